//! Gemma 4: calls in Gemma's own object notation between `<|tool_call>` and
//! `<tool_call|>`, reasoning in the thought channel.
//!
//! ```text
//! <|channel>thought
//! The user wants the weather in two places.
//! <channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>c<|"|>}<tool_call|><|tool_call>call:search{filters:{max:3,tags:[<|"|>a<|"|>,<|"|>b<|"|>]},open:true,q:<|"|>café "best"<|"|>}<tool_call|>Let me check.
//! ```
//!
//! The body after `call:NAME` is an object whose keys are bare (or wrapped
//! in `<|"|>` as the template writes nested keys), whose strings are
//! delimited by the `<|"|>` token and taken verbatim (no escapes), and whose
//! numbers, booleans and `null` are bare; objects and arrays nest. A bare
//! value that is no literal is a string; top-level values are typed by the
//! tool schema where it declares types. The end of the body is found by
//! scanning the notation, so `<tool_call|>` or `}` inside a string does not
//! end a call. `call:` may be missing; a body that does not parse, or a call
//! without `{…}`, falls back to content. Calls follow each other without
//! separators and text may follow them.
//!
//! Reasoning is the `<|channel>` … `<channel|>` block; its `thought` label is
//! dropped. The thinking-off prompt (`<|turn>model\n<|channel>thought\n<channel|>`)
//! starts in content; a prompt that ends inside the channel starts in
//! reasoning. A `<|tool_call>` inside an unclosed thought channel ends it.
//! Turn and stop tokens (`<turn|>`, `<|tool_response>`, `<eos>`, …) are
//! stripped; a stray `<|"|>` outside a call is dropped.

use super::cursor::Cursor;
use super::{prompt_opens, text_step, AtMarker, Machine, Shown, Step};
use crate::cx::Cx;
use crate::json::{self, JsonType};
use crate::scan::{ceil_boundary, find_first, starts_with, ws_len, Find, Prefix};
use crate::{DropReason, FinishReason, Options};
use serde_json::{Map, Value};

const OPEN: &str = "<|tool_call>";
const CLOSE: &str = "<tool_call|>";
const CH_OPEN: &str = "<|channel>";
const CH_CLOSE: &str = "<channel|>";
const QUOTE: &str = "<|\"|>";
const LABEL: &str = "thought";

/// Turn and control tokens that are stripped wherever they show.
const STRIPPED: [&str; 9] = [
    "<turn|>",
    "<|turn>",
    "<|tool_response>",
    "<tool_response|>",
    "<|think|>",
    "<eos>",
    "<|tool>",
    "<tool|>",
    CLOSE,
];

const CONTENT_MARKERS: [&str; 13] = [
    OPEN,
    CH_OPEN,
    CH_CLOSE,
    QUOTE,
    STRIPPED[0],
    STRIPPED[1],
    STRIPPED[2],
    STRIPPED[3],
    STRIPPED[4],
    STRIPPED[5],
    STRIPPED[6],
    STRIPPED[7],
    STRIPPED[8],
];

/// Markers that end a call body when they show outside a string: the body
/// was never closed.
const BODY_BREAKS: [&str; 5] = [OPEN, CLOSE, "<turn|>", "<|tool_response>", "<eos>"];

/// The longest header (`call:NAME`) waited for before its `{`.
const HEADER_MAX: usize = 1024;

/// Deepest nesting accepted in a body.
const MAX_DEPTH: usize = 128;

#[derive(Debug)]
pub(crate) enum State {
    Content,
    /// After `<|channel>`: the `thought` label may follow.
    Label,
    Reasoning,
    /// After `<|tool_call>`: the input starts with `call:NAME{`.
    Call(Body),
}

/// Progress through one call body.
#[derive(Debug, Default)]
pub(crate) struct Body {
    /// Offset of the body's `{` and the call name, once seen.
    head: Option<(usize, Option<String>)>,
    /// Resume offset of the scan.
    pos: usize,
    depth: usize,
    in_str: bool,
    /// Offset just past the body's closing `}`.
    end: Option<usize>,
}

#[derive(Debug)]
pub(crate) struct Gemma4 {
    state: State,
}

impl Gemma4 {
    pub(crate) fn new(opts: &Options) -> Gemma4 {
        let gen = opts.generation_prompt.as_deref();
        let state = if prompt_opens(gen, CH_OPEN, CH_CLOSE) {
            let tail = gen.and_then(|g| g.rfind(CH_OPEN).map(|i| &g[i + CH_OPEN.len()..]));
            if tail.is_some_and(|t| t.trim_start().starts_with(LABEL)) {
                State::Reasoning
            } else {
                State::Label
            }
        } else {
            State::Content
        };
        Gemma4 { state }
    }
}

impl Machine for Gemma4 {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        match &mut self.state {
            State::Content => {
                text_step(input, &CONTENT_MARKERS, eof, cx, Shown::Content, |m, _| {
                    match m {
                        OPEN => self.state = State::Call(Body::default()),
                        CH_OPEN => self.state = State::Label,
                        _ => {}
                    }
                    AtMarker::Markup
                })
            }
            State::Label => match starts_with(input, LABEL, eof) {
                Prefix::NeedMore => Step::Wait,
                Prefix::Yes => match input[LABEL.len()..].chars().next() {
                    None if !eof => Step::Wait,
                    Some(c) if !(c.is_whitespace() || c == '<') => {
                        // A word that only starts like the label.
                        self.state = State::Reasoning;
                        Step::Transition
                    }
                    _ => {
                        self.state = State::Reasoning;
                        Step::took(LABEL.len())
                    }
                },
                Prefix::No => {
                    self.state = State::Reasoning;
                    Step::Transition
                }
            },
            State::Reasoning => {
                text_step(input, &CONTENT_MARKERS, eof, cx, Shown::Reasoning, |m, _| {
                    match m {
                        CH_CLOSE => self.state = State::Content,
                        OPEN => self.state = State::Call(Body::default()),
                        _ => {}
                    }
                    AtMarker::Markup
                })
            }
            State::Call(body) => match call_step(body, input, end, cx) {
                None => Step::Wait,
                Some(n) => {
                    self.state = State::Content;
                    Step::moved(n)
                }
            },
        }
    }

    fn held(&self) -> usize {
        match self.state {
            State::Call(_) => OPEN.len(),
            State::Content | State::Label | State::Reasoning => 0,
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        cx.malformed(text);
        self.state = State::Content;
    }
}

/// Works on a call body; returns `None` to wait, else the bytes consumed
/// (the call is then decided).
fn call_step(
    body: &mut Body,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> Option<usize> {
    let eof = end.is_some();
    if input.is_empty() && eof {
        unfinished(input, end, cx);
        return Some(0);
    }
    if body.head.is_none() {
        let mut stops = vec!["{"];
        stops.extend(BODY_BREAKS);
        let found = find_first(input, &stops, eof);
        let searched = match found {
            Find::Found { at, .. } => at,
            Find::Clear { safe } => safe,
        };
        if searched > HEADER_MAX {
            // No `{` within HEADER_MAX bytes: not a call. The cut is at a
            // fixed offset, whatever the deltas.
            let cut = ceil_boundary(input, HEADER_MAX + 1);
            cx.malformed(&format!("{OPEN}{}", &input[..cut]));
            return Some(cut);
        }
        match found {
            Find::Found { at, idx } if stops[idx] == "{" => {
                let name = header_name(&input[..at]);
                if let Some(name) = &name {
                    cx.start_call(None, name);
                }
                body.head = Some((at, name));
                body.pos = at + 1;
                body.depth = 1;
            }
            Find::Found { at, idx } => {
                // No `{`: not a call. A close marker ends the markup.
                let used = if stops[idx] == CLOSE { at + CLOSE.len() } else { at };
                cx.malformed(&format!("{OPEN}{}", &input[..used]));
                return Some(used);
            }
            Find::Clear { .. } => {
                if eof {
                    unfinished(input, end, cx);
                    return Some(input.len());
                }
                return None;
            }
        }
    }
    let (brace, name) = body.head.clone()?;
    if body.end.is_none() {
        match scan_body(body, input, eof) {
            BodyScan::Done(e) => body.end = Some(e),
            BodyScan::Partial => {
                if eof {
                    unfinished(input, end, cx);
                    return Some(input.len());
                }
                return None;
            }
            BodyScan::Broken { at, marker } => {
                let used = if marker == CLOSE { at + CLOSE.len() } else { at };
                cx.malformed(&format!("{OPEN}{}", &input[..used]));
                return Some(used);
            }
        }
    }
    let e = body.end?;
    let after = &input[e..];
    let ws = ws_len(after);
    let parsed = || name.as_ref().and_then(|n| parse_args(&input[brace..e], n, cx).map(|a| (n, a)));
    match starts_with(&after[ws..], CLOSE, eof) {
        Prefix::NeedMore => None,
        Prefix::No if ws == after.len() && !eof => None,
        Prefix::Yes => {
            let used = e + ws + CLOSE.len();
            match parsed() {
                Some((_, args)) => cx.complete_call(args),
                None => cx.malformed(&format!("{OPEN}{}", &input[..used])),
            }
            Some(used)
        }
        Prefix::No => {
            // No close marker: the body alone decides, unless the token limit
            // cut the text right after it (or in the marker: then nothing of
            // it is shown).
            let cut = end == Some(FinishReason::Length) && CLOSE.starts_with(&after[ws..]);
            match parsed() {
                Some(_) if cut => cx.drop_call(DropReason::Truncated),
                Some((_, args)) => cx.complete_call(args),
                None => cx.malformed(&format!("{OPEN}{}", &input[..e])),
            }
            Some(if cut { input.len() } else { e })
        }
    }
}

/// The name in a call header (`call:NAME`), if it is one.
fn header_name(head: &str) -> Option<String> {
    let h = head.trim();
    let h = h.strip_prefix("call:").unwrap_or(h).trim();
    let ok = !h.is_empty()
        && h.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/'));
    ok.then(|| h.to_owned())
}

enum BodyScan {
    /// The body's `}` ends just before this offset.
    Done(usize),
    Partial,
    /// A marker that cannot be inside a body showed outside a string.
    Broken {
        at: usize,
        marker: &'static str,
    },
}

/// Finds the end of the body, resuming where the last scan stopped.
fn scan_body(body: &mut Body, input: &str, eof: bool) -> BodyScan {
    let b = input.as_bytes();
    crate::scan::scanned(b.len().saturating_sub(body.pos));
    while body.pos < b.len() {
        let p = body.pos;
        let c = b[p];
        if c == b'<' {
            let rest = &input[p..];
            match starts_with(rest, QUOTE, eof) {
                Prefix::Yes => {
                    body.in_str = !body.in_str;
                    body.pos += QUOTE.len();
                    continue;
                }
                Prefix::NeedMore => return BodyScan::Partial,
                Prefix::No => {}
            }
            if !body.in_str {
                for m in BODY_BREAKS {
                    match starts_with(rest, m, eof) {
                        Prefix::Yes => return BodyScan::Broken { at: p, marker: m },
                        Prefix::NeedMore => return BodyScan::Partial,
                        Prefix::No => {}
                    }
                }
            }
            body.pos += 1;
            continue;
        }
        body.pos += 1;
        if body.in_str {
            continue;
        }
        match c {
            b'{' | b'[' => body.depth += 1,
            b'}' | b']' => {
                body.depth = body.depth.saturating_sub(1);
                if body.depth == 0 {
                    return BodyScan::Done(body.pos);
                }
            }
            _ => {}
        }
    }
    BodyScan::Partial
}

/// The text ended inside a call: cut by the token limit, nothing is kept;
/// ended by a stop, the markup is shown as it is.
fn unfinished(input: &str, end: Option<FinishReason>, cx: &mut Cx) {
    if end == Some(FinishReason::Length) {
        cx.drop_call(DropReason::Truncated);
    } else {
        cx.malformed(&format!("{OPEN}{input}"));
    }
}

/// Parses a call body (`{…}`) into strict JSON object text.
fn parse_args(text: &str, name: &str, cx: &Cx) -> Option<String> {
    let mut p = Notation { c: Cursor::new(text, ws_len) };
    let map = p.object(0).ok()?;
    p.c.ws();
    if !p.c.done() {
        return None;
    }
    let mut out = Map::new();
    for (key, v) in map {
        let types = cx.tools().types_of(name, &key);
        let v = match v {
            Parsed::Value(v) => v,
            Parsed::Bare(t) => type_bare(&t, types),
            Parsed::Str(s) => type_string(s, types),
        };
        out.insert(key, v);
    }
    Some(json::to_text(&out))
}

/// A top-level value, kept apart until the schema has typed it.
enum Parsed {
    Value(Value),
    /// Bare text (a literal or a word).
    Bare(String),
    /// A `<|"|>` string.
    Str(String),
}

/// A bare top-level value: its literal type, unless the schema declares
/// types the literal does not fit.
fn type_bare(t: &str, types: &[JsonType]) -> Value {
    let lit = literal(t);
    if types.is_empty() || types.iter().any(|ty| ty.accepts(&lit)) {
        return lit;
    }
    json::coerce(t, types)
}

/// A delimited string: kept, unless the schema declares no string type and
/// the text parses as one of the declared types.
fn type_string(s: String, types: &[JsonType]) -> Value {
    if types.is_empty() || types.contains(&JsonType::String) {
        return Value::String(s);
    }
    json::coerce(&s, types)
}

/// The value of bare text: a boolean, null, a number, else the text.
fn literal(t: &str) -> Value {
    match t {
        "true" | "True" => return Value::Bool(true),
        "false" | "False" => return Value::Bool(false),
        "null" | "None" | "none" | "nil" => return Value::Null,
        _ => {}
    }
    let numeric = !t.is_empty()
        && t.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
        && t.bytes().any(|b| b.is_ascii_digit());
    if numeric {
        if let Ok(v @ Value::Number(_)) = json::strict_value(t) {
            return v;
        }
        if let Some(n) = t.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
            return Value::Number(n);
        }
    }
    Value::String(t.to_owned())
}

/// A parser for Gemma's object notation over a complete body.
struct Notation<'a> {
    c: Cursor<'a>,
}

impl Notation<'_> {
    /// `<|"|>…<|"|>`, after the opening delimiter was eaten.
    fn string_tail(&mut self) -> Result<String, ()> {
        self.c.until(QUOTE).map(str::to_owned).ok_or(())
    }

    /// Bare text up to one of `stops` (or a string delimiter), trimmed.
    fn bare(&mut self, stops: &[char]) -> Result<String, ()> {
        let rest = self.c.rest();
        let n = rest.find(|c| stops.contains(&c)).unwrap_or(rest.len());
        let t = &rest[..n];
        if t.contains(QUOTE) {
            return Err(());
        }
        let t = t.trim();
        if t.is_empty() {
            return Err(());
        }
        let t = t.to_owned();
        self.c.skip(n);
        Ok(t)
    }

    fn key(&mut self) -> Result<String, ()> {
        if self.c.eat(QUOTE) {
            return self.string_tail();
        }
        self.bare(&[':', ',', '{', '}', '[', ']'])
    }

    /// An object (at `{`), its values not yet typed.
    fn object(&mut self, depth: usize) -> Result<Vec<(String, Parsed)>, ()> {
        if depth > MAX_DEPTH || !self.c.eat("{") {
            return Err(());
        }
        let mut out: Vec<(String, Parsed)> = Vec::new();
        self.c.ws();
        if self.c.eat("}") {
            return Ok(out);
        }
        loop {
            self.c.ws();
            let key = self.key()?;
            self.c.ws();
            if !self.c.eat(":") {
                return Err(());
            }
            self.c.ws();
            let v = self.value(depth + 1)?;
            if out.iter().any(|(k, _)| *k == key) {
                return Err(());
            }
            out.push((key, v));
            self.c.ws();
            if self.c.eat(",") {
                self.c.ws();
                if self.c.eat("}") {
                    return Ok(out);
                }
            } else if self.c.eat("}") {
                return Ok(out);
            } else {
                return Err(());
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Vec<Value>, ()> {
        if depth > MAX_DEPTH || !self.c.eat("[") {
            return Err(());
        }
        let mut out = Vec::new();
        self.c.ws();
        if self.c.eat("]") {
            return Ok(out);
        }
        loop {
            self.c.ws();
            out.push(self.value(depth + 1)?.into_value());
            self.c.ws();
            if self.c.eat(",") {
                self.c.ws();
                if self.c.eat("]") {
                    return Ok(out);
                }
            } else if self.c.eat("]") {
                return Ok(out);
            } else {
                return Err(());
            }
        }
    }

    fn value(&mut self, depth: usize) -> Result<Parsed, ()> {
        if self.c.eat(QUOTE) {
            return self.string_tail().map(Parsed::Str);
        }
        match self.c.peek() {
            Some(b'{') => {
                let mut m = Map::new();
                for (k, v) in self.object(depth)? {
                    m.insert(k, v.into_value());
                }
                Ok(Parsed::Value(Value::Object(m)))
            }
            Some(b'[') => Ok(Parsed::Value(Value::Array(self.array(depth)?))),
            Some(_) => self.bare(&[',', '}', ']']).map(Parsed::Bare),
            None => Err(()),
        }
    }
}

impl Parsed {
    fn into_value(self) -> Value {
        match self {
            Parsed::Value(v) => v,
            Parsed::Bare(t) => literal(&t),
            Parsed::Str(s) => Value::String(s),
        }
    }
}

/// Writes the Lark rules of Gemma's value notation for JSON Schemas.
struct Notate<'a> {
    rules: String,
    /// The tool's arguments schema (what local `$ref`s point into).
    root: &'a Value,
    /// Rules already written for `$ref` targets, by reference.
    refs: Vec<(String, String)>,
    /// How many rules were named.
    n: usize,
    /// `<|"|>` as the vocabulary writes it.
    quote: String,
    /// `<|"|>` is text there (not one token).
    quote_is_text: bool,
    /// A string's content regex, with no minimum and with one character at
    /// least (`GrammarTool::text_body`).
    text: (String, String),
}

impl Notate<'_> {
    fn fresh(&mut self) -> String {
        self.n += 1;
        format!("g{}", self.n)
    }

    /// A string written out between quotes.
    fn quoted(&self, s: &str) -> String {
        use crate::grammar::lit;
        if self.quote_is_text {
            lit(&format!("{QUOTE}{s}{QUOTE}"))
        } else {
            let q = &self.quote;
            if s.is_empty() {
                format!("{q} {q}")
            } else {
                format!("{q} {} {q}", lit(s))
            }
        }
    }

    /// A JSON value in the notation (the template's rendering, keys sorted).
    fn literal(&self, v: &Value) -> String {
        use crate::grammar::lit;
        match v {
            Value::String(s) => self.quoted(s),
            Value::Array(a) => {
                if a.is_empty() {
                    return lit("[]");
                }
                let items: Vec<String> = a.iter().map(|x| self.literal(x)).collect();
                format!("\"[\" {} \"]\"", items.join(" \",\" "))
            }
            Value::Object(o) if o.is_empty() => lit("{}"),
            Value::Object(o) => {
                let mut keys: Vec<&String> = o.keys().collect();
                keys.sort();
                let m: Vec<String> = keys
                    .iter()
                    .map(|k| format!("{} {}", self.key(k), self.literal(&o[*k])))
                    .collect();
                format!("\"{{\" {} \"}}\"", m.join(" \",\" "))
            }
            other => lit(&other.to_string()),
        }
    }

    /// A key and its colon: bare where the parser reads it back bare.
    fn key(&self, k: &str) -> String {
        use crate::grammar::lit;
        let bare = !k.is_empty()
            && k.trim() == k
            && !k.contains(QUOTE)
            && !k.contains([':', ',', '{', '}', '[', ']']);
        if bare {
            lit(&format!("{k}:"))
        } else {
            format!("{} \":\"", self.quoted(k))
        }
    }

    /// The rules every schema may use: strings, numbers, any value.
    fn base(&mut self) {
        use super::qwen3_xml::{rx, TEXT_MAX};
        let q = rx(QUOTE);
        if self.quote_is_text {
            self.rules.push_str(&format!(
                "GSTR: /{q}{}{q}/ & ~/{q}(?s:.*){q}(?s:.+)/\ngstr[max_tokens={TEXT_MAX}]: GSTR\n",
                self.text.0
            ));
        } else {
            self.rules.push_str(&format!(
                "GSTRC: /{}/ & ~/(?s:.*){q}(?s:.*)/\ngstrc[max_tokens={TEXT_MAX}]: GSTRC\n",
                self.text.1
            ));
            self.rules.push_str(&format!("gstr: {0} gstrc? {0}\n", self.quote));
        }
        self.rules.push_str("GINT: /-?(0|[1-9][0-9]{0,15})/\n");
        self.rules
            .push_str("GNUM: /-?(0|[1-9][0-9]{0,15})(\\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?/\n");
        self.rules.push_str("GKEY: /[A-Za-z_][A-Za-z0-9_]{0,63}/\n");
        self.rules.push_str(
            "gany: gstr | GNUM | \"true\" | \"false\" | \"null\" | gobj | garr\n\
             gobj: \"{\" (GKEY \":\" gany (\",\" GKEY \":\" gany)*)? \"}\"\n\
             garr: \"[\" (gany (\",\" gany)*)? \"]\"\n",
        );
    }

    /// The expression of a value valid against `schema`.
    fn value(&mut self, schema: &Value) -> String {
        let Some(o) = schema.as_object() else { return "gany".into() };
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            return self.reference(r);
        }
        if let Some(c) = o.get("const") {
            return self.literal(c);
        }
        if let Some(e) = o.get("enum").and_then(Value::as_array) {
            let alts: Vec<String> = e.iter().map(|v| self.literal(v)).collect();
            return format!("({})", alts.join(" | "));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = o.get(key).and_then(Value::as_array) {
                let alts: Vec<String> = alts.iter().map(|s| self.value(s)).collect();
                return format!("({})", alts.join(" | "));
            }
        }
        if let Some([one]) = o.get("allOf").and_then(Value::as_array).map(Vec::as_slice) {
            return self.value(one);
        }
        let types: Vec<&str> = match o.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ if o.contains_key("properties") => vec!["object"],
            _ if o.contains_key("items") => vec!["array"],
            _ => return "gany".into(),
        };
        let mut alts = Vec::new();
        for t in types {
            alts.push(match t {
                "string" => "gstr".to_owned(),
                "integer" => "GINT".to_owned(),
                "number" => "GNUM".to_owned(),
                "boolean" => "(\"true\" | \"false\")".to_owned(),
                "null" => "\"null\"".to_owned(),
                "object" => self.object(schema, false),
                "array" => {
                    let item = match o.get("items") {
                        Some(items) => self.value(items),
                        None => "gany".to_owned(),
                    };
                    format!("\"[\" ({item} (\",\" {item})*)? \"]\"")
                }
                _ => "gany".to_owned(),
            });
        }
        if alts.is_empty() {
            return "gany".into();
        }
        format!("({})", alts.join(" | "))
    }

    /// A rule for the local reference `r` (written once).
    fn reference(&mut self, r: &str) -> String {
        if let Some((_, name)) = self.refs.iter().find(|(x, _)| x == r) {
            return name.clone();
        }
        let name = self.fresh();
        self.refs.push((r.to_owned(), name.clone()));
        let target = r.strip_prefix('#').and_then(|p| self.root.pointer(p)).cloned();
        let body = match target {
            Some(t) => self.value(&t),
            None => "gany".to_owned(),
        };
        self.rules.push_str(&format!("{name}: {body}\n"));
        name
    }

    /// An object: its declared properties in key order, the required ones
    /// always, the others optionally; any members where it declares none
    /// (none at the top level: a tool without properties takes none).
    fn object(&mut self, schema: &Value, top: bool) -> String {
        let props = schema.get("properties").and_then(Value::as_object);
        let Some(props) = props.filter(|p| !p.is_empty()) else {
            return if top { "\"{}\"".into() } else { "gobj".into() };
        };
        let required = crate::grammar::required(schema);
        let mut keys: Vec<&String> = props.keys().collect();
        keys.sort();
        let members: Vec<(bool, String)> = keys
            .iter()
            .map(|k| {
                (
                    required.contains(&k.as_str()),
                    format!("{} {}", self.key(k), self.value(&props[*k])),
                )
            })
            .collect();
        let id = self.fresh();
        let first = crate::grammar::member_chain(&mut self.rules, &id, &members, "\",\" ");
        format!("\"{{\" {first} \"}}\"")
    }
}

/// Calls as Gemma 4 writes them: `<|tool_call>call:NAME{…}<tool_call|>`,
/// one after another. The arguments are in Gemma's notation: keys bare (in
/// sorted order, as the template writes them; optional properties
/// optional, a tool without properties takes none), strings between
/// `<|"|>` (any text without `<|"|>`), numbers, `true`, `false`, `null`,
/// objects and arrays as the schema says (`enum`, `const`, `anyOf`,
/// `oneOf`, local `$ref`s, `items`; string and number bounds, `minItems`
/// and the like are not enforced; an object without declared properties
/// takes any members).
pub(crate) fn grammar(
    tools: &[crate::grammar::GrammarTool<'_>],
    special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    use crate::grammar::lit;
    let quote = special(QUOTE);
    let mut g = Notate {
        rules: String::new(),
        root: &Value::Null,
        refs: Vec::new(),
        n: 0,
        quote_is_text: quote == lit(QUOTE),
        quote,
        text: tools.first().map_or_else(
            || ("(?s:.*)".into(), "(?s:.+)".into()),
            |t| (t.text_body(0), t.text_body(1)),
        ),
    };
    g.base();
    let mut fns = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        g.root = t.parameters;
        g.refs.clear();
        let args = g.object(t.parameters, true);
        g.rules.push_str(&format!("fn{i}: {} {args}\n", lit(&format!("call:{}", t.name))));
        fns.push(format!("fn{i}"));
    }
    let mut rules = g.rules;
    let (open, close) = (special(OPEN), special(CLOSE));
    rules.push_str(&format!("fn: {}\n", fns.join(" | ")));
    rules.push_str("NL: /\\n{1,2}/\n");
    rules.push_str(&format!("call: {open} fn {close}\n"));
    rules.push_str("one: call\n");
    rules.push_str("calls: call (NL? call)*\n");
    rules.push_str(&format!("body: fn {close} (NL? call)*\n"));
    Some(crate::grammar::CallGrammar { rules, opener: OPEN.to_owned() })
}

/// A JSON value in Gemma's notation, as its template renders it: strings
/// between `<|"|>` (verbatim), keys sorted and bare where the parser reads
/// them back bare, numbers, booleans and `null` bare.
fn notate(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(QUOTE);
            out.push_str(s);
            out.push_str(QUOTE);
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                notate(x, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let bare = !k.is_empty()
                    && k.trim() == k
                    && !k.contains(QUOTE)
                    && !k.contains([':', ',', '{', '}', '[', ']']);
                if bare {
                    out.push_str(k);
                } else {
                    out.push_str(QUOTE);
                    out.push_str(k);
                    out.push_str(QUOTE);
                }
                out.push(':');
                notate(&o[k], out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Calls as Gemma 4 writes them (what [`grammar`] generates):
/// `<|tool_call>call:NAME{…}<tool_call|>` each, the arguments in its
/// notation, one after the other. A string holding `<|"|>` cannot be
/// written.
pub(crate) fn write(calls: &[(&str, &Value)]) -> String {
    let mut out = String::new();
    for (name, args) in calls {
        out.push_str(&format!("{OPEN}call:{name}"));
        match args {
            Value::Object(_) => notate(args, &mut out),
            _ => out.push_str("{}"),
        }
        out.push_str(CLOSE);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::{Accumulator, FinishReason, Format, Options, Parser};

    const THINK_OFF: &str = "<|turn>model\n<|channel>thought\n<channel|>";

    fn opts(gen: &str) -> Options {
        Options { generation_prompt: Some(gen.to_owned()), ..Options::default() }
    }

    #[test]
    fn long_call_pushed_by_char_is_linear() {
        let body = "x".repeat(200_000);
        let t = format!("<|tool_call>call:f{{s:<|\"|>{body}<|\"|>}}<tool_call|>");
        let mut p = Parser::new(Format::Gemma4, opts(THINK_OFF));
        let mut acc = Accumulator::default();
        let ((), work) = crate::scan::work::measure(|| {
            for c in t.chars() {
                acc.extend(p.push(&c.to_string()));
            }
            acc.extend(p.finish(FinishReason::Stop));
        });
        assert!(work <= 4 * t.len() as u64, "{work} bytes scanned for {}", t.len());
        assert_eq!(acc.calls.len(), 1);
    }
}
