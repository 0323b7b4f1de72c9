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

/// The Codex CLI (`codex exec`) with a model provider at `base`'s `/v1`
/// and `wire_api = "responses"`; its exit status and output.
fn codex(npm: &std::path::Path, base: &str, model: &str) -> (Option<i32>, String, Duration) {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let provider = format!(
        "model_providers.agentd={{name=\"agentd\", base_url=\"{base}/v1\", wire_api=\"responses\", env_key=\"AGENTD_TOKEN\"}}"
    );
    let t = Instant::now();
    let out = std::process::Command::new(npm.join(".bin/codex"))
        .args(["exec", "--skip-git-repo-check", "-s", "danger-full-access"])
        .args(["-c", "model_provider=agentd", "-c", &provider, "-m", model, "say hello"])
        .env("CODEX_HOME", home.path())
        .env("AGENTD_TOKEN", TOKEN)
        .current_dir(work.path())
        .output()
        .expect("codex runs");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text, t.elapsed())
}

/// Claude Code (`claude -p`) with `ANTHROPIC_BASE_URL` at `base`, on the
/// Node.js 22 the npm packages bring; its exit status and output.
fn claude(npm: &std::path::Path, base: &str) -> (Option<i32>, String, Duration) {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let path =
        format!("{}:{}", npm.join(".bin").display(), std::env::var("PATH").unwrap_or_default());
    let t = Instant::now();
    let out = std::process::Command::new(npm.join(".bin/claude"))
        .args(["-p", "say hello", "--allowedTools", "Bash(echo:*)"])
        .env("PATH", path)
        .env("HOME", home.path())
        .env("ANTHROPIC_BASE_URL", base)
        .env("ANTHROPIC_API_KEY", TOKEN)
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .current_dir(work.path())
        .output()
        .expect("claude runs");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text, t.elapsed())
}

/// What the script heard after its tool call: the request whose messages
/// carry the tool's output (the client ran the call and sent its result).
fn tool_result_came_back(log: &std::path::Path) -> bool {
    let heard = std::fs::read_to_string(log).unwrap_or_default();
    heard.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).any(|r| {
        r["messages"].as_array().into_iter().flatten().any(|m| {
            m["role"] == "tool"
                && m["content"].as_str().is_some_and(|c| c.contains("agentd-tool-ran"))
        })
    })
}

/// The Codex CLI and Claude Code as users run them, on the scripted
/// backend: each runs the tool call the script makes, sends its result
/// back, prints the scripted answer and exits 0.
#[test]
fn codex_and_claude_code_run_a_tool_and_answer_on_the_scripted_backend() {
    let test = "codex_and_claude_code_run_a_tool_and_answer_on_the_scripted_backend";
    let Some(npm) = agentd_tests::dep("AGENTD_TEST_NPM", test) else { return };
    for (name, file) in [("codex", "codex.jsonl"), ("claude", "claude-cli.jsonl")] {
        let home = Home::new();
        let (script, log) = script(&home, file);
        let (_daemon, base) =
            serve(&home, &["--provider", "scripted", "--script", script.to_str().unwrap()]);
        let (code, out, _) =
            if name == "codex" { codex(&npm, &base, "scripted") } else { claude(&npm, &base) };
        assert_eq!(code, Some(0), "{name}: {out}");
        assert!(out.contains("The command printed agentd-tool-ran."), "{name}: {out}");
        assert!(tool_result_came_back(&log), "{name}: no request carried the tool's output");
    }
}

/// The same clients on the real default model: Codex's first request fits
/// its context and it answers; Claude Code's (about 20k tokens) does not,
/// and it reports the overflow and exits non-zero at once, without
/// retrying.
#[test]
fn codex_answers_and_claude_code_reports_the_context_on_the_real_model() {
    let test = "codex_answers_and_claude_code_reports_the_context_on_the_real_model";
    let Some(model) = agentd_tests::dep("AGENTD_TEST_MODEL", test) else { return };
    let Some(npm) = agentd_tests::dep("AGENTD_TEST_NPM", test) else { return };
    let home = Home::new();
    let (_daemon, base) = serve(&home, &["--model", model.to_str().unwrap()]);
    let (code, out, _) = codex(&npm, &base, "default");
    assert_eq!(code, Some(0), "codex: {out}");
    let (code, out, took) = claude(&npm, &base);
    assert!(code.is_some_and(|c| c != 0), "claude: {out}");
    assert!(out.contains("context"), "claude: {out}");
    assert!(took < Duration::from_secs(30), "claude took {took:?}: {out}");
}
