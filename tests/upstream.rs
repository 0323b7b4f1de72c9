//! `agentd serve --provider openai` in front of an upstream engine: a real
//! llama-server (`AGENTD_TEST_LLAMA_BIN`, the default model
//! `AGENTD_TEST_MODEL`, `--jinja`) driven by the `openai` SDK and raw HTTP
//! over the Unix socket, a research run whose ledger holds the upstream
//! requests, a disconnect that stops the upstream's generation, the
//! upstream killed mid-reply; and a mock upstream for the failure
//! classifications (quota vs transient) and markup kept out of `content`.

use agentd_tests::{python_check, Home, Killed, MockOpenAi, Reply};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A llama-server on the default model, up (its /health answers 200).
fn llama(test: &str) -> Option<(Killed, u16)> {
    let model = agentd_tests::dep("AGENTD_TEST_MODEL", test)?;
    let bin = agentd_tests::dep("AGENTD_TEST_LLAMA_BIN", test)?;
    let port = free_port();
    let child = Command::new(bin.join("llama-server"))
        .args(["-m", model.to_str().unwrap(), "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-t", "2", "--jinja", "--no-webui", "-c", "16384", "-np", "2", "--metrics"])
        .env("LD_LIBRARY_PATH", &bin)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("llama-server starts");
    let p = Killed(child);
    let t = Instant::now();
    loop {
        if tcp_get(port, "/health").is_some_and(|(st, _)| st == 200) {
            return Some((p, port));
        }
        assert!(t.elapsed() < Duration::from_secs(60), "llama-server did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn tcp_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let st = out.split_whitespace().nth(1)?.parse().ok()?;
    Some((st, out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default()))
}

/// `agentd serve --provider openai` over `base`, up on its socket.
fn serve(h: &Home, base: &str, model: &str, extra: &[&str]) -> (Killed, PathBuf) {
    let socket = h.path().join("d.sock");
    let mut args = vec!["serve", "--provider", "openai", "--base-url", base, "--model", model];
    args.extend_from_slice(&["--socket", socket.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let child = h.cmd(&args).stderr(Stdio::inherit()).spawn().expect("serve starts");
    let mut p = Killed(child);
    let t = Instant::now();
    while UnixStream::connect(&socket).is_err() {
        assert!(p.0.try_wait().unwrap().is_none(), "the daemon exited");
        assert!(t.elapsed() < Duration::from_secs(60), "the daemon did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    (p, socket)
}

/// One raw HTTP/1.1 request over the socket; returns status and body.
fn http(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let st = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (st, body)
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

fn json_of(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// SSE `data:` payloads of a body, as JSON where they are.
fn sse(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// Starts a streaming POST and reads until `n` lines contain `needle`.
fn stream_until(sock: &Path, path: &str, body: &str, needle: &str, n: usize) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    write!(s, "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let (mut line, mut seen) = (String::new(), 0);
    while seen < n {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            panic!("the stream ended before {n} lines with {needle}");
        }
        if line.contains(needle) {
            seen += 1;
        }
    }
    s
}

#[test]
fn serve_fronts_a_real_llama_server() {
    let test = "serve_fronts_a_real_llama_server";
    let Some((_llama, port)) = llama(test) else { return };
    let h = Home::new();
    // Short research turns keep the run quick on a small CPU.
    h.write("policies.toml", "[values]\n\"prompts/turn-output-tokens\" = 96\n");
    let token = h.write("token", "test-token-0123456789abcdef");
    let listen = format!("127.0.0.1:{}", free_port());
    let base = format!("http://127.0.0.1:{port}/v1");
    let (_d, sock) = serve(
        &h,
        &base,
        "smollm2-135m",
        &["--listen", &listen, "--token-file", token.to_str().unwrap()],
    );

    // Health names the upstream; the model list shows it under our name.
    let (st, b) = http(&sock, "GET", "/health", "");
    assert_eq!(st, 200);
    let v = json_of(&b);
    assert_eq!(v["upstream"]["base_url"], base.as_str(), "{v}");
    assert_eq!(v["upstream"]["reachable"], true, "{v}");
    let (_, b) = http(&sock, "GET", "/v1/models", "");
    assert_eq!(json_of(&b)["data"][0]["id"], "smollm2-135m", "{b}");

    // Raw HTTP over the socket, whole and streamed.
    let (st, b) = http(
        &sock,
        "POST",
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}"#,
    );
    assert_eq!(st, 200, "{b}");
    let v = json_of(&b);
    assert_eq!(v["object"], "chat.completion");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{v}");
    let (st, b) = http(
        &sock,
        "POST",
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": true}"#,
    );
    assert_eq!(st, 200);
    assert!(b.trim_end().ends_with("data: [DONE]"), "{b}");
    assert!(sse(&b).iter().any(|c| c["choices"][0]["delta"]["content"].is_string()), "{b}");

    // The official SDK over TCP with the token, the same checks as against
    // the local engine.
    if let Some(python) = agentd_tests::python(test) {
        python_check(
            &python,
            "sdk_check.py",
            &[&format!("http://{listen}/v1"), "test-token-0123456789abcdef", "smollm2-135m"],
        );
    }

    // A research run: `done` names its run and chat; the ledger holds
    // every upstream request.
    let (st, b) = http(
        &sock,
        "POST",
        "/v1/research",
        r#"{"question": "What is a socket?", "stream": false, "max_tool_iters": 1}"#,
    );
    assert_eq!(st, 200, "{b}");
    let done = json_of(&b);
    let run_id = done["run_id"].as_str().expect("done carries run_id").to_owned();
    assert!(done["chat_id"].as_str().is_some_and(|c| c.starts_with("chat")), "{done}");
    let (_, b) = http(&sock, "GET", &format!("/v1/runs/{run_id}"), "");
    let run = json_of(&b);
    let ledger = run["ledger"].as_array().expect("ledger");
    assert!(!ledger.is_empty(), "{run}");
    let requests = done["model_requests"].as_u64().unwrap();
    assert!(requests >= 1 && ledger.len() as u64 >= requests, "every request in the ledger: {run}");
    assert!(run["snapshot"].to_string().contains(&base), "the run records its upstream: {run}");

    // A client that goes away stops the upstream's generation: its slots
    // go idle long before 4000 tokens could be generated.
    let s = stream_until(
        &sock,
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Write a very long story about a ship."}], "max_tokens": 4000, "stream": true, "temperature": 0.8, "seed": 1}"#,
        "\"content\"",
        3,
    );
    drop(s);
    let t = Instant::now();
    loop {
        let (_, b) = tcp_get(port, "/slots").expect("llama-server answers /slots");
        let slots = json_of(&b);
        let busy = slots.as_array().unwrap().iter().any(|s| s["is_processing"] == true);
        if !busy {
            let decoded: u64 = slots
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|s| {
                    s["next_token"][0]["n_decoded"].as_u64().or(s["n_decoded"].as_u64())
                })
                .max()
                .unwrap_or(0);
            assert!(decoded < 4000, "the upstream generated all {decoded} tokens");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "the upstream kept generating: {slots}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, m) = http(&sock, "GET", "/metrics", "");
    assert!(m.contains("agentd_upstream_concurrency 16"), "{m}");
}

#[test]
fn the_upstream_killed_mid_reply_leaves_the_text_interrupted() {
    let test = "the_upstream_killed_mid_reply_leaves_the_text_interrupted";
    let Some((mut llama, port)) = llama(test) else { return };
    let h = Home::new();
    h.write(
        "policies.toml",
        "[values]\n\"provider/transient-retries\" = 1\n\"provider/retry-backoff\" = 10\n",
    );
    let base = format!("http://127.0.0.1:{port}/v1");
    let (_d, sock) = serve(&h, &base, "smollm2-135m", &[]);
    let body = json!({"question": "Write a long explanation of how sockets work, with many details.", "chat_id": "chat_up"}).to_string();
    let s = stream_until(&sock, "/v1/research", &body, "\"type\":\"content\"", 5);
    let _ = llama.0.kill(); // SIGKILL
    let _ = llama.0.wait();
    let mut rest = String::new();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let _ = BufReader::new(s).read_to_string(&mut rest);
    let done = rest
        .lines()
        .filter_map(|l| l.split_once("data: ").map(|(_, d)| d))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == "done")
        .unwrap_or_else(|| panic!("no done event: {rest}"));
    let class = done["error"]["classification"].as_str().unwrap_or_default();
    assert!(
        matches!(class, "transient" | "provider_unavailable"),
        "the upstream's failure: {done}"
    );
    let (st, b) = http(&sock, "GET", "/v1/chats/chat_up", "");
    assert_eq!(st, 200);
    let v = json_of(&b);
    let a = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant")
        .unwrap_or_else(|| panic!("assistant message kept: {v}"));
    assert_eq!(a["status"], "interrupted", "{a}");
    assert!(!a["content"].as_str().unwrap().is_empty());
    // Health says the upstream is gone; a new daemon refuses to start
    // without --wait-upstream, saying what to do.
    let (_, b) = http(&sock, "GET", "/health", "");
    assert_eq!(json_of(&b)["upstream"]["reachable"], false, "{b}");
    let h2 = Home::new();
    let out = h2
        .cmd(&["serve", "--provider", "openai", "--base-url", &base, "--model", "m"])
        .arg("--socket")
        .arg(h2.path().join("s.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the upstream") && err.contains("--wait-upstream"), "{err}");
}

#[test]
fn upstream_failures_keep_their_classification_and_markup_stays_out_of_content() {
    let markup =
        r#"Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>"#;
    let mock = MockOpenAi::start(move |_, body| {
        if body.is_null() {
            return Reply::Status(200, r#"{"object": "list", "data": [{"id": "m"}]}"#.into());
        }
        let q = body["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
        match q.as_str() {
            "quota" => Reply::Status(
                429,
                r#"{"error": {"code": "insufficient_quota", "message": "out of credit"}}"#.into(),
            ),
            "busy" => Reply::Status(503, r#"{"error": {"message": "overloaded"}}"#.into()),
            _ => Reply::Stream {
                content: markup.into(),
                calls: vec![("get_weather".into(), r#"{"city": "Rome"}"#.into())],
            },
        }
    });
    let h = Home::new();
    h.write(
        "policies.toml",
        "[values]\n\"provider/transient-retries\" = 1\n\"provider/retry-backoff\" = 10\n",
    );
    let (_d, sock) = serve(&h, &mock.base(), "m", &[]);
    let ask = |q: &str, extra: &str| {
        http(
            &sock,
            "POST",
            "/v1/chat/completions",
            &format!(r#"{{"messages": [{{"role": "user", "content": "{q}"}}]{extra}}}"#),
        )
    };
    let (st, b) = ask("quota", "");
    assert_eq!(st, 429, "{b}");
    assert_eq!(json_of(&b)["error"]["code"], "upstream_quota_exhausted", "{b}");
    let (st, b) = ask("busy", "");
    assert_eq!(st, 502, "{b}");
    assert_eq!(json_of(&b)["error"]["code"], "transient", "{b}");
    let busy_calls =
        mock.requests().iter().filter(|r| r.body["messages"][0]["content"] == "busy").count();
    assert_eq!(busy_calls, 2, "one retry, owned by the provider layer");
    let tools = r#", "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]"#;
    // Tools offered: the markup in content is parsed into a call too.
    let (st, b) = ask("weather", tools);
    assert_eq!(st, 200, "{b}");
    let m = &json_of(&b)["choices"][0]["message"];
    let names: Vec<&str> = m["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["function"]["name"].as_str())
        .collect();
    assert_eq!(names, ["get_weather", "get_weather"], "{m}");
    assert!(!m["content"].as_str().unwrap_or_default().contains("<tool_call>"), "{m}");
    // tool_choice none: no calls, no markup, streamed or not.
    for stream in ["false", "true"] {
        let (st, b) =
            ask("weather", &format!(r#"{tools}, "tool_choice": "none", "stream": {stream}"#));
        assert_eq!(st, 200, "{b}");
        assert!(!b.contains("<tool_call>") && !b.contains("\"tool_calls\""), "{b}");
        assert!(b.contains("Sure."), "{b}");
    }
    let (_, m) = http(&sock, "GET", "/metrics", "");
    assert!(
        m.contains("agentd_errors_total{classification=\"upstream_quota_exhausted\"} 1"),
        "{m}"
    );
    assert!(m.contains("agentd_errors_total{classification=\"transient\"} 1"), "{m}");
}
