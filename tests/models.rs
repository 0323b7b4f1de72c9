//! Installed models from the command line: `agentd pull hf:OWNER/REPO/FILE`
//! fetches any GGUF file through hf-hub — here from a stand-in for the
//! Hugging Face Hub on loopback (`HF_ENDPOINT`), since the Hub cannot be
//! reached from the tests — checks its sha256 when the Hub gives one,
//! `agentd models` lists it, `agentd rm` deletes it.

use agentd_tests::Home;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// A file the stand-in serves: its bytes and the sha256 it announces.
struct Served {
    path: String,
    bytes: Vec<u8>,
    etag: String,
}

/// A stand-in for the Hub's `resolve` route, as hf-hub reads it: a
/// `Range: bytes=0-0` probe answered with `x-repo-commit`, `x-linked-etag`
/// and `Content-Range`, then `Range: bytes=N-` for the content. Returns
/// its base URL and the requests it saw.
fn hub(files: Vec<Served>) -> (String, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", l.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut r = BufReader::new(conn.try_clone().expect("clone"));
            let mut line = String::new();
            if r.read_line(&mut line).is_err() {
                continue;
            }
            let path = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
            let mut range = None;
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("range:") {
                    range = v.trim().strip_prefix("bytes=").map(str::to_owned);
                }
            }
            log.lock().expect("log").push(format!("{path} {range:?}"));
            let Some(f) = files.iter().find(|f| f.path == path) else {
                let _ = conn.write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                continue;
            };
            let n = f.bytes.len();
            let (start, end) = match range.as_deref().and_then(|r| r.split_once('-')) {
                Some((a, b)) => {
                    let a: usize = a.parse().unwrap_or(0);
                    let b: usize = b.parse().unwrap_or(n - 1);
                    (a.min(n), (b + 1).min(n))
                }
                None => (0, n),
            };
            let body = &f.bytes[start..end];
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {}-{}/{}\r\n\
                 x-repo-commit: 0123456789abcdef0123456789abcdef01234567\r\nx-linked-etag: \"{}\"\r\n\
                 etag: \"weak\"\r\nConnection: close\r\n\r\n",
                body.len(),
                start,
                end.saturating_sub(1),
                n,
                f.etag
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(body);
        }
    });
    (base, seen)
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn pull_from_the_hub_lists_and_removes_a_gguf_file() {
    let good: Vec<u8> =
        b"GGUF".iter().copied().chain((0..200_000u32).map(|i| (i % 251) as u8)).collect();
    let bad: Vec<u8> = b"GGUF broken".to_vec();
    let (base, seen) = hub(vec![
        Served {
            path: "/tester/tiny-GGUF/resolve/main/tiny-Q4_K_M.gguf".into(),
            bytes: good.clone(),
            etag: sha(&good),
        },
        Served {
            path: "/tester/tiny-GGUF/resolve/main/corrupt.gguf".into(),
            bytes: bad.clone(),
            etag: sha(b"something else"),
        },
    ]);
    let home = Home::new();
    let run = |args: &[&str]| {
        home.cmd(args)
            .env("HF_ENDPOINT", &base)
            .env("HF_HOME", home.path().join("hf"))
            .env_remove("HF_TOKEN")
            .output()
            .expect("agentd runs")
    };

    let out = run(&["pull", "hf:tester/tiny-GGUF/tiny-Q4_K_M.gguf"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pull failed: {err}");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(path.ends_with("models/tiny-Q4_K_M.gguf"), "{path}");
    assert_eq!(std::fs::read(&path).expect("the file is there"), good, "the bytes served");
    assert!(err.contains("sha256 checked"), "{err}");
    assert!(seen.lock().unwrap().iter().any(|r| r.contains("Some(\"0-0\")")), "hf-hub probed");
    assert!(!home.path().join("models/.hf-cache").exists(), "the download cache is cleared");

    // Listed as installed; a second pull finds it present.
    let out = run(&["models", "--json"]);
    let rows: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let row = rows.as_array().unwrap().iter().find(|r| r["name"] == "tiny-Q4_K_M");
    assert_eq!(row.map(|r| r["state"].clone()), Some("present".into()), "{rows}");
    let again = run(&["pull", "hf:tester/tiny-GGUF/tiny-Q4_K_M.gguf"]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("is present"));

    // `--model STEM` finds the file (this one is no real GGUF, so loading
    // it fails, naming the file rather than an unknown model).
    let out = run(&["tokenize", "--model", "tiny-Q4_K_M", "hi"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("unknown model"), "{err}");

    // A file whose bytes do not match the announced sha256 is not kept.
    let out = run(&["pull", "hf:tester/tiny-GGUF/corrupt.gguf"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a corrupt download must fail");
    assert!(err.contains("sha256 mismatch"), "{err}");
    assert!(!home.path().join("models/corrupt.gguf").exists());

    // Not on the stand-in: the error names the file and the repository.
    let out = run(&["pull", "hf:tester/tiny-GGUF/missing.gguf"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("missing.gguf") && err.contains("tester/tiny-GGUF"), "{err}");

    // A spec that is not a Hub file is refused with the shape to write.
    let out = run(&["pull", "hf:tester/tiny-GGUF"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("hf:OWNER/REPO/FILE.gguf"));

    // rm deletes it; rm of what is not installed says what is.
    let out = run(&["rm", "tiny-Q4_K_M"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!std::path::Path::new(&path).exists());
    let out = run(&["rm", "tiny-Q4_K_M"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no installed model is named"));
}
