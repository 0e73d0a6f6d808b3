//! On-disk encoding of segment file headers and records (see `FORMAT.md`). Little-endian.
//!
//! Decoding never trusts a length before it is bounded: the fixed header is sanity-checked first,
//! then the variable head (key, props, block CRC table) is checked against the header CRC, and
//! only then are data blocks read and checked one by one.

use bytes::Bytes;

use crate::types::Op;

/// Version written into every segment header and record header.
/// Version 2 added the sequence number to every record and the incarnation and first sequence
/// to every segment header; version 1 directories are refused (`FORMAT.md`).
pub(crate) const FORMAT_VERSION: u8 = 2;
pub(crate) const SEGMENT_MAGIC: &[u8; 6] = b"LARDER";
pub(crate) const SEGMENT_KIND: u8 = b'S';
pub(crate) const FILE_HEADER_LEN: u64 = 32;
/// Length of a version 1 segment header, recognised only to refuse it clearly.
const V1_FILE_HEADER_LEN: usize = 16;
pub(crate) const RECORD_MAGIC: &[u8; 4] = b"LRec";
/// Fixed part of a record header; the CRC sits in its last 4 bytes.
pub(crate) const HEADER_LEN: usize = 60;
const SEQ_AT: usize = 48;
const CRC_AT: usize = 56;
/// Data is checksummed in blocks of this size so range reads verify only what they touch.
pub(crate) const BLOCK_SIZE: u64 = 64 << 10;
/// Largest props a record may carry (props live in memory in the index).
pub(crate) const MAX_PROPS_LEN: usize = 1 << 20;
/// Sanity bound for decoding, so a garbage length cannot drive a huge allocation.
pub(crate) const MAX_DATA_LEN: u64 = 1 << 40;
const FLAG_EXPIRES: u16 = 1;

pub(crate) fn op_code(op: Op) -> u8 {
    match op {
        Op::PutBlob => 1,
        Op::DeleteBlob => 2,
        Op::PutDoc => 3,
        Op::RemoveDoc => 4,
    }
}

fn op_from(code: u8) -> Option<Op> {
    Some(match code {
        1 => Op::PutBlob,
        2 => Op::DeleteBlob,
        3 => Op::PutDoc,
        4 => Op::RemoveDoc,
        _ => return None,
    })
}

/// Everything a record says except its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecordInfo {
    pub op: Op,
    pub key: Bytes,
    pub props: Bytes,
    pub time_ms: u64,
    pub expires_ms: Option<u64>,
    pub version: u64,
    /// Data length.
    pub size: u64,
    /// The record's sequence number in its log (its change feed position); 0 until appended.
    pub seq: u64,
}

impl RecordInfo {
    pub fn head_len(&self) -> u64 {
        head_len(self.key.len(), self.props.len(), self.size)
    }
}

pub(crate) fn blocks_for(size: u64) -> u64 {
    size.div_ceil(BLOCK_SIZE)
}

/// Length of header + key + props + block CRC table: everything before the data.
pub(crate) fn head_len(key_len: usize, props_len: usize, size: u64) -> u64 {
    HEADER_LEN as u64 + key_len as u64 + props_len as u64 + 4 * blocks_for(size)
}

/// The fixed header, parsed and bounds-checked but not yet CRC-verified.
#[derive(Clone, Debug)]
pub(crate) struct Fixed {
    pub op: Op,
    pub key_len: usize,
    pub props_len: usize,
    pub size: u64,
    pub time_ms: u64,
    pub expires_ms: Option<u64>,
    pub version: u64,
    pub seq: u64,
    crc: u32,
}

impl Fixed {
    pub fn head_len(&self) -> u64 {
        head_len(self.key_len, self.props_len, self.size)
    }
}

/// Why bytes are not a valid record head. All variants mean "not a record here".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeadError {
    Short,
    BadMagic,
    /// A record version other than the segment's is treated as corruption, not as a newer
    /// format: one flipped bit must not make the whole store refuse to open.
    BadVersion(u8),
    BadField(&'static str),
    BadCrc,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

pub(crate) fn parse_fixed(b: &[u8]) -> Result<Fixed, HeadError> {
    if b.len() < HEADER_LEN {
        return Err(HeadError::Short);
    }
    if &b[0..4] != RECORD_MAGIC {
        return Err(HeadError::BadMagic);
    }
    if b[4] != FORMAT_VERSION {
        return Err(HeadError::BadVersion(b[4]));
    }
    let op = op_from(b[5]).ok_or(HeadError::BadField("op"))?;
    let flags = u16_at(b, 6);
    if flags & !FLAG_EXPIRES != 0 || u16_at(b, 10) != 0 {
        return Err(HeadError::BadField("flags"));
    }
    let key_len = u16_at(b, 8) as usize;
    if key_len == 0 || key_len > crate::types::MAX_KEY_LEN {
        return Err(HeadError::BadField("key length"));
    }
    let props_len = u32_at(b, 12) as usize;
    if props_len > MAX_PROPS_LEN {
        return Err(HeadError::BadField("props length"));
    }
    let size = u64_at(b, 16);
    if size > MAX_DATA_LEN {
        return Err(HeadError::BadField("data length"));
    }
    let expires = u64_at(b, 32);
    if flags & FLAG_EXPIRES == 0 && expires != 0 {
        // Keeps the encoding canonical: one record, one byte string.
        return Err(HeadError::BadField("expiry without flag"));
    }
    Ok(Fixed {
        op,
        key_len,
        props_len,
        size,
        time_ms: u64_at(b, 24),
        expires_ms: (flags & FLAG_EXPIRES != 0).then_some(expires),
        version: u64_at(b, 40),
        seq: u64_at(b, SEQ_AT),
        crc: u32_at(b, CRC_AT),
    })
}

/// The CRC covers the fixed header (minus the CRC field), key, props, block CRC table and the
/// record's own position (segment id, offset): a record is valid only where it was written, so
/// a segment stored as a blob's data can never be mistaken for records when recovery scans past
/// a corrupt header.
fn head_crc(head: &[u8], segment: u32, offset: u64) -> u32 {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head[..CRC_AT]), &head[HEADER_LEN..]);
    let mut position = [0u8; 12];
    position[..4].copy_from_slice(&segment.to_le_bytes());
    position[4..].copy_from_slice(&offset.to_le_bytes());
    crc32c::crc32c_append(crc, &position)
}

/// A verified record head borrowing from the buffer it was read from.
pub(crate) struct Head<'a> {
    pub fixed: Fixed,
    pub key: &'a [u8],
    pub props: &'a [u8],
    /// Raw little-endian block CRC table.
    pub crcs: &'a [u8],
}

impl Head<'_> {
    pub fn to_info(&self) -> RecordInfo {
        let f = &self.fixed;
        RecordInfo {
            op: f.op,
            key: Bytes::copy_from_slice(self.key),
            props: Bytes::copy_from_slice(self.props),
            time_ms: f.time_ms,
            expires_ms: f.expires_ms,
            version: f.version,
            size: f.size,
            seq: f.seq,
        }
    }
    pub fn block_crc(&self, block: u64) -> u32 {
        u32_at(self.crcs, block as usize * 4)
    }
}

/// Verifies the head region `b` (at least `fixed.head_len()` bytes), read at `offset` of
/// segment `segment`, against its CRC.
pub(crate) fn verify_head(
    b: &[u8],
    fixed: Fixed,
    segment: u32,
    offset: u64,
) -> Result<Head<'_>, HeadError> {
    let hl = fixed.head_len() as usize;
    if b.len() < hl {
        return Err(HeadError::Short);
    }
    let b = &b[..hl];
    if head_crc(b, segment, offset) != fixed.crc {
        return Err(HeadError::BadCrc);
    }
    let key_end = HEADER_LEN + fixed.key_len;
    let props_end = key_end + fixed.props_len;
    Ok(Head {
        key: &b[HEADER_LEN..key_end],
        props: &b[key_end..props_end],
        crcs: &b[props_end..],
        fixed,
    })
}

/// Encodes everything before the data of a record written at `offset` of segment `segment`;
/// `crcs` from [`block_crcs`].
pub(crate) fn encode_head(info: &RecordInfo, crcs: &[u32], segment: u32, offset: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(info.head_len() as usize);
    b.extend_from_slice(RECORD_MAGIC);
    b.push(FORMAT_VERSION);
    b.push(op_code(info.op));
    let flags = if info.expires_ms.is_some() {
        FLAG_EXPIRES
    } else {
        0
    };
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&(info.key.len() as u16).to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&(info.props.len() as u32).to_le_bytes());
    b.extend_from_slice(&info.size.to_le_bytes());
    b.extend_from_slice(&info.time_ms.to_le_bytes());
    b.extend_from_slice(&info.expires_ms.unwrap_or(0).to_le_bytes());
    b.extend_from_slice(&info.version.to_le_bytes());
    b.extend_from_slice(&info.seq.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&info.key);
    b.extend_from_slice(&info.props);
    for c in crcs {
        b.extend_from_slice(&c.to_le_bytes());
    }
    let crc = head_crc(&b, segment, offset);
    b[CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    b
}

/// CRC32C of each 64 KiB block of the concatenation of `chunks`, without concatenating them.
pub(crate) fn block_crcs(chunks: &[Bytes]) -> Vec<u32> {
    let mut out = Vec::new();
    let (mut crc, mut fill) = (0u32, 0usize);
    for chunk in chunks {
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let take = (BLOCK_SIZE as usize - fill).min(rest.len());
            crc = crc32c::crc32c_append(crc, &rest[..take]);
            fill += take;
            rest = &rest[take..];
            if fill == BLOCK_SIZE as usize {
                out.push(crc);
                (crc, fill) = (0, 0);
            }
        }
    }
    if fill > 0 {
        out.push(crc);
    }
    out
}

/// A fully decoded and verified record borrowing its data from the input.
pub(crate) struct Decoded<'a> {
    pub info: RecordInfo,
    pub data: &'a [u8],
}

/// Why a whole-record decode failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DecodeError {
    Head(HeadError),
    Truncated,
    /// Data block `n` failed its CRC.
    BadBlock(u64),
}

/// Decodes and verifies one record at the start of `b`, which was read at `offset` of segment
/// `segment` (header, head CRC and every data block).
pub(crate) fn decode_record(
    b: &[u8],
    segment: u32,
    offset: u64,
) -> Result<Decoded<'_>, DecodeError> {
    let fixed = parse_fixed(b).map_err(DecodeError::Head)?;
    let hl = fixed.head_len();
    let total = hl.checked_add(fixed.size).ok_or(DecodeError::Truncated)?;
    if (b.len() as u64) < total {
        return Err(DecodeError::Truncated);
    }
    let head = verify_head(b, fixed, segment, offset).map_err(DecodeError::Head)?;
    let data = &b[hl as usize..total as usize];
    for (i, block) in data.chunks(BLOCK_SIZE as usize).enumerate() {
        if crc32c::crc32c(block) != head.block_crc(i as u64) {
            return Err(DecodeError::BadBlock(i as u64));
        }
    }
    Ok(Decoded {
        info: head.to_info(),
        data,
    })
}

/// What a segment header says besides its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    /// The store's incarnation: the same in every segment of a directory.
    pub incarnation: u64,
    /// No record in the segment has a smaller sequence number (a lower bound: the segment may
    /// start later, or be empty).
    pub first_seq: u64,
}

pub(crate) fn encode_file_header(segment: u32, h: SegmentHeader) -> [u8; FILE_HEADER_LEN as usize] {
    let mut b = [0u8; FILE_HEADER_LEN as usize];
    b[..6].copy_from_slice(SEGMENT_MAGIC);
    b[6] = FORMAT_VERSION;
    b[7] = SEGMENT_KIND;
    b[8..12].copy_from_slice(&segment.to_le_bytes());
    b[12..20].copy_from_slice(&h.incarnation.to_le_bytes());
    b[20..28].copy_from_slice(&h.first_seq.to_le_bytes());
    let crc = crc32c::crc32c(&b[..28]);
    b[28..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// What a segment's first bytes say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileHeader {
    Valid(SegmentHeader),
    /// Shorter than a header: the file was being created when the process died.
    Short,
    /// Fails its CRC or names another segment; the records are still scanned as this version.
    Corrupt,
    /// A well-formed header of a format this build does not read.
    Unsupported(u8),
}

pub(crate) fn check_file_header(b: &[u8], segment: u32) -> FileHeader {
    // A version 1 header (16 bytes, CRC of 0..12 at 12) is recognised first: such a directory is
    // refused with a clear error rather than scanned as corrupt.
    if b.len() >= V1_FILE_HEADER_LEN
        && &b[..6] == SEGMENT_MAGIC
        && b[6] == 1
        && crc32c::crc32c(&b[..12]) == u32_at(b, 12)
    {
        return FileHeader::Unsupported(1);
    }
    if b.len() < FILE_HEADER_LEN as usize {
        return FileHeader::Short;
    }
    // The CRC comes first so that a flipped version bit reads as corruption, not as a newer format.
    if crc32c::crc32c(&b[..28]) != u32_at(b, 28) || &b[..6] != SEGMENT_MAGIC {
        return FileHeader::Corrupt;
    }
    if b[6] != FORMAT_VERSION {
        return FileHeader::Unsupported(b[6]);
    }
    if b[7] != SEGMENT_KIND || u32_at(b, 8) != segment {
        return FileHeader::Corrupt;
    }
    FileHeader::Valid(SegmentHeader {
        incarnation: u64_at(b, 12),
        first_seq: u64_at(b, 20),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(size: u64) -> RecordInfo {
        RecordInfo {
            op: Op::PutBlob,
            key: Bytes::from_static(b"key"),
            props: Bytes::from_static(b"props"),
            time_ms: 7,
            expires_ms: Some(9),
            version: 0,
            size,
            seq: 42,
        }
    }

    #[test]
    fn round_trip_across_chunks_and_blocks() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let chunks = [
            Bytes::copy_from_slice(&data[..1000]),
            Bytes::copy_from_slice(&data[1000..]),
        ];
        let crcs = block_crcs(&chunks);
        assert_eq!(crcs.len(), 4);
        assert_eq!(crcs, block_crcs(&[Bytes::from(data.clone())]));
        let mut rec = encode_head(&info(data.len() as u64), &crcs, 3, 16);
        rec.extend_from_slice(&data);
        let d = decode_record(&rec, 3, 16).unwrap();
        assert!(
            decode_record(&rec, 3, 17).is_err(),
            "a record is valid only at its position"
        );
        assert!(
            decode_record(&rec, 4, 16).is_err(),
            "and only in its segment"
        );
        assert_eq!(d.info, info(data.len() as u64));
        assert_eq!(d.data, &data[..]);
        let last = rec.len() - 1;
        rec[last] ^= 1;
        assert_eq!(
            decode_record(&rec, 3, 16).err(),
            Some(DecodeError::BadBlock(3))
        );
        rec[10] ^= 1;
        assert!(decode_record(&rec, 3, 16).is_err());
    }

    #[test]
    fn file_header_versions() {
        let sh = SegmentHeader {
            incarnation: 0xfeed,
            first_seq: 9,
        };
        let h = encode_file_header(3, sh);
        assert_eq!(check_file_header(&h, 3), FileHeader::Valid(sh));
        assert_eq!(check_file_header(&h, 4), FileHeader::Corrupt);
        assert_eq!(check_file_header(&h[..5], 3), FileHeader::Short);
        assert_eq!(check_file_header(&h[..20], 3), FileHeader::Short);
        let mut v3 = h;
        v3[6] = 3;
        assert_eq!(check_file_header(&v3, 3), FileHeader::Corrupt);
        let crc = crc32c::crc32c(&v3[..28]);
        v3[28..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(check_file_header(&v3, 3), FileHeader::Unsupported(3));
        // A version 1 header, as that format wrote it.
        let mut v1 = [0u8; 16];
        v1[..6].copy_from_slice(SEGMENT_MAGIC);
        v1[6] = 1;
        v1[7] = SEGMENT_KIND;
        v1[8..12].copy_from_slice(&3u32.to_le_bytes());
        let crc = crc32c::crc32c(&v1[..12]);
        v1[12..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(check_file_header(&v1, 3), FileHeader::Unsupported(1));
    }
}
