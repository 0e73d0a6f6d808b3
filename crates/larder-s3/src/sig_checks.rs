//! What Larder checks of a signed request before s3s verifies its signature, where s3s (0.12)
//! leaves a gap:
//!
//! - **The request's time.** s3s verifies a header signature (SigV4 or SigV2) without looking
//!   at the date it signs, so a request captured once (a PUT, a DELETE) could be replayed for
//!   ever. S3 refuses a request signed more than 15 minutes from its own clock
//!   (`RequestTimeTooSkewed`), and a SigV2 request without a date it can read (`AccessDenied`);
//!   so does Larder. Presigned URLs carry their own expiry, which s3s and `presign.rs` check.
//! - **SigV2's resource of a bucket.** Clients sign a path-style bucket request as `/bucket/`
//!   (S3's canonical resource for a bucket) and send `/bucket`; s3s signs the path as sent, so
//!   every SigV2 bucket operation failed with `SignatureDoesNotMatch`. Such a request's path is
//!   given its slash before s3s reads it (both name the same bucket to s3s).
//! - **SigV2 at all**, refused with 400 `InvalidRequest` when `[s3] signature_v2 = false`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{AUTHORIZATION, DATE};
use http::{HeaderMap, Uri};

/// How far a signed request's time may be from this server's clock, either way (S3's bound).
pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);

/// Why a signed request is refused before its signature is checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Signed with SigV2 where `[s3] signature_v2 = false` (400 InvalidRequest).
    SignatureV2,
    /// A SigV2 request with no `x-amz-date` or `Date` that reads as a time (403 AccessDenied).
    NoDate,
    /// Signed further than [`MAX_SKEW`] from now (403 RequestTimeTooSkewed).
    Skewed,
}

impl Refusal {
    /// The HTTP status of the refusal.
    pub fn status(&self) -> http::StatusCode {
        match self {
            Refusal::SignatureV2 => http::StatusCode::BAD_REQUEST,
            Refusal::NoDate | Refusal::Skewed => http::StatusCode::FORBIDDEN,
        }
    }
}

/// Whether the request is signed with SigV2: an `Authorization: AWS <key>:<signature>` header,
/// or a presigned URL's `AWSAccessKeyId` (SigV4's query names its own `X-Amz-*` parameters).
pub fn is_signature_v2(headers: &HeaderMap, uri: &Uri) -> bool {
    let header_v2 = headers
        .get(AUTHORIZATION)
        .is_some_and(|a| a.as_bytes().starts_with(b"AWS "));
    header_v2
        || uri.query().is_some_and(|q| {
            q.split('&')
                .any(|p| p.starts_with("AWSAccessKeyId=") || p.starts_with("Signature="))
        })
}

impl Refusal {
    /// The S3 error code and message of the refusal (fixed texts).
    pub fn code_and_message(&self) -> (&'static str, &'static str) {
        match self {
            Refusal::SignatureV2 => (
                "InvalidRequest",
                "The authorization mechanism you have provided is not supported. Please use \
                 AWS4-HMAC-SHA256.",
            ),
            Refusal::NoDate => (
                "AccessDenied",
                "AWS authentication requires a valid Date or x-amz-date header",
            ),
            Refusal::Skewed => (
                "RequestTimeTooSkewed",
                "The difference between the request time and the current time is too large.",
            ),
        }
    }
}

/// Checks the time of a request signed in its `Authorization` header against `now`. A request
/// without one, or with a scheme s3s does not take, is left to s3s; so is a SigV4 request
/// whose `x-amz-date` is missing or malformed (s3s refuses it).
pub fn check_time(headers: &HeaderMap, now: SystemTime) -> Result<(), Refusal> {
    let Some(authorization) = headers.get(AUTHORIZATION) else {
        return Ok(());
    };
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let signed_at = if authorization.as_bytes().starts_with(b"AWS4-") {
        match text("x-amz-date").and_then(amz_date_seconds) {
            Some(seconds) => seconds,
            None => return Ok(()),
        }
    } else if authorization.as_bytes().starts_with(b"AWS ") {
        // SigV2 signs `x-amz-date` when present, else `Date`.
        let date = text("x-amz-date").or_else(|| text(DATE.as_str()));
        date.and_then(http_date_seconds).ok_or(Refusal::NoDate)?
    } else {
        return Ok(());
    };
    let now = unix_seconds(now);
    match now.abs_diff(signed_at) > MAX_SKEW.as_secs() {
        true => Err(Refusal::Skewed),
        false => Ok(()),
    }
}

/// For a SigV2 request (header or query) of a path-style bucket (`/bucket`, with or without a
/// query): the same request's URI with the bucket's slash (`/bucket/`); `None` otherwise.
pub fn v2_bucket_uri(headers: &HeaderMap, uri: &Uri) -> Option<Uri> {
    let bucket = uri.path().strip_prefix('/')?;
    if !is_signature_v2(headers, uri) || bucket.is_empty() || bucket.contains('/') {
        return None;
    }
    let path_and_query = match uri.query() {
        Some(query) => format!("/{bucket}/?{query}"),
        None => format!("/{bucket}/"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    Uri::from_parts(parts).ok()
}

fn unix_seconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// An HTTP date (RFC 9110's three forms, by httpdate) in seconds since the epoch; an
/// IMF-fixdate past httpdate's range (up to the year 9999, as S3 reads it: a date far ahead is
/// skewed, not unreadable). Dates before 1970 read as none, as S3 refuses them.
fn http_date_seconds(text: &str) -> Option<i64> {
    if let Ok(time) = httpdate::parse_http_date(text) {
        return Some(unix_seconds(time));
    }
    // "Sun, 06 Nov 1994 08:49:37 GMT" -> "19941106T084937Z"
    let fields: Vec<&str> = text.split([' ', ':']).collect();
    let [_, day, month, year, hour, minute, second, "GMT"] = fields[..] else {
        return None;
    };
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = months.iter().position(|m| *m == month)? + 1;
    let seconds = amz_date_seconds(&format!("{year}{month:02}{day}T{hour}{minute}{second}Z"))?;
    (seconds >= 0).then_some(seconds)
}

/// Seconds since the Unix epoch (negative before it) of SigV4's `YYYYMMDDTHHMMSSZ`; `None`
/// for anything else, including dates that do not exist. Exactly 16 bytes are read.
pub fn amz_date_seconds(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| {
        b[range].iter().try_fold(0i64, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
        })
    };
    let (year, month, day) = (number(0..4)?, number(4..6)?, number(6..8)?);
    let (hour, minute, second) = (number(9..11)?, number(11..13)?, number(13..15)?);
    let valid = (1..=12).contains(&month)
        && (1..=days_in_month(year, month)).contains(&day)
        && hour < 24
        && minute < 60
        && second < 60;
    valid.then(|| days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`): years counted from March, so that the leap day ends a year.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests;
