//! Feed operations in Vespa's JSON feed format and the `/document/v1` requests they become.
//!
//! `{"put": "id:ns:type::key", "fields": {…}}` (also `"id"` for a put), `{"update": …, "fields":
//! {…}, "create": true}`, `{"remove": …}`; each may carry a `"condition"`.

use bytes::Bytes;
use http::Method;
use serde::Deserialize;
use serde_json::value::RawValue;

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Put,
    Update,
    Remove,
}

/// One operation, ready to send.
#[derive(Clone, Debug)]
pub struct Operation {
    pub kind: Kind,
    /// The full document ID; operations with the same ID are applied in feed order.
    pub id: std::sync::Arc<str>,
    /// `/document/v1/...` with the query (create, condition).
    pub path_and_query: String,
    /// `{"fields": …}` for puts and updates; empty for removes.
    pub body: Bytes,
    /// The input line the operation starts on.
    pub line: u64,
}

impl Operation {
    pub fn method(&self) -> Method {
        match self.kind {
            Kind::Put => Method::POST,
            Kind::Update => Method::PUT,
            Kind::Remove => Method::DELETE,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw<'a> {
    put: Option<String>,
    update: Option<String>,
    remove: Option<String>,
    id: Option<String>,
    #[serde(borrow)]
    fields: Option<&'a RawValue>,
    condition: Option<String>,
    create: Option<bool>,
}

/// Why an operation object was refused, and where in it (when the JSON parser said).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub message: String,
    /// 1-based line and byte column within the operation's own text.
    pub at: Option<(u64, u64)>,
}

impl From<String> for Invalid {
    fn from(message: String) -> Invalid {
        Invalid { message, at: None }
    }
}

impl From<&str> for Invalid {
    fn from(message: &str) -> Invalid {
        message.to_owned().into()
    }
}

/// serde_json's message without its " at line L column C" suffix (relative to the operation, not
/// the feed), and that position apart.
fn json_error(e: &serde_json::Error) -> Invalid {
    let text = e.to_string();
    if e.line() == 0 {
        return Invalid {
            message: format!("invalid operation: {text}"),
            at: None,
        };
    }
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    Invalid {
        message: format!(
            "invalid operation: {}",
            text.strip_suffix(&suffix).unwrap_or(&text)
        ),
        at: Some((e.line() as u64, e.column() as u64)),
    }
}

/// Parses one operation object; `line` is where it starts (for messages and ordering reports).
pub fn parse(json: &[u8], line: u64) -> Result<Operation, Invalid> {
    let raw: Raw = serde_json::from_slice(json).map_err(|e| json_error(&e))?;
    let (kind, id) = match (raw.put, raw.id, raw.update, raw.remove) {
        (Some(id), None, None, None) | (None, Some(id), None, None) => (Kind::Put, id),
        (None, None, Some(id), None) => (Kind::Update, id),
        (None, None, None, Some(id)) => (Kind::Remove, id),
        (None, None, None, None) => {
            return Err("operation has none of \"put\", \"update\", \"remove\" or \"id\"".into());
        }
        _ => return Err("operation names more than one of put, update, remove, id".into()),
    };
    let body = match (kind, raw.fields) {
        (Kind::Remove, None) => Bytes::new(),
        (Kind::Remove, Some(_)) => return Err("a remove has no \"fields\"".into()),
        (_, None) => {
            let kind = format!("{kind:?}").to_lowercase();
            return Err(format!("{kind} of {id} has no \"fields\"").into());
        }
        (_, Some(fields)) if !fields.get().starts_with('{') => {
            return Err("\"fields\" must be a JSON object".into())
        }
        (_, Some(fields)) => {
            let mut body = Vec::with_capacity(fields.get().len() + 11);
            body.extend_from_slice(b"{\"fields\":");
            body.extend_from_slice(fields.get().as_bytes());
            body.push(b'}');
            body.into()
        }
    };
    let mut path_and_query = document_path(&id).map_err(Invalid::from)?;
    let mut query = Vec::new();
    if raw.create == Some(true) {
        if kind == Kind::Remove {
            return Err("\"create\" applies to puts and updates, not removes".into());
        }
        query.push("create=true".to_string());
    }
    if let Some(condition) = raw.condition.filter(|c| !c.trim().is_empty()) {
        query.push(format!("condition={}", encode(&condition)));
    }
    if !query.is_empty() {
        path_and_query.push('?');
        path_and_query.push_str(&query.join("&"));
    }
    Ok(Operation {
        kind,
        id: id.into(),
        path_and_query,
        body,
        line,
    })
}

/// `id:<namespace>:<type>:<n=…|g=…|>:<user-specific>` → `/document/v1/<ns>/<type>/docid/<key>`
/// (or the `number` / `group` form).
pub fn document_path(id: &str) -> Result<String, String> {
    let bad = || format!("{id:?} is not a document ID (id:<namespace>:<type>::<key>)");
    let rest = id.strip_prefix("id:").ok_or_else(bad)?;
    let mut parts = rest.splitn(4, ':');
    let (Some(ns), Some(doctype), Some(modifier), Some(key)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    if ns.is_empty() || doctype.is_empty() || key.is_empty() {
        return Err(bad());
    }
    let selector = if modifier.is_empty() {
        "docid".to_string()
    } else if let Some(n) = modifier.strip_prefix("n=") {
        let n: u64 = n
            .parse()
            .map_err(|_| format!("{id:?}: n= needs an unsigned number"))?;
        format!("number/{n}")
    } else if let Some(g) = modifier.strip_prefix("g=").filter(|g| !g.is_empty()) {
        format!("group/{}", encode(g))
    } else {
        return Err(format!(
            "{id:?}: unsupported modifier {modifier:?} (use n=<number> or g=<group>)"
        ));
    };
    Ok(format!(
        "/document/v1/{}/{}/{selector}/{}",
        encode(ns),
        encode(doctype),
        encode(key)
    ))
}

/// Percent-encodes everything but RFC 3986 unreserved characters (so `/`, `+`, space and `?` in
/// IDs survive the trip).
pub(crate) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feed_format() {
        let op = parse(
            br#"{"put": "id:music:song::a b/c+d", "fields": {"t": [1, 2]}}"#,
            3,
        )
        .unwrap();
        assert_eq!(op.kind, Kind::Put);
        assert_eq!(&*op.id, "id:music:song::a b/c+d");
        assert_eq!(
            op.path_and_query,
            "/document/v1/music/song/docid/a%20b%2Fc%2Bd"
        );
        assert_eq!(&op.body[..], br#"{"fields":{"t": [1, 2]}}"#);
        assert_eq!(op.line, 3);
        let op = parse(br#"{"id": "id:n:t:n=5:k", "fields": {}}"#, 1).unwrap();
        assert_eq!(
            (op.kind, op.path_and_query.as_str()),
            (Kind::Put, "/document/v1/n/t/number/5/k")
        );
        let op = parse(
            br#"{"update": "id:n:t:g=x y:k", "create": true, "condition": "t.a > 1", "fields": {"a": {"increment": 1}}}"#,
            1,
        )
        .unwrap();
        assert_eq!(op.method(), Method::PUT);
        assert_eq!(
            op.path_and_query,
            "/document/v1/n/t/group/x%20y/k?create=true&condition=t.a%20%3E%201"
        );
        let op = parse(br#"{"remove": "id:n:t::k:with:colons"}"#, 1).unwrap();
        assert_eq!((op.method(), op.body.len()), (Method::DELETE, 0));
        assert_eq!(
            op.path_and_query,
            "/document/v1/n/t/docid/k%3Awith%3Acolons"
        );
        for bad in [
            &br#"{"put": "id:n:t::k"}"#[..],
            br#"{"put": "id:n:t::k", "fields": [1]}"#,
            br#"{"put": "nope", "fields": {}}"#,
            br#"{"put": "id:n:t:x=1:k", "fields": {}}"#,
            br#"{"fields": {}}"#,
            br#"{"put": "id:n:t::k", "remove": "id:n:t::k", "fields": {}}"#,
            br#"{"remove": "id:n:t::k", "fields": {}}"#,
            br#"{"put": "id:n:t::k", "fields": {}, "surprise": 1}"#,
            br#"[1]"#,
        ] {
            assert!(parse(bad, 1).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
