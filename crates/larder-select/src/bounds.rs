//! The bounds on what the selection parser accepts, in one place. The frontend's document API
//! takes its nesting limit for document bodies from here too (`MAX_NESTING`), so that the limit
//! stays one number.

/// Deepest nesting accepted anywhere: parentheses and `not` in a selection, and arrays and
/// objects in a document's fields (the `fields` object itself counts as one level). serde_json
/// refuses past 128 on its own; Larder's lower limit leaves room for the wrapping of a request
/// body (`{"fields": {"f": {"assign": …}}}`) and keeps every recursive walk of a parsed value
/// (evaluation, serialisation, drop) a few hundred stack frames at most.
pub const MAX_NESTING: usize = 64;

/// Longest selection, in bytes (query parameter or feed body). Real selections are a few dozen
/// bytes; the limit bounds tokenising and parsing time and the size of the parsed tree.
pub const MAX_SELECTION_BYTES: usize = 16 * 1024;

/// Longest glob pattern (the right-hand side of `=`), in characters. Matching costs one pass
/// over the text per pattern segment that contains `?`, each step a bit-parallel shift over
/// `len / 64` words: 1024 characters is 16 words, so a 10 MiB field is a fraction of a second
/// at worst (and callers run matching off their async workers).
pub const MAX_GLOB_CHARS: usize = 1024;

/// Longest regular expression (the right-hand side of `=~`), in bytes.
pub const MAX_REGEX_BYTES: usize = 1024;

/// Largest compiled program of one regular expression (and of its lazy DFA's cache), in bytes:
/// what bounds compile time and memory. The `regex` crate matches in time linear in the text.
pub const REGEX_SIZE_LIMIT: usize = 256 * 1024;

/// Most regular expressions in one selection: with `REGEX_SIZE_LIMIT`, a selection's compiled
/// regexes take at most 4 MiB.
pub const MAX_REGEXES: usize = 16;

/// The nesting depth of a parser in progress: `enter` on each level opened, `leave` on each
/// closed. Parsers call this rather than counting on their own so the limit stays one number.
#[derive(Debug, Default)]
pub(crate) struct Depth(usize);

impl Depth {
    pub(crate) fn enter(&mut self, what: &str) -> Result<(), String> {
        self.0 += 1;
        if self.0 > MAX_NESTING {
            return Err(format!("{what} nests deeper than {MAX_NESTING} levels"));
        }
        Ok(())
    }

    pub(crate) fn leave(&mut self) {
        self.0 = self.0.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_refuses_one_level_past_the_limit() {
        let mut depth = Depth::default();
        for _ in 0..MAX_NESTING {
            depth.enter("x").unwrap();
        }
        assert!(depth.enter("x").is_err());
    }
}
