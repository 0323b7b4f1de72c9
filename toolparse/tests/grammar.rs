//! Each format's call grammar (`Format::call_grammar`) against the recorded
//! fixtures, compiled by llguidance over a one-byte-per-token vocabulary
//! (llguidance is a test dependency only: the library runs no engine):
//! the calls of every fixture whose expected parse has calls are a
//! sentence of the format's `calls` rule, and the markup of a fixture the
//! parser refuses is not. The parser's noise regressions (ids with
//! `-noise-`) are left out: they test what it tolerates, not what a model
//! writes.

mod common;

use common::{grammar_factory as factory, load_fixtures, Fixture};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::collections::BTreeMap;
use toolparse::{lit, Format, GrammarTool};

/// The daemon's largest bound on a forced call's free-text value
/// (`provider/constrain.rs`; above it values are unbounded).
const TEXT_BYTES: usize = 256;

/// The longest prefix of `text` that is a whole sentence of `lark` (its
/// length), if one is.
fn accepted_prefix(f: &ParserFactory, lark: &str, text: &str) -> Result<Option<usize>, String> {
    let parser =
        f.create_parser(TopLevelGrammar::from_lark(lark.to_owned())).map_err(|e| e.to_string())?;
    let mut m = Matcher::new(Ok(parser));
    let mut best = None;
    for (i, b) in text.bytes().enumerate() {
        if m.consume_token(u32::from(b)).is_err() {
            break;
        }
        if m.is_accepting().unwrap_or(false) {
            best = Some(i + 1);
        }
    }
    Ok(best)
}

/// Whether the calls of `part` are a sentence of `lark`: a prefix is, and
/// what follows it is plain text (no call opener, no call object).
fn accepts(f: &ParserFactory, lark: &str, part: &str, format: Format) -> Result<bool, String> {
    Ok(match accepted_prefix(f, lark, part)? {
        Some(n) => {
            let rest = &part[n..];
            !format.call_openers().iter().any(|o| rest.contains(o)) && !rest.contains("{\"name\"")
        }
        None => false,
    })
}

/// The fixture's tools as a grammar takes them (OpenAI's shape).
fn tools(fx: &Fixture) -> Vec<(String, Value)> {
    fx.tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function").unwrap_or(t);
            let name = f["name"].as_str()?.to_owned();
            let params = f
                .get("parameters")
                .cloned()
                .filter(Value::is_object)
                .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
            Some((name, params))
        })
        .collect()
}

/// The calls part of a fixture's text: from its first call opener (or
/// call object, for formats whose calls may start bare), trailing
/// whitespace dropped.
fn calls_part(fx: &Fixture) -> Option<&str> {
    // Formats whose calls may start bare: at a call object or list.
    let bare: &[&str] = match fx.format {
        Format::Llama3Json => &["{\"name\""],
        Format::Llama4Pythonic => &["["],
        _ => &[],
    };
    // After the reasoning, where there is a block of it.
    let from = fx
        .format
        .reasoning_end()
        .and_then(|e| fx.text.find(e.trim_end()).map(|i| i + e.trim_end().len()))
        .unwrap_or(0);
    let text = &fx.text[from..];
    let at = fx.format.call_openers().iter().chain(bare).filter_map(|o| text.find(o)).min()?;
    Some(text[at..].trim_end())
}

/// Unbounded (a call the model starts itself, under `auto`): every valid
/// fixture call is a sentence, every refused markup is not.
#[test]
fn every_fixture_call_is_a_sentence_of_its_format_grammar_and_refused_markup_is_not() {
    check(None, true);
}

/// Bounded as a forced call is: every grammar compiles and runs, the
/// fixtures whose free-text values fit the bound are sentences (the others
/// are refused by the bound, as they must be), and refused markup stays
/// refused.
#[test]
fn bounded_grammars_compile_and_keep_what_fits() {
    check(Some(TEXT_BYTES), false);
}

fn check(bound: Option<usize>, all_valid: bool) {
    let f = factory();
    // format -> (accepted, valid, rejected, malformed, failures)
    let mut report: BTreeMap<&str, (usize, usize, usize, usize, Vec<String>)> = BTreeMap::new();
    for fx in load_fixtures() {
        // The parser's noise regressions (stray words in a section, fenced
        // arguments) test how much it tolerates, not what a model writes:
        // no grammar of the native markup generates them.
        if fx.id.contains("-noise-") {
            continue;
        }
        let owned = tools(&fx);
        let gt: Vec<GrammarTool<'_>> = owned
            .iter()
            .map(|(name, parameters)| GrammarTool { name, parameters, text_bytes: bound })
            .collect();
        if gt.is_empty() {
            continue;
        }
        let Some(g) = fx.format.call_grammar(&gt, &|t: &str| lit(t)) else { continue };
        let lark = format!("start: calls\n{}", g.rules);
        let Some(part) = calls_part(&fx) else { continue };
        let has_calls = fx
            .expected
            .as_ref()
            .is_some_and(|e| e["tool_calls"].as_array().is_some_and(|c| !c.is_empty()));
        let entry = report.entry(fx.format.name()).or_default();
        let ok = match accepts(&f, &lark, part, fx.format) {
            Ok(ok) => ok,
            Err(e) => panic!("{}: the grammar does not compile: {e}\n{lark}", fx.id),
        };
        if has_calls && !fx.truncated {
            entry.1 += 1;
            if ok {
                entry.0 += 1;
            } else if all_valid || part.len() < TEXT_BYTES {
                entry.4.push(format!("{} (refused): {part:?}", fx.id));
            }
        } else if fx.expected_error.is_some() {
            entry.3 += 1;
            if ok {
                entry.4.push(format!("{} (accepted malformed): {part:?}", fx.id));
            } else {
                entry.2 += 1;
            }
        }
    }
    let mut failed = Vec::new();
    for (format, (acc, valid, rej, bad, fails)) in &report {
        eprintln!("{format}: {acc}/{valid} valid accepted, {rej}/{bad} malformed refused");
        for x in fails {
            failed.push(format!("{format}: {x}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
