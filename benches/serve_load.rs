//! Load on `agentd serve` over loopback: 16 concurrent streaming clients,
//! 200 chat completions in all. Reports time to first token (p50/p95),
//! aggregate generated tokens per second, and errors by status (only the
//! bounded queue's 503s are acceptable).
//!
//! `cargo bench -p agentd-benches --bench serve_load` (after `cargo build
//! --release`). With `LLAMA_SERVER=/path/to/llama-server` the same load is
//! then run against llama.cpp's server (its defaults, same model, same
//! thread count) and the two are printed side by side.
//!
//! With `LLAMA_SERVER` and `AGENTD_BENCH_UPSTREAM=1` it measures instead
//! what `agentd serve --provider openai` adds in front of llama-server: the
//! same load against llama-server alone, then through agentd over that same
//! llama-server (`--jinja -np 16`), and the TTFT overhead (p50, ms) and the
//! aggregate tokens/s ratio.

use agentd_benches::{agentd, model, percentile};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: usize = 16;
const REQUESTS: usize = 200;
const MAX_TOKENS: usize = 24;

struct Outcome {
    status: u16,
    ttft: Option<f64>,
    tokens: usize,
}

/// Where the server listens.
#[derive(Clone)]
enum Target {
    Unix(std::path::PathBuf),
    Tcp(String),
}

impl Target {
    fn connect(&self) -> std::io::Result<Box<dyn ReadWrite>> {
        Ok(match self {
            Target::Unix(p) => Box::new(UnixStream::connect(p)?),
            Target::Tcp(a) => Box::new(TcpStream::connect(a)?),
        })
    }
}

trait ReadWrite: std::io::Read + Write + Send {}
impl<T: std::io::Read + Write + Send> ReadWrite for T {}

fn one(target: &Target, i: usize) -> Outcome {
    let body = format!(
        r#"{{"messages": [{{"role": "user", "content": "Question {i}: name a city and say one fact about it."}}], "max_tokens": {MAX_TOKENS}, "stream": true, "temperature": 0.7, "seed": {i}}}"#
    );
    let t = Instant::now();
    let Ok(mut s) = target.connect() else {
        return Outcome { status: 0, ttft: None, tokens: 0 };
    };
    let _ = write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    let mut r = BufReader::new(s);
    let mut line = String::new();
    let _ = r.read_line(&mut line);
    let status: u16 = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut ttft = None;
    let mut tokens = 0;
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.contains("\"content\":\"") && !line.contains("\"content\":\"\"") {
            if ttft.is_none() {
                ttft = Some(t.elapsed().as_secs_f64());
            }
            tokens += 1;
        }
        if line.contains("[DONE]") {
            break;
        }
    }
    Outcome { status, ttft, tokens }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let model = model();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if std::env::var("AGENTD_BENCH_UPSTREAM").as_deref() == Ok("1") {
        upstream(&model, threads);
        return;
    }
    let home = tempfile_dir();
    let sock = home.join("load.sock");
    let child = std::process::Command::new(agentd())
        .args(["serve", "--model", model.to_str().unwrap(), "--socket", sock.to_str().unwrap()])
        .args(["--threads", &threads.to_string()])
        .env("AGENTD_HOME", &home)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("serve starts");
    let ours = load("agentd serve", Some(child), Target::Unix(sock));
    let _ = std::fs::remove_dir_all(&home);
    let Ok(bin) = std::env::var("LLAMA_SERVER") else {
        println!("(llama-server not measured: set LLAMA_SERVER to its binary)");
        return;
    };
    let port = 18000 + std::process::id() % 1000;
    let child = std::process::Command::new(bin)
        .args(["-m", model.to_str().unwrap(), "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-t", &threads.to_string(), "--no-webui"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("llama-server starts");
    let theirs = load("llama-server", Some(child), Target::Tcp(format!("127.0.0.1:{port}")));
    println!(
        "ratio agentd/llama-server: p50 TTFT {:.2}x (lower is better) · p95 TTFT {:.2}x · tokens/s {:.2}x",
        ours.0 / theirs.0,
        ours.1 / theirs.1,
        ours.2 / theirs.2
    );
}

/// agentd in front of llama-server against llama-server alone.
fn upstream(model: &std::path::Path, threads: usize) {
    let bin = std::env::var("LLAMA_SERVER").expect("AGENTD_BENCH_UPSTREAM=1 needs LLAMA_SERVER");
    let port = 18000 + std::process::id() % 1000;
    let mut llama = std::process::Command::new(bin)
        .args(["-m", model.to_str().unwrap(), "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-t", &threads.to_string(), "--no-webui", "--jinja", "-np", &CLIENTS.to_string()])
        .args(["-c", &(CLIENTS * 2048).to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("llama-server starts");
    let theirs = load("llama-server alone", None, Target::Tcp(format!("127.0.0.1:{port}")));
    let home = tempfile_dir();
    let sock = home.join("load.sock");
    let base = format!("http://127.0.0.1:{port}/v1");
    let child = std::process::Command::new(agentd())
        .args(["serve", "--provider", "openai", "--base-url", &base, "--model", "smollm2"])
        .args(["--socket", sock.to_str().unwrap(), "--wait-upstream", "60"])
        .env("AGENTD_HOME", &home)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("serve starts");
    let ours = load("agentd serve --provider openai", Some(child), Target::Unix(sock));
    let _ = llama.kill();
    let _ = llama.wait();
    let _ = std::fs::remove_dir_all(&home);
    println!(
        "agentd in front of llama-server: TTFT overhead p50 {:+.1} ms (goal <= 5) · aggregate tokens/s {:.3}x (goal >= 0.97)",
        (ours.0 - theirs.0) * 1000.0,
        ours.2 / theirs.2
    );
}

/// Waits for the server, runs the load, stops it; returns
/// (p50 TTFT, p95 TTFT, aggregate tokens/s).
fn load(name: &str, child: Option<std::process::Child>, target: Target) -> (f64, f64, f64) {
    let t = Instant::now();
    loop {
        // Up when /health answers 200 (llama-server answers 503 while loading).
        if let Ok(mut s) = target.connect() {
            let _ = write!(s, "GET /health HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n");
            let mut line = String::new();
            let _ = BufReader::new(s).read_line(&mut line);
            if line.contains(" 200") {
                break;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(120), "{name} did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let next = Arc::new(Mutex::new(0usize));
    let results = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (next, results, target) = (Arc::clone(&next), Arc::clone(&results), target.clone());
            std::thread::spawn(move || loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    if *n >= REQUESTS {
                        return;
                    }
                    *n += 1;
                    *n
                };
                let o = one(&target, i);
                if o.status == 503 {
                    std::thread::sleep(Duration::from_millis(200));
                }
                results.lock().unwrap().push(o);
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let wall = start.elapsed().as_secs_f64();
    if let Some(mut child) = child {
        let _ = child.kill();
        let _ = child.wait();
    }
    let results = results.lock().unwrap();
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for r in results.iter() {
        *by_status.entry(r.status).or_default() += 1;
    }
    let ttfts: Vec<f64> = results.iter().filter_map(|r| r.ttft).collect();
    let tokens: usize = results.iter().map(|r| r.tokens).sum();
    let lost = results.iter().filter(|r| r.status == 200 && r.ttft.is_none()).count();
    println!("{name}: {CLIENTS} clients, {REQUESTS} streaming requests of up to {MAX_TOKENS} tokens, {wall:.1} s");
    println!(
        "  status counts: {by_status:?} (only 503 from the bounded queue is an acceptable error)"
    );
    println!("  completed with text: {} · lost (200 without text): {lost}", ttfts.len());
    let (p50, p95, tps) =
        (percentile(ttfts.clone(), 50.0), percentile(ttfts, 95.0), tokens as f64 / wall);
    println!(
        "  time to first token: p50 {p50:.2} s · p95 {p95:.2} s · aggregate {tps:.1} generated tokens/s"
    );
    (p50, p95, tps)
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("agentd-load-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
