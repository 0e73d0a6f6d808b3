//! Request bodies: read with a size limit, gunzipped when `Content-Encoding: gzip` (the Java
//! feed client compresses bodies over 512 bytes), and parsed into put and update operations.

use std::io::Read;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::bounds::{self, BODY_WRAPPING, MAX_NESTING};
use super::reply::Failure;
use super::update::Fields;
use crate::body::{drain_in_background, next_frame};
use crate::body_budget::Reservation;

/// Reads the whole body (at most `max` bytes after decoding), holding what it buffers against
/// `reservation` (429 when a budget is exhausted); a client that sends nothing for `stall` gets
/// a 400. The reservation comes back with the body: the caller holds it while the body lives.
pub async fn read(
    mut body: Incoming,
    headers: &HeaderMap,
    max: u64,
    stall: Duration,
    mut reservation: Reservation,
) -> Result<(Bytes, Reservation), Failure> {
    let gzip = match headers.get(header::CONTENT_ENCODING).map(|v| v.to_str()) {
        None | Some(Ok("identity")) => false,
        Some(Ok(v)) if v.eq_ignore_ascii_case("gzip") => true,
        Some(_) => {
            return Err(Failure::BadRequest(
                "unsupported Content-Encoding (use gzip or none)".into(),
            ))
        }
    };
    let mut data = BytesMut::new();
    while let Some(frame) = next_frame(&mut body, stall).await {
        let frame = frame.map_err(|e| Failure::BadRequest(e.to_string()))?;
        if let Ok(chunk) = frame.into_data() {
            let refusal = if data.len() as u64 + chunk.len() as u64 > max {
                Some(too_large(max))
            } else {
                reservation
                    .grow(chunk.len() as u64)
                    .err()
                    .map(|e| Failure::Overloaded(e.to_string()))
            };
            if let Some(refusal) = refusal {
                // Let the client finish sending so that it reads the answer, not a reset; what
                // it still sends is read and dropped, not buffered.
                drain_in_background(body, REFUSED_DRAIN_BUDGET, stall);
                return Err(refusal);
            }
            data.extend_from_slice(&chunk);
        }
    }
    if !gzip {
        return Ok((data.freeze(), reservation));
    }
    let compressed = data.freeze();
    // Decoding 10 MiB takes tens of milliseconds: not on an async worker.
    let (decoded, reservation) = tokio::task::spawn_blocking(move || {
        let decoded = gunzip(&compressed, max, &mut reservation);
        reservation.shrink(compressed.len() as u64);
        (decoded, reservation)
    })
    .await
    .map_err(|e| Failure::Internal(format!("gzip decoding failed: {e}")))?;
    Ok((decoded?.into(), reservation))
}

fn too_large(max: u64) -> Failure {
    Failure::TooLarge(format!("document is larger than the limit of {max} bytes"))
}

/// Every member of a gzip body (a second member is data too: `MultiGzDecoder`), at most `max`
/// bytes of output whatever the ratio (a zip bomb stops at the limit), each piece reserved
/// before it is kept.
fn gunzip(data: &[u8], max: u64, reservation: &mut Reservation) -> Result<Vec<u8>, Failure> {
    let mut decoder = flate2::read::MultiGzDecoder::new(data).take(max + 1);
    let mut decoded = Vec::new();
    let mut piece = vec![0u8; 64 * 1024];
    loop {
        let n = decoder
            .read(&mut piece)
            .map_err(|e| Failure::BadRequest(format!("body is not valid gzip: {e}")))?;
        if n == 0 {
            break;
        }
        if (decoded.len() + n) as u64 > max {
            return Err(too_large(max));
        }
        reservation
            .grow(n as u64)
            .map_err(|e| Failure::Overloaded(e.to_string()))?;
        decoded.extend_from_slice(&piece[..n]);
    }
    Ok(decoded)
}

/// How much of a refused (too large) body is read and dropped so the client sees the 413.
const REFUSED_DRAIN_BUDGET: u64 = 64 << 20;

#[derive(Deserialize)]
struct PutBody<'a> {
    #[serde(borrow)]
    fields: Option<&'a RawValue>,
    condition: Option<String>,
}

/// A put: the fields object exactly as sent (it is stored without re-encoding).
pub struct Put {
    pub fields: Bytes,
    pub condition: Option<String>,
}

pub fn put(body: &Bytes) -> Result<Put, Failure> {
    if body.is_empty() {
        return Err(Failure::BadRequest(
            "Could not read document, no document?".into(),
        ));
    }
    check_body_nesting(body)?;
    let parsed: PutBody = serde_json::from_slice(body)
        .map_err(|e| Failure::BadRequest(format!("document body is not valid JSON: {e}")))?;
    let fields = parsed
        .fields
        .ok_or_else(|| Failure::BadRequest("document body has no \"fields\" object".into()))?;
    // Stored as sent, but only once it has been parsed as what later reads and updates will
    // parse it as: an object no deeper than the limit. What is accepted can always be updated.
    bounds::check_nesting(fields.get().as_bytes(), MAX_NESTING, "document")
        .map_err(Failure::BadRequest)?;
    serde_json::from_str::<Fields>(fields.get())
        .map_err(|e| Failure::BadRequest(format!("\"fields\" must be a JSON object: {e}")))?;
    Ok(Put {
        fields: body.slice_ref(fields.get().as_bytes()),
        condition: parsed.condition,
    })
}

#[derive(Deserialize)]
pub struct Update {
    pub fields: Fields,
    pub condition: Option<String>,
    #[serde(default)]
    pub create: bool,
}

pub fn update(body: &Bytes) -> Result<Update, Failure> {
    if body.is_empty() {
        return Err(Failure::BadRequest(
            "Could not read document, no document?".into(),
        ));
    }
    check_body_nesting(body)?;
    serde_json::from_slice(body).map_err(|e| {
        Failure::BadRequest(format!(
            "update body is not valid JSON with a \"fields\" object: {e}"
        ))
    })
}

/// Refuses a body deeper than any document it may carry before serde_json parses it (its
/// `RawValue` skips a value without a depth limit, and a deep tree costs a deep drop).
fn check_body_nesting(body: &[u8]) -> Result<(), Failure> {
    bounds::check_nesting(body, MAX_NESTING + BODY_WRAPPING, "request body")
        .map_err(Failure::BadRequest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nested(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn documents_nest_at_most_the_limit() {
        // The fields object is one level, the field's value the rest.
        let at_limit = format!(r#"{{"fields":{{"f":{}}}}}"#, nested(MAX_NESTING - 1));
        assert!(put(&Bytes::from(at_limit)).is_ok());
        for depth in [MAX_NESTING, 200, 100_000] {
            let body = format!(r#"{{"fields":{{"f":{}}}}}"#, nested(depth));
            let err = put(&Bytes::from(body)).err().expect("too deep");
            assert_eq!(err.status(), 400);
            let body = format!(r#"{{"fields":{{"f":{{"assign":{}}}}}}}"#, nested(depth));
            assert!(update(&Bytes::from(body)).is_err());
        }
        assert!(put(&Bytes::from_static(br#"{"fields":[1]}"#)).is_err());
        assert!(put(&Bytes::from_static(br#"{"fields":{"a":1,}}"#)).is_err());
    }

    #[test]
    fn every_gzip_member_is_read_and_bombs_stop_at_the_limit() {
        use flate2::write::GzEncoder;
        use std::io::Write;
        let gz = |data: &[u8]| {
            let mut e = GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        };
        let budget = || {
            let b = |s| crate::body_budget::BodyBudget::new(bytesize::ByteSize::mib(64), s);
            Reservation::new(b("connection"), b("process"))
        };
        let mut two = gz(b"{\"fields\":");
        two.extend(gz(b"{}}"));
        assert_eq!(
            gunzip(&two, 100, &mut budget()).unwrap(),
            b"{\"fields\":{}}"
        );
        let bomb = gz(&vec![0u8; 8 << 20]);
        let err = gunzip(&bomb, 1 << 20, &mut budget()).unwrap_err();
        assert_eq!(err.status(), 413);
    }

    proptest! {
        #[test]
        fn bodies_never_panic(body in "[\\[\\]{}\":, a-z0-9]{0,300}") {
            let body = Bytes::from(body);
            if let Ok(p) = put(&body) {
                let fields: Fields = serde_json::from_slice(&p.fields).unwrap();
                prop_assert!(bounds::json_nesting(&p.fields) <= MAX_NESTING, "{fields:?}");
            }
            let _ = update(&body);
        }
    }
}
