//! Feeds arbitrary bytes to the log store's record decoder (the code recovery runs on whatever
//! it finds on disk). It must never panic, never allocate from an unchecked length, and a record
//! it accepts must re-encode to the same bytes.
//!
//! Run: `cargo +nightly fuzz run record_decoder` (from the repository root).
//! Check on stable: `cargo check --manifest-path fuzz/Cargo.toml`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = larder_store::fuzzing::decode_record_for_fuzz(data);
});
