//! `agentd serve` end to end with the real default model (set
//! `AGENTD_TEST_MODEL` to its GGUF; skipped otherwise): raw HTTP over the
//! Unix socket, the official `openai` Python SDK over TCP, a malformed
//! request corpus, disconnects, kill -9 and SIGTERM.

use agentd_tests::Home;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn model() -> Option<PathBuf> {
    agentd_tests::dep("AGENTD_TEST_MODEL", "serve (real default model)")
}

struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(h: &Home, extra: &[&str]) -> Daemon {
    let socket = h.path().join("d.sock");
    let m = model().unwrap();
    let mut args = vec![
        "serve",
        "--model",
        m.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
        "--threads",
        "2",
    ];
    args.extend_from_slice(extra);
    let child = h.cmd(&args).stderr(Stdio::piped()).spawn().expect("serve starts");
    let d = Daemon { child, socket };
    let t = Instant::now();
    while UnixStream::connect(&d.socket).is_err() {
        assert!(t.elapsed() < Duration::from_secs(60), "the daemon did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    d
}

/// One raw HTTP/1.1 request over the socket; returns status and body.
fn http(sock: &Path, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    // The daemon may answer (413) and close before the whole body is sent.
    let _ = write!(s, "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.as_bytes().to_vec()
    };
    (status, body)
}

fn dechunk(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.extend_from_slice(&tail.as_bytes()[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

fn json_of(b: &[u8]) -> Value {
    serde_json::from_slice(b)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(b)))
}

#[test]
fn raw_http_over_the_unix_socket() {
    if model().is_none() {
        return;
    }
    let h = Home::new();
    let d = start(&h, &[]);
    let mode = std::fs::metadata(&d.socket).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    let (st, b) = http(&d.socket, "GET", "/health", b"");
    assert_eq!(st, 200);
    assert_eq!(json_of(&b)["status"], "ok");
    let (st, b) = http(
        &d.socket,
        "POST",
        "/v1/chat/completions",
        br#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}"#,
    );
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&b));
    let v = json_of(&b);
    assert_eq!(v["object"], "chat.completion");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    let (st, b) = http(
        &d.socket,
        "POST",
        "/v1/chat/completions",
        br#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": true}"#,
    );
    assert_eq!(st, 200);
    let text = String::from_utf8_lossy(&b);
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // A second daemon on the live socket refuses to start.
    let out = h
        .cmd(&[
            "serve",
            "--model",
            model().unwrap().to_str().unwrap(),
            "--socket",
            d.socket.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already listening"));
}

#[test]
fn malformed_requests_get_a_4xx_with_a_message_and_the_daemon_stays_healthy() {
    if model().is_none() {
        return;
    }
    let h = Home::new();
    h.write("policies.toml", "[values]\n\"server/request-body-limit\" = 65536\n");
    let d = start(&h, &[]);
    let huge =
        format!(r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#, "x".repeat(200_000));
    let big_context =
        format!(r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#, "word ".repeat(12_000));
    let corpus: Vec<(&str, Vec<u8>, u16)> = vec![
        ("truncated JSON", br#"{"messages": [{"role": "user", "#.to_vec(), 400),
        ("not JSON", b"hello".to_vec(), 400),
        ("invalid UTF-8", vec![b'{', 0xff, 0xfe, b'}'], 400),
        ("messages not an array", br#"{"messages": "hi"}"#.to_vec(), 400),
        ("empty messages", br#"{"messages": []}"#.to_vec(), 400),
        ("unknown role", br#"{"messages": [{"role": "wizard", "content": "x"}]}"#.to_vec(), 400),
        ("content a number", br#"{"messages": [{"role": "user", "content": 5}]}"#.to_vec(), 400),
        ("tool schema not an object", br#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": "nope"}}]}"#.to_vec(), 400),
        ("tools not an array", br#"{"messages": [{"role": "user", "content": "x"}], "tools": {}}"#.to_vec(), 400),
        ("bad tool_choice", br#"{"messages": [{"role": "user", "content": "x"}], "tool_choice": 7}"#.to_vec(), 400),
        ("temperature a string", br#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#.to_vec(), 400),
        ("negative max_tokens", br#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}"#.to_vec(), 400),
        ("unknown model", br#"{"model": "gpt-99", "messages": [{"role": "user", "content": "x"}]}"#.to_vec(), 404),
        ("body over the limit", huge.into_bytes(), 413),
        ("prompt beyond the context", big_context.into_bytes(), 400),
        ("array body", b"[1, 2, 3]".to_vec(), 400),
    ];
    for (what, body, want) in corpus {
        let path = "/v1/chat/completions";
        let (st, b) = http(&d.socket, "POST", path, &body);
        assert_eq!(st, want, "{what}: {}", String::from_utf8_lossy(&b));
        let v = json_of(&b);
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {v}");
        if what == "prompt beyond the context" {
            let m = v["error"]["message"].as_str().unwrap();
            assert!(m.contains("8192"), "names both sizes: {m}");
        }
    }
    for (path, body, want) in [
        ("/v1/research", br#"{"question": 3}"#.to_vec(), 400u16),
        ("/v1/research", br#"{"question": "q", "max_tool_iters": 99}"#.to_vec(), 400),
        ("/v1/runs/run_nope/resume", b"{}".to_vec(), 404),
        ("/v1/nope", b"{}".to_vec(), 404),
    ] {
        let (st, b) = http(&d.socket, "POST", path, &body);
        assert_eq!(st, want, "{path}: {}", String::from_utf8_lossy(&b));
    }
    let (st, _) = http(&d.socket, "PUT", "/v1/settings/chat.max_tool_iters", br#"{"value": 0}"#);
    assert_eq!(st, 422);
    let (st, b) = http(&d.socket, "PUT", "/v1/settings/chat.max_tool_iters", br#"{"value": 6}"#);
    assert_eq!(st, 200);
    assert_eq!(json_of(&b)["value"], 6);
    let (st, b) = http(&d.socket, "DELETE", "/v1/settings/chat.max_tool_iters", b"");
    assert_eq!(st, 200);
    assert_eq!(json_of(&b)["value"], 12);
    // Unknown fields are ignored.
    let (st, _) = http(
        &d.socket,
        "POST",
        "/v1/chat/completions",
        br#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "frobnicate": true}"#,
    );
    assert_eq!(st, 200);
    let (st, b) = http(&d.socket, "GET", "/health", b"");
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&b));
    let (st, b) = http(&d.socket, "GET", "/metrics", b"");
    assert_eq!(st, 200);
    assert!(String::from_utf8_lossy(&b).contains("agentd_http_requests_total"));
}

#[test]
fn the_openai_python_sdk_works_over_tcp_with_a_token() {
    let test = "the_openai_python_sdk_works_over_tcp_with_a_token";
    let (Some(_), Some(python)) = (model(), agentd_tests::python(test)) else {
        return;
    };
    let h = Home::new();
    let token = h.write("token", "test-token-0123456789abcdef");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let _d = start(&h, &["--listen", &listen, "--token-file", token.to_str().unwrap()]);
    let t = Instant::now();
    while std::net::TcpStream::connect(&listen).is_err() {
        assert!(t.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(100));
    }
    // Without the token: 401.
    let mut s = std::net::TcpStream::connect(&listen).unwrap();
    write!(s, "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 401"), "{out}");
    let mut s = std::net::TcpStream::connect(&listen).unwrap();
    write!(s, "GET /health HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer test-token-0123456789abcdef\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let health: Value = serde_json::from_str(out.split_once("\r\n\r\n").unwrap().1).unwrap();
    let model_id = health["model"].as_str().unwrap().to_owned();
    let script = agentd_tests::workspace_root().join("tests/python/sdk_check.py");
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://{listen}/v1"))
        .arg("test-token-0123456789abcdef")
        .arg(&model_id)
        .output()
        .expect("the test venv's python runs");
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `response_format` and `tool_choice` are kept by the grammar, checked
/// with the openai SDK and python `jsonschema` (tests/python/constrained_check.py
/// over the schemas in tests/data/schemas/).
#[test]
fn the_grammar_keeps_response_formats_and_tool_choices() {
    let test = "the_grammar_keeps_response_formats_and_tool_choices";
    let (Some(_), Some(python)) = (model(), agentd_tests::python(test)) else {
        return;
    };
    let h = Home::new();
    let token = h.write("token", "test-token-0123456789abcdef");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let d = start(&h, &["--listen", &listen, "--token-file", token.to_str().unwrap()]);
    let (_, b) = http(&d.socket, "GET", "/health", b"");
    let model_id = json_of(&b)["model"].as_str().unwrap().to_owned();
    let root = agentd_tests::workspace_root();
    let out = Command::new(python)
        .arg(root.join("tests/python/constrained_check.py"))
        .arg(format!("http://{listen}/v1"))
        .arg("test-token-0123456789abcdef")
        .arg(&model_id)
        .arg(root.join("tests/data/schemas"))
        .output()
        .expect("the test venv's python runs");
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_client_that_disconnects_cancels_its_generation() {
    if model().is_none() {
        return;
    }
    let h = Home::new();
    let d = start(&h, &[]);
    let mut s = UnixStream::connect(&d.socket).unwrap();
    let body = br#"{"messages": [{"role": "user", "content": "Write a very long story about a ship."}], "max_tokens": 4000, "stream": true, "temperature": 0.8, "seed": 1}"#;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    while !line.contains("\"content\"") {
        line.clear();
        r.read_line(&mut line).unwrap();
    }
    drop(r);
    drop(s);
    // 4000 tokens would take minutes; a cancelled one frees the model at once.
    let t = Instant::now();
    let (st, _) = http(
        &d.socket,
        "POST",
        "/v1/chat/completions",
        br#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}"#,
    );
    assert_eq!(st, 200);
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "the dropped request kept the model busy for {:?}",
        t.elapsed()
    );
}

fn research_until_content(sock: &Path, chat: &str) -> UnixStream {
    let body = json!({"question": "Write a long explanation of how sockets work, with many details.", "chat_id": chat}).to_string();
    let mut s = UnixStream::connect(sock).unwrap();
    write!(
        s,
        "POST /v1/research HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    let mut seen = 0;
    while seen < 5 {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if line.contains("\"type\":\"content\"") {
            seen += 1;
        }
    }
    s
}

#[test]
fn kill_9_mid_reply_keeps_the_streamed_text_marked_interrupted() {
    if model().is_none() {
        return;
    }
    let h = Home::new();
    let mut d = start(&h, &[]);
    let _s = research_until_content(&d.socket, "chat_k9");
    std::thread::sleep(Duration::from_millis(600));
    d.child.kill().unwrap(); // SIGKILL
    d.child.wait().unwrap();
    // Restart: the socket file is stale and is replaced.
    let d2 = start(&h, &[]);
    let (st, b) = http(&d2.socket, "GET", "/v1/chats/chat_k9", b"");
    assert_eq!(st, 200);
    let v = json_of(&b);
    let a = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("assistant message kept");
    assert_eq!(a["status"], "interrupted");
    assert!(!a["content"].as_str().unwrap().is_empty());
    let run = a["run_id"].as_str().unwrap().to_owned();
    let (st, b) = http(&d2.socket, "GET", &format!("/v1/runs/{run}"), b"");
    assert_eq!(st, 200);
    assert_eq!(json_of(&b)["status"], "interrupted");
}

#[test]
fn sigterm_cancels_replies_in_flight_and_persists_them() {
    if model().is_none() {
        return;
    }
    let h = Home::new();
    let mut d = start(&h, &[]);
    let _s = research_until_content(&d.socket, "chat_term");
    let _ = Command::new("kill").args(["-TERM", &d.child.id().to_string()]).status();
    let t = Instant::now();
    loop {
        if let Some(st) = d.child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "serve did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    }
    let db = rusqlite::Connection::open(h.path().join("agentd.db")).unwrap();
    let (content, status): (String, String) = db
        .query_row("SELECT content, status FROM messages WHERE chat_id = 'chat_term' AND role = 'assistant' AND tool_calls IS NULL", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!(status, "cancelled");
    assert!(!content.is_empty());
}

/// Completions that arrive together decode together (one batched pass per
/// token): each gets exactly the reply it gets alone, tool calls included.
#[test]
fn concurrent_completions_get_their_solo_replies() {
    if model().is_none() {
        return;
    }
    let h = Home::new();
    let d = start(&h, &[]);
    let tools = r#"[{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]"#;
    let bodies: Vec<String> = [
        ("What is the capital of France?", 24, false),
        ("Write a haiku about the sea.", 40, false),
        ("What is the weather in Paris?", 48, true),
        ("List three prime numbers.", 16, false),
        ("Say hello.", 4, false),
    ]
    .iter()
    .map(|(q, n, with_tools)| {
        let t = if *with_tools { format!(r#", "tools": {tools}"#) } else { String::new() };
        format!(
            r#"{{"messages": [{{"role": "user", "content": "{q}"}}], "max_tokens": {n}, "temperature": 0{t}}}"#
        )
    })
    .collect();
    let reply = |b: &[u8]| {
        let v = json_of(b);
        let c = &v["choices"][0];
        (
            c["message"]["content"].clone(),
            c["message"]["tool_calls"].clone(),
            c["finish_reason"].clone(),
        )
    };
    let solo: Vec<_> = bodies
        .iter()
        .map(|b| {
            let (st, out) = http(&d.socket, "POST", "/v1/chat/completions", b.as_bytes());
            assert_eq!(st, 200, "{}", String::from_utf8_lossy(&out));
            reply(&out)
        })
        .collect();
    let together: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = bodies
            .iter()
            .map(|b| {
                let sock = d.socket.clone();
                s.spawn(move || http(&sock, "POST", "/v1/chat/completions", b.as_bytes()))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (k, (st, out)) in together.iter().enumerate() {
        assert_eq!(*st, 200, "{}", String::from_utf8_lossy(out));
        assert_eq!(reply(out), solo[k], "request {k}");
    }
    let (_, m) = http(&d.socket, "GET", "/metrics", b"");
    assert!(String::from_utf8_lossy(&m).contains("agentd_queue_depth 0"));
}

/// A research run streams on its own thread; its turns share the engine's
/// batch, so a completion sent meanwhile is answered before the run ends.
#[test]
fn a_completion_is_answered_while_a_research_run_streams() {
    if model().is_none() {
        return;
    }
    let h = Home::new();
    let d = start(&h, &[]);
    let s = research_until_content(&d.socket, "chat_side");
    let (st, b) = http(
        &d.socket,
        "POST",
        "/v1/chat/completions",
        br#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}"#,
    );
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&b));
    // Answered while the run's reply is still streaming (a run that held
    // the model would have finished first).
    let (_, c) = http(&d.socket, "GET", "/v1/chats/chat_side", b"");
    let chat = json_of(&c);
    let reply = chat["messages"].as_array().unwrap().iter().find(|m| m["role"] == "assistant");
    assert_eq!(reply.expect("the reply so far is kept")["status"], "streaming", "{chat}");
    // The research run finishes normally.
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut r = BufReader::new(s);
    let (mut line, mut content) = (String::new(), 0);
    let done = loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "the stream ended without done");
        content += usize::from(line.contains("\"type\":\"content\""));
        if line.contains("\"type\":\"done\"") {
            break line.clone();
        }
    };
    assert!(done.contains("\"outcome\":\"answered\""), "{done}");
    assert!(content > 0, "no content after the completion");
}
