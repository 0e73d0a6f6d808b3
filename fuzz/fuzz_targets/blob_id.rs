//! Feeds arbitrary text and bytes to the blob ID parsers (every `/v1/blobs/<id>` request, and
//! every chunk ID in a composite blob's record). They must never panic, and an ID they accept must
//! print back to exactly the text and bytes it came from.
//!
//! Run: `cargo +nightly fuzz run blob_id` (from the repository root).
//! Check on stable: `cargo check --manifest-path fuzz/Cargo.toml`.

#![no_main]

use larder_cluster::BlobId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = BlobId::from_bytes(data) {
        assert_eq!(&id.to_bytes()[..], data);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(id) = text.parse::<BlobId>() {
            assert_eq!(id.to_string(), text);
        }
    }
});
