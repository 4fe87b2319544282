//! A JSON document as a tree that keeps what the importers need and `serde_json` drops: the
//! order of object members (an exporter writes them back in the source's order) and the line
//! of every value (a refusal names the line of the offending item, not only syntax errors).

use std::fmt;

/// A JSON value with the line (1-based) it starts on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub(crate) line: usize,
    pub(crate) value: Json,
}

/// A JSON value; numbers keep their text (an integer stays exact, a float is told apart).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Number(String),
    Str(String),
    Array(Vec<Node>),
    /// Members in source order (a repeated name is refused at parse time).
    Object(Vec<(String, Node)>),
}

/// Deepest nesting accepted: no tool's cache file nests more than a few levels.
const MAX_DEPTH: usize = 64;

/// Why a text is not JSON, with the line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SyntaxError {
    pub(crate) line: usize,
    pub(crate) what: String,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

impl Node {
    /// The member `name` of an object.
    pub(crate) fn get(&self, name: &str) -> Option<&Node> {
        match &self.value {
            Json::Object(members) => members.iter().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }

    /// An integer that fits i64 (not a float, not a string).
    pub(crate) fn as_int(&self) -> Option<i64> {
        match &self.value {
            Json::Number(t) => t.parse().ok(),
            _ => None,
        }
    }

    /// A finite number, integer or float.
    pub(crate) fn as_f64(&self) -> Option<f64> {
        match &self.value {
            Json::Number(t) => t.parse::<f64>().ok().filter(|x| x.is_finite()),
            _ => None,
        }
    }

    /// A string.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match &self.value {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// What kind of value it is, for messages.
    pub(crate) fn kind(&self) -> &'static str {
        match &self.value {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::Str(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }
}

/// Parses a whole document (whitespace around it is allowed, nothing else).
pub(crate) fn parse(text: &str) -> Result<Node, SyntaxError> {
    let mut p = Parser {
        bytes: text.as_bytes(),
        pos: 0,
        line: 1,
    };
    p.skip_ws();
    let node = p.value(0)?;
    p.skip_ws();
    if p.pos != p.bytes.len() {
        return Err(p.error("text after the end of the document"));
    }
    Ok(node)
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

    fn skip_ws(&mut self) {
        while let Some(&b) = self.bytes.get(self.pos) {
            match b {
                b'\n' => self.line += 1,
                b' ' | b'\t' | b'\r' => {}
                _ => return,
            }
            self.pos += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.bytes.get(self.pos) == Some(&b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node, SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.error(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        let line = self.line;
        let value = match self.bytes.get(self.pos) {
            None => return Err(self.error("the document ends where a value was expected")),
            Some(b'{') => self.object(depth)?,
            Some(b'[') => self.array(depth)?,
            Some(b'"') => Json::Str(self.string()?),
            Some(b't') => self.word("true", Json::Bool(true))?,
            Some(b'f') => self.word("false", Json::Bool(false))?,
            Some(b'n') => self.word("null", Json::Null)?,
            Some(b'-' | b'0'..=b'9') => self.number()?,
            // Python's json writes these for non-finite floats; they are kept as numbers
            // that no reader takes as finite.
            Some(b'N') => self.word("NaN", Json::Number("NaN".into()))?,
            Some(b'I') => self.word("Infinity", Json::Number("Infinity".into()))?,
            Some(_) => return Err(self.error("expected a JSON value")),
        };
        Ok(Node { line, value })
    }

    fn word(&mut self, word: &str, value: Json) -> Result<Json, SyntaxError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.error("expected a JSON value"))
        }
    }

    fn number(&mut self) -> Result<Json, SyntaxError> {
        let start = self.pos;
        self.eat(b'-');
        if self.bytes[self.pos..].starts_with(b"Infinity") {
            self.pos += "Infinity".len();
            return Ok(Json::Number("-Infinity".into()));
        }
        let digits = |p: &mut Self| {
            let from = p.pos;
            while p.bytes.get(p.pos).is_some_and(u8::is_ascii_digit) {
                p.pos += 1;
            }
            p.pos > from
        };
        if !digits(self) {
            return Err(self.error("a number without digits"));
        }
        if self.eat(b'.') && !digits(self) {
            return Err(self.error("a number with no digits after its point"));
        }
        if (self.eat(b'e') || self.eat(b'E')) && {
            let _ = self.eat(b'+') || self.eat(b'-');
            !digits(self)
        } {
            return Err(self.error("a number with no digits in its exponent"));
        }
        let text = std::str::from_utf8(&self.bytes[start..self.pos]).unwrap_or_default();
        Ok(Json::Number(text.to_owned()))
    }

    fn string(&mut self) -> Result<String, SyntaxError> {
        self.pos += 1; // the opening quote
        let mut out = Vec::new();
        loop {
            let Some(&b) = self.bytes.get(self.pos) else {
                return Err(self.error("a string is not closed"));
            };
            self.pos += 1;
            match b {
                b'"' => break,
                b'\\' => self.escape(&mut out)?,
                b'\n' => return Err(self.error("a line break inside a string")),
                c if c < 0x20 => return Err(self.error("a control character inside a string")),
                c => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| self.error("a string that is not UTF-8"))
    }

    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), SyntaxError> {
        let Some(&e) = self.bytes.get(self.pos) else {
            return Err(self.error("a string is not closed"));
        };
        self.pos += 1;
        let c = match e {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let first = self.hex4()?;
                let code = if (0xd800..0xdc00).contains(&first) {
                    if !(self.eat(b'\\') && self.eat(b'u')) {
                        return Err(self.error("a lone surrogate in a \\u escape"));
                    }
                    let low = self.hex4()?;
                    if !(0xdc00..0xe000).contains(&low) {
                        return Err(self.error("a lone surrogate in a \\u escape"));
                    }
                    0x10000 + ((first - 0xd800) << 10) + (low - 0xdc00)
                } else {
                    first
                };
                char::from_u32(code)
                    .ok_or_else(|| self.error("a lone surrogate in a \\u escape"))?
            }
            _ => return Err(self.error("an unknown escape in a string")),
        };
        let mut buf = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, SyntaxError> {
        let digits = self
            .bytes
            .get(self.pos..self.pos + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| self.error("a \\u escape without four hex digits"))?;
        self.pos += 4;
        Ok(digits)
    }

    fn array(&mut self, depth: usize) -> Result<Json, SyntaxError> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.eat(b']') {
            return Ok(Json::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            if self.eat(b']') {
                return Ok(Json::Array(items));
            }
            if !self.eat(b',') {
                return Err(self.error("expected ',' or ']' in an array"));
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, SyntaxError> {
        self.pos += 1;
        let mut members: Vec<(String, Node)> = Vec::new();
        // The names seen, for the duplicate check: linear in the members (a search of the
        // list made a 70,000-member object take a minute).
        let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
        self.skip_ws();
        if self.eat(b'}') {
            return Ok(Json::Object(members));
        }
        loop {
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b'"') {
                return Err(self.error("expected a member name in quotes"));
            }
            let line = self.line;
            let name = self.string()?;
            self.skip_ws();
            if !self.eat(b':') {
                return Err(self.error("expected ':' after a member name"));
            }
            self.skip_ws();
            let value = self.value(depth + 1)?;
            if !seen.insert(name.clone()) {
                return Err(SyntaxError {
                    line,
                    what: format!("the member {name:?} appears twice in one object"),
                });
            }
            members.push((name, value));
            self.skip_ws();
            if self.eat(b'}') {
                return Ok(Json::Object(members));
            }
            if !self.eat(b',') {
                return Err(self.error("expected ',' or '}' in an object"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hardening IV, case 4: the duplicate check was quadratic (a 70,000-member object took
    /// 70 s); 300,000 members parse, and a duplicate at the very end is still found.
    #[test]
    fn a_huge_object_parses_and_its_last_duplicate_is_found() {
        let mut text = String::from("{");
        for i in 0..300_000 {
            text.push_str(&format!("\"m{i}\": {i},"));
        }
        let good = format!("{}\"end\": 0}}", text);
        let doc = parse(&good).expect("parses");
        let Json::Object(members) = &doc.value else {
            panic!("an object")
        };
        assert_eq!(members.len(), 300_001);
        let bad = format!("{}\"m7\": 0}}", text);
        let e = parse(&bad).expect_err("a duplicate");
        assert!(e.what.contains("\"m7\" appears twice"), "{}", e.what);
    }

    #[test]
    fn members_keep_their_order_and_values_their_lines() {
        let doc = parse(
            "{\n  \"b\": 1,\n  \"a\": [2.5, \"x\\u00e9\\ud83d\\ude00\"],\n  \"c\": null\n}\n",
        )
        .expect("parses");
        let Json::Object(members) = &doc.value else {
            panic!("an object")
        };
        let names: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["b", "a", "c"]);
        assert_eq!(doc.get("a").map(|n| n.line), Some(3));
        assert_eq!(doc.get("b").and_then(Node::as_int), Some(1));
        let Some(Json::Array(items)) = doc.get("a").map(|n| &n.value) else {
            panic!("an array")
        };
        assert_eq!(items[0].as_int(), None);
        assert_eq!(items[0].as_f64(), Some(2.5));
        assert_eq!(items[1].as_str(), Some("xé😀"));
    }

    #[test]
    fn bad_documents_are_refused_with_their_line() {
        for (text, line) in [
            ("{\n\"a\": 1,\n}", 3),
            ("{\"a\": 1}\n\nx", 3),
            ("[1,\n2", 2),
            ("{\"a\": 1, \"a\": 2}", 1),
            ("\"\\ud800\"", 1),
            ("{\"a\":\n01x}", 2),
            ("", 1),
        ] {
            let err = parse(text).expect_err(text);
            assert_eq!(err.line, line, "{text:?}: {err}");
        }
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(parse(&deep).expect_err("too deep").what.contains("deeper"));
    }
}
