//! Vespa's document selection language, the subset Larder speaks: the `condition` of a
//! test-and-set write and the `selection` of a visit are the same language and the same parser.
//!
//! A selection is parsed once, within fixed bounds (`MAX_SELECTION_BYTES`, `MAX_NESTING`,
//! `MAX_GLOB_CHARS`), into a [`Selection`] that is `Send + Sync` and can be evaluated against
//! any number of documents, on any thread: the frontend evaluates conditions, storage nodes
//! evaluate visit selections where the documents are.
//!
//! ```
//! use larder_select::{Document, Selection};
//!
//! let selection = Selection::parse("music.year > 2000 and music.title = 'Hel*'").unwrap();
//! let fields = serde_json::json!({"year": 2005, "title": "Hello"});
//! let doc = Document {
//!     id: "id:ns:music::1",
//!     doctype: "music",
//!     fields: fields.as_object(),
//! };
//! assert!(selection.matches(&doc));
//! ```

mod bounds;
#[doc(hidden)]
pub mod fuzzing;
mod glob;
mod selection;

pub use bounds::{MAX_GLOB_CHARS, MAX_NESTING, MAX_SELECTION_BYTES};

/// A document's fields: a JSON object.
pub type Fields = serde_json::Map<String, serde_json::Value>;

/// What a selection is evaluated against: a document's ID and type, and its fields if it
/// exists (`None` for a document that does not, as a test-and-set condition sees it).
#[derive(Debug, Clone, Copy)]
pub struct Document<'a> {
    /// The full document ID, `id:<namespace>:<type>:<key/values>:<user-specified>`.
    pub id: &'a str,
    /// The document's type.
    pub doctype: &'a str,
    /// The document's fields; `None` when the document does not exist.
    pub fields: Option<&'a Fields>,
}

/// A parsed selection: immutable, cheap to share (`Send + Sync`), evaluated with `matches`.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    root: selection::Condition,
}

impl Selection {
    /// Parses `text`, refusing anything past the crate's bounds or outside the language.
    pub fn parse(text: &str) -> Result<Selection, Error> {
        selection::parse(text)
            .map(|root| Selection { root })
            .map_err(|message| Error { message })
    }

    /// Whether the selection holds for `doc`. Time linear in the selection's size and the
    /// size of the fields it reads; recursion bounded by `MAX_NESTING`.
    pub fn matches(&self, doc: &Document) -> bool {
        self.root.matches(doc)
    }
}

/// Why a selection was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    message: String,
}
