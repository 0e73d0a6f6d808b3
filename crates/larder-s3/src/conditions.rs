//! Conditional GET and HEAD (RFC 9110 section 13.2.2, as S3 applies it): `If-Match`, then
//! `If-Unmodified-Since` only without `If-Match` (412 when false); `If-None-Match`, then
//! `If-Modified-Since` only without `If-None-Match` (304 when the object is unchanged). Dates
//! compare at whole seconds, the precision `Last-Modified` is sent in.

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
            Outcome::NotModified => Err(s3s::s3_error!(NotModified)),
            Outcome::PreconditionFailed => Err(S3Error::PreconditionFailed.into()),
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
}
