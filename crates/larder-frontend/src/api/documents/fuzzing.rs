//! Entry points for fuzzers and robustness tests of `/document/v1`'s parsers. Not part of the
//! stable API.

use bytes::Bytes;
use serde_json::Value;

use super::bounds::MAX_NESTING;
use super::condition::{self, Subject};
use super::update::Fields;
use super::{body, bounds};

/// The document conditions are evaluated against: a few fields of each JSON kind.
fn sample_fields() -> Fields {
    let value = serde_json::json!({
        "title": "Hello World", "year": 2005, "rating": 4.5, "live": true,
        "tags": ["a", "b"], "none": null,
    });
    match value {
        Value::Object(fields) => fields,
        _ => unreachable!("the sample is an object"),
    }
}

/// Parses `text` as a condition exactly as a request's `condition` is parsed and, if accepted,
/// evaluates it against a sample document and a missing one. Must never panic or overflow the
/// stack; returns whether the condition was accepted.
pub fn condition_for_fuzz(text: &str) -> bool {
    let Ok(parsed) = condition::parse(text) else {
        return false;
    };
    let fields = sample_fields();
    for fields in [Some(&fields), None] {
        let subject = Subject {
            id: "id:ns:music::1",
            doctype: "music",
            fields,
        };
        let _ = parsed.matches(&subject);
    }
    true
}

/// Parses `data` as a put body and as an update body, and applies an accepted update to the
/// sample document, as the API does. Must never panic; a put it accepts holds a JSON object no
/// deeper than the limit (asserted).
pub fn document_body_for_fuzz(data: &[u8]) {
    let data = Bytes::copy_from_slice(data);
    if let Ok(put) = body::put(&data) {
        assert!(serde_json::from_slice::<Fields>(&put.fields).is_ok());
        assert!(bounds::json_nesting(&put.fields) <= MAX_NESTING);
        if let Some(text) = put.condition {
            condition_for_fuzz(&text);
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
