//! The engine against llama.cpp's reference outputs on the default model
//! (`../shared/fixtures/reference/`, copied to `tests/data/reference/`):
//! tokenizer ids, control tokens included, and greedy decoding.
//!
//! Needs the real model: set `AGENTD_TEST_MODEL` to the GGUF path (the test
//! command does, after `agentd pull`); skipped otherwise.

use inference::{Engine, EngineOptions, GenParams};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

fn model() -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var_os("AGENTD_TEST_MODEL")?);
    assert!(p.is_file(), "AGENTD_TEST_MODEL={} is not a file", p.display());
    Some(p)
}

fn lines(name: &str) -> Vec<Value> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference").join(name);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

#[test]
fn tokenizer_matches_llama_cpp() {
    let Some(path) = model() else { return };
    let engine = Engine::load(&path, &EngineOptions::default()).expect("model loads");
    let mut bad = Vec::new();
    for case in lines("smollm2-tokenize.jsonl") {
        let text = case["text"].as_str().expect("text");
        let special = case["parse_special"].as_bool().unwrap_or(false);
        let got = engine.tokenize(text, special).expect("tokenizes");
        let want = ids(&case["ids"]);
        if got != want {
            bad.push(format!("{text:?} (special={special}): got {got:?}, want {want:?}"));
        }
    }
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn greedy_decoding_matches_llama_cpp() {
    let Some(path) = model() else { return };
    let threads = std::env::var("AGENTD_TEST_THREADS").ok().and_then(|t| t.parse().ok());
    let engine = Engine::load(&path, &EngineOptions { threads, ..Default::default() }).expect("model loads");
    let cases = lines("smollm2-greedy.jsonl");
    let mut full = 0;
    let mut report = Vec::new();
    for case in &cases {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy_ids"]);
        let mut s = engine.session();
        let params = GenParams { max_tokens: want.len(), ..GenParams::default() };
        let out = engine.generate(&mut s, &prompt, &params, &AtomicBool::new(false), &mut |_| {}).expect("generates");
        let same = out.ids.iter().zip(&want).take_while(|(a, b)| a == b).count();
        if same == want.len() && out.ids.len() == want.len() {
            full += 1;
        }
        report.push(format!("{:?}: {same}/{} match", case["question"].as_str().unwrap_or(""), want.len()));
        if std::env::var("X_ALL").is_err() { assert!(same >= 8.min(want.len()), "first 8 differ: {}\n got {:?}\nwant {:?}", report.join("\n"), out.ids, want); }
    }
    eprintln!("{}", report.join("\n"));
    assert!(full + 1 >= cases.len(), "only {full} of {} prompts match in full:\n{}", cases.len(), report.join("\n"));
}
