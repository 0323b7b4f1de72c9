//! `agentd ask` as a person meets it (issue 31, item 7): `--corpus`
//! folders that share a name — through the scripted provider.

use agentd_tests::{done, events, of, Home};

fn script(h: &Home, lines: &[&str]) -> String {
    h.write("script.jsonl", &lines.join("\n")).display().to_string()
}

/// Two `--corpus` folders named `docs` (`a/docs`, `b/docs`), each with a
/// `guide.md`: the search finds `b`'s under a path of its own, reading its
/// handle reads `b`'s file (not `a`'s), and the answer citing it is
/// grounded.
#[test]
fn corpus_folders_of_the_same_name_are_read_apart() {
    let h = Home::new();
    let a = h.write("a/docs/guide.md", "# Guide\n\nThe aardvark digs.\n");
    let b = h.write("b/docs/guide.md", "# Guide\n\nThe bumblebee hums.\n");
    let (a, b) = (a.parent().unwrap(), b.parent().unwrap());
    let s = script(
        &h,
        &[
            r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "bumblebee"}}]}"#,
            r#"{"when": "research", "tool_calls": [{"name": "read_source", "arguments": {"handle": "S1"}}]}"#,
            r#"{"when": "research", "content": "The bumblebee hums [S1]."}"#,
            r#"{"when": "final", "content": "The bumblebee hums [S1]."}"#,
        ],
    );
    let args = [
        "ask",
        "--provider",
        "scripted",
        "--script",
        &s,
        "--corpus",
        a.to_str().unwrap(),
        "--corpus",
        b.to_str().unwrap(),
        "--events",
        "What hums?",
    ];
    let out = h.run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let evs = events(&out);
    let results = of(&evs, "tool_result");
    let found = results.iter().find(|r| r["name"] == "search_sources").expect("a search");
    let found: serde_json::Value =
        serde_json::from_str(found["content"].as_str().unwrap()).unwrap();
    assert_eq!(found["results"][0]["path"], "docs-2/guide.md", "{found}");
    let read = results.iter().find(|r| r["name"] == "read_source").expect("a read");
    let read = read["content"].as_str().unwrap();
    assert!(read.contains("bumblebee"), "S1 read the other folder's guide.md: {read}");
    let d = done(&evs);
    assert_eq!(d["outcome"], "answered");
    assert_eq!(d["grounded"], true, "{d}");
    assert_eq!(d["invalid_citations"], serde_json::json!([]));
}
