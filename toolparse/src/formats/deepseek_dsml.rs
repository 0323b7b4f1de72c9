//! DeepSeek DSML calls: V3.2 (`<｜DSML｜function_calls>`), V4
//! (`<｜DSML｜tool_calls>`) and V4.1 (`<｜DSML｜ calls>`, with `<｜DSML｜ invoke`
//! and `<｜DSML｜ parameter` spelled with a space). The text around them is
//! [`super::deepseek`].
//!
//! ```text
//! I'll look it up.
//!
//! <｜DSML｜function_calls>
//! <｜DSML｜invoke name="search">
//! <｜DSML｜parameter name="query" string="true">café "best"</｜DSML｜parameter>
//! <｜DSML｜parameter name="filters" string="false">{"max": 3}</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! <｜DSML｜invoke name="get_time"/>
//! </｜DSML｜function_calls>
//! ```
//!
//! Each `invoke` becomes a call when its close tag arrives (so a reply cut
//! inside the second invoke keeps the first); a self-closing invoke
//! (`<｜DSML｜invoke name="f"/>`) is a call without arguments, and a
//! self-closing parameter has an empty value. `string="true"` values are raw
//! text, verbatim (typed by the tool schema only when it rules out a
//! string); `string="false"` values are JSON (a value that is not JSON, or a
//! parameter without the attribute, is typed by the tool schema). A value
//! ends only at its `</｜DSML｜parameter>`, so tag text inside it is kept; a
//! repeated parameter makes the invoke malformed. Any of the three block
//! names and both tag spellings are accepted in every DSML sub-format; an
//! invoke body that is a JSON object (instead of parameters) is accepted as
//! the arguments.

use super::deepseek::{self, call_done, fail, unfinished, Block, Grammar, State, EOS, TAG_CAP};
use super::keyed::KeyedCall;
use super::Step;
use crate::cx::Cx;
use crate::json::{self, JsonType, ValueEnd};
use crate::scan::{find_first, lead_any, push_capped, ws_len, Find, Lead};
use crate::FinishReason;
use serde_json::Value;

/// The block openers of the three sub-formats.
pub(super) const OPENS: [&str; 3] =
    ["<｜DSML｜function_calls>", "<｜DSML｜tool_calls>", "<｜DSML｜ calls>"];
/// Their close tags.
pub(super) const CLOSES: [&str; 3] =
    ["</｜DSML｜function_calls>", "</｜DSML｜tool_calls>", "</｜DSML｜ calls>"];

/// Markers stripped where they show outside a block.
pub(super) const STRAY: [&str; 8] = [
    CLOSES[0],
    CLOSES[1],
    CLOSES[2],
    PLAIN.invoke_close,
    PLAIN.param_close,
    SPACED.invoke_close,
    SPACED.param_close,
    "｜DSML｜",
];

/// The tag spellings of one DSML invoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Style {
    pub(super) invoke: &'static str,
    pub(super) invoke_close: &'static str,
    param: &'static str,
    param_close: &'static str,
}

/// V3.2 and V4.
pub(super) const PLAIN: Style = Style {
    invoke: "<｜DSML｜invoke",
    invoke_close: "</｜DSML｜invoke>",
    param: "<｜DSML｜parameter",
    param_close: "</｜DSML｜parameter>",
};

/// V4.1: tag names with a leading space.
pub(super) const SPACED: Style = Style {
    invoke: "<｜DSML｜ invoke",
    invoke_close: "</｜DSML｜ invoke>",
    param: "<｜DSML｜ parameter",
    param_close: "</｜DSML｜ parameter>",
};

fn style_of(block: &Block) -> Style {
    match block.grammar {
        Grammar::Dsml(style) => style,
        Grammar::V3 => PLAIN,
    }
}

/// Between the invokes of a block.
pub(super) fn between(
    block: Block,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (Step, State) {
    let markers: (&[&str], &[&str]) =
        (&[PLAIN.invoke, SPACED.invoke], &[CLOSES[0], CLOSES[1], CLOSES[2], EOS]);
    deepseek::between(block, input, end, cx, markers, |mut block, i| {
        block.grammar = Grammar::Dsml(if i == 1 { SPACED } else { PLAIN });
        State::InvokeTag { block, tag: String::new() }
    })
}

/// A complete tag's text: its attributes and whether it closes itself
/// (`<…/>`).
fn self_closing(tag: &str) -> (&str, bool) {
    let t = tag.trim_end();
    match t.strip_suffix('/') {
        Some(attrs) => (attrs, true),
        None => (t, false),
    }
}

/// How far the text of a tag was read.
enum TagRead {
    /// The tag is whole; the bytes taken with its `>`.
    Whole(usize),
    /// Part of it was taken; it goes on.
    Part(usize),
    Wait,
    /// The text ended inside it, after these bytes.
    Cut(usize),
    /// Not a tag (too long, or a `<` inside) after these bytes.
    Bad(usize),
}

/// Reads the attributes of a tag up to `>` into `tag` (and the block's
/// markup).
fn tag_text(
    block: &mut Block,
    tag: &mut String,
    input: &str,
    end: Option<FinishReason>,
) -> TagRead {
    let eof = end.is_some();
    let (text, found) = match find_first(input, &[">", "<"], eof) {
        Find::Found { at, idx } => (&input[..at], Some(idx)),
        Find::Clear { safe } => (&input[..safe], None),
    };
    if found.is_none() && eof {
        block.raw.push_str(text);
        return TagRead::Cut(text.len());
    }
    let r = push_capped(tag, text, TAG_CAP);
    block.raw.push_str(&text[..r.err().unwrap_or(text.len())]);
    match (r, found) {
        (Err(k), _) => TagRead::Bad(k),
        (Ok(()), Some(0)) => {
            block.raw.push('>');
            TagRead::Whole(text.len() + 1)
        }
        (Ok(()), Some(_)) => TagRead::Bad(text.len()),
        (Ok(()), None) if text.is_empty() => TagRead::Wait,
        (Ok(()), None) => TagRead::Part(text.len()),
    }
}

/// The attributes of an invoke tag, up to `>`.
pub(super) fn invoke_tag(
    mut block: Block,
    mut tag: String,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (Step, State) {
    match tag_text(&mut block, &mut tag, input, end) {
        TagRead::Wait => (Step::Wait, State::InvokeTag { block, tag }),
        TagRead::Part(n) => (Step::took(n), State::InvokeTag { block, tag }),
        TagRead::Cut(n) => (Step::moved(n), unfinished(block, end, cx)),
        TagRead::Bad(n) => (Step::moved(n), fail(block, cx)),
        TagRead::Whole(n) => {
            let (attrs, closed) = self_closing(&tag);
            let name =
                attributes(attrs).and_then(|a| attr(&a, "name").map(str::trim).map(str::to_owned));
            match name {
                Some(name) if !name.is_empty() => {
                    let call = KeyedCall::start(&name, cx);
                    if closed {
                        call.finish(cx);
                        return (Step::took(n), call_done(block));
                    }
                    (Step::took(n), State::Body { block, call })
                }
                _ => (Step::took(n), fail(block, cx)),
            }
        }
    }
}

/// The attributes of a parameter tag, up to `>`.
pub(super) fn param_tag(
    mut block: Block,
    call: KeyedCall,
    mut tag: String,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (Step, State) {
    match tag_text(&mut block, &mut tag, input, end) {
        TagRead::Wait => (Step::Wait, State::ParamTag { block, call, tag }),
        TagRead::Part(n) => (Step::took(n), State::ParamTag { block, call, tag }),
        TagRead::Cut(n) => (Step::moved(n), unfinished(block, end, cx)),
        TagRead::Bad(n) => (Step::moved(n), fail(block, cx)),
        TagRead::Whole(n) => {
            let (attrs, closed) = self_closing(&tag);
            let Some(attrs) = attributes(attrs) else { return (Step::took(n), fail(block, cx)) };
            let Some(key) = attr(&attrs, "name").filter(|k| !call.has(k)) else {
                return (Step::took(n), fail(block, cx));
            };
            let key = key.to_owned();
            let string = match attr(&attrs, "string") {
                Some("true") => Some(true),
                Some("false") => Some(false),
                _ => None,
            };
            if closed {
                let mut call = call;
                add_param(&mut call, key, string, "", cx);
                return (Step::took(n), State::Body { block, call });
            }
            (Step::took(n), State::Value { block, call, key, string, value: String::new() })
        }
    }
}

/// Inside an invoke, between parameters.
pub(super) fn body(
    mut block: Block,
    call: KeyedCall,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (Step, State) {
    let eof = end.is_some();
    let ws = ws_len(input);
    if ws > 0 {
        block.raw.push_str(&input[..ws]);
        return (Step::took(ws), State::Body { block, call });
    }
    if input.is_empty() {
        return if eof {
            (Step::Transition, unfinished(block, end, cx))
        } else {
            (Step::Wait, State::Body { block, call })
        };
    }
    let style = style_of(&block);
    let lits = [style.param, style.invoke_close, "{"];
    let n = if call.is_empty() { 3 } else { 2 };
    match lead_any(input, &lits[..n], eof) {
        Lead::More => (Step::Wait, State::Body { block, call }),
        Lead::Is(0) => {
            block.raw.push_str(style.param);
            (Step::took(style.param.len()), State::ParamTag { block, call, tag: String::new() })
        }
        Lead::Is(1) => {
            block.raw.push_str(style.invoke_close);
            call.finish(cx);
            (Step::took(style.invoke_close.len()), call_done(block))
        }
        Lead::Is(_) => {
            // The invoke body is a JSON object: its own end decides.
            (
                Step::Transition,
                State::Json { block, json: String::new(), scan: ValueEnd::default() },
            )
        }
        Lead::No => (Step::Transition, fail(block, cx)),
    }
}

/// A parameter value, up to its close tag.
#[allow(clippy::too_many_arguments)]
pub(super) fn value(
    mut block: Block,
    mut call: KeyedCall,
    key: String,
    string: Option<bool>,
    mut value: String,
    input: &str,
    end: Option<FinishReason>,
    cx: &mut Cx,
) -> (Step, State) {
    let eof = end.is_some();
    let close = style_of(&block).param_close;
    match find_first(input, &[close], eof) {
        Find::Found { at, .. } => {
            value.push_str(&input[..at]);
            block.raw.push_str(&input[..at + close.len()]);
            add_param(&mut call, key, string, &value, cx);
            (Step::took(at + close.len()), State::Body { block, call })
        }
        Find::Clear { safe } => {
            value.push_str(&input[..safe]);
            block.raw.push_str(&input[..safe]);
            if eof {
                return (Step::moved(safe), unfinished(block, end, cx));
            }
            (Step::up_to(safe), State::Value { block, call, key, string, value })
        }
    }
}

/// Types a value by its `string` attribute and the tool schema, and adds it.
fn add_param(call: &mut KeyedCall, key: String, string: Option<bool>, value: &str, cx: &mut Cx) {
    let types = cx.tools().types_of(call.name(), &key);
    let v = match string {
        // Raw text, unless the schema rules out a string (the model marked
        // a number or flag as a string).
        Some(true) if !types.is_empty() && !types.contains(&JsonType::String) => {
            json::coerce(value, types)
        }
        Some(true) => Value::String(value.to_owned()),
        Some(false) => {
            json::strict_value(value.trim()).unwrap_or_else(|_| json::coerce(value, types))
        }
        None => json::coerce(value, types),
    };
    // A repeated key was refused at its tag.
    let _ = call.insert(key, v, cx);
}

/// `key="value"` pairs of a tag; `None` when the text is not only that.
fn attributes(tag: &str) -> Option<Vec<(&str, &str)>> {
    let mut out = Vec::new();
    let mut s = tag.trim();
    while !s.is_empty() {
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return None;
        }
        let r = s[eq + 1..].trim_start();
        let q = r.chars().next()?;
        if q != '"' && q != '\'' {
            return None;
        }
        let len = r[1..].find(q)?;
        out.push((key, &r[1..1 + len]));
        s = r[1 + len + 1..].trim_start();
    }
    Some(out)
}

fn attr<'a>(attrs: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    attrs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// Calls as the DSML templates write them: the block (`function_calls`,
/// `tool_calls` or ` calls`, by sub-format) with one invoke per line, each
/// parameter on its line as `<｜DSML｜parameter name="KEY"
/// string="true">TEXT</｜DSML｜parameter>` for a string (raw text without
/// the close tag) or `string="false">JSON` for other values (the
/// properties in schema order, optional ones optional); an invoke without
/// parameters may close itself. Strings inside JSON values are not
/// checked for the close tag.
pub(crate) fn grammar(
    format: crate::Format,
    tools: &[crate::grammar::GrammarTool<'_>],
    _special: crate::grammar::Special<'_>,
) -> Option<crate::grammar::CallGrammar> {
    use super::qwen3_xml::{in_order, props, rx, value_expr, value_form, ValueForm};
    use crate::grammar::lit;
    use crate::Format;
    let (open, close, style) = match format {
        Format::DeepSeekV32 => (OPENS[0], CLOSES[0], PLAIN),
        Format::DeepSeekV4 => (OPENS[1], CLOSES[1], PLAIN),
        Format::DeepSeekV41 => (OPENS[2], CLOSES[2], SPACED),
        _ => return None,
    };
    let forbidden = [format!("{}(?s:.)", rx(style.param_close))];
    let forbidden: Vec<&str> = forbidden.iter().map(String::as_str).collect();
    let mut rules = String::new();
    let mut fns = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let props = props(t.parameters);
        let mut p = Vec::new();
        for (k, prop) in props.iter().enumerate() {
            let string = !matches!(
                value_form(t.parameters, prop.key, prop.schema, true),
                ValueForm::Json(..)
            );
            let tag = format!("{} name=\"{}\" string=\"{string}\">", style.param, prop.key);
            let v = value_expr(
                &format!("{i}_{k}"),
                t,
                t.parameters,
                prop,
                true,
                "",
                style.param_close,
                &forbidden,
                &mut rules,
            );
            p.push(format!("{} {v} NL", lit(&tag)));
        }
        let head = lit(&format!("{} name=\"{}\"", style.invoke, t.name));
        let full = format!("\">\" NL {} {}", in_order(&props, &p), lit(style.invoke_close));
        let body =
            if props.iter().any(|p| p.required) { full } else { format!("\" \"? \"/>\" | {full}") };
        rules.push_str(&format!("fn{i}: {head} ({body})\n"));
        fns.push(format!("fn{i}"));
    }
    rules.push_str(&format!("fn: {}\n", fns.join(" | ")));
    rules.push_str("NL: /\\n{1,2}/\n");
    rules.push_str(&format!("invokes: NL (fn NL)+ {}\n", lit(close)));
    rules.push_str(&format!("one: {} NL fn NL {}\n", lit(open), lit(close)));
    rules.push_str(&format!("calls: {} invokes\n", lit(open)));
    rules.push_str("body: invokes\n");
    Some(crate::grammar::CallGrammar { rules, opener: open.to_owned() })
}

/// Calls as DeepSeek V3.2, V4 and V4.1 write them (what [`grammar`]
/// generates): the block's open tag, a newline, each call as
/// `<｜DSML｜invoke name="NAME">\n` with one
/// `<｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>\n`
/// per argument (a string raw with `string="true"`, other values as JSON)
/// and `</｜DSML｜invoke>\n`, then the block's close tag (V4.1 with its
/// spaced spellings).
pub(crate) fn write(format: crate::Format, calls: &[(&str, &Value)]) -> String {
    use crate::Format;
    let (open, close, style) = match format {
        Format::DeepSeekV32 => (OPENS[0], CLOSES[0], PLAIN),
        Format::DeepSeekV4 => (OPENS[1], CLOSES[1], PLAIN),
        _ => (OPENS[2], CLOSES[2], SPACED),
    };
    let mut out = format!("{open}\n");
    for (name, args) in calls {
        out.push_str(&format!("{} name=\"{name}\">\n", style.invoke));
        for (k, v) in args.as_object().into_iter().flatten() {
            let string = v.is_string();
            let v = super::qwen3_xml::raw_or_json(v);
            out.push_str(&format!(
                "{} name=\"{k}\" string=\"{string}\">{v}{}\n",
                style.param, style.param_close
            ));
        }
        out.push_str(style.invoke_close);
        out.push('\n');
    }
    out.push_str(close);
    out
}
