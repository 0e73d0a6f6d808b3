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
    /// A path without a document: the documents a visit (or an update-where, a delete-where)
    /// goes through.
    Collection(Scope),
}

/// Which documents a visiting path covers: `/document/v1/` all of them, then narrowed by
/// namespace and type, and by a `number/<n>` or `group/<g>` location.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    pub namespace: Option<String>,
    pub doctype: Option<String>,
    /// The ID's modifier the documents must have: `n=<n>` or `g=<g>`.
    pub modifier: Option<String>,
}

impl Scope {
    /// Whether the document `id` (a full document ID) lies in this scope.
    pub fn covers(&self, id: &str) -> bool {
        let mut parts = id.splitn(5, ':');
        let (Some("id"), Some(ns), Some(ty), Some(modifier), Some(_)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return false;
        };
        self.namespace.as_deref().is_none_or(|n| n == ns)
            && self.doctype.as_deref().is_none_or(|t| t == ty)
            && self.modifier.as_deref().is_none_or(|m| m == modifier)
    }
}

/// The document type part of a full document ID.
pub fn doctype_of(id: &str) -> &str {
    id.split(':').nth(2).unwrap_or("")
}

pub fn parse(path: &str) -> Result<Target, String> {
    let rest = path
        .strip_prefix("/document/v1/")
        .ok_or_else(|| format!("{path} is not a /document/v1/ path"))?;
    if rest.is_empty() {
        return Ok(Target::Collection(Scope::default()));
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let decode = |s: &str| {
        percent_decode(s, true).ok_or_else(|| format!("malformed percent-encoding in {s:?}"))
    };
    let (namespace, doctype) = match segments.as_slice() {
        [ns, ty, ..] if !ns.is_empty() && !ty.is_empty() => (decode(ns)?, decode(ty)?),
        _ => return Err(usage(path)),
    };
    let mut scope = Scope {
        namespace: Some(namespace.clone()),
        doctype: Some(doctype.clone()),
        modifier: None,
    };
    let (modifier, id_segments) = match &segments[2..] {
        [] | [""] => return Ok(Target::Collection(scope)),
        ["docid"] | ["docid", ""] => return Ok(Target::Collection(scope)),
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
        scope.modifier = Some(modifier);
        return Ok(Target::Collection(scope));
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
            Target::Collection(_) => panic!("{path} names no document"),
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
        let typed = Scope {
            namespace: Some("ns".into()),
            doctype: Some("music".into()),
            modifier: None,
        };
        let collection = |p| match parse(p) {
            Ok(Target::Collection(scope)) => scope,
            other => panic!("{p}: {other:?}"),
        };
        assert_eq!(collection("/document/v1/ns/music/docid"), typed);
        assert_eq!(collection("/document/v1/ns/music/"), typed);
        assert_eq!(collection("/document/v1/"), Scope::default());
        let group = collection("/document/v1/ns/music/group/g1");
        assert_eq!(group.modifier.as_deref(), Some("g=g1"));
        assert!(group.covers("id:ns:music:g=g1:x") && !group.covers("id:ns:music:g=g2:x"));
        assert!(typed.covers("id:ns:music::a:b") && !typed.covers("id:ns:other::a"));
        assert!(Scope::default().covers("id:a:b::c") && !Scope::default().covers("nonsense"));
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
