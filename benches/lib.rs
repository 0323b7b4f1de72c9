//! Shared inputs for the benchmarks: the recorded model outputs of the
//! toolparse fixtures, grouped by family, split into token-sized deltas.

use serde_json::Value;
use std::path::PathBuf;
use toolparse::{FinishReason, Format, Options, ToolSpec, Tools};

/// One recorded generation, ready to stream.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The format that parses it.
    pub format: Format,
    /// Parser options (generation prompt, tools).
    pub options: Options,
    /// The text in deltas of about one token (4 bytes, char-aligned).
    pub deltas: Vec<String>,
    /// How it ended.
    pub reason: FinishReason,
}

/// The fixture folder (a copy of the shared conformance fixtures).
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../toolparse/tests/data/toolcalls")
}

/// Splits `text` into deltas of about `n` bytes, never inside a character.
pub fn deltas(text: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        cur.push(c);
        if cur.len() >= n {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Every fixture of every family, by family slug.
pub fn recorded_by_family() -> Vec<(String, Vec<Recorded>)> {
    let mut fams = Vec::new();
    let Ok(dir) = std::fs::read_dir(fixture_dir()) else { return fams };
    let mut dirs: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
    dirs.sort();
    for d in dirs {
        let Ok(fam) = std::fs::read_to_string(d.join("family.json")) else { continue };
        let Ok(fam) = serde_json::from_str::<Value>(&fam) else { continue };
        let slug = fam["slug"].as_str().unwrap_or_default().to_owned();
        let mut items = Vec::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&d)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        files.sort();
        for f in files {
            for line in std::fs::read_to_string(&f).unwrap_or_default().lines() {
                let Ok(fx) = serde_json::from_str::<Value>(line) else { continue };
                let model = fx["models"][0].as_str().unwrap_or_default();
                let Some(format) = Format::for_family(&slug, model) else { continue };
                let reference = fam["reference_models"]
                    .as_array()
                    .and_then(|a| a.iter().find(|r| r["repo"] == model).cloned());
                let gen = fx["generation_prompt"]
                    .as_str()
                    .or_else(|| {
                        reference.as_ref().and_then(|r| r["default_generation_prompt"].as_str())
                    })
                    .map(str::to_owned);
                let tools = fx["tools"]
                    .as_array()
                    .map(|a| a.iter().filter_map(ToolSpec::from_openai).collect())
                    .unwrap_or_default();
                let truncated =
                    fx["tags"].as_array().is_some_and(|t| t.iter().any(|x| x == "truncated"));
                items.push(Recorded {
                    format,
                    options: Options {
                        generation_prompt: gen,
                        thinking: fx["thinking"].as_bool(),
                        tools: Tools(tools),
                        ..Options::default()
                    },
                    deltas: deltas(fx["raw_output"].as_str().unwrap_or_default(), 4),
                    reason: if truncated { FinishReason::Length } else { FinishReason::Stop },
                });
            }
        }
        fams.push((slug, items));
    }
    fams
}

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The built `agentd` (release), or an explanation.
pub fn agentd() -> PathBuf {
    std::env::var_os("AGENTD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/release/agentd"))
}

/// The default model's file: `AGENTD_BENCH_MODEL`, else pulled with
/// `agentd pull` into the usual state folder.
pub fn model() -> PathBuf {
    if let Some(p) = std::env::var_os("AGENTD_BENCH_MODEL") {
        return PathBuf::from(p);
    }
    let out = std::process::Command::new(agentd())
        .arg("pull")
        .output()
        .expect("agentd runs (cargo build --release first)");
    assert!(out.status.success(), "agentd pull failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The folder of the native llama.cpp tools: `AGENTD_TEST_LLAMA_BIN`, else
/// what `scripts/build-llamacpp.sh` builds (once, cached) and prints.
pub fn llama_bin() -> Option<PathBuf> {
    if let Some(b) = std::env::var_os("AGENTD_TEST_LLAMA_BIN") {
        return Some(PathBuf::from(b));
    }
    let out = std::process::Command::new(root().join("scripts/build-llamacpp.sh")).output().ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_owned()))
}

/// Median of a sample.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[v.len() / 2]
}

/// A percentile (0–100) of a sample.
pub fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}
