//! Streaming reader of Vespa feed files: a JSON array of operations, or JSON lines (one operation
//! per line). It never holds more than one operation in memory, and reports malformed input with
//! the line it is on, then carries on with the next operation.
//!
//! The format is told by the first non-blank character: `[` for an array (where an operation may
//! span lines), `{` for JSON lines.

use std::io::BufRead;

use crate::operation::{self, Invalid, Operation};

/// Input that could not be read as an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// The line of the feed (1-based) where the problem is, or where the operation starts.
    pub line: u64,
    /// The byte column (1-based) on that line, when the JSON parser pinpointed the problem.
    pub column: Option<u64>,
    pub message: String,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.column {
            Some(column) => write!(f, "line {}, column {column}: {}", self.line, self.message),
            None => write!(f, "line {}: {}", self.line, self.message),
        }
    }
}

impl Malformed {
    /// Places `invalid` (positioned within an operation's own text) in the feed, given where that
    /// text starts: its first line continues the feed's line `line` from byte column `column`.
    fn in_feed(invalid: Invalid, line: u64, column: u64) -> Malformed {
        match invalid.at {
            Some((1, at)) => Malformed {
                line,
                column: Some(column.saturating_add(at - 1)),
                message: invalid.message,
            },
            Some((lines, at)) => Malformed {
                line: line.saturating_add(lines - 1),
                column: Some(at),
                message: invalid.message,
            },
            None => Malformed {
                line,
                column: None,
                message: invalid.message,
            },
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Unknown,
    Lines,
    Array,
    /// After the array's closing `]`.
    Done,
}

/// Yields operations (or what was malformed) from a feed, in input order.
pub struct FeedReader<R> {
    input: R,
    mode: Mode,
    line: u64,
    /// Byte column (1-based) of the next byte on `line`.
    column: u64,
    buffer: Vec<u8>,
    failed: bool,
    /// A read error met while peeking, reported once instead of passing for the end of input.
    read_error: Option<String>,
}

impl<R: BufRead> FeedReader<R> {
    pub fn new(input: R) -> FeedReader<R> {
        FeedReader {
            input,
            mode: Mode::Unknown,
            line: 1,
            column: 1,
            buffer: Vec::new(),
            failed: false,
            read_error: None,
        }
    }

    /// The next byte without consuming it; `None` at the end (or after a read error, which
    /// `next` then reports).
    fn peek(&mut self) -> Option<u8> {
        match self.input.fill_buf() {
            Ok(buf) => buf.first().copied(),
            Err(e) => {
                self.read_error.get_or_insert_with(|| e.to_string());
                None
            }
        }
    }

    fn bump(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.input.consume(1);
        if byte == b'\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(byte)
    }

    fn skip_blanks(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.bump();
        }
    }

    fn skip_line(&mut self) {
        while let Some(b) = self.bump() {
            if b == b'\n' {
                break;
            }
        }
    }

    fn malformed(
        &self,
        line: u64,
        message: impl Into<String>,
    ) -> Option<Result<Operation, Malformed>> {
        Some(Err(Malformed {
            line,
            column: None,
            message: message.into(),
        }))
    }

    fn next_line_operation(&mut self) -> Option<Result<Operation, Malformed>> {
        loop {
            self.buffer.clear();
            // The first line may have had blanks skipped already (while the format was sniffed).
            let (line, first_column) = (self.line, self.column);
            match self.input.read_until(b'\n', &mut self.buffer) {
                Ok(0) => return None,
                Ok(_) => (self.line, self.column) = (self.line + 1, 1),
                Err(err) => {
                    self.failed = true;
                    return self.malformed(line, format!("cannot read input: {err}"));
                }
            }
            let text = self.buffer.trim_ascii_start();
            let column = first_column + (self.buffer.len() - text.len()) as u64;
            let text = text.trim_ascii_end();
            if text.is_empty() {
                continue;
            }
            return Some(
                operation::parse(text, line)
                    .map_err(|invalid| Malformed::in_feed(invalid, line, column)),
            );
        }
    }

    /// Reads one `{…}` of an array, tracking strings so that braces inside them do not count.
    fn next_array_operation(&mut self) -> Option<Result<Operation, Malformed>> {
        loop {
            self.skip_blanks();
            let line = self.line;
            match self.peek()? {
                b',' => {
                    self.bump();
                }
                b']' => {
                    self.bump();
                    self.mode = Mode::Done;
                    return self.trailing();
                }
                b'{' => break,
                other => {
                    self.skip_line();
                    return self.malformed(
                        line,
                        format!("expected an operation object, found {:?}", other as char),
                    );
                }
            }
        }
        let (start, start_column) = (self.line, self.column);
        self.buffer.clear();
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        while let Some(byte) = self.bump() {
            self.buffer.push(byte);
            if in_string {
                match byte {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        let op = operation::parse(&self.buffer, start);
                        return Some(
                            op.map_err(|invalid| Malformed::in_feed(invalid, start, start_column)),
                        );
                    }
                }
                _ => {}
            }
        }
        self.malformed(
            start,
            "the operation starting here is not terminated before the end of the input",
        )
    }

    fn trailing(&mut self) -> Option<Result<Operation, Malformed>> {
        self.skip_blanks();
        let line = self.line;
        match self.peek() {
            None => None,
            Some(_) => {
                while self.bump().is_some() {}
                self.malformed(line, "unexpected input after the closing ']'")
            }
        }
    }
}

impl<R: BufRead> FeedReader<R> {
    fn next_item(&mut self) -> Option<Result<Operation, Malformed>> {
        if self.mode == Mode::Unknown {
            self.skip_blanks();
            match self.peek()? {
                b'[' => {
                    self.bump();
                    self.mode = Mode::Array;
                }
                _ => self.mode = Mode::Lines,
            }
        }
        match self.mode {
            Mode::Lines => self.next_line_operation(),
            Mode::Array => self.next_array_operation(),
            Mode::Done | Mode::Unknown => None,
        }
    }
}

impl<R: BufRead> Iterator for FeedReader<R> {
    type Item = Result<Operation, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let next = self.next_item();
        if next.is_none() {
            if let Some(error) = self.read_error.take() {
                self.failed = true;
                return self.malformed(self.line, format!("cannot read input: {error}"));
            }
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(input: &str) -> Vec<Result<(String, u64), Malformed>> {
        FeedReader::new(input.as_bytes())
            .map(|r| r.map(|op| (op.id.to_string(), op.line)))
            .collect()
    }

    fn ok(id: &str, line: u64) -> Result<(String, u64), Malformed> {
        Ok((id.to_string(), line))
    }

    fn bad(line: u64) -> impl Fn(&Result<(String, u64), Malformed>) -> bool {
        move |r| matches!(r, Err(m) if m.line == line)
    }

    #[test]
    fn json_lines_with_malformed_lines() {
        let input = "{\"put\":\"id:n:t::1\",\"fields\":{}}\n\n{\"put\": broken}\n{\"remove\":\"id:n:t::2\"}\n{\"put\":\"id:n:t::3\"\n{\"remove\":\"id:n:t::4\"}";
        let got = read(input);
        assert_eq!(got.len(), 5);
        assert_eq!(got[0], ok("id:n:t::1", 1));
        assert!(bad(3)(&got[1]));
        assert_eq!(got[2], ok("id:n:t::2", 4));
        assert!(bad(5)(&got[3]));
        assert_eq!(got[4], ok("id:n:t::4", 6));
    }

    #[test]
    fn arrays_spanning_lines_with_tricky_strings() {
        let input = "  [\n {\"put\": \"id:n:t::a\",\n  \"fields\": {\"s\": \"}{ ] \\\" [\"}},\n\n {\"remove\": \"id:n:t::b\"}\n]\n";
        assert_eq!(read(input), vec![ok("id:n:t::a", 2), ok("id:n:t::b", 5)]);
        assert_eq!(read("[]"), vec![]);
        assert_eq!(read(""), vec![]);
    }

    fn errors(input: &str) -> Vec<String> {
        FeedReader::new(input.as_bytes())
            .filter_map(|r| r.err().map(|m| m.to_string()))
            .collect()
    }

    /// Positions are the feed's, not those within an operation's text (which serde_json reports).
    #[test]
    fn malformed_input_is_placed_by_line_and_column_of_the_feed() {
        let lines = "{\"remove\":\"id:n:t::a\"}\n  {\"put\": broken}\n";
        assert_eq!(
            errors(lines),
            ["line 2, column 11: invalid operation: expected value"]
        );
        let array =
            "[\n{\"remove\":\"id:n:t::a\"},\n   {\"put\": \"id:n:t::b\",\n    \"fields\": [1}}\n]";
        assert_eq!(
            errors(array),
            ["line 4, column 17: invalid operation: expected `,` or `]`"]
        );
        let later = "[{\"remove\":\"id:n:t::a\"}, {\"remove\": 7}]";
        let got = errors(later);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].starts_with("line 1, column 37: "), "{got:?}");
        assert!(!got[0].contains(" at line "), "{got:?}");
        assert_eq!(
            errors("{\"remove\":\"nope\"}\n"),
            ["line 1: \"nope\" is not a document ID (id:<namespace>:<type>::<key>)"]
        );
    }

    /// A read error (here: the feed file is a directory) is reported, never taken for the end.
    #[test]
    fn read_errors_are_reported_not_taken_for_the_end() {
        let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
        let got: Vec<_> = FeedReader::new(std::io::BufReader::new(dir)).collect();
        assert_eq!(got.len(), 1, "{got:?}");
        let message = got[0].as_ref().unwrap_err().to_string();
        assert!(
            message.starts_with("line 1: cannot read input: "),
            "{message}"
        );
    }

    #[test]
    fn arrays_with_errors() {
        let got = read("[\n{\"remove\":\"id:n:t::a\"},\nnull,\n{\"remove\":\"nope\"},\n{\"remove\":\"id:n:t::b\"}\n]\nextra");
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(got[0], ok("id:n:t::a", 2));
        assert!(bad(3)(&got[1]));
        assert!(bad(4)(&got[2]));
        assert_eq!(got[3], ok("id:n:t::b", 5));
        assert!(bad(7)(&got[4]));
        let got = read("[\n{\"remove\":\"id:n:t::a\"},\n{\"remove\": \"id:n:t::b\"");
        assert!(bad(3)(&got[1]), "{got:?}");
    }
}
