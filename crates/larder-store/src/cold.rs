//! Large reads of what the page cache does not hold go to the disk directly (`O_DIRECT`).
//!
//! A storage node keeps its recent large records in the page cache and drops older ones
//! (`uncache.rs`). Reading an old one back through the page cache would fill fresh pages
//! (their cost on a VM that reports free memory to its host: `benchmarks/store/UNCACHE.md`),
//! copy them out, and keep them cached for nothing. A direct read fills the reader's buffer
//! from the device and caches nothing: 0.054–0.084 s of CPU per GiB here, against 0.106–1.452
//! for the same reads through the page cache (`benchmarks/store/DIRECT-READS.md`). What the
//! page cache does hold is read from it as before, since there a copy is the fastest read
//! there is, and costs this VM no more CPU than a direct one.
//!
//! Both paths are only ways to fetch bytes: the caller checks every block against its CRC as
//! for any other read. A kernel without `cachestat` or a file system without `O_DIRECT` is
//! read as before.

use std::alloc::{self, Layout};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::segment::read_exact_at;

/// Offsets, lengths and buffers of direct reads are multiples of this: every device's logical
/// block (512 or 4,096 bytes) divides it.
const ALIGN: usize = 4096;

/// Bytes of large reads by where they came from (for metrics and tests).
#[derive(Debug, Default)]
pub struct LargeReads {
    /// From the page cache (or through it, where `cachestat` or `O_DIRECT` is missing).
    pub cached: AtomicU64,
    /// From the disk, past the page cache.
    pub direct: AtomicU64,
}

/// Reads exactly `len` bytes at `offset` of `file`: from the page cache when it holds them
/// all, else directly from the disk.
pub(crate) fn read_large(
    file: &File,
    offset: u64,
    len: usize,
    count: &LargeReads,
) -> io::Result<Bytes> {
    if all_cached(file, offset, len) {
        let buf = read_exact_at(file, offset, len)?;
        count.cached.fetch_add(len as u64, Ordering::Relaxed);
        return Ok(Bytes::from(buf));
    }
    match read_direct(file, offset, len) {
        Ok(bytes) => {
            count.direct.fetch_add(len as u64, Ordering::Relaxed);
            Ok(bytes)
        }
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(e),
        // No O_DIRECT here (some FUSE file systems), or a device that wants another
        // alignment: through the page cache, as every read went before.
        Err(_) => {
            let buf = read_exact_at(file, offset, len)?;
            count.cached.fetch_add(len as u64, Ordering::Relaxed);
            Ok(Bytes::from(buf))
        }
    }
}

/// `cachestat(2)` (Linux 6.5): the same number on every architecture but alpha.
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Whether the page cache holds every page of the range (`cachestat`, which only counts). A
/// kernel without it answers yes: such a node reads through the page cache, as before. Not
/// `preadv2` with `RWF_NOWAIT`, which answers from the cache too but, on a miss, first starts
/// readahead into it (8 MiB on this VM's disk): the pages a direct read is meant to spare.
fn all_cached(file: &File, offset: u64, len: usize) -> bool {
    let page = 4096;
    let first = offset / page;
    let Some(end) = offset.checked_add(len as u64) else {
        return true;
    };
    let pages = end.div_ceil(page) - first;
    let range = CachestatRange {
        off: first * page,
        len: pages * page,
    };
    let mut stat = Cachestat::default();
    // SAFETY: the kernel reads `range` and writes `stat`, both live for the call.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut stat as *mut Cachestat,
            0,
        )
    };
    rc != 0 || stat.nr_cache >= pages
}

/// Reads the aligned range around `offset..offset + len` with `O_DIRECT` into an aligned
/// buffer, and returns the bytes asked for (no copy: a slice of that buffer).
fn read_direct(file: &File, offset: u64, len: usize) -> io::Result<Bytes> {
    let direct = reopen_direct(file)?;
    let start = offset - offset % ALIGN as u64;
    let skip = (offset - start) as usize;
    let want = skip
        .checked_add(len)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "read too large"))?;
    let size = want.div_ceil(ALIGN) * ALIGN;
    let mut buf = Aligned::new(size)?;
    while buf.filled < want {
        let at = position(start, buf.filled)?;
        // SAFETY: pread writes at most `size - filled` bytes past `filled`, within the buffer.
        let n = unsafe {
            libc::pread(
                direct.as_raw_fd(),
                buf.ptr.as_ptr().add(buf.filled).cast(),
                size - buf.filled,
                at,
            )
        };
        match n {
            // The end of the file, short of the record: what the caller calls corruption.
            0 => return Err(eof()),
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            n => buf.filled += n as usize,
        }
    }
    Ok(Bytes::from_owner(buf).slice(skip..want))
}

/// The same file opened again with `O_DIRECT`: the flag belongs to an open file, and the
/// store's own descriptors stay buffered for its writes and small reads. Through
/// `/proc/self/fd`, so it works for a segment compaction has already unlinked.
fn reopen_direct(file: &File) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

fn position(offset: u64, filled: usize) -> io::Result<i64> {
    offset
        .checked_add(filled as u64)
        .and_then(|at| i64::try_from(at).ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "read past i64"))
}

fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "failed to fill whole buffer")
}

/// A buffer aligned for `O_DIRECT`, of which the first `filled` bytes are initialised.
struct Aligned {
    ptr: NonNull<u8>,
    layout: Layout,
    filled: usize,
}

// SAFETY: the buffer is owned memory like a `Vec<u8>`'s; nothing else points into it.
unsafe impl Send for Aligned {}
// SAFETY: shared access only reads its initialised bytes.
unsafe impl Sync for Aligned {}

impl Aligned {
    fn new(size: usize) -> io::Result<Aligned> {
        let layout = Layout::from_size_align(size.max(ALIGN), ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout's size is not zero.
        let ptr = NonNull::new(unsafe { alloc::alloc(layout) })
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "no aligned buffer"))?;
        Ok(Aligned {
            ptr,
            layout,
            filled: 0,
        })
    }
}

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `filled` bytes were written by `pread`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.filled) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut file = File::create(&path).unwrap();
        file.write_all(bytes).unwrap();
        file.sync_all().unwrap();
        (dir, File::open(&path).unwrap())
    }

    fn drop_cache(file: &File) {
        // SAFETY: advice on an open descriptor.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }

    #[test]
    fn every_range_reads_the_same_cached_or_not() {
        let bytes: Vec<u8> = (0..3 * 1024 * 1024 + 777)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let (_dir, file) = file_of(&bytes);
        let count = LargeReads::default();
        let ends = [
            0,
            1,
            511,
            4095,
            4096,
            4097,
            1 << 20,
            bytes.len() - 1,
            bytes.len(),
        ];
        for &from in &ends {
            for &to in ends.iter().filter(|&&to| to >= from) {
                drop_cache(&file);
                let cold = read_large(&file, from as u64, to - from, &count).unwrap();
                assert_eq!(&cold[..], &bytes[from..to], "cold {from}..{to}");
                let hot = read_large(&file, from as u64, to - from, &count).unwrap();
                assert_eq!(&hot[..], &bytes[from..to], "hot {from}..{to}");
            }
        }
        let past = read_large(&file, bytes.len() as u64 - 10, 11, &count).unwrap_err();
        assert_eq!(past.kind(), io::ErrorKind::UnexpectedEof);
        drop_cache(&file);
        let past = read_large(&file, bytes.len() as u64 - 10, 11, &count).unwrap_err();
        assert_eq!(past.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn what_the_page_cache_holds_is_read_from_it_and_the_rest_from_the_disk() {
        let bytes = vec![5u8; 2 << 20];
        let (_dir, file) = file_of(&bytes);
        let count = LargeReads::default();
        read_large(&file, 0, bytes.len(), &count).unwrap();
        assert_eq!(count.cached.load(Ordering::Relaxed), bytes.len() as u64);
        drop_cache(&file);
        read_large(&file, 3, bytes.len() - 3, &count).unwrap();
        if reopen_direct(&file).is_ok() {
            assert_eq!(count.direct.load(Ordering::Relaxed), bytes.len() as u64 - 3);
            // A direct read caches nothing: the next read goes to the disk again.
            read_large(&file, 0, 4096, &count).unwrap();
            assert_eq!(
                count.direct.load(Ordering::Relaxed),
                bytes.len() as u64 + 4093
            );
        } else {
            eprintln!("no O_DIRECT on this file system: read through the page cache");
        }
    }
}
