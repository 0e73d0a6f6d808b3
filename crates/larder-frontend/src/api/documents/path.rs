//! `/document/v1/<namespace>/<type>/docid/<id>` and its `number/<n>/<id>` and `group/<g>/<id>`
//! forms, turned into a full Vespa document ID (`id:<namespace>:<type>:<n=…|g=…>:<id>`).
//!
//! Segments are percent-decoded, and `+` decodes to a space: the Java feed client encodes IDs
//! with `URLEncoder`, which writes a space as `+` (send a literal plus as `%2B`).

use larder_proto::percent_decode;

/// A parsed document path.
#[derive(Debug, PartialEq, Eq)]
pub struct DocPath {
    pub namespace: String,
    pub doctype: String,
    /// The full document ID, `id:<namespace>:<type>:<modifier>:<user-specific>`.
    pub id: String,
}

/// What a `/document/v1/...` path names.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Document(DocPath),
    /// A path without a document (visiting), which this frontend does not serve yet.
    Collection,
}

pub fn parse(path: &str) -> Result<Target, String> {
    let rest = path
        .strip_prefix("/document/v1/")
        .ok_or_else(|| format!("{path} is not a /document/v1/ path"))?;
    let segments: Vec<&str> = rest.split('/').collect();
    let decode = |s: &str| {
        percent_decode(s, true).ok_or_else(|| format!("malformed percent-encoding in {s:?}"))
    };
    let (namespace, doctype) = match segments.as_slice() {
        [ns, ty, ..] if !ns.is_empty() && !ty.is_empty() => (decode(ns)?, decode(ty)?),
        _ => return Err(usage(path)),
    };
    let (modifier, id_segments) = match &segments[2..] {
        [] | [""] => return Ok(Target::Collection),
        ["docid"] | ["docid", ""] => return Ok(Target::Collection),
        ["docid", id @ ..] => (String::new(), id),
        ["number", n, id @ ..] => {
            let n: u64 = decode(n)?
                .parse()
                .map_err(|_| format!("number {n:?} in {path} is not an unsigned integer"))?;
            (format!("n={n}"), id)
        }
        ["group", g, id @ ..] if !g.is_empty() => (format!("g={}", decode(g)?), id),
        _ => return Err(usage(path)),
    };
    if id_segments.is_empty() || id_segments.iter().all(|s| s.is_empty()) {
        return Ok(Target::Collection);
    }
    let user_specific = id_segments
        .iter()
        .map(|s| decode(s))
        .collect::<Result<Vec<_>, _>>()?
        .join("/");
    for (what, value) in [("namespace", &namespace), ("document type", &doctype)] {
        if value.contains(':') {
            return Err(format!("{what} {value:?} may not contain ':'"));
        }
    }
    let id = format!("id:{namespace}:{doctype}:{modifier}:{user_specific}");
    Ok(Target::Document(DocPath {
        namespace,
        doctype,
        id,
    }))
}

fn usage(path: &str) -> String {
    format!(
        "bad document path {path}: expected /document/v1/<namespace>/<type>/docid/<id>, \
         .../number/<n>/<id> or .../group/<group>/<id>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(path: &str) -> String {
        match parse(path).unwrap() {
            Target::Document(d) => d.id,
            Target::Collection => panic!("{path} names no document"),
        }
    }

    #[test]
    fn the_three_forms_and_decoding() {
        assert_eq!(id("/document/v1/ns/music/docid/1"), "id:ns:music::1");
        assert_eq!(
            id("/document/v1/ns/music/number/42/a"),
            "id:ns:music:n=42:a"
        );
        assert_eq!(
            id("/document/v1/ns/music/group/g%201/a"),
            "id:ns:music:g=g 1:a"
        );
        assert_eq!(
            id("/document/v1/ns/music/docid/a%2Fb+c%2Bd%3F"),
            "id:ns:music::a/b c+d?"
        );
        assert_eq!(id("/document/v1/ns/music/docid/a/b"), "id:ns:music::a/b");
        assert_eq!(parse("/document/v1/ns/music/docid"), Ok(Target::Collection));
        assert_eq!(parse("/document/v1/ns/music/"), Ok(Target::Collection));
        for bad in [
            "/document/v1/ns",
            "/document/v1//music/docid/1",
            "/document/v1/ns/music/number/x/1",
            "/document/v1/ns/music/other/1",
            "/document/v1/ns/music/docid/%zz",
            "/document/v1/n:s/music/docid/1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
