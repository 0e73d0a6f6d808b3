//! What an object keeps of its upload's headers besides `Content-Type` and `x-amz-meta-*`:
//! the standard headers S3 stores and answers reads with (`Cache-Control`,
//! `Content-Disposition`, `Content-Encoding`, `Content-Language`, `Expires`), GetObject's
//! `response-*` overrides, and the bounds on what one name's entry may carry. Entries live in
//! index leaves of up to 1,000 names, each read whole by every GET of a name in its range, so
//! every field has a budget: S3's 2 KiB of user metadata, and 2 KiB for these headers.

use s3s::dto::Timestamp;
use s3s::dto::TimestampFormat;

use crate::error::S3Error;
use crate::records::ObjectHeaders;

/// S3's bound on user metadata: the UTF-8 bytes of every `x-amz-meta-*` name and value.
pub const MAX_USER_METADATA: usize = 2048;
/// Larder's bound on the standard headers an object keeps, values added up.
pub const MAX_STORED_HEADERS: usize = 2048;

/// The standard headers of a PutObject, CopyObject (with `REPLACE`) or
/// CreateMultipartUpload, as s3s parsed them.
#[derive(Default)]
pub struct Given<'a> {
    pub cache_control: Option<&'a str>,
    pub content_disposition: Option<&'a str>,
    pub content_encoding: Option<&'a str>,
    pub content_language: Option<&'a str>,
    pub expires: Option<&'a Timestamp>,
}

/// Refuses user metadata past S3's bound (`MetadataTooLarge`), before anything is stored.
pub fn check_metadata(meta: &[(String, String)]) -> Result<(), S3Error> {
    let bytes = meta
        .iter()
        .fold(0usize, |sum, (k, v)| sum.saturating_add(k.len() + v.len()));
    if bytes > MAX_USER_METADATA {
        return Err(S3Error::MetadataTooLarge(format!(
            "Your metadata headers exceed the maximum allowed metadata size: {bytes} bytes, \
             at most {MAX_USER_METADATA}"
        )));
    }
    Ok(())
}

/// What the object keeps of `given`. `aws-chunked` in `Content-Encoding` names how this
/// request's body was sent, not the object's encoding, so it is not kept (as S3 does).
pub fn stored(given: &Given<'_>) -> Result<ObjectHeaders, S3Error> {
    let encoding = given.content_encoding.map(|e| {
        e.split(',')
            .map(str::trim)
            .filter(|part| !part.eq_ignore_ascii_case("aws-chunked") && !part.is_empty())
            .collect::<Vec<_>>()
            .join(", ")
    });
    let headers = ObjectHeaders {
        cache_control: given.cache_control.map(str::to_owned),
        content_disposition: given.content_disposition.map(str::to_owned),
        content_encoding: encoding.filter(|e| !e.is_empty()),
        content_language: given.content_language.map(str::to_owned),
        expires: given.expires.map(http_date).transpose()?,
    };
    let bytes = headers.values().map(str::len).sum::<usize>();
    if bytes > MAX_STORED_HEADERS {
        return Err(S3Error::InvalidArgument(format!(
            "Cache-Control, Content-Disposition, Content-Encoding, Content-Language and \
             Expires add up to {bytes} bytes; an object keeps at most {MAX_STORED_HEADERS}"
        )));
    }
    Ok(headers)
}

fn http_date(t: &Timestamp) -> Result<String, S3Error> {
    let mut out = Vec::new();
    t.format(TimestampFormat::HttpDate, &mut out)
        .map_err(|e| S3Error::InvalidArgument(format!("Expires cannot be written: {e}")))?;
    String::from_utf8(out).map_err(|_| S3Error::InvalidArgument("Expires is not text".into()))
}

impl ObjectHeaders {
    fn values(&self) -> impl Iterator<Item = &str> {
        [
            &self.cache_control,
            &self.content_disposition,
            &self.content_encoding,
            &self.content_language,
            &self.expires,
        ]
        .into_iter()
        .filter_map(|v| v.as_deref())
    }

    /// `Expires` as s3s answers it; one kept that no longer parses is left out.
    pub fn expires_timestamp(&self) -> Option<Timestamp> {
        let kept = self.expires.as_deref()?;
        Timestamp::parse(TimestampFormat::HttpDate, kept).ok()
    }
}

/// Sets an answer's (GetObject's, HeadObject's) standard headers from the object's, each
/// replaced by its `response-*` override when the request has one.
macro_rules! answer_headers {
    ($output:ident, $headers:expr, $input:ident) => {{
        let kept: &$crate::records::ObjectHeaders = $headers;
        $output.cache_control = $input
            .response_cache_control
            .take()
            .or_else(|| kept.cache_control.clone());
        $output.content_disposition = $input
            .response_content_disposition
            .take()
            .or_else(|| kept.content_disposition.clone());
        $output.content_encoding = $input
            .response_content_encoding
            .take()
            .or_else(|| kept.content_encoding.clone());
        $output.content_language = $input
            .response_content_language
            .take()
            .or_else(|| kept.content_language.clone());
        $output.expires = $input
            .response_expires
            .take()
            .or_else(|| kept.expires_timestamp());
        if let Some(content_type) = $input.response_content_type.take() {
            $output.content_type = Some(content_type);
        }
    }};
}
pub(crate) use answer_headers;

/// S3 takes `response-*` overrides only from signed requests: an anonymous read of a
/// public-read bucket may not make the object answer as something else.
pub fn check_overrides(anonymous: bool, any_override: bool) -> Result<(), S3Error> {
    if anonymous && any_override {
        return Err(S3Error::InvalidRequest(
            "Request specific response headers cannot be used for anonymous GET requests.".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_chunked_is_how_the_body_came_not_what_the_object_is() {
        let kept = |e: &str| {
            let given = Given {
                content_encoding: Some(e),
                ..Default::default()
            };
            stored(&given).unwrap().content_encoding
        };
        assert_eq!(kept("aws-chunked"), None);
        assert_eq!(kept("aws-chunked,gzip"), Some("gzip".into()));
        assert_eq!(kept("gzip, AWS-Chunked"), Some("gzip".into()));
        assert_eq!(kept("br"), Some("br".into()));
    }

    #[test]
    fn metadata_past_two_kib_is_refused() {
        let meta = |n: usize| vec![("k".to_owned(), "v".repeat(n))];
        assert!(check_metadata(&meta(2047)).is_ok());
        assert!(matches!(
            check_metadata(&meta(2048)),
            Err(S3Error::MetadataTooLarge(_))
        ));
    }

    #[test]
    fn expires_round_trips_as_an_http_date() {
        let t =
            Timestamp::parse(TimestampFormat::HttpDate, "Wed, 21 Oct 2037 07:28:00 GMT").unwrap();
        let given = Given {
            expires: Some(&t),
            ..Default::default()
        };
        let headers = stored(&given).unwrap();
        assert_eq!(
            headers.expires.as_deref(),
            Some("Wed, 21 Oct 2037 07:28:00 GMT")
        );
        assert_eq!(headers.expires_timestamp(), Some(t));
    }

    #[test]
    fn long_headers_are_refused() {
        let long = "x".repeat(MAX_STORED_HEADERS + 1);
        let given = Given {
            cache_control: Some(&long),
            ..Default::default()
        };
        assert!(matches!(stored(&given), Err(S3Error::InvalidArgument(_))));
    }
}
