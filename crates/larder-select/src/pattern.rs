//! Regular expressions of `=~`, compiled once when the selection is parsed, with the `regex`
//! crate: finite automata, no backtracking, so matching is linear in the text, and compiling is
//! bounded by `MAX_REGEX_BYTES` of pattern and `REGEX_SIZE_LIMIT` of compiled program.

use regex::{Regex, RegexBuilder};

use crate::bounds::{MAX_REGEX_BYTES, REGEX_SIZE_LIMIT};

/// A compiled regular expression; unanchored (it matches if found anywhere in the text, as in
/// Vespa: anchor it with `^…$` to match the whole text).
#[derive(Debug, Clone)]
pub(crate) struct Pattern(Regex);

impl Pattern {
    pub(crate) fn compile(pattern: &str) -> Result<Pattern, String> {
        if pattern.len() > MAX_REGEX_BYTES {
            return Err(format!(
                "regular expression is longer than {MAX_REGEX_BYTES} bytes"
            ));
        }
        RegexBuilder::new(pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map(Pattern)
            .map_err(|e| format!("bad regular expression: {}", first_line(&e.to_string())))
    }

    pub(crate) fn matches(&self, text: &str) -> bool {
        self.0.is_match(text)
    }
}

/// The regex crate's errors draw the pattern over several lines; an HTTP answer wants one.
fn first_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines.last().copied().unwrap_or(message).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unanchored_bounded_and_linear() {
        let p = Pattern::compile("^Hel+o").unwrap();
        assert!(p.matches("Hello World") && !p.matches("Oh Hello"));
        assert!(Pattern::compile("b+").unwrap().matches("abbc"));
        assert!(Pattern::compile(&"a".repeat(MAX_REGEX_BYTES + 1)).is_err());
        // A program past the size limit is refused at parse time, not built.
        let err = Pattern::compile(r"\w{1000}{1000}").unwrap_err();
        assert!(
            err.contains("size limit") || err.contains("exceeds"),
            "{err}"
        );
        assert!(Pattern::compile("(unclosed")
            .unwrap_err()
            .contains("bad regular"));
        // The classic catastrophic backtracking pattern: linear here.
        let text = "a".repeat(1 << 20);
        let started = std::time::Instant::now();
        assert!(!Pattern::compile("(a+)+$b").unwrap().matches(&text));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}
