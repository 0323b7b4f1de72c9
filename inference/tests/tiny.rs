//! The engine on a tiny GGUF the test writes itself (no download): loading,
//! tokenizer round trips, generation controls, cancellation, prefix-reuse
//! exactness, and our forward pass against candle's `quantized_llama`.

mod common;

use inference::{Engine, EngineOptions, ErrorKind, Finish, GenParams, Sampling};
use std::sync::atomic::{AtomicBool, Ordering};

fn engine(kq: Option<usize>, threads: usize) -> (common::Tiny, Engine) {
    let t = common::write_tiny(kq);
    let e = Engine::load(&t.path, &EngineOptions { threads: Some(threads), ..Default::default() })
        .expect("tiny model loads");
    (t, e)
}

fn go(e: &Engine, prompt: &[u32], p: &GenParams) -> inference::Output {
    let mut s = e.session();
    e.generate(&mut s, prompt, p, &AtomicBool::new(false), &mut |_| {}).expect("generates")
}

#[test]
fn loads_and_reports_its_shape() {
    let (t, e) = engine(None, 1);
    let info = e.info();
    assert_eq!(info.config.n_layer, 2);
    assert_eq!(info.config.n_vocab, t.vocab);
    assert!(info.chat_template.as_deref().is_some_and(|c| c.contains("im_start")));
    assert!(info.stop_tokens.contains(&2));
}

// See: issue 12. A head size above the attention kernels' MAX_HEAD (256)
// reached an assert on the first forward pass; it is refused at load.
#[test]
fn a_head_size_above_the_kernels_limit_is_refused_at_load() {
    use candle_core::quantized::gguf_file::Value;
    let t = common::write_tiny_with(
        None,
        vec![
            ("llama.attention.key_length".into(), Value::U32(512)),
            ("llama.rope.dimension_count".into(), Value::U32(512)),
        ],
    );
    let e = Engine::load(&t.path, &EngineOptions { threads: Some(1), ..Default::default() })
        .expect_err("a head size of 512 is refused");
    assert_eq!(e.kind(), ErrorKind::Model);
    assert!(e.to_string().contains("head size 512 (at most 256)"), "{e}");
}

#[test]
fn tokenizer_round_trips_and_parses_control_tokens_only_when_asked() {
    let (_t, e) = engine(None, 1);
    for text in ["hello there user", "Zürich 12345 ✓\n\n", "", "  spaces  "] {
        let ids = e.tokenize(text, false).unwrap();
        assert_eq!(e.tokenizer().decode(&ids), text);
    }
    assert_eq!(e.tokenize("<|im_start|>", true).unwrap(), vec![1]);
    assert!(e.tokenize("<|im_start|>", false).unwrap().len() > 1);
    // Digits are split one by one (the `smollm` pre-tokenizer).
    assert_eq!(e.tokenize("123", false).unwrap().len(), 3);
}

#[test]
fn greedy_is_deterministic_and_seeded_sampling_repeats() {
    let (_t, e) = engine(None, 2);
    let prompt =
        e.tokenize("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", true).unwrap();
    let p = GenParams { max_tokens: 24, ..GenParams::default() };
    assert_eq!(go(&e, &prompt, &p).ids, go(&e, &prompt, &p).ids);
    let s = |seed| GenParams {
        max_tokens: 24,
        sampling: Sampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..Sampling::default()
        },
        ..GenParams::default()
    };
    assert_eq!(go(&e, &prompt, &s(7)).ids, go(&e, &prompt, &s(7)).ids);
    assert_ne!(go(&e, &prompt, &s(7)).ids, go(&e, &prompt, &s(8)).ids);
}

#[test]
fn limits_bans_and_stops_are_obeyed() {
    let (_t, e) = engine(None, 1);
    let prompt = e.tokenize("the user", false).unwrap();
    let out =
        go(&e, &prompt, &GenParams { max_tokens: 5, stop_tokens: vec![], ..GenParams::default() });
    assert!(out.ids.len() <= 5);
    let free = go(&e, &prompt, &GenParams { max_tokens: 20, ..GenParams::default() });
    let banned: Vec<u32> = free.ids.iter().copied().take(3).collect();
    let out = go(
        &e,
        &prompt,
        &GenParams { max_tokens: 20, forbid: banned.clone(), ..GenParams::default() },
    );
    assert!(
        out.ids.iter().all(|i| !banned.contains(i)),
        "{:?} contains one of {banned:?}",
        out.ids
    );
    // A stop string cuts the text before it.
    if free.text.chars().count() > 4 {
        let stop: String = free.text.chars().skip(2).take(2).collect();
        let out = go(
            &e,
            &prompt,
            &GenParams { max_tokens: 20, stop_strings: vec![stop.clone()], ..GenParams::default() },
        );
        assert_eq!(out.finish, Finish::Stop);
        assert!(!out.text.contains(&stop));
        assert!(free.text.starts_with(&out.text));
    }
}

/// Whether `ids` hold some n-gram twice.
fn repeats(ids: &[u32], n: usize) -> bool {
    let grams: Vec<_> = ids.windows(n).collect();
    grams.iter().collect::<std::collections::HashSet<_>>().len() < grams.len()
}

#[test]
fn no_repeat_ngram_keeps_every_ngram_of_the_output_unique() {
    let (_t, e) = engine(None, 1);
    let prompt =
        e.tokenize("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", true).unwrap();
    let p = |n| GenParams {
        max_tokens: 64,
        stop_tokens: vec![],
        sampling: Sampling { no_repeat_ngram: n, ..Sampling::default() },
        ..GenParams::default()
    };
    // Greedy, the random tiny model loops.
    let free = go(&e, &prompt, &p(0));
    assert!(repeats(&free.ids, 3), "{:?}", free.ids);
    let out = go(&e, &prompt, &p(3));
    assert!(out.ids.len() > 8, "{:?}", out.ids);
    assert!(!repeats(&out.ids, 3), "{:?}", out.ids);
    // Up to the first repeat the two are the same tokens.
    let first = (3..=free.ids.len()).find(|&k| repeats(&free.ids[..k], 3)).unwrap();
    assert_eq!(out.ids[..first - 1], free.ids[..first - 1]);
}

#[test]
fn a_prompt_beyond_the_context_names_both_sizes() {
    let t = common::write_tiny(None);
    let e = Engine::load(
        &t.path,
        &EngineOptions { threads: Some(1), context: Some(64), ..Default::default() },
    )
    .unwrap();
    let prompt = vec![100u32; 80];
    let err = e
        .generate(
            &mut e.session(),
            &prompt,
            &GenParams::default(),
            &AtomicBool::new(false),
            &mut |_| {},
        )
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Input);
    let msg = err.to_string();
    assert!(msg.contains("80") && msg.contains("64"), "{msg}");
}

#[test]
fn cancellation_stops_generation() {
    let (_t, e) = engine(None, 1);
    let cancel = AtomicBool::new(false);
    let prompt = e.tokenize("the user", false).unwrap();
    let mut n = 0;
    let mut s = e.session();
    let out = e
        .generate(
            &mut s,
            &prompt,
            &GenParams { max_tokens: 200, stop_tokens: vec![], ..GenParams::default() },
            &cancel,
            &mut |_| {
                n += 1;
                if n == 3 {
                    cancel.store(true, Ordering::Relaxed);
                }
            },
        )
        .unwrap();
    assert_eq!(out.finish, Finish::Cancelled);
    assert!(out.ids.len() < 200);
}

#[test]
fn reusing_a_cached_prefix_gives_the_same_greedy_output() {
    let (_t, e) = engine(None, 2);
    let turn1 =
        e.tokenize("<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", true).unwrap();
    let p = GenParams { max_tokens: 16, chunk: 5, ..GenParams::default() };
    let mut s = e.session();
    let first = e.generate(&mut s, &turn1, &p, &AtomicBool::new(false), &mut |_| {}).unwrap();
    let mut turn2 = turn1.clone();
    turn2.extend(first.ids.iter().copied().filter(|&i| i != 2));
    turn2.extend(
        e.tokenize(
            "<|im_end|>\n<|im_start|>user\nand then?<|im_end|>\n<|im_start|>assistant\n",
            true,
        )
        .unwrap(),
    );
    let reused = e.generate(&mut s, &turn2, &p, &AtomicBool::new(false), &mut |_| {}).unwrap();
    assert!(reused.reused_tokens > 0, "nothing was reused");
    let cold = go(&e, &turn2, &GenParams { chunk: 512, ..p.clone() });
    assert_eq!(reused.ids, cold.ids);
    assert_eq!(reused.text, cold.text);
}

#[test]
fn threads_and_chunking_do_not_change_numbers() {
    let (_t, e1) = engine(None, 1);
    let (_t2, e2) = engine(None, 2);
    let prompt = e1.tokenize("the user hi there in an answer", false).unwrap();
    let a = go(&e1, &prompt, &GenParams { max_tokens: 12, chunk: 512, ..GenParams::default() });
    let b = go(&e2, &prompt, &GenParams { max_tokens: 12, chunk: 3, ..GenParams::default() });
    assert_eq!(a.ids, b.ids);
}

/// Our forward pass against candle's reference `quantized_llama` on the same
/// file: the last-token logits agree closely (both quantize activations, in
/// different ways, so not bit for bit).
#[test]
fn forward_pass_agrees_with_candle_quantized_llama() {
    for kq in [None, Some(1)] {
        let (t, e) = engine(kq, 1);
        let prompt = e.tokenize("the user hi there", false).unwrap();
        let mut s = e.session();
        e.eval(&mut s, &prompt).unwrap();
        let ours = s.logits().to_vec();
        let mut f = std::fs::File::open(&t.path).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
        let mut m = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
            content,
            &mut f,
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let input = candle_core::Tensor::new(prompt.as_slice(), &candle_core::Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let theirs: Vec<f32> = m.forward(&input, 0).unwrap().squeeze(0).unwrap().to_vec1().unwrap();
        assert_eq!(ours.len(), theirs.len());
        let scale = theirs.iter().map(|v| v.abs()).fold(0f32, f32::max);
        let worst = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 0.05 * scale, "kq={kq:?}: max |diff| {worst} vs logit scale {scale}");
        let argmax =
            |v: &[f32]| v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|x| x.0);
        assert_eq!(argmax(&ours), argmax(&theirs), "kq={kq:?}");
    }
}

/// Prompts of 64 tokens or more take llama.cpp's tiled attention path (and
/// past 512 tokens, physical batches of 512): chunking never changes the
/// numbers, and a session reuses exactly the cached positions that a fresh
/// run of the new prompt computes by the same path, with the same output.
#[test]
fn long_prompts_chunk_and_reuse_exactly() {
    let t = common::write_tiny(None);
    let e = Engine::load(
        &t.path,
        &EngineOptions { threads: Some(2), context: Some(1200), ..Default::default() },
    )
    .unwrap();
    let words = |n: usize, seed: usize| -> Vec<u32> {
        let text: String = (0..n)
            .map(|i| ["the ", "user ", "hi ", "there ", "answer "][(i * 7 + seed) % 5])
            .collect();
        let ids = e.tokenize(&text, false).unwrap();
        assert!(ids.len() >= n / 2, "{} tokens", ids.len());
        ids
    };
    let p = |chunk| GenParams { max_tokens: 6, stop_tokens: vec![], chunk, ..GenParams::default() };
    let cancel = AtomicBool::new(false);
    // 150 tokens: chunked or not, the same output.
    let a: Vec<u32> = words(400, 1).into_iter().take(150).collect();
    assert_eq!(go(&e, &a, &p(512)).ids, go(&e, &a, &p(7)).ids);
    // Continuing a tiled prompt reuses it, not its decoded tokens.
    let mut s = e.session();
    let first = e.generate(&mut s, &a, &p(64), &cancel, &mut |_| {}).unwrap();
    let mut b = a.clone();
    b.extend(&first.ids);
    b.extend(words(40, 2));
    let again = e.generate(&mut s, &b, &p(64), &cancel, &mut |_| {}).unwrap();
    assert_eq!(again.reused_tokens, a.len());
    assert_eq!(again.ids, go(&e, &b, &p(512)).ids);
    // 530 tokens: a batch of 512, then 18 by the one-query path, as
    // decoding; growing that tail below 64 reuses everything cached, past 64
    // it is redone (tiled), the first 512 stay.
    let c: Vec<u32> = words(1400, 3).into_iter().take(530).collect();
    assert_eq!(go(&e, &c, &p(512)).ids, go(&e, &c, &p(100)).ids);
    let mut s = e.session();
    let first = e.generate(&mut s, &c, &p(512), &cancel, &mut |_| {}).unwrap();
    let mut d = c.clone();
    d.extend(&first.ids);
    d.extend(words(10, 4).into_iter().take(5));
    let cached = s.cached().len();
    let more = e.generate(&mut s, &d, &p(512), &cancel, &mut |_| {}).unwrap();
    assert!(d.len() < 512 + 64);
    assert_eq!(more.reused_tokens, cached);
    assert_eq!(more.ids, go(&e, &d, &p(512)).ids);
    let mut f = d.clone();
    f.extend(&more.ids);
    f.extend(words(200, 5).into_iter().take(80));
    let last = e.generate(&mut s, &f, &p(30), &cancel, &mut |_| {}).unwrap();
    assert_eq!(last.reused_tokens, 512);
    assert_eq!(last.ids, go(&e, &f, &p(512)).ids);
}

/// Several generations stepped together (one batched pass per token) give
/// each the tokens it gets alone, whatever their lengths, stops and
/// sampling, and one that is cancelled or finishes early leaves the rest
/// untouched.
#[test]
fn batched_steps_give_each_generation_its_solo_output() {
    use inference::Step;
    let (_t, e) = engine(None, 2);
    // The last prompt is long enough for the tiled attention path and is
    // prefilled in chunks of 40 while the others already decode: rows of
    // both paths share passes.
    let long = "the user hi there answer ".repeat(30);
    let prompts: Vec<Vec<u32>> =
        ["the user hi", "hi there in an answer the user", "answer", "there", long.as_str()]
            .iter()
            .map(|p| e.tokenize(p, false).unwrap())
            .collect();
    assert!(prompts[4].len() > 100);
    let params: Vec<GenParams> = (0..5)
        .map(|k| GenParams {
            max_tokens: [20, 7, 15, 11, 12][k],
            chunk: if k == 4 { 40 } else { 128 },
            stop_tokens: vec![],
            sampling: Sampling {
                temperature: if k == 2 { 0.8 } else { 0.0 },
                seed: 7,
                ..Sampling::default()
            },
            ..GenParams::default()
        })
        .collect();
    let solo: Vec<inference::Output> =
        prompts.iter().zip(&params).map(|(p, g)| go(&e, p, g)).collect();
    let mut sessions: Vec<_> = (0..5).map(|_| e.session()).collect();
    let cancels: Vec<AtomicBool> = (0..5).map(|_| AtomicBool::new(false)).collect();
    let mut gens: Vec<_> = sessions
        .iter_mut()
        .zip(&prompts)
        .zip(&params)
        .map(|((s, p), g)| e.begin(s, p, g).unwrap())
        .collect();
    let mut texts = vec![String::new(); 5];
    let mut steps = 0;
    while gens.iter().any(|g| !g.is_done()) {
        steps += 1;
        if steps == 4 {
            cancels[3].store(true, Ordering::Relaxed);
        }
        let mut sinks: Vec<_> = texts.iter_mut().map(|t| move |d: &str| t.push_str(d)).collect();
        let mut items: Vec<Step<'_>> = sessions
            .iter_mut()
            .zip(gens.iter_mut())
            .zip(&cancels)
            .zip(sinks.iter_mut())
            .map(|(((session, gen), cancel), on_text)| Step {
                session,
                gen,
                cancel,
                on_text: on_text as &mut dyn FnMut(&str),
            })
            .collect();
        e.step(&mut items).unwrap();
    }
    let outs: Vec<_> = gens
        .into_iter()
        .zip(texts.iter_mut())
        .map(|(g, t)| e.end(g, &mut |d| t.push_str(d)))
        .collect();
    for k in [0, 1, 2, 4] {
        assert_eq!(outs[k].ids, solo[k].ids, "generation {k}");
        assert_eq!(outs[k].text, solo[k].text, "generation {k}");
        assert_eq!(texts[k], solo[k].text, "generation {k}");
        assert_eq!(outs[k].finish, solo[k].finish, "generation {k}");
    }
    assert_eq!(outs[3].finish, Finish::Cancelled);
    // Cancelled after its prompt step and two tokens: those are its solo ones.
    assert_eq!(outs[3].ids[..], solo[3].ids[..2]);
}
