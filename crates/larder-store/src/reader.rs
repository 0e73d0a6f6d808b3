//! Verified reads of stored records. Nothing leaves here without passing its checksum.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use crate::cold::{self, LargeReads};
use crate::format::{head_len, parse_fixed, verify_head, BLOCK_SIZE};
use crate::segment::read_exact_at;
use crate::types::{Error, Location, Result};

fn corrupt(loc: &Location, detail: impl Into<String>) -> Error {
    Error::Corrupt {
        location: loc.describe(),
        detail: detail.into(),
    }
}

impl Location {
    pub(crate) fn describe(&self) -> String {
        format!(
            "{}@{}",
            crate::segment::segment_name(self.segment),
            self.offset
        )
    }
}

/// A short read means the file no longer holds the record: that is corruption, not an I/O error.
fn read_error(loc: &Location, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        corrupt(loc, "record extends past the end of its segment")
    } else {
        Error::Io(e)
    }
}

/// Records up to this size (head and data) are read whole, in one `pread`: a 1 KiB GET then
/// costs one system call instead of two (head, then data). The data is verified block by
/// block as it is served, as any other.
const READ_WHOLE_UP_TO: u64 = 64 * 1024;

/// Reads and verifies the head of the record at `loc`, checking it is the record the index
/// expects (same key and size). Returns the block CRC table and, for a small record, its data
/// (read with the head, not yet verified).
fn read_head(
    loc: &Location,
    key: &[u8],
    props_len: usize,
    size: u64,
) -> Result<(Vec<u32>, Option<Bytes>)> {
    let hl = head_len(key.len(), props_len, size) as usize;
    let whole = (hl as u64)
        .checked_add(size)
        .filter(|len| *len <= READ_WHOLE_UP_TO);
    let len = whole.map_or(hl, |len| len as usize);
    let buf =
        Bytes::from(read_exact_at(&loc.file, loc.offset, len).map_err(|e| read_error(loc, e))?);
    let data = whole.map(|_| buf.slice(hl..));
    let crcs = verify_record_head(loc, &buf[..hl], key, props_len, size)?;
    Ok((crcs, data))
}

fn verify_record_head(
    loc: &Location,
    buf: &[u8],
    key: &[u8],
    props_len: usize,
    size: u64,
) -> Result<Vec<u32>> {
    let fixed = parse_fixed(buf).map_err(|e| corrupt(loc, format!("bad record header: {e:?}")))?;
    let head = verify_head(buf, fixed, loc.segment, loc.offset)
        .map_err(|e| corrupt(loc, format!("bad record head: {e:?}")))?;
    if head.key != key || head.fixed.size != size || head.props.len() != props_len {
        return Err(corrupt(loc, "record does not match the index"));
    }
    Ok(head
        .crcs
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
        .collect())
}

/// Reads a whole record's data (documents), verifying every block.
pub(crate) fn read_whole(loc: &Location, key: &[u8], size: u64) -> Result<Bytes> {
    let reader = BlobReaderState::open(loc, key, 0, size, 0..size, (usize::MAX, None))?;
    let mut out = Vec::with_capacity(size as usize);
    for piece in reader {
        out.extend_from_slice(&piece?);
    }
    Ok(out.into())
}

/// The state behind [`crate::BlobReader`].
pub(crate) struct BlobReaderState {
    file: Arc<File>,
    loc: Location,
    data_at: u64,
    size: u64,
    crcs: Vec<u32>,
    /// The whole data of a small record, read with its head (see `READ_WHOLE_UP_TO`).
    data: Option<Bytes>,
    pos: u64,
    end: u64,
    chunk: usize,
    cold: Option<ColdReads>,
    done: bool,
}

/// Pieces of records of at least `from` bytes of data that the page cache does not hold are
/// read past it (`cold.rs`), counted in `count`.
#[derive(Clone)]
pub(crate) struct ColdReads {
    pub from: u64,
    pub count: Arc<LargeReads>,
}

impl BlobReaderState {
    pub(crate) fn open(
        loc: &Location,
        key: &[u8],
        props_len: usize,
        size: u64,
        range: Range<u64>,
        (chunk, cold): (usize, Option<ColdReads>),
    ) -> Result<Self> {
        let (crcs, data) = read_head(loc, key, props_len, size)?;
        let end = range.end.min(size);
        Ok(BlobReaderState {
            file: loc.file.clone(),
            loc: loc.clone(),
            data_at: loc.offset + head_len(key.len(), props_len, size),
            size,
            crcs,
            data,
            pos: range.start.min(end),
            end,
            chunk: chunk.max(1),
            cold,
            done: false,
        })
    }

    /// End of the next piece: at most `chunk` bytes, cut at a block boundary when that is
    /// possible so consecutive pieces do not re-read (and re-verify) a shared block.
    fn piece_end(&self) -> u64 {
        let end = self.end.min(self.pos.saturating_add(self.chunk as u64));
        let aligned = end / BLOCK_SIZE * BLOCK_SIZE;
        if end < self.end && aligned > self.pos {
            aligned
        } else {
            end
        }
    }

    fn read_piece(&mut self) -> Result<Bytes> {
        let piece_end = self.piece_end();
        let first = self.pos / BLOCK_SIZE;
        let last = (piece_end - 1) / BLOCK_SIZE;
        let from = first * BLOCK_SIZE;
        let to = ((last + 1) * BLOCK_SIZE).min(self.size);
        let buf = match &self.data {
            Some(data) => data.slice(from as usize..to as usize),
            None => {
                let at = self.data_at + from;
                let len = (to - from) as usize;
                match &self.cold {
                    Some(cold) if self.size >= cold.from => {
                        cold::read_large(&self.file, at, len, &cold.count)
                    }
                    _ => read_exact_at(&self.file, at, len).map(Bytes::from),
                }
                .map_err(|e| read_error(&self.loc, e))?
            }
        };
        for (i, block) in buf.chunks(BLOCK_SIZE as usize).enumerate() {
            let n = first + i as u64;
            if crc32c::crc32c(block) != self.crcs[n as usize] {
                return Err(corrupt(
                    &self.loc,
                    format!("data block {n} fails its checksum"),
                ));
            }
        }
        let piece = buf.slice((self.pos - from) as usize..(piece_end - from) as usize);
        self.pos = piece_end;
        Ok(piece)
    }
}

impl Iterator for BlobReaderState {
    type Item = Result<Bytes>;

    fn next(&mut self) -> Option<Result<Bytes>> {
        if self.done || self.pos >= self.end {
            return None;
        }
        let piece = self.read_piece();
        self.done = piece.is_err();
        Some(piece)
    }
}
