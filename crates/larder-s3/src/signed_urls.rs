//! Presigned URLs on the native blob API (`/v1/blobs`), for frontends with `[auth]
//! require_signed_blob_urls`: the same SigV4 query signatures as the S3 port's presigned URLs
//! (`larder s3 presign … /v1/blobs/<id>`), checked against the same key ring. The blob API has
//! no buckets, so a key acts on blobs through its grant for every bucket (`*`): read for GET
//! and HEAD, write for POST and DELETE.
//!
//! The query is parsed in one pass, bounded by the request line's own limit; a request is
//! refused before any body is read.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use larder_router::Router;
use sha2::{Digest, Sha256};

use crate::auth::Keys;
use crate::presign::{encode, hex, hmac, utc, MAX_EXPIRY};
use crate::records::Permission;
use crate::store::Records;

/// How far a URL's date may be ahead of this frontend's clock (AWS allows 15 minutes).
const CLOCK_SKEW: Duration = Duration::from_secs(15 * 60);

/// Why a request's signature was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("this API needs a presigned URL (X-Amz-Signature and the other X-Amz-* parameters)")]
    Missing,
    #[error("malformed presigned URL: {0}")]
    Malformed(&'static str),
    #[error("the presigned URL expired")]
    Expired,
    #[error("the presigned URL is dated in the future")]
    NotYetValid,
    #[error("no such access key")]
    UnknownKey,
    #[error("the signature does not match")]
    Mismatch,
    #[error("the key has no {0} grant on every bucket ('*'), which blobs need")]
    Forbidden(&'static str),
    #[error("the key ring could not be read: {0}")]
    Unavailable(String),
}

/// The SigV4 parameters of a presigned query.
#[derive(Debug, PartialEq, Eq)]
pub struct PresignedQuery {
    pub access_key_id: String,
    date: String,
    time: String,
    scope: String,
    region: String,
    expires: u64,
    signature: String,
    /// Every parameter but the signature, decoded, for the canonical query.
    pairs: Vec<(String, String)>,
}

impl PresignedQuery {
    /// Parses `query`; linear in its length.
    pub fn parse(query: Option<&str>) -> Result<PresignedQuery, SignatureError> {
        use SignatureError::Malformed;
        let query = query.filter(|q| q.contains("X-Amz-Signature="));
        let query = query.ok_or(SignatureError::Missing)?;
        let mut pairs = Vec::new();
        let mut signature = None;
        for part in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = part.split_once('=').unwrap_or((part, ""));
            let (name, value) = (decode(name)?, decode(value)?);
            if name == "X-Amz-Signature" {
                signature = Some(value);
            } else {
                pairs.push((name, value));
            }
        }
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        if get("X-Amz-Algorithm") != Some("AWS4-HMAC-SHA256") {
            return Err(Malformed("X-Amz-Algorithm must be AWS4-HMAC-SHA256"));
        }
        if get("X-Amz-SignedHeaders") != Some("host") {
            return Err(Malformed("X-Amz-SignedHeaders must be host"));
        }
        let credential = get("X-Amz-Credential").ok_or(Malformed("no X-Amz-Credential"))?;
        let mut fields = credential.splitn(5, '/');
        let mut field = || fields.next().filter(|f| !f.is_empty());
        let (id, day, region) = (field(), field(), field());
        let (Some(id), Some(day), Some(region), Some("s3"), Some("aws4_request")) =
            (id, day, region, field(), field())
        else {
            return Err(Malformed(
                "X-Amz-Credential is not ID/date/region/s3/aws4_request",
            ));
        };
        let stamp = get("X-Amz-Date").ok_or(Malformed("no X-Amz-Date"))?;
        let (date, time) = stamp
            .strip_suffix('Z')
            .and_then(|s| s.split_once('T'))
            .filter(|(d, t)| d.len() == 8 && t.len() == 6 && *d == day)
            .filter(|(d, t)| d.bytes().chain(t.bytes()).all(|b| b.is_ascii_digit()))
            .ok_or(Malformed(
                "X-Amz-Date is not the credential's YYYYMMDD then THHMMSSZ",
            ))?;
        let expires = get("X-Amz-Expires")
            .and_then(|e| e.parse::<u64>().ok())
            .filter(|e| (1..=MAX_EXPIRY.as_secs()).contains(e))
            .ok_or(Malformed("X-Amz-Expires must be 1 to 604800 seconds"))?;
        let signature = signature
            .filter(|s| s.len() == 64)
            .ok_or(Malformed("bad X-Amz-Signature"))?;
        Ok(PresignedQuery {
            access_key_id: id.to_owned(),
            scope: format!("{day}/{region}/s3/aws4_request"),
            date: date.to_owned(),
            time: time.to_owned(),
            region: region.to_owned(),
            expires,
            signature,
            pairs,
        })
    }

    /// Checks the signature of `method` `path` on `host` with `secret`, and the URL's time
    /// window at `now`.
    pub fn verify(
        &self,
        method: &str,
        host: &str,
        path: &str,
        secret: &str,
        now: SystemTime,
    ) -> Result<(), SignatureError> {
        let signed_at = signed_at(&self.date, &self.time)
            .ok_or(SignatureError::Malformed("X-Amz-Date is not a date"))?;
        let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        if signed_at > now.saturating_add(CLOCK_SKEW.as_secs()) {
            return Err(SignatureError::NotYetValid);
        }
        if now >= signed_at.saturating_add(self.expires) {
            return Err(SignatureError::Expired);
        }
        let mut pairs: Vec<(String, String)> = self
            .pairs
            .iter()
            .map(|(n, v)| (encode(n, false), encode(v, false)))
            .collect();
        pairs.sort();
        let query: Vec<String> = pairs.iter().map(|(n, v)| format!("{n}={v}")).collect();
        let canonical = format!(
            "{method}\n{path}\n{}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD",
            query.join("&")
        );
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{}T{}Z\n{}\n{}",
            self.date,
            self.time,
            self.scope,
            hex(&Sha256::digest(canonical.as_bytes()))
        );
        let mut key = format!("AWS4{secret}").into_bytes();
        for part in [
            self.date.as_str(),
            self.region.as_str(),
            "s3",
            "aws4_request",
        ] {
            key = hmac(&key, part.as_bytes());
        }
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes keys of any length");
        mac.update(to_sign.as_bytes());
        let given = unhex(&self.signature).ok_or(SignatureError::Mismatch)?;
        // Constant time: the comparison says nothing of how much of a guess was right.
        mac.verify_slice(&given)
            .map_err(|_| SignatureError::Mismatch)
    }
}

/// Unix seconds of `YYYYMMDD` `HHMMSS` (UTC), for dates the signer can write.
fn signed_at(date: &str, time: &str) -> Option<u64> {
    let num = |s: &str| s.parse::<u64>().ok();
    let (y, m, d) = (num(&date[..4])?, num(&date[4..6])?, num(&date[6..])?);
    let (hh, mm, ss) = (num(&time[..2])?, num(&time[2..4])?, num(&time[4..])?);
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    if hh > 23 || mm > 59 || ss > 59 {
        return None;
    }
    // Days from 1970-01-01 to the civil date (Howard Hinnant's algorithm), then checked
    // against the signer's own conversion back, which refuses 31 February and the like.
    let (y2, m2) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y2 / 400;
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    let seconds = days * 86_400 + hh * 3600 + mm * 60 + ss;
    (utc(seconds) == (date.to_owned(), time.to_owned())).then_some(seconds)
}

fn decode(text: &str) -> Result<String, SignatureError> {
    // `+` is itself in SigV4's canonical query (its signers escape a space as `%20`).
    larder_proto::percent_decode(text, false).ok_or(SignatureError::Malformed(
        "bad percent-encoding or not UTF-8",
    ))
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The blob API's check of presigned URLs against the cluster's key ring.
pub struct SignedUrls {
    keys: Keys,
}

impl SignedUrls {
    /// Over the key ring read through `records_router` (`S3Config::records_router`).
    pub fn new(records_router: Arc<Router>) -> SignedUrls {
        let records = Records::new(records_router.clone(), records_router);
        SignedUrls {
            keys: Keys::new(Arc::new(records)),
        }
    }

    /// Whether `method` on `path` (`host` as the client named it, `query` as sent) carries a
    /// valid presigned URL of a key that may do it.
    pub async fn check(
        &self,
        method: &http::Method,
        host: &str,
        path: &str,
        query: Option<&str>,
    ) -> Result<(), SignatureError> {
        let parsed = PresignedQuery::parse(query)?;
        let key = self
            .keys
            .get(&parsed.access_key_id)
            .await
            .map_err(|e| SignatureError::Unavailable(e.to_string()))?
            .ok_or(SignatureError::UnknownKey)?;
        parsed.verify(method.as_str(), host, path, &key.secret, SystemTime::now())?;
        let (needed, name) = match *method {
            http::Method::GET | http::Method::HEAD => (Permission::Read, "read"),
            _ => (Permission::Write, "write"),
        };
        match key.permission("*") {
            Some(granted) if granted >= needed => Ok(()),
            _ => Err(SignatureError::Forbidden(name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presign::{presign, Presign};

    const NOW: u64 = 1_700_000_000;

    fn url(method: &str, expires: u64) -> String {
        presign(&Presign {
            method,
            endpoint: "http://127.0.0.1:8080",
            bucket: "v1",
            key: "blobs/AQABAAAAAAAAABQ",
            access_key_id: "LKID",
            secret: "sekrit",
            region: "us-east-1",
            expires: Duration::from_secs(expires),
            now: UNIX_EPOCH + Duration::from_secs(NOW),
        })
        .unwrap()
    }

    fn check(url: &str, method: &str, secret: &str, now: u64) -> Result<(), SignatureError> {
        let rest = url.strip_prefix("http://127.0.0.1:8080").unwrap();
        let (path, query) = rest.split_once('?').unwrap();
        let parsed = PresignedQuery::parse(Some(query))?;
        assert_eq!(parsed.access_key_id, "LKID");
        let at = UNIX_EPOCH + Duration::from_secs(now);
        parsed.verify(method, "127.0.0.1:8080", path, secret, at)
    }

    #[test]
    fn a_presigned_url_verifies_within_its_window_and_for_its_method_path_and_secret() {
        let get = url("GET", 300);
        assert_eq!(check(&get, "GET", "sekrit", NOW + 10), Ok(()));
        assert_eq!(
            check(&get, "DELETE", "sekrit", NOW),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            check(&get, "GET", "other", NOW),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            check(&get, "GET", "sekrit", NOW + 300),
            Err(SignatureError::Expired)
        );
        assert_eq!(
            check(&get, "GET", "sekrit", NOW - 3600),
            Err(SignatureError::NotYetValid)
        );
        let other_path = get.replace("/v1/blobs/AQAB", "/v1/blobs/AQAC");
        assert_eq!(
            check(&other_path, "GET", "sekrit", NOW),
            Err(SignatureError::Mismatch)
        );
        let longer = get.replace("X-Amz-Expires=300", "X-Amz-Expires=301");
        assert_eq!(
            check(&longer, "GET", "sekrit", NOW),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn queries_without_every_part_are_refused_clearly() {
        assert_eq!(PresignedQuery::parse(None), Err(SignatureError::Missing));
        assert_eq!(
            PresignedQuery::parse(Some("a=b")),
            Err(SignatureError::Missing)
        );
        let get = url("GET", 300);
        let query = get.split_once('?').unwrap().1;
        for (from, to) in [
            ("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA1"),
            ("SignedHeaders=host", "SignedHeaders=host%3Bx"),
            ("%2Fs3%2F", "%2Fs4%2F"),
            ("T221320Z", "T2213Z"),
            ("X-Amz-Expires=300", "X-Amz-Expires=0"),
            ("X-Amz-Expires=300", "X-Amz-Expires=604801"),
            ("20231114", "20231115"),
        ] {
            let bad = query.replacen(from, to, 1);
            assert!(
                matches!(
                    PresignedQuery::parse(Some(&bad)),
                    Err(SignatureError::Malformed(_))
                ),
                "{from} -> {to}"
            );
        }
    }

    #[test]
    fn dates_round_trip_and_impossible_ones_are_refused() {
        assert_eq!(signed_at("20231114", "221320"), Some(NOW));
        assert_eq!(signed_at("19700101", "000000"), Some(0));
        assert_eq!(signed_at("20230231", "000000"), None);
        assert_eq!(signed_at("20231114", "245960"), None);
    }

    proptest::proptest! {
        // Any query is judged, never a panic; any change to a valid one is refused.
        #[test]
        fn any_query_is_judged(query in ".{0,300}") {
            if let Ok(parsed) = PresignedQuery::parse(Some(&query)) {
                let _ = parsed.verify("GET", "h", "/v1/blobs/x", "s", SystemTime::now());
            }
        }

        #[test]
        fn a_changed_byte_is_refused(at in 0usize..400, byte in proptest::prelude::any::<u8>()) {
            let get = url("GET", 300);
            let mut bytes = get.into_bytes();
            let at = at % bytes.len();
            proptest::prop_assume!(bytes[at] != byte);
            bytes[at] = byte;
            if let Ok(changed) = String::from_utf8(bytes) {
                let rest = changed.strip_prefix("http://127.0.0.1:8080");
                if let Some((path, query)) = rest.and_then(|r| r.split_once('?')) {
                    if let Ok(parsed) = PresignedQuery::parse(Some(query)) {
                        let at = UNIX_EPOCH + Duration::from_secs(NOW);
                        let verified = parsed.verify("GET", "127.0.0.1:8080", path, "sekrit", at);
                        // A change the canonical form ignores (a letter's case in a
                        // percent-escape) may still verify; any other may not.
                        let same = changed.eq_ignore_ascii_case(&url("GET", 300));
                        proptest::prop_assert!(verified.is_err() || same, "{changed}");
                    }
                }
            }
        }
    }
}
