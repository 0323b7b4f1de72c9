//! The candle path: the code `--device cuda[:N]` and `--device metal` run,
//! exercised on candle's CPU backend (`--device candle-cpu`) because this
//! machine has no GPU. What differs on a GPU is only the `candle_core::Device`
//! the weights and activations live on.

mod common;

use candle_core::Tensor;
use inference::{Device, Engine, EngineOptions, ErrorKind, GenParams};
use std::sync::atomic::AtomicBool;

fn candle_engine(t: &common::Tiny) -> Engine {
    Engine::load(&t.path, &EngineOptions { device: Device::CandleCpu, ..Default::default() })
        .expect("tiny model loads on the candle path")
}

fn gen(e: &Engine, s: &mut inference::Session, prompt: &[u32], n: usize) -> inference::Output {
    let p = GenParams { max_tokens: n, stop_tokens: vec![], ..GenParams::default() };
    e.generate(s, prompt, &p, &AtomicBool::new(false), &mut |_| {}).expect("generates")
}

/// Greedy decoding written out by hand on candle's `quantized_llama`.
fn by_hand(t: &common::Tiny, prompt: &[u32], n: usize, stops: &[u32]) -> Vec<u32> {
    let dev = candle_core::Device::Cpu;
    let mut f = std::fs::File::open(&t.path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let mut m = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        content, &mut f, &dev,
    )
    .unwrap();
    let (mut out, mut pos, mut input) = (Vec::new(), 0, prompt.to_vec());
    while out.len() < n {
        let x = Tensor::new(input.as_slice(), &dev).unwrap().unsqueeze(0).unwrap();
        let logits: Vec<f32> = m.forward(&x, pos).unwrap().squeeze(0).unwrap().to_vec1().unwrap();
        pos += input.len();
        let id = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32;
        out.push(id);
        if stops.contains(&id) {
            break;
        }
        input = vec![id];
    }
    out
}

#[test]
fn the_engine_on_candle_decodes_exactly_as_candle_itself() {
    let t = common::write_tiny(None);
    let e = candle_engine(&t);
    assert!(e.info().weight_bytes > 0);
    let prompt = e.tokenize("the user hi there in an answer", false).unwrap();
    let mut s = e.session();
    let out = gen(&e, &mut s, &prompt, 12);
    assert_eq!(out.ids, by_hand(&t, &prompt, 12, &e.info().stop_tokens));
}

/// A session that extends its own cached tokens continues; one whose cache
/// another session took in between is replayed from position 0. Either way
/// the output equals a cold run.
#[test]
fn candle_sessions_reuse_their_prefix_and_survive_each_other() {
    let t = common::write_tiny(None);
    let e = candle_engine(&t);
    let a1 = e.tokenize("the user hi there", false).unwrap();
    let b1 = e.tokenize("an answer the user", false).unwrap();
    let (mut sa, mut sb) = (e.session(), e.session());
    let first = gen(&e, &mut sa, &a1, 5);
    let mut a2 = a1.clone();
    a2.extend(&first.ids);
    a2.extend(e.tokenize(" and then", false).unwrap());
    // Straight continuation: reused.
    let cont = gen(&e, &mut sa, &a2, 6);
    assert_eq!(cont.reused_tokens, a1.len() + first.ids.len());
    let cold = gen(&e, &mut e.session(), &a2, 6);
    assert_eq!(cont.ids, cold.ids);
    // Interleaved: b takes the cache, a comes back.
    gen(&e, &mut sb, &b1, 4);
    let mut a3 = a2.clone();
    a3.extend(&cont.ids);
    a3.extend(e.tokenize(" the", false).unwrap());
    let back = gen(&e, &mut sa, &a3, 6);
    let cold = gen(&e, &mut e.session(), &a3, 6);
    assert_eq!(back.ids, cold.ids);
    // A prompt that diverges from the cache starts over.
    let diverged = gen(&e, &mut sa, &b1, 4);
    assert_eq!(diverged.reused_tokens, 0);
    assert_eq!(diverged.ids, gen(&e, &mut e.session(), &b1, 4).ids);
}

#[test]
fn a_gpu_device_missing_from_the_build_is_a_clear_device_error() {
    let t = common::write_tiny(None);
    for (d, feature, built) in [
        (Device::Cuda(0), "cuda", cfg!(feature = "cuda")),
        (Device::Metal, "metal", cfg!(feature = "metal")),
    ] {
        if built {
            continue;
        }
        let e = Engine::load(&t.path, &EngineOptions { device: d, ..Default::default() })
            .expect_err("no such backend in this build");
        assert_eq!(e.kind(), ErrorKind::Device);
        assert!(e.to_string().contains(&format!("--features {feature}")), "{e}");
    }
    assert_eq!("candle-cpu".parse::<Device>().unwrap(), Device::CandleCpu);
    assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::Cuda(1));
    let bad = "tpu".parse::<Device>().unwrap_err();
    assert!(bad.to_string().contains("candle-cpu"), "{bad}");
}
