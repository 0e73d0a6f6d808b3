//! Entry points for fuzzers and robustness tests of the selection parser. Not part of the
//! stable API.

use serde_json::Value;

use crate::{Document, Fields, Selection};

/// The document selections are evaluated against: a few fields of each JSON kind.
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

/// Parses `text` as a selection exactly as a request's `condition` or `selection` is parsed
/// and, if accepted, evaluates it against a sample document and a missing one. Must never panic
/// or overflow the stack; returns whether the selection was accepted.
pub fn selection_for_fuzz(text: &str) -> bool {
    let Ok(parsed) = Selection::parse(text) else {
        return false;
    };
    let fields = sample_fields();
    for fields in [Some(&fields), None] {
        let doc = Document {
            id: "id:ns:music::1",
            doctype: "music",
            fields,
        };
        let _ = parsed.matches(&doc);
    }
    true
}
