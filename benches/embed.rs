//! Embedding throughput against native llama.cpp, side by side in one run:
//! 64 inputs of 128 tokens (windows of this repository's docs, the same
//! token ids for both), 2 threads, on three files: the default chat model
//! pooled by the mean, and the encoders at the real models' sizes
//! (`scripts/synth_embed.py --shape bench`, F16, made on first use beside
//! the engine bench's files): `bert` as all-MiniLM-L6 (CLS pooling) and
//! `nomic-bert` as nomic-embed-text (mean pooling), each with its file's
//! pooling.
//!
//! - agentd: the engine in this process, `Engine::embed_many` on the 64
//!   inputs (what `/v1/embeddings` runs on the model's engine thread: an
//!   encoder runs inputs together, up to 2,048 tokens a pass, each attending
//!   only to itself; a decoder one after another);
//! - llama.cpp: `llama-server --embedding --pooling mean -t 2` (the build of
//!   `scripts/build-llamacpp.sh`), one `/v1/embeddings` request holding the
//!   64 token arrays, which it evaluates in shared batches — its fastest way.
//!
//! Inputs per second for each, the ratio, and the worst cosine between the
//! two engines' vectors (llama-server's batching moves its numbers by up to
//! ~1e-4; each input alone they agree to 1e-7, `inference/tests/reference.rs`).
//!
//!     cargo build --release && cargo bench -p agentd-benches --bench embed
//!
//! The chat model is the default one (`AGENTD_BENCH_MODEL`, else `agentd
//! pull`); the encoders need `AGENTD_TEST_PYTHON` (else `python3`) with
//! numpy and gguf; `AGENTD_BENCH_ONLY=bert` runs only the files whose name
//! holds it.
//! llama.cpp's tools come from `AGENTD_TEST_LLAMA_BIN`, else the build
//! script. `AGENTD_BENCH_ROUNDS` (3): alternating rounds, medians reported.
//! Run on an otherwise idle machine; the ratio is the result.

use agentd_benches::{llama_bin, median, model, root};
use inference::{Engine, EngineOptions, Pooling};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INPUTS: usize = 64;
const TOKENS: usize = 128;
const THREADS: usize = 2;

/// 64 windows of 128 token ids from the docs.
fn inputs(engine: &Engine) -> Vec<Vec<u32>> {
    let mut text = String::new();
    for f in ["README.md", "ARCHITECTURE.md", "docs/http.md", "docs/cli.md"] {
        text.push_str(&std::fs::read_to_string(root().join(f)).unwrap_or_default());
    }
    let ids = engine.tokenize(&text, false).expect("tokenizes");
    assert!(ids.len() >= INPUTS * TOKENS, "the docs give {} tokens", ids.len());
    ids.chunks_exact(TOKENS).take(INPUTS).map(<[u32]>::to_vec).collect()
}

/// The server, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP request to 127.0.0.1:`port` (`Connection: close`): the body.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(600))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, rest) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| rest.to_owned())
}

fn start_llama(
    bin: &std::path::Path,
    model: &std::path::Path,
    pooling: &str,
) -> Option<(Server, u16)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
    let child = Command::new(bin.join("llama-server"))
        .arg("-m")
        .arg(model)
        .args(["-t", &THREADS.to_string(), "-c", "8192", "-np", "1", "--embedding"])
        .args(["--pooling", pooling, "--host", "127.0.0.1", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = Server(child);
    let t = Instant::now();
    while http(port, "GET", "/health", "").is_none() {
        if t.elapsed() > Duration::from_secs(120) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Some((server, port))
}

/// The chunked-body answer of llama-server may be chunked: find the JSON.
fn json_of(body: &str) -> Option<Value> {
    let start = body.find('{')?;
    let end = body.rfind('}')?;
    serde_json::from_str(&body[start..=end]).ok()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Where the encoder bench files live: beside the engine bench's
/// (`AGENTD_BENCH_MODELS`, else the peer cache's `models`).
fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("AGENTD_BENCH_MODELS") {
        return PathBuf::from(d);
    }
    std::env::var_os("AGENTD_PEER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache")
                })
                .join("agentd-peers")
        })
        .join("models")
}

/// The encoder file `FAMILY-bench-f16.gguf`, written by the script when
/// missing; `None` when it cannot be.
fn encoder_file(family: &str) -> Option<PathBuf> {
    let dir = models_dir();
    let path = dir.join(format!("{family}-bench-f16.gguf"));
    if path.is_file() {
        return Some(path);
    }
    std::fs::create_dir_all(&dir).ok()?;
    let part = dir.join(format!("{family}-bench-f16.gguf.part"));
    let py = std::env::var_os("AGENTD_TEST_PYTHON").unwrap_or_else(|| "python3".into());
    let ok = Command::new(py)
        .arg(root().join("scripts/synth_embed.py"))
        .args(["--family", family, "--shape", "bench", "--out"])
        .arg(&part)
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (ok && std::fs::rename(&part, &path).is_ok()).then_some(path)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds: usize =
        std::env::var("AGENTD_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let only = std::env::var("AGENTD_BENCH_ONLY").unwrap_or_default();
    println!(
        "embedding throughput, {INPUTS} inputs of {TOKENS} tokens, {THREADS} threads, {rounds} alternating rounds (medians):"
    );
    println!("| file | pooling | agentd inputs/s | llama.cpp inputs/s | ratio | worst cosine |");
    println!("|---|---|---|---|---|---|");
    let mut files: Vec<(String, Option<PathBuf>)> = vec![("chat model".into(), Some(model()))];
    for family in ["bert", "nomic-bert"] {
        files.push((format!("{family}-bench-f16"), None));
    }
    for (name, path) in files {
        if !name.contains(only.as_str()) && !only.is_empty() {
            continue;
        }
        let path = match path {
            Some(p) => p,
            None => match encoder_file(name.trim_end_matches("-bench-f16")) {
                Some(p) => p,
                None => {
                    println!("| {name} | – | not made (scripts/synth_embed.py needs numpy and gguf) | | | |");
                    continue;
                }
            },
        };
        bench(&path, rounds);
    }
}

/// One file's row.
fn bench(model: &std::path::Path, rounds: usize) {
    let engine =
        Engine::load(model, &EngineOptions { threads: Some(THREADS), ..Default::default() })
            .expect("model loads");
    let pooling = engine.info().config.pooling.unwrap_or(Pooling::Mean);
    let inputs = inputs(&engine);
    let body = serde_json::json!({ "input": inputs }).to_string();
    let llama = llama_bin().and_then(|b| start_llama(&b, model, pooling.as_str()));
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut last: (Vec<Vec<f32>>, Option<Value>) = (Vec::new(), None);
    for _ in 0..rounds {
        let t = Instant::now();
        let refs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
        last.0 = engine
            .embed_many(&refs, Some(pooling))
            .expect("embeds")
            .into_iter()
            .map(|e| e.vector)
            .collect();
        ours.push(INPUTS as f64 / t.elapsed().as_secs_f64());
        if let Some((_, port)) = &llama {
            let t = Instant::now();
            let reply = http(*port, "POST", "/v1/embeddings", &body).and_then(|b| json_of(&b));
            theirs.push(INPUTS as f64 / t.elapsed().as_secs_f64());
            last.1 = reply;
        }
    }
    let worst = last.1.as_ref().map(|v| {
        let data = v["data"].as_array().cloned().unwrap_or_default();
        data.iter()
            .zip(&last.0)
            .map(|(d, a)| {
                let b: Vec<f64> = d["embedding"]
                    .as_array()
                    .map(|e| e.iter().filter_map(Value::as_f64).collect())
                    .unwrap_or_default();
                cosine(a, &b)
            })
            .fold(1.0f64, f64::min)
    });
    let (a, l) = (median(ours), median(theirs));
    let name = model.file_name().and_then(|f| f.to_str()).unwrap_or_default();
    let theirs = if l > 0.0 { format!("{l:.1}") } else { "not available".into() };
    let ratio = if l > 0.0 { format!("{:.2}×", a / l) } else { "–".into() };
    let worst = worst.map_or("–".into(), |w| format!("{w:.6}"));
    println!("| {name} | {} | {a:.1} | {theirs} | {ratio} | {worst} |", pooling.as_str());
}
