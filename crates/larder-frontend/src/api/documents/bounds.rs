//! The bounds on what `/document/v1` parses, in one place: every parser of client text here
//! (the condition language today, any selection language added later, document and update
//! bodies) takes its limits from this module, so that no input can make the frontend recurse,
//! allocate or compute without a bound.

/// Deepest nesting accepted anywhere: parentheses and `not` in a condition, and arrays and
/// objects in a document's fields (the `fields` object itself counts as one level). serde_json
/// refuses past 128 on its own; Larder's lower limit leaves room for the wrapping of a request
/// body (`{"fields": {"f": {"assign": …}}}`) and keeps every recursive walk of a parsed value
/// (evaluation, serialisation, drop) a few hundred stack frames at most.
pub const MAX_NESTING: usize = 64;

/// Longest condition, in bytes (query parameter or feed body). Real conditions are a few dozen
/// bytes; the limit bounds tokenising and parsing time and the size of the parsed tree.
pub const MAX_CONDITION_BYTES: usize = 16 * 1024;

/// Longest glob pattern (the right-hand side of `=`), in characters. Matching costs one pass
/// over the text per pattern segment that contains `?`, each step a bit-parallel shift over
/// `len / 64` words: 1024 characters is 16 words, so a 10 MiB field is a fraction of a second
/// at worst (and matching runs off the async workers).
pub const MAX_GLOB_CHARS: usize = 1024;

/// The nesting depth of a parser in progress: `enter` on each level opened, `leave` on each
/// closed. Parsers call this rather than counting on their own so the limit stays one number.
#[derive(Debug, Default)]
pub struct Depth(usize);

impl Depth {
    pub fn enter(&mut self, what: &str) -> Result<(), String> {
        self.0 += 1;
        if self.0 > MAX_NESTING {
            return Err(format!("{what} nests deeper than {MAX_NESTING} levels"));
        }
        Ok(())
    }

    pub fn leave(&mut self) {
        self.0 = self.0.saturating_sub(1);
    }
}

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

    #[test]
    fn depth_refuses_one_level_past_the_limit() {
        let mut depth = Depth::default();
        for _ in 0..MAX_NESTING {
            depth.enter("x").unwrap();
        }
        assert!(depth.enter("x").is_err());
    }
}
