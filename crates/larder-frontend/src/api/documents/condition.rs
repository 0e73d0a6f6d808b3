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

use serde_json::Value;

use super::update::Fields;

/// A parsed condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    Or(Box<Condition>, Box<Condition>),
    And(Box<Condition>, Box<Condition>),
    Not(Box<Condition>),
    Compare(Operand, Cmp, Operand),
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
    Glob,
}

/// What a condition is evaluated against: the document if it exists.
pub struct Subject<'a> {
    pub id: &'a str,
    pub doctype: &'a str,
    pub fields: Option<&'a Fields>,
}

pub fn parse(text: &str) -> Result<Condition, String> {
    let tokens = tokenize(text)?;
    let mut parser = Parser { tokens, pos: 0 };
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
        let mut left = self.and()?;
        while self.keyword("or") {
            left = Condition::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Condition, String> {
        let mut left = self.not()?;
        while self.keyword("and") {
            left = Condition::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Condition, String> {
        if self.keyword("not") {
            return Ok(Condition::Not(Box::new(self.not()?)));
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
                _ => Cmp::Glob,
            },
            _ => return Ok(Condition::Truthy(left)),
        };
        self.pos += 1;
        Ok(Condition::Compare(left, cmp, self.operand()?))
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
                let inner = self.or()?;
                if self.peek() != Some(&Token::Close) {
                    return Err("missing ')' in condition".into());
                }
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
    /// Whether the condition holds for `subject`.
    pub fn matches(&self, subject: &Subject) -> bool {
        match self {
            Condition::Or(a, b) => a.matches(subject) || b.matches(subject),
            Condition::And(a, b) => a.matches(subject) && b.matches(subject),
            Condition::Not(a) => !a.matches(subject),
            Condition::Truthy(operand) => truthy(&operand.value(subject)),
            Condition::Compare(a, cmp, b) => compare(&a.value(subject), *cmp, &b.value(subject)),
        }
    }
}

impl Operand {
    fn value(&self, subject: &Subject) -> Value {
        match self {
            Operand::Literal(v) => v.clone(),
            Operand::Id => Value::String(subject.id.to_owned()),
            Operand::DocType(t) => Value::Bool(subject.fields.is_some() && t == subject.doctype),
            Operand::Field { doctype, field } if doctype == subject.doctype => subject
                .fields
                .and_then(|f| f.get(field))
                .cloned()
                .unwrap_or(Value::Null),
            Operand::Field { .. } => Value::Null,
            Operand::Group(inner) => Value::Bool(inner.matches(subject)),
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
        Cmp::Glob => match (a, b) {
            (Value::String(text), Value::String(pattern)) => glob(pattern, text),
            _ => order == Some(Ordering::Equal),
        },
    }
}

/// `*` matches any run of characters, `?` any one.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(condition: &str, fields: Option<Value>, expected: bool) {
        let fields = fields.map(|f| f.as_object().unwrap().clone());
        let subject = Subject {
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
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
