//! HTTP byte ranges (RFC 9110 §14): one range per request, `bytes=a-b`, `bytes=a-`, `bytes=-n`.
//!
//! Anything else a client may send in `Range` (another unit, several ranges, a malformed or
//! backwards range-spec) is a range this server does not honour, and RFC 9110 §14.2 lets a server
//! ignore such a header and answer 200 with the whole representation: `parse` says
//! [`RangeError::Ignored`] and callers do exactly that. Positions too large for a u64 saturate: a
//! first position past u64::MAX is past the end of any blob (416), a last position or suffix that
//! large reaches the end (RFC 9110 §14.1.2).

use std::ops::Range;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteRange {
    /// `bytes=a-b`, inclusive.
    FromTo(u64, u64),
    /// `bytes=a-`
    From(u64),
    /// `bytes=-n`: the last n bytes.
    Suffix(u64),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Not one byte range (another unit, several ranges, malformed): RFC 9110 lets a server
    /// ignore the header and send the whole blob, which is what the public API does.
    #[error(
        "Range header ignored (only one range of bytes=a-b, bytes=a- or bytes=-n is honoured)"
    )]
    Ignored,
    #[error("range not satisfiable for a blob of {size} bytes")]
    Unsatisfiable { size: u64 },
}

impl ByteRange {
    /// Parses a `Range` header value. Linear in the value's length; never panics.
    pub fn parse(value: &str) -> Result<ByteRange, RangeError> {
        let (unit, spec) = value.trim().split_once('=').ok_or(RangeError::Ignored)?;
        // Range units are case-insensitive (RFC 9110 §14.1).
        if !unit.trim().eq_ignore_ascii_case("bytes") || spec.contains(',') {
            return Err(RangeError::Ignored);
        }
        let (first, last) = spec.split_once('-').ok_or(RangeError::Ignored)?;
        let (first, last) = (first.trim(), last.trim());
        match (first.is_empty(), last.is_empty()) {
            (true, true) => Err(RangeError::Ignored),
            (true, false) => Ok(ByteRange::Suffix(position(last)?)),
            (false, true) => Ok(ByteRange::From(position(first)?)),
            (false, false) => {
                let (a, b) = (position(first)?, position(last)?);
                if b < a {
                    // An invalid range-spec (RFC 9110 §14.1.1): the header is ignored.
                    return Err(RangeError::Ignored);
                }
                Ok(ByteRange::FromTo(a, b))
            }
        }
    }

    /// The half-open byte range this selects in a blob of `size` bytes.
    pub fn resolve(self, size: u64) -> Result<Range<u64>, RangeError> {
        let unsatisfiable = Err(RangeError::Unsatisfiable { size });
        match self {
            ByteRange::FromTo(a, _) | ByteRange::From(a) if a >= size => unsatisfiable,
            ByteRange::FromTo(a, b) => Ok(a..b.saturating_add(1).min(size)),
            ByteRange::From(a) => Ok(a..size),
            // No byte to select: an empty blob has no last bytes (RFC 9110 14.1.1).
            ByteRange::Suffix(_) if size == 0 => unsatisfiable,
            ByteRange::Suffix(0) => unsatisfiable,
            ByteRange::Suffix(n) => Ok(size.saturating_sub(n)..size),
        }
    }

    /// The header value that requests this range again (for forwarding).
    pub fn to_header(self) -> String {
        match self {
            ByteRange::FromTo(a, b) => format!("bytes={a}-{b}"),
            ByteRange::From(a) => format!("bytes={a}-"),
            ByteRange::Suffix(n) => format!("bytes=-{n}"),
        }
    }
}

/// A position (`1*DIGIT`): digits only, saturating at u64::MAX, which no blob reaches.
fn position(text: &str) -> Result<u64, RangeError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RangeError::Ignored);
    }
    Ok(text.bytes().fold(0u64, |n, digit| {
        n.saturating_mul(10).saturating_add(u64::from(digit - b'0'))
    }))
}

/// `Content-Range` value for a resolved range.
pub fn content_range(range: &Range<u64>, size: u64) -> String {
    format!("bytes {}-{}/{size}", range.start, range.end - 1)
}

impl RangeError {
    /// `Content-Range` of a 416 answer, when the size is known.
    pub fn content_range(&self) -> Option<String> {
        match self {
            RangeError::Unsatisfiable { size } => Some(format!("bytes */{size}")),
            RangeError::Ignored => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_and_resolve() {
        let r = |s: &str, size| ByteRange::parse(s).and_then(|r| r.resolve(size));
        assert_eq!(r("bytes=0-9", 100), Ok(0..10));
        assert_eq!(r("bytes=90-200", 100), Ok(90..100));
        assert_eq!(r("bytes=10-", 100), Ok(10..100));
        assert_eq!(r("bytes=-10", 100), Ok(90..100));
        assert_eq!(r("bytes=-500", 100), Ok(0..100));
        assert_eq!(r("BYTES=0-3", 100), Ok(0..4));
        assert_eq!(r("Bytes=-3", 100), Ok(97..100));
        assert_eq!(
            r("bytes=100-", 100),
            Err(RangeError::Unsatisfiable { size: 100 })
        );
        assert_eq!(
            r("bytes=-0", 100),
            Err(RangeError::Unsatisfiable { size: 100 })
        );
        assert_eq!(
            r("bytes=0-0", 0),
            Err(RangeError::Unsatisfiable { size: 0 })
        );
        assert_eq!(content_range(&(0..10), 100), "bytes 0-9/100");
    }

    #[test]
    fn huge_positions_saturate() {
        let r = |s: &str, size| ByteRange::parse(s).and_then(|r| r.resolve(size));
        let huge = "99999999999999999999999";
        assert_eq!(
            r(&format!("bytes={huge}-"), 100),
            Err(RangeError::Unsatisfiable { size: 100 })
        );
        assert_eq!(
            r(&format!("bytes={huge}-{huge}9"), 100),
            Err(RangeError::Unsatisfiable { size: 100 })
        );
        assert_eq!(r(&format!("bytes=5-{huge}"), 100), Ok(5..100));
        assert_eq!(r(&format!("bytes=-{huge}"), 100), Ok(0..100));
    }

    #[test]
    fn ranges_not_honoured_are_ignored() {
        for ignored in [
            "",
            "bytes",
            "bytes=",
            "bytes=-",
            "bytes=5-1",
            "items=0-1",
            "bytes=0-1,3-4",
            "bytes=0-1,",
            "bytes=a-b",
            "bytes=+1-2",
            "bytes=1-+2",
            "bytes=-1-2",
            "bytes=١-٢",
        ] {
            assert_eq!(
                ByteRange::parse(ignored),
                Err(RangeError::Ignored),
                "{ignored}"
            );
        }
    }

    /// Found by the proptest below (CI, 2026-12-07): a suffix of an empty blob resolved to an
    /// empty range, which a 206 cannot describe.
    #[test]
    fn a_suffix_of_an_empty_blob_is_unsatisfiable() {
        assert_eq!(
            ByteRange::Suffix(1).resolve(0),
            Err(RangeError::Unsatisfiable { size: 0 })
        );
        assert_eq!(ByteRange::Suffix(5).resolve(3), Ok(0..3));
    }

    proptest! {
        #[test]
        fn resolved_ranges_are_inside_the_blob(s in "bytes=[0-9]{0,4}-[0-9]{0,4}", size in 0u64..10_000) {
            if let Ok(range) = ByteRange::parse(&s).and_then(|r| r.resolve(size)) {
                prop_assert!(range.start < range.end && range.end <= size);
            }
        }

        /// Any text at all: parsing never panics, and each outcome is one of the three RFC 9110
        /// answers (a range inside the blob, ignore the header, or 416 with the size).
        #[test]
        fn any_header_gives_a_range_inside_the_blob_or_ignore_or_416(
            s in "(?i:bytes)?[ =,0-9-]{0,30}|\\PC{0,40}",
            size in any::<u64>(),
        ) {
            match ByteRange::parse(&s) {
                Err(err) => prop_assert_eq!(err, RangeError::Ignored),
                Ok(range) => match range.resolve(size) {
                    Ok(selected) => prop_assert!(selected.start < selected.end && selected.end <= size),
                    Err(err) => prop_assert_eq!(err, RangeError::Unsatisfiable { size }),
                },
            }
        }

        #[test]
        fn forwarded_ranges_parse_back(a in any::<u64>(), b in any::<u64>(), pick in 0..3u8) {
            let range = match pick {
                0 => ByteRange::FromTo(a.min(b), a.max(b)),
                1 => ByteRange::From(a),
                _ => ByteRange::Suffix(a),
            };
            prop_assert_eq!(ByteRange::parse(&range.to_header()), Ok(range));
        }
    }
}
