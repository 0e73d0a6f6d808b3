//! HTTP byte ranges (RFC 9110 §14): one range per request, `bytes=a-b`, `bytes=a-`, `bytes=-n`.

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
    #[error("malformed Range header (expected bytes=a-b, bytes=a- or bytes=-n)")]
    Malformed,
    #[error("range not satisfiable for a blob of {size} bytes")]
    Unsatisfiable { size: u64 },
}

impl ByteRange {
    pub fn parse(value: &str) -> Result<ByteRange, RangeError> {
        let spec = value
            .trim()
            .strip_prefix("bytes=")
            .ok_or(RangeError::Malformed)?;
        if spec.contains(',') {
            // Multipart ranges are not supported; treat as malformed rather than guess.
            return Err(RangeError::Malformed);
        }
        let (first, last) = spec.split_once('-').ok_or(RangeError::Malformed)?;
        let number = |s: &str| s.trim().parse::<u64>().map_err(|_| RangeError::Malformed);
        match (first.trim().is_empty(), last.trim().is_empty()) {
            (true, true) => Err(RangeError::Malformed),
            (true, false) => Ok(ByteRange::Suffix(number(last)?)),
            (false, true) => Ok(ByteRange::From(number(first)?)),
            (false, false) => {
                let (a, b) = (number(first)?, number(last)?);
                if b < a {
                    return Err(RangeError::Malformed);
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

/// `Content-Range` value for a resolved range.
pub fn content_range(range: &Range<u64>, size: u64) -> String {
    format!("bytes {}-{}/{size}", range.start, range.end - 1)
}

impl RangeError {
    /// `Content-Range` of a 416 answer, when the size is known.
    pub fn content_range(&self) -> Option<String> {
        match self {
            RangeError::Unsatisfiable { size } => Some(format!("bytes */{size}")),
            RangeError::Malformed => None,
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
        for bad in [
            "",
            "bytes=",
            "bytes=-",
            "bytes=5-1",
            "items=0-1",
            "bytes=0-1,3-4",
            "bytes=a-b",
        ] {
            assert_eq!(ByteRange::parse(bad), Err(RangeError::Malformed), "{bad}");
        }
        assert_eq!(content_range(&(0..10), 100), "bytes 0-9/100");
    }

    proptest! {
        #[test]
        fn resolved_ranges_are_inside_the_blob(s in "bytes=[0-9]{0,4}-[0-9]{0,4}", size in 0u64..10_000) {
            if let Ok(range) = ByteRange::parse(&s).and_then(|r| r.resolve(size)) {
                prop_assert!(range.start < range.end && range.end <= size);
            }
        }
    }
}
