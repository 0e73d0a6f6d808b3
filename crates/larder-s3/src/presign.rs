//! Presigned URLs (AWS Signature V4 in the query string, `UNSIGNED-PAYLOAD`), as `larder s3
//! presign` hands them out: a GET or PUT of one object that anyone holding the URL may do until
//! it expires, checked by the S3 port like any SigV4 request (s3s verifies the signature and
//! the expiry; the key's grants apply).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::S3Error;

/// SigV4's longest presigned URL lifetime: seven days.
pub const MAX_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);

/// Whether a request's query keeps SigV4's bounds on `X-Amz-Expires` (1 second to seven
/// days; s3s checks the signature and the expiry, not the bound). `None` for a query without
/// one; else the answer, with S3's message. Linear in the query's length.
pub fn expiry_out_of_bounds(query: &str) -> Option<&'static str> {
    let value = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("X-Amz-Expires="))?;
    match value.parse::<u64>() {
        Ok(seconds) if (1..=MAX_EXPIRY.as_secs()).contains(&seconds) => None,
        Ok(0) => Some("X-Amz-Expires must be non-negative"),
        Ok(_) => Some("X-Amz-Expires must be less than a week (in seconds) that is 604800"),
        Err(_) => Some("X-Amz-Expires should be a number"),
    }
}

/// What to sign.
pub struct Presign<'a> {
    pub method: &'a str,
    /// `http://host:port` or `https://host:port`, without a path.
    pub endpoint: &'a str,
    pub bucket: &'a str,
    pub key: &'a str,
    pub access_key_id: &'a str,
    pub secret: &'a str,
    pub region: &'a str,
    pub expires: Duration,
    pub now: SystemTime,
}

/// The presigned URL (path style: `<endpoint>/<bucket>/<key>?X-Amz-...`).
pub fn presign(p: &Presign<'_>) -> Result<String, S3Error> {
    presign_with_query(p, &[])
}

/// A presigned URL with more query parameters signed in (a listing's `list-type=2&prefix=…`).
/// An empty key presigns the bucket itself (`<endpoint>/<bucket>`: CreateBucket, a listing).
pub fn presign_with_query(p: &Presign<'_>, extra: &[(&str, &str)]) -> Result<String, S3Error> {
    if p.expires.is_zero() || p.expires > MAX_EXPIRY {
        return Err(S3Error::InvalidArgument(
            "a presigned URL expires after 1 second to 7 days".into(),
        ));
    }
    let host = p
        .endpoint
        .strip_prefix("http://")
        .or_else(|| p.endpoint.strip_prefix("https://"))
        .filter(|h| !h.is_empty() && !h.contains('/'))
        .ok_or_else(|| {
            S3Error::InvalidArgument(format!(
                "endpoint {:?} is not http(s)://host[:port]",
                p.endpoint
            ))
        })?;
    let path = match p.key.is_empty() {
        true => format!("/{}", encode(p.bucket, false)),
        false => format!("/{}/{}", encode(p.bucket, false), encode(p.key, true)),
    };
    let query = sign(p, host, &path, extra)?;
    Ok(format!("{}{path}?{query}", p.endpoint))
}

/// The query string, signature last, of a presigned request for `path` on `host`. SigV4 signs
/// the query sorted by name, every name and value encoded.
fn sign(
    p: &Presign<'_>,
    host: &str,
    path: &str,
    extra: &[(&str, &str)],
) -> Result<String, S3Error> {
    let seconds = p
        .now
        .duration_since(UNIX_EPOCH)
        .map_err(|_| S3Error::InvalidArgument("the clock is before 1970".into()))?
        .as_secs();
    let (date, time) = utc(seconds);
    let scope = format!("{date}/{}/s3/aws4_request", p.region);
    let credential = format!("{}/{scope}", p.access_key_id);
    let mut pairs = vec![
        ("X-Amz-Algorithm".to_owned(), "AWS4-HMAC-SHA256".to_owned()),
        ("X-Amz-Credential".to_owned(), encode(&credential, false)),
        ("X-Amz-Date".to_owned(), format!("{date}T{time}Z")),
        ("X-Amz-Expires".to_owned(), p.expires.as_secs().to_string()),
        ("X-Amz-SignedHeaders".to_owned(), "host".to_owned()),
    ];
    pairs.extend(
        extra
            .iter()
            .map(|(name, value)| (encode(name, false), encode(value, false))),
    );
    pairs.sort();
    let query = pairs
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join("&");
    let canonical = format!(
        "{}\n{path}\n{query}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD",
        p.method
    );
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{date}T{time}Z\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let mut key = format!("AWS4{}", p.secret).into_bytes();
    for part in [date.as_str(), p.region, "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex(&hmac(&key, to_sign.as_bytes()));
    Ok(format!("{query}&X-Amz-Signature={signature}"))
}

pub(crate) fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    crate::blobs::hex(bytes)
}

/// SigV4's URI encoding: every byte but `A-Za-z0-9-._~` (and `/` in a key) as `%XX`.
pub(crate) fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(byte as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// `YYYYMMDD` and `HHMMSS` (UTC) of Unix time `seconds`.
pub(crate) fn utc(seconds: u64) -> (String, String) {
    let days = (seconds / 86_400) as i64;
    let of_day = seconds % 86_400;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let time = format!(
        "{:02}{:02}{:02}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    );
    (format!("{year:04}{month:02}{day:02}"), time)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's worked example of a presigned GET ("Authenticating Requests: Using Query
    /// Parameters"), virtual-host style: host examplebucket.s3.amazonaws.com, path /test.txt.
    #[test]
    fn the_aws_documentation_example_signs_alike() {
        let p = Presign {
            method: "GET",
            endpoint: "https://examplebucket.s3.amazonaws.com",
            bucket: "",
            key: "",
            access_key_id: "AKIAIOSFODNN7EXAMPLE",
            secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            region: "us-east-1",
            expires: Duration::from_secs(86_400),
            now: UNIX_EPOCH + Duration::from_secs(1_369_353_600), // 2013-05-24T00:00:00Z
        };
        let query = sign(&p, "examplebucket.s3.amazonaws.com", "/test.txt", &[]).unwrap();
        assert!(
            query.ends_with(
                "X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
            ),
            "{query}"
        );
        assert!(query.contains(
            "X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
        ));
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(utc(0), ("19700101".into(), "000000".into()));
        assert_eq!(utc(951_782_400), ("20000229".into(), "000000".into()));
        assert_eq!(utc(1_700_000_000), ("20231114".into(), "221320".into()));
    }

    #[test]
    fn keys_keep_their_slashes_and_lose_the_rest() {
        assert_eq!(encode("a b/ü+", true), "a%20b/%C3%BC%2B");
        assert_eq!(encode("a/b", false), "a%2Fb");
    }

    #[test]
    fn expiry_and_endpoint_are_checked() {
        let mut p = Presign {
            method: "GET",
            endpoint: "http://127.0.0.1:9000",
            bucket: "b",
            key: "k",
            access_key_id: "id",
            secret: "s",
            region: "us-east-1",
            expires: MAX_EXPIRY + Duration::from_secs(1),
            now: SystemTime::now(),
        };
        assert!(presign(&p).is_err());
        p.expires = Duration::from_secs(60);
        assert!(presign(&p)
            .unwrap()
            .starts_with("http://127.0.0.1:9000/b/k?X-Amz-Algorithm="));
        p.endpoint = "ftp://x";
        assert!(presign(&p).is_err());
    }

    #[test]
    fn the_expiry_of_a_presigned_request_is_one_second_to_seven_days() {
        assert_eq!(expiry_out_of_bounds("a=b"), None);
        assert_eq!(expiry_out_of_bounds("X-Amz-Expires=604800&x=y"), None);
        assert_eq!(expiry_out_of_bounds("x=y&X-Amz-Expires=1"), None);
        for bad in ["0", "604801", "-7", "", "1e3", "99999999999999999999999"] {
            let query = format!("X-Amz-Date=1&X-Amz-Expires={bad}");
            assert!(expiry_out_of_bounds(&query).is_some(), "{bad}");
        }
    }

    proptest::proptest! {
        // Any query is answered, never a panic; a number in range always passes.
        #[test]
        fn any_query_is_judged(query in ".{0,200}", seconds in 1u64..=604_800) {
            let _ = expiry_out_of_bounds(&query);
            let query = format!("X-Amz-Expires={seconds}");
            proptest::prop_assert_eq!(expiry_out_of_bounds(&query), None);
        }
    }
}
