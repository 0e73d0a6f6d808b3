//! A parsed selection and its evaluation against one document.
//!
//! Evaluation recurses over the tree, which is at most `MAX_NESTING` levels deep (the parser
//! guarantees it; `and`/`or` chains are flat lists), so its recursion and the tree's drop are
//! bounded too.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::Value;

use crate::docid::IdPart;
use crate::glob::Glob;
use crate::pattern::Pattern;
use crate::Document;

#[derive(Debug, Clone)]
pub(crate) enum Expr {
    /// True when any holds (two or more).
    Or(Vec<Expr>),
    /// True when all hold (two or more).
    And(Vec<Expr>),
    Not(Box<Expr>),
    Compare(Operand, Cmp, Operand),
    /// `operand = 'pattern'`: true when the operand is text the glob matches.
    Glob(Operand, Glob),
    /// `operand =~ 'regex'`: true when the operand is text the regex matches somewhere.
    Regex(Operand, Pattern),
    /// An operand alone: true unless null, false or the number 0.
    Truthy(Operand),
}

#[derive(Debug, Clone)]
pub(crate) enum Operand {
    Literal(Value),
    Field {
        doctype: String,
        field: String,
    },
    /// `<type>` alone: true when the document exists and is of that type.
    DocType(String),
    Id(IdPart),
    Group(Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Expr {
    pub(crate) fn matches(&self, doc: &Document) -> bool {
        match self {
            Expr::Or(all) => all.iter().any(|e| e.matches(doc)),
            Expr::And(all) => all.iter().all(|e| e.matches(doc)),
            Expr::Not(inner) => !inner.matches(doc),
            Expr::Truthy(operand) => truthy(&operand.value(doc)),
            Expr::Compare(a, cmp, b) => compare(&a.value(doc), *cmp, &b.value(doc)),
            Expr::Glob(a, glob) => text_of(&a.value(doc)).is_some_and(|t| glob.matches(t)),
            Expr::Regex(a, regex) => text_of(&a.value(doc)).is_some_and(|t| regex.matches(t)),
        }
    }
}

impl Operand {
    /// The operand's value; a field is borrowed, not copied (it may be megabytes of text).
    fn value<'a>(&'a self, doc: &Document<'a>) -> Cow<'a, Value> {
        match self {
            Operand::Literal(v) => Cow::Borrowed(v),
            Operand::Id(part) => Cow::Owned(part.of(doc.id)),
            Operand::DocType(t) => {
                Cow::Owned(Value::Bool(doc.fields.is_some() && t == doc.doctype))
            }
            Operand::Field { doctype, field } if doctype == doc.doctype => {
                match doc.fields.and_then(|f| f.get(field)) {
                    Some(value) => Cow::Borrowed(value),
                    None => Cow::Owned(Value::Null),
                }
            }
            Operand::Field { .. } => Cow::Owned(Value::Null),
            Operand::Group(inner) => Cow::Owned(Value::Bool(inner.matches(doc))),
        }
    }
}

fn text_of(value: &Value) -> Option<&str> {
    match value {
        Value::String(text) => Some(text),
        _ => None,
    }
}

fn truthy(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => false,
        Value::Number(n) => n.as_f64() != Some(0.0),
        _ => true,
    }
}

/// Numbers compare as numbers and text as text; other values are only equal or not (so
/// `null == null` holds), and values of different kinds are unordered: only `!=` holds.
fn compare(a: &Value, cmp: Cmp, b: &Value) -> bool {
    let order = match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64().partial_cmp(&y.as_f64()),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (x, y) if x == y => Some(Ordering::Equal),
        _ => None,
    };
    match cmp {
        Cmp::Eq => order == Some(Ordering::Equal),
        Cmp::Ne => order != Some(Ordering::Equal),
        Cmp::Lt => order == Some(Ordering::Less),
        Cmp::Le => matches!(order, Some(Ordering::Less | Ordering::Equal)),
        Cmp::Gt => order == Some(Ordering::Greater),
        Cmp::Ge => matches!(order, Some(Ordering::Greater | Ordering::Equal)),
    }
}
