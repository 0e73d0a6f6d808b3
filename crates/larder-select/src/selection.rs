//! Test-and-set conditions: the subset of Vespa's document selection language that Larder
//! evaluates against a document's stored fields.
//!
//! ```text
//! expr    := or
//! or      := and ("or" and)*
//! and     := not ("and" not)*
//! not     := "not" not | compare
//! compare := operand (("==" | "!=" | "<" | "<=" | ">" | ">=" | "=") operand)?
//! operand := "(" expr ")" | number | 'text' | "text" | true | false | null
//!          | <type>.<field> | <type> | id
//! ```
//!
//! `<type>.<field>` is the field's value (null when the document lacks it) and `<type>` alone is
//! true when the document is of that type; a bare operand is true when it is neither null, false
//! nor the number 0. `=` matches text against a glob (`*` any run, `?` one character). Keywords
//! are case-insensitive. Numbers compare as numbers, text as text; comparisons of different kinds
//! are false (except `!=`). Anything else (arithmetic, functions, field paths into structs) is a
//! 400, never a guess.
//!
//! Bounded (see `bounds`): a condition is at most `MAX_SELECTION_BYTES` long and nests
//! parentheses and `not` at most `MAX_NESTING` deep; `and`/`or` chains are flat lists, not
//! left-deep trees. So the parsed tree is at most `MAX_NESTING` levels deep, and the recursive
//! descent, the recursive evaluation (`matches`) and the recursive drop of the tree are all
//! bounded by it. The right-hand side of `=` must be a text literal: it is compiled once here
//! (`glob`), and matching is linear in the text.

use std::borrow::Cow;

use serde_json::Value;

use crate::bounds::{Depth, MAX_SELECTION_BYTES};
use crate::glob::Glob;
use crate::Document;

/// A parsed condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// True when any holds (two or more).
    Or(Vec<Condition>),
    /// True when all hold (two or more).
    And(Vec<Condition>),
    Not(Box<Condition>),
    Compare(Operand, Cmp, Operand),
    /// `operand = 'pattern'`: true when the operand is text the pattern matches.
    Glob(Operand, Glob),
    Truthy(Operand),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    Literal(Value),
    Field { doctype: String, field: String },
    DocType(String),
    Id,
    Group(Box<Condition>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

pub fn parse(text: &str) -> Result<Condition, String> {
    if text.len() > MAX_SELECTION_BYTES {
        return Err(format!(
            "condition is longer than {MAX_SELECTION_BYTES} bytes"
        ));
    }
    let tokens = tokenize(text)?;
    let mut parser = Parser {
        tokens,
        pos: 0,
        depth: Depth::default(),
    };
    let condition = parser.or()?;
    match parser.peek() {
        None => Ok(condition),
        Some(t) => Err(format!("unexpected {t:?} in condition {text:?}")),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Text(String),
    Number(Value),
    Op(&'static str),
    Open,
    Close,
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '(' || c == ')' {
            tokens.push(if c == '(' { Token::Open } else { Token::Close });
            i += 1;
        } else if c == '"' || c == '\'' {
            let (value, next) = quoted(&chars, i)?;
            tokens.push(Token::Text(value));
            i = next;
        } else if let Some(op) = ["==", "!=", "<=", ">=", "<", ">", "="]
            .into_iter()
            .find(|op| chars[i..].starts_with(&op.chars().collect::<Vec<_>>()))
        {
            tokens.push(Token::Op(op));
            i += op.len();
        } else if c.is_ascii_digit()
            || (c == '-' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let start = i;
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let number: Value = serde_json::from_str(&word)
                .ok()
                .filter(Value::is_number)
                .ok_or_else(|| format!("{word:?} is not a number"))?;
            tokens.push(Token::Number(number));
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || "_.".contains(chars[i])) {
                i += 1;
            }
            tokens.push(Token::Word(chars[start..i].iter().collect()));
        } else {
            return Err(format!("unexpected character {c:?} in condition"));
        }
    }
    Ok(tokens)
}

fn quoted(chars: &[char], start: usize) -> Result<(String, usize), String> {
    let quote = chars[start];
    let mut value = String::new();
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' if i + 1 < chars.len() => {
                value.push(match chars[i + 1] {
                    'n' => '\n',
                    't' => '\t',
                    other => other,
                });
                i += 2;
            }
            c if c == quote => return Ok((value, i + 1)),
            c => {
                value.push(c);
                i += 1;
            }
        }
    }
    Err("unterminated string in condition".into())
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    /// Levels of `(` and `not` open: the only ways the recursion goes deeper.
    depth: Depth,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn keyword(&mut self, word: &str) -> bool {
        let hit = matches!(self.peek(), Some(Token::Word(w)) if w.eq_ignore_ascii_case(word));
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn or(&mut self) -> Result<Condition, String> {
        let mut all = vec![self.and()?];
        while self.keyword("or") {
            all.push(self.and()?);
        }
        Ok(flatten(all, Condition::Or))
    }

    fn and(&mut self) -> Result<Condition, String> {
        let mut all = vec![self.not()?];
        while self.keyword("and") {
            all.push(self.not()?);
        }
        Ok(flatten(all, Condition::And))
    }

    fn not(&mut self) -> Result<Condition, String> {
        if self.keyword("not") {
            self.depth.enter("condition")?;
            let inner = self.not()?;
            self.depth.leave();
            return Ok(Condition::Not(Box::new(inner)));
        }
        let left = self.operand()?;
        let cmp = match self.peek() {
            Some(Token::Op(op)) => match *op {
                "==" => Cmp::Eq,
                "!=" => Cmp::Ne,
                "<" => Cmp::Lt,
                "<=" => Cmp::Le,
                ">" => Cmp::Gt,
                ">=" => Cmp::Ge,
                _ => return self.glob(left),
            },
            _ => return Ok(Condition::Truthy(left)),
        };
        self.pos += 1;
        Ok(Condition::Compare(left, cmp, self.operand()?))
    }

    /// `left = 'pattern'`: the pattern must be a text literal, compiled here once.
    fn glob(&mut self, left: Operand) -> Result<Condition, String> {
        self.pos += 1;
        match self.tokens.get(self.pos) {
            Some(Token::Text(pattern)) => {
                let glob = Glob::compile(pattern)?;
                self.pos += 1;
                Ok(Condition::Glob(left, glob))
            }
            _ => Err("the right-hand side of '=' must be a quoted glob pattern".into()),
        }
    }

    fn operand(&mut self) -> Result<Operand, String> {
        let token = self
            .tokens
            .get(self.pos)
            .cloned()
            .ok_or("condition ends too early")?;
        self.pos += 1;
        Ok(match token {
            Token::Open => {
                self.depth.enter("condition")?;
                let inner = self.or()?;
                if self.peek() != Some(&Token::Close) {
                    return Err("missing ')' in condition".into());
                }
                self.depth.leave();
                self.pos += 1;
                Operand::Group(Box::new(inner))
            }
            Token::Text(t) => Operand::Literal(Value::String(t)),
            Token::Number(n) => Operand::Literal(n),
            Token::Word(w) => word_operand(&w)?,
            other => return Err(format!("unexpected {other:?} in condition")),
        })
    }
}

/// One condition stays itself; two or more become one flat `and`/`or`.
fn flatten(mut all: Vec<Condition>, combine: fn(Vec<Condition>) -> Condition) -> Condition {
    match all.len() {
        1 => all.pop().expect("one condition"),
        _ => combine(all),
    }
}

fn word_operand(word: &str) -> Result<Operand, String> {
    match word.to_ascii_lowercase().as_str() {
        "true" => return Ok(Operand::Literal(Value::Bool(true))),
        "false" => return Ok(Operand::Literal(Value::Bool(false))),
        "null" => return Ok(Operand::Literal(Value::Null)),
        "id" => return Ok(Operand::Id),
        _ => {}
    }
    match word.split_once('.') {
        None => Ok(Operand::DocType(word.to_owned())),
        Some((doctype, field))
            if !doctype.is_empty() && !field.is_empty() && !field.contains('.') =>
        {
            Ok(Operand::Field {
                doctype: doctype.to_owned(),
                field: field.to_owned(),
            })
        }
        _ => Err(format!(
            "{word:?}: only <type>.<field> references are supported in conditions"
        )),
    }
}

impl Condition {
    /// Whether the condition holds for `subject`. Recursive, and bounded: the tree is at most
    /// `MAX_NESTING` levels deep (see the module's docs).
    pub fn matches(&self, subject: &Document) -> bool {
        match self {
            Condition::Or(all) => all.iter().any(|c| c.matches(subject)),
            Condition::And(all) => all.iter().all(|c| c.matches(subject)),
            Condition::Not(a) => !a.matches(subject),
            Condition::Truthy(operand) => truthy(&operand.value(subject)),
            Condition::Compare(a, cmp, b) => compare(&a.value(subject), *cmp, &b.value(subject)),
            Condition::Glob(a, glob) => match a.value(subject).as_ref() {
                Value::String(text) => glob.matches(text),
                _ => false,
            },
        }
    }
}

impl Operand {
    /// The operand's value; a field is borrowed, not copied (it may be megabytes of text).
    fn value<'a>(&'a self, subject: &'a Document) -> Cow<'a, Value> {
        match self {
            Operand::Literal(v) => Cow::Borrowed(v),
            Operand::Id => Cow::Owned(Value::String(subject.id.to_owned())),
            Operand::DocType(t) => Cow::Owned(Value::Bool(
                subject.fields.is_some() && t == subject.doctype,
            )),
            Operand::Field { doctype, field } if doctype == subject.doctype => {
                match subject.fields.and_then(|f| f.get(field)) {
                    Some(value) => Cow::Borrowed(value),
                    None => Cow::Owned(Value::Null),
                }
            }
            Operand::Field { .. } => Cow::Owned(Value::Null),
            Operand::Group(inner) => Cow::Owned(Value::Bool(inner.matches(subject))),
        }
    }
}

fn truthy(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => false,
        Value::Number(n) => n.as_f64() != Some(0.0),
        _ => true,
    }
}

fn compare(a: &Value, cmp: Cmp, b: &Value) -> bool {
    use std::cmp::Ordering;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(condition: &str, fields: Option<Value>, expected: bool) {
        let fields = fields.map(|f| f.as_object().unwrap().clone());
        let subject = Document {
            id: "id:ns:music::1",
            doctype: "music",
            fields: fields.as_ref(),
        };
        let parsed = parse(condition).unwrap_or_else(|e| panic!("{condition}: {e}"));
        assert_eq!(parsed.matches(&subject), expected, "{condition}");
    }

    #[test]
    fn evaluates_the_subset() {
        let doc =
            || Some(json!({"year": 2005, "title": "Hello World", "rating": 4.5, "live": true}));
        check("music.year > 2000", doc(), true);
        check(
            "music.year == 2005 and music.title == \"Hello World\"",
            doc(),
            true,
        );
        check("music.year < 2000 or music.rating >= 4.5", doc(), true);
        check("NOT (music.year <= 2005)", doc(), false);
        check("music.title = 'Hello*'", doc(), true);
        check("music.title = 'H?llo W*d'", doc(), true);
        check("music.title = 'Bye*'", doc(), false);
        check("music.missing", doc(), false);
        check("music.missing == null", doc(), true);
        check("music.title != 'x'", doc(), true);
        check("music.live", doc(), true);
        check("music", doc(), true);
        check("books", doc(), false);
        check("books.year > 1", doc(), false);
        check("id == 'id:ns:music::1'", doc(), true);
        check("music.year > 2000", None, false);
        check("not music", None, true);
        check("music.year > 'text'", doc(), false);
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        for bad in [
            "",
            "music.year >",
            "(music.year > 1",
            "music.a.b == 1",
            "music.year + 1 > 2",
            "'unterminated",
            "music.year > 1 )",
            "now() > 1",
            "music.title = music.other",
            "music.title = 3",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nesting_is_bounded_and_long_chains_stay_flat() {
        use crate::bounds::MAX_NESTING;
        let nested = |n: usize| format!("{}music.x{}", "(".repeat(n), ")".repeat(n));
        assert!(parse(&nested(MAX_NESTING)).is_ok());
        let err = parse(&nested(MAX_NESTING + 1)).unwrap_err();
        assert!(err.contains("nests deeper"), "{err}");
        assert!(parse(&nested(100_000)).is_err());
        assert!(parse(&format!("{}music", "not ".repeat(MAX_NESTING))).is_ok());
        assert!(parse(&format!("{}music", "not ".repeat(MAX_NESTING + 1))).is_err());
        assert!(parse(&format!("{}music", "not ".repeat(100_000))).is_err());
        // 1,000 `and`s: one flat list, evaluated and dropped without deep recursion.
        let chain = vec!["music.x"; 1_000].join(" and ");
        match parse(&chain).unwrap() {
            Condition::And(all) => assert_eq!(all.len(), 1_000),
            other => panic!("not flat: {other:?}"),
        }
        assert!(parse(&"music.x or ".repeat(2_000)).is_err(), "too long");
    }

    /// How deep a parsed condition nests: what bounds evaluation's and drop's recursion.
    fn depth(condition: &Condition) -> usize {
        let operand = |o: &Operand| match o {
            Operand::Group(inner) => 1 + depth(inner),
            _ => 0,
        };
        match condition {
            Condition::Or(all) | Condition::And(all) => all.iter().map(depth).max().unwrap_or(0),
            Condition::Not(inner) => 1 + depth(inner),
            Condition::Compare(a, _, b) => operand(a).max(operand(b)),
            Condition::Glob(a, _) | Condition::Truthy(a) => operand(a),
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_never_nests_past_the_limit(
            text in "([()]|not |and |or |music\\.x|music| == | = |'a\\*'|1| ){0,400}"
        ) {
            if let Ok(condition) = parse(&text) {
                proptest::prop_assert!(depth(&condition) <= crate::bounds::MAX_NESTING);
                let fields = json!({"x": "abc"}).as_object().unwrap().clone();
                let subject = Document { id: "id:ns:music::1", doctype: "music", fields: Some(&fields) };
                let _ = condition.matches(&subject);
            }
        }

        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }
    }

    #[test]
    fn parsing_time_grows_linearly() {
        // The longest condition accepted, of the worst shapes: parsing must not take longer than
        // a small multiple of a condition a sixteenth its size (a generous linearity check).
        use crate::bounds::MAX_SELECTION_BYTES;
        for unit in [
            "(",
            "not ",
            "music.x and ",
            "'a*' = 'b?' or ",
            r#""\\"#,
            "-1 ",
        ] {
            // The fastest of a few runs: other tests share the cores.
            let timed = |bytes: usize| {
                let text = unit.repeat(bytes / unit.len());
                (0..5)
                    .map(|_| {
                        let started = std::time::Instant::now();
                        let _ = parse(&text);
                        started.elapsed()
                    })
                    .min()
                    .expect("five runs")
            };
            let (small, large) = (timed(MAX_SELECTION_BYTES / 16), timed(MAX_SELECTION_BYTES));
            assert!(
                large < small * 64 + std::time::Duration::from_millis(100),
                "{unit:?}: {small:?} then {large:?}"
            );
        }
    }
}
