//! Feeds arbitrary text to the selection parser and evaluator (`larder_select`: `/document/v1`'s
//! conditions and visit selections), and arbitrary bytes to the document API's
//! put and update body parsers (with the update applied). They must never panic, never
//! overflow the stack (nesting is bounded), and never take more than linear time (libFuzzer's
//! `-timeout` catches a slow input).
//!
//! Run: `cargo +nightly fuzz run condition` (from the repository root).
//! Check on stable: `cargo check --manifest-path fuzz/Cargo.toml`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        larder_select::fuzzing::selection_for_fuzz(text);
    }
    larder_frontend::fuzzing::document_body_for_fuzz(data);
});
