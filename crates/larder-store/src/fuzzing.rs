//! Entry points for fuzzers and robustness tests. Not part of the stable API.

/// Where the fuzz entry points pretend a record sits (a record's CRC covers its position).
const SEGMENT: u32 = 1;
const OFFSET: u64 = crate::format::FILE_HEADER_LEN;

/// Decodes `data` as a record (and as a segment header) exactly as recovery does. Must never
/// panic; returns whether a record was accepted. On acceptance the decoded record re-encodes
/// to the same bytes, which the fuzz target asserts.
pub fn decode_record_for_fuzz(data: &[u8]) -> bool {
    let _ = crate::format::check_file_header(data, 1);
    match crate::format::decode_record(data, SEGMENT, OFFSET) {
        Ok(rec) => {
            let chunks = [bytes::Bytes::copy_from_slice(rec.data)];
            let crcs = crate::format::block_crcs(&chunks);
            let mut again = crate::format::encode_head(&rec.info, &crcs, SEGMENT, OFFSET);
            again.extend_from_slice(rec.data);
            assert_eq!(
                &again[..],
                &data[..again.len()],
                "accepted record must re-encode identically"
            );
            true
        }
        Err(_) => false,
    }
}

/// Encodes a put-blob record as it would appear in a segment: seeds for fuzzing and tests.
pub fn encode_record_for_fuzz(
    key: &[u8],
    props: &[u8],
    data: &[u8],
    time_ms: u64,
    expires_ms: Option<u64>,
) -> Vec<u8> {
    let info = crate::format::RecordInfo {
        op: crate::types::Op::PutBlob,
        key: bytes::Bytes::copy_from_slice(key),
        props: bytes::Bytes::copy_from_slice(props),
        time_ms,
        expires_ms,
        version: 0,
        size: data.len() as u64,
        seq: 1,
    };
    let mut out = crate::format::encode_head(
        &info,
        &crate::format::block_crcs(&[bytes::Bytes::copy_from_slice(data)]),
        SEGMENT,
        OFFSET,
    );
    out.extend_from_slice(data);
    out
}

/// Parses `data` as the frames of a journal file (after its header) exactly as recovery does.
/// Must never panic; every accepted frame re-encodes to the same bytes, which this asserts.
/// Returns the number of frames accepted before the first invalid byte.
pub fn parse_journal_for_fuzz(data: &[u8]) -> usize {
    let _ = crate::journal::check_file_header(data);
    let mut rest = data;
    let mut frames = 0;
    while let Some((target, payload, len)) = crate::journal::parse_frame(rest) {
        let mut again = crate::journal::encode_frame_head(&target, payload);
        again.extend_from_slice(payload);
        assert_eq!(
            &again[..],
            &rest[..len],
            "accepted frame must re-encode identically"
        );
        rest = &rest[len..];
        frames += 1;
    }
    frames
}
