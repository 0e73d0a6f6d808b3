//! Feeds arbitrary text to the `Range` header parser (client input on every blob GET) and
//! resolves what it accepts against arbitrary sizes. It must never panic, and every outcome must
//! be one of RFC 9110's three: a range inside the blob, ignore the header, or 416 with the size.
//!
//! Run: `cargo +nightly fuzz run range` (from the repository root).
//! Check on stable: `cargo check --manifest-path fuzz/Cargo.toml`.

#![no_main]

use larder_proto::{ByteRange, RangeError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, u64)| {
    let (header, size) = input;
    match ByteRange::parse(header) {
        Err(err) => assert_eq!(err, RangeError::Ignored),
        Ok(range) => {
            assert_eq!(ByteRange::parse(&range.to_header()), Ok(range));
            match range.resolve(size) {
                Ok(selected) => assert!(selected.start < selected.end && selected.end <= size),
                Err(err) => assert_eq!(err, RangeError::Unsatisfiable { size }),
            }
        }
    }
});
