//! Llama 4 pythonic calls: a Python list of calls with keyword arguments,
//! optionally wrapped in `<|python_start|>` … `<|python_end|>`.
//!
//! ```text
//! <|python_start|>[get_weather(city="Paris", unit='c'), search(q="café \"best\"", filters={"max": 3, "tags": ["a", "b"]}, strict=True, page=None), get_time()]<|python_end|>
//! ```
//!
//! A list counts as calls when it starts the text, follows whitespace or a
//! marker (not a word, so `a[f(x=1)]` is not one), and opens like
//! `[name(` followed by `)` or `key=`; anything else is content. Each element
//! is `name(key=value, …)` (a dotted name is kept whole); values are Python
//! literals: strings in `'`/`"`/triple quotes with their escapes (`r` and
//! `u` prefixes, adjacent strings joined), numbers (`_`, hex/octal/binary,
//! floats), `True`/`False`/`None` (and JSON's `true`/`false`/`null`), lists,
//! tuples (as arrays) and dicts. The end of each call is found by scanning
//! Python tokens, so `]`, `)` or marker text inside a string does not end it.
//!
//! A list that does not parse is content (once it looked like calls, it is
//! malformed markup). A call whose literal has no JSON value (bytes,
//! complex, `1e999`, sets, f-strings) is dropped and its siblings are kept.
//! Text cut by the token limit keeps the calls completed before the cut;
//! a list left open by a stop is content. Turn tokens (`<|eot|>`, `<|eom|>`,
//! header tokens, Llama 3's `<|eot_id|>` …) are stripped.

use crate::cx::Cx;
use crate::formats::Machine;
use crate::scan::{find_first, Find};
use crate::{FinishReason, Options};
use serde_json::{Map, Number, Value};

const PY_START: &str = "<|python_start|>";

/// Markers stripped from content; `[` may open a call list.
const CONTENT_MARKERS: [&str; 14] = [
    "[",
    PY_START,
    "<|python_end|>",
    "<|eot|>",
    "<|eom|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|python_tag|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
];

/// The longest `name(` header (or whitespace run between calls) waited for.
const HEADER_MAX: usize = 512;

/// Deepest nesting accepted in a value.
const MAX_DEPTH: usize = 128;

#[derive(Debug)]
enum State {
    /// `open`: a `[` here may start a call list (start of text, after
    /// whitespace or a marker).
    Content { open: bool },
    /// The input starts with the `[` of a call list.
    List(List),
}

#[derive(Debug)]
struct List {
    calls: Vec<(String, String)>,
    phase: Phase,
    /// Whether a whole call header was seen: failures are then malformed
    /// markup rather than prose.
    markup: bool,
}

#[derive(Debug)]
enum Phase {
    /// An element (or the closing `]`) starts at this offset.
    Element(usize),
    /// Scanning the element that starts at `start` for its `)`.
    Body { start: usize, scan: PyScan },
    /// After an element, at this offset: `,` or `]` follow.
    After(usize),
}

#[derive(Debug)]
pub(crate) struct Llama4Pythonic {
    state: State,
}

impl Llama4Pythonic {
    pub(crate) fn new(_opts: &Options) -> Llama4Pythonic {
        Llama4Pythonic { state: State::Content { open: true } }
    }
}

/// What a look at held text decided.
enum Step {
    /// Wait for more text.
    Wait,
    /// Consumed this many bytes; back to content.
    Done(usize, bool),
}

impl Machine for Llama4Pythonic {
    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> usize {
        let eof = end.is_some();
        match &mut self.state {
            State::Content { open } => match find_first(input, &CONTENT_MARKERS, eof) {
                Find::Found { at, idx: 0 } => {
                    let before = &input[..at];
                    let ok = before.chars().next_back().map_or(*open, opens_list);
                    if !ok {
                        cx.content(&input[..=at]);
                        *open = false;
                        return at + 1;
                    }
                    cx.content(before);
                    self.state = State::List(List {
                        calls: Vec::new(),
                        phase: Phase::Element(1),
                        markup: false,
                    });
                    if at == 0 {
                        return self.step(input, end, cx);
                    }
                    at
                }
                Find::Found { at, idx } => {
                    cx.content(&input[..at]);
                    cx.boundary();
                    *open = true;
                    at + CONTENT_MARKERS[idx].len()
                }
                Find::Clear { safe } => {
                    cx.content(&input[..safe]);
                    if let Some(c) = input[..safe].chars().next_back() {
                        *open = opens_list(c);
                    }
                    safe
                }
            },
            State::List(list) => match list_step(list, input, end, cx) {
                Step::Wait => 0,
                Step::Done(n, open) => {
                    self.state = State::Content { open };
                    if n == 0 && !input.is_empty() {
                        return self.step(input, end, cx);
                    }
                    n
                }
            },
        }
    }

    /// A call list waits unconsumed from its `[`.
    fn held(&self) -> usize {
        0
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        match &self.state {
            State::List(list) if list.markup => cx.malformed(text),
            _ => cx.content(text),
        }
        self.state = State::Content { open: false };
    }
}

/// Whether a `[` right after `c` may open a call list: not after a word,
/// a closing bracket, a quote or a backtick (`a[f(x=1)]`, `` `[f()]` ``).
fn opens_list(c: char) -> bool {
    !(c.is_alphanumeric() || "_)]}[`'\"\\".contains(c))
}

/// Works through a held call list (the input starts at its `[`).
fn list_step(list: &mut List, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
    loop {
        match &mut list.phase {
            Phase::Element(at) => {
                let j = *at + py_ws(&input[*at..]);
                if j - *at > HEADER_MAX {
                    return not_a_list(list, input, j, cx);
                }
                if list.markup && input[j..].starts_with(']') {
                    return close(list, j, cx);
                }
                match header(&input[j..]) {
                    Head::Ok(paren) => {
                        list.markup = true;
                        list.phase = Phase::Body { start: j, scan: PyScan::new(j + paren + 1) };
                        continue;
                    }
                    Head::NeedMore => break,
                    Head::Invalid => return not_a_list(list, input, j, cx),
                }
            }
            Phase::Body { start, scan } => match scan.scan(input) {
                PyEnd::Done(e) => {
                    match parse_call(&input[*start..e]) {
                        Ok(call) => list.calls.push(call),
                        Err(Bad::Value) => {}
                        Err(Bad::Syntax) => return not_a_list(list, input, e, cx),
                    }
                    list.phase = Phase::After(e);
                }
                PyEnd::Partial => break,
                PyEnd::Invalid(at) => return not_a_list(list, input, at, cx),
            },
            Phase::After(at) => {
                let at = *at;
                let j = at + py_ws(&input[at..]);
                if j - at > HEADER_MAX {
                    return not_a_list(list, input, j, cx);
                }
                match input.as_bytes().get(j) {
                    Some(b']') => return close(list, j, cx),
                    Some(b',') => list.phase = Phase::Element(j + 1),
                    Some(_) => return not_a_list(list, input, at, cx),
                    None => break,
                }
            }
        }
    }
    // The list goes on past the text seen so far.
    if end.is_none() {
        return Step::Wait;
    }
    if end == Some(FinishReason::Length) {
        // Cut by the token limit: the calls completed so far stand, the rest
        // is dropped.
        emit(list, cx);
    } else if list.markup {
        cx.malformed(input);
    } else {
        cx.content(input);
    }
    Step::Done(input.len(), false)
}

/// The list closes with the `]` at `at`.
fn close(list: &mut List, at: usize, cx: &mut Cx) -> Step {
    emit(list, cx);
    Step::Done(at + 1, true)
}

fn emit(list: &mut List, cx: &mut Cx) {
    if list.calls.is_empty() {
        return;
    }
    cx.boundary();
    for (name, args) in list.calls.drain(..) {
        cx.call(None, &name, args);
    }
}

/// The held text up to `at` is not a call list: it is shown as it is.
fn not_a_list(list: &mut List, input: &str, at: usize, cx: &mut Cx) -> Step {
    if !list.markup {
        // Prose: only the `[` is decided; the rest is read as content again.
        cx.content("[");
        return Step::Done(1, false);
    }
    cx.malformed(&input[..at]);
    Step::Done(at, false)
}

enum Head {
    /// A call header; the offset of its `(`.
    Ok(usize),
    NeedMore,
    Invalid,
}

/// Checks that `s` begins like a call: `name(` then `)` or `key=`.
fn header(s: &str) -> Head {
    let more = Head::NeedMore;
    let mut i = 0;
    // The dotted name.
    loop {
        let n = ident_len(&s[i..]);
        if n == 0 {
            return if i == s.len() { more } else { Head::Invalid };
        }
        i += n;
        if i >= HEADER_MAX {
            return Head::Invalid;
        }
        if s[i..].starts_with('.') {
            i += 1;
            continue;
        }
        break;
    }
    i += py_ws(&s[i..]);
    match s.as_bytes().get(i) {
        None => return more,
        Some(b'(') => {}
        Some(_) => return Head::Invalid,
    }
    let paren = i;
    i += 1;
    i += py_ws(&s[i..]);
    match s.as_bytes().get(i) {
        None => return more,
        Some(b')') => return Head::Ok(paren),
        Some(_) => {}
    }
    let n = ident_len(&s[i..]);
    if n == 0 {
        return Head::Invalid;
    }
    i += n;
    if i == s.len() {
        return more;
    }
    i += py_ws(&s[i..]);
    match s.as_bytes().get(i) {
        None => more,
        // `key=`, not `key==`.
        Some(b'=') => match s.as_bytes().get(i + 1) {
            None => more,
            Some(b'=') => Head::Invalid,
            Some(_) => Head::Ok(paren),
        },
        Some(_) => Head::Invalid,
    }
}

/// Length of the Python identifier at the start of `s`.
fn ident_len(s: &str) -> usize {
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
fn py_ws(s: &str) -> usize {
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
struct PyScan {
    pos: usize,
    depth: usize,
    /// Inside a string: its quote and whether it is triple-quoted.
    quote: Option<(u8, bool)>,
    esc: bool,
}

enum PyEnd {
    /// The call ends just before this offset.
    Done(usize),
    Partial,
    /// The brackets do not match at this offset.
    Invalid(usize),
}

impl PyScan {
    /// A scan that starts just after the call's `(`.
    fn new(pos: usize) -> PyScan {
        PyScan { pos, depth: 1, quote: None, esc: false }
    }

    fn scan(&mut self, text: &str) -> PyEnd {
        let b = text.as_bytes();
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
enum Bad {
    /// Not Python call syntax.
    Syntax,
    /// Valid syntax, but a literal with no JSON value.
    Value,
}

/// Parses one complete `name(key=value, …)` into a name and arguments text.
fn parse_call(text: &str) -> Result<(String, String), Bad> {
    let mut p = Py { s: text, i: 0 };
    p.ws();
    let mut name = String::new();
    loop {
        let n = ident_len(p.rest());
        if n == 0 {
            return Err(Bad::Syntax);
        }
        name.push_str(&p.rest()[..n]);
        p.i += n;
        if p.eat(".") {
            name.push('.');
            continue;
        }
        break;
    }
    p.ws();
    if !p.eat("(") {
        return Err(Bad::Syntax);
    }
    let mut args = Map::new();
    let mut value_error = false;
    loop {
        p.ws();
        if p.eat(")") {
            break;
        }
        let n = ident_len(p.rest());
        if n == 0 {
            return Err(Bad::Syntax);
        }
        let key = p.rest()[..n].to_owned();
        p.i += n;
        p.ws();
        if !p.eat("=") {
            return Err(Bad::Syntax);
        }
        p.ws();
        match p.value(0) {
            Ok(v) => {
                if args.insert(key, v).is_some() {
                    return Err(Bad::Syntax);
                }
            }
            Err(Bad::Value) => value_error = true,
            Err(Bad::Syntax) => return Err(Bad::Syntax),
        }
        p.ws();
        if p.eat(",") {
            continue;
        }
        p.ws();
        if p.eat(")") {
            break;
        }
        return Err(Bad::Syntax);
    }
    p.ws();
    if p.i != text.len() {
        return Err(Bad::Syntax);
    }
    if value_error {
        return Err(Bad::Value);
    }
    Ok((name, Value::Object(args).to_string()))
}

/// A parser for Python literals over complete text.
struct Py<'a> {
    s: &'a str,
    i: usize,
}

impl Py<'_> {
    fn rest(&self) -> &str {
        &self.s[self.i..]
    }

    fn ws(&mut self) {
        self.i += py_ws(self.rest());
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.rest().starts_with(lit) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn peek(&self) -> Option<u8> {
        self.rest().as_bytes().first().copied()
    }

    /// A literal. A value error is reported only once the literal's syntax
    /// is known to be whole, so the caller can go on.
    fn value(&mut self, depth: usize) -> Result<Value, Bad> {
        if depth > MAX_DEPTH {
            return Err(Bad::Syntax);
        }
        match self.peek() {
            Some(b'[') => {
                self.i += 1;
                self.seq(b']', depth).map(|(v, _)| Value::Array(v))
            }
            Some(b'(') => {
                self.i += 1;
                let (mut v, tuple) = self.seq(b')', depth)?;
                if !tuple && v.len() == 1 {
                    return Ok(v.remove(0));
                }
                Ok(Value::Array(v))
            }
            Some(b'{') => {
                self.i += 1;
                self.dict(depth)
            }
            Some(b'-' | b'+') => {
                let neg = self.peek() == Some(b'-');
                self.i += 1;
                self.ws();
                let v = match self.peek() {
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
                let n = ident_len(self.rest());
                if n == 0 {
                    return Err(Bad::Syntax);
                }
                let word = &self.rest()[..n];
                let after = self.rest().as_bytes().get(n).copied();
                if matches!(after, Some(b'\'' | b'"')) && n <= 2 {
                    return self.strings();
                }
                let v = match word {
                    "True" | "true" => Value::Bool(true),
                    "False" | "false" => Value::Bool(false),
                    "None" | "null" => Value::Null,
                    _ => return Err(Bad::Syntax),
                };
                self.i += n;
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
            self.ws();
            if self.peek() == Some(close) {
                self.i += 1;
                break;
            }
            match self.value(depth + 1) {
                Ok(v) => out.push(v),
                Err(Bad::Value) => bad = true,
                Err(e) => return Err(e),
            }
            self.ws();
            if self.eat(",") {
                comma = true;
                continue;
            }
            if self.peek() == Some(close) {
                self.i += 1;
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
            self.ws();
            if self.eat("}") {
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
            self.ws();
            if !self.eat(":") {
                // A set, or not a literal at all.
                return Err(Bad::Syntax);
            }
            self.ws();
            match (key, self.value(depth + 1)) {
                (Some(k), Ok(v)) => {
                    out.insert(k, v);
                }
                (_, Err(Bad::Syntax)) => return Err(Bad::Syntax),
                _ => bad = true,
            }
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("}") {
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
            let save = self.i;
            self.ws();
            let n = ident_len(self.rest());
            let next = self.rest().as_bytes().get(n).copied();
            if n <= 2 && matches!(next, Some(b'\'' | b'"')) {
                continue;
            }
            self.i = save;
            break;
        }
        if bad {
            return Err(Bad::Value);
        }
        Ok(Value::String(out))
    }

    /// One string literal with its prefix.
    fn string(&mut self) -> Result<String, Bad> {
        let n = ident_len(self.rest());
        let prefix = self.rest()[..n].to_ascii_lowercase();
        if !matches!(prefix.as_str(), "" | "r" | "u" | "b" | "br" | "rb" | "f" | "fr" | "rf") {
            return Err(Bad::Syntax);
        }
        self.i += n;
        let raw = prefix.contains('r');
        let q = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(Bad::Syntax),
        };
        let q = q as char;
        let triple: String = [q, q, q].iter().collect();
        let delim = if self.rest().starts_with(&triple) { triple } else { q.to_string() };
        self.i += delim.len();
        let mut out = String::new();
        let mut chars = self.rest().char_indices().peekable();
        let close = loop {
            let Some((at, c)) = chars.next() else { return Err(Bad::Syntax) };
            if self.rest()[at..].starts_with(&delim) {
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
        self.i += close + delim.len();
        if prefix.contains('b') || prefix.contains('f') {
            // Bytes have no JSON value; f-strings are no literals.
            return Err(Bad::Value);
        }
        Ok(out)
    }

    fn number(&mut self) -> Result<Value, Bad> {
        let rest = self.rest();
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
        self.i += n;
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

#[cfg(test)]
mod tests {
    use crate::{parse, Accumulator, FinishReason, Format, Mode, Options, Parser, ToolCall};
    use serde_json::{json, Value};

    const GEN: &str = "<|header_start|>assistant<|header_end|>\n\n";

    fn opts() -> Options {
        Options { generation_prompt: Some(GEN.to_owned()), ..Options::default() }
    }

    /// Parses whole, and checks that one char per delta gives the same.
    fn run(text: &str, reason: FinishReason) -> Accumulator {
        let whole = parse(Format::Llama4Pythonic, opts(), text, reason);
        let mut p = Parser::new(Format::Llama4Pythonic, opts());
        let mut acc = Accumulator::default();
        for c in text.chars() {
            acc.extend(p.push(&c.to_string()));
        }
        acc.extend(p.finish(reason));
        assert_eq!(acc, whole, "char split differs for {text:?}");
        whole
    }

    fn calls(a: &Accumulator) -> Vec<(String, Value)> {
        a.calls
            .iter()
            .map(|c| {
                assert_eq!(c.id, None);
                (c.name.clone(), serde_json::from_str(&c.arguments).expect("JSON arguments"))
            })
            .collect()
    }

    fn one(name: &str, args: Value) -> Vec<(String, Value)> {
        vec![(name.to_owned(), args)]
    }

    #[test]
    fn simple_and_parallel_calls() {
        let a = run("[get_weather(city='LA', metric='C')]", FinishReason::Stop);
        assert_eq!(calls(&a), one("get_weather", json!({"city": "LA", "metric": "C"})));
        assert_eq!(a.content, "");
        let a = run(
            "[get_weather(city='LA',metric='C'),register_user(name='Doe',age=9), get_time()]",
            FinishReason::Stop,
        );
        assert_eq!(
            calls(&a),
            vec![
                ("get_weather".into(), json!({"city": "LA", "metric": "C"})),
                ("register_user".into(), json!({"name": "Doe", "age": 9})),
                ("get_time".into(), json!({})),
            ]
        );
        assert_eq!(a.calls[2].arguments, "{}");
    }

    #[test]
    fn python_tags_and_turn_tokens_are_stripped() {
        let t = "<|python_start|>[get_weather(city='LA', metric='C'), get_weather(), do_something_cool(steps=[])]<|python_end|><|eom|>";
        let a = run(t, FinishReason::Stop);
        assert_eq!(a.content, "");
        assert_eq!(a.calls.len(), 3);
        assert_eq!(a.calls[2].arguments, r#"{"steps":[]}"#);
        let a = run("<|python_start|>\n[f(x=1)]\n<|python_end|>", FinishReason::Stop);
        assert_eq!(calls(&a), one("f", json!({"x": 1})));
        let a = run("How can I help you today?<|eot|>", FinishReason::Stop);
        assert_eq!(a.content, "How can I help you today?");
        assert!(a.calls.is_empty());
    }

    #[test]
    fn literal_types() {
        let t = "[register_user(name='Doe', age=9, address={'city': 'LA', 'state': 'CA'}, role=None, passed_test=True, aliases=['John', 'Johnny'], ok=False)]";
        let a = run(t, FinishReason::Stop);
        assert_eq!(
            calls(&a),
            one(
                "register_user",
                json!({"name": "Doe", "age": 9, "address": {"city": "LA", "state": "CA"},
                       "role": null, "passed_test": true, "aliases": ["John", "Johnny"], "ok": false})
            )
        );
        let t = "[n(a=-1, b=1_000, c=0x1F, d=1e-5, e=.5, f=5., g=-2.5, h=+3, i=(1, 2), j=(3), k={1: 'x', True: None}, l=[[], {}], m=true, o=null, p=18446744073709551615, q=0o17, r=0b101)]";
        let a = run(t, FinishReason::Stop);
        assert_eq!(
            calls(&a),
            one(
                "n",
                json!({"a": -1, "b": 1000, "c": 31, "d": 1e-5, "e": 0.5, "f": 5.0, "g": -2.5,
                       "h": 3, "i": [1, 2], "j": 3, "k": {"1": "x", "true": null},
                       "l": [[], {}], "m": true, "o": null, "p": 18446744073709551615u64,
                       "q": 15, "r": 5})
            )
        );
    }

    #[test]
    fn strings_and_escapes() {
        let t = r#"[get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')]"#;
        let a = run(t, FinishReason::Stop);
        assert_eq!(
            calls(&a),
            one("get_weather", json!({"city": "Martha's Vineyard", "metric": "\"cool units\""}))
        );
        let t = r#"[s(a="tab\tnl\nq\"", b=r'\d+\'', c='caf\u00e9 \x41\101 \U0001F600 \ud83d\ude00', d='x' "y", e="""multi
"line" ''' """, f='Zürich 東京 🙂', g='unknown \q', h=u'u')]"#;
        let a = run(t, FinishReason::Stop);
        assert_eq!(
            calls(&a),
            one(
                "s",
                json!({"a": "tab\tnl\nq\"", "b": "\\d+\\'", "c": "café AA 😀 😀", "d": "xy",
                       "e": "multi\n\"line\" ''' ", "f": "Zürich 東京 🙂", "g": "unknown \\q",
                       "h": "u"})
            )
        );
    }

    #[test]
    fn marker_text_inside_strings_does_not_end_a_call() {
        let t = r#"[f(s="a]b)c<|eot|>[g(x=1)]", t='<|python_end|>')]<|eot|>"#;
        let a = run(t, FinishReason::Stop);
        assert_eq!(
            calls(&a),
            one("f", json!({"s": "a]b)c<|eot|>[g(x=1)]", "t": "<|python_end|>"}))
        );
        assert_eq!(a.content, "");
    }

    #[test]
    fn text_around_calls() {
        let a = run("Let me check.\n[get_weather(city=\"Paris\")]", FinishReason::Stop);
        assert_eq!(a.content, "Let me check.");
        assert_eq!(calls(&a), one("get_weather", json!({"city": "Paris"})));
        let a = run("[get_time()]\n\nDone.", FinishReason::Stop);
        assert_eq!(a.content, "Done.");
        assert_eq!(calls(&a), one("get_time", json!({})));
        let a = run(
            "[\n  get_weather(\n    city=\"Paris\",\n    unit=\"c\",\n  ),\n  get_time(),\n]",
            FinishReason::Stop,
        );
        assert_eq!(a.calls.len(), 2);
        assert_eq!(calls(&a)[0].1, json!({"city": "Paris", "unit": "c"}));
    }

    #[test]
    fn prose_with_brackets_stays_content() {
        for t in [
            "See [1] and [note: x] and a[f(x=1)] and [link](url) and [f(x)] and [] ok",
            "`[f(x=1)]` is code; so is x[g()]",
            "[Paris, London]",
            "[get weather] [f(x==1)] [f(1, 2)]",
            "It's [",
            "[fo",
        ] {
            let a = run(t, FinishReason::Stop);
            assert_eq!(a.content, t, "{t}");
            assert!(a.calls.is_empty(), "{t}");
        }
    }

    #[test]
    fn malformed_lists_are_content() {
        for t in [
            "[foo(x=1])]",
            "[f(x=1), hello]",
            "[f(x=1) g()]",
            "[f(x=1, x=2)]",
            "[f(x=undefined_name)]",
            "[f(x=1, 2)]",
            "[f(x={1, 2})]",
        ] {
            let a = run(t, FinishReason::Stop);
            assert!(a.calls.is_empty(), "{t}");
            assert_eq!(a.content, t, "{t}");
        }
        // Left open by a stop: shown as it is.
        let t = "<|python_start|>[get_weather(city='Paris')";
        let a = run(t, FinishReason::Stop);
        assert!(a.calls.is_empty());
        assert_eq!(a.content, "[get_weather(city='Paris')");
    }

    #[test]
    fn calls_without_json_values_are_dropped_alone() {
        let a = run("[bad(x=b'z'), get_weather(city='LA', metric='C')]", FinishReason::Stop);
        assert_eq!(calls(&a), one("get_weather", json!({"city": "LA", "metric": "C"})));
        let a = run("[calc(x=1e999), calc(x=2j), ok(y=[f'{1}'])]", FinishReason::Stop);
        assert!(a.calls.is_empty());
        assert_eq!(a.content, "");
    }

    #[test]
    fn truncation_keeps_the_calls_completed_before_the_cut() {
        let a = run("[get_weather(city='Zürich'), search(query='caf", FinishReason::Length);
        assert_eq!(calls(&a), one("get_weather", json!({"city": "Zürich"})));
        assert_eq!(a.content, "");
        // A call whose `)` came is complete, even if the list was not closed.
        for (t, n) in [
            ("[get_weather(city='Par", 0),
            ("[get_wea", 0),
            ("[get_weather(city='Paris'", 0),
            ("[get_weather(city='Paris')", 1),
            ("[f(), ", 1),
        ] {
            let a = run(t, FinishReason::Length);
            assert_eq!(a.content, "", "{t}");
            assert_eq!(a.calls.len(), n, "{t}");
        }
        let a = run("Checking. [get_weather(city='Pa", FinishReason::Length);
        assert_eq!(a.content, "Checking.");
        assert!(a.calls.is_empty());
    }

    #[test]
    fn dotted_names_and_odd_spacing() {
        let a = run("[ functions.get_weather ( city = 'Paris' , ) ]", FinishReason::Stop);
        assert_eq!(calls(&a), one("functions.get_weather", json!({"city": "Paris"})));
    }

    #[test]
    fn suppress_mode_strips_calls() {
        let o = Options { mode: Mode::Suppress, ..opts() };
        let t = "Answer.\n<|python_start|>[f(x=1)]<|python_end|>";
        let a = parse(Format::Llama4Pythonic, o, t, FinishReason::Stop);
        assert_eq!(a.content, "Answer.");
        assert!(a.calls.is_empty());
        assert_eq!(
            a.discarded,
            vec![ToolCall { id: None, name: "f".into(), arguments: r#"{"x":1}"#.into() }]
        );
    }

    #[test]
    fn long_call_pushed_by_char_is_linear() {
        let body = "y".repeat(200_000);
        let t = format!("[f(s='{body}', t=\"\"\"{body}\"\"\")]");
        let mut p = Parser::new(Format::Llama4Pythonic, opts());
        let mut acc = Accumulator::default();
        for c in t.chars() {
            acc.extend(p.push(&c.to_string()));
        }
        acc.extend(p.finish(FinishReason::Stop));
        assert_eq!(acc.calls.len(), 1);
    }
}
