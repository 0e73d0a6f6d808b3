//! Request bodies: read with a size limit, gunzipped when `Content-Encoding: gzip` (the Java
//! feed client compresses bodies over 512 bytes), and parsed into put and update operations.

use std::io::Read;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::reply::Failure;
use super::update::Fields;
use crate::body::{drain_in_background, next_frame};

/// Reads the whole body (at most `max` bytes after decoding); a client that sends nothing for
/// `stall` gets a 400.
pub async fn read(
    mut body: Incoming,
    headers: &HeaderMap,
    max: u64,
    stall: Duration,
) -> Result<Bytes, Failure> {
    let too_large =
        || Failure::TooLarge(format!("document is larger than the limit of {max} bytes"));
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
            if data.len() as u64 + chunk.len() as u64 > max {
                // Let the client finish sending so that it reads the 413, not a reset.
                drain_in_background(body, REFUSED_DRAIN_BUDGET, stall);
                return Err(too_large());
            }
            data.extend_from_slice(&chunk);
        }
    }
    if !gzip {
        return Ok(data.freeze());
    }
    let mut decoded = Vec::new();
    flate2::read::GzDecoder::new(&data[..])
        .take(max + 1)
        .read_to_end(&mut decoded)
        .map_err(|e| Failure::BadRequest(format!("body is not valid gzip: {e}")))?;
    if decoded.len() as u64 > max {
        return Err(too_large());
    }
    Ok(decoded.into())
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
    let parsed: PutBody = serde_json::from_slice(body)
        .map_err(|e| Failure::BadRequest(format!("document body is not valid JSON: {e}")))?;
    let fields = parsed
        .fields
        .ok_or_else(|| Failure::BadRequest("document body has no \"fields\" object".into()))?;
    if !fields.get().starts_with('{') {
        return Err(Failure::BadRequest(
            "\"fields\" must be a JSON object".into(),
        ));
    }
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
    serde_json::from_slice(body).map_err(|e| {
        Failure::BadRequest(format!(
            "update body is not valid JSON with a \"fields\" object: {e}"
        ))
    })
}
