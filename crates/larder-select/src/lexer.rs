//! Splits a selection into tokens, each with the byte offset where it starts (errors carry it).
//! One pass over the text, no backtracking: linear in its length.

use serde_json::Value;

use crate::Error;

/// A token and where it starts in the selection, in bytes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub kind: Kind,
    pub at: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// A name: a keyword, a document type, `<type>.<field>` or `id.<part>`.
    Word(String),
    /// A quoted string, escapes resolved.
    Text(String),
    Number(Value),
    Op(Op),
    Open,
    Close,
}

/// The comparison operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `=`: glob match.
    Glob,
    /// `=~`: regular expression match.
    Regex,
}

impl Op {
    pub(crate) fn symbol(self) -> &'static str {
        OPERATORS
            .iter()
            .find(|(_, op)| *op == self)
            .map(|(symbol, _)| *symbol)
            .expect("every operator is in the table")
    }
}

/// Longest first, so that `<=` is never read as `<` then `=`.
const OPERATORS: [(&str, Op); 8] = [
    ("==", Op::Eq),
    ("!=", Op::Ne),
    ("=~", Op::Regex),
    ("<=", Op::Le),
    (">=", Op::Ge),
    ("<", Op::Lt),
    (">", Op::Gt),
    ("=", Op::Glob),
];

pub(crate) fn tokenize(text: &str) -> Result<Vec<Token>, Error> {
    let mut tokens = Vec::new();
    let mut at = 0;
    while let Some(c) = text[at..].chars().next() {
        let rest = &text[at..];
        let (kind, len) = if c.is_whitespace() {
            at += c.len_utf8();
            continue;
        } else if c == '(' {
            (Kind::Open, 1)
        } else if c == ')' {
            (Kind::Close, 1)
        } else if c == '"' || c == '\'' {
            quoted(rest, at)?
        } else if let Some((op, kind)) = OPERATORS.iter().find(|(op, _)| rest.starts_with(op)) {
            (Kind::Op(*kind), op.len())
        } else if c.is_ascii_digit()
            || (c == '-' && rest[1..].starts_with(|d: char| d.is_ascii_digit()))
        {
            number(rest, at)?
        } else if c.is_alphabetic() || c == '_' {
            let len = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
                .unwrap_or(rest.len());
            (Kind::Word(rest[..len].to_owned()), len)
        } else {
            return Err(Error::new(at, format!("unexpected character {c:?}")));
        };
        tokens.push(Token { kind, at });
        at += len;
    }
    Ok(tokens)
}

/// A number: digits, letters and dots (so `1.5e3` is one token), and a sign after an exponent's
/// `e`; serde_json decides whether it is a number.
fn number(rest: &str, at: usize) -> Result<(Kind, usize), Error> {
    let bytes = rest.as_bytes();
    let mut len = 1;
    while let Some(&b) = bytes.get(len) {
        let exponent_sign = (b == b'-' || b == b'+') && matches!(bytes[len - 1], b'e' | b'E');
        if !(b.is_ascii_alphanumeric() || b == b'.' || exponent_sign) {
            break;
        }
        len += 1;
    }
    let word = &rest[..len];
    serde_json::from_str::<Value>(word)
        .ok()
        .filter(Value::is_number)
        .map(|n| (Kind::Number(n), len))
        .ok_or_else(|| Error::new(at, format!("{word:?} is not a number")))
}

/// A string in `'` or `"`: `\n` and `\t` are a newline and a tab, `\` before anything else is
/// that character.
fn quoted(rest: &str, at: usize) -> Result<(Kind, usize), Error> {
    let mut chars = rest.char_indices();
    let (_, quote) = chars.next().expect("a quoted string starts with its quote");
    let mut value = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, 't')) => value.push('\t'),
                Some((_, other)) => value.push(other),
                None => break,
            },
            c if c == quote => return Ok((Kind::Text(value), i + 1)),
            c => value.push(c),
        }
    }
    Err(Error::new(at, "unterminated string"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<(Kind, usize)> {
        tokenize(text)
            .unwrap()
            .into_iter()
            .map(|t| (t.kind, t.at))
            .collect()
    }

    #[test]
    fn tokens_and_their_byte_offsets() {
        use Kind::*;
        assert_eq!(
            kinds("é.x=~'a\\'b' <=-1.5e-3)"),
            vec![
                (Word("é.x".into()), 0),
                (Op(super::Op::Regex), 4),
                (Text("a'b".into()), 6),
                (Op(super::Op::Le), 13),
                (Number(serde_json::json!(-0.0015)), 15),
                (Close, 22),
            ]
        );
    }

    #[test]
    fn errors_say_where() {
        assert_eq!(tokenize("a == 'x").unwrap_err().position(), 5);
        assert_eq!(tokenize("a == 0x1").unwrap_err().position(), 5);
        assert_eq!(tokenize("ab # c").unwrap_err().position(), 3);
        assert_eq!(tokenize("'é' $").unwrap_err().position(), 5);
    }
}
