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
//! literals ([`super::python`]). The end of each call is found by scanning
//! Python tokens, so `]`, `)` or marker text inside a string does not end it.
//!
//! A list that does not parse is content (once it looked like calls, it is
//! malformed markup). A call whose literal has no JSON value (bytes,
//! complex, `1e999`, sets, f-strings) is dropped and its siblings are kept.
//! The list is one Python expression: its calls stand only once its `]`
//! closes it, so a list cut by the token limit yields no call (not even one
//! whose `)` came), and a list left open by a stop is content. Whitespace
//! inside the list is markup; text around it is content, verbatim. Turn tokens (`<|eot|>`, `<|eom|>`,
//! header tokens, Llama 3's `<|eot_id|>` …) are stripped.

use super::python::{ident_len, parse_call, py_ws, Bad, PyEnd, PyScan};
use super::{Machine, Step};
use crate::cx::Cx;
use crate::grammar::{lit, member_chain, required};
use crate::scan::{find_first, Find};
use crate::{FinishReason, Options};
use serde_json::Value;

const PY_START: &str = "<|python_start|>";
const PY_END: &str = "<|python_end|>";

/// Markers stripped from content; `[` may open a call list.
const CONTENT_MARKERS: [&str; 14] = [
    "[",
    PY_START,
    PY_END,
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

#[derive(Debug)]
pub(crate) enum State {
    /// `open`: a `[` here may start a call list (start of text, after
    /// whitespace or a marker).
    Content { open: bool },
    /// The input starts with the `[` of a call list.
    List(List),
}

#[derive(Debug)]
pub(crate) struct List {
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

/// A held list is decided: this many bytes are consumed, and whether a
/// `[` right after them may open a list.
struct Decided(usize, bool);

impl Machine for Llama4Pythonic {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        match &mut self.state {
            State::Content { open } => match find_first(input, &CONTENT_MARKERS, eof) {
                Find::Found { at, idx: 0 } => {
                    let before = &input[..at];
                    let ok = before.chars().next_back().map_or(*open, opens_list);
                    if !ok {
                        cx.content(&input[..=at]);
                        *open = false;
                        return Step::took(at + 1);
                    }
                    cx.content(before);
                    self.state = State::List(List {
                        calls: Vec::new(),
                        phase: Phase::Element(1),
                        markup: false,
                    });
                    Step::moved(at)
                }
                Find::Found { at, idx } => {
                    cx.content(&input[..at]);
                    *open = true;
                    Step::took(at + CONTENT_MARKERS[idx].len())
                }
                Find::Clear { safe } => {
                    cx.content(&input[..safe]);
                    if let Some(c) = input[..safe].chars().next_back() {
                        *open = opens_list(c);
                    }
                    Step::up_to(safe)
                }
            },
            State::List(list) => match list_step(list, input, end, cx) {
                None => Step::Wait,
                Some(Decided(n, open)) => {
                    self.state = State::Content { open };
                    Step::moved(n)
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

/// Works through a held call list (the input starts at its `[`); `None`
/// waits for more text.
fn list_step(
    list: &mut List,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> Option<Decided> {
    loop {
        match &mut list.phase {
            Phase::Element(at) => {
                let j = *at + py_ws(&input[*at..]);
                if j - *at > HEADER_MAX {
                    return Some(not_a_list(list, input, j, cx));
                }
                if list.markup && input[j..].starts_with(']') {
                    return Some(close(list, j, cx));
                }
                if continuation_pending(input, j, end) {
                    break;
                }
                match header(&input[j..]) {
                    Head::Ok(paren) => {
                        list.markup = true;
                        list.phase = Phase::Body { start: j, scan: PyScan::new(j + paren + 1) };
                        continue;
                    }
                    Head::NeedMore => break,
                    Head::Invalid => return Some(not_a_list(list, input, j, cx)),
                }
            }
            Phase::Body { start, scan } => match scan.scan(input) {
                PyEnd::Done(e) => {
                    match parse_call(&input[*start..e]) {
                        Ok(call) => list.calls.push(call),
                        Err(Bad::Value) => {}
                        Err(Bad::Syntax) => return Some(not_a_list(list, input, e, cx)),
                    }
                    list.phase = Phase::After(e);
                }
                PyEnd::Partial => break,
                PyEnd::Invalid(at) => return Some(not_a_list(list, input, at, cx)),
            },
            Phase::After(at) => {
                let at = *at;
                let j = at + py_ws(&input[at..]);
                if j - at > HEADER_MAX {
                    return Some(not_a_list(list, input, j, cx));
                }
                if continuation_pending(input, j, end) {
                    break;
                }
                match input.as_bytes().get(j) {
                    Some(b']') => return Some(close(list, j, cx)),
                    Some(b',') => list.phase = Phase::Element(j + 1),
                    Some(_) => return Some(not_a_list(list, input, at, cx)),
                    None => break,
                }
            }
        }
    }
    // The list goes on past the text seen so far.
    match end {
        None => return None,
        // Cut by the token limit before the list closed: no call of it
        // stands, and nothing of the cut markup is shown.
        Some(FinishReason::Length) => {}
        Some(FinishReason::Stop) if list.markup => cx.malformed(input),
        Some(FinishReason::Stop) => cx.content(input),
    }
    Some(Decided(input.len(), false))
}

/// Whether the whitespace at `j` may still be a line continuation: a `\`
/// that ends the text seen so far (its `\n` may come in the next delta).
fn continuation_pending(input: &str, j: usize, end: Option<FinishReason>) -> bool {
    end.is_none() && &input[j..] == "\\"
}

/// The list closes with the `]` at `at`: its calls stand.
fn close(list: &mut List, at: usize, cx: &mut Cx) -> Decided {
    for (name, args) in list.calls.drain(..) {
        cx.call(None, &name, args);
    }
    Decided(at + 1, true)
}

/// The held text up to `at` is not a call list: it is shown as it is.
fn not_a_list(list: &mut List, input: &str, at: usize, cx: &mut Cx) -> Decided {
    if !list.markup {
        // Prose: only the `[` is decided; the rest is read as content again.
        cx.content("[");
        return Decided(1, false);
    }
    cx.malformed(&input[..at]);
    Decided(at, false)
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
    if &s[i..] == "\\" {
        return more;
    }
    match s.as_bytes().get(i) {
        None => return more,
        Some(b'(') => {}
        Some(_) => return Head::Invalid,
    }
    let paren = i;
    i += 1;
    i += py_ws(&s[i..]);
    if &s[i..] == "\\" {
        return more;
    }
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
    if &s[i..] == "\\" {
        return more;
    }
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

/// Whether `s` is a (dotted) name the parser reads whole: identifiers
/// joined by `.`.
fn dotted_name(s: &str) -> bool {
    s.len() < HEADER_MAX && s.split('.').all(|p| !p.is_empty() && ident_len(p) == p.len())
}

/// `s` as a Python string literal between `q` quotes.
fn py_str(s: &str, q: char) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// Writes the Lark rules of Python literals for JSON Schemas.
struct Pyn<'a> {
    rules: String,
    /// The tool's arguments schema (what local `$ref`s point into).
    root: &'a Value,
    /// Rules already written for `$ref` targets, by reference.
    refs: Vec<(String, String)>,
    /// How many rules were named.
    n: usize,
}

impl Pyn<'_> {
    fn fresh(&mut self) -> String {
        self.n += 1;
        format!("p{}", self.n)
    }

    /// A string literal in either quote.
    fn quoted(s: &str) -> String {
        format!("({} | {})", lit(&py_str(s, '"')), lit(&py_str(s, '\'')))
    }

    /// A JSON value as a Python literal.
    fn literal(v: &Value) -> String {
        match v {
            Value::String(s) => Pyn::quoted(s),
            Value::Bool(true) => lit("True"),
            Value::Bool(false) => lit("False"),
            Value::Null => lit("None"),
            Value::Number(n) => lit(&n.to_string()),
            Value::Array(a) => {
                let items: Vec<String> = a.iter().map(Pyn::literal).collect();
                format!("\"[\" {} \"]\"", items.join(" COMMA "))
            }
            Value::Object(o) => {
                let m: Vec<String> = o
                    .iter()
                    .map(|(k, v)| format!("{} COLON {}", Pyn::quoted(k), Pyn::literal(v)))
                    .collect();
                format!("\"{{\" {} \"}}\"", m.join(" COMMA "))
            }
        }
    }

    /// The rules every schema may use: strings, numbers, any value.
    fn base(&mut self) {
        self.rules.push_str(
            "PSTR: /\"([^\"\\\\\\n]|\\\\[\"'\\\\ntr])*\"/ | /'([^'\\\\\\n]|\\\\[\"'\\\\ntr])*'/\n",
        );
        self.rules.push_str("PINT: /-?(0|[1-9][0-9]{0,15})/\n");
        self.rules
            .push_str("PNUM: /-?(0|[1-9][0-9]{0,15})(\\.[0-9]{1,16})?([eE][+-]?[0-9]{1,2})?/\n");
        self.rules.push_str("COMMA: /, ?/\nCOLON: /: ?/\n");
        self.rules.push_str(
            "pany: PSTR | PNUM | \"True\" | \"False\" | \"None\" | pdict | plist\n\
             pdict: \"{\" (PSTR COLON pany (COMMA PSTR COLON pany)*)? \"}\"\n\
             plist: \"[\" (pany (COMMA pany)*)? \"]\"\n",
        );
    }

    /// The expression of a value valid against `schema`.
    fn value(&mut self, schema: &Value) -> String {
        let Some(o) = schema.as_object() else { return "pany".into() };
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            return self.reference(r);
        }
        if let Some(c) = o.get("const") {
            return Pyn::literal(c);
        }
        if let Some(e) = o.get("enum").and_then(Value::as_array) {
            let alts: Vec<String> = e.iter().map(Pyn::literal).collect();
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
            _ => return "pany".into(),
        };
        let mut alts = Vec::new();
        for t in types {
            alts.push(match t {
                "string" => "PSTR".to_owned(),
                "integer" => "PINT".to_owned(),
                "number" => "PNUM".to_owned(),
                "boolean" => "(\"True\" | \"False\")".to_owned(),
                "null" => "\"None\"".to_owned(),
                "object" => self.dict(schema),
                "array" => {
                    let item = match o.get("items") {
                        Some(items) => self.value(items),
                        None => "pany".to_owned(),
                    };
                    format!("\"[\" ({item} (COMMA {item})*)? \"]\"")
                }
                _ => "pany".to_owned(),
            });
        }
        if alts.is_empty() {
            return "pany".into();
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
            None => "pany".to_owned(),
        };
        self.rules.push_str(&format!("{name}: {body}\n"));
        name
    }

    /// A dict: its declared properties in schema order, the required ones
    /// always, the others optionally; any members where it declares none.
    fn dict(&mut self, schema: &Value) -> String {
        let props = schema.get("properties").and_then(Value::as_object);
        let Some(props) = props.filter(|p| !p.is_empty()) else { return "pdict".into() };
        let required = required(schema);
        let members: Vec<(bool, String)> = props
            .iter()
            .map(|(k, v)| {
                (
                    required.contains(&k.as_str()),
                    format!("{} COLON {}", Pyn::quoted(k), self.value(v)),
                )
            })
            .collect();
        let seq = self.members(&members);
        format!("\"{{\" {seq} \"}}\"")
    }

    /// Members in order, separated by commas, the required ones always,
    /// the others optionally.
    fn members(&mut self, members: &[(bool, String)]) -> String {
        let id = self.fresh();
        member_chain(&mut self.rules, &id, members, "COMMA ")
    }
}

/// Calls as Llama 4 writes them: a Python list `[NAME(KEY=VALUE, …), …]`,
/// after `<|python_start|>` (then optionally closed by `<|python_end|>`)
/// or bare. The keyword arguments are the schema's properties in order,
/// the required ones always, the others optionally (a tool without
/// properties takes none); values are Python literals as the schema says
/// (strings in either quote with `\\ \' \" \n \t \r` escapes, integers,
/// numbers, `True`, `False`, `None`, lists and dicts; `enum`, `const`,
/// `anyOf`, `oneOf`, local `$ref`s, `items`, nested `properties`; string
/// and number bounds, `minItems` and the like are not enforced; a dict
/// without declared properties takes any members). A tool whose name is
/// no dotted Python name, or that requires a property whose name is no
/// identifier, cannot be written: it is left out (no grammar when none is
/// left), as are optional properties without identifier names.
pub(crate) fn grammar(
    tools: &[crate::grammar::GrammarTool<'_>],
    special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    let mut g = Pyn { rules: String::new(), root: &Value::Null, refs: Vec::new(), n: 0 };
    g.base();
    let mut fns = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if !dotted_name(t.name) {
            continue;
        }
        let props = t.parameters.get("properties").and_then(Value::as_object);
        let required = required(t.parameters);
        let keyword = |k: &str| ident_len(k) == k.len() && !k.is_empty();
        if required.iter().any(|k| !keyword(k) && props.is_some_and(|p| p.contains_key(*k))) {
            continue;
        }
        g.root = t.parameters;
        g.refs.clear();
        let members: Vec<(bool, String)> = props
            .into_iter()
            .flatten()
            .filter(|(k, _)| keyword(k))
            .map(|(k, v)| {
                (
                    required.contains(&k.as_str()),
                    format!("{} {}", lit(&format!("{k}=")), g.value(v)),
                )
            })
            .collect();
        let args = if members.is_empty() { String::new() } else { g.members(&members) };
        g.rules.push_str(&format!("fn{i}: {} {args} \")\"\n", lit(&format!("{}(", t.name))));
        fns.push(format!("fn{i}"));
    }
    if fns.is_empty() {
        return None;
    }
    let mut rules = g.rules;
    let (start, end) = (special(PY_START), special(PY_END));
    rules.push_str(&format!("fn: {}\n", fns.join(" | ")));
    rules.push_str("WS: /[ \\n]{1,3}/\n");
    rules.push_str(&format!("one: {start} WS? \"[\" fn \"]\" (WS? {end})? | \"[\" fn \"]\"\n"));
    rules.push_str("list: \"[\" fn (COMMA fn)* \"]\"\n");
    rules.push_str(&format!("calls: {start} body | list\n"));
    rules.push_str(&format!("body: WS? list (WS? {end})?\n"));
    Some(crate::grammar::CallGrammar { rules, opener: PY_START.to_owned() })
}

/// A JSON value as a Python literal: strings double-quoted (escaping
/// backslashes, quotes and line breaks), `True`, `False`, `None`, lists
/// and dicts.
fn py_literal(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => out.push_str(&py_str(s, '"')),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Null => out.push_str("None"),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_literal(x, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&py_str(k, '"'));
                out.push_str(": ");
                py_literal(x, out);
            }
            out.push('}');
        }
    }
}

/// Calls as Llama 4 writes them (what [`grammar`] generates):
/// `<|python_start|>[NAME(KEY=VALUE, …), …]<|python_end|>`, the values
/// Python literals, the keywords in the order of the object (a key that
/// is no Python identifier cannot be a keyword: it is not read back).
pub(crate) fn write(calls: &[(&str, &Value)]) -> String {
    let mut out = format!("{PY_START}[");
    for (i, (name, args)) in calls.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(name);
        out.push('(');
        for (j, (k, v)) in args.as_object().into_iter().flatten().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            out.push_str(k);
            out.push('=');
            py_literal(v, &mut out);
        }
        out.push(')');
    }
    out.push(']');
    out.push_str(PY_END);
    out
}

#[cfg(test)]
mod tests {
    use crate::{Accumulator, FinishReason, Format, Options, Parser};

    const GEN: &str = "<|header_start|>assistant<|header_end|>\n\n";

    fn opts() -> Options {
        Options { generation_prompt: Some(GEN.to_owned()), ..Options::default() }
    }

    /// The grammar's verdicts on call lists (with `<|python_start|>` and
    /// `<|python_end|>` as text and as tokens of their own), and the
    /// parser's calls (name, arguments) for each accepted one.
    #[test]
    fn grammar_holds_literals_to_the_schema_and_the_parser() {
        use crate::grammar::{lit, GrammarTool};
        use serde_json::{json, Value};
        let f = json!({"type": "object", "properties": {
            "s": {"type": "string"}, "n": {"type": ["integer", "null"]},
            "x": {"type": "number"}, "b": {"type": "boolean"},
            "e": {"enum": ["a", "b'c"]},
            "l": {"type": "array", "items": {"$ref": "#/$defs/p"}},
            "d": {"type": "object"},
            "q&a": {"type": "string"}}, "required": ["s"],
            "$defs": {"p": {"type": "object", "properties": {"k": {"type": "string"},
                "v": {"type": "integer"}}, "required": ["v"]}}});
        let none = json!({"type": "object", "properties": {}});
        let odd = json!({"type": "object", "properties": {"q&a": {"type": "string"}},
            "required": ["q&a"]});
        let tools = [
            GrammarTool { name: "f", parameters: &f, text_bytes: None },
            GrammarTool { name: "ns.get_time", parameters: &none, text_bytes: None },
            GrammarTool { name: "odd", parameters: &odd, text_bytes: None },
            GrammarTool { name: "get-x", parameters: &none, text_bytes: None },
        ];
        let marks = [(super::PY_START, 250u32, "{B}"), (super::PY_END, 251, "{E}")];
        let as_token = |t: &str| {
            marks.iter().find(|m| m.0 == t).map_or_else(|| lit(t), |m| format!("<[{}]>", m.1))
        };
        let text_g = super::grammar(&tools, &|t: &str| lit(t)).expect("a grammar").rules;
        let tok_g = super::grammar(&tools, &as_token).expect("a grammar").rules;
        let cases: Vec<(&str, Option<Value>)> = vec![
            ("[f(s='x')]", Some(json!([["f", {"s": "x"}]]))),
            ("{B}[f(s=\"\")]{E}", Some(json!([["f", {"s": ""}]]))),
            (
                "{B}\n[f(s='a', n=None), ns.get_time()]\n{E}",
                Some(json!([["f", {"s": "a", "n": null}], ["ns.get_time", {}]])),
            ),
            (
                "{B}[ns.get_time(),ns.get_time()]",
                Some(json!([["ns.get_time", {}], ["ns.get_time", {}]])),
            ),
            (
                r#"[f(s="q\"'\\\n\t]) <|python_end|>", n=-3, x=1.5e-3, b=True, e='b\'c')]"#,
                Some(
                    json!([["f", {"s": "q\"'\\\n\t]) <|python_end|>", "n": -3, "x": 0.0015, "b": true, "e": "b'c"}]]),
                ),
            ),
            (
                r#"[f(s='', l=[{"k": 'z', "v": 0}, {'v': 2}], d={"a": [1, None, "c"], 'b': {}})]"#,
                Some(
                    json!([["f", {"s": "", "l": [{"k": "z", "v": 0}, {"v": 2}], "d": {"a": [1, null, "c"], "b": {}}}]]),
                ),
            ),
            // What the schema or the parser does not allow.
            ("[f()]", None),
            ("[f(n=1, s='a')]", None),
            ("[f(s='a', n=1.5)]", None),
            ("[f(s='a', x=1e999)]", None),
            ("[f(s='a', b=true)]", None),
            ("[f(s='a', e='c')]", None),
            ("[f(s=1)]", None),
            ("[f(s='a\nb')]", None),
            ("[f(s='a', l=[{'k': 'z'}])]", None),
            ("[f(s='a', z=1)]", None),
            ("[g()]", None),
            ("[odd()]", None),
            ("[get-x()]", None),
            ("[ns.get_time()]{E}", None),
            ("{B}[]{E}", None),
        ];
        for (text, want) in cases {
            let plain = marks.iter().fold(text.to_owned(), |t, m| t.replace(m.2, m.0));
            let bytes: Vec<u32> = plain.bytes().map(u32::from).collect();
            assert_eq!(
                crate::formats::testing::sentence(&text_g, &bytes),
                want.is_some(),
                "{plain:?}"
            );
            let toks = crate::formats::testing::tokens(text, &marks);
            assert_eq!(
                crate::formats::testing::sentence(&tok_g, &toks),
                want.is_some(),
                "tokens: {plain:?}"
            );
            if let Some(want) = want {
                let got = crate::formats::testing::whole_and_by_char(
                    Format::Llama4Pythonic,
                    &opts(),
                    &plain,
                    FinishReason::Stop,
                );
                let got: Vec<Value> = got
                    .calls
                    .iter()
                    .map(|c| {
                        let args: Value = serde_json::from_str(&c.arguments).expect("json");
                        json!([c.name, args])
                    })
                    .collect();
                assert_eq!(Value::from(got), want, "{plain:?}");
            }
        }
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
