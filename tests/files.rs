//! Model files the engine cannot compute as llama.cpp does are refused at
//! load — `agentd` exits 1 with a message naming the architecture, the RoPE
//! scaling type or the tensor, and never panics — while the same file
//! without the offending part loads, generates, and is reported by `agentd
//! models` and `agentd bench --json` with its architecture and RoPE scaling.
//!
//! The files are tiny GGUFs written here (one llama layer of 32 values, a
//! byte-level vocabulary, seeded F32 weights), so the test needs nothing
//! from outside.

use agentd_tests::Home;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

/// A GGUF metadata value.
enum Kv {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

/// A GGUF v3 file: metadata, then F32 tensors (`dims` innermost first).
struct Gguf {
    kv: Vec<(String, Kv)>,
    tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

impl Gguf {
    fn kv(&mut self, k: &str, v: Kv) {
        self.kv.retain(|(name, _)| name != k);
        self.kv.push((k.to_owned(), v));
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut b, k);
            match v {
                Kv::U32(x) => {
                    b.extend(4u32.to_le_bytes());
                    b.extend(x.to_le_bytes());
                }
                Kv::F32(x) => {
                    b.extend(6u32.to_le_bytes());
                    b.extend(x.to_le_bytes());
                }
                Kv::Bool(x) => {
                    b.extend(7u32.to_le_bytes());
                    b.push(u8::from(*x));
                }
                Kv::Str(s) => {
                    b.extend(8u32.to_le_bytes());
                    put_str(&mut b, s);
                }
                Kv::Strs(a) => {
                    b.extend(9u32.to_le_bytes());
                    b.extend(8u32.to_le_bytes());
                    b.extend((a.len() as u64).to_le_bytes());
                    a.iter().for_each(|s| put_str(&mut b, s));
                }
                Kv::I32s(a) => {
                    b.extend(9u32.to_le_bytes());
                    b.extend(5u32.to_le_bytes());
                    b.extend((a.len() as u64).to_le_bytes());
                    a.iter().for_each(|x| b.extend(x.to_le_bytes()));
                }
            }
        }
        let mut off = 0u64;
        for (name, dims, data) in &self.tensors {
            put_str(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(0u32.to_le_bytes()); // F32
            b.extend(off.to_le_bytes());
            off += (data.len() as u64 * 4).next_multiple_of(32);
        }
        let pad = |b: &mut Vec<u8>| b.resize(b.len().next_multiple_of(32), 0);
        pad(&mut b);
        for (_, _, data) in &self.tensors {
            data.iter().for_each(|x| b.extend(x.to_le_bytes()));
            pad(&mut b);
        }
        b
    }

    fn write(&self, path: &Path) -> PathBuf {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, self.bytes()).expect("write the GGUF");
        path.to_owned()
    }
}

/// GPT-2's byte-level alphabet: each byte as a printable character.
fn byte_tokens() -> Vec<String> {
    let mut bs: Vec<u32> = (u32::from('!')..=u32::from('~'))
        .chain(u32::from('¡')..=u32::from('¬'))
        .chain(u32::from('®')..=u32::from('ÿ'))
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![String::new(); 256];
    for (b, c) in bs.iter().zip(&cs) {
        out[*b as usize] = char::from_u32(*c).expect("char").to_string();
    }
    out
}

const D: u64 = 32;
const FF: u64 = 64;
const ROT: u64 = 16;

/// A one-layer llama file, Llama 3.2-style: `rope_freqs.weight` and base
/// 500000. Weights from a fixed xorshift stream.
fn llama() -> Gguf {
    let mut tokens = byte_tokens();
    tokens.push("<|endoftext|>".into());
    let vocab = tokens.len() as u64;
    let mut types = vec![1; 256];
    types.push(3);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut rand = move |n: u64, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    };
    let mut g = Gguf { kv: Vec::new(), tensors: Vec::new() };
    for (k, v) in [
        ("general.architecture", Kv::Str("llama".into())),
        ("llama.block_count", Kv::U32(1)),
        ("llama.context_length", Kv::U32(256)),
        ("llama.embedding_length", Kv::U32(D as u32)),
        ("llama.feed_forward_length", Kv::U32(FF as u32)),
        ("llama.attention.head_count", Kv::U32(2)),
        ("llama.attention.head_count_kv", Kv::U32(1)),
        ("llama.rope.freq_base", Kv::F32(500_000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Kv::F32(1e-5)),
        ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Kv::Str("llama-bpe".into())),
        ("tokenizer.ggml.tokens", Kv::Strs(tokens)),
        ("tokenizer.ggml.token_type", Kv::I32s(types)),
        ("tokenizer.ggml.merges", Kv::Strs(Vec::new())),
        ("tokenizer.ggml.eos_token_id", Kv::U32(256)),
        ("tokenizer.ggml.add_bos_token", Kv::Bool(false)),
    ] {
        g.kv(k, v);
    }
    let mut t = |name: &str, dims: &[u64], data: Vec<f32>| {
        g.tensors.push((name.to_owned(), dims.to_vec(), data));
    };
    t("token_embd.weight", &[D, vocab], rand(D * vocab, 2.0));
    t("rope_freqs.weight", &[ROT / 2], (0..ROT / 2).map(|i| 1.0 + i as f32).collect());
    t("blk.0.attn_norm.weight", &[D], vec![1.0; D as usize]);
    t("blk.0.attn_q.weight", &[D, D], rand(D * D, 0.5));
    t("blk.0.attn_k.weight", &[D, ROT], rand(D * ROT, 0.5));
    t("blk.0.attn_v.weight", &[D, ROT], rand(D * ROT, 0.5));
    t("blk.0.attn_output.weight", &[D, D], rand(D * D, 0.5));
    t("blk.0.ffn_norm.weight", &[D], vec![1.0; D as usize]);
    t("blk.0.ffn_gate.weight", &[D, FF], rand(D * FF, 0.5));
    t("blk.0.ffn_up.weight", &[D, FF], rand(D * FF, 0.5));
    t("blk.0.ffn_down.weight", &[FF, D], rand(D * FF, 0.5));
    t("output_norm.weight", &[D], vec![1.0; D as usize]);
    g
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

/// `agentd generate` on `model` exits 1 with a message naming each of
/// `names`, and no panic.
fn refused(home: &Home, model: &Path, names: &[&str]) {
    let out = home.run(&[
        "generate",
        "--model",
        model.to_str().expect("path"),
        "--max-tokens",
        "2",
        "hi",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit status; stderr: {err}");
    assert!(!err.contains("panicked"), "a refusal is no panic: {err}");
    for n in names {
        assert!(err.contains(n), "the refusal names `{n}`: {err}");
    }
}

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[test]
fn files_the_engine_cannot_compute_exactly_are_refused_naming_what() {
    let home = Home::new();
    let models = home.path().join("models");

    // The good file loads and generates; models and bench name its
    // architecture and the llama3 frequency factors.
    let good = llama().write(&models.join("llama32ish.gguf"));
    let out = home.run(&[
        "generate",
        "--model",
        good.to_str().expect("path"),
        "--max-tokens",
        "2",
        "--json",
        "hi",
    ]);
    let v = json(&out);
    assert_eq!(v["ids"].as_array().map(Vec::len), Some(2), "{v}");
    let rows = json(&home.run(&["models", "--json"]));
    let row = rows.as_array().and_then(|r| r.iter().find(|r| r["name"] == "llama32ish"));
    let row = row.unwrap_or_else(|| panic!("listed: {rows}"));
    assert_eq!(row["architecture"], "llama", "{row}");
    assert_eq!(row["rope_scaling"], "llama3 (rope_freqs)", "{row}");
    let bench = json(&home.run(&[
        "bench",
        "--model",
        good.to_str().expect("path"),
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "2",
        "--reps",
        "1",
        "--json",
    ]));
    assert_eq!(bench["architecture"], "llama", "{bench}");
    assert_eq!(bench["rope_scaling"], "llama3 (rope_freqs)", "{bench}");
    // Its heads of 16 values cannot hold blocks of 32: a quantized K/V
    // cache is refused at load, naming the head size.
    let out = home.run(&["bench", "--model", good.to_str().expect("path"), "--kv-type", "q8_0"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("multiple of 32") && err.contains("16") && !err.contains("panicked"),
        "{err}"
    );

    // `agentd embed`: one unit vector of n_embd values per text, mean-pooled
    // (the file names no pooling); an unknown pooling is a clear error.
    let em = json(&home.run(&["embed", "--model", good.to_str().expect("path"), "hi", "there"]));
    assert_eq!(
        (em["dimensions"].as_u64(), em["pooling"].as_str()),
        (Some(D), Some("mean")),
        "{em}"
    );
    let vectors = em["embeddings"].as_array().expect("embeddings");
    assert_eq!(vectors.len(), 2, "{em}");
    for v in vectors {
        let v: Vec<f64> = v.as_array().expect("vector").iter().filter_map(Value::as_f64).collect();
        let len = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!(v.len() == D as usize && (len - 1.0).abs() < 1e-5, "{em}");
    }
    let out =
        home.run(&["embed", "--model", good.to_str().expect("path"), "--pooling", "rank", "hi"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("rank") && !text(&out.stderr).contains("panicked"));

    // A YaRN file is reported with its factor and original context.
    let mut yarn = llama();
    yarn.tensors.retain(|t| t.0 != "rope_freqs.weight");
    yarn.kv("llama.rope.scaling.type", Kv::Str("yarn".into()));
    yarn.kv("llama.rope.scaling.factor", Kv::F32(4.0));
    yarn.kv("llama.rope.scaling.original_context_length", Kv::U32(64));
    yarn.write(&models.join("yarn.gguf"));
    let rows = json(&home.run(&["models", "--json"]));
    let row = rows.as_array().and_then(|r| r.iter().find(|r| r["name"] == "yarn"));
    assert_eq!(row.map(|r| r["rope_scaling"].clone()), Some("yarn ×4 from 64".into()), "{rows}");

    // An architecture outside the list: named, with the list.
    let mut arch = llama();
    arch.kv("general.architecture", Kv::Str("deepseek2".into()));
    let arch = arch.write(&home.path().join("deepseek2.gguf"));
    refused(&home, &arch, &["deepseek2", "supported: llama"]);

    // A RoPE scaling type the engine does not implement.
    let mut dynamic = llama();
    dynamic.kv("llama.rope.scaling.type", Kv::Str("dynamic".into()));
    let dynamic = dynamic.write(&home.path().join("dynamic.gguf"));
    refused(&home, &dynamic, &["dynamic", "llama.rope.scaling.type"]);

    // A reranker's pooling (a classification head the engine lacks).
    let mut rank = llama();
    rank.kv("llama.pooling_type", Kv::U32(4));
    let rank = rank.write(&home.path().join("rank.gguf"));
    refused(&home, &rank, &["llama.pooling_type", "rank"]);

    // A tensor the forward pass would leave unused (llama.cpp adds this
    // bias to the attention output): named.
    let mut extra = llama();
    extra.tensors.push(("blk.0.attn_output.bias".into(), vec![D], vec![0.5; D as usize]));
    let extra = extra.write(&home.path().join("extra.gguf"));
    refused(&home, &extra, &["blk.0.attn_output.bias"]);

    // Longrope factors on an architecture whose graph takes none (qwen2):
    // the tensors are left over, and named.
    let mut qwen = llama();
    qwen.kv("general.architecture", Kv::Str("qwen2".into()));
    let keys: Vec<(String, Kv)> = std::mem::take(&mut qwen.kv)
        .into_iter()
        .map(|(k, v)| (k.strip_prefix("llama.").map_or(k.clone(), |r| format!("qwen2.{r}")), v))
        .collect();
    qwen.kv = keys;
    let qwen = qwen.write(&home.path().join("qwen2-freqs.gguf"));
    refused(&home, &qwen, &["rope_freqs.weight"]);

    // `agentd models` lists a refused file with the reason, and still exits 0.
    std::fs::copy(&dynamic, models.join("dynamic.gguf")).expect("copy");
    let rows = json(&home.run(&["models", "--json"]));
    let row = rows.as_array().and_then(|r| r.iter().find(|r| r["name"] == "dynamic"));
    let why = row.map(|r| r["refused"].as_str().unwrap_or_default().to_owned());
    assert!(why.as_deref().is_some_and(|w| w.contains("dynamic")), "{rows}");
}
