//! Segment files: naming, creation, positional vectored writes and reads.
//!
//! Every reader holds an `Arc<File>` and reads with `pread`, so a segment that compaction later
//! swaps out or unlinks stays readable by whoever still holds the handle.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{encode_file_header, SegmentHeader};
use crate::types::{Error, Result};

/// One segment file, shared by the writer and every reader.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub id: u32,
    pub file: Arc<File>,
    /// No record in the segment has a smaller sequence number: where the change feed starts
    /// looking for a cursor it has no hint for.
    pub first_seq: u64,
    /// How many times compaction rewrote it: part of its file name (`segment_file_name`).
    pub gen: u32,
}

/// The file of generation `gen` of segment `id`: generation 0 is the name the log wrote (and the
/// disk journal names); each compaction writes the next generation. A journal frame of a
/// compacted segment therefore finds no file and is skipped: the rewrite copied those bytes and
/// was synced before the old generation was deleted.
pub(crate) fn segment_file_name(id: u32, gen: u32) -> String {
    match gen {
        0 => segment_name(id),
        g => format!("seg-{id:08}-{g:08}.log"),
    }
}

pub(crate) fn segment_name(id: u32) -> String {
    format!("seg-{id:08}.log")
}

pub(crate) fn parse_segment_name(name: &str) -> Option<(u32, u32)> {
    let digits = name.strip_prefix("seg-")?.strip_suffix(".log")?;
    let number = |d: &str| {
        (d.len() == 8 && d.bytes().all(|c| c.is_ascii_digit()))
            .then(|| d.parse::<u32>().ok())
            .flatten()
    };
    let (id, gen) = match digits.split_once('-') {
        None => (number(digits)?, 0),
        Some((id, gen)) => (number(id)?, number(gen).filter(|&g| g > 0)?),
    };
    (id > 0).then_some((id, gen))
}

/// One segment file found in a directory.
pub(crate) struct Found {
    pub id: u32,
    pub gen: u32,
    pub path: PathBuf,
}

/// Segments in `dir`, ascending by id, the newest generation of each. Older generations (left by
/// a compaction that crashed after its rewrite was in place) are returned in `stale`.
pub(crate) fn list_segments(dir: &Path) -> io::Result<(Vec<Found>, Vec<PathBuf>)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if let Some((id, gen)) = entry.file_name().to_str().and_then(parse_segment_name) {
            all.push(Found {
                id,
                gen,
                path: entry.path(),
            });
        }
    }
    all.sort_unstable_by_key(|f| (f.id, std::cmp::Reverse(f.gen)));
    let mut out: Vec<Found> = Vec::with_capacity(all.len());
    let mut stale = Vec::new();
    for f in all {
        if out.last().is_some_and(|newest| newest.id == f.id) {
            stale.push(f.path);
        } else {
            out.push(f);
        }
    }
    Ok((out, stale))
}

pub(crate) fn open_segment(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// Creates segment `id` with its header. When `sync`, the file and the directory are synced so
/// the new file (and its name) survive a crash before any record in it is acknowledged.
pub(crate) fn create_segment(
    dir: &Path,
    id: u32,
    header: SegmentHeader,
    sync: bool,
) -> Result<Segment> {
    let path = dir.join(segment_name(id));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    let result = (|| {
        file.write_all_at(&encode_file_header(id, header), 0)?;
        if sync {
            file.sync_all()?;
            sync_dir(dir)?;
        }
        Ok::<_, io::Error>(())
    })();
    if let Err(e) = result {
        // Leave no headerless file behind; recovery would cope, but the next attempt reuses the id.
        let _ = std::fs::remove_file(&path);
        return Err(io_error(e));
    }
    Ok(Segment {
        id,
        file: Arc::new(file),
        first_seq: header.first_seq,
        gen: 0,
    })
}

/// Rewrites the header of a segment whose creation was cut short by a crash.
pub(crate) fn rewrite_header(file: &File, id: u32, header: SegmentHeader) -> io::Result<()> {
    file.set_len(0)?;
    file.write_all_at(&encode_file_header(id, header), 0)?;
    file.sync_all()
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `create_dir_all`, and durably: a new directory's name is in its parent, so each parent of a
/// directory created here is synced (a power loss would otherwise take the new directory, and
/// everything later synced below it, away; the nemesis suite's power losses found it).
pub fn create_dir_all_durable(dir: &Path) -> io::Result<()> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|a| !a.exists()).collect();
    std::fs::create_dir_all(dir)?;
    for created in missing.iter().rev() {
        if let Some(parent) = created.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

pub(crate) fn fdatasync(file: &File) -> io::Result<()> {
    file.sync_data()
}

/// Asks the kernel to drop `len` bytes of `file` from `offset` from its page cache
/// (`POSIX_FADV_DONTNEED`): clean pages are freed at once, dirty ones only queued for write-back.
pub(crate) fn drop_cached(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let too_far = || io::Error::new(io::ErrorKind::InvalidInput, "range past i64");
    let offset = i64::try_from(offset).map_err(|_| too_far())?;
    let len = i64::try_from(len).map_err(|_| too_far())?;
    // SAFETY: a plain syscall on a descriptor `file` keeps open; no memory is passed.
    let err =
        unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_DONTNEED) };
    match err {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Maps I/O errors to the store's error, singling out a full disk.
pub(crate) fn io_error(e: io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Error::OutOfSpace,
        _ => Error::Io(e),
    }
}

/// Writes all of `bufs` at `offset` with `pwritev`, resuming after short writes, so record
/// chunks go to the kernel as they arrived instead of being copied into one buffer.
pub(crate) fn write_all_vectored_at(
    file: &File,
    mut offset: u64,
    bufs: &[&[u8]],
) -> io::Result<()> {
    const MAX_IOV: usize = 1024; // IOV_MAX on Linux
    let mut rest: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
    let mut first = 0;
    while first < rest.len() {
        let iov: Vec<libc::iovec> = rest[first..(first + MAX_IOV).min(rest.len())]
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: every iovec points into a live slice of `rest` for the duration of the call.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                offset as i64,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        offset += n as u64;
        let mut n = n as usize;
        while n > 0 {
            let len = rest[first].len();
            if n >= len {
                n -= len;
                first += 1;
            } else {
                rest[first] = &rest[first][n..];
                n = 0;
            }
        }
    }
    Ok(())
}

/// Reads exactly `len` bytes at `offset`, into a buffer that is not zeroed first: `pread`
/// fills it (zeroing 4 MiB before every large read was 15 % of a storage node's CPU under
/// 4 MiB GETs).
pub(crate) fn read_exact_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let filled = buf.len();
        let at = offset
            .checked_add(filled as u64)
            .and_then(|at| i64::try_from(at).ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "read past i64"))?;
        let spare = &mut buf.spare_capacity_mut()[..len - filled];
        // SAFETY: pread writes at most `spare.len()` bytes into the spare capacity, and only
        // the bytes it says it wrote are counted into the length.
        let n =
            unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), at) };
        match n {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "failed to fill whole buffer",
                ))
            }
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            // SAFETY: the first `filled + n` bytes are initialised (`n <= spare.len()`).
            n => unsafe { buf.set_len(filled + n as usize) },
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(segment_name(12), "seg-00000012.log");
        assert_eq!(parse_segment_name("seg-00000012.log"), Some((12, 0)));
        assert_eq!(segment_file_name(12, 3), "seg-00000012-00000003.log");
        assert_eq!(
            parse_segment_name("seg-00000012-00000003.log"),
            Some((12, 3))
        );
        assert_eq!(parse_segment_name("seg-00000012-00000000.log"), None);
        assert_eq!(parse_segment_name("seg-00000012-3.log"), None);
        assert_eq!(parse_segment_name("seg-00000012-00000003.log.tmp"), None);
        assert_eq!(parse_segment_name("seg-00000000.log"), None);
        assert_eq!(parse_segment_name("seg-12.log"), None);
        assert_eq!(parse_segment_name("index.ckpt"), None);
    }

    #[test]
    fn vectored_write_covers_many_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("f"))
            .unwrap();
        let parts: Vec<Vec<u8>> = (0..3000u32)
            .map(|i| vec![i as u8; (i % 7) as usize])
            .collect();
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        write_all_vectored_at(&file, 5, &refs).unwrap();
        let want: Vec<u8> = parts.concat();
        assert_eq!(read_exact_at(&file, 5, want.len()).unwrap(), want);
    }

    #[test]
    fn an_exact_read_gets_every_byte_asked_or_says_the_file_is_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(read_exact_at(&file, 0, bytes.len()).unwrap(), bytes);
        assert_eq!(read_exact_at(&file, 7, 1000).unwrap(), &bytes[7..1007]);
        assert_eq!(read_exact_at(&file, 9, 0).unwrap(), Vec::<u8>::new());
        let short = read_exact_at(&file, 299_000, 1001).unwrap_err();
        assert_eq!(short.kind(), io::ErrorKind::UnexpectedEof);
        let past = read_exact_at(&file, 400_000, 1).unwrap_err();
        assert_eq!(past.kind(), io::ErrorKind::UnexpectedEof);
        let huge = read_exact_at(&file, u64::MAX, 1).unwrap_err();
        assert_eq!(huge.kind(), io::ErrorKind::InvalidInput);
    }
}
