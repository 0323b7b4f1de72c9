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
        ("frequency_penalty above 2", br#"{"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 2.5}"#.to_vec(), 400),
        ("presence_penalty below -2", br#"{"messages": [{"role": "user", "content": "x"}], "presence_penalty": -3}"#.to_vec(), 400),
        ("repeat_penalty 0", br#"{"messages": [{"role": "user", "content": "x"}], "repeat_penalty": 0}"#.to_vec(), 400),
        ("repeat_last_n over its policy", br#"{"messages": [{"role": "user", "content": "x"}], "repeat_last_n": 100000000}"#.to_vec(), 400),
        ("no_repeat_ngram negative", br#"{"messages": [{"role": "user", "content": "x"}], "no_repeat_ngram": -1}"#.to_vec(), 400),
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
        if what == "frequency_penalty above 2" {
            let m = v["error"]["message"].as_str().unwrap();
            assert!(
                m.contains("frequency_penalty") && m.contains("-2 and 2"),
                "names the field and range: {m}"
            );
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
    // The Ollama and Anthropic routes: each bad request a 4xx in the API's
    // own error shape.
    let chat = |extra: &str| {
        format!(r#"{{"model": "", "messages": [{{"role": "user", "content": "x"}}], "stream": false{extra}}}"#).into_bytes()
    };
    let msg = |extra: &str| {
        format!(r#"{{"model": "", "max_tokens": 4, "messages": [{{"role": "user", "content": "x"}}]{extra}}}"#).into_bytes()
    };
    let huge_ollama =
        format!(r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#, "x".repeat(200_000));
    let corpus: Vec<(&str, &str, Vec<u8>, u16)> = vec![
        ("/api/chat", "truncated JSON", br#"{"messages": ["#.to_vec(), 400),
        ("/api/chat", "messages not an array", br#"{"messages": "hi"}"#.to_vec(), 400),
        ("/api/chat", "format a number", chat(r#", "format": 5"#), 400),
        ("/api/chat", "options not an object", chat(r#", "options": [1]"#), 400),
        ("/api/chat", "temperature a string", chat(r#", "options": {"temperature": "hot"}"#), 400),
        ("/api/chat", "num_predict a string", chat(r#", "options": {"num_predict": "many"}"#), 400),
        ("/api/chat", "repeat_penalty above 2", chat(r#", "options": {"repeat_penalty": 5}"#), 400),
        ("/api/chat", "presence_penalty a string", chat(r#", "options": {"presence_penalty": "some"}"#), 400),
        ("/api/chat", "min_p above 1", chat(r#", "options": {"min_p": 2}"#), 400),
        ("/api/chat", "stream a string", chat(r#", "stream": "yes""#), 400),
        ("/api/chat", "think a number", chat(r#", "think": 3"#), 400),
        ("/api/chat", "images", br#"{"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}"#.to_vec(), 400),
        ("/api/chat", "tool arguments a number", br#"{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]}"#.to_vec(), 400),
        ("/api/chat", "unknown model", br#"{"model": "llama9:70b", "messages": [{"role": "user", "content": "x"}]}"#.to_vec(), 404),
        ("/api/chat", "body over the limit", huge_ollama.clone().into_bytes(), 413),
        ("/api/generate", "prompt a number", br#"{"prompt": 3}"#.to_vec(), 400),
        ("/api/generate", "raw a string", br#"{"prompt": "x", "raw": "yes"}"#.to_vec(), 400),
        ("/api/show", "no model", b"{}".to_vec(), 400),
        ("/api/show", "unknown model", br#"{"model": "nope"}"#.to_vec(), 404),
        ("/api/pull", "no model", b"{}".to_vec(), 400),
        ("/api/pull", "unknown model", br#"{"model": "nope:7b"}"#.to_vec(), 404),
        ("/api/nope", "unknown route", b"{}".to_vec(), 404),
        ("/v1/messages", "truncated JSON", br#"{"model": "#.to_vec(), 400),
        ("/v1/messages", "no max_tokens", br#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#.to_vec(), 400),
        ("/v1/messages", "empty messages", br#"{"model": "m", "max_tokens": 4, "messages": []}"#.to_vec(), 400),
        ("/v1/messages", "only system messages", br#"{"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}"#.to_vec(), 400),
        ("/v1/messages", "a role of no kind", br#"{"model": "m", "max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]}"#.to_vec(), 400),
        ("/v1/messages", "image block", br#"{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}"#.to_vec(), 400),
        ("/v1/messages", "tool without input_schema", msg(r#", "tools": [{"name": "f"}]"#), 400),
        ("/v1/messages", "bad tool_choice", msg(r#", "tool_choice": {"type": "sometimes"}"#), 400),
        ("/v1/messages", "tool_choice naming no tool", msg(r#", "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "g"}"#), 400),
        ("/v1/messages", "temperature above 1", msg(r#", "temperature": 1.5"#), 400),
        ("/v1/messages", "unknown model", br#"{"model": "gpt-nope", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}"#.to_vec(), 404),
        ("/v1/messages", "body over the limit", huge_ollama.into_bytes(), 413),
        ("/v1/messages/count_tokens", "no messages", br#"{"model": "m"}"#.to_vec(), 400),
    ];
    for (path, what, body, want) in corpus {
        let (st, b) = http(&d.socket, "POST", path, &body);
        assert_eq!(st, want, "{path} {what}: {}", String::from_utf8_lossy(&b));
        let v = json_of(&b);
        if path.starts_with("/api/") {
            assert!(v["error"].as_str().is_some_and(|m| !m.is_empty()), "{path} {what}: {v}");
        } else {
            assert_eq!(v["type"], "error", "{path} {what}: {v}");
            assert!(
                v["error"]["type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("error") || t == "request_too_large"),
                "{path} {what}: {v}"
            );
            assert!(
                v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{path} {what}: {v}"
            );
        }
    }
    // Embeddings: the served model embeds; a bad request is Ollama's 400.
    let (st, b) = http(&d.socket, "POST", "/api/embed", br#"{"input": "x"}"#);
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&b));
    assert_eq!(json_of(&b)["embeddings"].as_array().map(Vec::len), Some(1));
    let (st, b) = http(&d.socket, "POST", "/api/embed", br#"{"input": []}"#);
    assert_eq!(st, 400);
    assert!(json_of(&b)["error"].as_str().unwrap().contains("input"));
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
    agentd_tests::python_check(
        &python,
        "sdk_check.py",
        &[&format!("http://{listen}/v1"), "test-token-0123456789abcdef", &model_id],
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
    let schemas = agentd_tests::workspace_root().join("tests/data/schemas");
    agentd_tests::python_check(
        &python,
        "constrained_check.py",
        &[
            &format!("http://{listen}/v1"),
            "test-token-0123456789abcdef",
            &model_id,
            schemas.to_str().unwrap(),
        ],
    );
}

/// Every tool-call format on the default model (`serve --tool-format
/// NAME`), through the openai SDK: `required` and a named function give a
/// call valid against its schema on a prompt that asks not to call;
/// `none` gives no call and no opener text on a prompt that asks for one.
#[test]
fn every_format_enforces_tool_choice_on_the_default_model() {
    let test = "every_format_enforces_tool_choice_on_the_default_model";
    let (Some(_), Some(python)) = (model(), agentd_tests::python(test)) else {
        return;
    };
    let mut failed = Vec::new();
    for name in toolparse::Format::NAMES {
        let format = toolparse::Format::from_name(name).unwrap();
        let h = Home::new();
        let token = h.write("token", "test-token-0123456789abcdef");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let listen = format!("127.0.0.1:{port}");
        let d = start(
            &h,
            &["--listen", &listen, "--token-file", token.to_str().unwrap(), "--tool-format", name],
        );
        let (_, b) = http(&d.socket, "GET", "/health", b"");
        let model_id = json_of(&b)["model"].as_str().unwrap().to_owned();
        let openers = serde_json::to_string(format.call_openers()).unwrap();
        let out = std::process::Command::new(&python)
            .arg(agentd_tests::workspace_root().join("tests/python/formats_check.py"))
            .args([&format!("http://{listen}/v1"), "test-token-0123456789abcdef", &model_id])
            .args([name, openers.as_str()])
            .output()
            .unwrap();
        eprint!("{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            failed.push(String::from_utf8_lossy(&out.stderr).into_owned());
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// `serve --socket PATH` where PATH is a regular file: refused, and the
/// file is left as it was (only a stale socket is replaced).
#[test]
fn serve_does_not_delete_a_file_at_the_socket_path() {
    let Some(m) = model() else { return };
    let h = Home::new();
    let file = h.write("notes.txt", "keep me");
    let out = h
        .cmd(&["serve", "--model", m.to_str().unwrap(), "--socket", file.to_str().unwrap()])
        .output()
        .expect("serve runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
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
    // Normally: an answer, or — when the tiny model's text loops — the
    // labelled excerpt that replaces junk (never cancelled, never an error).
    assert!(
        done.contains("\"outcome\":\"answered\"") || done.contains("\"outcome\":\"excerpt\""),
        "{done}"
    );
    assert!(content > 0, "no content after the completion");
}

/// One raw HTTP/1.1 request over TCP with extra header lines; returns the
/// status and the whole response text.
fn tcp(addr: &str, head: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    write!(s, "{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_tcp(addr: &str) {
    let t = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(t.elapsed() < Duration::from_secs(30), "{addr} did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The clients users already have (issue 17): the official `ollama` client
/// on the tokenless loopback listener, the official `anthropic` SDK on the
/// token listener, the listener's guard (non-loopback refused at start,
/// foreign Host refused, no CORS grant to a foreign Origin), and voice
/// sentences from a research run, each rendered by espeak-ng.
#[test]
fn ollama_anthropic_and_voice_clients_on_the_real_model() {
    let test = "ollama_anthropic_and_voice_clients_on_the_real_model";
    let (Some(m), Some(python)) = (model(), agentd_tests::python(test)) else {
        return;
    };
    let h = Home::new();
    // A non-loopback --ollama address is refused before anything loads.
    let out = h.run(&["serve", "--model", m.to_str().unwrap(), "--ollama", "0.0.0.0:11434"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loopback") && err.contains("--token-file"), "{err}");
    // The default model, present under its registry name, for /api/pull.
    std::fs::create_dir_all(h.path().join("models")).unwrap();
    std::os::unix::fs::symlink(&m, h.path().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
        .unwrap();
    let token = h.write("token", "test-token-0123456789abcdef");
    let corpus = h.corpus();
    let (listen, ollama) =
        (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let d = start(
        &h,
        &[
            "--listen",
            &listen,
            "--token-file",
            token.to_str().unwrap(),
            "--ollama",
            &ollama,
            "--allow-origin",
            "http://good.example",
            "--corpus",
            corpus.to_str().unwrap(),
        ],
    );
    wait_tcp(&listen);
    wait_tcp(&ollama);

    // The guard: DNS rebinding (a foreign Host) is refused; a foreign
    // Origin gets no CORS grant (and cannot act); a named one does.
    let (st, out) = tcp(&ollama, "GET /api/tags HTTP/1.1\r\nHost: attacker.example\r\n", "");
    assert_eq!(st, 403, "{out}");
    assert!(out.contains(r#"{"error":"#), "{out}");
    let (st, out) = tcp(
        &ollama,
        "GET /api/tags HTTP/1.1\r\nHost: localhost\r\nOrigin: http://attacker.example\r\n",
        "",
    );
    assert_eq!(st, 200, "{out}");
    assert!(!out.to_ascii_lowercase().contains("access-control-allow-origin"), "{out}");
    let (st, out) = tcp(&ollama, "POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://attacker.example\r\nContent-Type: text/plain\r\n", r#"{"prompt": "hi"}"#);
    assert_eq!(st, 403, "{out}");
    assert!(!out.to_ascii_lowercase().contains("access-control-allow-origin"), "{out}");
    let (st, out) = tcp(&ollama, "OPTIONS /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://good.example\r\nAccess-Control-Request-Method: POST\r\n", "");
    assert!(st == 204 && out.contains("access-control-allow-origin: http://good.example"), "{out}");
    // The tokenless listener serves no records.
    let (st, _) = tcp(&ollama, "GET /v1/chats HTTP/1.1\r\nHost: localhost\r\n", "");
    assert_eq!(st, 404);

    let run_py = |script: &str, args: &[&str]| {
        agentd_tests::python_check(&python, script, args);
    };
    run_py("ollama_check.py", &[&format!("http://{ollama}"), "smollm2-135m-instruct-q4_1"]);
    let (_, b) = http(&d.socket, "GET", "/health", b"");
    let model_id = json_of(&b)["model"].as_str().unwrap().to_owned();
    run_py(
        "anthropic_check.py",
        &[&format!("http://{listen}"), "test-token-0123456789abcdef", &model_id],
    );

    // Voice: sentences arrive as they complete, before done, each plain.
    let body =
        json!({"question": "How does the daemon listen for clients? Answer in a few sentences.",
        "voice": true, "max_tool_iters": 1})
        .to_string();
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    write!(
        s,
        "POST /v1/research HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let t0 = Instant::now();
    let mut r = BufReader::new(s);
    let (mut line, mut sentences, mut first) = (String::new(), Vec::new(), None);
    let mut first_content = None;
    let done = loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "the stream ended without done");
        let Some(data) = line.trim().strip_prefix("data:") else { continue };
        let Ok(v) = serde_json::from_str::<Value>(data.trim()) else { continue };
        if v["type"] == "content" {
            first_content.get_or_insert(t0.elapsed());
        } else if v["type"] == "sentence" {
            first.get_or_insert(t0.elapsed());
            sentences.push(v);
        } else if v["type"] == "done" {
            break v;
        }
    };
    let whole = t0.elapsed();
    assert!(!sentences.is_empty(), "no sentence before done: {done}");
    for v in &sentences {
        let t = v["text"].as_str().unwrap();
        assert!(!t.trim().is_empty(), "{v}");
        for bad in ["[S", "http", "**", "`", "<", "](", "# "] {
            assert!(!t.contains(bad), "not plain ({bad:?}): {t}");
        }
    }
    eprintln!(
        "voice: {} sentence(s), {} progress; first text after {:?}, first sentence after {:?}, whole answer after {whole:?} ({})",
        sentences.len(),
        sentences.iter().filter(|v| v["kind"] == "progress").count(),
        first_content,
        first.unwrap(),
        done["outcome"]
    );
    if let Some(espeak) = agentd_tests::dep("AGENTD_TEST_ESPEAK", test) {
        for (i, v) in sentences.iter().enumerate() {
            let wav = h.path().join(format!("s{i}.wav"));
            let st = Command::new(&espeak)
                .arg("-w")
                .arg(&wav)
                .arg("--")
                .arg(v["text"].as_str().unwrap())
                .status()
                .unwrap();
            assert!(st.success(), "espeak-ng failed on {v}");
            let len = std::fs::metadata(&wav).unwrap().len();
            assert!(len > 44, "{v} rendered to an empty WAV ({len} bytes)");
        }
    }
    let (st, _) = http(&d.socket, "GET", "/health", b"");
    assert_eq!(st, 200);
}

/// Slow clients: 150 connections that send half a header — on the token
/// listener and the tokenless `--ollama` one, under a 128-descriptor limit
/// — do not starve the Unix socket, and the daemon drops each after
/// `server/header-timeout`; a body trickled past `server/body-timeout` is
/// a 408. (Before: `axum::serve` had no timer and no cap; all 150 were
/// open after 45 s and `/health` on the socket went unanswered.) Runs on
/// the scripted provider: no model needed.
#[test]
fn slow_clients_are_dropped_and_the_socket_keeps_answering() {
    use std::net::TcpStream;
    let h = Home::new();
    h.write(
        "policies.toml",
        "[values]\n\"server/header-timeout\" = 3\n\"server/body-timeout\" = 3\n",
    );
    let script = h.write("s.jsonl", r#"{"content": "ok"}"#);
    let token = h.write("token", "slow-token-0123456789abcdef");
    let socket = h.path().join("d.sock");
    let (port, oport) = (free_port(), free_port());
    let serve = format!(
        "ulimit -n 128 && exec '{}' serve --provider scripted --script '{}' --socket '{}' --listen 127.0.0.1:{port} --token-file '{}' --ollama 127.0.0.1:{oport}",
        agentd_tests::agentd_bin().display(),
        script.display(),
        socket.display(),
        token.display()
    );
    let mut sh = Command::new("sh");
    sh.args(["-c", &serve]).env("AGENTD_HOME", h.path()).env("AGENTD_NO_HUB", "1");
    let child = sh.stderr(Stdio::piped()).spawn().expect("serve starts");
    let _d = Daemon { child, socket: socket.clone() };
    let t = Instant::now();
    while UnixStream::connect(&socket).is_err() {
        assert!(t.elapsed() < Duration::from_secs(60), "the daemon did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut held: Vec<TcpStream> = (0..150)
        .map(|i| {
            let mut s = TcpStream::connect(("127.0.0.1", if i % 2 == 0 { port } else { oport }))
                .expect("connect");
            s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let (status, body) = http(&socket, "GET", "/health", b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(t.elapsed() < Duration::from_secs(2), "the socket answered late: {:?}", t.elapsed());

    // A body that never arrives whole: 408 once the body timeout passes.
    let mut s = UnixStream::connect(&socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\"").unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");

    // Every half-header connection is closed by the daemon: those held
    // first after 3 s, those waiting for a slot after theirs.
    let deadline = Instant::now() + Duration::from_secs(40);
    for (i, s) in held.iter_mut().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        s.set_read_timeout(Some(left)).unwrap();
        let mut buf = [0u8; 256];
        match s.read(&mut buf) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("connection {i} still open after {:?}: {e}", t.elapsed()),
        }
    }
    eprintln!("all 150 slow connections closed after {:?}", t.elapsed());
    let (status, _) = http(&socket, "GET", "/health", b"");
    assert_eq!(status, 200);
}

/// The events of a streamed `POST /v1/research` answer (SSE `data:` lines).
fn sse_events(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|l| json_of(l.trim().as_bytes()))
        .collect()
}

/// A research run over the socket: its `run_id`, its `run` event's
/// `max_tool_iters`, and the rounds limit of its stored admission
/// snapshot; it must end with `done`.
fn research(socket: &Path) -> (String, u64, Value) {
    let (status, body) = http(socket, "POST", "/v1/research", br#"{"question": "q"}"#);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let evs = sse_events(&body);
    assert_eq!(evs.last().map(|e| e["type"].clone()), Some(json!("done")), "{evs:?}");
    let run = evs.iter().find(|e| e["type"] == "run").expect("a run event");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let (status, rec) = http(socket, "GET", &format!("/v1/runs/{id}"), b"");
    assert_eq!(status, 200);
    let rounds =
        json_of(&rec)["snapshot"]["policies"]["research-runtime/tool-research-rounds"].clone();
    (id, run["max_tool_iters"].as_u64().unwrap(), rounds)
}

/// A setting changed over HTTP applies to the next run the running daemon
/// admits, without a restart (issue 31, item 6): the PUT answers that it
/// applies from the next run, a run admitted before it keeps the snapshot
/// it was admitted under, the next run has the new limit, and after a
/// DELETE the one after has the default again.
#[test]
fn a_changed_setting_applies_to_the_next_run_and_not_to_one_running() {
    let h = Home::new();
    let script = h.write(
        "s.jsonl",
        "{\"when\": \"research\", \"delay_ms\": 1500, \"content\": \"ok\"}\n{\"when\": \"final\", \"content\": \"ok\"}\n",
    );
    let socket = h.path().join("d.sock");
    let args = [
        "serve",
        "--provider",
        "scripted",
        "--script",
        script.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ];
    let child = h.cmd(&args).stderr(Stdio::piped()).spawn().expect("serve starts");
    let _d = Daemon { child, socket: socket.clone() };
    let t = Instant::now();
    while UnixStream::connect(&socket).is_err() {
        assert!(t.elapsed() < Duration::from_secs(60), "the daemon did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A run admitted before the change (its first turn takes 1.5 s).
    let sock = socket.clone();
    let before = std::thread::spawn(move || research(&sock));
    let t = Instant::now();
    loop {
        let (_, chats) = http(&socket, "GET", "/v1/chats", b"");
        if !json_of(&chats)["data"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the first run was not admitted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, body) =
        http(&socket, "PUT", "/v1/settings/chat.max_tool_iters", br#"{"value": 3}"#);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let put = json_of(&body);
    assert_eq!((&put["value"], &put["applies"]), (&json!(3), &json!("next_run")), "{put}");

    let (_, iters, rounds) = before.join().expect("the first run");
    assert_eq!((iters, rounds), (12, json!(12)), "the run admitted before the change");
    let (_, iters, rounds) = research(&socket);
    assert_eq!((iters, rounds), (3, json!(3)), "the run admitted after the change");

    let (status, body) = http(&socket, "DELETE", "/v1/settings/chat.max_tool_iters", b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json_of(&body)["value"], 12);
    let (_, iters, rounds) = research(&socket);
    assert_eq!((iters, rounds), (12, json!(12)), "the run admitted after the reset");
}
