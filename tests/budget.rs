//! Budget governance end to end (docs/budgets.md): owned policies and composition
//! checks at start, admission with a finalization reserve, the durable
//! ledger and recovery after kill -9, tool projection, citations, and
//! errors that keep their owner.

use agentd_tests::{done, events, of, Home, MockOpenAi, Reply};
use serde_json::Value;
use std::time::{Duration, Instant};

fn ask_scripted(h: &Home, lines: &[&str], extra: &[&str]) -> (std::process::Output, Vec<Value>) {
    let s = h.write("script.jsonl", &lines.join("\n")).display().to_string();
    let corpus = h.corpus();
    let mut args = vec![
        "ask",
        "--provider",
        "scripted",
        "--script",
        &s,
        "--corpus",
        corpus.to_str().unwrap(),
        "--events",
    ];
    args.extend_from_slice(extra);
    args.push("How many requests are reserved?");
    let out = h.run(&args);
    let evs = events(&out);
    (out, evs)
}

fn ledger(h: &Home, run: &str) -> Vec<(String, String, Option<String>)> {
    let db = rusqlite::Connection::open(h.path().join("agentd.db")).unwrap();
    let mut st = db
        .prepare("SELECT phase, outcome, classification FROM ledger WHERE run_id = ?1 ORDER BY id")
        .unwrap();
    st.query_map([run], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

const SEARCH_READ: &str = r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "budget"}}, {"name": "read_source", "arguments": {"handle": "S1"}}]}"#;

#[test]
fn conflicting_policy_declarations_refuse_to_start_naming_both() {
    let h = Home::new();
    h.write(
        "policies.toml",
        "[[declare]]\nid = \"research-runtime/finalization-request-reserve\"\nowner = \"tools\"\nversion = \"tools-policy@9\"\nunit = \"requests\"\ndefault = 1\nhard_max = 3\n",
    );
    let (out, _) = ask_scripted(&h, &[SEARCH_READ], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("conflicting declarations")
            && err.contains("research-runtime")
            && err.contains("tools-policy@9"),
        "{err}"
    );
}

#[test]
fn compositions_that_cannot_finish_refuse_to_start_naming_both_limits() {
    for (values, names) in [
        (
            "\"tools/handle-registry-capacity\" = 10\n\"tools/searches-per-run\" = 5\n",
            vec![
                "tools/handle-registry-capacity",
                "tools/searches-per-run",
                "tools/results-per-search",
            ],
        ),
        (
            "\"tools/source-handle-lifetime\" = 60\n",
            vec!["tools/source-handle-lifetime", "research-runtime/run-deadline"],
        ),
        (
            "\"research-runtime/total-model-requests\" = 2\n",
            vec![
                "research-runtime/finalization-request-reserve",
                "research-runtime/total-model-requests",
            ],
        ),
        (
            "\"provider/request-timeout\" = 900\n",
            vec![
                "provider/request-timeout",
                "provider/transient-retries",
                "research-runtime/run-deadline",
            ],
        ),
    ] {
        let h = Home::new();
        h.write("policies.toml", &format!("[values]\n{values}"));
        let (out, _) = ask_scripted(&h, &[SEARCH_READ], &[]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        for n in names {
            assert!(err.contains(n), "{values}: {err}");
        }
    }
}

#[test]
fn research_spends_only_the_allowance_less_the_reserve_and_the_answer_still_comes() {
    let h = Home::new();
    h.write("policies.toml", "[values]\n\"research-runtime/total-model-requests\" = 5\n");
    let other = r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "sockets"}}]}"#;
    let (out, evs) = ask_scripted(
        &h,
        &[
            SEARCH_READ,
            other,
            SEARCH_READ,
            other,
            r#"{"when": "final", "content": "Two requests [S1]."}"#,
        ],
        &[],
    );
    assert!(out.status.success());
    let d = done(&evs);
    assert_eq!(d["stop"], "budget");
    assert_eq!(d["outcome"], "answered");
    let phases: Vec<String> =
        of(&evs, "request").iter().map(|r| r["phase"].as_str().unwrap().to_owned()).collect();
    assert_eq!(phases, ["research", "research", "research", "final"]);
    let run = evs[0]["run_id"].as_str().unwrap();
    let l = ledger(&h, run);
    let phases: Vec<&str> = l.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        phases,
        ["research", "research", "research", "final"],
        "research never spends the reserve"
    );
}

#[test]
fn an_exhausted_reserve_is_a_local_budget_error_never_provider_unavailable() {
    let h = Home::new();
    // The final turn fails transiently again and again: its retries spend
    // the reserve (2), then the run's own allowance refuses the next one.
    let fin = r#"{"when": "final", "error": "transient", "retries": 5}"#;
    let (out, evs) = ask_scripted(&h, &[SEARCH_READ, SEARCH_READ, SEARCH_READ, fin], &[]);
    assert_eq!(out.status.code(), Some(0), "the reply completes with an excerpt");
    let d = done(&evs);
    assert_eq!(d["outcome"], "excerpt");
    assert_eq!(d["error"]["code"], "PROVIDER_CALL_BUDGET_EXCEEDED");
    assert_eq!(d["error"]["classification"], "local_budget_exhausted");
    let finals = of(&evs, "request").into_iter().filter(|r| r["phase"] == "final").count();
    assert_eq!(finals, 2);
}

#[test]
fn an_unread_citation_is_corrected_once() {
    let h = Home::new();
    let search = r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "budget socket"}}, {"name": "read_source", "arguments": {"handle": "S1"}}]}"#;
    let answer = r#"{"when": "research", "content": "Two requests [S1]; sockets use 0600 [S2]."}"#;
    let fixed = r#"{"when": "final", "content": "Two requests are reserved [S1]."}"#;
    let (_, evs) = ask_scripted(&h, &[search, answer, fixed], &[]);
    let reqs: Vec<&str> =
        of(&evs, "request").iter().map(|r| r["phase"].as_str().unwrap()).collect();
    assert_eq!(reqs, ["research", "research", "correction"]);
    assert!(of(&evs, "notice")
        .iter()
        .any(|n| n["kind"] == "citation_rejected" && n["text"].as_str().unwrap().contains("S2")));
    let d = done(&evs);
    assert_eq!(d["outcome"], "answered");
    assert_eq!(d["answer"], "Two requests are reserved [S1].");
    assert_eq!(d["invalid_citations"], serde_json::json!([]));
    // When the correction cites an unread source too, it is marked, never silent.
    let h = Home::new();
    let still = r#"{"when": "final", "content": "Sockets use 0600 [S2]."}"#;
    let (_, evs) = ask_scripted(&h, &[search, answer, still], &[]);
    let d = done(&evs);
    assert_eq!(d["invalid_citations"], serde_json::json!(["S2"]));
    assert!(d["answer"].as_str().unwrap().contains("[S2: not read, unverified]"), "{d}");
    assert_eq!(of(&evs, "request").len(), 3, "only one correction");
}

#[test]
fn spent_searches_are_hidden_from_the_next_request_while_reading_stays() {
    let mock = MockOpenAi::start(|n, body| {
        if body.get("tools").is_some() {
            let calls = if n <= 3 {
                vec![("search_sources".to_string(), format!(r#"{{"query": "budget {n}"}}"#))]
            } else {
                vec![
                    ("search_sources".to_string(), r#"{"query": "again"}"#.to_string()),
                    ("read_source".to_string(), r#"{"handle": "S1"}"#.to_string()),
                ]
            };
            Reply::Stream { content: String::new(), calls }
        } else {
            Reply::Stream { content: "Two requests are reserved [S1].".into(), calls: vec![] }
        }
    });
    let h = Home::new();
    h.write("policies.toml", "[values]\n\"tools/searches-per-run\" = 2\n");
    let corpus = h.corpus();
    let out = h
        .cmd(&[
            "ask",
            "--provider",
            "openai",
            "--base-url",
            &mock.base(),
            "--corpus",
            corpus.to_str().unwrap(),
            "--events",
            "q",
        ])
        .env("AGENTD_CHAT_MAX_TOOL_ITERS", "4")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let names = |b: &Value| -> Vec<String> {
        b["tools"]
            .as_array()
            .map(|t| t.iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };
    let seen = mock.requests();
    assert_eq!(names(&seen[0].body), ["search_sources", "read_source", "analyze_source"]);
    assert_eq!(names(&seen[1].body), ["search_sources", "read_source", "analyze_source"]);
    assert_eq!(
        names(&seen[2].body),
        ["read_source", "analyze_source"],
        "searches spent: search hidden, reading stays"
    );
    assert_eq!(names(&seen[3].body), ["read_source", "analyze_source"]);
    let evs = events(&out);
    // The host still refuses a search the model calls anyway.
    let refused = of(&evs, "tool_result")
        .into_iter()
        .filter(|r| r["name"] == "search_sources" && r["ok"] == false)
        .count();
    assert!(refused >= 2);
    assert!(of(&evs, "tool_result").iter().any(|r| r["name"] == "read_source" && r["ok"] == true));
}

#[test]
fn insufficient_quota_is_sent_exactly_once_and_keeps_its_owner() {
    let mock = MockOpenAi::start(|_, _| {
        Reply::Status(429, r#"{"error": {"message": "You exceeded your current quota", "type": "insufficient_quota", "code": "insufficient_quota"}}"#.into())
    });
    let h = Home::new();
    let out = h.run(&["ask", "--provider", "openai", "--base-url", &mock.base(), "--events", "q"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(mock.requests().len(), 1, "a quota 429 must not be retried");
    let d = done(&events(&out)).clone();
    assert_eq!(d["error"]["classification"], "upstream_quota_exhausted");
    assert_eq!(d["error"]["code"], "UPSTREAM_QUOTA_EXHAUSTED");
}

#[test]
fn a_transient_503_is_retried_and_counted_in_the_ledger() {
    let mock = MockOpenAi::start(|n, _| {
        if n == 1 {
            Reply::Status(503, r#"{"error": {"message": "overloaded"}}"#.into())
        } else {
            Reply::Stream { content: "Two requests are reserved.".into(), calls: vec![] }
        }
    });
    let h = Home::new();
    let out = h.run(&["ask", "--provider", "openai", "--base-url", &mock.base(), "--events", "q"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mock.requests().len(), 2);
    let evs = events(&out);
    assert_eq!(done(&evs)["model_requests"], 2);
    let run = evs[0]["run_id"].as_str().unwrap();
    assert_eq!(
        ledger(&h, run),
        vec![
            ("research".into(), "retried".into(), Some("transient".into())),
            ("research".into(), "ok".into(), None)
        ]
    );
    // `runs show` prints the snapshot and the ledger for an audit.
    let show = h.run(&["runs", "show", run]);
    let v: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(v["ledger"].as_array().unwrap().len(), 2);
    assert!(v["snapshot"]["policies"]["research-runtime/total-model-requests"].is_number());
}

#[test]
fn connection_refused_is_provider_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let h = Home::new();
    let out = h.run(&[
        "ask",
        "--provider",
        "openai",
        "--base-url",
        &format!("http://127.0.0.1:{port}/v1"),
        "--events",
        "q",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let d = done(&events(&out)).clone();
    assert_eq!(d["error"]["code"], "PROVIDER_UNAVAILABLE");
}

#[test]
fn the_deadline_ends_research_and_leaves_time_for_the_answer() {
    let h = Home::new();
    h.write(
        "policies.toml",
        "[values]\n\"research-runtime/run-deadline\" = 4\n\"research-runtime/research-deadline-share-percent\" = 50\n\"provider/request-timeout\" = 1\n\"tools/source-handle-lifetime\" = 60\n",
    );
    let slow = r#"{"when": "research", "content": "", "delay_ms": 300, "tool_calls": [{"name": "search_sources", "arguments": {"query": "budget"}}]}"#;
    let slow2 = r#"{"when": "research", "content": "", "delay_ms": 300, "tool_calls": [{"name": "read_source", "arguments": {"handle": "S1"}}]}"#;
    let fin = r#"{"when": "final", "content": "Two requests are reserved [S1]."}"#;
    let lines: Vec<&str> = [slow, slow2].iter().cycle().take(20).copied().chain([fin]).collect();
    let t = Instant::now();
    let (out, evs) = ask_scripted(&h, &lines, &[]);
    assert!(out.status.success());
    let d = done(&evs);
    assert_eq!(d["stop"], "deadline", "{d}");
    assert_eq!(d["outcome"], "answered");
    assert!(t.elapsed() < Duration::from_secs(20));
}

/// kill -9 during research, then resume under larger defaults: the run
/// keeps its snapshot (10 rounds, 10 requests) and its used requests, and
/// both processes together never exceed the original allowance.
#[test]
fn kill_9_then_resume_under_larger_defaults_never_exceeds_the_allowance() {
    let h = Home::new();
    h.write("policies.toml", "[values]\n\"research-runtime/total-model-requests\" = 10\n");
    let turn = r#"{"when": "research", "delay_ms": 120, "content": "looking", "tool_calls": [{"name": "search_sources", "arguments": {"query": "budget"}}, {"name": "read_source", "arguments": {"handle": "S1"}}]}"#;
    let other = r#"{"when": "research", "delay_ms": 120, "content": "looking", "tool_calls": [{"name": "search_sources", "arguments": {"query": "sockets"}}]}"#;
    let fin = r#"{"when": "final", "content": "Two requests are reserved [S1]."}"#;
    let lines: Vec<&str> = [turn, other].iter().cycle().take(30).copied().chain([fin]).collect();
    let script = h.write("script.jsonl", &lines.join("\n")).display().to_string();
    let corpus = h.corpus();
    let mut child = h
        .cmd(&[
            "ask",
            "--provider",
            "scripted",
            "--script",
            &script,
            "--corpus",
            corpus.to_str().unwrap(),
            "--events",
            "--chat",
            "chat_k",
            "q",
        ])
        .env("AGENTD_CHAT_MAX_TOOL_ITERS", "10")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let db_path = h.path().join("agentd.db");
    let t = Instant::now();
    let (run, used_before) = loop {
        std::thread::sleep(Duration::from_millis(50));
        if let Ok(db) = rusqlite::Connection::open(&db_path) {
            let r: Option<(String, i64)> = db
                .query_row("SELECT run_id, count(*) FROM ledger GROUP BY run_id", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .ok();
            if let Some((run, n)) = r {
                if n >= 4 {
                    break (run, n);
                }
            }
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the run never got going");
    };
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let listed = String::from_utf8(h.run(&["runs", "list"]).stdout).unwrap();
    let row: Value = listed
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["run_id"] == run)
        .unwrap();
    assert_eq!(row["status"], "interrupted");
    // The streamed text of the killed process is still in the chat, marked.
    let db = rusqlite::Connection::open(&db_path).unwrap();
    let st: String = db
        .query_row("SELECT status FROM messages WHERE chat_id = 'chat_k' AND role = 'assistant' AND tool_calls IS NULL ORDER BY id LIMIT 1", [], |r| r.get(0))
        .unwrap();
    assert_eq!(st, "interrupted");
    // Larger defaults now: 20 rounds, 50 requests.
    h.write("policies.toml", "[values]\n\"research-runtime/total-model-requests\" = 50\n");
    let out = h
        .cmd(&["runs", "resume", &run, "--events"])
        .env("AGENTD_CHAT_MAX_TOOL_ITERS", "20")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let evs = events(&out);
    assert_eq!(evs[0]["run_id"], run);
    assert_eq!(evs[0]["max_tool_iters"], 10, "the snapshot's rounds, not the new default");
    let d = done(&evs);
    let sent: Vec<_> = ledger(&h, &run).into_iter().filter(|e| e.1 != "refused").collect();
    assert!(sent.len() <= 10, "{} requests over both processes", sent.len());
    assert_eq!(d["model_requests"].as_u64().unwrap() as usize, sent.len());
    assert!(used_before as usize <= sent.len());
    assert!(matches!(d["outcome"].as_str(), Some("answered" | "excerpt")), "{d}");
    // A finished run cannot be resumed again.
    assert_eq!(h.run(&["runs", "resume", &run]).status.code(), Some(1));
}
