//! The coding agents' APIs end to end, driven by the official SDKs:
//! Claude Code's request shapes on the Messages API
//! (`tests/python/agents_check.py`) and OpenAI's Responses API with the
//! Agents SDK (`tests/python/responses_check.py`) on `agentd serve
//! --provider scripted` (scripts in `tests/data/agents/`), and the
//! Responses API's structured output and context errors on the real
//! default model.

use agentd_tests::{python_check, Home, Killed};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const TOKEN: &str = "test-token-0123456789abcdef";

/// `agentd serve` on a loopback port with a token, `engine` naming what
/// runs the model; the daemon and its base URL.
fn serve(home: &Home, engine: &[&str]) -> (Killed, String) {
    let token = home.write("token", TOKEN);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let socket = home.path().join("agentd.sock");
    let mut args = vec![
        "serve",
        "--socket",
        socket.to_str().unwrap(),
        "--listen",
        &listen,
        "--token-file",
        token.to_str().unwrap(),
        "--threads",
        "2",
    ];
    args.extend_from_slice(engine);
    let child = home.cmd(&args).stderr(std::process::Stdio::null()).spawn().expect("serve starts");
    let daemon = Killed(child);
    let t = Instant::now();
    while TcpStream::connect(&listen).is_err() {
        assert!(t.elapsed() < Duration::from_secs(60), "the daemon did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    (daemon, format!("http://{listen}"))
}

/// A script of `tests/data/agents/`, written into `home` with `LOG` made
/// a path there; the script's path and the log's.
fn script(home: &Home, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let log = home.path().join("heard.jsonl");
    let text = std::fs::read_to_string(
        agentd_tests::workspace_root().join("tests/data/agents").join(name),
    )
    .unwrap()
    .replace("LOG", log.to_str().unwrap());
    (home.write("script.jsonl", &text), log)
}

/// Claude Code's request shape on the Messages API, streamed and not, a
/// scripted tool call and its result's round trip, and the OpenAI route on
/// the same scripted backend.
#[test]
fn claude_code_shaped_requests_are_served_on_the_scripted_backend() {
    let test = "claude_code_shaped_requests_are_served_on_the_scripted_backend";
    let Some(python) = agentd_tests::python(test) else { return };
    let home = Home::new();
    let (script, log) = script(&home, "claude-code.jsonl");
    let (_daemon, base) =
        serve(&home, &["--provider", "scripted", "--script", script.to_str().unwrap()]);
    python_check(&python, "agents_check.py", &[&base, TOKEN, log.to_str().unwrap()]);
}

/// The Responses API with the `openai` SDK (plain, streamed in order,
/// function calls with `previous_response_id`, kept responses) and the
/// Agents SDK's Runner with a function tool.
#[test]
fn the_responses_api_serves_the_openai_sdks_on_the_scripted_backend() {
    let test = "the_responses_api_serves_the_openai_sdks_on_the_scripted_backend";
    let Some(python) = agentd_tests::python(test) else { return };
    let home = Home::new();
    let (script, _) = script(&home, "responses.jsonl");
    let (_daemon, base) =
        serve(&home, &["--provider", "scripted", "--script", script.to_str().unwrap()]);
    python_check(&python, "responses_check.py", &["scripted", &base, TOKEN]);
}

/// On the real default model: a json_schema `text.format` is held to its
/// schema; a prompt beyond the context is refused at once (400, and
/// `response.failed` when streamed, both `context_length_exceeded`).
#[test]
fn the_responses_api_holds_the_real_model_to_a_schema_and_its_context() {
    let test = "the_responses_api_holds_the_real_model_to_a_schema_and_its_context";
    let Some(model) = agentd_tests::dep("AGENTD_TEST_MODEL", test) else { return };
    let Some(python) = agentd_tests::python(test) else { return };
    let home = Home::new();
    let (_daemon, base) = serve(&home, &["--model", model.to_str().unwrap()]);
    python_check(&python, "responses_check.py", &["model", &base, TOKEN]);
}
