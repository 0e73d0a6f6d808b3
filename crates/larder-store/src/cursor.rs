//! The stable string form of a [`Cursor`]: `<incarnation>.<sequence>`, the incarnation as 16
//! lowercase hex digits and the sequence in decimal, e.g. `00c0ffee12345678.1048576`.
//!
//! A cursor of the old physical form (`<segment>.<offset>`, format version 1) does not parse: a
//! caller that saved one starts again from [`Cursor::START`], which is always safe (replication
//! applies changes idempotently).

use std::fmt;
use std::str::FromStr;

use crate::types::Cursor;

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}.{}", self.incarnation, self.sequence)
    }
}

/// A string that is not a cursor produced by [`Cursor`]'s `Display`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid cursor {0:?}: expected <16 hex digits>.<sequence>")]
pub struct ParseCursorError(pub String);

impl FromStr for Cursor {
    type Err = ParseCursorError;

    fn from_str(s: &str) -> Result<Cursor, ParseCursorError> {
        let bad = || ParseCursorError(s.chars().take(64).collect());
        let (incarnation, sequence) = s.split_once('.').ok_or_else(bad)?;
        // Exact forms only: `u64::from_str` would also accept a leading '+'.
        let hex = incarnation.len() == 16
            && incarnation
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
        // Canonical decimal (no leading zero), so one cursor has one string form.
        let digits = !sequence.is_empty()
            && sequence.bytes().all(|c| c.is_ascii_digit())
            && (sequence == "0" || !sequence.starts_with('0'));
        if !hex || !digits {
            return Err(bad());
        }
        Ok(Cursor {
            incarnation: u64::from_str_radix(incarnation, 16).map_err(|_| bad())?,
            sequence: sequence.parse().map_err(|_| bad())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        for c in [
            Cursor::START,
            Cursor {
                incarnation: 0xc0ffee,
                sequence: 123_456,
            },
            Cursor {
                incarnation: u64::MAX,
                sequence: u64::MAX,
            },
        ] {
            assert_eq!(c.to_string().parse::<Cursor>(), Ok(c));
        }
        assert_eq!(
            Cursor {
                incarnation: 0xab,
                sequence: 16
            }
            .to_string(),
            "00000000000000ab.16"
        );
        for bad in [
            "",
            "1",
            "3.1048576",
            "00000000000000ab.",
            ".1",
            "+000000000000000.2",
            "00000000000000AB.2",
            "00000000000000ab.2.3",
            "00000000000000ab.-2",
            "00000000000000ab.02",
            "00000000000000ab.18446744073709551616",
            " 00000000000000ab.2",
        ] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn parsing_never_panics_and_round_trips(s in "\\PC{0,40}", i: u64, q: u64) {
            if let Ok(c) = s.parse::<Cursor>() {
                prop_assert_eq!(c.to_string(), s);
            }
            let c = Cursor { incarnation: i, sequence: q };
            prop_assert_eq!(c.to_string().parse::<Cursor>(), Ok(c));
        }
    }
}
