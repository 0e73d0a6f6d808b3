//! Feeds arbitrary bytes to the two decoders of batched GETs (a frontend's batch, as a storage
//! node reads it, and a node's answer, as a frontend reads it). They must never panic; every
//! batch accepted must encode back to the same bytes, and every answer accepted too.
//!
//! Run: `cargo +nightly fuzz run get_batch` (from the repository root).
//! Check on stable: `cargo check --manifest-path fuzz/Cargo.toml`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = larder_proto::decode_get_batch(data) {
        let refs: Vec<&larder_proto::GetItem> = batch.items.iter().collect();
        assert_eq!(larder_proto::encode_get_batch(batch.inline_up_to, &refs), data);
    }
    let body = bytes::Bytes::copy_from_slice(data);
    let expected = data.len() % 8;
    if let Ok(answers) = larder_proto::decode_get_answers(&body, expected) {
        assert_eq!(answers.len(), expected);
        let again = larder_proto::encode_get_answers(&answers);
        assert_eq!(larder_proto::decode_get_answers(&again, expected), Ok(answers));
    }
});
