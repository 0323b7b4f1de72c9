//! Drives `agentd toolparse replay` over its stdin/stdout as the conformance
//! script does.

use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn replay_answers_every_line_and_refuses_unknown_families() {
    let bin = agentd_tests::agentd_bin();
    let mut child = Command::new(&bin)
        .args(["toolparse", "replay"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let input = concat!(
        r#"{"fixture_id": "a", "family": "qwen3-hermes", "model": "Qwen/Qwen3-0.6B", "text": "Hi<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>", "generation_prompt": null, "thinking": null, "truncated": false, "tools": [], "streams": {"one": ["Hi<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"], "two": ["Hi<tool", "_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"]}}"#,
        "\n",
        "not json\n",
        r#"{"fixture_id": "b", "family": "nope", "model": "x/y", "text": "", "streams": {}}"#,
        "\n"
    );
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let a = &lines[0];
    assert_eq!(a["fixture_id"], "a");
    assert_eq!(a["supported"], true);
    assert_eq!(a["nonstream"]["content"], "Hi");
    assert_eq!(a["nonstream"]["tool_calls"][0]["name"], "f");
    assert_eq!(a["streams"]["two"], a["nonstream"]);
    assert_eq!(lines[1]["supported"], false);
    assert_eq!(lines[2]["fixture_id"], "b");
    assert_eq!(lines[2]["supported"], false);
}
