//! The research loop end to end (ADR 0101's test sentence), driving the
//! built `agentd ask --events` with the scripted provider, a mock
//! OpenAI-compatible server and (opt-in, `AGENTD_TEST_MODEL`) the real
//! default model.

use agentd_tests::{done, events, of, runs_show as show, Home, MockOpenAi, Reply};
use serde_json::Value;
use std::io::{Read, Write};

/// The real default model's GGUF (`AGENTD_TEST_MODEL`, the path `agentd
/// pull` prints); `None`, said on stderr past the test harness's capture,
/// when it is not set.
fn real_model(test: &str) -> Option<String> {
    match std::env::var("AGENTD_TEST_MODEL") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: AGENTD_TEST_MODEL is not set (`agentd pull` prints the default model's path)"
            );
            None
        }
    }
}

fn script(h: &Home, lines: &[&str]) -> String {
    h.write("script.jsonl", &lines.join("\n")).display().to_string()
}

fn ask(
    h: &Home,
    script_path: &str,
    extra: &[&str],
    question: &str,
) -> (std::process::Output, Vec<Value>) {
    let corpus = h.corpus();
    let mut args = vec![
        "ask",
        "--provider",
        "scripted",
        "--script",
        script_path,
        "--corpus",
        corpus.to_str().unwrap(),
        "--events",
    ];
    args.extend_from_slice(extra);
    args.push(question);
    let out = h.run(&args);
    let evs = events(&out);
    (out, evs)
}

const SEARCH: &str = r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "budget"}}]}"#;
const ANSWER: &str = r#"{"when": "final", "content": "Two requests are reserved."}"#;

#[test]
fn final_synthesis_after_the_last_results_beyond_six_rounds() {
    let h = Home::new();
    // Every research turn calls a different search, so only the bound stops it.
    let mut lines: Vec<String> = (0..20)
        .map(|i| format!(r#"{{"when": "research", "tool_calls": [{{"name": "search_sources", "arguments": {{"query": "budget {i}"}}}}]}}"#))
        .collect();
    lines.push(ANSWER.into());
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let (out, evs) = ask(&h, &script(&h, &refs), &[], "How many requests are reserved?");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reqs = of(&evs, "request");
    assert_eq!(reqs.len(), 13);
    assert!(reqs[..12].iter().all(|r| r["phase"] == "research"));
    assert_eq!(reqs[12]["phase"], "final");
    let n: Vec<u64> = reqs.iter().map(|r| r["n"].as_u64().unwrap()).collect();
    assert_eq!(n, (1..=13).collect::<Vec<_>>());
    assert_eq!(of(&evs, "tool_result").len(), 12);
    let notice = of(&evs, "notice");
    assert!(notice.iter().any(|e| e["kind"] == "finishing" && e["text"] == "Finishing the answer"));
    // The notice comes after the last result and before the final request.
    let pos = |p: &dyn Fn(&Value) -> bool| evs.iter().position(p).unwrap();
    let last_result = evs.iter().rposition(|e| e["type"] == "tool_result").unwrap();
    assert!(pos(&|e| e["kind"] == "finishing") > last_result);
    assert!(
        pos(&|e| e["type"] == "request" && e["phase"] == "final")
            > pos(&|e| e["kind"] == "finishing")
    );
    let d = done(&evs);
    assert_eq!(d["outcome"], "answered");
    assert_eq!(d["stop"], "round_limit");
    assert_eq!(d["rounds"], 12);
    assert_eq!(d["model_requests"], 13);
    assert_eq!(d["answer"], "Two requests are reserved.");
    assert_eq!(evs[0]["type"], "run");
    assert_eq!(evs[0]["max_tool_iters"], 12);
}

#[test]
fn the_setting_bounds_rounds_and_six_stays_effective() {
    let h = Home::new();
    assert!(h.run(&["settings", "set", "chat.max_tool_iters", "6"]).status.success());
    let lines: Vec<String> = (0..10)
        .map(|i| format!(r#"{{"when": "research", "tool_calls": [{{"name": "search_sources", "arguments": {{"query": "q{i}"}}}}]}}"#))
        .chain([ANSWER.to_string()])
        .collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let (_, evs) = ask(&h, &script(&h, &refs), &[], "q");
    assert_eq!(of(&evs, "request").len(), 7);
    assert_eq!(done(&evs)["stop"], "round_limit");
    assert_eq!(evs[0]["max_tool_iters"], 6);
}

#[test]
fn several_calls_in_one_round_run_in_order_and_count_as_one_round() {
    let h = Home::new();
    let s = script(
        &h,
        &[
            r#"{"tool_calls": [{"name": "search_sources", "arguments": {"query": "budget"}}, {"name": "search_sources", "arguments": {"query": "socket"}}, {"name": "read_source", "arguments": {"handle": "S1"}}]}"#,
            r#"{"content": "Two requests [S1]."}"#,
        ],
    );
    let (_, evs) = ask(&h, &s, &[], "q");
    let calls = of(&evs, "tool_call");
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c["round"] == 1));
    let results = of(&evs, "tool_result");
    assert_eq!(
        results.iter().map(|r| r["id"].clone()).collect::<Vec<_>>(),
        calls.iter().map(|c| c["id"].clone()).collect::<Vec<_>>()
    );
    assert!(results.iter().all(|r| r["ok"] == true));
    let d = done(&evs);
    assert_eq!(d["rounds"], 1);
    assert_eq!(d["stop"], "answer");
}

#[test]
fn three_identical_read_batches_end_research_early() {
    let h = Home::new();
    let (_, evs) = ask(&h, &script(&h, &[SEARCH, ANSWER]), &[], "q");
    let d = done(&evs);
    assert_eq!(d["stop"], "repeated_batches");
    assert_eq!(d["rounds"], 3);
    assert_eq!(d["outcome"], "answered");
    assert_eq!(of(&evs, "request").len(), 4);
}

#[test]
fn different_results_reset_the_repeat_count() {
    let h = Home::new();
    let a = r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "budget"}}]}"#;
    let b = r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "socket"}}]}"#;
    let (_, evs) = ask(&h, &script(&h, &[a, a, b, a, a, b, a, a, a, ANSWER]), &[], "q");
    let d = done(&evs);
    assert_eq!(d["stop"], "repeated_batches");
    assert_eq!(d["rounds"], 9);
}

#[test]
fn batches_with_a_write_are_never_counted_as_repeats() {
    let h = Home::new();
    let notes = h.path().join("notes");
    let w = r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "budget"}}, {"name": "save_note", "arguments": {"title": "Budget", "text": "two"}}]}"#;
    let (_, evs) = ask(&h, &script(&h, &[w, ANSWER]), &["--notes", notes.to_str().unwrap()], "q");
    let d = done(&evs);
    assert_eq!(d["stop"], "round_limit", "{d}");
    assert_eq!(d["rounds"], 12);
    // Every write ran: twelve notes.
    assert_eq!(std::fs::read_dir(&notes).unwrap().count(), 12);
}

#[test]
fn calls_proposed_in_the_final_turn_never_run() {
    let h = Home::new();
    let notes = h.path().join("notes");
    let fin = r#"{"when": "final", "raw": "Budget: two requests.\n<tool_call>\n{\"name\": \"save_note\", \"arguments\": {\"title\": \"x\", \"text\": \"y\"}}\n</tool_call>", "tool_calls": [{"name": "save_note", "arguments": {"title": "z", "text": "w"}}]}"#;
    let (_, evs) = ask(&h, &script(&h, &[SEARCH, fin]), &["--notes", notes.to_str().unwrap()], "q");
    let discarded = of(&evs, "discarded_call");
    assert_eq!(discarded.len(), 2);
    assert!(discarded.iter().all(|e| e["name"] == "save_note"));
    assert!(
        !notes.exists() || std::fs::read_dir(&notes).unwrap().count() == 0,
        "a final-turn call wrote a note"
    );
    let d = done(&evs);
    assert_eq!(d["outcome"], "answered");
    assert_eq!(d["answer"], "Budget: two requests.");
    let content: String =
        of(&evs, "content").iter().map(|e| e["delta"].as_str().unwrap()).collect();
    assert!(!content.contains("tool_call"), "{content}");
}

#[test]
fn a_final_turn_with_only_calls_completes_with_an_excerpt() {
    let h = Home::new();
    let fin = r#"{"when": "final", "raw": "<tool_call>\n{\"name\": \"search_sources\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>"}"#;
    let read = r#"{"when": "research", "tool_calls": [{"name": "read_source", "arguments": {"handle": "S1"}}]}"#;
    let (out, evs) = ask(&h, &script(&h, &[SEARCH, read, read, read, fin]), &[], "q");
    assert!(out.status.success());
    let d = done(&evs);
    assert_eq!(d["outcome"], "excerpt");
    let answer = d["answer"].as_str().unwrap();
    assert!(answer.lines().next().unwrap().contains("excerpt"), "{answer}");
    assert!(answer.contains("[S1]") && answer.chars().count() <= 1500, "{answer}");
}

#[test]
fn final_provider_failure_gives_an_excerpt_and_voice_a_spoken_fallback() {
    let h = Home::new();
    let fail = r#"{"when": "final", "error": "failed"}"#;
    let (out, evs) = ask(&h, &script(&h, &[SEARCH, fail]), &[], "q");
    assert_eq!(out.status.code(), Some(0));
    let d = done(&evs);
    assert_eq!(d["outcome"], "excerpt");
    assert!(d["answer"].as_str().unwrap().contains("excerpt"));
    let (out, evs) = ask(&h, &script(&h, &[SEARCH, fail]), &["--voice"], "q");
    assert_eq!(out.status.code(), Some(0));
    let d = done(&evs);
    assert_eq!(d["outcome"], "spoken_fallback");
    let a = d["answer"].as_str().unwrap();
    assert!(
        a.split_whitespace().count() <= 40
            && !a.contains('[')
            && !a.contains("http")
            && !a.contains('<'),
        "{a}"
    );
    // Voice: the tool round is announced, then each sentence of the spoken
    // text, plain, before done.
    let said: Vec<&Value> = evs.iter().filter(|e| e["type"] == "sentence").collect();
    assert_eq!(said.first().map(|e| &e["kind"]), Some(&serde_json::json!("progress")), "{said:?}");
    let spoken: Vec<&str> =
        said.iter().filter(|e| e["kind"].is_null()).filter_map(|e| e["text"].as_str()).collect();
    assert_eq!(spoken.join(" "), a.trim(), "the sentences are the spoken answer");
    let at = |ty: &str| evs.iter().position(|e| e["type"] == ty).unwrap();
    assert_eq!(at("sentence") + 1, at("tool_call"), "announced as the round begins");
    assert!(evs.iter().rposition(|e| e["type"] == "sentence").unwrap() < evs.len() - 1);
}

#[test]
fn context_exhaustion_after_tools_ran_goes_to_the_final_turn() {
    let h = Home::new();
    h.write(
        "corpus/big.md",
        &format!("# Big budget notes\n\n{}", "budget words fill this segment. ".repeat(200)),
    );
    // A context of 1300 tokens (≈ chars / 4): each round reads a 1500-character
    // segment; shortening older results cannot keep up for long. (The
    // default section size could not fit a section worker in it.)
    h.write("policies.toml", "[values]\n\"research/section-size\" = 1500\n");
    let mut lines = vec![
        r#"{"context": 1300}"#.to_string(),
        r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "fill"}}]}"#.to_string(),
    ];
    for k in 0..14 {
        lines.push(format!(r#"{{"when": "research", "tool_calls": [{{"name": "read_source", "arguments": {{"handle": "S1", "segment": {}}}}}]}}"#, k % 3 + 1));
    }
    lines.push(ANSWER.into());
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let (_, evs) = ask(&h, &script(&h, &refs), &[], "q");
    let d = done(&evs);
    assert_eq!(d["stop"], "context_limit", "{d}");
    assert!(d["rounds"].as_u64().unwrap() >= 2 && d["rounds"].as_u64().unwrap() < 12, "{d}");
    assert!(matches!(d["outcome"].as_str(), Some("answered" | "excerpt")), "{d}");
    assert_eq!(of(&evs, "request").last().unwrap()["phase"], "final");
    // Before any tool ran, an input that cannot fit is an error naming both sizes.
    let h2 = Home::new();
    let long = "word ".repeat(4000);
    let (out, evs) = ask(&h2, &script(&h2, &[r#"{"context": 1200}"#, SEARCH]), &[], &long);
    assert_eq!(out.status.code(), Some(1));
    let d = done(&evs);
    assert_eq!(d["outcome"], "error");
    let msg = d["error"]["message"].as_str().unwrap();
    assert!(msg.contains("1200") && msg.contains("needs"), "{msg}");
}

#[test]
fn cancellation_stops_everything_and_keeps_the_streamed_text() {
    let h = Home::new();
    let slow = r#"{"content": "Partial answer that streams slowly and is cut by Ctrl-C before it ends.", "delay_ms": 150}"#;
    let s = script(&h, &[slow]);
    let corpus = h.corpus();
    let mut child = h
        .cmd(&[
            "ask",
            "--provider",
            "scripted",
            "--script",
            &s,
            "--corpus",
            corpus.to_str().unwrap(),
            "--events",
            "--chat",
            "chat_cancel",
            "q",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(900));
    // SIGINT, as Ctrl-C would send.
    let _ = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let status = child.wait().unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert_eq!(status.code(), Some(130), "{out}");
    let evs: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let d = done(&evs);
    assert_eq!(d["outcome"], "cancelled");
    assert_eq!(d["stop"], "cancelled");
    let streamed = d["answer"].as_str().unwrap().to_owned();
    assert!(!streamed.is_empty() && streamed.len() < 70, "{streamed:?}");
    let db = rusqlite::Connection::open(h.path().join("agentd.db")).unwrap();
    let (content, status): (String, String) = db
        .query_row("SELECT content, status FROM messages WHERE chat_id = 'chat_cancel' AND role = 'assistant'", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!(content, streamed);
    assert_eq!(status, "cancelled");
}

#[test]
fn chats_persist_and_continue() {
    let h = Home::new();
    let s = script(&h, &[r#"{"content": "First answer."}"#]);
    let (_, evs) = ask(&h, &s, &["--chat", "chat_1"], "first question");
    assert_eq!(evs[0]["chat_id"], "chat_1");
    let s = script(&h, &[r#"{"content": "Second answer."}"#]);
    let (_, evs) = ask(&h, &s, &["--chat", "chat_1"], "second question");
    assert_eq!(done(&evs)["answer"], "Second answer.");
    let db = rusqlite::Connection::open(h.path().join("agentd.db")).unwrap();
    let mut st = db
        .prepare("SELECT role, content, status FROM messages WHERE chat_id = 'chat_1' ORDER BY id")
        .unwrap();
    let rows: Vec<(String, String, String)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        rows,
        vec![
            ("user".into(), "first question".into(), "complete".into()),
            ("assistant".into(), "First answer.".into(), "complete".into()),
            ("user".into(), "second question".into(), "complete".into()),
            ("assistant".into(), "Second answer.".into(), "complete".into()),
        ]
    );
}

/// Against an OpenAI-compatible mock that always calls tools: exactly 12
/// research requests with tools, then one final request with neither
/// `tools` nor `tool_choice` (7 in all with the setting at 6).
#[test]
fn openai_mock_that_always_calls_tools() {
    for (setting, want_research) in [(None, 12usize), (Some("6"), 6)] {
        let mock = MockOpenAi::start(|n, body| {
            if body.get("tools").is_some() {
                Reply::Stream {
                    content: String::new(),
                    calls: vec![("search_sources".into(), format!(r#"{{"query": "budget {n}"}}"#))],
                }
            } else {
                Reply::Stream {
                    content: "Two requests are reserved.<tool_call>\n{\"name\": \"save_note\", \"arguments\": {}}\n</tool_call>".into(),
                    calls: vec![],
                }
            }
        });
        let h = Home::new();
        if let Some(v) = setting {
            assert!(h.run(&["settings", "set", "chat.max_tool_iters", v]).status.success());
        }
        let corpus = h.corpus();
        let out = h.run(&[
            "ask",
            "--provider",
            "openai",
            "--base-url",
            &mock.base(),
            "--model",
            "mock-model",
            "--corpus",
            corpus.to_str().unwrap(),
            "--events",
            "How many requests are reserved?",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let evs = events(&out);
        let seen = mock.requests();
        assert_eq!(seen.len(), want_research + 1);
        for (i, r) in seen.iter().enumerate() {
            assert_eq!(r.path, "/v1/chat/completions");
            assert_eq!(r.body["model"], "mock-model");
            assert_eq!(r.body["stream"], true);
            if i < want_research {
                assert!(r.body["tools"].is_array(), "request {i} lacks tools");
                // Results go back the OpenAI way: a tool message with the call id.
                if i > 0 {
                    let msgs = r.body["messages"].as_array().unwrap();
                    let tool = msgs.iter().rev().find(|m| m["role"] == "tool").unwrap();
                    assert!(tool["tool_call_id"].as_str().unwrap().starts_with("call_"));
                    let result: Value =
                        serde_json::from_str(tool["content"].as_str().unwrap()).unwrap();
                    assert!(result["results"].is_array());
                    let asst = msgs.iter().rev().find(|m| m["role"] == "assistant").unwrap();
                    assert_eq!(asst["tool_calls"][0]["function"]["name"], "search_sources");
                }
            } else {
                assert!(r.body.get("tools").is_none(), "final request offers tools");
                assert!(r.body.get("tool_choice").is_none(), "final request sets tool_choice");
            }
        }
        let d = done(&evs);
        assert_eq!(d["outcome"], "answered");
        assert_eq!(d["stop"], "round_limit");
        assert_eq!(d["model_requests"], want_research as u64 + 1);
        assert_eq!(d["answer"], "Two requests are reserved.");
        assert_eq!(of(&evs, "discarded_call").len(), 1);
    }
}

/// The local provider on the real default model: whatever a 135M model
/// writes, the run is admitted, every request is numbered and in the
/// ledger's order, and the reply ends with an answer or the labelled
/// excerpt, never an error.
#[test]
fn the_real_default_model_researches_and_always_completes() {
    let Some(model) = real_model("the_real_default_model_researches_and_always_completes") else {
        return;
    };
    let h = Home::new();
    let corpus = h.corpus();
    let out = h
        .cmd(&[
            "ask",
            "--model",
            &model,
            "--corpus",
            corpus.to_str().unwrap(),
            "--events",
            "How many requests does the run reserve for the final answer?",
        ])
        .env("AGENTD_CHAT_MAX_TOOL_ITERS", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let evs = events(&out);
    assert_eq!(evs[0]["type"], "run");
    assert_eq!(evs[0]["max_tool_iters"], 1);
    let n: Vec<u64> = of(&evs, "request").iter().map(|r| r["n"].as_u64().unwrap()).collect();
    assert!(!n.is_empty());
    assert_eq!(n, (1..=n.len() as u64).collect::<Vec<_>>());
    let d = done(&evs);
    assert!(matches!(d["outcome"].as_str(), Some("answered" | "excerpt")), "{d}");
    assert!(d["rounds"].as_u64().unwrap() <= 1, "{d}");
    assert_eq!(d["model_requests"].as_u64().unwrap() as usize, n.len());
    assert!(!d["answer"].as_str().unwrap().trim().is_empty(), "{d}");
}

/// Logs (issue 12): under `AGENTD_LOG=info` a run writes one `run finished`
/// line and one `model request` line per request, each naming the run id;
/// with no filter set, nothing of the kind.
#[test]
fn info_logs_name_the_run_in_a_line_per_run_and_per_request() {
    let h = Home::new();
    let s = script(&h, &[SEARCH, r#"{"content": "Two requests are reserved."}"#]);
    let corpus = h.corpus();
    let args = [
        "ask",
        "--provider",
        "scripted",
        "--script",
        &s,
        "--corpus",
        corpus.to_str().unwrap(),
        "--events",
        "budget?",
    ];
    let out = h.cmd(&args).env("AGENTD_LOG", "info").output().expect("agentd runs");
    let evs = events(&out);
    let run_id = of(&evs, "run")[0]["run_id"].as_str().unwrap().to_owned();
    let requests = of(&evs, "request").len();
    assert_eq!(requests, 2, "{evs:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let with_id = |what: &str| {
        err.lines().filter(|l| l.contains(what) && l.contains(&format!("run_id={run_id}"))).count()
    };
    assert_eq!(with_id("run finished"), 1, "{err}");
    assert_eq!(with_id("model request"), requests, "{err}");
    let quiet = h.run(&args);
    let err = String::from_utf8_lossy(&quiet.stderr);
    assert!(!err.contains("model request") && !err.contains("run finished"), "{err}");
}

/// Host-led entry research (issue 27): a model that does not drive tools
/// (`--research host`; models.toml says so for the default model) gets the
/// host's search with the question and reads of the best segments before
/// its first turn — the same tools, quotas, events (`by: host`), chat and
/// ledger — and answers with one of the sentences read, cited.
#[test]
fn host_led_entry_reads_before_the_first_turn_and_the_answer_is_composed_of_it() {
    let h = Home::new();
    let log = h.path().join("requests.jsonl");
    let first = format!(r#"{{"log": "{}"}}"#, log.display());
    let s = script(&h, &[&first, r#"{"when": "final", "choose": 0}"#]);
    let q = "How many requests does the run reserve for the final answer?";
    let (out, evs) = ask(&h, &s, &["--research", "host"], q);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let calls = of(&evs, "tool_call");
    assert!(calls.len() >= 2, "{calls:?}");
    assert!(calls.iter().all(|c| c["by"] == "host" && c["round"] == 1), "{calls:?}");
    assert_eq!(calls[0]["name"], "search_sources");
    assert_eq!(calls[0]["arguments"]["query"], q, "the host searches with the question itself");
    assert!(calls[1..].iter().all(|c| c["name"] == "read_source"));
    // Every call of the entry comes before the first model request.
    let first_request = evs.iter().position(|e| e["type"] == "request").unwrap();
    let last_result = evs.iter().rposition(|e| e["type"] == "tool_result").unwrap();
    assert!(last_result < first_request);
    let reqs = of(&evs, "request");
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["phase"], "final");
    // The turn was offered the most relevant sentences read, each cited.
    let logged: Value =
        serde_json::from_str(std::fs::read_to_string(&log).unwrap().lines().next().unwrap())
            .unwrap();
    let choices = logged["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 1, "{choices:?}");
    assert!(
        choices[0].as_str().unwrap().starts_with("The run reserves two requests"),
        "{choices:?}"
    );
    let d = done(&evs);
    assert_eq!(d["outcome"], "answered");
    assert_eq!(d["stop"], "answer");
    assert_eq!(d["grounded"], true, "{d}");
    assert_eq!(d["rounds"], 1);
    assert_eq!(d["model_requests"], 1);
    let answer = d["answer"].as_str().unwrap();
    assert!(
        answer.starts_with("The run reserves two requests for the final answer. [S"),
        "{answer}"
    );
    // The entry is in the run's ledger of tool calls, marked as the host's.
    let run = evs[0]["run_id"].as_str().unwrap();
    let shown: Value = serde_json::from_slice(&h.run(&["runs", "show", run]).stdout).unwrap();
    let ledger_calls = shown["tool_calls"].as_array().unwrap();
    assert_eq!(ledger_calls.len(), calls.len(), "{shown}");
    assert!(ledger_calls.iter().all(|c| c["outcome"] == "ok" && c["round"] == 1), "{shown}");
    assert_eq!(shown["ledger"].as_array().unwrap().len(), 1);
}

/// The entry spends the run's own tool quotas: with one read allowed per
/// reply, the host's second read is refused like a model's would be.
#[test]
fn host_led_entry_spends_the_same_quotas() {
    let h = Home::new();
    h.write("policies.toml", "[values]\n\"tools/reads-per-run\" = 1\n");
    let s = script(&h, &[r#"{"when": "final", "choose": 0}"#]);
    let (out, evs) =
        ask(&h, &s, &["--research", "host"], "Which socket mode and which final answer?");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reads: Vec<&Value> =
        of(&evs, "tool_result").into_iter().filter(|r| r["name"] == "read_source").collect();
    assert!(reads.len() >= 2, "{reads:?}");
    assert_eq!(reads[0]["ok"], true);
    assert!(
        reads[1..]
            .iter()
            .all(|r| r["ok"] == false
                && r["content"].as_str().unwrap().contains("TOOL_NOT_AVAILABLE"))
    );
}

/// No junk as an answer (issue 27): an answer that loops is stopped while
/// it streams; what streamed stays, and the reply completes with the
/// labelled excerpt of the most relevant sentences, each with its handle.
#[test]
fn a_looping_answer_is_stopped_and_completed_with_the_labelled_excerpt() {
    let h = Home::new();
    let looped = "The round limit is removed when the round limit is reached, and the round limit is removed. The round limit is removed when the round limit is reached.";
    let final_line = serde_json::json!({"when": "final", "content": looped}).to_string();
    let s = script(
        &h,
        &[
            SEARCH,
            r#"{"when": "research", "tool_calls": [{"name": "read_source", "arguments": {"handle": "S1"}}]}"#,
            &final_line,
        ],
    );
    let (out, evs) = ask(&h, &s, &[], "How many requests are reserved for the final answer?");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d = done(&evs);
    assert_eq!(d["outcome"], "excerpt", "{d}");
    let answer = d["answer"].as_str().unwrap();
    assert!(answer.lines().next().unwrap().contains("excerpt"), "{answer}");
    assert!(
        answer.contains("[S1] The run reserves two requests for the final answer."),
        "{answer}"
    );
    // The text streamed before the loop was caught stays, and stops short.
    let streamed: String =
        of(&evs, "content").iter().map(|e| e["delta"].as_str().unwrap()).collect();
    assert!(streamed.starts_with("The round limit is removed"), "{streamed}");
    assert!(!streamed.contains(looped), "the loop was cut short: {streamed}");
    assert!(of(&evs, "notice")
        .iter()
        .any(|n| n["kind"] == "fallback" && n["text"].as_str().unwrap().contains("repeating")));
}

/// The README's first command on the real default model (issue 27): the
/// host leads research over `docs/`, and the answer is grounded — it cites
/// the handle of `docs/research.md`, whose text says what the round limit
/// does.
#[test]
fn the_readme_question_is_answered_from_docs_research_md_on_the_real_model() {
    let Some(model) =
        real_model("the_readme_question_is_answered_from_docs_research_md_on_the_real_model")
    else {
        return;
    };
    let h = Home::new();
    let docs = agentd_tests::workspace_root().join("docs");
    let out = h.run(&[
        "ask",
        "--model",
        &model,
        "--corpus",
        docs.to_str().unwrap(),
        "--events",
        "What happens when research reaches the round limit?",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let evs = events(&out);
    let d = done(&evs);
    assert_eq!(d["outcome"], "answered", "{d}");
    assert_eq!(d["grounded"], true, "{d}");
    let calls = of(&evs, "tool_call");
    assert!(!calls.is_empty() && calls.iter().all(|c| c["by"] == "host"), "{calls:?}");
    // Which handle is docs/research.md: from the search results.
    let mut research_md = Vec::new();
    for r in of(&evs, "tool_result").iter().filter(|r| r["name"] == "search_sources") {
        let v: Value = serde_json::from_str(r["content"].as_str().unwrap()).unwrap();
        for hit in v["results"].as_array().unwrap() {
            if hit["path"].as_str().unwrap().ends_with("docs/research.md") {
                research_md.push(format!("[{}]", hit["handle"].as_str().unwrap()));
            }
        }
    }
    let answer = d["answer"].as_str().unwrap();
    assert!(research_md.iter().any(|h| answer.contains(h.as_str())), "{answer} {research_md:?}");
    assert!(answer.to_lowercase().contains("round limit"), "{answer}");
}

/// A bug that panics inside a run (here the scripted provider's `panic`
/// line) ends that run with an error `done` and a settled row — never a
/// process that dies with 101 or a run left `running`.
#[test]
fn a_panic_inside_a_run_settles_it_as_an_error() {
    let h = Home::new();
    let s = script(&h, &[SEARCH, r#"{"when": "research", "panic": "a bug"}"#, ANSWER]);
    let (out, evs) = ask(&h, &s, &[], "How many requests are reserved?");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let d = done(&evs);
    assert_eq!(d["outcome"], "error", "{d}");
    assert_eq!(d["error"]["code"], "INTERNAL_ERROR", "{d}");
    assert!(d["error"]["message"].as_str().unwrap().contains("a bug"), "{d}");
    let id = of(&evs, "run")[0]["run_id"].as_str().unwrap().to_owned();
    let rec = show(&h, &id);
    assert_eq!(rec["status"], "finished", "{rec}");
    assert_eq!(rec["outcome"], "error", "{rec}");
    // Nothing is left running.
    let out = h.run(&["runs", "list"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("running"));
}

/// The ledger fails closed at tool calls too: with the ledger of tool calls
/// unwritable, no call runs — the note is not written — and no model
/// request goes out after the failed write.
#[test]
fn no_tool_call_runs_when_its_ledger_row_cannot_be_written() {
    let h = Home::new();
    let notes = h.path().join("notes");
    // A first run creates the store; then every insert into the ledger of
    // tool calls fails, as a full or broken disk would make it.
    let s = script(&h, &[ANSWER]);
    let (out, _) = ask(&h, &s, &[], "q");
    assert!(out.status.success());
    agentd_tests::break_tool_call_ledger(&h);
    let write = r#"{"when": "research", "tool_calls": [{"name": "save_note", "arguments": {"title": "Budget", "text": "two"}}, {"name": "search_sources", "arguments": {"query": "budget"}}]}"#;
    let s = script(&h, &[write, SEARCH, ANSWER]);
    let (out, evs) = ask(&h, &s, &["--notes", notes.to_str().unwrap()], "q");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        !notes.exists() || std::fs::read_dir(&notes).unwrap().count() == 0,
        "the note was written without its ledger row"
    );
    let results = of(&evs, "tool_result");
    assert_eq!(results.len(), 2, "{results:?}");
    for r in &results {
        assert_eq!(r["ok"], false, "{r}");
        assert!(r["content"].as_str().unwrap().contains("LEDGER_WRITE_FAILED"), "{r}");
    }
    let d = done(&evs);
    assert_eq!(d["error"]["code"], "LEDGER_WRITE_FAILED", "{d}");
    assert_eq!(d["model_requests"], 1, "no model request after the failed write: {d}");
    let rec = show(&h, d["run_id"].as_str().unwrap());
    assert_eq!(rec["ledger"].as_array().unwrap().len(), 1, "{rec}");
    assert!(rec["tool_calls"].as_array().unwrap().is_empty(), "{rec}");
}

/// Every call of a run — built-in, read or write, by the model or the
/// host — has its row in the ledger of tool calls, closed with its end.
#[test]
fn every_tool_call_of_a_run_is_in_its_ledger_of_tool_calls() {
    let h = Home::new();
    let notes = h.path().join("notes");
    let write = r#"{"when": "research", "tool_calls": [{"name": "search_sources", "arguments": {"query": "budget"}}, {"name": "save_note", "arguments": {"title": "Budget", "text": "two"}}, {"name": "no_such_tool", "arguments": {}}]}"#;
    let s = script(&h, &[write, ANSWER]);
    let (out, evs) = ask(&h, &s, &["--notes", notes.to_str().unwrap()], "q");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rec = show(&h, done(&evs)["run_id"].as_str().unwrap());
    // The script's last line repeats each round: round 1 shows all three.
    let rows: Vec<(&str, &str, &str)> = rec["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["round"] == 1)
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["kind"].as_str().unwrap(),
                c["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("search_sources", "read", "ok"),
            ("save_note", "write", "ok"),
            ("no_such_tool", "write", "error")
        ],
        "{rec}"
    );
}
