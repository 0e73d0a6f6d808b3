//! Recursive descent over the tokens (`lexer`), one function per rule of the grammar (see the
//! crate's docs). Every error carries the byte offset of the token where it was found.
//!
//! Bounded (see `bounds`): only `(` and `not` make the descent go deeper, and each counts
//! against `MAX_NESTING`; `and`/`or` chains are loops that build flat lists. The right-hand side
//! of `=` and `=~` must be a text literal, compiled here once (at most `MAX_REGEXES` regular
//! expressions per selection).

use serde_json::Value;

use crate::bounds::{Depth, MAX_REGEXES, MAX_SELECTION_BYTES};
use crate::docid::IdPart;
use crate::expr::{Cmp, Expr, Operand};
use crate::glob::Glob;
use crate::lexer::{tokenize, Kind, Op, Token};
use crate::pattern::Pattern;
use crate::Error;

pub(crate) fn parse(text: &str) -> Result<Expr, Error> {
    if text.len() > MAX_SELECTION_BYTES {
        return Err(Error::new(
            MAX_SELECTION_BYTES,
            format!("selection is longer than {MAX_SELECTION_BYTES} bytes"),
        ));
    }
    let mut parser = Parser {
        tokens: tokenize(text)?,
        pos: 0,
        end: text.len(),
        depth: Depth::default(),
        regexes: 0,
    };
    let expr = parser.or()?;
    match parser.tokens.get(parser.pos) {
        None => Ok(expr),
        Some(t) => Err(Error::new(
            t.at,
            format!("unexpected {}", describe(&t.kind)),
        )),
    }
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    /// The selection's length: where "ends too early" points.
    end: usize,
    /// Levels of `(` and `not` open: the only ways the recursion goes deeper.
    depth: Depth,
    regexes: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Kind> {
        self.tokens.get(self.pos).map(|t| &t.kind)
    }

    /// Where the next token starts (or the end of the selection).
    fn here(&self) -> usize {
        self.tokens.get(self.pos).map_or(self.end, |t| t.at)
    }

    fn keyword(&mut self, word: &str) -> bool {
        let hit = matches!(self.peek(), Some(Kind::Word(w)) if w.eq_ignore_ascii_case(word));
        self.pos += usize::from(hit);
        hit
    }

    /// One level deeper, opened by the token at `at`.
    fn enter(&mut self, at: usize) -> Result<(), Error> {
        self.depth
            .enter("selection")
            .map_err(|message| Error::new(at, message))
    }

    fn or(&mut self) -> Result<Expr, Error> {
        let mut all = vec![self.and()?];
        while self.keyword("or") {
            all.push(self.and()?);
        }
        Ok(flatten(all, Expr::Or))
    }

    fn and(&mut self) -> Result<Expr, Error> {
        let mut all = vec![self.not()?];
        while self.keyword("and") {
            all.push(self.not()?);
        }
        Ok(flatten(all, Expr::And))
    }

    fn not(&mut self) -> Result<Expr, Error> {
        let at = self.here();
        if !self.keyword("not") {
            return self.comparison();
        }
        self.enter(at)?;
        let inner = self.not()?;
        self.depth.leave();
        Ok(Expr::Not(Box::new(inner)))
    }

    fn comparison(&mut self) -> Result<Expr, Error> {
        let left = self.operand()?;
        let op = match self.peek() {
            Some(Kind::Op(op)) => *op,
            _ => return Ok(Expr::Truthy(left)),
        };
        self.pos += 1;
        let cmp = match op {
            Op::Eq => Cmp::Eq,
            Op::Ne => Cmp::Ne,
            Op::Lt => Cmp::Lt,
            Op::Le => Cmp::Le,
            Op::Gt => Cmp::Gt,
            Op::Ge => Cmp::Ge,
            Op::Glob => return self.glob(left),
            Op::Regex => return self.regex(left),
        };
        Ok(Expr::Compare(left, cmp, self.operand()?))
    }

    /// The text literal a glob or a regex needs on the right, and where it starts.
    fn pattern(&mut self, op: &str) -> Result<(String, usize), Error> {
        let at = self.here();
        match self.peek() {
            Some(Kind::Text(pattern)) => {
                let pattern = pattern.clone();
                self.pos += 1;
                Ok((pattern, at))
            }
            _ => Err(Error::new(
                at,
                format!("the right-hand side of '{op}' must be a quoted pattern"),
            )),
        }
    }

    fn glob(&mut self, left: Operand) -> Result<Expr, Error> {
        let (pattern, at) = self.pattern("=")?;
        let glob = Glob::compile(&pattern).map_err(|message| Error::new(at, message))?;
        Ok(Expr::Glob(left, glob))
    }

    fn regex(&mut self, left: Operand) -> Result<Expr, Error> {
        let (pattern, at) = self.pattern("=~")?;
        self.regexes += 1;
        if self.regexes > MAX_REGEXES {
            let message = format!("a selection has at most {MAX_REGEXES} regular expressions");
            return Err(Error::new(at, message));
        }
        let regex = Pattern::compile(&pattern).map_err(|message| Error::new(at, message))?;
        Ok(Expr::Regex(left, regex))
    }

    fn operand(&mut self) -> Result<Operand, Error> {
        let Some(token) = self.tokens.get(self.pos).cloned() else {
            return Err(Error::new(self.end, "selection ends too early"));
        };
        self.pos += 1;
        Ok(match token.kind {
            Kind::Open => self.group(token.at)?,
            Kind::Text(t) => Operand::Literal(Value::String(t)),
            Kind::Number(n) => Operand::Literal(n),
            Kind::Word(w) => word_operand(&w).map_err(|message| Error::new(token.at, message))?,
            other => {
                return Err(Error::new(
                    token.at,
                    format!("unexpected {}", describe(&other)),
                ));
            }
        })
    }

    /// `( selection )`, the `(` already read at `open`.
    fn group(&mut self, open: usize) -> Result<Operand, Error> {
        self.enter(open)?;
        let inner = self.or()?;
        if self.peek() != Some(&Kind::Close) {
            let message = format!("missing ')' for the '(' at byte {open}");
            return Err(Error::new(self.here(), message));
        }
        self.depth.leave();
        self.pos += 1;
        Ok(Operand::Group(Box::new(inner)))
    }
}

/// One expression stays itself; two or more become one flat `and`/`or`.
fn flatten(mut all: Vec<Expr>, combine: fn(Vec<Expr>) -> Expr) -> Expr {
    match all.len() {
        1 => all.pop().expect("one expression"),
        _ => combine(all),
    }
}

fn word_operand(word: &str) -> Result<Operand, String> {
    match word.to_ascii_lowercase().as_str() {
        "true" => return Ok(Operand::Literal(Value::Bool(true))),
        "false" => return Ok(Operand::Literal(Value::Bool(false))),
        "null" => return Ok(Operand::Literal(Value::Null)),
        "id" => return Ok(Operand::Id(IdPart::Whole)),
        "and" | "or" | "not" => return Err(format!("unexpected '{word}'")),
        _ => {}
    }
    match word.split_once('.') {
        None => Ok(Operand::DocType(word.to_owned())),
        Some((id, part)) if id.eq_ignore_ascii_case("id") => IdPart::named(part)
            .map(Operand::Id)
            .ok_or_else(|| {
                format!("{word:?}: the ID's parts are id.namespace, id.type, id.user, id.group and id.specific")
            }),
        Some((doctype, field)) if !doctype.is_empty() && !field.is_empty() && !field.contains('.') => {
            Ok(Operand::Field {
                doctype: doctype.to_owned(),
                field: field.to_owned(),
            })
        }
        _ => Err(format!("{word:?}: only <type>.<field> references are supported")),
    }
}

fn describe(kind: &Kind) -> String {
    match kind {
        Kind::Word(w) => format!("{w:?}"),
        Kind::Text(t) => format!("string {t:?}"),
        Kind::Number(n) => format!("number {n}"),
        Kind::Op(op) => format!("operator '{}'", op.symbol()),
        Kind::Open => "'('".into(),
        Kind::Close => "')'".into(),
    }
}
