//! The per-disk journal's on-disk format (see `FORMAT.md`): a file header, then frames, each
//! carrying bytes some log wrote at a position of one of its segments.
//!
//! Parsing never trusts a length before it is bounded (path and data lengths are capped before
//! anything is read or allocated) and never reads past what the caller handed in: a frame is
//! accepted only when its head CRC and its data CRC both verify. The first frame that does not
//! ends the journal (a torn tail).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Held (`flock`) by the one `Disk` that has a disk root open, next to its journal files.
pub(crate) const JOURNAL_LOCK: &str = "journal.lock";
const FILE_MAGIC: &[u8; 8] = b"LRDRJRNL";
const FILE_VERSION: u8 = 1;
pub(crate) const FILE_HEADER_LEN: u64 = 16;
const FRAME_MAGIC: &[u8; 4] = b"LJnl";
pub(crate) const FRAME_HEAD_LEN: usize = 32;
/// Longest store path (relative to the disk root) a frame may name.
pub(crate) const MAX_PATH_LEN: usize = 1024;
/// Most data one frame carries (a log's batch is at most 1 MiB, a large record journaled alone at
/// most 1 MiB): anything larger is not a frame this build wrote.
pub(crate) const MAX_FRAME_DATA: usize = 4 << 20;

pub(crate) fn journal_name(n: u32) -> String {
    format!("journal-{n:08}.jnl")
}

pub(crate) fn parse_journal_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("journal-")?.strip_suffix(".jnl")?;
    if digits.len() != 8 || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&n| n > 0)
}

pub(crate) fn encode_file_header() -> [u8; FILE_HEADER_LEN as usize] {
    let mut h = [0u8; FILE_HEADER_LEN as usize];
    h[..8].copy_from_slice(FILE_MAGIC);
    h[8] = FILE_VERSION;
    let crc = crc32c::crc32c(&h[..12]);
    h[12..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Whether `b` starts with a journal file header this build reads.
pub(crate) fn check_file_header(b: &[u8]) -> bool {
    b.len() >= FILE_HEADER_LEN as usize
        && &b[..8] == FILE_MAGIC
        && b[8] == FILE_VERSION
        && b[9..12] == [0, 0, 0]
        && crc32c::crc32c(&b[..12]).to_le_bytes() == b[12..16]
}

/// Where a frame's bytes belong: a store (by its path under the disk root), a segment, an offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target<'a> {
    pub path: &'a [u8],
    pub segment: u32,
    pub offset: u64,
}

/// Encodes everything of a frame before its data: the fixed head and the path.
pub(crate) fn encode_frame_head(target: &Target<'_>, data: &[u8]) -> Vec<u8> {
    encode_frame_head_of_pieces(target, &[data])
}

/// `encode_frame_head` of data given in pieces (their concatenation is the frame's data).
pub(crate) fn encode_frame_head_of_pieces(target: &Target<'_>, pieces: &[&[u8]]) -> Vec<u8> {
    let data_len: usize = pieces.iter().map(|p| p.len()).sum();
    let data_crc = pieces
        .iter()
        .fold(0, |crc, p| crc32c::crc32c_append(crc, p));
    debug_assert!(target.path.len() <= MAX_PATH_LEN && data_len <= MAX_FRAME_DATA);
    let mut b = Vec::with_capacity(FRAME_HEAD_LEN + target.path.len());
    b.extend_from_slice(FRAME_MAGIC);
    b.extend_from_slice(&(target.path.len() as u16).to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&target.segment.to_le_bytes());
    b.extend_from_slice(&target.offset.to_le_bytes());
    b.extend_from_slice(&(data_len as u32).to_le_bytes());
    b.extend_from_slice(&data_crc.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(target.path);
    let crc = head_crc(&b);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b
}

fn head_crc(head_and_path: &[u8]) -> u32 {
    crc32c::crc32c_append(
        crc32c::crc32c(&head_and_path[..28]),
        &head_and_path[FRAME_HEAD_LEN..],
    )
}

/// The fixed head of a frame, bounds-checked (not yet CRC-verified).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FrameHead {
    path_len: usize,
    segment: u32,
    offset: u64,
    data_len: usize,
    data_crc: u32,
    crc: u32,
}

impl FrameHead {
    /// Path plus data: what follows the fixed head.
    pub fn body_len(&self) -> usize {
        self.path_len + self.data_len
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn parse_frame_head(b: &[u8]) -> Option<FrameHead> {
    if b.len() < FRAME_HEAD_LEN || &b[..4] != FRAME_MAGIC || b[6..8] != [0, 0] {
        return None;
    }
    let path_len = u16::from_le_bytes([b[4], b[5]]) as usize;
    let data_len = u32_at(b, 20) as usize;
    if path_len > MAX_PATH_LEN || data_len > MAX_FRAME_DATA {
        return None;
    }
    Some(FrameHead {
        path_len,
        segment: u32_at(b, 8),
        offset: u64::from_le_bytes(b[12..20].try_into().expect("8 bytes")),
        data_len,
        data_crc: u32_at(b, 24),
        crc: u32_at(b, 28),
    })
}

/// Verifies a frame whose fixed head is `head` (parsed from `fixed`) and whose path and data are
/// `body` (exactly `head.body_len()` bytes). Returns its target and data.
pub(crate) fn verify_frame<'a>(
    fixed: &[u8],
    head: FrameHead,
    body: &'a [u8],
) -> Option<(Target<'a>, &'a [u8])> {
    if body.len() != head.body_len() {
        return None;
    }
    let (path, data) = body.split_at(head.path_len);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&fixed[..28]), path);
    if crc != head.crc || crc32c::crc32c(data) != head.data_crc {
        return None;
    }
    let target = Target {
        path,
        segment: head.segment,
        offset: head.offset,
    };
    Some((target, data))
}

/// Parses one frame at the start of `b`; returns it and its length. `None`: no valid frame here.
pub(crate) fn parse_frame(b: &[u8]) -> Option<(Target<'_>, &[u8], usize)> {
    let head = parse_frame_head(b)?;
    let end = FRAME_HEAD_LEN.checked_add(head.body_len())?;
    let body = b.get(FRAME_HEAD_LEN..end)?;
    let (target, data) = verify_frame(b, head, body)?;
    Some((target, data, end))
}

/// Reads the frames of one journal file in order, with one reused buffer of at most
/// [`MAX_PATH_LEN`] + [`MAX_FRAME_DATA`] bytes.
pub(crate) struct JournalReader<'a> {
    file: &'a File,
    len: u64,
    pos: u64,
    fixed: [u8; FRAME_HEAD_LEN],
    body: Vec<u8>,
}

impl<'a> JournalReader<'a> {
    /// `None` when the file does not start with a valid header (nothing in it counts).
    pub fn new(file: &'a File) -> io::Result<Option<Self>> {
        let len = file.metadata()?.len();
        let mut header = [0u8; FILE_HEADER_LEN as usize];
        if len < FILE_HEADER_LEN {
            return Ok(None);
        }
        file.read_exact_at(&mut header, 0)?;
        if !check_file_header(&header) {
            return Ok(None);
        }
        Ok(Some(JournalReader {
            file,
            len,
            pos: FILE_HEADER_LEN,
            fixed: [0; FRAME_HEAD_LEN],
            body: Vec::new(),
        }))
    }

    /// Offset just past the last valid frame read so far.
    pub fn valid_len(&self) -> u64 {
        self.pos
    }

    /// Whether bytes follow the last valid frame (a torn or damaged tail).
    pub fn has_tail(&self) -> bool {
        self.pos < self.len
    }

    /// The next valid frame, or `None` at the end of the valid frames.
    pub fn next_frame(&mut self) -> io::Result<Option<(Target<'_>, &[u8])>> {
        if self.len - self.pos < FRAME_HEAD_LEN as u64 {
            return Ok(None);
        }
        self.file.read_exact_at(&mut self.fixed, self.pos)?;
        let Some(head) = parse_frame_head(&self.fixed) else {
            return Ok(None);
        };
        let end = self.pos + FRAME_HEAD_LEN as u64 + head.body_len() as u64;
        if end > self.len {
            return Ok(None);
        }
        self.body.resize(head.body_len(), 0);
        self.file
            .read_exact_at(&mut self.body, self.pos + FRAME_HEAD_LEN as u64)?;
        let Some(frame) = verify_frame(&self.fixed, head, &self.body) else {
            return Ok(None);
        };
        self.pos = end;
        Ok(Some(frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(path: &[u8], segment: u32, offset: u64, data: &[u8]) -> Vec<u8> {
        let t = Target {
            path,
            segment,
            offset,
        };
        let mut b = encode_frame_head(&t, data);
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(journal_name(3), "journal-00000003.jnl");
        assert_eq!(parse_journal_name("journal-00000003.jnl"), Some(3));
        assert_eq!(parse_journal_name("journal-00000000.jnl"), None);
        assert_eq!(parse_journal_name("journal-3.jnl"), None);
        assert!(check_file_header(&encode_file_header()));
    }

    type Frames = Vec<(Vec<u8>, u32, u64, Vec<u8>)>;

    fn frames() -> impl Strategy<Value = Frames> {
        proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 0..20),
                any::<u32>(),
                any::<u64>(),
                proptest::collection::vec(any::<u8>(), 0..300),
            ),
            0..8,
        )
    }

    fn parse_all(mut b: &[u8]) -> Frames {
        let mut out = Vec::new();
        while let Some((t, data, len)) = parse_frame(b) {
            out.push((t.path.to_vec(), t.segment, t.offset, data.to_vec()));
            b = &b[len..];
        }
        out
    }

    proptest! {
        #[test]
        fn frames_round_trip_and_a_torn_tail_keeps_only_whole_frames(
            fs in frames(), cut in any::<prop::sample::Index>()
        ) {
            let encoded: Vec<Vec<u8>> = fs.iter().map(|(p, s, o, d)| frame(p, *s, *o, d)).collect();
            let all = encoded.concat();
            prop_assert_eq!(parse_all(&all), fs.clone());
            let cut = cut.index(all.len() + 1);
            let whole = encoded.iter().scan(0, |end, f| { *end += f.len(); Some(*end) })
                .take_while(|end| *end <= cut).count();
            prop_assert_eq!(parse_all(&all[..cut]), fs[..whole].to_vec());
        }

        #[test]
        fn a_flipped_bit_ends_the_journal_at_its_frame(
            fs in frames(), bit in any::<prop::sample::Index>()
        ) {
            let encoded: Vec<Vec<u8>> = fs.iter().map(|(p, s, o, d)| frame(p, *s, *o, d)).collect();
            let mut all = encoded.concat();
            prop_assume!(!all.is_empty());
            let bit = bit.index(all.len() * 8);
            all[bit / 8] ^= 1 << (bit % 8);
            let damaged = encoded.iter().scan(0, |end, f| { *end += f.len(); Some(*end) })
                .take_while(|end| *end <= bit / 8).count();
            prop_assert_eq!(parse_all(&all), fs[..damaged].to_vec());
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_all(&b);
            let _ = check_file_header(&b);
        }
    }
}
