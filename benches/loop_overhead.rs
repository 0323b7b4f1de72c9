//! Research-loop overhead: everything except model time. A scripted run of
//! 12 rounds of search and read over a 40-document corpus and a final
//! answer is timed end to end (process start, store, index, tools, events,
//! persistence) with the model taking no time at all; that is the
//! overhead. It is then set against the model time the same turns take at
//! a realistic rate (8 characters every 20 ms, about 50 tokens/s), and a
//! run at that rate is shown for reference (its sleeps overshoot by a
//! fraction of a millisecond each, which is timer noise, not overhead).
//!
//! `cargo bench -p agentd-benches --bench loop_overhead`.

use agentd_benches::{agentd, median};
use std::time::Instant;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let home = std::env::temp_dir().join(format!("agentd-loop-{}", std::process::id()));
    let corpus = home.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    for i in 0..40 {
        std::fs::write(
            corpus.join(format!("doc{i}.md")),
            format!(
                "# Document {i}\n\n{}",
                "Budgets reserve answers; sockets carry requests; voices read short sentences. "
                    .repeat(60)
            ),
        )
        .unwrap();
    }
    // 20 ms per streamed piece of 8 characters ≈ 2 tokens: 100 tokens/s of
    // characters, 50 tokens/s of pieces; each turn writes ~200 characters.
    let text = "Looking at the sources about budgets and sockets before answering. ".repeat(3);
    let pieces = text.chars().count().div_ceil(8);
    let delay_ms = 20u64;
    let mut lines = Vec::new();
    for r in 0..12 {
        lines.push(format!(
            r#"{{"when": "research", "delay_ms": {delay_ms}, "content": "{text}", "tool_calls": [{{"name": "search_sources", "arguments": {{"query": "budgets sockets {r}"}}}}, {{"name": "read_source", "arguments": {{"handle": "S{}"}}}}]}}"#,
            r + 1
        ));
    }
    lines.push(format!(r#"{{"when": "final", "delay_ms": {delay_ms}, "content": "{text}"}}"#));
    let script = home.join("script.jsonl");
    std::fs::write(&script, lines.join("\n")).unwrap();
    // Model time: every turn pauses once before it starts and once per piece.
    let model_s = 13.0 * (pieces as f64 + 1.0) * delay_ms as f64 / 1000.0;
    let run = |script: &std::path::Path| {
        let t = Instant::now();
        let out = std::process::Command::new(agentd())
            .args([
                "ask",
                "--provider",
                "scripted",
                "--script",
                script.to_str().unwrap(),
                "--corpus",
                corpus.to_str().unwrap(),
                "--events",
                "How are budgets kept?",
            ])
            .env("AGENTD_HOME", home.join("state"))
            .output()
            .expect("agentd runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        t.elapsed().as_secs_f64()
    };
    let instant = home.join("instant.jsonl");
    std::fs::write(
        &instant,
        lines
            .iter()
            .map(|l| l.replace(&format!("\"delay_ms\": {delay_ms}"), "\"delay_ms\": 0"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    run(&instant); // warm-up: builds the corpus index
    let overhead = median((0..7).map(|_| run(&instant)).collect());
    let paced = run(&script);
    println!(
        "12 rounds + final, model taking no time: {:.1} ms end to end (median of 7)",
        overhead * 1e3
    );
    println!("the same turns at ~50 tokens/s: {model_s:.2} s of model time; a paced run took {paced:.2} s wall");
    println!(
        "loop overhead: {:.2}% of the run's wall time",
        overhead / (overhead + model_s) * 100.0
    );
    let _ = std::fs::remove_dir_all(&home);
}
