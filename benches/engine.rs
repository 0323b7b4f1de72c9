//! The engine against llama.cpp, side by side in one run on the same GGUF
//! and thread count: prompt processing (512 tokens) and decode (128 tokens)
//! at 1 and 2 threads, peak RSS, and time to first token when a request
//! extends a cached 1,000-token conversation by 50 tokens (with reuse vs
//! cold).
//!
//! llama.cpp comes prebuilt with node-llama-cpp 3.21.1
//! (`cd benches/llamacpp && npm ci`); without it only agentd is measured.
//!
//! `cargo bench -p agentd-benches --bench engine` (after `cargo build
//! --release`). Run on an otherwise idle machine; compare the ratios.

use agentd_benches::{agentd, median, model, root};
use inference::{Engine, EngineOptions, GenParams};
use serde_json::Value;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

fn agentd_bench(model: &str, threads: usize, reps: usize, extra: &[&str]) -> Value {
    let out = Command::new(agentd())
        .args([
            "bench",
            "--model",
            model,
            "--threads",
            &threads.to_string(),
            "--reps",
            &reps.to_string(),
            "--json",
        ])
        .args(extra)
        .output()
        .expect("agentd bench runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn llamacpp_bench(model: &str, threads: usize, reps: usize) -> Option<Value> {
    let dir = root().join("benches/llamacpp");
    if !dir.join("node_modules/node-llama-cpp").is_dir() {
        return None;
    }
    let out = Command::new("node")
        .current_dir(&dir)
        .args(["bench.mjs", model, &threads.to_string(), "512", "128", &reps.to_string()])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("node-llama-cpp failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn reuse(model: &std::path::Path, threads: usize) -> (f64, f64) {
    let e = Engine::load(model, &EngineOptions { threads: Some(threads), ..Default::default() })
        .expect("model loads");
    let tok = e.tokenizer();
    let mut conv = String::new();
    let mut turn = 0;
    while tok.encode(&conv, true).map(|v| v.len()).unwrap_or(0) < 1000 {
        conv.push_str(&format!(
            "<|im_start|>user\nQuestion {turn}: what do the notes say about budgets, sockets and voice replies?<|im_end|>\n<|im_start|>assistant\nThe notes say the run reserves two requests, the socket has mode 0600, and voice gets short sentences.<|im_end|>\n"
        ));
        turn += 1;
    }
    let base = e.tokenize(&conv, true).unwrap();
    let base = &base[..1000.min(base.len())];
    let mut ext = base.to_vec();
    ext.extend(e.tokenize("<|im_start|>user\nAnd what about the final answer turn and its correction, in one short sentence?<|im_end|>\n<|im_start|>assistant\n", true).unwrap());
    ext.truncate(1050);
    let p = GenParams { max_tokens: 1, ..GenParams::default() };
    let no = AtomicBool::new(false);
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for _ in 0..3 {
        let mut s = e.session();
        let t = Instant::now();
        e.generate(&mut s, &ext, &p, &no, &mut |_| {}).unwrap();
        cold.push(t.elapsed().as_secs_f64());
        let mut s = e.session();
        e.eval(&mut s, base).unwrap();
        let t = Instant::now();
        let out = e.generate(&mut s, &ext, &p, &no, &mut |_| {}).unwrap();
        warm.push(t.elapsed().as_secs_f64());
        assert!(out.reused_tokens >= 1000 - 64, "reused only {}", out.reused_tokens);
    }
    (median(cold), median(warm))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let model = model();
    let m = model.display().to_string();
    let size_mb = std::fs::metadata(&model).map(|m| m.len() as f64 / 1e6).unwrap_or(0.0);
    let reps = std::env::var("AGENTD_BENCH_REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    println!(
        "engine benchmark: {m} ({size_mb:.0} MB), pp512 / tg128, median of {reps} after a warm-up"
    );
    println!(
        "{:<10} {:>7} {:>10} {:>10} {:>12}",
        "engine", "threads", "pp tok/s", "tg tok/s", "peak RSS MB"
    );
    for threads in [1usize, 2] {
        // Alternate the two engines so drift hits both alike.
        let ours = agentd_bench(&m, threads, reps, &[]);
        let theirs = llamacpp_bench(&m, threads, reps);
        let row = |name: &str, v: &Value| {
            println!(
                "{:<10} {:>7} {:>10.1} {:>10.1} {:>12.0}",
                name,
                threads,
                v["pp_tok_s"].as_f64().unwrap_or(0.0),
                v["tg_tok_s"].as_f64().unwrap_or(0.0),
                v["peak_rss_mb"].as_f64().unwrap_or(0.0)
            )
        };
        row("agentd", &ours);
        if let Some(t) = &theirs {
            row("llama.cpp", t);
            println!(
                "ratio agentd/llama.cpp at {threads} thread(s): pp {:.2}x  tg {:.2}x",
                ours["pp_tok_s"].as_f64().unwrap_or(0.0) / t["pp_tok_s"].as_f64().unwrap_or(1.0),
                ours["tg_tok_s"].as_f64().unwrap_or(0.0) / t["tg_tok_s"].as_f64().unwrap_or(1.0)
            );
        } else {
            println!("(llama.cpp not measured: run `npm ci` in benches/llamacpp)");
        }
        // KV cache for 512 + 128 positions: 30 layers × K and V × 192 × f16.
        let kv_mb = 640.0 * 30.0 * 2.0 * 192.0 * 2.0 / 1e6;
        println!(
            "agentd peak RSS / (file + KV) = {:.0} / ({size_mb:.0} + {kv_mb:.0}) = {:.2}x",
            ours["peak_rss_mb"].as_f64().unwrap_or(0.0),
            ours["peak_rss_mb"].as_f64().unwrap_or(0.0) * 1.048_576 / (size_mb + kv_mb)
        );
    }
    // What `serve` does with concurrent completions: 8 sequences decoding
    // together, one batched pass per token (llama.cpp's single-sequence
    // figure above is the comparable peer number per stream).
    let solo = agentd_bench(&m, 2, reps, &["--prompt-tokens", "0"]);
    let together = agentd_bench(&m, 2, reps, &["--prompt-tokens", "0", "--parallel", "8"]);
    let (a, b) =
        (solo["tg_tok_s"].as_f64().unwrap_or(0.0), together["tg_tok_s"].as_f64().unwrap_or(0.0));
    println!(
        "decode together, 2 threads: 1 sequence {a:.1} tok/s, 8 sequences {b:.1} tok/s aggregate = {:.2}x",
        b / a.max(1e-9)
    );
    for threads in [1usize, 2] {
        let (cold, warm) = reuse(&model, threads);
        println!(
            "prefix reuse, {threads} thread(s): time to first token extending 1000 cached tokens by 50: {:.0} ms with reuse vs {:.0} ms cold = {:.1}%",
            warm * 1e3,
            cold * 1e3,
            warm / cold * 100.0
        );
    }
}
