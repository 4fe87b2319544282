//! Protocol buffer text format, read without the schema: a message is a list of fields in
//! order, each a scalar (kept as its token: a number, an identifier such as an enum value or
//! `true`, or a decoded string) or a nested message; lines are kept for messages. Enough for
//! XLA's autotune results, whose schema is small and stable.

use crate::tree::SyntaxError;

/// One field's value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Field {
    /// A number or identifier, as written.
    Token(String),
    /// A string, decoded.
    Str(Vec<u8>),
    /// A nested message.
    Message(Message),
}

/// A message: its fields in order (a repeated field appears once per value), and the line
/// it starts on.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Message {
    pub(crate) line: usize,
    pub(crate) fields: Vec<(String, Field)>,
}

impl Message {
    /// The values of `name`, in order.
    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Field> + 'a {
        self.fields
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v)
    }

    /// The first value of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// The nested message `name`.
    pub(crate) fn message(&self, name: &str) -> Option<&Message> {
        match self.get(name)? {
            Field::Message(m) => Some(m),
            _ => None,
        }
    }

    /// The string `name` (UTF-8).
    pub(crate) fn string(&self, name: &str) -> Option<String> {
        match self.get(name)? {
            Field::Str(bytes) => String::from_utf8(bytes.clone()).ok(),
            _ => None,
        }
    }

    /// The integer `name`.
    pub(crate) fn int(&self, name: &str) -> Option<i64> {
        match self.get(name)? {
            Field::Token(t) => t.parse().ok(),
            _ => None,
        }
    }
}

const MAX_DEPTH: usize = 64;

/// Parses a whole text-format document.
pub(crate) fn parse(text: &str) -> Result<Message, SyntaxError> {
    let mut p = Parser {
        bytes: text.as_bytes(),
        pos: 0,
        line: 1,
    };
    let message = p.fields(0, None)?;
    Ok(message)
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
    line: usize,
}

impl Parser<'_> {
    fn error(&self, what: impl Into<String>) -> SyntaxError {
        SyntaxError {
            line: self.line,
            what: what.into(),
        }
    }

    /// Skips spaces, line breaks, `#` comments and the optional `,` / `;` separators.
    fn skip(&mut self) {
        while let Some(&b) = self.bytes.get(self.pos) {
            match b {
                b'\n' => self.line += 1,
                b' ' | b'\t' | b'\r' | b',' | b';' => {}
                b'#' => {
                    while self.bytes.get(self.pos).is_some_and(|b| *b != b'\n') {
                        self.pos += 1;
                    }
                    continue;
                }
                _ => return,
            }
            self.pos += 1;
        }
    }

    /// Fields up to `close` (or the end of the text, for the top level).
    fn fields(&mut self, depth: usize, close: Option<u8>) -> Result<Message, SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.error(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        let mut message = Message {
            line: self.line,
            fields: Vec::new(),
        };
        loop {
            self.skip();
            match (self.bytes.get(self.pos), close) {
                (None, None) => return Ok(message),
                (None, Some(_)) => return Err(self.error("a message is not closed")),
                (Some(&b), Some(c)) if b == c => {
                    self.pos += 1;
                    return Ok(message);
                }
                _ => {}
            }
            let name = self.name()?;
            self.skip();
            let colon = self.bytes.get(self.pos) == Some(&b':');
            if colon {
                self.pos += 1;
                self.skip();
            }
            match self.bytes.get(self.pos) {
                Some(b'{') | Some(b'<') => {
                    let close = if self.bytes[self.pos] == b'{' {
                        b'}'
                    } else {
                        b'>'
                    };
                    self.pos += 1;
                    let nested = self.fields(depth + 1, Some(close))?;
                    message.fields.push((name, Field::Message(nested)));
                }
                Some(b'[') if colon => {
                    self.pos += 1;
                    loop {
                        self.skip();
                        if self.bytes.get(self.pos) == Some(&b']') {
                            self.pos += 1;
                            break;
                        }
                        let value = self.scalar()?;
                        message.fields.push((name.clone(), value));
                    }
                }
                _ if colon => {
                    let value = self.scalar()?;
                    message.fields.push((name, value));
                }
                _ => {
                    return Err(
                        self.error(format!("expected ':' or '{{' after the field {name:?}"))
                    );
                }
            }
        }
    }

    fn name(&mut self) -> Result<String, SyntaxError> {
        let start = self.pos;
        while self
            .bytes
            .get(self.pos)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')
        {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error("expected a field name"));
        }
        Ok(String::from_utf8_lossy(&self.bytes[start..self.pos]).into_owned())
    }

    fn scalar(&mut self) -> Result<Field, SyntaxError> {
        match self.bytes.get(self.pos) {
            Some(b'"') | Some(b'\'') => {
                // Adjacent strings are one string.
                let mut out = Vec::new();
                while let Some(&q @ (b'"' | b'\'')) = self.bytes.get(self.pos) {
                    self.string(q, &mut out)?;
                    self.skip();
                }
                Ok(Field::Str(out))
            }
            Some(_) => {
                let start = self.pos;
                while self.bytes.get(self.pos).is_some_and(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'+' | b'.')
                }) {
                    self.pos += 1;
                }
                if self.pos == start {
                    return Err(self.error("expected a value"));
                }
                Ok(Field::Token(
                    String::from_utf8_lossy(&self.bytes[start..self.pos]).into_owned(),
                ))
            }
            None => Err(self.error("the text ends where a value was expected")),
        }
    }

    fn string(&mut self, quote: u8, out: &mut Vec<u8>) -> Result<(), SyntaxError> {
        self.pos += 1;
        loop {
            let Some(&b) = self.bytes.get(self.pos) else {
                return Err(self.error("a string is not closed"));
            };
            self.pos += 1;
            match b {
                b'\n' => return Err(self.error("a line break inside a string")),
                b'\\' => self.escape(out)?,
                b if b == quote => return Ok(()),
                b => out.push(b),
            }
        }
    }

    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), SyntaxError> {
        let Some(&e) = self.bytes.get(self.pos) else {
            return Err(self.error("a string is not closed"));
        };
        self.pos += 1;
        let simple = match e {
            b'n' => Some(b'\n'),
            b't' => Some(b'\t'),
            b'r' => Some(b'\r'),
            b'a' => Some(7),
            b'b' => Some(8),
            b'f' => Some(12),
            b'v' => Some(11),
            b'\\' | b'\'' | b'"' | b'?' => Some(e),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            return Ok(());
        }
        let (radix, max) = match e {
            b'x' | b'X' => (16, 2),
            b'0'..=b'7' => {
                self.pos -= 1;
                (8, 3)
            }
            _ => return Err(self.error("an unknown escape in a string")),
        };
        let start = self.pos;
        while self.pos - start < max
            && self
                .bytes
                .get(self.pos)
                .is_some_and(|b| (*b as char).is_digit(radix))
        {
            self.pos += 1;
        }
        let digits = std::str::from_utf8(&self.bytes[start..self.pos]).unwrap_or_default();
        let value = u32::from_str_radix(digits, radix)
            .map_err(|_| self.error("an escape without digits"))?;
        out.push(u8::try_from(value).map_err(|_| self.error("an escape above 255"))?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_messages_strings_and_comments() {
        let text = "# c\nversion: 3\nresults {\n  device: \"sm_8.0 \\\"x\\\"\" 'y'\n  result < run_time { nanos: 31744 } triton: { block_m: 32, enable_tma: false } >\n}\nresults { hlo: \"\\x41\\101\\n\" }\nids: [1, 2]\n";
        let m = parse(text).expect("parses");
        assert_eq!(m.int("version"), Some(3));
        let first = m.message("results").expect("results");
        assert_eq!(first.line, 3);
        assert_eq!(first.string("device").as_deref(), Some("sm_8.0 \"x\"y"));
        let result = first.message("result").expect("result");
        assert_eq!(
            result.message("run_time").and_then(|r| r.int("nanos")),
            Some(31744)
        );
        assert_eq!(
            result.message("triton").and_then(|t| t.get("enable_tma")),
            Some(&Field::Token("false".into()))
        );
        let second = m.all("results").nth(1).expect("two");
        assert!(matches!(second, Field::Message(s) if s.string("hlo").as_deref() == Some("AA\n")));
        assert_eq!(m.all("ids").count(), 2);
    }

    #[test]
    fn damaged_text_is_refused_with_its_line() {
        for (text, line) in [
            ("a {\n b: 1\n", 3),
            ("a: \"x\n\"", 1),
            ("a 1", 1),
            ("a {\n}\n}", 3),
        ] {
            let err = parse(text).expect_err(text);
            assert_eq!(err.line, line, "{text:?}: {err}");
        }
    }
}
