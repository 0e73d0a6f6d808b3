//! Glob patterns of conditions (`music.title = 'Hel*o W?rld'`), compiled when the condition is
//! parsed and matched in time linear in the text.
//!
//! A pattern is segments separated by `*`. The text must start with the first segment and end
//! with the last; the segments between are found left to right, each at its leftmost place
//! after the previous one (leftmost is always right: a `*` on both sides absorbs whatever a
//! later placement would have skipped). Each segment is searched once over a disjoint stretch
//! of the text: `str::find` (linear) for segments without `?`, a bit-parallel shift-and over
//! `len / 64` words per character for segments with `?`. Nothing backtracks, so no pattern
//! can make matching quadratic (the classic two-pointer glob with star backtracking is
//! O(text × pattern): that is what stalled the workers).

use std::collections::HashMap;

use crate::bounds::MAX_GLOB_CHARS;

/// A compiled glob pattern.
#[derive(Debug, Clone)]
pub struct Glob {
    pattern: String,
    /// The segments between `*`s; exactly one when the pattern has no `*`.
    segments: Vec<Segment>,
}

impl PartialEq for Glob {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern
    }
}

impl Glob {
    pub fn compile(pattern: &str) -> Result<Glob, String> {
        if pattern.chars().count() > MAX_GLOB_CHARS {
            return Err(format!(
                "glob pattern is longer than {MAX_GLOB_CHARS} characters"
            ));
        }
        Ok(Glob {
            pattern: pattern.to_owned(),
            segments: pattern.split('*').map(Segment::new).collect(),
        })
    }

    pub fn matches(&self, text: &str) -> bool {
        let (first, rest) = self
            .segments
            .split_first()
            .expect("split yields one segment");
        let Some((last, middle)) = rest.split_last() else {
            return first.matches_exactly(text);
        };
        let Some(after_first) = first.strip_prefix_of(text) else {
            return false;
        };
        let Some(mut between) = last.strip_suffix_of(after_first) else {
            return false;
        };
        for segment in middle {
            match segment.find_end(between) {
                Some(end) => between = &between[end..],
                None => return false,
            }
        }
        true
    }
}

/// One run of literal characters and `?`s.
#[derive(Debug, Clone)]
struct Segment {
    literal: String,
    chars: Vec<char>,
    /// For a segment with `?`: the shift-and masks (see `find_end`); `None` for a literal.
    masks: Option<Masks>,
}

#[derive(Debug, Clone)]
struct Masks {
    /// Bit `j` set where the segment's `j`th character is `c` or `?`.
    by_char: HashMap<char, Vec<u64>>,
    /// Bit `j` set where the segment's `j`th character is `?` (for characters not in it).
    wild: Vec<u64>,
}

impl Segment {
    fn new(text: &str) -> Segment {
        let chars: Vec<char> = text.chars().collect();
        let masks = chars.contains(&'?').then(|| Masks::new(&chars));
        Segment {
            literal: text.to_owned(),
            chars,
            masks,
        }
    }

    fn char_matches(pattern: char, c: char) -> bool {
        pattern == '?' || pattern == c
    }

    fn matches_exactly(&self, text: &str) -> bool {
        let mut chars = text.chars();
        self.chars
            .iter()
            .all(|p| chars.next().is_some_and(|c| Self::char_matches(*p, c)))
            && chars.next().is_none()
    }

    fn strip_prefix_of<'t>(&self, text: &'t str) -> Option<&'t str> {
        let mut chars = text.chars();
        for p in &self.chars {
            if !chars.next().is_some_and(|c| Self::char_matches(*p, c)) {
                return None;
            }
        }
        Some(chars.as_str())
    }

    fn strip_suffix_of<'t>(&self, text: &'t str) -> Option<&'t str> {
        let mut chars = text.chars();
        for p in self.chars.iter().rev() {
            if !chars.next_back().is_some_and(|c| Self::char_matches(*p, c)) {
                return None;
            }
        }
        Some(chars.as_str())
    }

    /// The byte offset just past the leftmost occurrence of this segment in `text`.
    fn find_end(&self, text: &str) -> Option<usize> {
        let Some(masks) = &self.masks else {
            let literal = &self.literal;
            return text.find(literal).map(|start| start + literal.len());
        };
        if self.chars.is_empty() {
            return Some(0);
        }
        // Shift-and: bit j of `state` says the last j+1 characters read match the segment's
        // first j+1. One pass, O(text × segment / 64).
        let last = self.chars.len() - 1;
        let mut state = vec![0u64; masks.wild.len()];
        for (offset, c) in text.char_indices() {
            let mask = masks.by_char.get(&c).unwrap_or(&masks.wild);
            shift_in_one(&mut state);
            for (word, m) in state.iter_mut().zip(mask) {
                *word &= m;
            }
            if state[last / 64] & (1 << (last % 64)) != 0 {
                return Some(offset + c.len_utf8());
            }
        }
        None
    }
}

impl Masks {
    fn new(chars: &[char]) -> Masks {
        let words = chars.len().div_ceil(64);
        let mut wild = vec![0u64; words];
        let mut by_char: HashMap<char, Vec<u64>> = HashMap::new();
        for (j, c) in chars.iter().enumerate() {
            if *c == '?' {
                wild[j / 64] |= 1 << (j % 64);
            }
        }
        for (j, c) in chars.iter().enumerate() {
            if *c != '?' {
                let mask = by_char.entry(*c).or_insert_with(|| wild.clone());
                mask[j / 64] |= 1 << (j % 64);
            }
        }
        Masks { by_char, wild }
    }
}

/// `state = (state << 1) | 1` over a little-endian array of words.
fn shift_in_one(state: &mut [u64]) {
    let mut carry = 1;
    for word in state.iter_mut() {
        let next = *word >> 63;
        *word = (*word << 1) | carry;
        carry = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious exponential-time definition, as the reference.
    fn reference(pattern: &[char], text: &[char]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some(('*', rest)) => (0..=text.len()).any(|i| reference(rest, &text[i..])),
            Some((p, rest)) => text
                .split_first()
                .is_some_and(|(c, tail)| (*p == '?' || p == c) && reference(rest, tail)),
        }
    }

    fn check(pattern: &str, text: &str) {
        let expected = reference(
            &pattern.chars().collect::<Vec<_>>(),
            &text.chars().collect::<Vec<_>>(),
        );
        let glob = Glob::compile(pattern).unwrap();
        assert_eq!(glob.matches(text), expected, "{pattern:?} on {text:?}");
    }

    #[test]
    fn known_cases() {
        for (pattern, text) in [
            ("Hello*", "Hello World"),
            ("H?llo W*d", "Hello World"),
            ("*", ""),
            ("", ""),
            ("", "a"),
            ("a*a", "a"),
            ("a*a", "aa"),
            ("*ab*ab", "abab"),
            ("*?b?*", "ab"),
            ("*a?c*", "xxabcabc"),
            ("é?*ü", "éßü"),
            ("*aab", "aaab"),
        ] {
            check(pattern, text);
        }
        let long = "?".repeat(130);
        check(&format!("*{long}x*"), &format!("{}x", "y".repeat(200)));
        assert!(Glob::compile(&"a".repeat(MAX_GLOB_CHARS + 1)).is_err());
    }

    #[test]
    fn pathological_patterns_are_linear() {
        let text = "a".repeat(1 << 20);
        let pattern = format!("{}b", "*a".repeat(500));
        let started = std::time::Instant::now();
        assert!(!Glob::compile(&pattern).unwrap().matches(&text));
        let pattern = format!("*{}b*", "a?".repeat(500));
        assert!(!Glob::compile(&pattern).unwrap().matches(&text));
        // Generous: the quadratic matcher took many seconds on this; linear takes milliseconds.
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    proptest! {
        #[test]
        fn agrees_with_the_reference(pattern in "[ab?*]{0,10}", text in "[abc]{0,12}") {
            check(&pattern, &text);
        }
    }
}
