//! The engine on a tiny qwen3moe the test writes itself (`common::write_tiny_moe`):
//! its expert counts are checked at load, and its Q6_K down experts — whose numbers
//! depend on how many rows of a physical batch chose them (`moe.rs`) — give the same
//! logits whether a prompt runs cold, after a cached prefix, or stepped beside
//! another generation. Agreement with llama.cpp is `families.rs`'s.

mod common;

use candle_core::quantized::gguf_file::Value;
use inference::{Engine, EngineOptions, ErrorKind, GenParams, Step};
use std::sync::atomic::AtomicBool;

fn load(t: &common::Tiny) -> Engine {
    let o = EngineOptions { threads: Some(2), context: Some(2048), ..Default::default() };
    Engine::load(&t.path, &o).expect("the tiny qwen3moe loads")
}

/// Prompt ids over the ordinary byte tokens.
fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 3 + (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 7) % 250)
        .collect()
}

/// The logits after `p` (one token generated), in `s`.
fn logits(e: &Engine, s: &mut inference::Session, p: &[u32]) -> (Vec<u32>, usize) {
    let params = GenParams { max_tokens: 1, ..GenParams::default() };
    let out = e.generate(s, p, &params, &AtomicBool::new(false), &mut |_| {}).expect("runs");
    (s.logits().iter().map(|v| v.to_bits()).collect(), out.reused_tokens)
}

#[test]
fn expert_counts_are_checked_at_load_naming_the_key() {
    let cases = [
        (vec![("qwen3moe.expert_count".to_owned(), Value::U32(0))], "qwen3moe.expert_count"),
        (
            vec![("qwen3moe.expert_used_count".to_owned(), Value::U32(33))],
            "qwen3moe.expert_used_count",
        ),
        (
            vec![("qwen3moe.expert_feed_forward_length".to_owned(), Value::U32(128))],
            "blk.0.ffn_gate_exps.weight",
        ),
    ];
    for (md, what) in cases {
        let t = common::write_tiny_moe(md);
        let o = EngineOptions { threads: Some(1), ..Default::default() };
        let e = Engine::load(&t.path, &o).expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::Model);
        assert!(e.to_string().contains(what), "{what}: {e}");
    }
}

#[test]
fn loads_and_counts_every_expert() {
    let t = common::write_tiny_moe(Vec::new());
    let e = load(&t);
    assert_eq!(e.info().config.arch_name, "qwen3moe");
    // Q4_K gate and up (144 bytes per 256 values), Q6_K down (210): 32
    // experts of 256 × 256 each, in both layers.
    let experts = 2 * 32 * 256 * (144 + 144 + 210);
    assert!(e.info().weight_bytes > experts, "{} ≤ {experts}", e.info().weight_bytes);
}

/// A prompt that a cached prefix ends inside a physical batch of (0..512,
/// 512..600) is recomputed from that batch's start, so its logits are a
/// cold run's bit for bit (a prefix of 100 ran as a batch of its own, whose
/// experts saw too few rows for ggml's tiled kernel); a prefix of whole
/// batches is reused. The reused count is checked as well as the logits:
/// the two kernels part in the last bits, which the f16 KV cache may round
/// away before they reach the last position.
#[test]
fn a_cached_prefix_gives_a_cold_runs_logits() {
    let t = common::write_tiny_moe(Vec::new());
    let e = load(&t);
    let full = prompt(600, 1);
    let (cold, _) = logits(&e, &mut e.session(), &full);
    for cut in [550usize, 100, 512] {
        let mut s = e.session();
        logits(&e, &mut s, &full[..cut]);
        let (warm, reused) = logits(&e, &mut s, &full);
        assert_eq!(warm, cold, "after a cached prefix of {cut}");
        let want = if cut >= 512 { 512 } else { 0 };
        assert_eq!(reused, want, "reused after a cached prefix of {cut}");
    }
}

/// Two prompts stepped together (one pass per step) give the logits each
/// gives alone.
#[test]
fn generations_stepped_together_equal_each_alone() {
    let t = common::write_tiny_moe(Vec::new());
    let e = load(&t);
    let (a, b) = (prompt(700, 2), prompt(90, 3));
    let (la, _) = logits(&e, &mut e.session(), &a);
    let (lb, _) = logits(&e, &mut e.session(), &b);
    let params = GenParams { max_tokens: 1, ..GenParams::default() };
    let (mut sa, mut sb) = (e.session(), e.session());
    let mut ga = e.begin(&mut sa, &a, &params).unwrap();
    let mut gb = e.begin(&mut sb, &b, &params).unwrap();
    let no = AtomicBool::new(false);
    let (mut fa, mut fb) = (|_: &str| {}, |_: &str| {});
    while !(ga.is_done() && gb.is_done()) {
        let mut items = [
            Step { session: &mut sa, gen: &mut ga, cancel: &no, on_text: &mut fa },
            Step { session: &mut sb, gen: &mut gb, cancel: &no, on_text: &mut fb },
        ];
        e.step(&mut items).unwrap();
    }
    let bits = |s: &inference::Session| s.logits().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&sa), la);
    assert_eq!(bits(&sb), lb);
}
