//! Vespa's document selection language, the subset Larder speaks: the `condition` of a
//! test-and-set write and the `selection` of a visit are the same language and the same parser.
//!
//! A selection is parsed once, within fixed bounds, into a [`Selection`] that is
//! `Send + Sync` and can be evaluated against any number of documents, on any thread: the
//! frontend evaluates conditions, storage nodes evaluate visit selections where the documents
//! are. An invalid selection is an [`Error`] that says at which byte it went wrong.
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
//! assert_eq!(Selection::parse("music.year >").unwrap_err().position(), 12);
//! ```
//!
//! # Grammar
//!
//! ```text
//! selection  := or
//! or         := and ("or" and)*
//! and        := not ("and" not)*
//! not        := "not" not | comparison
//! comparison := operand (("==" | "!=" | "<" | "<=" | ">" | ">=") operand)?
//!             | operand "=" string          (glob: `*` any run, `?` one character)
//!             | operand "=~" string         (regular expression, found anywhere)
//! operand    := "(" selection ")" | number | string | "true" | "false" | "null"
//!             | "id" | "id.namespace" | "id.type" | "id.user" | "id.group" | "id.specific"
//!             | <type> | <type> "." <field>
//! string     := '…' | "…"                   (`\n`, `\t`; `\` before any other character is it)
//! number     := a JSON number, optionally negative (`42`, `-1.5`, `2e3`)
//! ```
//!
//! Keywords are case-insensitive. `<type>.<field>` is the field's value, null when the document
//! lacks it or is of another type; `<type>` alone is true when the document exists and is of
//! that type. The ID's parts come from `id:<namespace>:<type>:<n=number|g=group>:<specific>`:
//! `id.user` is the number of `n=`, `id.group` the text of `g=`, each null when the ID has
//! none. An operand alone is true unless it is null, false or the number 0. Numbers compare as
//! numbers and text as text; other values are only equal or not (`music.x == null` is true when
//! the field is missing), and values of different kinds are unordered: only `!=` holds between
//! them. `=` and `=~` are false unless the left side is text. Anything else (arithmetic,
//! functions such as `now()`, field paths into structs, `id.bucket`) is an error, never a guess.
//!
//! # Bounds
//!
//! A selection is at most [`MAX_SELECTION_BYTES`] long and nests parentheses and `not` at most
//! [`MAX_NESTING`] deep, so parsing, evaluation and the tree's drop recurse at most that far
//! (`and`/`or` chains are flat lists). Tokenising and parsing are linear in the text. Globs
//! (at most [`MAX_GLOB_CHARS`]) are matched without backtracking; regular expressions (at most
//! [`MAX_REGEXES`] of [`MAX_REGEX_BYTES`] each, compiled programs of at most
//! [`REGEX_SIZE_LIMIT`]) use the `regex` crate's automata, linear in the text. Matching a large
//! field still costs time linear in its size: callers run it off their async workers.

mod bounds;
mod docid;
mod expr;
#[doc(hidden)]
pub mod fuzzing;
mod glob;
mod lexer;
#[cfg(test)]
mod model;
mod parser;
mod pattern;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

pub use bounds::{
    MAX_GLOB_CHARS, MAX_NESTING, MAX_REGEXES, MAX_REGEX_BYTES, MAX_SELECTION_BYTES,
    REGEX_SIZE_LIMIT,
};

/// A document's fields: a JSON object.
pub type Fields = serde_json::Map<String, serde_json::Value>;

/// What a selection is evaluated against: a document's ID and type, and its fields if it
/// exists (`None` for a document that does not, as a test-and-set condition sees it).
#[derive(Debug, Clone, Copy)]
pub struct Document<'a> {
    /// The full document ID, `id:<namespace>:<type>:<key=value>:<user-specified>`.
    pub id: &'a str,
    /// The document's type.
    pub doctype: &'a str,
    /// The document's fields; `None` when the document does not exist.
    pub fields: Option<&'a Fields>,
}

/// A parsed selection: immutable, cheap to share (`Send + Sync`), evaluated with `matches`.
#[derive(Debug, Clone)]
pub struct Selection {
    root: expr::Expr,
}

impl Selection {
    /// Parses `text`, refusing anything past the crate's bounds or outside the language.
    pub fn parse(text: &str) -> Result<Selection, Error> {
        parser::parse(text).map(|root| Selection { root })
    }

    /// Whether the selection holds for `doc`. Time linear in the selection's size and the size
    /// of the fields it reads; recursion bounded by `MAX_NESTING`.
    pub fn matches(&self, doc: &Document) -> bool {
        self.root.matches(doc)
    }
}

/// Why a selection was refused, and at which byte of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} at byte {position}")]
pub struct Error {
    position: usize,
    message: Cow<'static, str>,
}

impl Error {
    pub(crate) fn new(position: usize, message: impl Into<Cow<'static, str>>) -> Error {
        Error {
            position,
            message: message.into(),
        }
    }

    /// The byte offset in the selection where the error was found (its length when the
    /// selection ends too early).
    pub fn position(&self) -> usize {
        self.position
    }

    /// What is wrong, without the position.
    pub fn message(&self) -> &str {
        &self.message
    }
}
