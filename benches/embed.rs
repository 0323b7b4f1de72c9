//! Embedding throughput against native llama.cpp, side by side in one run:
//! 64 inputs of 128 tokens (windows of this repository's docs, the same
//! token ids for both), mean pooling, 2 threads.
//!
//! - agentd: the engine in this process, `Engine::embed` on each input (what
//!   `/v1/embeddings` runs on the model's engine thread);
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
//! The model is the default one (`AGENTD_BENCH_MODEL`, else `agentd pull`);
//! llama.cpp's tools come from `AGENTD_TEST_LLAMA_BIN`, else the build
//! script. `AGENTD_BENCH_ROUNDS` (3): alternating rounds, medians reported.
//! Run on an otherwise idle machine; the ratio is the result.

use agentd_benches::{llama_bin, median, model, root};
use inference::{Engine, EngineOptions, Pooling};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
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

fn start_llama(bin: &std::path::Path, model: &std::path::Path) -> Option<(Server, u16)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
    let child = Command::new(bin.join("llama-server"))
        .arg("-m")
        .arg(model)
        .args(["-t", &THREADS.to_string(), "-c", "8192", "-np", "1", "--embedding"])
        .args(["--pooling", "mean", "--host", "127.0.0.1", "--port", &port.to_string()])
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

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let model = model();
    let rounds: usize =
        std::env::var("AGENTD_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let engine =
        Engine::load(&model, &EngineOptions { threads: Some(THREADS), ..Default::default() })
            .expect("model loads");
    let inputs = inputs(&engine);
    let body = serde_json::json!({ "input": inputs }).to_string();
    let llama = llama_bin().and_then(|b| start_llama(&b, &model));
    if llama.is_none() {
        println!("llama.cpp: not available (AGENTD_TEST_LLAMA_BIN, scripts/build-llamacpp.sh)");
    }
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut last: (Vec<Vec<f32>>, Option<Value>) = (Vec::new(), None);
    for _ in 0..rounds {
        let t = Instant::now();
        last.0 = inputs
            .iter()
            .map(|ids| engine.embed(ids, Some(Pooling::Mean)).expect("embeds").vector)
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
    println!(
        "embedding throughput, {INPUTS} inputs of {TOKENS} tokens, mean pooling, {THREADS} threads, {rounds} rounds, {}:",
        model.file_name().and_then(|f| f.to_str()).unwrap_or_default()
    );
    println!("| engine | inputs/s |\n|---|---|\n| agentd | {a:.1} |");
    if l > 0.0 {
        println!("| llama.cpp (llama-server, one batched request) | {l:.1} |");
        println!("ratio agentd / llama.cpp: {:.2}×", a / l);
    }
    if let Some(w) = worst {
        println!("worst cosine between the two engines' vectors: {w:.6}");
    }
}
