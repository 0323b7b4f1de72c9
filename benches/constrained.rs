//! Constrained decoding on the default model at 2 threads: decode tokens/s
//! with a JSON-schema grammar against free decoding (goal ≥ 0.97×), and
//! grammar compile times — p50 over the schemas of `tests/data/schemas/`
//! (goal ≤ 5 ms) and one 100-tool `tool_choice: required` grammar in the
//! Hermes call format (goal ≤ 100 ms), each compiled fresh (the cache is
//! keyed by the grammar's text, so a comment makes it new).
//!
//! `cargo bench -p agentd-benches --bench constrained` (set
//! `AGENTD_TEST_MODEL`, or the default model is looked up like the other
//! benches). Figures move with the machine's load: compare the ratio.

use agentd_benches::{median, model, percentile, root};
use inference::{Constraint, Engine, EngineOptions, GenParams};
use serde_json::{json, Value};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

const WS: &str = "[\\x20\\x0A\\x0D\\x09]{1,20}";

fn bounded(mut s: Value) -> Value {
    s["x-guidance"] = json!({"whitespace_pattern": WS});
    s
}

/// Decode tokens per second (generated tokens over generation time).
fn rate(e: &Engine, prompt: &[u32], p: &GenParams, reps: usize) -> (f64, usize) {
    let mut rates = Vec::new();
    let mut n = 0;
    for _ in 0..reps {
        let mut s = e.session();
        let out = e.generate(&mut s, prompt, p, &AtomicBool::new(false), &mut |_| {}).unwrap();
        n = out.ids.len();
        rates.push(out.ids.len() as f64 / out.gen_time.as_secs_f64());
    }
    (median(rates), n)
}

fn hundred_tools() -> String {
    let mut rules = String::new();
    let mut alts = Vec::new();
    for i in 0..100 {
        let schema = bounded(json!({
            "type": "object",
            "properties": {
                "name": {"const": format!("tool_{i}")},
                "arguments": {"type": "object", "properties": {
                    "query": {"type": "string", "maxLength": 80},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                    "mode": {"enum": ["fast", "full"]}},
                    "required": ["query"], "additionalProperties": false}},
            "required": ["name", "arguments"], "additionalProperties": false}));
        rules.push_str(&format!("fn{i}: %json {schema}\n"));
        alts.push(format!("fn{i}"));
    }
    format!(
        "start: call (NL? call)*\ncall: \"<tool_call>\" NL? one NL? \"</tool_call>\"\nNL: /[ \\n]{{1,2}}/\none: {}\n{rules}",
        alts.join(" | ")
    )
}

fn main() {
    let path: std::path::PathBuf =
        std::env::var_os("AGENTD_TEST_MODEL").map(Into::into).unwrap_or_else(model);
    let e = Engine::load(&path, &EngineOptions { threads: Some(2), ..Default::default() })
        .expect("the model loads");
    let g = e.grammars().expect("the vocabulary's trie");

    // Compile times.
    let mut schemas = Vec::new();
    let mut dir: Vec<_> = std::fs::read_dir(root().join("tests/data/schemas"))
        .expect("tests/data/schemas")
        .filter_map(|f| f.ok().map(|f| f.path()))
        .collect();
    dir.sort();
    for p in &dir {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        schemas.push(format!("start: %json {}\n", bounded(v["schema"].clone())));
    }
    let mut times = Vec::new();
    for rep in 0..5 {
        for s in &schemas {
            let t = Instant::now();
            g.compile(&format!("{s}// {rep}\n")).expect("compiles");
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let tools = hundred_tools();
    let mut tool_times = Vec::new();
    for rep in 0..3 {
        let t = Instant::now();
        g.compile(&format!("{tools}// {rep}\n")).expect("100 tools compile");
        tool_times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "grammar compile: schemas p50 {:.2} ms p95 {:.2} ms ({} schemas × 5); 100-tool request p50 {:.1} ms",
        percentile(times.clone(), 50.0),
        percentile(times, 95.0),
        schemas.len(),
        median(tool_times)
    );

    // Decode with and without a JSON-schema grammar, same prompt.
    let prompt = e
        .tokenize_prompt(
            "<|im_start|>user\nList thirty short names of fruits and vegetables as JSON.<|im_end|>\n<|im_start|>assistant\n",
            true,
        )
        .unwrap();
    let schema = bounded(json!({"type": "object", "properties": {"items": {"type": "array",
        "items": {"type": "string", "maxLength": 24}, "minItems": 30, "maxItems": 30}},
        "required": ["items"], "additionalProperties": false}));
    let grammar = g.compile(&format!("start: %json {schema}\n")).unwrap();
    let reps = 5;
    let free = GenParams { max_tokens: 128, stop_tokens: Vec::new(), ..GenParams::default() };
    let json = GenParams { constraint: Some(Constraint::Grammar(grammar.clone())), ..free.clone() };
    // Warm both paths once (the lexer's caches fill on first use).
    rate(&e, &prompt, &json, 1);
    let (f, fnum) = rate(&e, &prompt, &free, reps);
    let (c, cnum) = rate(&e, &prompt, &json, reps);
    // The mask alone: replayed over the constrained output's tokens.
    let mut s = e.session();
    let out = e.generate(&mut s, &prompt, &json, &AtomicBool::new(false), &mut |_| {}).unwrap();
    let masks: Vec<f64> =
        g.time_masks(&grammar, &out.ids).iter().map(|d| d.as_secs_f64() * 1e6).collect();
    println!(
        "mask per token: p50 {:.0} µs p95 {:.0} µs over {} tokens",
        percentile(masks.clone(), 50.0),
        percentile(masks, 95.0),
        out.ids.len()
    );
    println!(
        "decode at 2 threads: free {f:.1} tok/s ({fnum} tokens), JSON schema {c:.1} tok/s ({cnum} tokens): {:.3}×",
        c / f
    );
}
