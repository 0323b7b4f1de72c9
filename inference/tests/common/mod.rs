//! A tiny GGUF written by the tests themselves: a two-layer llama with
//! random weights, a small byte-level vocabulary with merges and control
//! tokens, and a ChatML template. Unit tests need no download.

#![allow(dead_code, unreachable_pub)]

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::path::{Path, PathBuf};

pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's byte → printable char table.
pub fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> =
        (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec![' '; 256];
    for (b, c) in bs.into_iter().zip(cs) {
        table[b as usize] = char::from_u32(c).unwrap();
    }
    table
}

pub struct Tiny {
    pub path: PathBuf,
    pub vocab: usize,
    _dir: tempfile::TempDir,
}

fn rand_tensor(shape: (usize, usize), seed: u64, scale: f32) -> Tensor {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..shape.0 * shape.1)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s % 20001) as f32 / 10000.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn ones(n: usize) -> Tensor {
    Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).unwrap()
}

/// Writes the tiny model. `kquant_layer`: quantize that layer's ffn_down as
/// Q4_K (a type the fast path leaves to candle).
pub fn write_tiny(kquant_layer: Option<usize>) -> Tiny {
    write_tiny_with(kquant_layer, Vec::new())
}

/// The tiny model with metadata entries `md` added or replaced (a shape
/// the engine must refuse, say).
#[allow(dead_code)] // not every test crate writes a variant
pub fn write_tiny_with(kquant_layer: Option<usize>, md: Vec<(String, Value)>) -> Tiny {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_at(&path, kquant_layer, md);
    Tiny { path, vocab: vocab_tokens().0.len(), _dir: dir }
}

fn vocab_tokens() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let bc = byte_chars();
    let mut tokens: Vec<String> =
        vec!["<|endoftext|>".into(), "<|im_start|>".into(), "<|im_end|>".into()];
    let mut types = vec![3, 3, 3];
    for &c in &bc {
        tokens.push(c.to_string());
        types.push(1);
    }
    let sp = bc[b' ' as usize];
    let nl = bc[b'\n' as usize];
    let merges_src: Vec<(String, String)> = vec![
        (format!("{sp}"), "t".into()),
        ("h".into(), "e".into()),
        (format!("{sp}t"), "he".into()),
        ("i".into(), "n".into()),
        ("a".into(), "n".into()),
        (format!("{nl}"), format!("{nl}")),
        ("u".into(), "s".into()),
        ("us".into(), "er".into()),
        ("e".into(), "r".into()),
    ];
    let mut merges = Vec::new();
    for (a, b) in merges_src {
        let m = format!("{a}{b}");
        if !tokens.contains(&m) {
            tokens.push(m);
            types.push(1);
        }
        merges.push(format!("{a} {b}"));
    }
    // Pad to a multiple of 4 rows.
    while !tokens.len().is_multiple_of(4) {
        tokens.push(format!("<pad{}>", tokens.len()));
        types.push(5);
    }
    (tokens, types, merges)
}

fn write_at(path: &Path, kquant_layer: Option<usize>, extra: Vec<(String, Value)>) {
    let (tokens, types, merges) = vocab_tokens();
    let (d, ff, layers, heads, kv) = (128usize, 256usize, 2usize, 2usize, 1usize);
    let hd = d / heads;
    let vocab = tokens.len();
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String("llama".into())),
        ("general.name".into(), Value::String("tiny-test".into())),
        ("llama.block_count".into(), Value::U32(layers as u32)),
        ("llama.context_length".into(), Value::U32(512)),
        ("llama.embedding_length".into(), Value::U32(d as u32)),
        ("llama.feed_forward_length".into(), Value::U32(ff as u32)),
        ("llama.attention.head_count".into(), Value::U32(heads as u32)),
        ("llama.attention.head_count_kv".into(), Value::U32(kv as u32)),
        ("llama.rope.freq_base".into(), Value::F32(10000.0)),
        ("llama.rope.dimension_count".into(), Value::U32(hd as u32)),
        ("llama.attention.layer_norm_rms_epsilon".into(), Value::F32(1e-5)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("smollm".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.iter().map(|t| Value::String(t.clone())).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(merges.iter().map(|m| Value::String(m.clone())).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        ("tokenizer.chat_template".into(), Value::String(CHATML.into())),
    ];
    for (k, v) in extra {
        md.retain(|(m, _)| *m != k);
        md.push((k, v));
    }
    md.sort_by(|a, b| a.0.cmp(&b.0));
    let mut ts: Vec<(String, QTensor)> = Vec::new();
    let q = |t: &Tensor, ty| QTensor::quantize(t, ty).unwrap();
    ts.push(("token_embd.weight".into(), q(&rand_tensor((vocab, d), 1, 1.0), GgmlDType::Q8_0)));
    ts.push(("output_norm.weight".into(), q(&ones(d), GgmlDType::F32)));
    for l in 0..layers {
        let s = 100 * (l as u64 + 1);
        let n = |x: &str| format!("blk.{l}.{x}");
        ts.push((n("attn_norm.weight"), q(&ones(d), GgmlDType::F32)));
        ts.push((n("ffn_norm.weight"), q(&ones(d), GgmlDType::F32)));
        ts.push((n("attn_q.weight"), q(&rand_tensor((d, d), s + 1, 0.2), GgmlDType::Q4_1)));
        ts.push((n("attn_k.weight"), q(&rand_tensor((kv * hd, d), s + 2, 0.2), GgmlDType::Q4_1)));
        ts.push((n("attn_v.weight"), q(&rand_tensor((kv * hd, d), s + 3, 0.2), GgmlDType::Q4_1)));
        ts.push((n("attn_output.weight"), q(&rand_tensor((d, d), s + 4, 0.2), GgmlDType::Q8_0)));
        ts.push((n("ffn_gate.weight"), q(&rand_tensor((ff, d), s + 5, 0.2), GgmlDType::Q4_1)));
        ts.push((n("ffn_up.weight"), q(&rand_tensor((ff, d), s + 6, 0.2), GgmlDType::Q4_1)));
        let down_ty = if kquant_layer == Some(l) { GgmlDType::Q4K } else { GgmlDType::Q4_1 };
        ts.push((n("ffn_down.weight"), q(&rand_tensor((d, ff), s + 7, 0.2), down_ty)));
    }
    let mdr: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tsr: Vec<(&str, &QTensor)> = ts.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &mdr, &tsr).unwrap();
}

/// A tiny qwen3moe (2 layers of 32 experts, 2 used, n_embd 256): qwen3's
/// q/k norms, an f32 router, Q4_K gate/up experts and Q6_K down experts
/// (whose numbers depend on their batch, `moe.rs`: few rows of a short
/// batch reach an expert, many of a long one), with metadata `md`
/// added or replaced (`Value::U32(0)` for a key to drop).
#[allow(dead_code)] // not every test crate writes one
pub fn write_tiny_moe(md: Vec<(String, Value)>) -> Tiny {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-moe.gguf");
    let (tokens, types, merges) = vocab_tokens();
    let (d, layers, heads, kv, hd, experts, used, ff) = (256usize, 2, 2, 1, 128, 32, 2, 256);
    let vocab = tokens.len();
    let a = |k: &str| format!("qwen3moe.{k}");
    let mut all: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String("qwen3moe".into())),
        (a("block_count"), Value::U32(layers as u32)),
        (a("context_length"), Value::U32(2048)),
        (a("embedding_length"), Value::U32(d as u32)),
        (a("feed_forward_length"), Value::U32((used * ff) as u32)),
        (a("expert_feed_forward_length"), Value::U32(ff as u32)),
        (a("expert_count"), Value::U32(experts as u32)),
        (a("expert_used_count"), Value::U32(used as u32)),
        (a("attention.head_count"), Value::U32(heads as u32)),
        (a("attention.head_count_kv"), Value::U32(kv as u32)),
        (a("attention.key_length"), Value::U32(hd as u32)),
        (a("attention.value_length"), Value::U32(hd as u32)),
        (a("rope.freq_base"), Value::F32(1_000_000.0)),
        (a("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("smollm".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.iter().map(|t| Value::String(t.clone())).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(merges.iter().map(|m| Value::String(m.clone())).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
    ];
    for (k, v) in md {
        all.retain(|(m, _)| *m != k);
        if !matches!(v, Value::U32(0)) {
            all.push((k, v));
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let mut ts: Vec<(String, QTensor)> = Vec::new();
    let q = |t: &Tensor, ty| QTensor::quantize(t, ty).unwrap();
    // Experts `[experts × rows × cols]`, each a random matrix of its own.
    let stack = |rows: usize, cols: usize, seed: u64, scale: f32| {
        let parts: Vec<Tensor> =
            (0..experts).map(|e| rand_tensor((rows, cols), seed + 7 * e as u64, scale)).collect();
        Tensor::stack(&parts, 0).unwrap()
    };
    ts.push(("token_embd.weight".into(), q(&rand_tensor((vocab, d), 1, 1.0), GgmlDType::Q8_0)));
    ts.push(("output_norm.weight".into(), q(&ones(d), GgmlDType::F32)));
    for l in 0..layers {
        let s = 1000 * (l as u64 + 1);
        let n = |x: &str| format!("blk.{l}.{x}");
        ts.push((n("attn_norm.weight"), q(&ones(d), GgmlDType::F32)));
        ts.push((n("ffn_norm.weight"), q(&ones(d), GgmlDType::F32)));
        ts.push((n("attn_q_norm.weight"), q(&ones(hd), GgmlDType::F32)));
        ts.push((n("attn_k_norm.weight"), q(&ones(hd), GgmlDType::F32)));
        ts.push((
            n("attn_q.weight"),
            q(&rand_tensor((heads * hd, d), s + 1, 0.2), GgmlDType::Q8_0),
        ));
        ts.push((n("attn_k.weight"), q(&rand_tensor((kv * hd, d), s + 2, 0.2), GgmlDType::Q8_0)));
        ts.push((n("attn_v.weight"), q(&rand_tensor((kv * hd, d), s + 3, 0.2), GgmlDType::Q8_0)));
        ts.push((
            n("attn_output.weight"),
            q(&rand_tensor((d, heads * hd), s + 4, 0.2), GgmlDType::Q8_0),
        ));
        ts.push((
            n("ffn_gate_inp.weight"),
            q(&rand_tensor((experts, d), s + 5, 0.5), GgmlDType::F32),
        ));
        ts.push((n("ffn_gate_exps.weight"), q(&stack(ff, d, s + 100, 0.2), GgmlDType::Q4K)));
        ts.push((n("ffn_up_exps.weight"), q(&stack(ff, d, s + 300, 0.2), GgmlDType::Q4K)));
        ts.push((n("ffn_down_exps.weight"), q(&stack(d, ff, s + 500, 0.2), GgmlDType::Q6K)));
    }
    let mdr: Vec<(&str, &Value)> = all.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tsr: Vec<(&str, &QTensor)> = ts.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut f, &mdr, &tsr).unwrap();
    Tiny { path, vocab, _dir: dir }
}

/// The real model file environment variable `var` names (the test command
/// sets it), or `None` when it is unset: `test` then says it skips, and
/// fails instead under `AGENTD_TEST_STRICT=1`.
pub fn real_file(var: &str, test: &str) -> Option<PathBuf> {
    let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) else {
        assert!(
            std::env::var("AGENTD_TEST_STRICT").as_deref() != Ok("1"),
            "{test}: {var} is not set and AGENTD_TEST_STRICT=1 (run ./test.sh)"
        );
        eprintln!("SKIPPED {test}: {var} is not set (./test.sh sets it)");
        return None;
    };
    let p = PathBuf::from(p);
    assert!(p.is_file(), "{var}={} is not a file", p.display());
    Some(p)
}

/// The lines of the JSON-lines fixture `name` in `tests/data/reference/`
/// (its README says how each was made).
pub fn reference_lines(name: &str) -> Vec<serde_json::Value> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference").join(name);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
        .collect()
}

/// A fixture's array of token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}
