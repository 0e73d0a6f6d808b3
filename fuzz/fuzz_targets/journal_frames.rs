//! Feeds arbitrary bytes to the disk journal's frame parser (the code `Disk::open` runs on
//! whatever it finds in a journal file before any store opens). It must never panic, never
//! allocate from an unchecked length, and every frame it accepts must re-encode to the same bytes.
//!
//! Run: `cargo +nightly fuzz run journal_frames` (from the repository root).
//! Check on stable: `cargo check --manifest-path fuzz/Cargo.toml`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = larder_store::fuzzing::parse_journal_for_fuzz(data);
});
