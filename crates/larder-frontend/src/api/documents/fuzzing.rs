//! Entry points for fuzzers and robustness tests of `/document/v1`'s body parsers (conditions
//! are parsed by `larder_select`, which has its own). Not part of the stable API.

use bytes::Bytes;

use super::bounds::MAX_NESTING;
use super::update::Fields;
use super::{body, bounds};

/// Parses `data` as a put body (and its condition) and as an update body, and applies an
/// accepted update to a sample document, as the API does. Must never panic; a put it accepts holds a JSON object no
/// deeper than the limit (asserted).
pub fn document_body_for_fuzz(data: &[u8]) {
    let data = Bytes::copy_from_slice(data);
    if let Ok(put) = body::put(&data) {
        assert!(serde_json::from_slice::<Fields>(&put.fields).is_ok());
        assert!(bounds::json_nesting(&put.fields) <= MAX_NESTING);
        if let Some(text) = put.condition {
            larder_select::fuzzing::selection_for_fuzz(&text);
        }
    }
    if let Ok(update) = body::update(&data) {
        let _ = super::updated(Some(br#"{"title":"x","n":1,"tags":["a"]}"#), &update.fields);
        let _ = super::updated(None, &update.fields);
    }
}

/// Parses `text` as a visiting continuation exactly as a request's `continuation` is parsed;
/// a token it accepts must encode back to itself (modulo padding). Must never panic.
pub fn continuation_for_fuzz(text: &str) -> bool {
    match super::continuation::Position::decode(text) {
        Ok(position) => {
            let again = super::continuation::Position::decode(&position.encode());
            assert_eq!(again.as_ref(), Ok(&position));
            true
        }
        Err(_) => false,
    }
}
