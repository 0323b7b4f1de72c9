//! The engine against llama.cpp on the model families it runs, one synthetic file per family
//! in the real layout (`scripts/synth_families.py` writes it: the tensor names, shapes, types
//! and metadata keys of llama.cpp's converter, tiny sizes, seeded weights far from greedy
//! ties), and a refusal of the files it cannot compute exactly.
//!
//! For each family the test writes the file with the script into a temporary folder, checks
//! its sha256 against `tests/data/reference/families.jsonl` (the file llama.cpp ran: the script
//! is reproducible), loads it with the line's context, and compares the 16 greedy ids after a
//! short (10 ids) and a long (1,100 ids) prompt with llama.cpp's, exactly. The fixture and how
//! it was made: `tests/data/reference/README.md` and `scripts/family_reference.py`.
//!
//! Needs the script's Python (numpy and `gguf`, pinned in tests/deps/requirements.txt):
//! `AGENTD_TEST_PYTHON` (the test command sets it, see `scripts/test-deps.sh`); each test says
//! when it skips, and fails instead under `AGENTD_TEST_STRICT=1`.
//!
//! The mutation check: `AGENTD_FAMILIES_MUTATE=drop-bias` (or another of the script's
//! `--mutate` names) makes the script leave that thing out; the sha256 check then only reports
//! the difference, and the family's test must fail on the ids — an engine that ignored the
//! thing would compute what the mutated file asks for.

use inference::{Engine, EngineOptions, GenParams};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python(test: &str) -> Option<PathBuf> {
    let Some(p) = std::env::var_os("AGENTD_TEST_PYTHON").filter(|v| !v.is_empty()) else {
        assert!(
            std::env::var("AGENTD_TEST_STRICT").as_deref() != Ok("1"),
            "{test}: AGENTD_TEST_PYTHON is not set and AGENTD_TEST_STRICT=1 (run ./test.sh)"
        );
        eprintln!("SKIPPED {test}: AGENTD_TEST_PYTHON is not set (./test.sh sets it)");
        return None;
    };
    Some(PathBuf::from(p))
}

/// A family's file, written by the script into a folder removed with it.
struct Made {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn make(family: &str) -> Option<Made> {
    make_with("synth_families.py", family)
}

/// A family's file, written by `script` (of `scripts/`).
fn make_with(script: &str, family: &str) -> Option<Made> {
    let py = python(&format!("families ({family})"))?;
    let dir = tempfile::tempdir().expect("temporary folder");
    let path = dir.path().join(format!("{family}.gguf"));
    let out = Command::new(&py)
        .arg(root().join("scripts").join(script))
        .args(["--family", family, "--out"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{family}: cannot run {}: {e}", py.display()));
    assert!(
        out.status.success(),
        "{family}: scripts/{script} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(Made { _dir: dir, path })
}

fn fixture(family: &str) -> Vec<Value> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference/families.jsonl");
    let all = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let lines: Vec<Value> = all
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Value>(l).expect("fixture line is JSON"))
        .filter(|v| v["family"] == family)
        .collect();
    assert!(!lines.is_empty(), "{}: no line for {family}", p.display());
    lines
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The file is the one llama.cpp ran; under a mutation (`AGENTD_FAMILIES_MUTATE`) it differs
/// on purpose, and the ids must tell.
fn same_file(family: &str, path: &Path, want: &Value) {
    let got = sha256(path);
    let want = want.as_str().expect("sha256");
    if let Some(m) = std::env::var_os("AGENTD_FAMILIES_MUTATE").filter(|v| !v.is_empty()) {
        if got != want {
            eprintln!("{family}: the file differs from the fixture's under AGENTD_FAMILIES_MUTATE={m:?}; comparing ids");
        }
        return;
    }
    assert_eq!(
        got, want,
        "{family}: scripts/synth_families.py wrote a file other than the one llama.cpp ran (sha256); \
         remake the fixture with scripts/family_reference.py if the change is meant"
    );
}

fn options(context: usize) -> EngineOptions {
    let threads = std::env::var("AGENTD_TEST_THREADS").ok().and_then(|t| t.parse().ok());
    EngineOptions { threads, context: Some(context), ..Default::default() }
}

/// Greedy ids after each prompt of the family equal llama.cpp's, all 16.
fn family(name: &str) {
    let Some(made) = make(name) else { return };
    let cases = fixture(name);
    same_file(name, &made.path, &cases[0]["sha256"]);
    let mut engines: Vec<(usize, Engine)> = Vec::new();
    let mut bad = Vec::new();
    for case in &cases {
        let n_ctx = case["n_ctx"].as_u64().expect("n_ctx") as usize;
        if !engines.iter().any(|(c, _)| *c == n_ctx) {
            let engine = Engine::load(&made.path, &options(n_ctx))
                .unwrap_or_else(|e| panic!("{name}: the engine does not load the file: {e}"));
            engines.push((n_ctx, engine));
        }
        let engine = &engines.iter().find(|(c, _)| *c == n_ctx).expect("loaded").1;
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy_ids"]);
        let params = GenParams { max_tokens: want.len(), ..GenParams::default() };
        let out = engine
            .generate(&mut engine.session(), &prompt, &params, &AtomicBool::new(false), &mut |_| {})
            .unwrap_or_else(|e| panic!("{name}: generation failed: {e}"));
        if out.ids != want {
            let same = out.ids.iter().zip(&want).take_while(|(a, b)| a == b).count();
            bad.push(format!(
                "{name}, {} prompt ({} ids, context {n_ctx}): parts from llama.cpp at token {same}\n got {:?}\nwant {want:?}",
                case["prompt"].as_str().unwrap_or("?"),
                prompt.len(),
                out.ids
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The engine refuses the file at load with an error naming `what`.
fn refused(name: &str) {
    let Some(made) = make(name) else { return };
    let cases = fixture(name);
    same_file(name, &made.path, &cases[0]["sha256"]);
    let what = cases[0]["refuse"].as_str().expect("refuse");
    match Engine::load(&made.path, &options(2048)) {
        Ok(_) => panic!(
            "{name}: the engine loaded a file it cannot compute exactly; it must refuse it naming `{what}`"
        ),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(what), "{name}: the refusal does not name `{what}`: {msg}");
        }
    }
}

/// Llama 3.2's layout: the llama3 `rope_freqs.weight` factors, rope base 500000.
#[test]
fn llama3_with_rope_freqs_matches_llama_cpp() {
    family("llama3");
}

/// Qwen2.5: q/k/v biases, NeoX RoPE.
#[test]
fn qwen2_matches_llama_cpp() {
    family("qwen2");
}

/// Qwen2.5 with YaRN (factor 4 over an original context of 512; the long prompt crosses it).
#[test]
fn qwen2_yarn_matches_llama_cpp() {
    family("qwen2-yarn");
}

/// Qwen3: per-head q/k norms, heads × head size ≠ n_embd.
#[test]
fn qwen3_matches_llama_cpp() {
    family("qwen3");
}

/// Gemma 2: soft-capping, post norms, a sliding window of 128 on every other layer.
#[test]
fn gemma2_matches_llama_cpp() {
    family("gemma2");
}

/// Phi-4-mini's layout: fused qkv and gate/up, partial rotary, longrope (the short factors at
/// the original context of 512, the long ones beyond).
#[test]
fn phi3_longrope_matches_llama_cpp() {
    family("phi3");
}

/// Qwen3-30B-A3B's layout: 16 experts, 4 routed per token, q/k norms.
#[test]
fn qwen3moe_matches_llama_cpp() {
    family("qwen3moe");
}

/// deepseek2 (MLA attention), an architecture llama.cpp runs and the engine does not.
#[test]
fn an_unknown_architecture_is_refused_naming_it() {
    refused("unknown");
}

/// A llama file whose `rope.scaling.type` is one the engine does not implement.
#[test]
fn an_unknown_rope_scaling_is_refused_naming_it() {
    refused("bad-scaling");
}

/// The lines of `tests/data/reference/embed-families.jsonl` (llama.cpp's ids, vectors and
/// rerank scores on the files of `scripts/synth_embed.py`).
fn embed_fixture() -> Vec<Value> {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference/embed-families.jsonl");
    let all = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    all.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect()
}

/// The WordPiece (`bert`) tokenizer of the embedding families gives llama.cpp's ids, `[CLS]`
/// and `[SEP]` included, on the files `scripts/synth_embed.py` writes (the fixture
/// `embed-families.jsonl`, from llama-server's `/tokenize`).
#[test]
fn wordpiece_tokenizer_matches_llama_cpp() {
    let lines = embed_fixture();
    let mut checked = 0;
    for family in ["bert", "nomic-bert"] {
        let Some(made) = make_with("synth_embed.py", family) else { return };
        let tok = inference::Tok::load(&made.path).expect("the tokenizer loads");
        let sha = sha256(&made.path);
        for l in lines.iter().filter(|l| l["family"] == family) {
            assert_eq!(sha, l["sha256"].as_str().unwrap(), "{family}: the file");
            let text = l["text"].as_str().expect("text");
            let got = tok.encode_prompt(text, false).expect("tokenizes");
            assert_eq!(got, ids(&l["ids"]), "{family}: {text:?}");
            checked += 1;
        }
    }
    assert!(checked >= 10, "{checked} inputs checked");
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().expect("an array").iter().map(|x| x.as_f64().expect("a number") as f32).collect()
}

/// The encoders (`bert` with CLS pooling, `nomic-bert` with mean pooling) embed as llama.cpp
/// does: each input of `embed-families.jsonl` (llama-server's `/v1/embeddings`, one input per
/// request) within cosine 0.9999 of llama.cpp's vector, on the files `scripts/synth_embed.py`
/// writes; and the reranker's scores (`bert` with the classification head) are llama-server's
/// `/v1/rerank` scores, its input laid out as llama-server lays it out.
#[test]
fn encoders_embed_and_rerank_as_llama_cpp() {
    let lines = embed_fixture();
    let opts = EngineOptions { threads: Some(2), ..Default::default() };
    let mut worst = 1.0f64;
    let mut checked = 0;
    for family in ["bert", "nomic-bert"] {
        let Some(made) = make_with("synth_embed.py", family) else { return };
        let engine = Engine::load(&made.path, &opts).expect("the encoder loads");
        assert!(!engine.is_generative(), "{family}: an encoder does not generate");
        let err = engine.generate(
            &mut engine.session(),
            &[2, 5, 3],
            &GenParams::default(),
            &AtomicBool::new(false),
            &mut |_| {},
        );
        let why = err.expect_err("an encoder refuses to generate").to_string();
        assert!(why.contains("embedding model"), "{why}");
        for l in lines.iter().filter(|l| l["family"] == family) {
            let text = l["text"].as_str().expect("text");
            let e = engine.embed_text(text, None).expect("embeds");
            let c = cosine(&e.vector, &floats(&l["embedding"]));
            assert!(c >= 0.9999, "{family}: {text:?}: cosine {c}");
            worst = worst.min(c);
            checked += 1;
        }
    }
    assert!(checked >= 10, "{checked} inputs checked");
    eprintln!("encoders: {checked} inputs, worst cosine {worst:.7}");
    // Inputs run together in one pass give each input's own vector, bit for bit (inputs of
    // both attention paths, short and long, mixed).
    let Some(made) = make_with("synth_embed.py", "nomic-bert") else { return };
    let engine = Engine::load(&made.path, &opts).expect("the encoder loads");
    let texts: Vec<&str> = lines
        .iter()
        .filter(|l| l["family"] == "nomic-bert")
        .map(|l| l["text"].as_str().expect("text"))
        .collect();
    let ids: Vec<Vec<u32>> =
        texts.iter().map(|t| engine.tokenizer().encode_prompt(t, false).unwrap()).collect();
    let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    let together = engine.embed_many(&refs, None).expect("embeds");
    for (t, got) in refs.iter().zip(&together) {
        assert_eq!(got.vector, engine.embed(t, None).unwrap().vector, "{} tokens", t.len());
    }
    let Some(made) = make_with("synth_embed.py", "bert-rerank") else { return };
    let engine = Engine::load(&made.path, &opts).expect("the reranker loads");
    assert!(engine.reranks());
    let l = lines.iter().find(|l| l["family"] == "bert-rerank").expect("a rerank line");
    let query = l["query"].as_str().expect("query");
    let want = floats(&l["scores"]);
    let docs = l["documents"].as_array().expect("documents");
    assert_eq!(docs.len(), want.len());
    let mut worst_score = 0f32;
    let tokens: Vec<Vec<u32>> = docs
        .iter()
        .map(|d| engine.rerank_tokens(query, d.as_str().expect("a document")).expect("tokenizes"))
        .collect();
    let refs: Vec<&[u32]> = tokens.iter().map(Vec::as_slice).collect();
    let scores = engine.rerank(&refs).expect("scores");
    assert_eq!(scores.len(), docs.len());
    for ((doc, want), got) in docs.iter().zip(want).zip(scores) {
        worst_score = worst_score.max((got - want).abs());
        assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{doc:?}: {got} vs {want}");
    }
    eprintln!("reranker: {} documents, largest score difference {worst_score:e}", docs.len());
    let why =
        engine.embed_text("x", None).expect_err("a reranker's file pools by rank").to_string();
    assert!(why.contains("reranker"), "{why}");
}
