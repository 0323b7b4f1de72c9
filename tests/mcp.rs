//! Tools from MCP servers end to end (issue 14): the built `agentd ask
//! --events`, driven by the scripted provider, against a stdio server
//! written with the official Python SDK (`mcp/server.py`, FastMCP), the
//! npm reference filesystem server, and the same Python server over
//! Streamable HTTP. Gated by AGENTD_TEST_PYTHON and AGENTD_TEST_NPM.

use agentd_tests::{dep, done, events, of, python, runs_show as show, workspace_root, Home};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Output;

fn server_py() -> PathBuf {
    workspace_root().join("tests/mcp/server.py")
}

/// `agentd ask --events` with the scripted `lines`, the MCP config `mcp`
/// and the environment `env`.
fn ask(
    h: &Home,
    mcp: &Path,
    lines: &[Value],
    env: &[(&str, &str)],
    extra: &[&str],
) -> (Output, Vec<Value>) {
    let script: Vec<String> = lines.iter().map(Value::to_string).collect();
    let script = h.write("script.jsonl", &script.join("\n"));
    let mut args = vec![
        "ask",
        "--provider",
        "scripted",
        "--script",
        script.to_str().unwrap(),
        "--mcp",
        mcp.to_str().unwrap(),
        "--events",
    ];
    args.extend_from_slice(extra);
    args.push("Use the tools, then answer.");
    let mut c = h.cmd(&args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("agentd runs");
    let evs = events(&out);
    (out, evs)
}

/// The test server (`tests/mcp/server.py`) as server `t` of an mcp.json in
/// `h`, its write tools journaling to the returned file; (journal, config).
fn journal_server(h: &Home, py: &Path) -> (PathBuf, PathBuf) {
    let journal = h.path().join("journal.txt");
    let cfg = h.write(
        "mcp.json",
        &json!({"mcpServers": {"t": {"command": py, "args": [server_py()],
                                     "env": {"MCP_TEST_LOG": journal}}}})
        .to_string(),
    );
    (journal, cfg)
}

fn call(name: &str, args: Value) -> Value {
    json!({"when": "research", "tool_calls": [{"name": name, "arguments": args}]})
}

fn answer(text: &str) -> Value {
    json!({"when": "final", "content": text})
}

/// The run id (from the `run` event).
fn run_id(evs: &[Value]) -> String {
    of(evs, "run")[0]["run_id"].as_str().expect("a run event").to_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A stdio server gets PATH, HOME, LANG and its entry's `env`, never the
/// rest of the daemon's environment (an API key set for the daemon).
#[test]
fn a_stdio_server_does_not_inherit_the_daemons_secrets() {
    let Some(py) = python("a_stdio_server_does_not_inherit_the_daemons_secrets") else { return };
    let h = Home::new();
    let dump = h.path().join("env.txt");
    let cfg = h.write(
        "mcp.json",
        &json!({"mcpServers": {"t": {"command": py, "args": [server_py()],
                                     "env": {"MCP_TEST_ENV_DUMP": dump}}}})
        .to_string(),
    );
    let out = h
        .cmd(&["mcp", "list", "--mcp", cfg.to_str().unwrap()])
        .env("AGENTD_TEST_SECRET_API_KEY", "sk-do-not-leak")
        .output()
        .expect("agentd runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let names = std::fs::read_to_string(&dump).expect("the server wrote its environment");
    let names: Vec<&str> = names.lines().collect();
    assert!(names.contains(&"PATH") && names.contains(&"MCP_TEST_ENV_DUMP"), "{names:?}");
    assert!(!names.contains(&"AGENTD_TEST_SECRET_API_KEY"), "{names:?}");
    assert!(!names.contains(&"AGENTD_HOME"), "{names:?}");
}

#[test]
fn a_fastmcp_stdio_server_under_the_loop_budgets_and_ledger() {
    let Some(py) = python("a_fastmcp_stdio_server_under_the_loop_budgets_and_ledger") else {
        return;
    };
    let h = Home::new();
    let (journal, cfg) = journal_server(&h, &py);

    // `mcp list`: the server is up, with each tool's class from its annotation.
    let out = h.run(&["mcp", "list", "--mcp", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(listed["server"], "t");
    assert_eq!(listed["state"], "up", "{listed}");
    let class = |n: &str| {
        listed["tools"].as_array().unwrap().iter().find(|t| t["name"] == n).unwrap()["class"]
            .clone()
    };
    assert_eq!(class("t__lookup"), "read");
    assert_eq!(class("t__record"), "write");
    assert_eq!(class("t__crash"), "write", "no annotation: a write");

    // Three identical read-only batches end research.
    let (out, evs) =
        ask(&h, &cfg, &[call("t__lookup", json!({"key": "a"})), answer("It is 42.")], &[], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let d = done(&evs);
    assert_eq!(d["stop"], "repeated_batches", "{d}");
    assert_eq!(d["outcome"], "answered");
    let results = of(&evs, "tool_result");
    assert_eq!(results.len(), 3);
    for r in &results {
        assert_eq!(r["ok"], true, "{r}");
        assert!(r["content"].as_str().unwrap().contains("the value of a is 42"), "{r}");
    }
    // The server's stderr went to agentd's log, never into the reply.
    assert!(stderr(&out).contains("SERVER-STDERR-MARKER"), "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("SERVER-STDERR-MARKER"));
    let rec = show(&h, &run_id(&evs));
    let calls = rec["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 3, "{rec}");
    assert!(calls
        .iter()
        .all(|c| c["name"] == "t__lookup" && c["kind"] == "read" && c["outcome"] == "ok"));

    // Five identical writes at a bound of five rounds all execute.
    let (out, evs) = ask(
        &h,
        &cfg,
        &[call("t__record", json!({"entry": "same"})), answer("Recorded.")],
        &[("AGENTD_CHAT_MAX_TOOL_ITERS", "5")],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let d = done(&evs);
    assert_eq!(d["stop"], "round_limit", "{d}");
    assert_eq!(of(&evs, "tool_result").iter().filter(|r| r["ok"] == true).count(), 5);
    assert_eq!(std::fs::read_to_string(&journal).unwrap(), "same\n".repeat(5));
    let rec = show(&h, &run_id(&evs));
    let calls = rec["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 5, "{rec}");
    assert!(calls.iter().all(|c| c["kind"] == "write" && c["outcome"] == "ok"));

    // A tool that kills its server: a failed result, the server's tools
    // hidden and refused after it, and the run still answers. (A corpus
    // keeps a tool offered once the server's are hidden, so the model's
    // next call reaches the host and is refused there.)
    let corpus = h.corpus();
    let (out, evs) = ask(
        &h,
        &cfg,
        &[
            call("t__crash", json!({})),
            call("t__lookup", json!({"key": "b"})),
            json!({"when": "research", "content": "The server stopped; I answer without it."}),
            answer("The server stopped; I answer without it."),
        ],
        &[],
        &["--corpus", corpus.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let d = done(&evs);
    assert_eq!(d["outcome"], "answered", "{d}");
    assert!(d["answer"].as_str().unwrap().contains("answer without it"));
    let results = of(&evs, "tool_result");
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["ok"], false);
    assert!(results[0]["content"].as_str().unwrap().contains("MCP_SERVER_DOWN"), "{}", results[0]);
    assert_eq!(results[1]["ok"], false);
    assert!(results[1]["content"].as_str().unwrap().contains("not running"), "{}", results[1]);
    let rec = show(&h, &run_id(&evs));
    let calls: Vec<(String, String)> = rec["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().into(), c["outcome"].as_str().unwrap().into()))
        .collect();
    assert_eq!(
        calls,
        [("t__crash".into(), "error".into()), ("t__lookup".into(), "refused".into())],
        "{rec}"
    );

    // A per-call timeout that cannot fit the research share of the run
    // deadline is refused at start, naming both limits.
    h.write("policies.toml", "[values]\n\"mcp/call-timeout\" = 3000\n");
    let (out, _) = ask(&h, &cfg, &[answer("x")], &[], &[]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(e.contains("mcp/call-timeout") && e.contains("research-runtime/run-deadline"), "{e}");

    // A call that hangs fails at the timeout; the run still answers. A
    // server that will not start is listed down with the reason, and a
    // call to it is a failed result.
    h.write("policies.toml", "[values]\n\"mcp/call-timeout\" = 1\n");
    let broken = h.write(
        "broken.json",
        &json!({"mcpServers": {"gone": {"command": h.path().join("no-such-server")}}}).to_string(),
    );
    let out = h.run(&["mcp", "list", "--mcp", broken.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(listed["state"], "down", "{listed}");
    assert!(listed["error"].as_str().unwrap().contains("no-such-server"), "{listed}");
    let (out, evs) = ask(
        &h,
        &cfg,
        &[
            json!({"when": "research", "tool_calls": [
                {"name": "t__hang", "arguments": {}},
                {"name": "gone__anything", "arguments": {}}]}),
            json!({"when": "research", "content": "Nothing answered."}),
        ],
        &[],
        &["--mcp", broken.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(done(&evs)["outcome"], "answered");
    let results = of(&evs, "tool_result");
    assert!(results[0]["content"].as_str().unwrap().contains("MCP_TIMEOUT"), "{}", results[0]);
    assert!(results[1]["content"].as_str().unwrap().contains("not running"), "{}", results[1]);
}

/// A tool whose answer is over the 16 MiB limit on one MCP message (17 MiB
/// of text): the call fails at once — not at the 60 s call timeout — with
/// an error that names the limit, and the server answers the next call
/// (issue 31, item 7).
#[test]
fn an_answer_over_the_message_limit_fails_its_call_at_once() {
    let Some(py) = python("an_answer_over_the_message_limit_fails_its_call_at_once") else {
        return;
    };
    let h = Home::new();
    let cfg = h.write(
        "mcp.json",
        &json!({"mcpServers": {"t": {"command": py, "args": [server_py()]}}}).to_string(),
    );
    let started = std::time::Instant::now();
    let (out, evs) = ask(
        &h,
        &cfg,
        &[
            call("t__huge", json!({})),
            call("t__lookup", json!({"key": "c"})),
            json!({"when": "research", "content": "It is 42."}),
            answer("It is 42."),
        ],
        &[],
        &[],
    );
    let took = started.elapsed();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(took < std::time::Duration::from_secs(20), "the run took {took:?}");
    let results = of(&evs, "tool_result");
    assert_eq!(results.len(), 2, "{evs:?}");
    let huge = results[0]["content"].as_str().unwrap();
    assert_eq!(results[0]["ok"], false, "{huge}");
    assert!(huge.contains("MCP_ERROR") && huge.contains("16 MiB"), "{huge}");
    assert!(!huge.contains("MCP_TIMEOUT"), "{huge}");
    assert!(huge.len() < 2000, "the error is short: {} bytes", huge.len());
    assert_eq!(results[1]["ok"], true, "{}", results[1]);
    assert!(results[1]["content"].as_str().unwrap().contains("the value of c is 42"));
    assert_eq!(done(&evs)["outcome"], "answered");
    assert!(stderr(&out).contains("over the 16 MiB limit"), "{}", stderr(&out));
}

#[test]
fn the_npm_reference_filesystem_server_lists_a_folder() {
    let test = "the_npm_reference_filesystem_server_lists_a_folder";
    let Some(npm) = dep("AGENTD_TEST_NPM", test) else { return };
    let h = Home::new();
    h.write("shared/alpha-notes.md", "alpha\n");
    h.write("shared/beta-report.txt", "beta\n");
    let dir = std::fs::canonicalize(h.path().join("shared")).unwrap();
    let index = npm.join("@modelcontextprotocol/server-filesystem/dist/index.js");
    let cfg = h.write(
        "mcp.json",
        &json!({"mcpServers": {"fs": {"command": "node", "args": [index, dir]}}}).to_string(),
    );
    let (out, evs) = ask(
        &h,
        &cfg,
        &[call("fs__list_directory", json!({"path": dir})), answer("Two files.")],
        &[],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let results = of(&evs, "tool_result");
    assert!(!results.is_empty(), "{evs:?}");
    let first = results[0]["content"].as_str().unwrap();
    assert_eq!(results[0]["ok"], true, "{first}");
    assert!(first.contains("alpha-notes.md") && first.contains("beta-report.txt"), "{first}");
    let d = done(&evs);
    assert_eq!(d["outcome"], "answered", "{d}");
    let rec = show(&h, &run_id(&evs));
    assert_eq!(rec["tool_calls"][0]["name"], "fs__list_directory", "{rec}");
    assert_eq!(rec["tool_calls"][0]["kind"], "read", "the server marks it readOnlyHint");
}

/// Kills the child when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_streamable_http_server_is_used_the_same_way() {
    let Some(py) = python("a_streamable_http_server_is_used_the_same_way") else { return };
    let h = Home::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = std::process::Command::new(&py)
        .arg(server_py())
        .args(["http", &port.to_string()])
        .env("MCP_TEST_LOG", h.path().join("journal.txt"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python runs");
    let _child = Child(child);
    // Wait until it listens (no timing is asserted: it either comes up or
    // the test fails after many tries).
    let up = (0..300).any(|_| {
        let ok = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        if !ok {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        ok
    });
    assert!(up, "the FastMCP HTTP server did not listen on {port}");
    let cfg = h.write(
        "mcp.json",
        &json!({"mcpServers": {"web": {"url": format!("http://127.0.0.1:{port}/mcp"),
                                       "headers": {"X-Test": "1"}}}})
        .to_string(),
    );
    let (out, evs) = ask(
        &h,
        &cfg,
        &[
            call("web__lookup", json!({"key": "z"})),
            call("web__record", json!({"entry": "over http"})),
            json!({"when": "research", "content": "It is 42."}),
            answer("It is 42."),
        ],
        &[],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let results = of(&evs, "tool_result");
    assert_eq!(results.len(), 2, "{evs:?}");
    assert!(
        results[0]["content"].as_str().unwrap().contains("the value of z is 42"),
        "{}",
        results[0]
    );
    assert_eq!(results[1]["ok"], true, "{}", results[1]);
    assert_eq!(std::fs::read_to_string(h.path().join("journal.txt")).unwrap(), "over http\n");
    let d = done(&evs);
    assert_eq!(d["outcome"], "answered", "{d}");
    let rec = show(&h, &run_id(&evs));
    let kinds: Vec<&str> =
        rec["tool_calls"].as_array().unwrap().iter().map(|c| c["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["read", "write"], "{rec}");
}

/// The ledger fails closed for MCP calls too: with the run's ledger of
/// tool calls unwritable, the server's write tool is never sent (its
/// journal stays empty) and no model request follows.
#[test]
fn an_mcp_call_is_not_sent_when_its_ledger_row_cannot_be_written() {
    let Some(py) = python("an_mcp_call_is_not_sent_when_its_ledger_row_cannot_be_written") else {
        return;
    };
    let h = Home::new();
    let (journal, cfg) = journal_server(&h, &py);
    // A first run creates the store; then every insert into the ledger of
    // tool calls fails.
    let (out, _) = ask(&h, &cfg, &[answer("Nothing to do.")], &[], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    agentd_tests::break_tool_call_ledger(&h);
    let (out, evs) = ask(
        &h,
        &cfg,
        &[call("t__record", json!({"entry": "must not be written"})), answer("Recorded.")],
        &[],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        std::fs::read_to_string(&journal).unwrap_or_default().is_empty(),
        "the MCP write was sent without its ledger row"
    );
    let results = of(&evs, "tool_result");
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0]["content"].as_str().unwrap().contains("LEDGER_WRITE_FAILED"));
    let d = done(&evs);
    assert_eq!(d["error"]["code"], "LEDGER_WRITE_FAILED", "{d}");
    assert_eq!(d["model_requests"], 1, "{d}");
}
