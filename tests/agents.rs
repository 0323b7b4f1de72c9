//! The coding agents' requests end to end: `agentd serve --provider
//! scripted` (no model needed) driven by the official SDKs with the shapes
//! Claude Code sends (`tests/python/agents_check.py`, its script in
//! `tests/data/agents/`).

use agentd_tests::{python_check, Home, Killed};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Claude Code's request shape on the Messages API, streamed and not, a
/// scripted tool call and its result's round trip, and the OpenAI route on
/// the same scripted backend.
#[test]
fn claude_code_shaped_requests_are_served_on_the_scripted_backend() {
    let test = "claude_code_shaped_requests_are_served_on_the_scripted_backend";
    let Some(python) = agentd_tests::python(test) else { return };
    let home = Home::new();
    let log = home.path().join("heard.jsonl");
    let script = std::fs::read_to_string(
        agentd_tests::workspace_root().join("tests/data/agents/claude-code.jsonl"),
    )
    .unwrap()
    .replace("LOG", log.to_str().unwrap());
    let script = home.write("script.jsonl", &script);
    let token = home.write("token", "test-token-0123456789abcdef");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let socket = home.path().join("agentd.sock");
    let child = home
        .cmd(&[
            "serve",
            "--provider",
            "scripted",
            "--script",
            script.to_str().unwrap(),
            "--socket",
            socket.to_str().unwrap(),
            "--listen",
            &listen,
            "--token-file",
            token.to_str().unwrap(),
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("serve starts");
    let _daemon = Killed(child);
    let t = Instant::now();
    while TcpStream::connect(&listen).is_err() {
        assert!(t.elapsed() < Duration::from_secs(30), "the daemon did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    python_check(
        &python,
        "agents_check.py",
        &[&format!("http://{listen}"), "test-token-0123456789abcdef", log.to_str().unwrap()],
    );
}
