//! Feeds arbitrary bytes to the composite record's decoder, every version (1; 2 and 3, parts) (every GET, delete and
//! settlement of a composite blob reads one back from a storage node). It must never panic, and
//! a record it accepts must encode back to exactly the bytes it came from.
//!
//! Run: `cargo +nightly fuzz run composite_record` (from the repository root).
//! Check on stable: `cargo check --manifest-path fuzz/Cargo.toml`.

#![no_main]

use larder_router::Composite;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Composite::decode(data) {
        Ok(Composite::Chunks(manifest)) => assert_eq!(manifest.encode(), data),
        Ok(Composite::Parts(parts)) => {
            assert_eq!(parts.encode(), data);
            // Every part's range lies inside the object.
            for number in 1..=parts.parts.len() {
                let range = parts.part_range(number).expect("a listed part");
                assert!(range.end <= parts.size);
            }
        }
        Err(_) => {}
    }
});
