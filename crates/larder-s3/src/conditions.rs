//! Conditional GET and HEAD (RFC 9110 section 13.2.2, as S3 applies it): `If-Match`, then
//! `If-Unmodified-Since` only without `If-Match` (412 when false); `If-None-Match`, then
//! `If-Modified-Since` only without `If-None-Match` (304 when the object is unchanged). Dates
//! compare at whole seconds, the precision `Last-Modified` is sent in.
//!
//! CopyObject's `x-amz-copy-source-if-*` headers are the same four on the source object, with
//! every failure 412 (a copy has nothing to answer 304 with). Writes (PutObject,
//! CompleteMultipartUpload) take `If-None-Match: *` and `If-Match` (`WriteConditions`),
//! checked against the name's current entry inside the bucket index's read-modify-write at
//! the partition primary, so two conditional writes are decided in one order.

use std::time::{SystemTime, UNIX_EPOCH};

use s3s::dto::{ETagCondition, Timestamp, TimestampFormat};

use crate::error::S3Error;
use crate::records::ObjectEntry;

/// The condition headers of one GET or HEAD.
#[derive(Default)]
pub struct Conditions<'a> {
    pub if_match: Option<&'a ETagCondition>,
    pub if_none_match: Option<&'a ETagCondition>,
    pub if_modified_since: Option<&'a Timestamp>,
    pub if_unmodified_since: Option<&'a Timestamp>,
}

/// What the conditions decide.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Serve,
    NotModified,
    PreconditionFailed,
}

impl Conditions<'_> {
    pub fn check(&self, entry: &ObjectEntry) -> Result<(), s3s::S3Error> {
        match self.evaluate(&entry.etag, entry.modified_ms / 1000) {
            Outcome::Serve => Ok(()),
            Outcome::NotModified => Err(not_modified(entry)),
            Outcome::PreconditionFailed => Err(S3Error::PreconditionFailed.into()),
        }
    }

    /// For a CopyObject source: any condition that fails is 412 `PreconditionFailed`.
    pub fn check_copy_source(&self, entry: &ObjectEntry) -> Result<(), S3Error> {
        match self.evaluate(&entry.etag, entry.modified_ms / 1000) {
            Outcome::Serve => Ok(()),
            Outcome::NotModified | Outcome::PreconditionFailed => Err(S3Error::PreconditionFailed),
        }
    }

    /// The outcome for an object with `etag` last modified at `modified_s` (Unix seconds).
    pub fn evaluate(&self, etag: &str, modified_s: u64) -> Outcome {
        let matches = |c: &ETagCondition| match c {
            ETagCondition::Any => true,
            ETagCondition::ETag(tag) => tag.value() == etag,
        };
        // A date that cannot be read is ignored, as HTTP says of an invalid date.
        let since = |t: Option<&Timestamp>| t.and_then(unix_seconds);
        let precondition_holds = match (self.if_match, since(self.if_unmodified_since)) {
            (Some(condition), _) => matches(condition),
            (None, Some(date)) => modified_s <= date,
            (None, None) => true,
        };
        if !precondition_holds {
            return Outcome::PreconditionFailed;
        }
        let unchanged = match (self.if_none_match, since(self.if_modified_since)) {
            (Some(condition), _) => matches(condition),
            (None, Some(date)) => modified_s <= date,
            (None, None) => false,
        };
        match unchanged {
            true => Outcome::NotModified,
            false => Outcome::Serve,
        }
    }
}

/// A 304 carries the object's `ETag` and `Last-Modified`, as S3's does (caches revalidate
/// with them).
fn not_modified(entry: &ObjectEntry) -> s3s::S3Error {
    let mut err = s3s::s3_error!(NotModified);
    let mut headers = http::HeaderMap::new();
    if let Ok(etag) = http::HeaderValue::from_str(&format!("\"{}\"", entry.etag)) {
        headers.insert(http::header::ETAG, etag);
    }
    let modified = UNIX_EPOCH + std::time::Duration::from_millis(entry.modified_ms);
    if let Ok(date) = http::HeaderValue::from_str(&httpdate::fmt_http_date(modified)) {
        headers.insert(http::header::LAST_MODIFIED, date);
    }
    err.set_headers(headers);
    err
}

/// The conditions of a write to a name, as S3 takes them on PutObject and
/// CompleteMultipartUpload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteConditions {
    /// `If-None-Match: *`: only if no object has the name (else 412).
    pub absent: bool,
    /// `If-Match`: only if an object has the name (else 404 `NoSuchKey`) and, for a tag
    /// rather than `*`, that ETag (else 412).
    pub matching: Option<ETagCondition>,
    /// Not after this time (ms since the epoch, this process's clock), however often the write
    /// is tried again: a CompleteMultipartUpload's link, which another frontend may settle
    /// once it is much older (`multipart::LINK_DEADLINE`).
    pub not_after_ms: Option<u64>,
}

impl WriteConditions {
    /// From the request's headers; `If-None-Match` with a tag rather than `*` is refused, as
    /// S3 does (only `*` means something for a write).
    pub fn new(
        if_match: Option<&ETagCondition>,
        if_none_match: Option<&ETagCondition>,
    ) -> Result<WriteConditions, S3Error> {
        let absent = match if_none_match {
            None => false,
            Some(ETagCondition::Any) => true,
            Some(ETagCondition::ETag(_)) => {
                return Err(S3Error::NotImplemented(
                    "If-None-Match on a write takes only *".into(),
                ))
            }
        };
        Ok(WriteConditions {
            absent,
            matching: if_match.cloned(),
            not_after_ms: None,
        })
    }

    /// Whether the write holds whatever the name points at (no condition on it).
    pub fn is_unconditional(&self) -> bool {
        *self == WriteConditions::default()
    }

    /// Whether the write may replace `current` (the name's entry now, if any).
    pub fn check(&self, current: Option<&ObjectEntry>) -> Result<(), S3Error> {
        if self
            .not_after_ms
            .is_some_and(|end| crate::service::now_ms() > end)
        {
            return Err(S3Error::OperationAborted(
                "the link of this write took too long and was given up; try again".into(),
            ));
        }
        if self.absent && current.is_some() {
            return Err(S3Error::PreconditionFailed);
        }
        match (&self.matching, current) {
            (None, _) => Ok(()),
            (Some(_), None) => Err(S3Error::NoSuchKey),
            (Some(ETagCondition::Any), Some(_)) => Ok(()),
            (Some(ETagCondition::ETag(tag)), Some(entry)) => match tag.value() == entry.etag {
                true => Ok(()),
                false => Err(S3Error::PreconditionFailed),
            },
        }
    }
}

/// Whole seconds since the epoch of `time` (`None` before 1970 or unreadable).
fn unix_seconds(time: &Timestamp) -> Option<u64> {
    let mut text = Vec::with_capacity(32);
    time.format(TimestampFormat::HttpDate, &mut text).ok()?;
    let text = std::str::from_utf8(&text).ok()?;
    let at: SystemTime = httpdate::parse_http_date(text).ok()?;
    at.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(seconds: u64) -> Timestamp {
        Timestamp::from(UNIX_EPOCH + Duration::from_secs(seconds))
    }

    fn tag(value: &str) -> ETagCondition {
        ETagCondition::ETag(s3s::dto::ETag::Strong(value.into()))
    }

    const T: u64 = 1_700_000_000;

    #[test]
    fn dates_decide_alone() {
        let (before, same, after) = (at(T - 1), at(T), at(T + 1));
        let modified_since = |t| Conditions {
            if_modified_since: Some(t),
            ..Default::default()
        };
        assert_eq!(
            modified_since(&after).evaluate("e", T),
            Outcome::NotModified
        );
        assert_eq!(modified_since(&same).evaluate("e", T), Outcome::NotModified);
        assert_eq!(modified_since(&before).evaluate("e", T), Outcome::Serve);
        let unmodified_since = |t| Conditions {
            if_unmodified_since: Some(t),
            ..Default::default()
        };
        assert_eq!(
            unmodified_since(&before).evaluate("e", T),
            Outcome::PreconditionFailed
        );
        assert_eq!(unmodified_since(&same).evaluate("e", T), Outcome::Serve);
    }

    #[test]
    fn etags_take_precedence_over_dates() {
        // S3: If-Match true and If-Unmodified-Since false: 200.
        let (before, after) = (at(T - 1), at(T + 1));
        let matching = tag("e");
        let conditions = Conditions {
            if_match: Some(&matching),
            if_unmodified_since: Some(&before),
            ..Default::default()
        };
        assert_eq!(conditions.evaluate("e", T), Outcome::Serve);
        // S3: If-None-Match false (the tag matches) and If-Modified-Since true: 304.
        let conditions = Conditions {
            if_none_match: Some(&matching),
            if_modified_since: Some(&before),
            ..Default::default()
        };
        assert_eq!(conditions.evaluate("e", T), Outcome::NotModified);
        // A different tag is a change, whatever the date says.
        let other = tag("f");
        let conditions = Conditions {
            if_none_match: Some(&other),
            if_modified_since: Some(&after),
            ..Default::default()
        };
        assert_eq!(conditions.evaluate("e", T), Outcome::Serve);
        let conditions = Conditions {
            if_match: Some(&other),
            ..Default::default()
        };
        assert_eq!(conditions.evaluate("e", T), Outcome::PreconditionFailed);
    }

    fn entry(etag: &str) -> ObjectEntry {
        ObjectEntry {
            etag: etag.into(),
            modified_ms: T * 1000,
            ..Default::default()
        }
    }

    #[test]
    fn writes_check_absence_and_tags_and_copies_fail_with_412() {
        let any = ETagCondition::Any;
        let absent = WriteConditions::new(None, Some(&any)).unwrap();
        assert!(absent.check(None).is_ok());
        assert!(matches!(
            absent.check(Some(&entry("e"))),
            Err(S3Error::PreconditionFailed)
        ));
        let matching = WriteConditions::new(Some(&tag("e")), None).unwrap();
        assert!(matching.check(Some(&entry("e"))).is_ok());
        assert!(matches!(
            matching.check(Some(&entry("f"))),
            Err(S3Error::PreconditionFailed)
        ));
        assert!(matches!(matching.check(None), Err(S3Error::NoSuchKey)));
        assert!(WriteConditions::new(None, Some(&tag("e"))).is_err());
        // A copy source whose tag matches If-None-Match is not copied: 412, not 304.
        let matched = tag("e");
        let copy = Conditions {
            if_none_match: Some(&matched),
            ..Default::default()
        };
        assert!(matches!(
            copy.check_copy_source(&entry("e")),
            Err(S3Error::PreconditionFailed)
        ));
        assert!(copy.check_copy_source(&entry("f")).is_ok());
    }

    #[test]
    fn a_write_with_a_deadline_is_refused_past_it_whatever_else_holds() {
        let now = crate::service::now_ms();
        let within = WriteConditions {
            not_after_ms: Some(now + 60_000),
            ..Default::default()
        };
        assert!(within.check(None).is_ok());
        let past = WriteConditions {
            not_after_ms: Some(now - 1),
            ..Default::default()
        };
        assert!(matches!(
            past.check(None),
            Err(S3Error::OperationAborted(_))
        ));
    }
}
