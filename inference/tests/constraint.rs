//! Constrained decoding on the tiny GGUF (random weights: unconstrained, it
//! writes noise) and, when `AGENTD_TEST_MODEL` names it, the real default
//! model: grammar output follows the grammar, forced tokens are spliced,
//! markers are masked at every state, and a lazy grammar engages only at
//! its marker.

mod common;

use inference::{Constraint, Engine, EngineOptions, Finish, GenParams, Marker};
use std::sync::atomic::AtomicBool;

fn tiny() -> (common::Tiny, Engine) {
    let t = common::write_tiny(None);
    let e = Engine::load(&t.path, &EngineOptions { threads: Some(1), ..Default::default() })
        .expect("tiny model loads");
    (t, e)
}

fn go(e: &Engine, prompt: &str, p: &GenParams) -> inference::Output {
    let mut s = e.session();
    let ids = e.tokenize(prompt, true).unwrap();
    e.generate(&mut s, &ids, p, &AtomicBool::new(false), &mut |_| {}).expect("generates")
}

const CALL: &str = r#"start: "<tool_call>" "\n" %json {"type": "object", "properties": {"name": {"const": "search"}, "arguments": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 12}, "limit": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["query", "limit"], "additionalProperties": false}}, "required": ["name", "arguments"], "additionalProperties": false, "x-guidance": {"whitespace_pattern": "[ ]{1,2}"}} "\n" "</tool_call>"
"#;

#[test]
fn a_grammar_turns_noise_into_a_valid_call() {
    let (_t, e) = tiny();
    let prompt = "<|im_start|>user\nfind the user<|im_end|>\n<|im_start|>assistant\n";
    let free = go(&e, prompt, &GenParams { max_tokens: 60, ..GenParams::default() });
    assert!(!free.text.starts_with("<tool_call>"), "the tiny model writes noise: {:?}", free.text);
    let g = e.grammars().unwrap().compile(CALL).expect("the grammar compiles");
    let p = GenParams {
        max_tokens: 400,
        constraint: Some(Constraint::Grammar(g)),
        ..GenParams::default()
    };
    let out = go(&e, prompt, &p);
    assert_eq!(out.finish, Finish::Stop, "{:?}", out.text);
    let body = out
        .text
        .strip_prefix("<tool_call>\n")
        .and_then(|b| b.strip_suffix("\n</tool_call>"))
        .unwrap_or_else(|| panic!("not a call: {:?}", out.text));
    let v: serde_json::Value = serde_json::from_str(body).expect("valid JSON");
    assert_eq!(v["name"], "search");
    assert!(v["arguments"]["query"].as_str().is_some_and(|q| q.chars().count() <= 12));
    let limit = v["arguments"]["limit"].as_i64().expect("an integer");
    assert!((1..=9).contains(&limit), "{limit}");
    // Forced text ran as spliced tokens: the output is the same tokens the
    // tokenizer gives its text.
    assert_eq!(e.tokenizer().decode(&out.ids), out.text);
    // A second compile of the same text is the cached grammar.
    let before = e.grammars().unwrap().cached();
    e.grammars().unwrap().compile(CALL).unwrap();
    assert_eq!(e.grammars().unwrap().cached(), before);
}

#[test]
fn grammar_errors_are_typed() {
    let (_t, e) = tiny();
    let err = e
        .grammars()
        .unwrap()
        .compile(r#"start: %json {"type": "array", "uniqueItems": true}"#)
        .expect_err("uniqueItems is not enforced");
    assert_eq!(err.kind(), inference::ErrorKind::Grammar);
    assert!(err.to_string().contains("uniqueItems"), "{err}");
}

/// Every token that would complete `m` from each state is in the mask, and
/// nothing else: checked against the bytes of every token.
fn check_marker(e: &Engine, m: &Marker) {
    let text = m.text();
    let tok = e.tokenizer();
    for state in 0..m.len() {
        let mut expect: Vec<u32> = (0..tok.len() as u32)
            .filter(|&id| {
                let mut s = text.as_bytes()[..state].to_vec();
                s.extend_from_slice(tok.piece(id));
                s.windows(m.len()).any(|w| w == text.as_bytes())
            })
            .collect();
        expect.sort_unstable();
        let mut got = m.completing(state);
        got.sort_unstable();
        assert_eq!(got, expect, "state {state} of {text:?}");
    }
}

#[test]
fn marker_masks_hold_every_completing_token() {
    let (_t, e) = tiny();
    let g = e.grammars().unwrap();
    for text in ["<tool_call>", "<|im_end|>", "aab", "[TOOL_CALLS]"] {
        check_marker(&e, &g.marker(text).unwrap());
    }
}

#[test]
fn the_real_vocabulary_masks_call_starts() {
    let Some(path) = std::env::var_os("AGENTD_TEST_MODEL") else {
        eprintln!("SKIP: AGENTD_TEST_MODEL is not set");
        return;
    };
    let e = Engine::load(path.as_ref(), &EngineOptions { threads: Some(2), ..Default::default() })
        .unwrap();
    let g = e.grammars().unwrap();
    let m = g.marker("<tool_call>").unwrap();
    check_marker(&e, &m);
    // After "<tool_call" only ">"-led tokens complete it.
    assert!(m.completing(10).contains(&e.tokenize(">", false).unwrap()[0]));
    let prompt = "<|im_start|>user\nRepeat exactly this text: <tool_call>{\"name\": \"search\"}</tool_call><|im_end|>\n<|im_start|>assistant\n";
    let free = go(&e, prompt, &GenParams { max_tokens: 24, ..GenParams::default() });
    assert!(
        free.text.contains("<tool_call>"),
        "unconstrained, the model starts a call: {:?}",
        free.text
    );
    let p = GenParams {
        max_tokens: 24,
        constraint: Some(Constraint::Forbid(vec![m.clone()])),
        ..GenParams::default()
    };
    let out = go(&e, prompt, &p);
    let mut s = 0;
    for &id in &out.ids {
        assert!(!m.completing(s).contains(&id), "token {id} completes the marker");
        s = m.advance(s, e.tokenizer().piece(id)) % m.len();
    }
    assert!(!out.text.contains("<tool_call>"), "{:?}", out.text);
}

/// The no-repeat n-gram rule is off while a grammar governs: JSON repeats
/// its punctuation by design, so a governed output is the same with the
/// rule as without it, even at n = 2.
#[test]
fn the_no_repeat_ngram_rule_leaves_a_governed_output_alone() {
    let (_t, e) = tiny();
    let prompt = "<|im_start|>user\nfind the user<|im_end|>\n<|im_start|>assistant\n";
    let g = e.grammars().unwrap().compile(CALL).unwrap();
    let p = |n| GenParams {
        max_tokens: 400,
        sampling: inference::Sampling { no_repeat_ngram: n, ..Default::default() },
        constraint: Some(Constraint::Grammar(g.clone())),
        ..GenParams::default()
    };
    let plain = go(&e, prompt, &p(0));
    let ruled = go(&e, prompt, &p(2));
    assert_eq!(plain.finish, Finish::Stop, "{:?}", plain.text);
    assert_eq!(ruled.ids, plain.ids, "{:?} vs {:?}", ruled.text, plain.text);
    // The call does repeat bigrams, which the rule would have banned.
    let pairs: Vec<_> = plain.ids.windows(2).collect();
    let distinct: std::collections::HashSet<_> = pairs.iter().collect();
    assert!(distinct.len() < pairs.len(), "{:?}", plain.text);
}
