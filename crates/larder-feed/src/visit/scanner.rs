//! Reads a visit page as it streams in: each document of the top-level `documents` array is
//! handed over as soon as its last byte arrives, so a streamed page of any length is written
//! out with memory for one document, not the page. Everything else of the page (its
//! `pathId`, `documentCount`, `continuation`, `message`) is kept as a small skeleton (the page
//! with an empty `documents` array) and parsed when the page ends.
//!
//! One pass over the bytes, a few states: time linear in the page, memory bounded by
//! `MAX_DOCUMENT_BYTES` and `MAX_SKELETON_BYTES`. Strings, most of a page's bytes, are taken a
//! run at a time (up to the next `"` or `\\`, found with `memchr`), not byte by byte.

use serde::Deserialize;
use serde_json::value::RawValue;

/// Largest single document accepted in a page (Larder stores at most 10 MiB by default).
pub(crate) const MAX_DOCUMENT_BYTES: usize = 64 << 20;

/// Largest page outside its documents: a continuation token and a few fields.
pub(crate) const MAX_SKELETON_BYTES: usize = 1 << 20;

/// What the page says besides its documents.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Tail {
    #[serde(rename = "documentCount", default)]
    pub document_count: Option<u64>,
    #[serde(default)]
    pub continuation: Option<String>,
}

impl Tail {
    /// An empty continuation means "finished", as no continuation does.
    pub(crate) fn next(&self) -> Option<&str> {
        self.continuation.as_deref().filter(|c| !c.is_empty())
    }
}

#[derive(Default)]
pub(crate) struct PageScanner {
    /// Open objects and arrays.
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// Inside the top-level `documents` array.
    in_documents: bool,
    /// Whether a document is open, and its bytes so far (whitespace outside strings dropped);
    /// the buffer is reused from one document to the next.
    in_document: bool,
    document: Vec<u8>,
    /// The last string seen at the top level, and whether it became a key (`:` followed it).
    top_string: Vec<u8>,
    key: Vec<u8>,
    skeleton: Vec<u8>,
    documents: u64,
}

impl PageScanner {
    /// Scans `chunk`, calling `emit` with each document completed in it (compact JSON, checked).
    pub(crate) fn feed(&mut self, chunk: &[u8], emit: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        let mut rest = chunk;
        while let Some((&byte, after)) = rest.split_first() {
            if self.in_string && !self.escaped {
                let run = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
                if run > 0 {
                    self.string_run(&rest[..run])?;
                    rest = &rest[run..];
                    continue;
                }
            }
            self.byte(byte, emit)?;
            rest = after;
        }
        Ok(())
    }

    /// Bytes inside a string that hold no quote and no backslash: kept as they are.
    fn string_run(&mut self, run: &[u8]) -> Result<(), String> {
        if self.depth == 1 {
            let room = 64usize.saturating_sub(self.top_string.len());
            self.top_string
                .extend_from_slice(&run[..room.min(run.len())]);
        }
        if self.in_document {
            Self::append(
                &mut self.document,
                run,
                MAX_DOCUMENT_BYTES,
                "a document is larger than",
            )
        } else if !(self.in_documents && self.depth >= 2) {
            Self::append(
                &mut self.skeleton,
                run,
                MAX_SKELETON_BYTES,
                "the page's fields exceed",
            )
        } else {
            Ok(())
        }
    }

    fn append(to: &mut Vec<u8>, bytes: &[u8], limit: usize, what: &str) -> Result<(), String> {
        if to.len() + bytes.len() > limit {
            return Err(format!("{what} {limit} bytes"));
        }
        to.extend_from_slice(bytes);
        Ok(())
    }

    /// The page has ended: its tail, checked against the documents counted.
    pub(crate) fn finish(self) -> Result<Tail, String> {
        if self.depth != 0 || self.in_string || self.skeleton.is_empty() {
            return Err("the page ended before its JSON did".into());
        }
        let tail: Tail = serde_json::from_slice(&self.skeleton)
            .map_err(|e| format!("the answer is not a visit page: {e}"))?;
        match tail.document_count {
            Some(count) if count != self.documents => Err(format!(
                "the page claims {count} documents and holds {}",
                self.documents
            )),
            _ => Ok(tail),
        }
    }

    fn byte(&mut self, byte: u8, emit: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        if self.in_string {
            self.string_byte(byte);
            return self.keep(byte);
        }
        match byte {
            b' ' | b'\n' | b'\r' | b'\t' => return Ok(()),
            b'"' => {
                self.in_string = true;
                if self.depth == 1 {
                    self.top_string.clear();
                }
            }
            b':' if self.depth == 1 => self.key = std::mem::take(&mut self.top_string),
            b',' if self.depth == 1 => self.key.clear(),
            b'[' if self.depth == 1 && self.key == b"documents" => {
                self.in_documents = true;
            }
            b'{' if self.in_documents && self.depth == 2 => {
                self.in_document = true;
                self.document.clear();
            }
            _ => {}
        }
        self.keep(byte)?;
        match byte {
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self
                    .depth
                    .checked_sub(1)
                    .ok_or("the page closes more than it opens")?;
                if self.in_documents && self.depth == 2 && byte == b'}' {
                    self.emit(emit)?;
                } else if self.in_documents && self.depth == 1 {
                    self.in_documents = false;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn string_byte(&mut self, byte: u8) {
        if self.escaped {
            self.escaped = false;
        } else if byte == b'\\' {
            self.escaped = true;
        } else if byte == b'"' {
            self.in_string = false;
        } else if self.depth == 1 && self.top_string.len() < 64 {
            self.top_string.push(byte);
        }
    }

    /// Appends `byte` to the open document, or to the skeleton when it is not a document's.
    fn keep(&mut self, byte: u8) -> Result<(), String> {
        if self.in_document {
            Self::append(
                &mut self.document,
                &[byte],
                MAX_DOCUMENT_BYTES,
                "a document is larger than",
            )
        } else if !(self.in_documents && self.depth >= 2) || byte == b']' && self.depth == 2 {
            Self::append(
                &mut self.skeleton,
                &[byte],
                MAX_SKELETON_BYTES,
                "the page's fields exceed",
            )
        } else {
            Ok(())
        }
    }

    fn emit(&mut self, emit: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        debug_assert!(self.in_document, "a document was open");
        self.in_document = false;
        serde_json::from_slice::<&RawValue>(&self.document)
            .map_err(|e| format!("a document in the page is not JSON: {e}"))?;
        self.documents += 1;
        emit(&self.document);
        // One huge document does not keep its buffer for the rest of the visit.
        if self.document.capacity() > 1 << 20 {
            self.document = Vec::new();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Scans `page` cut into chunks of `size`; the documents and the tail.
    fn scan(page: &[u8], size: usize) -> Result<(Vec<String>, Tail), String> {
        let mut scanner = PageScanner::default();
        let mut documents = Vec::new();
        for chunk in page.chunks(size.max(1)) {
            scanner.feed(chunk, &mut |d| {
                documents.push(String::from_utf8(d.to_vec()).unwrap())
            })?;
        }
        Ok((documents, scanner.finish()?))
    }

    #[test]
    fn documents_come_out_whole_and_compact_in_any_chunking() {
        let page = br#"{"pathId":"/document/v1/","documents":[
            {"id":"id:a:b::1","fields":{"t":"x \"}]\\ y","a":[1,{"b":[]}]}},
            {"id":"id:a:b::[2]", "fields":{}}
        ],"documentCount":2,"continuation":"AAB="}"#;
        for size in [1, 2, 3, 7, 1000] {
            let (documents, tail) = scan(page, size).unwrap();
            assert_eq!(
                documents,
                [
                    r#"{"id":"id:a:b::1","fields":{"t":"x \"}]\\ y","a":[1,{"b":[]}]}}"#,
                    r#"{"id":"id:a:b::[2]","fields":{}}"#
                ]
            );
            assert_eq!(tail.next(), Some("AAB="));
        }
        // The tail may come first, and a "documents" key inside a document means nothing.
        let page = br#"{"documentCount":1,"pathId":"/","documents":[{"id":"x","fields":{"documents":[{"a":1}]}}]}"#;
        let (documents, tail) = scan(page, 5).unwrap();
        assert_eq!(documents.len(), 1);
        assert_eq!(tail.next(), None);
    }

    #[test]
    fn broken_pages_are_errors() {
        for bad in [
            &br#"{"documents":[{"id":"x"}],"documentCount":2}"#[..],
            br#"{"documents":[{"id":"x"}"#,
            br#"{"documents":[{"id":x}]}"#,
            br#"]]"#,
            b"",
            b"<html>",
        ] {
            assert!(scan(bad, 3).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let (documents, tail) = scan(br#"{"documents":[],"continuation":""}"#, 4).unwrap();
        assert!(documents.is_empty() && tail.next().is_none());
    }

    proptest! {
        /// Any page serde_json writes scans to the same documents, however it is cut.
        #[test]
        fn agrees_with_serde_json(
            texts in prop::collection::vec("[a-c\"\\\\{}\\[\\], ]{0,6}", 0..6),
            size in 1usize..40,
        ) {
            let documents: Vec<serde_json::Value> = texts
                .iter()
                .enumerate()
                .map(|(i, t)| serde_json::json!({"id": format!("id:n:t::{i}"), "fields": {"t": t, "l": [t]}}))
                .collect();
            let page = serde_json::json!({"pathId": "/", "documents": documents,
                "documentCount": texts.len(), "continuation": "c"});
            let pretty = serde_json::to_vec_pretty(&page).unwrap();
            let (scanned, tail) = scan(&pretty, size).unwrap();
            let expected: Vec<String> = documents.iter().map(|d| d.to_string()).collect();
            prop_assert_eq!(scanned, expected);
            prop_assert_eq!(tail.next(), Some("c"));
        }
    }
}
