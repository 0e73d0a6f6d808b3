//! Sequential record scanning over one segment, shared by recovery and the change feed.
//!
//! Reads go through a window (growing from 32 KiB to 1 MiB as a scan goes on) so that replaying
//! millions of small records costs a few large `pread`s rather than one per record, while a
//! short scan (a change-feed page) reads little past what it needs.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::format::{parse_fixed, verify_head, RecordInfo, BLOCK_SIZE, HEADER_LEN, RECORD_MAGIC};

const WINDOW: usize = 1 << 20;
/// The first read of a scanner; each further one doubles up to `WINDOW`. A change-feed page
/// that needs a few hundred KiB then reads about that much, not a whole window past it (a
/// bootstrap export of 1 KiB records read ~3.6 times the log that way).
const FIRST_READ: usize = 32 << 10;
/// Window buffers kept for the next scanners: a change-feed page (one per replication pull,
/// many a second under writes) would otherwise take, and zero, a fresh megabyte each time.
const POOLED_WINDOWS: usize = 8;

static WINDOWS: parking_lot::Mutex<Vec<Vec<u8>>> = parking_lot::Mutex::new(Vec::new());

/// A record found at some offset.
#[derive(Debug)]
pub(crate) struct Scanned {
    pub info: RecordInfo,
    pub start: u64,
    pub end: u64,
}

/// Outcome of reading at one offset.
#[derive(Debug)]
pub(crate) enum Found {
    Valid(Scanned),
    /// The head is valid but data block `.1` fails its CRC.
    BadData(Scanned, u64),
    /// No valid record starts here (garbage, torn head, or data running past the end).
    Invalid,
}

pub(crate) struct Scanner<'a> {
    file: &'a File,
    /// The segment's id: part of every record's head CRC.
    segment: u32,
    len: u64,
    /// A window buffer; only `buf[..filled]` holds the file's bytes at `at`. The rest is
    /// whatever an earlier scan left there (never read: every view is within `filled`).
    buf: Vec<u8>,
    filled: usize,
    at: u64,
    /// How much the next read asks for (at least).
    next_read: usize,
    /// Bytes read from the file so far (the change feed counts them: `Counters::feed_read`).
    read: u64,
}

impl Drop for Scanner<'_> {
    fn drop(&mut self) {
        // Buffers grown past the window for one large record are not worth keeping.
        if self.buf.capacity() == 0 || self.buf.capacity() > WINDOW {
            return;
        }
        let mut pool = WINDOWS.lock();
        if pool.len() < POOLED_WINDOWS {
            pool.push(std::mem::take(&mut self.buf));
        }
    }
}

impl<'a> Scanner<'a> {
    /// Scans `file` up to `len` (the caller decides how much of the file counts).
    pub fn new(file: &'a File, segment: u32, len: u64) -> Self {
        Scanner {
            file,
            segment,
            len,
            buf: WINDOWS.lock().pop().unwrap_or_default(),
            filled: 0,
            at: 0,
            next_read: FIRST_READ,
            read: 0,
        }
    }

    /// Bytes `[pos, pos + n)`, clipped to the scanned length.
    fn view(&mut self, pos: u64, n: usize) -> io::Result<&[u8]> {
        let end = (pos + n as u64).min(self.len);
        if pos >= end {
            return Ok(&[]);
        }
        let buffered = self.at + self.filled as u64;
        if pos < self.at || end > buffered {
            let want = (n.max(self.next_read) as u64).min(self.len - pos) as usize;
            self.next_read = (self.next_read * 2).min(WINDOW);
            if self.buf.len() < want {
                // A whole window at once (so it can be pooled), zeroed by the allocator: fresh
                // pages come zeroed; growing with `resize` would write every byte.
                self.buf = vec![0; want.max(WINDOW)];
            }
            self.filled = 0;
            self.file.read_exact_at(&mut self.buf[..want], pos)?;
            self.read += want as u64;
            (self.at, self.filled) = (pos, want);
        }
        let from = (pos - self.at) as usize;
        Ok(&self.buf[from..from + (end - pos) as usize])
    }

    /// The id of the segment scanned.
    pub fn segment(&self) -> u32 {
        self.segment
    }

    /// Bytes this scanner read from its file.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// Reads the record starting at `pos`; with `verify_data` every data block is checked too.
    pub fn read_at(&mut self, pos: u64, verify_data: bool) -> io::Result<Found> {
        let fixed = match parse_fixed(self.view(pos, HEADER_LEN)?) {
            Ok(f) => f,
            Err(_) => return Ok(Found::Invalid),
        };
        let (head_len, size) = (fixed.head_len(), fixed.size);
        if pos + head_len + size > self.len {
            return Ok(Found::Invalid);
        }
        // A record that fits in the window is verified in place: replaying millions of small
        // records must not allocate for each one's CRC table.
        let in_place = verify_data && head_len + size <= WINDOW as u64;
        let span = if in_place { head_len + size } else { head_len };
        let segment = self.segment;
        let buf = self.view(pos, span as usize)?;
        let Ok(head) = verify_head(buf, fixed, segment, pos) else {
            return Ok(Found::Invalid);
        };
        let rec = Scanned {
            info: head.to_info(),
            start: pos,
            end: pos + head_len + size,
        };
        if in_place {
            let data = &buf[head_len as usize..];
            let bad = data
                .chunks(BLOCK_SIZE as usize)
                .enumerate()
                .find(|(i, block)| crc32c::crc32c(block) != head.block_crc(*i as u64));
            return Ok(match bad {
                Some((i, _)) => Found::BadData(rec, i as u64),
                None => Found::Valid(rec),
            });
        }
        let crcs = head.crcs.to_vec();
        if verify_data {
            if let Some(bad) = self.first_bad_block(pos + head_len, size, &crcs)? {
                return Ok(Found::BadData(rec, bad));
            }
        }
        Ok(Found::Valid(rec))
    }

    fn first_bad_block(&mut self, data_at: u64, size: u64, crcs: &[u8]) -> io::Result<Option<u64>> {
        for (i, want) in crcs.chunks_exact(4).enumerate() {
            let off = i as u64 * BLOCK_SIZE;
            let n = BLOCK_SIZE.min(size - off) as usize;
            let block = self.view(data_at + off, n)?;
            if crc32c::crc32c(block).to_le_bytes() != want {
                return Ok(Some(i as u64));
            }
        }
        Ok(None)
    }

    /// The first offset at or after `from` where a record with a valid head starts, if any.
    /// Used to step over a corrupt region; data is not verified (the caller reads it next).
    pub fn resync(&mut self, from: u64) -> io::Result<Option<u64>> {
        let mut pos = from;
        while pos + (HEADER_LEN as u64) <= self.len {
            let window = self.view(pos, WINDOW)?;
            if window.len() < RECORD_MAGIC.len() {
                break;
            }
            match window
                .windows(RECORD_MAGIC.len())
                .position(|w| w == RECORD_MAGIC)
            {
                None => pos += (window.len() - RECORD_MAGIC.len() + 1) as u64,
                Some(i) => {
                    let candidate = pos + i as u64;
                    if !matches!(self.read_at(candidate, false)?, Found::Invalid) {
                        return Ok(Some(candidate));
                    }
                    pos = candidate + 1;
                }
            }
        }
        Ok(None)
    }
}
