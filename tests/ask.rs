//! `agentd ask` as a person meets it (issue 31, item 7): what it prints
//! of a model's text on a terminal, and `--corpus` folders that share a
//! name; and its corpus index (item 5): many processes at once on a
//! changed corpus, an index that cannot be built — all through the
//! scripted provider.

use agentd_tests::{done, events, of, Home};

fn script(h: &Home, lines: &[&str]) -> String {
    h.write("script.jsonl", &lines.join("\n")).display().to_string()
}

/// An answer holding escape sequences (an OSC that retitles the terminal,
/// a CSI that clears it): the printed answer shows them, with the rest of
/// the text, and sends none; `--events` keeps the answer as the model
/// wrote it, JSON-escaped.
#[test]
fn a_models_escape_sequences_are_shown_not_sent() {
    let h = Home::new();
    let s = script(
        &h,
        &[
            r#"{"content": "Two requests.\u001b]0;pwned\u0007 Then\u001b[2J gone\u009b31m.\r\n\tEnd"}"#,
        ],
    );
    let out = h.run(&["ask", "--provider", "scripted", "--script", &s, "q"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(
        !printed.chars().any(|c| c.is_control() && c != '\n' && c != '\t'),
        "a control character reached the terminal: {printed:?}"
    );
    assert_eq!(printed, "Two requests.␛]0;pwned␇ Then␛[2J gone\\u{9b}31m.␍\n\tEnd\n");

    let out = h.run(&["ask", "--provider", "scripted", "--script", &s, "--events", "q"]);
    let evs = events(&out);
    assert_eq!(
        done(&evs)["answer"],
        "Two requests.\u{1b}]0;pwned\u{7} Then\u{1b}[2J gone\u{9b}31m.\r\n\tEnd"
    );
    let line = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(!line.contains('\u{1b}') && !line.contains('\u{7}'), "{line:?}");
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

/// Twelve `agentd ask` processes started together on one home right after
/// a corpus file changed (issue 31, item 5): the stale index is rebuilt
/// once while the others wait for it, and every run searches, answers and
/// ends with a `done` event and status 0 — none fails on the index lock.
#[test]
fn runs_started_together_share_one_rebuild_of_a_changed_corpus() {
    let h = Home::new();
    let corpus = h.corpus();
    let s = script(
        &h,
        &[
            r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "socket mode"}}]}"#,
            r#"{"when": "research", "content": "The socket is created with mode 0600 [S1]."}"#,
            r#"{"when": "final", "content": "The socket is created with mode 0600 [S1]."}"#,
        ],
    );
    let corpus = corpus.to_str().unwrap().to_owned();
    let args =
        ["ask", "--provider", "scripted", "--script", &s, "--corpus", &corpus, "--events", "q"];
    // The index is built once, then goes stale.
    let first = h.run(&args);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    h.write(
        "corpus/sockets.md",
        "# Sockets\n\nThe daemon listens on a Unix socket created with mode 0600, in its home.\n",
    );
    let children: Vec<_> = (0..12)
        .map(|_| {
            h.cmd(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("agentd starts")
        })
        .collect();
    for (i, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().expect("agentd runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "run {i}: {:?}: {err}", out.status);
        let evs = events(&out);
        let d = done(&evs);
        assert_eq!(d["outcome"], "answered", "run {i}: {d}");
        let results = of(&evs, "tool_result");
        let found = results.iter().find(|r| r["name"] == "search_sources").expect("a search");
        let found: serde_json::Value =
            serde_json::from_str(found["content"].as_str().unwrap()).unwrap();
        assert_eq!(found["results"][0]["path"], "corpus/sockets.md", "run {i}: {found}");
    }
}

/// A corpus whose index cannot be built (the place of the index folder in
/// the home is taken by a file): the run does not stop at start — its
/// search answers `SEARCH_FAILED` naming the cause, and it ends with a
/// `done` event and status 0.
#[test]
fn an_index_that_cannot_be_built_fails_the_search_not_the_run() {
    let h = Home::new();
    let corpus = h.corpus();
    h.write("index", "not a folder");
    let s = script(
        &h,
        &[
            r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "socket mode"}}]}"#,
            r#"{"when": "research", "content": "The sources could not be searched."}"#,
            r#"{"when": "final", "content": "The sources could not be searched."}"#,
        ],
    );
    let corpus = corpus.to_str().unwrap().to_owned();
    let out = h.run(&[
        "ask",
        "--provider",
        "scripted",
        "--script",
        &s,
        "--corpus",
        &corpus,
        "--events",
        "q",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let evs = events(&out);
    done(&evs);
    let results = of(&evs, "tool_result");
    let found = results.iter().find(|r| r["name"] == "search_sources").expect("a search");
    let found = found["content"].as_str().unwrap();
    assert!(found.contains("SEARCH_FAILED") && found.contains("index"), "{found}");
}
