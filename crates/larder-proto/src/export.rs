//! The bulk bootstrap stream (`GET /internal/v1/partitions/<p>/export`): a replica's live
//! records and tombstones, in its change feed's order, with their positions, as checksummed
//! frames (`INTERNAL_API.md`, "Export"). A new replica copies a whole partition in one HTTP/2
//! exchange instead of one request per blob.
//!
//! Stream: a 20-byte head (magic `LRDREXP1`, the source replica's incarnation, CRC32C of both),
//! then frames. A frame:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 1 | kind: 1 put blob, 2 delete blob, 3 put doc, 4 remove doc, 0xEE end |
//! | 1 | 1 | flags: bit 0 = has expiry; other bits 0 |
//! | 2 | 2 | key length (0 only for the end frame), at most [`MAX_KEY`] |
//! | 4 | 4 | props length, at most [`MAX_PROPS`] |
//! | 8 | 8 | data length, at most the decoder's limit |
//! | 16 | 8 | sequence: the record's position in the source's feed (the end frame: where to resume) |
//! | 24 | 8 | operation time, ms since the epoch |
//! | 32 | 8 | expiry, ms since the epoch (0 without the flag) |
//! | 40 | 8 | document version (0 for blobs) |
//! | 48 | .. | key, props, data |
//! | .. | 4 | CRC32C of every byte of the frame before it |
//!
//! The decoder checks the lengths against their caps before it buffers anything, so a hostile
//! peer can make it hold at most one frame of the largest allowed size.

use bytes::{Buf, BufMut, Bytes, BytesMut};

const MAGIC: &[u8; 8] = b"LRDREXP1";
/// The stream's head: magic, incarnation, CRC.
pub const STREAM_HEAD_LEN: usize = 20;
const FRAME_HEAD_LEN: usize = 48;
/// Longest key (the store's limit).
pub const MAX_KEY: usize = 1024;
/// Longest properties (the store's limit).
pub const MAX_PROPS: usize = 1 << 20;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    PutBlob,
    DeleteBlob,
    PutDoc,
    RemoveDoc,
    /// The last frame: the stream is complete and `sequence` is where the next export resumes.
    End,
}

impl FrameKind {
    fn code(self) -> u8 {
        match self {
            FrameKind::PutBlob => 1,
            FrameKind::DeleteBlob => 2,
            FrameKind::PutDoc => 3,
            FrameKind::RemoveDoc => 4,
            FrameKind::End => 0xEE,
        }
    }

    fn from_code(code: u8) -> Option<FrameKind> {
        Some(match code {
            1 => FrameKind::PutBlob,
            2 => FrameKind::DeleteBlob,
            3 => FrameKind::PutDoc,
            4 => FrameKind::RemoveDoc,
            0xEE => FrameKind::End,
            _ => return None,
        })
    }
}

/// One record of the source replica (or the end of the stream).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportFrame {
    pub kind: FrameKind,
    pub sequence: u64,
    pub key: Bytes,
    pub props: Bytes,
    pub data: Bytes,
    pub time_ms: u64,
    pub expires_ms: Option<u64>,
    pub version: u64,
}

impl ExportFrame {
    /// The end frame: everything up to `sequence` was sent.
    pub fn end(sequence: u64) -> ExportFrame {
        ExportFrame {
            kind: FrameKind::End,
            sequence,
            key: Bytes::new(),
            props: Bytes::new(),
            data: Bytes::new(),
            time_ms: 0,
            expires_ms: None,
            version: 0,
        }
    }

    /// The frame's bytes, checksum included.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(usize::try_from(self.wire_len()).unwrap_or(0));
        self.encode_into(&mut out);
        out.freeze()
    }

    /// Appends the frame's bytes, checksum included, to `out` (an exporter packs many small
    /// frames into one DATA frame this way, each copied once).
    pub fn encode_into(&self, out: &mut BytesMut) {
        let start = out.len();
        out.reserve(usize::try_from(self.wire_len()).unwrap_or(0));
        out.put_u8(self.kind.code());
        out.put_u8(u8::from(self.expires_ms.is_some()));
        out.put_u16_le(u16::try_from(self.key.len()).unwrap_or(u16::MAX));
        out.put_u32_le(u32::try_from(self.props.len()).unwrap_or(u32::MAX));
        out.put_u64_le(self.data.len() as u64);
        out.put_u64_le(self.sequence);
        out.put_u64_le(self.time_ms);
        out.put_u64_le(self.expires_ms.unwrap_or(0));
        out.put_u64_le(self.version);
        out.put_slice(&self.key);
        out.put_slice(&self.props);
        out.put_slice(&self.data);
        let crc = crc32c::crc32c(&out[start..]);
        out.put_u32_le(crc);
    }

    /// Bytes of the frame on the wire.
    pub fn wire_len(&self) -> u64 {
        (FRAME_HEAD_LEN + self.key.len() + self.props.len() + 4) as u64 + self.data.len() as u64
    }
}

/// The stream's head: names the source replica's incarnation (the resume cursor's).
pub fn encode_stream_head(incarnation: u64) -> Bytes {
    let mut out = BytesMut::with_capacity(STREAM_HEAD_LEN);
    out.put_slice(MAGIC);
    out.put_u64_le(incarnation);
    let crc = crc32c::crc32c(&out);
    out.put_u32_le(crc);
    out.freeze()
}

/// Why an export stream was refused. Every error ends the stream: nothing after a bad frame
/// is trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    #[error("export stream: bad head")]
    BadHead,
    #[error("export stream: unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("export stream: bad flags {0:#x}")]
    BadFlags(u8),
    #[error("export stream: {what} length {len} over its limit {limit}")]
    TooLong {
        what: &'static str,
        len: u64,
        limit: u64,
    },
    #[error("export stream: frame checksum mismatch at sequence {0}")]
    Checksum(u64),
    #[error("export stream: frames after the end frame")]
    AfterEnd,
}

/// Incremental decoder of an export stream: feed it the body's bytes as they arrive, take
/// frames out. Holds at most one frame (its lengths checked against the caps first).
pub struct ExportDecoder {
    buf: BytesMut,
    max_data: u64,
    incarnation: Option<u64>,
    ended: bool,
}

impl ExportDecoder {
    /// `max_data`: the largest record data accepted (the node's `max_record_size`).
    pub fn new(max_data: u64) -> ExportDecoder {
        ExportDecoder {
            buf: BytesMut::new(),
            max_data,
            incarnation: None,
            ended: false,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The source's incarnation, once the head was read.
    pub fn incarnation(&self) -> Option<u64> {
        self.incarnation
    }

    /// Whether the end frame was read.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Bytes buffered and not yet decoded (a stream that ends with some is truncated).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next complete, verified frame; `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<ExportFrame>, ExportError> {
        if self.incarnation.is_none() {
            if self.buf.len() < STREAM_HEAD_LEN {
                return Ok(None);
            }
            let head = self.buf.split_to(STREAM_HEAD_LEN);
            let crc = u32::from_le_bytes([head[16], head[17], head[18], head[19]]);
            if &head[..8] != MAGIC || crc32c::crc32c(&head[..16]) != crc {
                return Err(ExportError::BadHead);
            }
            let mut incarnation = &head[8..16];
            self.incarnation = Some(incarnation.get_u64_le());
        }
        if self.buf.len() < FRAME_HEAD_LEN {
            return Ok(None);
        }
        if self.ended {
            return Err(ExportError::AfterEnd);
        }
        let total = self.checked_len()?;
        if (self.buf.len() as u64) < total {
            // Reserve once what the frame needs (bounded by the caps just checked).
            self.buf
                .reserve(usize::try_from(total).unwrap_or(usize::MAX) - self.buf.len());
            return Ok(None);
        }
        let frame = self
            .buf
            .split_to(usize::try_from(total).expect("bounded by the caps"));
        let frame = decode_checked(frame.freeze())?;
        self.ended = frame.kind == FrameKind::End;
        Ok(Some(frame))
    }

    /// The whole frame's length from its head, every field against its cap.
    fn checked_len(&self) -> Result<u64, ExportError> {
        let head = &self.buf[..FRAME_HEAD_LEN];
        let kind = FrameKind::from_code(head[0]).ok_or(ExportError::UnknownKind(head[0]))?;
        if head[1] > 1 {
            return Err(ExportError::BadFlags(head[1]));
        }
        let key = u64::from(u16::from_le_bytes([head[2], head[3]]));
        let props = u64::from(u32::from_le_bytes([head[4], head[5], head[6], head[7]]));
        let mut data = &head[8..16];
        let data = data.get_u64_le();
        let limit = |what, len, limit: u64| match len > limit {
            true => Err(ExportError::TooLong { what, len, limit }),
            false => Ok(()),
        };
        let end = kind == FrameKind::End;
        limit("key", key, if end { 0 } else { MAX_KEY as u64 })?;
        limit("props", props, if end { 0 } else { MAX_PROPS as u64 })?;
        limit("data", data, if end { 0 } else { self.max_data })?;
        // Each term is capped above, so this cannot overflow.
        Ok(FRAME_HEAD_LEN as u64 + key + props + data + 4)
    }
}

/// Decodes one whole frame whose lengths were checked; verifies its checksum first.
fn decode_checked(frame: Bytes) -> Result<ExportFrame, ExportError> {
    let body_len = frame.len() - 4;
    let mut tail = &frame[body_len..];
    let crc = tail.get_u32_le();
    let mut head = &frame[..FRAME_HEAD_LEN];
    let kind = FrameKind::from_code(head.get_u8()).ok_or(ExportError::UnknownKind(0))?;
    let flags = head.get_u8();
    let key_len = usize::from(head.get_u16_le());
    let props_len = head.get_u32_le() as usize;
    let data_len = usize::try_from(head.get_u64_le()).expect("bounded by the caps");
    let sequence = head.get_u64_le();
    if crc32c::crc32c(&frame[..body_len]) != crc {
        return Err(ExportError::Checksum(sequence));
    }
    let time_ms = head.get_u64_le();
    let expires_ms = head.get_u64_le();
    let version = head.get_u64_le();
    let key_at = FRAME_HEAD_LEN;
    let props_at = key_at + key_len;
    let data_at = props_at + props_len;
    Ok(ExportFrame {
        kind,
        sequence,
        key: frame.slice(key_at..props_at),
        props: frame.slice(props_at..data_at),
        data: frame.slice(data_at..data_at + data_len),
        time_ms,
        expires_ms: (flags & 1 == 1).then_some(expires_ms),
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(kind: FrameKind, key: &[u8], props: &[u8], data: &[u8], seq: u64) -> ExportFrame {
        ExportFrame {
            kind,
            sequence: seq,
            key: Bytes::copy_from_slice(key),
            props: Bytes::copy_from_slice(props),
            data: Bytes::copy_from_slice(data),
            time_ms: 17,
            expires_ms: seq.is_multiple_of(2).then_some(99),
            version: seq.wrapping_mul(3),
        }
    }

    fn decode_all(bytes: &[u8], step: usize) -> Result<Vec<ExportFrame>, ExportError> {
        let mut decoder = ExportDecoder::new(1 << 20);
        let mut out = Vec::new();
        for piece in bytes.chunks(step.max(1)) {
            decoder.push(piece);
            while let Some(frame) = decoder.next_frame()? {
                out.push(frame);
            }
        }
        Ok(out)
    }

    #[test]
    fn a_stream_round_trips_in_any_pieces() {
        let frames = vec![
            frame(FrameKind::PutBlob, b"k1", b"p", &[7; 1000], 1),
            frame(FrameKind::DeleteBlob, b"k2", b"", b"", 2),
            frame(FrameKind::PutDoc, b"d", b"", b"{}", 3),
            ExportFrame::end(9),
        ];
        let mut wire = encode_stream_head(0xabc).to_vec();
        for f in &frames {
            wire.extend_from_slice(&f.encode());
        }
        for step in [1, 7, 4096] {
            assert_eq!(decode_all(&wire, step).unwrap(), frames);
        }
    }

    #[test]
    fn frames_packed_into_one_buffer_decode_alike() {
        let frames = vec![
            frame(FrameKind::PutBlob, b"k1", b"p", &[7; 100], 1),
            frame(FrameKind::RemoveDoc, b"d", b"", b"", 2),
            ExportFrame::end(3),
        ];
        let mut packed = BytesMut::from(&encode_stream_head(9)[..]);
        frames.iter().for_each(|f| f.encode_into(&mut packed));
        let one_by_one: Vec<u8> = std::iter::once(encode_stream_head(9))
            .chain(frames.iter().map(ExportFrame::encode))
            .flat_map(|b| b.to_vec())
            .collect();
        assert_eq!(&packed[..], &one_by_one[..]);
        assert_eq!(decode_all(&packed, 4096).unwrap(), frames);
    }

    #[test]
    fn a_flipped_bit_is_refused_never_returned() {
        let mut wire = encode_stream_head(1).to_vec();
        wire.extend_from_slice(&frame(FrameKind::PutBlob, b"k", b"", &[1; 64], 4).encode());
        let at = wire.len() - 10;
        wire[at] ^= 1;
        assert_eq!(decode_all(&wire, 3), Err(ExportError::Checksum(4)));
    }

    #[test]
    fn lengths_over_their_caps_are_refused_before_buffering() {
        let mut wire = encode_stream_head(1).to_vec();
        let mut big = frame(FrameKind::PutBlob, b"k", b"", b"", 1)
            .encode()
            .to_vec();
        big[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        wire.extend_from_slice(&big);
        let mut decoder = ExportDecoder::new(1 << 20);
        decoder.push(&wire);
        assert!(matches!(
            decoder.next_frame(),
            Err(ExportError::TooLong { what: "data", .. })
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_and_accepted_frames_re_encode(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            step in 1usize..64,
        ) {
            let mut wire = encode_stream_head(5).to_vec();
            wire.extend_from_slice(&bytes);
            if let Ok(frames) = decode_all(&wire, step) {
                for f in frames {
                    let again = decode_all(&[encode_stream_head(5).to_vec(), f.encode().to_vec()].concat(), 1);
                    prop_assert_eq!(again.unwrap(), vec![f]);
                }
            }
        }

        #[test]
        fn encoded_frames_decode_to_themselves(
            key in proptest::collection::vec(any::<u8>(), 1..64),
            props in proptest::collection::vec(any::<u8>(), 0..64),
            data in proptest::collection::vec(any::<u8>(), 0..2048),
            seq in any::<u64>(),
            kind in 1u8..=4,
        ) {
            let f = frame(FrameKind::from_code(kind).unwrap(), &key, &props, &data, seq);
            let wire = [encode_stream_head(seq).to_vec(), f.encode().to_vec()].concat();
            prop_assert_eq!(decode_all(&wire, 13).unwrap(), vec![f]);
        }
    }
}
