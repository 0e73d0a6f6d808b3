//! The bounds on what `/document/v1` parses, in one place: document and update bodies take their
//! limits from this module (the selection language, conditions included, has its own in
//! `larder_select`, which shares `MAX_NESTING`), so that no input can make the frontend recurse,
//! allocate or compute without a bound.

/// Deepest nesting of a document's fields (and of a selection): one number, owned by the
/// selection crate (see `larder_select::MAX_NESTING`).
pub use larder_select::MAX_NESTING;

/// The deepest nesting of arrays and objects in `json`, found without parsing it or recursing:
/// a scan that skips strings. Run before serde_json sees a body, so a body deeper than
/// `MAX_NESTING` (plus its wrapping) is refused with a clear message whatever its size. Invalid
/// JSON is left for the parser to report.
pub fn json_nesting(json: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in json {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// How deep a request body may nest beyond the document it carries: an update wraps a field's
/// new value in `{"fields": {"<field>": {"assign": …}}}`, two levels above the field's own.
pub const BODY_WRAPPING: usize = 2;

/// Fails when `json` nests deeper than `allowed` levels (`MAX_NESTING` for a document's
/// fields, `MAX_NESTING + BODY_WRAPPING` for a whole request body).
pub fn check_nesting(json: &[u8], allowed: usize, what: &str) -> Result<(), String> {
    let depth = json_nesting(json);
    if depth > allowed {
        return Err(format!(
            "{what} nests {depth} levels deep; documents may nest at most {MAX_NESTING} levels"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_skips_strings_and_counts_both_brackets() {
        assert_eq!(json_nesting(br#"{"a":[1,{"b":"[[[{"}]}"#), 3);
        assert_eq!(json_nesting(br#""\"[[""#), 0);
        assert_eq!(json_nesting(b"[[[]]]"), 3);
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(json_nesting(deep.as_bytes()), 100_000);
        let limit = "[".repeat(MAX_NESTING);
        assert!(check_nesting(limit.as_bytes(), MAX_NESTING, "x").is_ok());
        assert!(check_nesting(format!("[{limit}").as_bytes(), MAX_NESTING, "x").is_err());
    }
}
