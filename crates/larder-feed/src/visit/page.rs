//! One page of a visit on the wire (Vespa's format): the request's query string, and the
//! answer `{"pathId", "documents": [{"id", "fields"}], "documentCount", "continuation"}`.

use serde::Deserialize;
use serde_json::value::RawValue;

/// What one slice asks for on every page (the continuation is added per page).
#[derive(Clone, Debug, Default)]
pub(crate) struct PageQuery {
    pub selection: Option<String>,
    pub field_set: Option<String>,
    pub cluster: Option<String>,
    pub wanted_document_count: Option<u32>,
    pub stream: bool,
    /// `(slices, slice_id)`; `None` visits everything in one slice.
    pub slice: Option<(u32, u32)>,
}

impl PageQuery {
    /// The query string of the page after `continuation` (the first page without one).
    pub(crate) fn to_query(&self, continuation: Option<&str>) -> String {
        let mut pairs: Vec<(&str, String)> = Vec::new();
        let mut optional = |name, value: &Option<String>| {
            if let Some(value) = value {
                pairs.push((name, value.clone()));
            }
        };
        optional("cluster", &self.cluster);
        optional("selection", &self.selection);
        optional("fieldSet", &self.field_set);
        if let Some(count) = self.wanted_document_count {
            pairs.push(("wantedDocumentCount", count.to_string()));
        }
        if let Some((slices, id)) = self.slice {
            pairs.push(("slices", slices.to_string()));
            pairs.push(("sliceId", id.to_string()));
        }
        pairs.push(("stream", self.stream.to_string()));
        if let Some(continuation) = continuation {
            pairs.push(("continuation", continuation.to_owned()));
        }
        let encoded: Vec<String> = pairs
            .iter()
            .map(|(name, value)| format!("{name}={}", crate::operation::encode(value)))
            .collect();
        encoded.join("&")
    }
}

/// A page as answered; documents stay raw JSON, written out as they came.
#[derive(Debug, Deserialize)]
pub(crate) struct Page<'a> {
    #[serde(borrow, default)]
    pub documents: Vec<&'a RawValue>,
    #[serde(rename = "documentCount", default)]
    pub document_count: Option<u64>,
    #[serde(default)]
    pub continuation: Option<String>,
}

impl<'a> Page<'a> {
    pub(crate) fn parse(body: &'a [u8]) -> Result<Page<'a>, String> {
        let page: Page = serde_json::from_slice(body)
            .map_err(|e| format!("the answer is not a visit page: {e}"))?;
        match page.document_count {
            Some(count) if count != page.documents.len() as u64 => Err(format!(
                "the page claims {count} documents and holds {}",
                page.documents.len()
            )),
            _ => Ok(page),
        }
    }

    /// The documents as JSON lines, appended to `out`: one compact line each (a document the
    /// server sent over several lines is re-encoded).
    pub(crate) fn write_lines(&self, out: &mut Vec<u8>) {
        for document in &self.documents {
            let text = document.get();
            if text.contains('\n') {
                let value: serde_json::Value =
                    serde_json::from_str(text).expect("a RawValue is valid JSON");
                serde_json::to_writer(&mut *out, &value).expect("writing to a Vec never fails");
            } else {
                out.extend_from_slice(text.as_bytes());
            }
            out.push(b'\n');
        }
    }

    /// An empty continuation means "finished", as no continuation does.
    pub(crate) fn next(&self) -> Option<&str> {
        self.continuation.as_deref().filter(|c| !c.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_carry_every_parameter_encoded() {
        let query = PageQuery {
            selection: Some("music.title = 'a b*' and id.user == 1+1&x".into()),
            field_set: Some("music:[document]".into()),
            cluster: Some("content".into()),
            wanted_document_count: Some(500),
            stream: true,
            slice: Some((4, 3)),
        };
        assert_eq!(
            query.to_query(Some("AAB+/=")),
            "cluster=content\
             &selection=music.title%20%3D%20%27a%20b%2A%27%20and%20id.user%20%3D%3D%201%2B1%26x\
             &fieldSet=music%3A%5Bdocument%5D&wantedDocumentCount=500&slices=4&sliceId=3\
             &stream=true&continuation=AAB%2B%2F%3D"
        );
        assert_eq!(PageQuery::default().to_query(None), "stream=false");
    }

    #[test]
    fn pages_parse_and_print_as_json_lines() {
        let body = br#"{"pathId":"/document/v1/","documents":[{"id":"id:a:b::1","fields":{"x":1}},
            {"id":"id:a:b::2",
             "fields":{}}],"documentCount":2,"continuation":"AAA"}"#;
        let page = Page::parse(body).unwrap();
        assert_eq!(page.next(), Some("AAA"));
        let mut out = Vec::new();
        page.write_lines(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"id\":\"id:a:b::1\",\"fields\":{\"x\":1}}\n{\"fields\":{},\"id\":\"id:a:b::2\"}\n"
        );
        let last = Page::parse(br#"{"pathId":"/","documents":[],"documentCount":0}"#).unwrap();
        assert_eq!(last.next(), None);
        assert_eq!(
            Page::parse(br#"{"documents":[],"continuation":""}"#)
                .unwrap()
                .next(),
            None
        );
        assert!(Page::parse(br#"{"documents":[{}],"documentCount":2}"#).is_err());
        assert!(Page::parse(b"<html>").is_err());
    }
}
