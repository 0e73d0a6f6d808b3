//! Feeds arbitrary bytes to the parsers of visiting: the public continuation token (a client's
//! text) and the internal visit page and query (a storage node's answer, a frontend's request).
//! They must never panic, and what they accept must encode back to an equal value.
//!
//! Run: `cargo +nightly fuzz run visit_wire` (from the repository root).
//! Check on stable: `cargo check --manifest-path fuzz/Cargo.toml`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        larder_frontend::fuzzing::continuation_for_fuzz(text);
        if let Ok(query) = larder_proto::VisitQuery::parse(text) {
            let path = query.path(0);
            let (_, again) = path.split_once('?').expect("a visit path has a query");
            assert_eq!(larder_proto::VisitQuery::parse(again), Ok(query));
        }
    }
    let bytes = bytes::Bytes::copy_from_slice(data);
    if let Ok(page) = larder_proto::VisitPage::decode(&bytes) {
        let again = larder_proto::VisitPage::decode(&bytes::Bytes::from(page.encode()));
        assert_eq!(again, Ok(page));
    }
});
