//! Shows how the evidence ranking (`prompts::evidence::rank`) orders the
//! units a run read: for tuning and for reading a wrong answer.
//!
//! ```sh
//! agentd ask --corpus DIR --events "QUESTION" > run.jsonl
//! cargo run --release -p prompts --example rank -- run.jsonl "QUESTION" [N]
//! ```

use prompts::evidence::{rank, Passage};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(file), Some(question)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: rank EVENTS.jsonl QUESTION [N]");
        std::process::exit(2);
    };
    let n: usize = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(12);
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| {
        eprintln!("rank: cannot read {file}: {e}");
        std::process::exit(1);
    });
    let mut passages = Vec::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if e["type"] != "tool_result" || e["name"] != "read_source" {
            continue;
        }
        let Some(content) = e["content"].as_str() else { continue };
        let Ok(c) = serde_json::from_str::<serde_json::Value>(content) else { continue };
        passages.push(Passage {
            handle: c["handle"].as_str().unwrap_or_default().to_owned(),
            title: c["title"].as_str().unwrap_or_default().to_owned(),
            text: c["text"].as_str().unwrap_or_default().to_owned(),
            // The host knows the heading a segment continues; the tool's
            // JSON does not carry it.
            heading: String::new(),
            rank: Some(passages.len() + 1),
        });
    }
    for u in rank(question, &passages).into_iter().take(n) {
        println!("{:7.3} {:3} {:?} | {}", u.score, u.handle, u.order, u.text);
    }
}
