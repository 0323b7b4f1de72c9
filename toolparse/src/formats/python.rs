//! Python literals and calls, as Llama 4 writes its tool calls: parsing a
//! complete `name(key=value, …)` into a name and JSON arguments, and finding
//! where a call ends while its text streams in.
//!
//! ```text
//! get_weather(city="Paris", unit='c')
//! search(q="café \"best\"", filters={"max": 3, "tags": ["a", "b"]}, strict=True, page=None)
//! ```
//!
//! Values are Python literals: strings in `'`/`"`/triple quotes with their
//! escapes (`r` and `u` prefixes, adjacent strings joined), numbers (`_`,
//! hex/octal/binary, floats), `True`/`False`/`None` (and JSON's
//! `true`/`false`/`null`), lists, tuples (as arrays) and dicts. A literal
//! that has no JSON value (bytes, complex, `1e999`, sets, f-strings) is a
//! [`Bad::Value`]; text that is not this syntax is a [`Bad::Syntax`].

use super::cursor::Cursor;
use serde_json::{Map, Number, Value};

/// Deepest nesting accepted in a value.
const MAX_DEPTH: usize = 128;

/// Length of the Python identifier at the start of `s`.
pub(crate) fn ident_len(s: &str) -> usize {
    let mut n = 0;
    for (i, c) in s.char_indices() {
        let ok =
            if i == 0 { c.is_alphabetic() || c == '_' } else { c.is_alphanumeric() || c == '_' };
        if !ok {
            break;
        }
        n = i + c.len_utf8();
    }
    n
}

/// Length of the whitespace (and line continuations) at the start of `s`.
pub(crate) fn py_ws(s: &str) -> usize {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'\\' if matches!(b.get(i + 1), Some(b'\n')) => i += 2,
            _ => break,
        }
    }
    i
}

/// Where a call's `)` is, found incrementally over Python tokens.
#[derive(Debug)]
pub(crate) struct PyScan {
    pos: usize,
    depth: usize,
    /// Inside a string: its quote and whether it is triple-quoted.
    quote: Option<(u8, bool)>,
    esc: bool,
}

pub(crate) enum PyEnd {
    /// The call ends just before this offset.
    Done(usize),
    Partial,
    /// The brackets do not match at this offset.
    Invalid(usize),
}

impl PyScan {
    /// A scan that starts just after the call's `(`.
    pub(crate) fn new(pos: usize) -> PyScan {
        PyScan { pos, depth: 1, quote: None, esc: false }
    }

    pub(crate) fn scan(&mut self, text: &str) -> PyEnd {
        let b = text.as_bytes();
        crate::scan::scanned(b.len().saturating_sub(self.pos));
        while self.pos < b.len() {
            let c = b[self.pos];
            if let Some((q, triple)) = self.quote {
                if self.esc {
                    self.esc = false;
                } else if c == b'\\' {
                    self.esc = true;
                } else if c == q {
                    if !triple {
                        self.quote = None;
                    } else if self.pos + 3 > b.len() {
                        return PyEnd::Partial;
                    } else if b[self.pos + 1] == q && b[self.pos + 2] == q {
                        self.quote = None;
                        self.pos += 3;
                        continue;
                    }
                } else if c == b'\n' && !triple {
                    return PyEnd::Invalid(self.pos);
                }
                self.pos += 1;
                continue;
            }
            match c {
                b'\'' | b'"' => {
                    if self.pos + 3 > b.len() {
                        return PyEnd::Partial;
                    }
                    if b[self.pos + 1] == c && b[self.pos + 2] == c {
                        self.quote = Some((c, true));
                        self.pos += 3;
                        continue;
                    }
                    self.quote = Some((c, false));
                }
                b'(' | b'[' | b'{' => {
                    self.depth += 1;
                    if self.depth > MAX_DEPTH {
                        return PyEnd::Invalid(self.pos);
                    }
                }
                b')' | b']' | b'}' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        if c != b')' {
                            return PyEnd::Invalid(self.pos);
                        }
                        return PyEnd::Done(self.pos + 1);
                    }
                }
                _ => {}
            }
            self.pos += 1;
        }
        PyEnd::Partial
    }
}

/// Why a call did not parse.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Bad {
    /// Not Python call syntax.
    Syntax,
    /// Valid syntax, but a literal with no JSON value.
    Value,
}

/// Parses one complete `name(key=value, …)` into a name and arguments text.
pub(crate) fn parse_call(text: &str) -> Result<(String, String), Bad> {
    let mut p = Py { c: Cursor::new(text, py_ws) };
    p.c.ws();
    let mut name = String::new();
    loop {
        name.push_str(p.c.word(ident_len).ok_or(Bad::Syntax)?);
        if p.c.eat(".") {
            name.push('.');
            continue;
        }
        break;
    }
    p.c.ws();
    if !p.c.eat("(") {
        return Err(Bad::Syntax);
    }
    let mut args = Map::new();
    let mut value_error = false;
    loop {
        p.c.ws();
        if p.c.eat(")") {
            break;
        }
        let key = p.c.word(ident_len).ok_or(Bad::Syntax)?.to_owned();
        p.c.ws();
        if !p.c.eat("=") {
            return Err(Bad::Syntax);
        }
        p.c.ws();
        match p.value(0) {
            Ok(v) => {
                if args.insert(key, v).is_some() {
                    return Err(Bad::Syntax);
                }
            }
            Err(Bad::Value) => value_error = true,
            Err(Bad::Syntax) => return Err(Bad::Syntax),
        }
        p.c.ws();
        if p.c.eat(",") {
            continue;
        }
        p.c.ws();
        if p.c.eat(")") {
            break;
        }
        return Err(Bad::Syntax);
    }
    p.c.ws();
    if !p.c.done() {
        return Err(Bad::Syntax);
    }
    if value_error {
        return Err(Bad::Value);
    }
    Ok((name, Value::Object(args).to_string()))
}

/// A parser for Python literals over complete text.
struct Py<'a> {
    c: Cursor<'a>,
}

impl Py<'_> {
    /// A literal. A value error is reported only once the literal's syntax
    /// is known to be whole, so the caller can go on.
    fn value(&mut self, depth: usize) -> Result<Value, Bad> {
        if depth > MAX_DEPTH {
            return Err(Bad::Syntax);
        }
        match self.c.peek() {
            Some(b'[') => {
                self.c.skip(1);
                self.seq(b']', depth).map(|(v, _)| Value::Array(v))
            }
            Some(b'(') => {
                self.c.skip(1);
                let (mut v, tuple) = self.seq(b')', depth)?;
                if !tuple && v.len() == 1 {
                    return Ok(v.remove(0));
                }
                Ok(Value::Array(v))
            }
            Some(b'{') => {
                self.c.skip(1);
                self.dict(depth)
            }
            Some(b'-' | b'+') => {
                let neg = self.c.peek() == Some(b'-');
                self.c.skip(1);
                self.c.ws();
                let v = match self.c.peek() {
                    Some(b'0'..=b'9' | b'.') => self.number()?,
                    Some(b'-' | b'+') => self.value(depth + 1)?,
                    _ => return Err(Bad::Syntax),
                };
                if !neg {
                    return Ok(v);
                }
                negate(v)
            }
            Some(b'0'..=b'9' | b'.') => self.number(),
            Some(b'\'' | b'"') => self.strings(),
            Some(_) => {
                let n = ident_len(self.c.rest());
                if n == 0 {
                    return Err(Bad::Syntax);
                }
                let word = &self.c.rest()[..n];
                let after = self.c.rest().as_bytes().get(n).copied();
                if matches!(after, Some(b'\'' | b'"')) && n <= 2 {
                    return self.strings();
                }
                let v = match word {
                    "True" | "true" => Value::Bool(true),
                    "False" | "false" => Value::Bool(false),
                    "None" | "null" => Value::Null,
                    _ => return Err(Bad::Syntax),
                };
                self.c.skip(n);
                Ok(v)
            }
            None => Err(Bad::Syntax),
        }
    }

    /// Elements up to `close`; whether a comma was seen (a tuple).
    fn seq(&mut self, close: u8, depth: usize) -> Result<(Vec<Value>, bool), Bad> {
        let mut out = Vec::new();
        let mut comma = false;
        let mut bad = false;
        loop {
            self.c.ws();
            if self.c.peek() == Some(close) {
                self.c.skip(1);
                break;
            }
            match self.value(depth + 1) {
                Ok(v) => out.push(v),
                Err(Bad::Value) => bad = true,
                Err(e) => return Err(e),
            }
            self.c.ws();
            if self.c.eat(",") {
                comma = true;
                continue;
            }
            if self.c.peek() == Some(close) {
                self.c.skip(1);
                break;
            }
            return Err(Bad::Syntax);
        }
        if bad {
            return Err(Bad::Value);
        }
        Ok((out, comma))
    }

    fn dict(&mut self, depth: usize) -> Result<Value, Bad> {
        let mut out = Map::new();
        let mut bad = false;
        loop {
            self.c.ws();
            if self.c.eat("}") {
                break;
            }
            let key = match self.value(depth + 1) {
                Ok(Value::String(s)) => Some(s),
                Ok(Value::Number(n)) => Some(n.to_string()),
                Ok(Value::Bool(b)) => Some(b.to_string()),
                Ok(Value::Null) => Some("null".to_owned()),
                // Lists and dicts are not hashable.
                Ok(_) => return Err(Bad::Syntax),
                Err(Bad::Value) => None,
                Err(e) => return Err(e),
            };
            self.c.ws();
            if !self.c.eat(":") {
                // A set, or not a literal at all.
                return Err(Bad::Syntax);
            }
            self.c.ws();
            match (key, self.value(depth + 1)) {
                (Some(k), Ok(v)) => {
                    out.insert(k, v);
                }
                (_, Err(Bad::Syntax)) => return Err(Bad::Syntax),
                _ => bad = true,
            }
            self.c.ws();
            if self.c.eat(",") {
                continue;
            }
            if self.c.eat("}") {
                break;
            }
            return Err(Bad::Syntax);
        }
        if bad {
            return Err(Bad::Value);
        }
        Ok(Value::Object(out))
    }

    /// One or more adjacent string literals, joined.
    fn strings(&mut self) -> Result<Value, Bad> {
        let mut out = String::new();
        let mut bad = false;
        loop {
            match self.string() {
                Ok(s) => out.push_str(&s),
                Err(Bad::Value) => bad = true,
                Err(e) => return Err(e),
            }
            let save = self.c.pos();
            self.c.ws();
            let n = ident_len(self.c.rest());
            let next = self.c.rest().as_bytes().get(n).copied();
            if n <= 2 && matches!(next, Some(b'\'' | b'"')) {
                continue;
            }
            self.c.reset(save);
            break;
        }
        if bad {
            return Err(Bad::Value);
        }
        Ok(Value::String(out))
    }

    /// One string literal with its prefix.
    fn string(&mut self) -> Result<String, Bad> {
        let n = ident_len(self.c.rest());
        let prefix = self.c.rest()[..n].to_ascii_lowercase();
        if !matches!(prefix.as_str(), "" | "r" | "u" | "b" | "br" | "rb" | "f" | "fr" | "rf") {
            return Err(Bad::Syntax);
        }
        self.c.skip(n);
        let raw = prefix.contains('r');
        let q = match self.c.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(Bad::Syntax),
        };
        let q = q as char;
        let triple: String = [q, q, q].iter().collect();
        let delim = if self.c.rest().starts_with(&triple) { triple } else { q.to_string() };
        self.c.skip(delim.len());
        let mut out = String::new();
        let mut chars = self.c.rest().char_indices().peekable();
        let close = loop {
            let Some((at, c)) = chars.next() else { return Err(Bad::Syntax) };
            if self.c.rest()[at..].starts_with(&delim) {
                break at;
            }
            if c == '\n' && delim.len() == 1 {
                return Err(Bad::Syntax);
            }
            if c != '\\' {
                out.push(c);
                continue;
            }
            let Some((_, e)) = chars.next() else { return Err(Bad::Syntax) };
            if raw {
                out.push('\\');
                out.push(e);
                continue;
            }
            match e {
                '\n' => {}
                '\\' | '\'' | '"' => out.push(e),
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'a' => out.push('\u{7}'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'v' => out.push('\u{b}'),
                '0'..='7' => {
                    let mut v = e.to_digit(8).unwrap_or(0);
                    for _ in 0..2 {
                        match chars.peek().and_then(|(_, d)| d.to_digit(8)) {
                            Some(d) => {
                                v = v * 8 + d;
                                chars.next();
                            }
                            None => break,
                        }
                    }
                    out.push(char::from_u32(v).ok_or(Bad::Value)?);
                }
                'x' | 'u' | 'U' if !prefix.contains('b') || e == 'x' => {
                    let len = match e {
                        'x' => 2,
                        'u' => 4,
                        _ => 8,
                    };
                    let mut v = 0u32;
                    for _ in 0..len {
                        let d = chars.next().and_then(|(_, d)| d.to_digit(16));
                        v = v.wrapping_mul(16) + d.ok_or(Bad::Syntax)?;
                    }
                    if (0xD800..0xDC00).contains(&v) {
                        // A surrogate pair written as two escapes.
                        let rest: String = chars.clone().take(6).map(|(_, c)| c).collect();
                        let low = rest
                            .strip_prefix("\\u")
                            .and_then(|h| u32::from_str_radix(h, 16).ok())
                            .filter(|l| (0xDC00..0xE000).contains(l));
                        let Some(low) = low else { return Err(Bad::Value) };
                        for _ in 0..6 {
                            chars.next();
                        }
                        v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
                    }
                    out.push(char::from_u32(v).ok_or(Bad::Value)?);
                }
                _ => {
                    out.push('\\');
                    out.push(e);
                }
            }
        };
        self.c.skip(close + delim.len());
        if prefix.contains('b') || prefix.contains('f') {
            // Bytes have no JSON value; f-strings are no literals.
            return Err(Bad::Value);
        }
        Ok(out)
    }

    fn number(&mut self) -> Result<Value, Bad> {
        let rest = self.c.rest();
        let n = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(rest.len());
        let mut n = n;
        // An exponent sign: `1e-5`.
        let b = rest.as_bytes();
        while n > 0
            && matches!(b[n - 1], b'e' | b'E')
            && matches!(b.get(n), Some(b'-' | b'+'))
            && !rest[..n].starts_with("0x")
            && !rest[..n].starts_with("0X")
        {
            let m = rest[n + 1..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .map_or(rest.len(), |k| n + 1 + k);
            n = m;
        }
        let v = number(&rest[..n]);
        self.c.skip(n);
        v
    }
}

/// The JSON value of a Python number literal.
fn number(text: &str) -> Result<Value, Bad> {
    if text.starts_with('_') || text.ends_with('_') || text.contains("__") {
        return Err(Bad::Syntax);
    }
    let t: String = text.chars().filter(|c| *c != '_').collect();
    if t.ends_with('j') || t.ends_with('J') {
        let body = &t[..t.len() - 1];
        return if body.parse::<f64>().is_ok() { Err(Bad::Value) } else { Err(Bad::Syntax) };
    }
    let lower = t.to_ascii_lowercase();
    for (p, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(digits) = lower.strip_prefix(p) {
            return match u64::from_str_radix(digits, radix) {
                Ok(v) => Ok(Value::from(v)),
                Err(_) if !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix)) => {
                    Err(Bad::Value)
                }
                Err(_) => Err(Bad::Syntax),
            };
        }
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        if t.len() > 1 && t.starts_with('0') && t.bytes().any(|b| b != b'0') {
            return Err(Bad::Syntax);
        }
        if let Ok(v) = t.parse::<u64>() {
            return Ok(Value::from(v));
        }
        return t
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map(Value::Number)
            .ok_or(Bad::Value);
    }
    let ok = t.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
        && t.bytes().any(|b| b.is_ascii_digit());
    if !ok {
        return Err(Bad::Syntax);
    }
    match t.parse::<f64>() {
        Ok(f) => Number::from_f64(f).map(Value::Number).ok_or(Bad::Value),
        Err(_) => Err(Bad::Syntax),
    }
}

fn negate(v: Value) -> Result<Value, Bad> {
    let Value::Number(n) = v else { return Err(Bad::Syntax) };
    if let Some(u) = n.as_u64() {
        if let Ok(i) = i64::try_from(u) {
            return Ok(Value::from(-i));
        }
        if u == 1 << 63 {
            return Ok(Value::from(i64::MIN));
        }
    }
    if let Some(i) = n.as_i64() {
        return Ok(i.checked_neg().map(Value::from).unwrap_or_else(|| Value::from(-(i as f64))));
    }
    n.as_f64().and_then(|f| Number::from_f64(-f)).map(Value::Number).ok_or(Bad::Value)
}
