//! The property test of the language: a small reference model (an AST, its own printer and its
//! own evaluator, written from the grammar in the crate's docs, not from the parser), random
//! selections printed to text and parsed back, and both evaluated against random documents.
//! The parser must accept every printed selection and agree with the model on every document.

use std::cmp::Ordering;

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::{Document, Fields, Selection};

#[derive(Debug, Clone)]
enum M {
    Or(Vec<M>),
    And(Vec<M>),
    Not(Box<M>),
    Cmp(V, &'static str, V),
    Glob(V, String),
    Regex(V, &'static str),
    Truthy(V),
}

#[derive(Debug, Clone)]
enum V {
    Null,
    Bool(bool),
    Int(i64),
    /// `n.5`
    Half(i64),
    Text(String),
    Field(&'static str, &'static str),
    Type(&'static str),
    /// `id` (empty) or `id.<part>`.
    Id(&'static str),
    Group(Box<M>),
}

const TYPES: [&str; 2] = ["music", "books"];
const FIELDS: [&str; 6] = ["year", "title", "live", "rating", "tags", "absent"];
const ID_PARTS: [&str; 6] = ["", "namespace", "type", "user", "group", "specific"];
const CMPS: [&str; 6] = ["==", "!=", "<", "<=", ">", ">="];
const REGEXES: [&str; 7] = ["^a", "b$", "a+b", "^(a|b)*$", "c", ".", "^$"];
const IDS: [&str; 5] = [
    "id:ns:music::a",
    "id:ns:music:n=5:b:c",
    "id:other:books:g=ab:a",
    "id:ns:books:n=x:1",
    "id:broken",
];

fn leaf_value() -> impl Strategy<Value = V> {
    // Few distinct values, so that equal operands (where `<` and `<=` differ) are common.
    prop_oneof![
        1 => Just(V::Null),
        1 => any::<bool>().prop_map(V::Bool),
        3 => (-1i64..=1).prop_map(V::Int),
        1 => Just(V::Int(2005)),
        1 => (-1i64..=0).prop_map(V::Half),
        2 => "[ab'\"\\\\ ]{0,2}".prop_map(V::Text),
        4 => (prop::sample::select(&TYPES[..]), prop::sample::select(&FIELDS[..]))
            .prop_map(|(t, f)| V::Field(t, f)),
        1 => prop::sample::select(&TYPES[..]).prop_map(V::Type),
        2 => prop::sample::select(&ID_PARTS[..]).prop_map(V::Id),
    ]
}

fn selection() -> impl Strategy<Value = M> {
    let leaf = prop_oneof![
        (leaf_value(), prop::sample::select(&CMPS[..]), leaf_value())
            .prop_map(|(a, c, b)| M::Cmp(a, c, b)),
        (leaf_value(), "[ab?*]{0,5}").prop_map(|(a, p)| M::Glob(a, p)),
        (leaf_value(), prop::sample::select(&REGEXES[..])).prop_map(|(a, r)| M::Regex(a, r)),
        leaf_value().prop_map(M::Truthy),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 2..4).prop_map(M::Or),
            prop::collection::vec(inner.clone(), 2..4).prop_map(M::And),
            inner.clone().prop_map(|m| M::Not(Box::new(m))),
            (inner.clone(), prop::sample::select(&CMPS[..]), leaf_value())
                .prop_map(|(m, c, b)| M::Cmp(V::Group(Box::new(m)), c, b)),
            inner.prop_map(|m| M::Truthy(V::Group(Box::new(m)))),
        ]
    })
}

/// Prints with as few parentheses as precedence allows (or < and < not/comparison), so that
/// the parser's precedence is what is tested; `upper` prints keywords in capitals.
struct Printer {
    upper: bool,
}

impl Printer {
    fn keyword(&self, word: &str) -> String {
        match self.upper {
            true => word.to_uppercase(),
            false => word.to_owned(),
        }
    }

    fn precedence(m: &M) -> u8 {
        match m {
            M::Or(_) => 0,
            M::And(_) => 1,
            _ => 2,
        }
    }

    fn at_least(&self, m: &M, precedence: u8) -> String {
        let text = self.selection(m);
        match Self::precedence(m) < precedence {
            true => format!("({text})"),
            false => text,
        }
    }

    fn selection(&self, m: &M) -> String {
        let join = |all: &[M], word: &str, precedence: u8| {
            let parts: Vec<String> = all.iter().map(|m| self.at_least(m, precedence)).collect();
            parts.join(&format!(" {} ", self.keyword(word)))
        };
        match m {
            M::Or(all) => join(all, "or", 1),
            M::And(all) => join(all, "and", 2),
            M::Not(inner) => format!("{} {}", self.keyword("not"), self.at_least(inner, 2)),
            M::Cmp(a, op, b) => format!("{} {op} {}", self.value(a), self.value(b)),
            M::Glob(a, pattern) => format!("{} = {}", self.value(a), quote(pattern)),
            M::Regex(a, regex) => format!("{}=~{}", self.value(a), quote(regex)),
            M::Truthy(a) => self.value(a),
        }
    }

    fn value(&self, v: &V) -> String {
        match v {
            V::Null => self.keyword("null"),
            V::Bool(b) => self.keyword(&b.to_string()),
            V::Int(n) => n.to_string(),
            V::Half(n) if *n < 0 => format!("-{}.5", -n - 1),
            V::Half(n) => format!("{n}.5"),
            V::Text(t) => quote(t),
            V::Field(t, f) => format!("{t}.{f}"),
            V::Type(t) => (*t).to_owned(),
            V::Id("") => self.keyword("id"),
            V::Id(part) => format!("{}.{part}", self.keyword("id")),
            V::Group(m) => format!("({})", self.selection(m)),
        }
    }
}

fn quote(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

/// The reference evaluator.
struct Doc<'a> {
    id: &'a str,
    doctype: &'a str,
    fields: Option<&'a Fields>,
}

impl Doc<'_> {
    fn holds(&self, m: &M) -> bool {
        match m {
            M::Or(all) => all.iter().any(|m| self.holds(m)),
            M::And(all) => all.iter().all(|m| self.holds(m)),
            M::Not(inner) => !self.holds(inner),
            M::Cmp(a, op, b) => compare(&self.value(a), op, &self.value(b)),
            M::Glob(a, pattern) => match self.value(a) {
                Value::String(text) => glob(
                    &pattern.chars().collect::<Vec<_>>(),
                    &text.chars().collect::<Vec<_>>(),
                ),
                _ => false,
            },
            M::Regex(a, regex) => match self.value(a) {
                Value::String(text) => regex::Regex::new(regex).unwrap().is_match(&text),
                _ => false,
            },
            M::Truthy(a) => {
                !matches!(self.value(a), Value::Null | Value::Bool(false))
                    && self.value(a).as_f64() != Some(0.0)
            }
        }
    }

    fn value(&self, v: &V) -> Value {
        match v {
            V::Null => Value::Null,
            V::Bool(b) => json!(b),
            V::Int(n) => json!(n),
            V::Half(n) => json!(*n as f64 + 0.5),
            V::Text(t) => json!(t),
            V::Field(t, f) if *t == self.doctype => self
                .fields
                .and_then(|fields| fields.get(*f).cloned())
                .unwrap_or(Value::Null),
            V::Field(..) => Value::Null,
            V::Type(t) => json!(self.fields.is_some() && *t == self.doctype),
            V::Id(part) => self.id_part(part),
            V::Group(m) => json!(self.holds(m)),
        }
    }

    fn id_part(&self, part: &str) -> Value {
        let pieces: Vec<&str> = self.id.split(':').collect();
        if part.is_empty() {
            return json!(self.id);
        }
        if pieces.len() < 5 || pieces[0] != "id" {
            return Value::Null;
        }
        let pair = pieces[3];
        match part {
            "namespace" => json!(pieces[1]),
            "type" => json!(pieces[2]),
            "specific" => json!(pieces[4..].join(":")),
            "user" => pair
                .strip_prefix("n=")
                .and_then(|n| n.parse::<u64>().ok())
                .map_or(Value::Null, |n| json!(n)),
            "group" => pair.strip_prefix("g=").map_or(Value::Null, |g| json!(g)),
            _ => unreachable!("generated parts only"),
        }
    }
}

fn compare(a: &Value, op: &str, b: &Value) -> bool {
    let order = match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64().partial_cmp(&y.as_f64()),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ if a == b => Some(Ordering::Equal),
        _ => None,
    };
    match op {
        "==" => order == Some(Ordering::Equal),
        "!=" => order != Some(Ordering::Equal),
        "<" => order == Some(Ordering::Less),
        "<=" => order.is_some_and(Ordering::is_le),
        ">" => order == Some(Ordering::Greater),
        ">=" => order.is_some_and(Ordering::is_ge),
        _ => unreachable!("generated operators only"),
    }
}

/// The obvious exponential-time glob: fine for the model's short patterns.
fn glob(pattern: &[char], text: &[char]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some(('*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        Some((p, rest)) => text
            .split_first()
            .is_some_and(|(c, tail)| (*p == '?' || p == c) && glob(rest, tail)),
    }
}

fn fields() -> impl Strategy<Value = Option<Fields>> {
    let one = (
        prop_oneof![Just(json!(2005)), (-1i64..=1).prop_map(|n| json!(n))],
        "[ab]{0,2}",
        any::<bool>(),
        (-1i64..=0).prop_map(|n| json!(n as f64 + 0.5)),
    )
        .prop_map(|(year, title, live, rating)| {
            let doc = json!({"year": year, "title": title, "live": live, "rating": rating,
                "tags": ["a"]});
            doc.as_object().cloned().expect("an object")
        });
    prop::option::weighted(0.9, one)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_parser_agrees_with_the_model(
        m in selection(),
        upper in any::<bool>(),
        id in prop::sample::select(&IDS[..]),
        doctype in prop::sample::select(&TYPES[..]),
        fields in fields(),
    ) {
        let text = Printer { upper }.selection(&m);
        let parsed = Selection::parse(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        let doc = Document { id, doctype, fields: fields.as_ref() };
        let model = Doc { id, doctype, fields: fields.as_ref() };
        prop_assert_eq!(parsed.matches(&doc), model.holds(&m), "{}", text);
    }
}
