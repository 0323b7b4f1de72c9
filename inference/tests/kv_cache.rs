//! The quantized K/V caches against llama.cpp (`tests/data/reference/kv-greedy.jsonl`, made by
//! `scripts/kv_reference.py`: `llama-server -ctk T -ctv T` at 1 thread): greedy ids on the
//! reference prompts, 6 to 786 tokens (past 64 tokens an f16 cache would take the tiled path,
//! a quantized one never does), on the default model with q8_0 and q4_0, the Q4_K_M file and
//! gemma3 with q8_0; and the cache's bytes per position.
//!
//! Needs the real files (`AGENTD_TEST_MODEL`, `AGENTD_TEST_Q4KM`, `AGENTD_TEST_GEMMA`); each
//! test says when it skips, and fails instead under `AGENTD_TEST_STRICT=1`.

use inference::{Engine, EngineOptions, GenParams, KvType};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

mod common;

use common::ids;

fn lines() -> Vec<Value> {
    common::reference_lines("kv-greedy.jsonl")
}

fn file(model: &str) -> Option<PathBuf> {
    let var = match model {
        "smollm2" => "AGENTD_TEST_MODEL",
        "smollm2-q4_k_m" => "AGENTD_TEST_Q4KM",
        "gemma3" => "AGENTD_TEST_GEMMA",
        m => panic!("unknown model {m} in kv-greedy.jsonl"),
    };
    common::real_file(var, "kv_cache")
}

/// Every line's greedy ids equal llama.cpp's with the same cache type, in full.
fn greedy(model: &str, kv: KvType) {
    let Some(path) = file(model) else { return };
    let opts = EngineOptions { kv_type: Some(kv), context: Some(4096), ..Default::default() };
    let engine = Engine::load(&path, &opts).expect("model loads");
    assert_eq!(engine.info().kv_type, kv);
    let mut bad = Vec::new();
    let mut n = 0;
    for case in lines().iter().filter(|c| c["model"] == model && c["kv"] == kv.name()) {
        let (prompt, want) = (ids(&case["prompt_ids"]), ids(&case["greedy_ids"]));
        // Chunks that cut llama.cpp's batches: the numbers must not depend on them.
        let chunk = if n % 2 == 0 { 512 } else { 37 };
        let params = GenParams { max_tokens: want.len(), chunk, ..GenParams::default() };
        let out = engine
            .generate(&mut engine.session(), &prompt, &params, &AtomicBool::new(false), &mut |_| {})
            .expect("generates");
        if out.ids != want {
            let same = out.ids.iter().zip(&want).take_while(|(a, b)| a == b).count();
            bad.push(format!(
                "{:?} ({} tokens, min gap {}): parts at {same}\n got {:?}\nwant {want:?}",
                case["question"],
                prompt.len(),
                case["min_gap"],
                out.ids
            ));
        }
        n += 1;
    }
    assert!(n > 0, "no {model} {kv} lines in kv-greedy.jsonl");
    assert!(bad.is_empty(), "{model} {kv}: {} of {n} differ:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn q8_0_cache_matches_llama_cpp() {
    greedy("smollm2", KvType::Q8_0);
}

#[test]
fn q4_0_cache_matches_llama_cpp() {
    greedy("smollm2", KvType::Q4_0);
}

#[test]
fn q8_0_cache_matches_llama_cpp_on_q4_k_m() {
    greedy("smollm2-q4_k_m", KvType::Q8_0);
}

#[test]
fn q8_0_cache_matches_llama_cpp_on_gemma3() {
    greedy("gemma3", KvType::Q8_0);
}
