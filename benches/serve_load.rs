//! Load on `agentd serve` over loopback: 16 concurrent streaming clients,
//! 200 chat completions in all. Reports time to first token (p50/p95),
//! aggregate generated tokens per second, and errors by status (only the
//! bounded queue's 503s are acceptable).
//!
//! `cargo bench -p agentd-benches --bench serve_load` (after `cargo build
//! --release`).

use agentd_benches::{agentd, model, percentile};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
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

fn one(sock: &std::path::Path, i: usize) -> Outcome {
    let body = format!(
        r#"{{"messages": [{{"role": "user", "content": "Question {i}: name a city and say one fact about it."}}], "max_tokens": {MAX_TOKENS}, "stream": true, "temperature": 0.7, "seed": {i}}}"#
    );
    let t = Instant::now();
    let Ok(mut s) = UnixStream::connect(sock) else {
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
    let home = tempfile_dir();
    let sock = home.join("load.sock");
    let mut child = std::process::Command::new(agentd())
        .args(["serve", "--model", model.to_str().unwrap(), "--socket", sock.to_str().unwrap()])
        .env("AGENTD_HOME", &home)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("serve starts");
    let t = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        assert!(t.elapsed() < Duration::from_secs(60), "serve did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let next = Arc::new(Mutex::new(0usize));
    let results = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (next, results, sock) = (Arc::clone(&next), Arc::clone(&results), sock.clone());
            std::thread::spawn(move || loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    if *n >= REQUESTS {
                        return;
                    }
                    *n += 1;
                    *n
                };
                let o = one(&sock, i);
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
    let _ = child.kill();
    let _ = child.wait();
    let results = results.lock().unwrap();
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for r in results.iter() {
        *by_status.entry(r.status).or_default() += 1;
    }
    let ttfts: Vec<f64> = results.iter().filter_map(|r| r.ttft).collect();
    let tokens: usize = results.iter().map(|r| r.tokens).sum();
    let lost = results.iter().filter(|r| r.status == 200 && r.ttft.is_none()).count();
    println!("serve load: {CLIENTS} clients, {REQUESTS} streaming requests of up to {MAX_TOKENS} tokens, {wall:.1} s");
    println!(
        "status counts: {by_status:?} (only 503 from the bounded queue is an acceptable error)"
    );
    println!("completed with text: {} · lost (200 without text): {lost}", ttfts.len());
    println!(
        "time to first token: p50 {:.2} s · p95 {:.2} s · aggregate {:.1} generated tokens/s",
        percentile(ttfts.clone(), 50.0),
        percentile(ttfts, 95.0),
        tokens as f64 / wall
    );
    let _ = std::fs::remove_dir_all(&home);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("agentd-load-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
