//! The stable string form of a [`Cursor`]: `<segment>.<offset>` in decimal, e.g. `3.1048576`.

use std::fmt;
use std::str::FromStr;

use crate::types::Cursor;

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.segment, self.offset)
    }
}

/// A string that is not a cursor produced by [`Cursor`]'s `Display`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid cursor {0:?}: expected <segment>.<offset>")]
pub struct ParseCursorError(pub String);

impl FromStr for Cursor {
    type Err = ParseCursorError;

    fn from_str(s: &str) -> Result<Cursor, ParseCursorError> {
        let bad = || ParseCursorError(s.chars().take(64).collect());
        let (segment, offset) = s.split_once('.').ok_or_else(bad)?;
        // Digits only: `u64::from_str` would also accept a leading '+'.
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit());
        if !digits(segment) || !digits(offset) {
            return Err(bad());
        }
        Ok(Cursor {
            segment: segment.parse().map_err(|_| bad())?,
            offset: offset.parse().map_err(|_| bad())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        for c in [
            Cursor::START,
            Cursor {
                segment: 7,
                offset: 123_456,
            },
            Cursor {
                segment: u32::MAX,
                offset: u64::MAX,
            },
        ] {
            assert_eq!(c.to_string().parse::<Cursor>(), Ok(c));
        }
        assert_eq!(
            Cursor {
                segment: 3,
                offset: 16
            }
            .to_string(),
            "3.16"
        );
        for bad in [
            "",
            "1",
            "1.",
            ".1",
            "+1.2",
            "1.2.3",
            "a.b",
            "1.-2",
            "4294967296.0",
            " 1.2",
        ] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad:?}");
        }
    }
}
