//! The file system: the current state lives in memory only; `fsync` of a file copies its
//! contents to the durable image, `fsync` of a directory its entries (the names created, renamed
//! and unlinked in it). A new mount starts from the durable image, so a process killed between
//! a write and its sync loses the write, as a machine losing power loses its page cache.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use libc::{EEXIST, EINVAL, EIO, EISDIR, ENOENT, ENOTDIR, ENOTEMPTY};

use crate::durable::{Backing, Manifest, ROOT};

const TTL: Duration = Duration::from_secs(1);

/// The disk is full (SIGUSR1 toggles it, `main.rs`): statfs reports no free space, and a write
/// that would grow a file fails with ENOSPC (overwrites in place still succeed).
pub static FULL: AtomicBool = AtomicBool::new(false);
/// Reported to statfs: far more than any test writes (Larder refuses writes when it looks full).
const REPORTED_BLOCKS: u64 = 64 << 20;

enum Kind {
    Dir(BTreeMap<String, u64>),
    File(Vec<u8>),
}

struct Inode {
    kind: Kind,
    mode: u32,
    nlink: u32,
    open: u32,
    mtime: SystemTime,
}

pub struct LossyFs {
    backing: Backing,
    durable: Manifest,
    inodes: HashMap<u64, Inode>,
}

impl LossyFs {
    /// The state after a power loss: the durable image, nothing more.
    pub fn mount_state(backing: Backing) -> std::io::Result<LossyFs> {
        let durable = backing.load_manifest()?;
        let mut inodes = HashMap::new();
        let mut todo = vec![ROOT];
        while let Some(ino) = todo.pop() {
            if inodes.contains_key(&ino) {
                continue;
            }
            let mode = durable.modes.get(&ino).copied().unwrap_or(0o644);
            let kind = match durable.dirs.get(&ino) {
                Some(entries) => {
                    todo.extend(entries.values().copied());
                    Kind::Dir(entries.clone())
                }
                None => Kind::File(backing.read_data(ino)?),
            };
            let inode = Inode {
                kind,
                mode,
                nlink: 0,
                open: 0,
                mtime: SystemTime::now(),
            };
            inodes.insert(ino, inode);
        }
        let links: Vec<u64> = inodes
            .values()
            .filter_map(|i| match &i.kind {
                Kind::Dir(entries) => Some(entries.values().copied().collect::<Vec<_>>()),
                Kind::File(_) => None,
            })
            .flatten()
            .collect();
        for ino in links {
            if let Some(inode) = inodes.get_mut(&ino) {
                inode.nlink += 1;
            }
        }
        if let Some(root) = inodes.get_mut(&ROOT) {
            root.nlink = 1;
        }
        backing.collect_garbage(&|ino| inodes.contains_key(&ino))?;
        Ok(LossyFs {
            backing,
            durable,
            inodes,
        })
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let inode = self.inodes.get(&ino)?;
        let (kind, size) = match &inode.kind {
            Kind::Dir(entries) => (FileType::Directory, entries.len() as u64),
            Kind::File(data) => (FileType::RegularFile, data.len() as u64),
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: inode.mtime,
            mtime: inode.mtime,
            ctime: inode.mtime,
            crtime: inode.mtime,
            kind,
            perm: (inode.mode & 0o7777) as u16,
            nlink: inode.nlink.max(1),
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<String, u64>, i32> {
        match self.inodes.get_mut(&dir).map(|i| &mut i.kind) {
            Some(Kind::Dir(entries)) => Ok(entries),
            Some(Kind::File(_)) => Err(ENOTDIR),
            None => Err(ENOENT),
        }
    }

    fn child(&mut self, dir: u64, name: &OsStr) -> Result<Option<u64>, i32> {
        let name = name.to_str().ok_or(EINVAL)?;
        Ok(self.entries_mut(dir)?.get(name).copied())
    }

    fn new_inode(&mut self, parent: u64, name: &OsStr, kind: Kind, mode: u32) -> Result<u64, i32> {
        let name = name.to_str().ok_or(EINVAL)?.to_owned();
        if self.entries_mut(parent)?.contains_key(&name) {
            return Err(EEXIST);
        }
        let ino = self.durable.next_ino;
        self.durable.next_ino += 1;
        self.entries_mut(parent)?.insert(name, ino);
        let inode = Inode {
            kind,
            mode: mode & 0o7777,
            nlink: 1,
            open: 0,
            mtime: SystemTime::now(),
        };
        self.inodes.insert(ino, inode);
        Ok(ino)
    }

    /// One link of `ino` is gone: its memory goes with the last link and the last open handle.
    fn unlinked(&mut self, ino: u64) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.nlink = inode.nlink.saturating_sub(1);
            if inode.nlink == 0 && inode.open == 0 {
                self.inodes.remove(&ino);
            }
        }
    }

    fn remove_entry(&mut self, parent: u64, name: &OsStr, want_dir: bool) -> Result<(), i32> {
        let ino = self.child(parent, name)?.ok_or(ENOENT)?;
        match (&self.inodes.get(&ino).ok_or(ENOENT)?.kind, want_dir) {
            (Kind::Dir(entries), true) if !entries.is_empty() => return Err(ENOTEMPTY),
            (Kind::Dir(_), false) => return Err(EISDIR),
            (Kind::File(_), true) => return Err(ENOTDIR),
            _ => {}
        }
        let name = name.to_str().ok_or(EINVAL)?;
        self.entries_mut(parent)?.remove(name);
        self.unlinked(ino);
        Ok(())
    }

    fn rename_entry(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<(), i32> {
        let ino = self.child(parent, name)?.ok_or(ENOENT)?;
        let replaced = self.child(newparent, newname)?;
        if replaced.is_some() && flags & libc::RENAME_NOREPLACE != 0 {
            return Err(EEXIST);
        }
        if flags & libc::RENAME_EXCHANGE != 0 {
            return Err(EINVAL);
        }
        if let Some(old) = replaced {
            if old == ino {
                return Ok(());
            }
            if let Some(Kind::Dir(entries)) = self.inodes.get(&old).map(|i| &i.kind) {
                if !entries.is_empty() {
                    return Err(ENOTEMPTY);
                }
            }
        }
        let (name, newname) = (
            name.to_str().ok_or(EINVAL)?,
            newname.to_str().ok_or(EINVAL)?,
        );
        self.entries_mut(parent)?.remove(name);
        self.entries_mut(newparent)?.insert(newname.to_owned(), ino);
        if let Some(old) = replaced {
            self.unlinked(old);
        }
        Ok(())
    }

    /// fsync of a file: its contents become durable (not its name: that is its directory's).
    fn sync_file(&mut self, ino: u64) -> Result<(), i32> {
        match &self.inodes.get(&ino).ok_or(ENOENT)?.kind {
            Kind::File(data) => self.backing.write_data(ino, data).map_err(|_| EIO),
            Kind::Dir(_) => self.sync_dir(ino),
        }
    }

    /// fsync of a directory: its entries, as they are now, become durable.
    fn sync_dir(&mut self, ino: u64) -> Result<(), i32> {
        let Some(Inode {
            kind: Kind::Dir(entries),
            mode,
            ..
        }) = self.inodes.get(&ino)
        else {
            return Err(ENOTDIR);
        };
        self.durable.dirs.insert(ino, entries.clone());
        self.durable.modes.insert(ino, *mode);
        for child in entries.values() {
            if let Some(inode) = self.inodes.get(child) {
                self.durable.modes.insert(*child, inode.mode);
                // A new subdirectory is durable as an empty one until it is synced itself.
                if matches!(inode.kind, Kind::Dir(_)) {
                    self.durable.dirs.entry(*child).or_default();
                }
            }
        }
        self.backing.save_manifest(&self.durable).map_err(|_| EIO)
    }

    fn reply_entry(&self, ino: u64, reply: ReplyEntry) {
        match self.attr(ino) {
            Some(attr) => reply.entry(&TTL, &attr, 0),
            None => reply.error(ENOENT),
        }
    }
}

fn done(result: Result<(), i32>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for LossyFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name) {
            Ok(Some(ino)) => self.reply_entry(ino, reply),
            Ok(None) => reply.error(ENOENT),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(ENOENT),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let Some(inode) = self.inodes.get_mut(&ino) else {
            return reply.error(ENOENT);
        };
        if let Some(mode) = mode {
            inode.mode = mode & 0o7777;
        }
        if let (Some(size), Kind::File(data)) = (size, &mut inode.kind) {
            data.resize(size as usize, 0);
            inode.mtime = SystemTime::now();
        }
        match self.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(ENOENT),
        }
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self.new_inode(parent, name, Kind::Dir(BTreeMap::new()), mode & !umask) {
            Ok(ino) => self.reply_entry(ino, reply),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(libc::EPERM);
        }
        match self.new_inode(parent, name, Kind::File(Vec::new()), mode & !umask) {
            Ok(ino) => self.reply_entry(ino, reply),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let ino = match self.new_inode(parent, name, Kind::File(Vec::new()), mode & !umask) {
            Ok(ino) => ino,
            Err(e) => return reply.error(e),
        };
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.open += 1;
        }
        match self.attr(ino) {
            Some(attr) => reply.created(&TTL, &attr, 0, ino, 0),
            None => reply.error(ENOENT),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        done(self.remove_entry(parent, name, false), reply)
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        done(self.remove_entry(parent, name, true), reply)
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        done(
            self.rename_entry(parent, name, newparent, newname, flags),
            reply,
        )
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        match self.inodes.get_mut(&ino) {
            Some(inode) => {
                inode.open += 1;
                reply.opened(ino, 0)
            }
            None => reply.error(ENOENT),
        }
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.open = inode.open.saturating_sub(1);
            if inode.open == 0 && inode.nlink == 0 {
                self.inodes.remove(&ino);
            }
        }
        reply.ok()
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        match self.inodes.get(&ino).map(|i| &i.kind) {
            Some(Kind::File(data)) => {
                let start = (offset.max(0) as usize).min(data.len());
                let end = start.saturating_add(size as usize).min(data.len());
                reply.data(&data[start..end])
            }
            Some(Kind::Dir(_)) => reply.error(EISDIR),
            None => reply.error(ENOENT),
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        bytes: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let Some(inode) = self.inodes.get_mut(&ino) else {
            return reply.error(ENOENT);
        };
        let Kind::File(data) = &mut inode.kind else {
            return reply.error(EISDIR);
        };
        let start = offset.max(0) as usize;
        let end = start + bytes.len();
        if data.len() < end && FULL.load(Ordering::Relaxed) {
            return reply.error(libc::ENOSPC);
        }
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        inode.mtime = SystemTime::now();
        reply.written(bytes.len() as u32)
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _owner: u64, reply: ReplyEmpty) {
        reply.ok()
    }

    fn fsync(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        done(self.sync_file(ino), reply)
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        match self.inodes.get(&ino).map(|i| &i.kind) {
            Some(Kind::Dir(_)) => reply.opened(ino, 0),
            Some(Kind::File(_)) => reply.error(ENOTDIR),
            None => reply.error(ENOENT),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let Some(Kind::Dir(entries)) = self.inodes.get(&ino).map(|i| &i.kind) else {
            return reply.error(ENOTDIR);
        };
        let mut listing = vec![
            (ino, FileType::Directory, ".".to_owned()),
            (ino, FileType::Directory, "..".to_owned()),
        ];
        for (name, child) in entries {
            let kind = match self.inodes.get(child).map(|i| &i.kind) {
                Some(Kind::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            listing.push((*child, kind, name.clone()));
        }
        for (i, (child, kind, name)) in listing.into_iter().enumerate().skip(offset.max(0) as usize)
        {
            if reply.add(child, (i + 1) as i64, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn fsyncdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        done(self.sync_dir(ino), reply)
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let free = match FULL.load(Ordering::Relaxed) {
            true => 0,
            false => REPORTED_BLOCKS,
        };
        reply.statfs(
            REPORTED_BLOCKS,
            free,
            free,
            1 << 20,
            1 << 20,
            4096,
            255,
            4096,
        )
    }

    fn access(&mut self, _req: &Request<'_>, _ino: u64, _mask: i32, reply: ReplyEmpty) {
        reply.ok()
    }
}
