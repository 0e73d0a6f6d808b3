//! Feeds arbitrary bytes to the two decoders of batched PUTs (a frontend's batch, as a storage
//! node reads it, and a node's answer, as a frontend reads it). They must never panic, and
//! every batch accepted must encode back to the same bytes.
//!
//! Run: `cargo +nightly fuzz run put_batch` (from the repository root).
//! Check on stable: `cargo check --manifest-path fuzz/Cargo.toml`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let body = bytes::Bytes::copy_from_slice(data);
    if let Ok(items) = larder_proto::decode_put_batch(&body) {
        let refs: Vec<&larder_proto::PutItem> = items.iter().collect();
        assert_eq!(larder_proto::encode_put_batch(&refs), body);
    }
    let expected = data.len() % 16;
    if let Ok(answers) = larder_proto::decode_answers(data, expected) {
        assert_eq!(answers.len(), expected);
    }
});
