//! Qwen XML calls: Qwen3-Coder (30B, 480B, Next) and Qwen3.5/3.6/3.8.
//!
//! ```text
//! <think>
//! The user wants the weather.
//! </think>
//!
//! Let me check.
//!
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! <parameter=days>
//! 3
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! Values are raw text. Exactly one newline on each side of a value is
//! markup; the rest (indentation, blank lines, trailing spaces) is data.
//! Values are typed by the tool's schema ([`crate::json::coerce`]: `3` is an
//! integer only where the schema says so; `True`/`null` are read too);
//! parameters the schema does not declare stay strings unless they are a
//! JSON object or array.
//!
//! A value ends at a `</parameter>` followed (after whitespace) by the next
//! `<parameter=`, `</function>` or `</tool_call>`, so the same tags written
//! inside a value are data. Missing tags are recovered as vLLM does: a value
//! also ends at `</function>` + `</tool_call>`, at `</tool_call>` + end (or a
//! new `<tool_call>`), and at a `<parameter=NAME>` that starts a line;
//! `</function>` may be missing before `</tool_call>`. Also accepted: values
//! without the wrapping newlines (`<parameter=k>v</parameter>`), several
//! `<function=…>` in one `<tool_call>`, a bare `<function=…>…</function>`
//! without `<tool_call>`, and a Hermes JSON body
//! (`<tool_call>{"name": …, "arguments": …}</tool_call>`).
//!
//! A prompt ending inside `<think>` starts the parser in reasoning. A call
//! written inside the reasoning (`<tool_call>` followed by `<function=`) is
//! parsed as a call; other `<tool_call>` text there stays reasoning. Under
//! the token limit an unclosed call is dropped; under a stop the call is kept
//! when it ended between parameters (the stop token may stand for the tags).

use super::hermes::call_from_object;
use super::keyed::KeyedCall;
use super::{prompt_thinks, text_step, AtMarker, Machine, Shown, Step, THINK, UNTHINK};
use crate::cx::Cx;
use crate::json::{self, Scan, ValueEnd};
use crate::scan::{find_first, follow, lead_any, starts_with, ws_len, Find, Follow, Lead};
use crate::{DropReason, FinishReason, Options};
use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FUNC: &str = "<function=";
const FUNC_END: &str = "</function>";
const PARAM: &str = "<parameter=";
const PARAM_END: &str = "</parameter>";

/// Markers recognised in content. A stray `</tool_call>` and turn tokens a
/// model should not write are stripped so they never show.
const CONTENT_MARKERS: [&str; 8] =
    [OPEN, FUNC, THINK, UNTHINK, CLOSE, "<|im_end|>", "<|im_start|>", "<|endoftext|>"];

/// Markers recognised in reasoning.
const REASONING_MARKERS: [&str; 5] = [UNTHINK, OPEN, "<|im_end|>", "<|im_start|>", "<|endoftext|>"];

/// Tags that may end a parameter value (each is checked by what follows it).
const VALUE_ENDS: [&str; 4] = [PARAM_END, FUNC_END, CLOSE, PARAM];

/// The longest function or parameter name waited for.
const NAME_MAX: usize = 256;

#[derive(Debug)]
pub(crate) enum State {
    Content,
    Reasoning,
    Call(Box<Call>),
}

#[derive(Debug)]
enum Phase {
    /// After `<tool_call>`: whitespace, then `<function=` (or a JSON body).
    Start,
    /// After `<function=`: the name up to `>`.
    Name,
    /// Between parameters: `<parameter=`, `</function>` or `</tool_call>`.
    Params,
    /// After `<parameter=`: the key up to `>`.
    Key,
    /// Inside the value of `key`; `scan`: the resume offset of the search for
    /// its end (relative to the value start).
    Value { key: String, scan: usize },
    /// A Hermes JSON body.
    Json(ValueEnd),
    /// After `</function>`: `</tool_call>` or another `<function=`.
    After,
    /// Invalid markup: everything up to `</tool_call>` is shown as content.
    Garbage,
}

#[derive(Debug)]
pub(crate) struct Call {
    /// Opened inside reasoning: the parser returns to reasoning afterwards.
    think: bool,
    /// Opened by `<tool_call>` (not a bare `<function=`).
    wrapped: bool,
    phase: Phase,
    /// The markup consumed so far, shown if the call turns out malformed.
    raw: String,
    /// A bare `<function=NAME>` not confirmed yet by what follows it.
    unconfirmed: Option<String>,
    /// The started call.
    call: Option<KeyedCall>,
}

impl Call {
    fn new(think: bool, wrapped: bool, opener: &str) -> Box<Call> {
        Box::new(Call {
            think,
            wrapped,
            phase: if wrapped { Phase::Start } else { Phase::Name },
            raw: opener.to_owned(),
            unconfirmed: None,
            call: None,
        })
    }

    fn eat(&mut self, s: &str) {
        self.raw.push_str(s);
    }

    fn start(&mut self, name: &str, cx: &mut Cx) {
        self.call = Some(KeyedCall::start(name, cx));
    }

    /// Adds one parameter value (raw text between the tags).
    fn add_param(&mut self, key: String, value: &str, cx: &mut Cx) {
        let Some(call) = &mut self.call else { return };
        let v = value.strip_prefix('\n').unwrap_or(value);
        let v = v.strip_suffix('\n').unwrap_or(v);
        let typed = json::coerce(v, cx.tools().types_of(call.name(), &key));
        call.replace(key, typed, cx);
    }

    /// Ends the open call with the arguments gathered.
    fn finish(&mut self, cx: &mut Cx) {
        if let Some(call) = self.call.take() {
            call.finish(cx);
        }
        self.raw.clear();
    }

    /// The markup is not a valid call: it is shown as content.
    fn fail(&mut self, extra: &str, cx: &mut Cx) {
        let mut raw = std::mem::take(&mut self.raw);
        raw.push_str(extra);
        if !self.wrapped && self.call.is_none() {
            // An unconfirmed bare `<function=`: plain text.
            cx.content(&raw);
        } else {
            self.call = None;
            cx.malformed(&raw);
        }
    }

    /// The text ended inside the call; `rest` is what was not consumed.
    fn unfinished(&mut self, rest: &str, end: Option<FinishReason>, cx: &mut Cx) {
        if end == Some(FinishReason::Length) {
            self.call = None;
            cx.drop_call(DropReason::Truncated);
        } else if self.call.is_some() && matches!(self.phase, Phase::Params | Phase::After) {
            self.finish(cx);
        } else {
            self.fail(rest, cx);
        }
    }

    /// Invalid markup at `pos`.
    fn garbage(&mut self, pos: usize, cx: &mut Cx) -> Option<(usize, bool)> {
        if self.wrapped {
            self.phase = Phase::Garbage;
            None
        } else {
            // A bare `<function=` that is not a call: its text is content.
            self.fail("", cx);
            Some((pos, true))
        }
    }

    /// Runs the call's phases over `input`; returns the bytes consumed and
    /// whether the call is over.
    fn run(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> (usize, bool) {
        let eof = end.is_some();
        let mut pos = 0;
        loop {
            let rest = &input[pos..];
            match &mut self.phase {
                Phase::Start => {
                    let ws = ws_len(rest);
                    self.eat(&rest[..ws]);
                    pos += ws;
                    let t = &rest[ws..];
                    match lead_any(t, &[FUNC], eof) {
                        Lead::Is(_) => {
                            self.eat(FUNC);
                            pos += FUNC.len();
                            self.phase = Phase::Name;
                        }
                        Lead::More => return (pos, false),
                        Lead::No if t.is_empty() => {
                            self.unfinished(t, end, cx);
                            return (input.len(), true);
                        }
                        Lead::No if t.starts_with('{') => {
                            self.phase = Phase::Json(ValueEnd::default())
                        }
                        Lead::No => self.phase = Phase::Garbage,
                    }
                }
                Phase::Name | Phase::Key => match rest.find(['>', '\n', '<']) {
                    // A name is accepted only within NAME_MAX bytes, as
                    // it is waited for, whatever the deltas.
                    Some(i)
                        if rest.as_bytes()[i] == b'>'
                            && i <= NAME_MAX
                            && !rest[..i].trim().is_empty() =>
                    {
                        let name = rest[..i].trim().to_owned();
                        self.eat(&rest[..=i]);
                        pos += i + 1;
                        if matches!(self.phase, Phase::Name) {
                            // A bare `<function=NAME>` is reported once a
                            // parameter or `</function>` confirms it.
                            if self.wrapped {
                                self.start(&name, cx);
                            } else {
                                self.unconfirmed = Some(name);
                            }
                            self.phase = Phase::Params;
                        } else {
                            self.phase = Phase::Value { key: name, scan: 0 };
                        }
                    }
                    None if rest.len() <= NAME_MAX && !eof => return (pos, false),
                    None if rest.len() <= NAME_MAX => {
                        self.unfinished(rest, end, cx);
                        return (input.len(), true);
                    }
                    _ => {
                        if let Some(r) = self.garbage(pos, cx) {
                            return r;
                        }
                    }
                },
                Phase::Params | Phase::After => {
                    let after = matches!(self.phase, Phase::After);
                    let ws = ws_len(rest);
                    self.eat(&rest[..ws]);
                    pos += ws;
                    let t = &rest[ws..];
                    let lits: &[&str] =
                        if after { &[CLOSE, FUNC] } else { &[PARAM, FUNC_END, CLOSE] };
                    let lead = lead_any(t, lits, eof);
                    if let Lead::Is(_) = lead {
                        if let Some(name) = self.unconfirmed.take() {
                            self.start(&name, cx);
                        }
                    }
                    match (after, lead) {
                        (_, Lead::More) => return (pos, false),
                        (_, Lead::No) if t.is_empty() => {
                            self.unfinished(t, end, cx);
                            return (input.len(), true);
                        }
                        (false, Lead::Is(0)) => {
                            self.eat(PARAM);
                            pos += PARAM.len();
                            self.phase = Phase::Key;
                        }
                        (false, Lead::Is(1)) => {
                            self.eat(FUNC_END);
                            pos += FUNC_END.len();
                            self.phase = Phase::After;
                        }
                        (false, Lead::Is(_)) | (true, Lead::Is(0)) => {
                            // `</tool_call>` (after `</function>`, or without it).
                            self.finish(cx);
                            return (pos + CLOSE.len(), true);
                        }
                        (true, Lead::Is(_)) => {
                            // Another function in the same block.
                            self.finish(cx);
                            self.eat(FUNC);
                            pos += FUNC.len();
                            self.phase = Phase::Name;
                        }
                        (true, Lead::No) => {
                            // Text after `</function>`: the call is complete,
                            // the text is content.
                            self.finish(cx);
                            return (pos, true);
                        }
                        (false, Lead::No) => {
                            if let Some(r) = self.garbage(pos, cx) {
                                return r;
                            }
                        }
                    }
                }
                Phase::Value { key, scan } => loop {
                    match find_first(&rest[*scan..], &VALUE_ENDS, eof) {
                        Find::Found { at, idx } => {
                            let abs = *scan + at;
                            let tag = VALUE_ENDS[idx];
                            let after = &rest[abs + tag.len()..];
                            let verdict = match tag {
                                PARAM_END => follow(after, &[PARAM, FUNC_END, CLOSE], eof),
                                FUNC_END => follow(after, &[CLOSE, FUNC], eof),
                                CLOSE => follow(after, &[OPEN], eof),
                                _ => param_at_line_start(&rest[..abs], after, eof),
                            };
                            match verdict {
                                Follow::Accept => {
                                    let key = std::mem::take(key);
                                    let value = &rest[..abs];
                                    self.eat(value);
                                    self.add_param(key, value, cx);
                                    pos += abs;
                                    if tag == PARAM_END {
                                        self.eat(PARAM_END);
                                        pos += PARAM_END.len();
                                    }
                                    self.phase = Phase::Params;
                                    break;
                                }
                                Follow::Wait => {
                                    *scan = abs;
                                    return (pos, false);
                                }
                                Follow::Reject => *scan = abs + 1,
                            }
                        }
                        Find::Clear { safe } => {
                            *scan += safe;
                            if eof {
                                self.unfinished(rest, end, cx);
                                return (input.len(), true);
                            }
                            return (pos, false);
                        }
                    }
                },
                Phase::Json(scan) => match scan.scan(rest) {
                    Scan::Done(e) => match call_from_object(&rest[..e]) {
                        Some((name, args)) => {
                            self.eat(&rest[..e]);
                            pos += e;
                            self.start(&name, cx);
                            if let Some(call) = &mut self.call {
                                for (k, v) in json::strict_object(&args).unwrap_or_default() {
                                    call.replace(k, v, cx);
                                }
                            }
                            self.phase = Phase::After;
                        }
                        None => self.phase = Phase::Garbage,
                    },
                    Scan::Partial if !eof => return (pos, false),
                    Scan::Partial => {
                        self.unfinished(rest, end, cx);
                        return (input.len(), true);
                    }
                    Scan::Invalid => self.phase = Phase::Garbage,
                },
                Phase::Garbage => match find_first(rest, &[CLOSE], eof) {
                    Find::Found { at, .. } => {
                        let used = at + CLOSE.len();
                        self.fail(&rest[..used], cx);
                        return (pos + used, true);
                    }
                    Find::Clear { safe } => {
                        self.eat(&rest[..safe]);
                        pos += safe;
                        if eof {
                            self.unfinished(&rest[safe..], end, cx);
                            return (input.len(), true);
                        }
                        return (pos, false);
                    }
                },
            }
        }
    }
}

/// A `<parameter=` inside a value starts the next parameter (the value's
/// `</parameter>` is missing) only at a line start and with a name and `>`.
fn param_at_line_start(before: &str, after: &str, eof: bool) -> Follow {
    if !before.ends_with('\n') {
        return Follow::Reject;
    }
    match after.find(['>', '\n', '<']) {
        Some(i)
            if after.as_bytes()[i] == b'>' && i <= NAME_MAX && !after[..i].trim().is_empty() =>
        {
            Follow::Accept
        }
        None if after.len() <= NAME_MAX && !eof => Follow::Wait,
        _ => Follow::Reject,
    }
}

#[derive(Debug)]
pub(crate) struct Qwen3Xml {
    state: State,
}

impl Qwen3Xml {
    pub(crate) fn new(opts: &Options) -> Qwen3Xml {
        let state = if prompt_thinks(opts) { State::Reasoning } else { State::Content };
        Qwen3Xml { state }
    }
}

impl Machine for Qwen3Xml {
    type State = State;

    fn state(&self) -> &State {
        &self.state
    }

    fn step(&mut self, input: &str, end: Option<FinishReason>, cx: &mut Cx) -> Step {
        let eof = end.is_some();
        match &mut self.state {
            State::Reasoning => {
                text_step(input, &REASONING_MARKERS, eof, cx, Shown::Reasoning, |tag, after| {
                    match tag {
                        OPEN => {
                            let ahead = starts_with(&after[ws_len(after)..], FUNC, eof);
                            AtMarker::opener_in_reasoning(ahead, || {
                                self.state = State::Call(Call::new(true, true, OPEN));
                            })
                        }
                        UNTHINK => {
                            self.state = State::Content;
                            AtMarker::Markup
                        }
                        _ => AtMarker::Markup,
                    }
                })
            }
            State::Content => {
                text_step(input, &CONTENT_MARKERS, eof, cx, Shown::Content, |tag, _| {
                    match tag {
                        OPEN => self.state = State::Call(Call::new(false, true, OPEN)),
                        // Not markup until the call is confirmed.
                        FUNC => self.state = State::Call(Call::new(false, false, FUNC)),
                        THINK => self.state = State::Reasoning,
                        _ => {}
                    }
                    AtMarker::Markup
                })
            }
            State::Call(call) => {
                let (used, done) = call.run(input, end, cx);
                if !done {
                    return Step::up_to(used);
                }
                self.state = if call.think { State::Reasoning } else { State::Content };
                Step::moved(used)
            }
        }
    }

    fn held(&self) -> usize {
        match &self.state {
            State::Call(call) => call.raw.len(),
            State::Content | State::Reasoning => 0,
        }
    }

    fn overflow(&mut self, text: &str, cx: &mut Cx) {
        match &self.state {
            // An unconfirmed bare `<function=`: plain text.
            State::Call(call) if !call.wrapped && call.call.is_none() => cx.content(text),
            _ => cx.malformed(text),
        }
        self.state = State::Content;
    }
}

/// The most tokens a grammar lets a model write in one text value (with
/// the markup around it in the same lexeme).
pub(crate) const TEXT_MAX: usize = 8192;

/// How a format that writes values as bare text (the XML-style formats)
/// writes one parameter, so that [`json::coerce`] (with the types the
/// parser reads from the same schema) gives a value the schema allows.
#[derive(Debug, Clone)]
pub(crate) enum ValueForm {
    /// One of these texts (a string enum or const).
    Choice(Vec<String>),
    /// Free text (a string, or a type list with `string`: any text reads
    /// back as one of the types). Length bounds are not enforced.
    Text,
    /// JSON text valid against this schema (`%json`), or one of the
    /// Python literals the parser reads too (`True`, `False`, `None`).
    Json(Value, Vec<&'static str>),
}

/// Whether a parameter schema constrains nothing (only annotations).
fn unconstrained(prop: &Value) -> bool {
    prop.as_object().is_some_and(|o| {
        o.keys().all(|k| {
            matches!(k.as_str(), "description" | "title" | "default" | "examples" | "$comment")
        })
    })
}

/// The form of parameter `key` (schema `prop`) of a tool whose arguments
/// schema is `params`. `undeclared_any`: the parser reads a value whose
/// types the schema does not declare as any JSON (else only a JSON object
/// or array is read as JSON, other text stays a string).
pub(crate) fn value_form(
    params: &Value,
    key: &str,
    prop: &Value,
    undeclared_any: bool,
) -> ValueForm {
    use crate::json::JsonType;
    let spec = crate::ToolSpec::from_json_schema("", params);
    let types = spec.types_of(key);
    let strings = |v: &Value| -> Option<Vec<String>> {
        v.as_array()?.iter().map(|x| x.as_str().map(str::to_owned)).collect()
    };
    if types == [JsonType::String] {
        if let Some(c) = prop.get("const").and_then(Value::as_str) {
            return ValueForm::Choice(vec![c.to_owned()]);
        }
        if let Some(e) = prop.get("enum").and_then(strings) {
            return ValueForm::Choice(e);
        }
    }
    if types.contains(&JsonType::String) || (types.is_empty() && unconstrained(prop)) {
        return ValueForm::Text;
    }
    // The Python literals `json::coerce` reads for a plain declared type.
    let mut python = Vec::new();
    if prop.get("enum").is_none() && prop.get("const").is_none() {
        if types.contains(&JsonType::Boolean) {
            python.extend(["True", "False"]);
        }
        if types.contains(&JsonType::Null) {
            python.push("None");
        }
    }
    // JSON: the property's schema, with the tool's definitions it may refer to.
    let mut schema = prop.clone();
    if let (Value::Object(o), Some(p)) = (&mut schema, params.as_object()) {
        for defs in ["$defs", "definitions"] {
            if let (Some(d), false) = (p.get(defs), o.contains_key(defs)) {
                o.insert(defs.to_owned(), d.clone());
            }
        }
    }
    if types.is_empty() && !undeclared_any {
        schema = serde_json::json!({"allOf": [schema], "type": ["object", "array"]});
    }
    ValueForm::Json(schema, python)
}

/// `s` as literal text inside a Lark `/regex/`.
pub(crate) fn rx(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            _ => out.push(c),
        }
    }
    out
}

/// A Lark terminal body for `open` + free text + `close`, where the whole lexeme holds no match of any of the regexes
/// `forbidden` (what the parser would take for the end of the value).
pub(crate) fn text_terminal(open: &str, body: &str, close: &str, forbidden: &[&str]) -> String {
    format!("/{}{body}{}/ & ~/(?s:.*)({})(?s:.*)/", rx(open), rx(close), forbidden.join("|"))
}

/// One declared parameter of a tool.
pub(crate) struct Prop<'a> {
    pub(crate) key: &'a str,
    pub(crate) required: bool,
    pub(crate) schema: &'a Value,
}

/// The declared parameters of a tool (its schema's `properties`, in
/// order; none when it has none).
pub(crate) fn props(params: &Value) -> Vec<Prop<'_>> {
    let required: Vec<&str> = params
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    params
        .get("properties")
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .map(|(key, schema)| Prop {
                    key,
                    required: required.contains(&key.as_str()),
                    schema,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The Lark expression for one value of `prop` (of a tool whose arguments
/// schema is `params`) written between `open` and `close`, its terminal or
/// rules (named after `id`) added to `rules`. A text value, with `open` and
/// `close`, holds no match of any of the regexes `forbidden` (what the
/// parser would take for the end of the value).
#[allow(clippy::too_many_arguments)]
pub(crate) fn value_expr(
    id: &str,
    tool: &crate::grammar::GrammarTool<'_>,
    params: &Value,
    prop: &Prop<'_>,
    undeclared_any: bool,
    open: &str,
    close: &str,
    forbidden: &[&str],
    rules: &mut String,
) -> String {
    use crate::grammar::{bounded, lit};
    match value_form(params, prop.key, prop.schema, undeclared_any) {
        ValueForm::Choice(c) => {
            let alts: Vec<String> = c.iter().map(|c| lit(&format!("{open}{c}{close}"))).collect();
            format!("({})", alts.join(" | "))
        }
        ValueForm::Text => {
            let t = text_terminal(open, &tool.text_body(0), close, forbidden);
            let up = id.to_uppercase();
            rules.push_str(&format!("V{up}: {t}\n"));
            rules.push_str(&format!("v{id}[max_tokens={TEXT_MAX}]: V{up}\n"));
            format!("v{id}")
        }
        ValueForm::Json(schema, python) => {
            rules.push_str(&format!("j{id}: %json {}\n", bounded(crate::grammar::closed(schema))));
            let mut alts = vec![format!("j{id}")];
            alts.extend(python.iter().map(|p| lit(p)));
            format!("{} ({}) {}", lit(open), alts.join(" | "), lit(close))
        }
    }
}

/// The properties' parameters in schema order, required ones always,
/// optional ones optionally (`p[k]` is the expression of parameter `k`).
pub(crate) fn in_order(props: &[Prop<'_>], p: &[String]) -> String {
    let seq: Vec<String> = props
        .iter()
        .zip(p)
        .map(|(prop, p)| if prop.required { p.clone() } else { format!("({p})?") })
        .collect();
    seq.join(" ")
}

/// Calls as Qwen3-Coder writes them: `<tool_call>\n<function=NAME>\n`,
/// each parameter as `<parameter=KEY>\nVALUE\n</parameter>\n` (the
/// properties in schema order, optional ones optional; a tool without
/// properties takes none), then `</function>\n</tool_call>`. A string
/// value is raw text that holds nothing the parser would take for its end
/// (a closing tag followed by a tag, `<parameter=` at a line start); other
/// values are JSON (strings inside them are not checked for those tags).
pub(crate) fn grammar(
    tools: &[crate::grammar::GrammarTool<'_>],
    _special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    use crate::grammar::{alternatives, lit};
    // What would end a value early (the value's own `</parameter>` is
    // last in its lexeme, followed by nothing there).
    let forbidden =
        ["<\\/parameter>\\s*<", "<\\/function>\\s*<", "<\\/tool_call>\\s*<", "\\n<parameter="];
    let mut rules = String::new();
    let mut params = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let props = props(t.parameters);
        let mut p = Vec::new();
        for (k, prop) in props.iter().enumerate() {
            let id = format!("{i}_{k}");
            let v = value_expr(
                &id,
                t,
                t.parameters,
                prop,
                false,
                "\n",
                "\n</parameter>\n",
                &forbidden,
                &mut rules,
            );
            p.push(format!("{} {v}", lit(&format!("<parameter={}>", prop.key))));
        }
        params.push(in_order(&props, &p));
    }
    rules.push_str(&alternatives(tools, |i, t| {
        let name = lit(&format!("<function={}>\n", t.name));
        format!("{name} {} {}", params[i], lit("</function>\n"))
    }));
    let (open, close) = (lit(OPEN), lit(CLOSE));
    rules.push_str("NL: /\\n{1,2}/\n");
    rules.push_str(&format!("call: {open} \"\\n\" fn {close}\n"));
    rules.push_str("one: call\n");
    rules.push_str("calls: call (NL? call)*\n");
    rules.push_str(&format!("body: \"\\n\" fn {close} (NL? call)*\n"));
    Some(crate::grammar::CallGrammar { rules, opener: OPEN.to_owned() })
}

/// A parameter value as the XML-style formats write it: a string raw,
/// any other value as JSON (the schema types it back).
pub(crate) fn raw_or_json(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Calls as Qwen3-Coder writes them (what [`grammar`] generates):
/// `<tool_call>\n<function=NAME>\n`, each argument as
/// `<parameter=KEY>\nVALUE\n</parameter>\n` in the order of the object
/// (a string raw, other values as JSON), then `</function>\n</tool_call>`;
/// the calls separated by a newline. A string holding what would end its
/// value early (a closing tag followed by a tag) is not read back whole.
pub(crate) fn write(calls: &[(&str, &Value)]) -> String {
    let calls: Vec<String> = calls
        .iter()
        .map(|(name, args)| {
            let mut s = format!("{OPEN}\n<function={name}>\n");
            for (k, v) in args.as_object().into_iter().flatten() {
                s.push_str(&format!("<parameter={k}>\n{}\n</parameter>\n", raw_or_json(v)));
            }
            s.push_str("</function>\n");
            s.push_str(CLOSE);
            s
        })
        .collect();
    calls.join("\n")
}

#[cfg(test)]
mod tests {
    use crate::{Accumulator, FinishReason, Format, JsonType, Options, Parser, ToolSpec, Tools};

    fn opts(gen: Option<&str>) -> Options {
        use JsonType::*;
        let tools = Tools(vec![
            ToolSpec::new("get_weather").param("city", &[String]).param("days", &[Integer]),
            ToolSpec::new("write_file").param("path", &[String]).param("content", &[String]),
            ToolSpec::new("set").param("on", &[Boolean]).param("label", &[String, Null]),
        ]);
        Options { generation_prompt: gen.map(str::to_owned), tools, ..Options::default() }
    }

    /// Bare `<function=` text that is no call is reported as content only,
    /// as it streams (no call is started and dropped).
    #[test]
    fn bare_function_text_that_is_no_call_is_only_content() {
        for t in ["a <function=x is not a call", "Write <function=NAME> tags, see."] {
            let mut p = crate::Parser::new(Format::Qwen3Xml, opts(None));
            let events = p.push(t);
            assert!(events.iter().all(|e| matches!(e, crate::Event::Content(_))), "{events:?}");
        }
    }

    #[test]
    fn long_values_stay_linear() {
        let body = "x".repeat(200_000);
        let t = format!("<tool_call>\n<function=write_file>\n<parameter=content>\n{body}\n</parameter>\n</function>\n</tool_call>");
        let mut p = Parser::new(Format::Qwen3Xml, opts(None));
        let mut acc = Accumulator::default();
        for ch in t.as_bytes().chunks(1) {
            acc.extend(p.push(std::str::from_utf8(ch).unwrap_or("")));
        }
        acc.extend(p.finish(FinishReason::Stop));
        assert_eq!(acc.calls.len(), 1);
    }

    #[test]
    fn random_markup_never_panics_and_ignores_splits() {
        let toks = [
            "<tool_call>",
            "</tool_call>",
            "<function=",
            "</function>",
            "<parameter=",
            "</parameter>",
            "<think>",
            "</think>",
            "<|im_end|>",
            "get_weather>",
            "city>",
            "\n",
            " ",
            "Paris",
            "3",
            "{\"a\": [1]}",
            ">",
            "<",
            "é🌸",
            "\\n",
        ];
        crate::formats::testing::random_markup(
            Format::Qwen3Xml,
            &toks,
            &[None, Some("<think>")],
            &opts,
            400,
            24,
        );
    }
}
