//! Fixture loading and judging shared by the toolparse integration tests;
//! the judge follows `tests/conformance/toolcalls.py` (the conformance
//! judge `test.sh` runs).

#![allow(dead_code, unreachable_pub)]

use serde_json::Value;
use std::path::PathBuf;
use toolparse::{Accumulator, FinishReason, Format, Mode, Options, ToolSpec, Tools};

pub struct Fixture {
    pub id: String,
    pub format: Format,
    pub text: String,
    pub generation_prompt: Option<String>,
    pub thinking: Option<bool>,
    pub truncated: bool,
    pub tools: Vec<Value>,
    pub markers: Vec<String>,
    pub expected: Option<Value>,
    pub expected_error: Option<Value>,
}

/// The recorded conformance fixtures, then the regression cases written
/// for bugs found since (same format).
fn data_dirs() -> [PathBuf; 2] {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    [data.join("toolcalls"), data.join("regressions")]
}

pub fn load_fixtures() -> Vec<Fixture> {
    let mut out = Vec::new();
    let mut dirs = Vec::new();
    for root in data_dirs() {
        let mut found: Vec<_> = std::fs::read_dir(&root)
            .expect("fixture folder")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("family.json").is_file())
            .collect();
        found.sort();
        dirs.extend(found);
    }
    for dir in dirs {
        let family: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("family.json")).unwrap())
                .unwrap();
        let markers: Vec<String> = family["markers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap().to_owned())
            .collect();
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        files.sort();
        for f in files {
            for line in std::fs::read_to_string(&f).unwrap().lines() {
                if line.trim().is_empty() {
                    continue;
                }
                let fx: Value = serde_json::from_str(line).unwrap();
                let model = fx["models"][0].as_str().unwrap();
                let fam = fx["family"].as_str().unwrap();
                let reference = family["reference_models"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["repo"] == model);
                let generation_prompt = fx
                    .get("generation_prompt")
                    .and_then(Value::as_str)
                    .or_else(|| reference.and_then(|r| r["default_generation_prompt"].as_str()))
                    .map(str::to_owned);
                let tags: Vec<&str> = fx["tags"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                out.push(Fixture {
                    id: fx["id"].as_str().unwrap().to_owned(),
                    format: Format::for_family(fam, model).expect("known family"),
                    text: fx["raw_output"].as_str().unwrap().to_owned(),
                    generation_prompt,
                    thinking: fx.get("thinking").and_then(Value::as_bool),
                    truncated: tags.contains(&"truncated"),
                    tools: fx["tools"].as_array().cloned().unwrap_or_default(),
                    markers: markers.clone(),
                    expected: fx.get("expected").cloned().filter(|v| !v.is_null()),
                    expected_error: fx.get("expected_error").cloned().filter(|v| !v.is_null()),
                });
            }
        }
    }
    out
}

impl Fixture {
    pub fn options(&self, mode: Mode) -> Options {
        Options {
            generation_prompt: self.generation_prompt.clone(),
            thinking: self.thinking,
            tools: Tools(self.tools.iter().filter_map(ToolSpec::from_openai).collect()),
            mode,
            ..Options::default()
        }
    }

    pub fn reason(&self) -> FinishReason {
        if self.truncated {
            FinishReason::Length
        } else {
            FinishReason::Stop
        }
    }

    /// A marker that should not be in this visible text.
    pub fn leaked_marker(&self, content: &str, reasoning: &str) -> Option<String> {
        let exp = self.expected.as_ref()?;
        let exp_content = exp["content"].as_str().unwrap_or("");
        let exp_reason = exp["reasoning_content"].as_str().unwrap_or("");
        self.markers
            .iter()
            .find(|m| {
                (content.contains(m.as_str()) && !exp_content.contains(m.as_str()))
                    || (reasoning.contains(m.as_str()) && !exp_reason.contains(m.as_str()))
            })
            .cloned()
    }

    /// Judges a parse the way the conformance script does (whitespace at
    /// the edges of content and reasoning is soft).
    pub fn judge(&self, got: &Accumulator) -> Result<(), String> {
        for c in &got.calls {
            let v: Value = serde_json::from_str(&c.arguments)
                .map_err(|e| format!("arguments of {} are not JSON: {e}", c.name))?;
            if !v.is_object() {
                return Err(format!("arguments of {} are not an object", c.name));
            }
        }
        if let Some(err) = &self.expected_error {
            if !got.calls.is_empty() {
                return Err(format!("calls {:?} for {}", got.calls, err["reason"]));
            }
            return Ok(());
        }
        let exp = self.expected.as_ref().ok_or("fixture without expectation")?;
        let norm = |s: &str| s.trim().to_owned();
        let want_content = norm(exp["content"].as_str().unwrap_or(""));
        let want_reason = norm(exp["reasoning_content"].as_str().unwrap_or(""));
        if norm(&got.content) != want_content {
            return Err(format!("content {:?}, want {:?}", got.content, want_content));
        }
        if norm(&got.reasoning) != want_reason {
            return Err(format!("reasoning {:?}, want {:?}", got.reasoning, want_reason));
        }
        let want_calls: Vec<(String, Value)> = exp["tool_calls"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| (c["name"].as_str().unwrap().to_owned(), c["arguments"].clone()))
                    .collect()
            })
            .unwrap_or_default();
        let got_calls: Vec<(String, Value)> = got
            .calls
            .iter()
            .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap_or(Value::Null)))
            .collect();
        if !same_calls(&got_calls, &want_calls) {
            return Err(format!("calls {got_calls:?}, want {want_calls:?}"));
        }
        if let Some(m) = self.leaked_marker(&got.content, &got.reasoning) {
            return Err(format!("marker {m:?} leaked"));
        }
        Ok(())
    }
}

fn same_calls(a: &[(String, Value)], b: &[(String, Value)]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|((n1, v1), (n2, v2))| n1 == n2 && same_json(v1, v2))
}

/// JSON equality where 3 and 3.0 are the same number.
pub fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// Pseudo-tokens (markers atomic, other characters one each), or plain
/// characters when `chars`; grouped into deltas of `size(i)` units.
pub fn split_units(
    text: &str,
    markers: &[String],
    chars: bool,
    size: &mut dyn FnMut(usize) -> usize,
) -> Vec<String> {
    let units = units_of(text, markers, chars);
    let mut out = Vec::new();
    let mut i = 0;
    while i < units.len() {
        let k = size(i).max(1).min(units.len() - i);
        out.push(units[i..i + k].iter().map(|(u, _)| u.as_str()).collect());
        i += k;
    }
    out
}

/// Every marker its own delta, the text between markers one delta.
pub fn split_special(text: &str, markers: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut run = String::new();
    for (u, special) in units_of(text, markers, false) {
        if special {
            if !run.is_empty() {
                out.push(std::mem::take(&mut run));
            }
            out.push(u);
        } else {
            run.push_str(&u);
        }
    }
    if !run.is_empty() {
        out.push(run);
    }
    out
}

fn units_of(text: &str, markers: &[String], chars: bool) -> Vec<(String, bool)> {
    let mut ordered: Vec<&String> = markers.iter().collect();
    ordered.sort_by_key(|m| std::cmp::Reverse(m.len()));
    let mut units = Vec::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if !chars {
            if let Some(m) = ordered.iter().find(|m| !m.is_empty() && rest.starts_with(m.as_str()))
            {
                units.push(((*m).clone(), true));
                rest = &rest[m.len()..];
                continue;
            }
        }
        units.push((c.to_string(), false));
        rest = &rest[c.len_utf8()..];
    }
    units
}

/// llguidance over a one-byte-per-token vocabulary, with the lexer limits
/// the daemon's engine sets (`inference/src/constraint.rs`): what the
/// grammar tests compile each format's grammar with.
pub fn grammar_factory() -> llguidance::ParserFactory {
    use llguidance::toktrie::{ApproximateTokEnv, InferenceCapabilities};
    let env = ApproximateTokEnv::single_byte_env();
    let caps = InferenceCapabilities {
        ff_tokens: true,
        conditional_ff_tokens: false,
        backtrack: false,
        fork: false,
    };
    let mut f = llguidance::ParserFactory::new(
        &env,
        caps,
        &llguidance::earley::SlicedBiasComputer::general_slices(),
    )
    .expect("the factory builds");
    f.quiet();
    f.limits_mut().step_lexer_fuel = 2_000_000;
    f.limits_mut().initial_lexer_fuel = 10_000_000;
    f
}
