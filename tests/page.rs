//! The built-in chat page end to end: `agentd serve` with the real default
//! model on a TCP listener with a token, its sign-in over raw HTTP, then the
//! page in headless Chromium driven by Playwright for Python
//! (`python/page_check.py`): the token link, the settings' bounds, a
//! question over `docs/` streamed to `data-role="done"`, stop, the chat list
//! after a reload, a scripted model that writes `<script>` and
//! `<img onerror>` (shown as text, never run), the excerpt label, 360 px.
//! Screenshots go to `target/page-*.png`. Needs `AGENTD_TEST_MODEL`,
//! `AGENTD_TEST_PYTHON` and `AGENTD_TEST_CHROMIUM` (skipped without them).

use agentd_tests::{dep, done, events, of, python, python_check, workspace_root, Home, Killed};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

const TOKEN: &str = "page-token-0123456789abcdef";

/// A scripted run in the test's home, as the page will later find it.
fn scripted(h: &Home, script: &str, chat: &str, question: &str) -> Vec<Value> {
    let root = workspace_root();
    let script = root.join("tests/data/page").join(script);
    let docs = root.join("docs");
    let out = h
        .cmd(&[
            "ask",
            "--provider",
            "scripted",
            "--script",
            script.to_str().unwrap(),
            "--corpus",
            docs.to_str().unwrap(),
            "--events",
            "--chat",
            chat,
            question,
        ])
        .env("AGENTD_CHAT_MAX_TOOL_ITERS", "1")
        .output()
        .expect("agentd ask runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    events(&out)
}

/// One raw HTTP/1.1 request over TCP: status, head (lower-cased) and body.
fn http(addr: &str, req: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (status, head.to_ascii_lowercase(), body.to_owned())
}

fn get(addr: &str, path: &str, extra: &str) -> (u16, String, String) {
    http(addr, &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n"))
}

#[test]
fn the_chat_page_in_headless_chromium() {
    let test = "the_chat_page_in_headless_chromium";
    let (Some(model), Some(py), Some(chromium)) =
        (dep("AGENTD_TEST_MODEL", test), python(test), dep("AGENTD_TEST_CHROMIUM", test))
    else {
        return;
    };
    let h = Home::new();

    // Two scripted chats for the page to reopen: one whose model writes
    // HTML (its events are also streamed to the page), one excerpt.
    let xss = scripted(&h, "xss.jsonl", "chat_xss", "What does the model write?");
    let d = done(&xss);
    assert_eq!(d["outcome"], "answered", "{d}");
    assert!(d["answer"].as_str().unwrap().contains("<script>"), "{d}");
    assert_eq!(of(&xss, "discarded_call").len(), 1);
    let lines: Vec<String> = xss.iter().map(Value::to_string).collect();
    let xss_events = h.write("xss-events.jsonl", &(lines.join("\n") + "\n"));
    let ex = scripted(&h, "excerpt.jsonl", "chat_excerpt", "What is the budget?");
    assert_eq!(done(&ex)["outcome"], "excerpt");

    // serve on TCP with a token; it prints the page's link.
    let token = h.write("token", TOKEN);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let docs = workspace_root().join("docs");
    let socket = h.path().join("d.sock");
    let mut child = h
        .cmd(&[
            "serve",
            "--model",
            model.to_str().unwrap(),
            "--corpus",
            docs.to_str().unwrap(),
            "--socket",
            socket.to_str().unwrap(),
            "--listen",
            &addr,
            "--token-file",
            token.to_str().unwrap(),
            "--threads",
            "2",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let stderr = child.stderr.take().unwrap();
    let _d = Killed(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
            // Not a terminal: the log names the file that holds the link
            // (the token stays out of logs).
            if let Some((_, file)) = line.split_once("(it holds the token) is in ") {
                let _ = tx.send(std::path::PathBuf::from(file));
            }
        }
    });
    let file = rx.recv_timeout(Duration::from_secs(120)).expect("serve says where the link is");
    let link = std::fs::read_to_string(&file).unwrap().trim().to_owned();
    assert_eq!(link, format!("http://{addr}/?token={TOKEN}"));
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the link file is the user's alone");
    }

    // The sign-in over raw HTTP.
    let (st, _, body) = get(&addr, "/", "");
    assert_eq!(st, 401);
    assert!(body.contains("?token="), "the page says how to get the link: {body}");
    assert_eq!(get(&addr, "/?token=wrong-token-0123456789", "").0, 401);
    let (st, head, _) = get(&addr, &format!("/?token={TOKEN}"), "");
    assert_eq!(st, 303, "{head}");
    assert!(head.contains("\r\nlocation: /\r\n"), "{head}");
    let set =
        head.lines().find_map(|l| l.strip_prefix("set-cookie: ")).expect("a cookie").to_owned();
    assert!(set.contains("httponly") && set.contains("samesite=strict"), "{set}");
    assert!(!set.contains(TOKEN), "the cookie holds the token itself: {set}");
    let cookie = set.split(';').next().unwrap().to_owned();
    let with = format!("Cookie: {cookie}\r\n");
    assert_eq!(get(&addr, "/v1/chats", "").0, 401);
    let (st, _, body) = get(&addr, "/v1/chats", &with);
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("chat_xss"));
    let (st, head, body) = get(&addr, "/", &with);
    assert_eq!(st, 200);
    assert!(head.contains("content-security-policy: default-src 'none'"), "{head}");
    assert!(body.contains("textarea id=\"question\" name=\"question\""));
    let (st, head, _) = get(&addr, "/favicon.ico", "");
    assert_eq!(st, 200);
    assert!(head.contains("content-type: image/svg+xml"), "{head}");
    let q = r#"{"question": "q", "stream": false}"#;
    let (st, _, body) = http(
        &addr,
        &format!(
            "POST /v1/research HTTP/1.1\r\nHost: {addr}\r\n{with}Origin: http://evil.test\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{q}",
            q.len()
        ),
    );
    assert_eq!(st, 403, "a cross-origin request with the cookie: {body}");

    // The page in Chromium.
    let out_dir = workspace_root().join("target");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = python_check(
        &py,
        "page_check.py",
        &[
            &link,
            chromium.to_str().unwrap(),
            xss_events.to_str().unwrap(),
            out_dir.to_str().unwrap(),
        ],
    );
    eprintln!("{out}");
    for shot in [
        "page-desktop.png",
        "page-desktop-research.png",
        "page-desktop-research-dark.png",
        "page-360.png",
        "page-360-chats.png",
    ] {
        assert!(out_dir.join(shot).is_file(), "{shot} was not written");
    }
}
