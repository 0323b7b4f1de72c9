//! `agentd settings`: metadata, bounds (0 and 65 refused, nothing stored),
//! persistence, environment override and reset (ADR 0101's settings tests).

use agentd_tests::Home;
use serde_json::Value;

const KEY: &str = "chat.max_tool_iters";

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

#[test]
fn metadata_is_listed() {
    let h = Home::new();
    let out = h.run(&["settings", "list"]);
    assert!(out.status.success());
    let rows: Vec<Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let row = rows.iter().find(|r| r["key"] == KEY).expect("listed");
    assert_eq!(row["label"], "Tool research rounds");
    assert_eq!(row["type"], "integer");
    assert_eq!(row["default"], 12);
    assert_eq!(row["min"], 1);
    assert_eq!(row["max"], 64);
    assert_eq!(row["value"], 12);
    assert_eq!(row["source"], "default");
}

#[test]
fn bounds_are_refused_and_nothing_is_stored() {
    let h = Home::new();
    for bad in ["0", "65", "abc"] {
        let out = h.run(&["settings", "set", KEY, bad]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains('1') && err.contains("64"), "{bad}: {err}");
        assert_eq!(stdout(&h.run(&["settings", "get", KEY])), "12");
    }
}

#[test]
fn stored_values_persist_env_overrides_and_reset_returns_the_default() {
    let h = Home::new();
    assert!(h.run(&["settings", "set", KEY, "6"]).status.success());
    assert_eq!(stdout(&h.run(&["settings", "get", KEY])), "6");
    let env =
        h.cmd(&["settings", "get", KEY]).env("AGENTD_CHAT_MAX_TOOL_ITERS", "20").output().unwrap();
    assert_eq!(stdout(&env), "20");
    let listed =
        h.cmd(&["settings", "list"]).env("AGENTD_CHAT_MAX_TOOL_ITERS", "20").output().unwrap();
    assert!(stdout(&listed).contains("\"source\":\"env\""));
    // The stored value is still there underneath the override.
    assert_eq!(stdout(&h.run(&["settings", "get", KEY])), "6");
    assert!(h.run(&["settings", "reset", KEY]).status.success());
    assert_eq!(stdout(&h.run(&["settings", "get", KEY])), "12");
    let bad_env =
        h.cmd(&["settings", "get", KEY]).env("AGENTD_CHAT_MAX_TOOL_ITERS", "99").output().unwrap();
    assert_eq!(bad_env.status.code(), Some(1));
}
