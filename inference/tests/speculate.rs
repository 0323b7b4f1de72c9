//! Prompt-lookup speculation (`GenParams::speculate`) never changes an
//! output: on the default model, with prompts that make it quote its
//! context, every generation equals the one without drafts — greedy or
//! sampled, with penalties, under a constraint, at every length limit,
//! batched with another session, and in a continued session — while drafts
//! are in fact confirmed. The same with a draft model (`Engine::load_draft`)
//! proposing the drafts: the default checkpoint's Q8_0 drafted by its Q4_1.
//!
//! Needs `AGENTD_TEST_MODEL` (the default model), `AGENTD_TEST_Q4KM`,
//! `AGENTD_TEST_Q8` and `AGENTD_TEST_GEMMA` (the test command sets them):
//! each test says when it skips, and fails instead under
//! `AGENTD_TEST_STRICT=1`.

mod common;

use inference::{Constraint, Engine, EngineOptions, GenParams, Output, Sampling, Step};
use std::sync::atomic::AtomicBool;

fn engine(test: &str) -> Option<Engine> {
    engine_of("AGENTD_TEST_MODEL", test)
}

fn engine_of(var: &str, test: &str) -> Option<Engine> {
    let p = common::real_file(var, test)?;
    let opts = EngineOptions { threads: Some(2), ..Default::default() };
    Some(Engine::load(&p, &opts).expect("model loads"))
}

/// Passages the model is asked to quote back, or to answer from.
const QUOTES: [&str; 3] = [
    "Copy this text exactly: The river Vell rises in the Harrow Hills, runs 212 kilometres south through the town of Marrick, and meets the sea at Cold Harbour, where the old lighthouse still stands.",
    "Here is a note: \"The backup job runs at 02:30 every night and keeps the last 14 copies in /srv/backups/daily.\" When does the backup job run and how many copies does it keep? Quote the note.",
    "Document: The Orrin 4 battery lasts 18 hours of video playback and charges to 80 percent in 35 minutes with the 65 W adapter. Question: how long does the battery last? Answer with the sentence from the document.",
];

fn prompt(e: &Engine, text: &str) -> Vec<u32> {
    let chat = format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n");
    e.tokenize_prompt(&chat, true).expect("tokenizes")
}

fn run(e: &Engine, prompt: &[u32], p: &GenParams) -> Output {
    run_logits(e, prompt, p).0
}

/// The output and the session's last logits row (the one after its last
/// cached token: a verification row when the limit ends a confirmed run).
fn run_logits(e: &Engine, prompt: &[u32], p: &GenParams) -> (Output, Vec<f32>) {
    let mut s = e.session();
    let out =
        e.generate(&mut s, prompt, p, &AtomicBool::new(false), &mut |_| {}).expect("generates");
    (out, s.logits().to_vec())
}

/// `p` with and without drafts give the same ids and text, and the same
/// last logits to the bit; returns the drafted output.
fn same(e: &Engine, prompt: &[u32], p: &GenParams) -> Output {
    let (plain, lp) = run_logits(e, prompt, &GenParams { speculate: 0, ..p.clone() });
    let (spec, ls) = run_logits(e, prompt, &GenParams { speculate: 8, ..p.clone() });
    let bits = |l: &[f32]| l.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert!(bits(&ls) == bits(&lp), "last logits differ after {} tokens", spec.ids.len());
    assert_eq!(spec.ids, plain.ids, "drafted {:?}\n  plain {:?}", spec.text, plain.text);
    assert_eq!(spec.text, plain.text);
    assert_eq!(spec.finish, plain.finish);
    assert_eq!((plain.drafted, plain.accepted), (0, 0));
    assert!(spec.accepted <= spec.drafted);
    spec
}

/// Two generations stepping together (one batched pass for both), each
/// `(prompt, params)` in a session of its own: their outputs.
fn together(e: &Engine, runs: [(&[u32], &GenParams); 2]) -> [Output; 2] {
    let (mut sa, mut sb) = (e.session(), e.session());
    let mut ga = e.begin(&mut sa, runs[0].0, runs[0].1).unwrap();
    let mut gb = e.begin(&mut sb, runs[1].0, runs[1].1).unwrap();
    let no = AtomicBool::new(false);
    while !ga.is_done() || !gb.is_done() {
        e.step(&mut [
            Step { session: &mut sa, gen: &mut ga, cancel: &no, on_text: &mut |_| {} },
            Step { session: &mut sb, gen: &mut gb, cancel: &no, on_text: &mut |_| {} },
        ])
        .unwrap();
    }
    [e.end(ga, &mut |_| {}), e.end(gb, &mut |_| {})]
}

/// `first` generated in a session, then in the same session the longer
/// prompt (`first`, its answer, and a user turn saying `user`): that
/// continuation and the longer prompt.
fn continued(e: &Engine, first: &[u32], p: &GenParams, user: &str) -> (Output, Vec<u32>) {
    let mut s = e.session();
    let out = e.generate(&mut s, first, p, &AtomicBool::new(false), &mut |_| {}).unwrap();
    let mut next = first.to_vec();
    next.extend(&out.ids);
    let turn = format!("\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n");
    next.extend(e.tokenize_prompt(&turn, true).unwrap());
    let cont = e.generate(&mut s, &next, p, &AtomicBool::new(false), &mut |_| {}).unwrap();
    (cont, next)
}

#[test]
fn greedy_output_is_the_same_and_drafts_are_confirmed() {
    let Some(e) = engine("speculate greedy") else { return };
    let (mut drafted, mut accepted) = (0, 0);
    for q in QUOTES {
        let out = same(&e, &prompt(&e, q), &GenParams { max_tokens: 64, ..GenParams::default() });
        eprintln!("{}/{} drafts confirmed: {:?}", out.accepted, out.drafted, out.text);
        (drafted, accepted) = (drafted + out.drafted, accepted + out.accepted);
    }
    assert!(accepted * 4 >= drafted && accepted > 20, "{accepted}/{drafted} confirmed");
}

#[test]
fn sampled_output_with_penalties_is_the_same() {
    let Some(e) = engine("speculate sampled") else { return };
    for (i, q) in QUOTES.iter().enumerate() {
        let sampling = Sampling {
            temperature: 0.7,
            repeat_penalty: 1.1,
            presence_penalty: 0.2,
            no_repeat_ngram: 6,
            seed: 11 + i as u64,
            ..Sampling::default()
        };
        same(&e, &prompt(&e, q), &GenParams { max_tokens: 48, sampling, ..GenParams::default() });
    }
}

/// Every limit between 1 and 40 tokens ends where decoding without drafts
/// ends (a limit can fall inside a confirmed run).
#[test]
fn every_length_limit_is_the_same() {
    let Some(e) = engine("speculate limits") else { return };
    let p = prompt(&e, QUOTES[0]);
    for max_tokens in 1..=40 {
        same(&e, &p, &GenParams { max_tokens, ..GenParams::default() });
    }
}

/// The Q4_K_M requantization of the default model (K-quant products whose
/// batched numbers depend on grouping) and gemma3 (sliding-window layers,
/// soft-capped logits): the same at every limit up to 24 tokens.
#[test]
fn other_files_are_the_same() {
    for var in ["AGENTD_TEST_Q4KM", "AGENTD_TEST_GEMMA"] {
        let Some(e) = engine_of(var, "speculate other files") else { continue };
        let mut accepted = 0;
        for q in QUOTES {
            let p = e.tokenize_prompt(q, false).expect("tokenizes");
            for max_tokens in [1, 2, 3, 5, 8, 13, 24] {
                accepted +=
                    same(&e, &p, &GenParams { max_tokens, ..GenParams::default() }).accepted;
            }
        }
        assert!(accepted > 0, "{var}: no draft confirmed");
    }
}

/// Under a constraint that forbids a marker the model is asked to repeat,
/// and under a lazy grammar that the marker engages.
#[test]
fn constrained_output_is_the_same() {
    let Some(e) = engine("speculate constrained") else { return };
    let g = e.grammars().unwrap();
    let m = g.marker("<tool_call>").unwrap();
    let text = "Repeat exactly this text twice: <tool_call>{\"name\": \"search\"}</tool_call>";
    let p = prompt(&e, text);
    let forbid = Constraint::Forbid(vec![m.clone()]);
    same(&e, &p, &GenParams { max_tokens: 48, constraint: Some(forbid), ..GenParams::default() });
    let call = g.compile(r#"start: "<tool_call>" "\n" %json {"type": "object", "properties": {"name": {"const": "search"}}, "required": ["name"]} "\n" "</tool_call>""#).unwrap();
    let lazy = Constraint::Lazy { marker: m, grammar: call };
    same(&e, &p, &GenParams { max_tokens: 64, constraint: Some(lazy), ..GenParams::default() });
}

/// Under a grammar that governs every token (a JSON object whose string
/// quotes the context, as a structured output or a tool call's arguments
/// would): drafts are proposed, checked against the grammar and verified
/// row by row under its masks; the output is the same and drafts are
/// confirmed inside the governed span.
#[test]
fn drafts_under_a_governing_grammar_are_confirmed_and_change_nothing() {
    let Some(e) = engine("speculate grammar") else { return };
    let g = e.grammars().unwrap();
    let schema = r#"start: %json {"type": "object", "properties": {"quote": {"type": "string"}}, "required": ["quote"], "additionalProperties": false}"#;
    let (mut drafted, mut accepted) = (0, 0);
    for q in QUOTES {
        let text = format!("{q}\nReply with JSON: {{\"quote\": \"<the sentence>\"}}");
        let c = Constraint::Grammar(g.compile(schema).unwrap());
        let p = GenParams { max_tokens: 64, constraint: Some(c), ..GenParams::default() };
        let out = same(&e, &prompt(&e, &text), &p);
        eprintln!("{}/{} drafts confirmed: {:?}", out.accepted, out.drafted, out.text);
        assert!(out.text.starts_with('{'), "{:?}", out.text);
        (drafted, accepted) = (drafted + out.drafted, accepted + out.accepted);
    }
    assert!(accepted > 10 && accepted * 4 >= drafted, "{accepted}/{drafted} confirmed");
}

/// A generation with drafts stepping beside another (one batched pass for
/// both) gives what each gives alone.
#[test]
fn batched_with_another_session_is_the_same() {
    let Some(e) = engine("speculate batched") else { return };
    let (pa, pb) = (prompt(&e, QUOTES[0]), prompt(&e, QUOTES[2]));
    let p = GenParams { max_tokens: 40, ..GenParams::default() };
    let alone_a = run(&e, &pa, &GenParams { speculate: 0, ..p.clone() });
    let alone_b = run(&e, &pb, &GenParams { speculate: 0, ..p.clone() });
    let [oa, ob] = together(&e, [(&pa, &p), (&pb, &GenParams { speculate: 0, ..p.clone() })]);
    assert_eq!(oa.ids, alone_a.ids);
    assert_eq!(ob.ids, alone_b.ids);
    assert!(oa.accepted > 0, "{}/{}", oa.accepted, oa.drafted);
}

/// A session continued after a drafted turn (rejected drafts cut from its
/// cache) reuses its cache and answers as a fresh session does.
#[test]
fn a_continued_session_is_the_same_as_a_fresh_one() {
    let Some(e) = engine("speculate continued") else { return };
    let p = GenParams { max_tokens: 32, ..GenParams::default() };
    let (cont, next) = continued(&e, &prompt(&e, QUOTES[1]), &p, "Say it again.");
    // (What a fresh run of the longer prompt computes alike: most of the
    // first prompt, `Session`'s invariant.)
    assert!(cont.reused_tokens > 0, "{} reused", cont.reused_tokens);
    let fresh = run(&e, &next, &GenParams { speculate: 0, ..p });
    assert_eq!(cont.ids, fresh.ids);
}

/// The target of the draft-model tests: the default checkpoint in Q8_0,
/// drafted by the default model itself (Q4_1 of the same weights, the same
/// vocabulary).
fn drafted_engine(test: &str) -> Option<Engine> {
    let mut e = engine_of("AGENTD_TEST_Q8", test)?;
    let draft = common::real_file("AGENTD_TEST_MODEL", test)?;
    e.load_draft(&draft).expect("the draft model loads");
    Some(e)
}

/// With a draft model the drafts are its greedy tokens — on free text too,
/// where prompt lookup finds nothing to quote — and output is still the
/// same as decoding without drafts, greedy and sampled, at every limit.
#[test]
fn a_draft_model_changes_no_output_and_its_drafts_are_confirmed() {
    let Some(e) = drafted_engine("speculate draft model") else { return };
    let free = "Write a short story about a lighthouse keeper and his cat.";
    let (mut drafted, mut accepted) = (0, 0);
    for q in QUOTES.iter().chain([&free]) {
        let out = same(&e, &prompt(&e, q), &GenParams { max_tokens: 64, ..GenParams::default() });
        eprintln!("draft model: {}/{} confirmed: {:?}", out.accepted, out.drafted, out.text);
        (drafted, accepted) = (drafted + out.drafted, accepted + out.accepted);
    }
    assert!(accepted * 2 >= drafted && accepted > 60, "{accepted}/{drafted} confirmed");
    let p = prompt(&e, free);
    for max_tokens in [1, 2, 3, 5, 8, 13] {
        same(&e, &p, &GenParams { max_tokens, ..GenParams::default() });
    }
    let sampling =
        Sampling { temperature: 0.8, repeat_penalty: 1.1, seed: 5, ..Sampling::default() };
    same(&e, &p, &GenParams { max_tokens: 48, sampling, ..GenParams::default() });
}

/// A context longer than the draft model's window (`DRAFT_WINDOW`), a
/// session continued after a drafted turn, and two sessions stepping
/// together (each with its own draft cache) give what plain decoding gives.
#[test]
fn a_draft_model_follows_long_continued_and_batched_sessions() {
    let Some(e) = drafted_engine("speculate draft sessions") else { return };
    let p = GenParams { max_tokens: 32, ..GenParams::default() };
    let mut long = String::new();
    while e.tokenize(&long, false).unwrap().len() < inference::DRAFT_WINDOW + 300 {
        long.push_str(QUOTES[long.len() % 3]);
        long.push('\n');
    }
    same(&e, &prompt(&e, &format!("{long}Quote the first note.")), &p);
    let (cont, next) = continued(&e, &prompt(&e, QUOTES[1]), &p, "Again.");
    assert_eq!(cont.ids, run(&e, &next, &GenParams { speculate: 0, ..p.clone() }).ids);
    let (pa, pb) = (prompt(&e, QUOTES[0]), prompt(&e, QUOTES[2]));
    let alone_a = run(&e, &pa, &GenParams { speculate: 0, ..p.clone() });
    let alone_b = run(&e, &pb, &GenParams { speculate: 0, ..p.clone() });
    let [oa, ob] = together(&e, [(&pa, &p), (&pb, &p)]);
    assert_eq!((oa.ids, ob.ids), (alone_a.ids, alone_b.ids));
    assert!(oa.accepted > 0 && ob.accepted > 0);
}

/// A draft model of another vocabulary is refused, naming the first token
/// that differs.
#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let Some(mut e) = engine("speculate draft vocabulary") else { return };
    let Some(gemma) = common::real_file("AGENTD_TEST_GEMMA", "speculate draft vocabulary") else {
        return;
    };
    let err = e.load_draft(&gemma).expect_err("gemma's vocabulary is not SmolLM2's");
    assert_eq!(err.kind(), inference::ErrorKind::Input);
    assert!(err.to_string().contains("vocabulary"), "{err}");
    assert!(e.draft().is_none());
}
