//! The engine commands: `pull`, `models`, `tokenize`, `generate` and
//! `bench` (llama-bench's measurements, and decode of several sequences
//! together as `serve` runs them).

use crate::provider::build::{resolve, EngineArgs};
use crate::state::pull;
use crate::state::registry::Registry;
use anyhow::{Context, Result};
use inference::{GenParams, Sampling};
use serde_json::{json, Value};
use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

pub(crate) fn pull(name: Option<&str>) -> Result<()> {
    if let Some(h) = name.map(pull::HubFile::parse).transpose()?.flatten() {
        println!("{}", pull::pull_hub_file(&h)?.display());
        return Ok(());
    }
    let reg = Registry::load()?;
    let entry = reg.get(name.unwrap_or(&reg.default))?;
    let path = pull::pull(entry)?;
    println!("{}", path.display());
    Ok(())
}

pub(crate) fn models(json_out: bool) -> Result<()> {
    let reg = Registry::load()?;
    let mut rows = Vec::new();
    for (name, e) in &reg.entries {
        let path = e.local_path();
        let state = if !path.is_file() {
            "missing"
        } else if pull::verified(&path, &e.sha256)? {
            "present"
        } else {
            "corrupt"
        };
        let mut row = json!({
            "name": name, "default": *name == reg.default, "state": state,
            "path": path, "repo": e.repo, "file": e.file, "sha256": e.sha256,
            "tool_format": e.tool_format, "mirrors": e.mirrors, "size": e.size,
            "architecture": e.architecture, "chat_template": e.chat_template,
            "rope_scaling": null,
        });
        if state != "missing" {
            header_facts(&mut row, &path, e.context);
        }
        rows.push(row);
    }
    // GGUF files in the models folder that no registry entry names
    // (`agentd pull hf:…`, or copied in): installed too.
    for path in installed_files() {
        if reg.entries.values().any(|e| e.local_path() == path) {
            continue;
        }
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
        let size = std::fs::metadata(&path).map(|m| m.len()).ok();
        let mut row = json!({"name": name, "default": false, "state": "present", "path": path,
            "repo": "", "file": path.file_name().and_then(|s| s.to_str()), "size": size,
            "architecture": null, "rope_scaling": null});
        header_facts(&mut row, &path, None);
        rows.push(row);
    }
    // What a daemon on the default socket has loaded, when one answers.
    let loaded = loaded_by_daemon();
    for r in &mut rows {
        let name = r["name"].as_str().unwrap_or_default().to_owned();
        r["loaded"] = json!(loaded.as_ref().map(|l| l.contains(&name)));
    }
    if json_out {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for r in rows {
            let facts = match (&r["architecture"], &r["rope_scaling"], &r["refused"]) {
                (_, _, Value::String(why)) => format!("  refused: {why}"),
                (Value::String(a), Value::String(rope), _) => format!("  {a}, RoPE {rope}"),
                _ => String::new(),
            };
            println!(
                "{}{}  {}{}  {}/{}  {}{facts}",
                r["name"].as_str().unwrap_or_default(),
                if r["default"] == true { " (default)" } else { "" },
                r["state"].as_str().unwrap_or_default(),
                if r["loaded"] == true { ", loaded by the daemon" } else { "" },
                r["repo"].as_str().unwrap_or_default(),
                r["file"].as_str().unwrap_or_default(),
                r["path"].as_str().unwrap_or_default(),
            );
        }
    }
    Ok(())
}

/// What a listed file's header says: its `architecture` and `rope_scaling`
/// (at the context a load would use: `context` of its registry entry, else
/// the default), or, when the engine cannot run it (an architecture outside
/// the list, a RoPE scaling it does not implement, no GGUF), `refused` with
/// the engine's reason. Reads the header only.
fn header_facts(row: &mut Value, path: &std::path::Path, context: Option<usize>) {
    match inference::inspect(path, context) {
        Ok(f) => {
            row["architecture"] = json!(f.config.arch_name);
            row["rope_scaling"] = json!(f.config.rope_scaling(f.context));
        }
        Err(e) => row["refused"] = json!(e.to_string()),
    }
}

/// The models the daemon on the default socket has loaded (`GET /api/ps`),
/// or `None` when no daemon answers there within a second.
fn loaded_by_daemon() -> Option<Vec<String>> {
    use std::io::{Read, Write};
    let mut s =
        std::os::unix::net::UnixStream::connect(crate::state::home::default_socket()).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(1))).ok()?;
    s.write_all(b"GET /api/ps HTTP/1.1\r\nHost: agentd\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (_, body) = out.split_once("\r\n\r\n")?;
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(
        v["models"]
            .as_array()?
            .iter()
            .filter_map(|m| m["name"].as_str())
            .map(|n| n.strip_suffix(":latest").unwrap_or(n).to_owned())
            .collect(),
    )
}

/// `*.gguf` files in the models folder, sorted.
fn installed_files() -> Vec<std::path::PathBuf> {
    crate::state::home::gguf_files(&crate::state::home::models_dir())
}

/// `agentd rm NAME`: deletes an installed model file (a registry name, a
/// file name or its stem), with its verification stamp; never a file
/// outside the models folder.
pub(crate) fn rm(name: &str) -> Result<()> {
    let reg = Registry::load()?;
    let files = installed_files();
    let path = match reg.entries.get(name) {
        Some(e) => Some(e.local_path()).filter(|p| p.is_file()),
        None => files
            .iter()
            .find(|p| {
                p.file_name().and_then(|s| s.to_str()) == Some(name)
                    || p.file_stem().and_then(|s| s.to_str()) == Some(name)
            })
            .cloned(),
    };
    let Some(path) = path else {
        let have: Vec<String> = files
            .iter()
            .filter_map(|p| p.file_name().and_then(|s| s.to_str()).map(str::to_owned))
            .collect();
        anyhow::bail!(
            "no installed model is named {name:?} in {} (installed: {})",
            crate::state::home::models_dir().display(),
            if have.is_empty() { "none".to_owned() } else { have.join(", ") }
        );
    };
    std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    std::fs::remove_file(pull::stamp_path(&path)).ok();
    eprintln!("agentd: removed {}", path.display());
    Ok(())
}

pub(crate) fn tokenize(model: Option<&str>, special: bool, text: &str) -> Result<()> {
    let r = resolve(model)?;
    let tok = inference::Tok::load(&r.path)?;
    // As the model sees a prompt: BOS first when the file says so.
    let ids = tok.encode_prompt(text, special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

/// `generate`'s repetition rules: all off unless given (the raw
/// completion stays llama.cpp's), whatever models.toml says.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RepeatArgs {
    /// Divide the logits of the last --repeat-last-n tokens by this (1: off)
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Tokens the penalties look at (prompt included)
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// Lower a recent token's logit by this times its count
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Lower a recent token's logit by this once
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// Never repeat an n-gram of the output of this many tokens (0: off)
    #[arg(long, default_value_t = 0)]
    no_repeat_ngram: usize,
}

pub(crate) struct GenerateArgs<'a> {
    pub(crate) engine: &'a EngineArgs,
    pub(crate) max_tokens: usize,
    pub(crate) temperature: f32,
    pub(crate) seed: u64,
    pub(crate) rules: RepeatArgs,
    pub(crate) json: bool,
    pub(crate) prompt: &'a str,
}

pub(crate) fn generate(a: GenerateArgs<'_>, cancel: &AtomicBool) -> Result<inference::Finish> {
    let (_, engine) = a.engine.load()?;
    let prompt = engine.tokenize_prompt(a.prompt, true)?;
    let params = GenParams {
        max_tokens: a.max_tokens,
        sampling: Sampling {
            temperature: a.temperature,
            seed: a.seed,
            repeat_penalty: a.rules.repeat_penalty,
            repeat_last_n: a.rules.repeat_last_n,
            frequency_penalty: a.rules.frequency_penalty,
            presence_penalty: a.rules.presence_penalty,
            no_repeat_ngram: a.rules.no_repeat_ngram,
            ..Sampling::default()
        },
        speculate: a.engine.draft.into(),
        ..GenParams::default()
    };
    let mut s = engine.session();
    let stdout = std::io::stdout();
    let json_out = a.json;
    let out = engine.generate(&mut s, &prompt, &params, cancel, &mut |d| {
        if !json_out {
            let mut o = stdout.lock();
            // The model's text, its control characters shown, not sent.
            let _ = o.write_all(super::visible::visible(d).as_bytes());
            let _ = o.flush();
        }
    })?;
    if json_out {
        println!(
            "{}",
            json!({"prompt_ids": prompt, "ids": out.ids, "text": out.text, "finish_reason": out.finish.as_str(),
                "decode": {"tokens": out.ids.len(), "seconds": out.gen_time.as_secs_f64(),
                           "drafted": out.drafted, "accepted": out.accepted}})
        );
    } else {
        println!();
    }
    Ok(out.finish)
}

/// `agentd embed`: each text's embedding, printed as one JSON object
/// `{"model", "pooling", "dimensions", "embeddings": [[…], …], "tokens": [n, …]}`.
pub(crate) fn embed(e: &EngineArgs, pooling: Option<&str>, texts: &[String]) -> Result<()> {
    let pooling = pooling.map(str::parse::<inference::Pooling>).transpose()?;
    let (r, engine) = e.load()?;
    let mut vectors = Vec::with_capacity(texts.len());
    let mut tokens = Vec::with_capacity(texts.len());
    let mut used = None;
    for (i, t) in texts.iter().enumerate() {
        let em = engine.embed_text(t, pooling).with_context(|| format!("text {}", i + 1))?;
        used = Some(em.pooling);
        tokens.push(em.tokens);
        vectors.push(em.vector);
    }
    let out = json!({"model": r.name, "pooling": used.map(inference::Pooling::as_str),
               "dimensions": engine.info().config.n_embd, "embeddings": vectors, "tokens": tokens});
    // A reader that stops early (`| head`) ends the output, not in a panic.
    use std::io::Write;
    match writeln!(std::io::stdout().lock(), "{out}") {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Peak resident set size of this process in MB (VmHWM).
fn peak_rss_mb() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// What `agentd bench` measures: prompt processing of `pp` tokens and
/// decode of `tg`, each `reps` times after a warm-up, `depth` tokens into
/// the context; `parallel` sequences decoding together.
pub(crate) struct BenchRun {
    pub(crate) pp: usize,
    pub(crate) tg: usize,
    pub(crate) reps: usize,
    pub(crate) parallel: usize,
    pub(crate) depth: usize,
}

/// The most tokens `agentd bench` puts in a context (1M: past any GGUF's
/// trained context).
const MAX_DEPTH: usize = 1 << 20;

pub(crate) fn bench(engine_args: &EngineArgs, run: &BenchRun, json_out: bool) -> Result<()> {
    let &BenchRun { pp, tg, reps, parallel, depth } = run;
    anyhow::ensure!(
        (1..=256).contains(&parallel),
        "--parallel {parallel} is out of range: use 1 to 256 sequences"
    );
    anyhow::ensure!(
        depth == 0 || parallel == 1,
        "--depth {depth} with --parallel {parallel}: a depth is measured on one sequence; drop one of them"
    );
    anyhow::ensure!(
        depth <= MAX_DEPTH && pp.max(tg) <= MAX_DEPTH,
        "--depth {depth}, --prompt-tokens {pp} and --gen-tokens {tg} must each be at most {MAX_DEPTH}"
    );
    // The context must hold the depth and what is timed after it; past the
    // default (8192) the model is loaded with a context that does.
    let need = depth + pp.max(tg) + 1;
    let (r, engine) = if need > 8192 {
        engine_args.load_context(need.next_multiple_of(256))?
    } else {
        engine_args.load_plain()?
    };
    anyhow::ensure!(
        need <= engine.info().context,
        "--depth {depth} plus {} timed tokens need a context of {need}, but {} is loaded with {}: lower --depth or the token counts",
        pp.max(tg),
        r.name,
        engine.info().context
    );
    let vocab = engine.info().config.n_vocab as u32;
    let tok = engine.tokenizer();
    // Ordinary tokens in a fixed pseudo-random order, like llama-bench.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut ids = Vec::new();
    while ids.len() < depth + pp.max(tg) + 1 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id = (x % vocab as u64) as u32;
        if !tok.is_control(id) {
            ids.push(id);
        }
    }
    let (context, ids) = ids.split_at(depth);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // One session holds the depth (prefilled once, untimed); each timed run
    // rewinds to it (a backend that cannot cut its cache prefills again).
    let mut s = engine.session();
    let at_depth = |s: &mut inference::Session| -> Result<()> {
        engine.rewind(s, depth);
        if s.cached().len() < depth {
            engine.eval(s, context)?;
        }
        Ok(())
    };
    let mut pps = Vec::new();
    let mut tgs = Vec::new();
    for rep in 0..=reps.max(1) {
        if pp > 0 {
            at_depth(&mut s)?;
            let t = Instant::now();
            engine.eval(&mut s, &ids[..pp])?;
            let v = pp as f64 / t.elapsed().as_secs_f64();
            if rep > 0 {
                pps.push(v);
            }
        }
        if tg > 0 && parallel == 1 {
            at_depth(&mut s)?;
            let t = Instant::now();
            for &id in &ids[..tg] {
                engine.eval(&mut s, &[id])?;
            }
            let v = tg as f64 / t.elapsed().as_secs_f64();
            if rep > 0 {
                tgs.push(v);
            }
        } else if tg > 0 {
            let v = decode_together(&engine, ids, tg, parallel)?;
            if rep > 0 {
                tgs.push(v);
            }
        }
    }
    let pp_s = if pps.is_empty() { 0.0 } else { median(pps) };
    let par = if parallel > 1 { format!(" x{parallel} together") } else { String::new() };
    let at = if depth > 0 { format!(" @ d{depth}") } else { String::new() };
    let tg_s = if tgs.is_empty() { 0.0 } else { median(tgs) };
    let rss = peak_rss_mb().unwrap_or(0.0);
    let info = engine.info();
    if json_out {
        println!(
            "{}",
            json!({"model": r.name, "threads": info.threads, "pp_tok_s": pp_s, "tg_tok_s": tg_s,
                   "peak_rss_mb": rss, "prompt_tokens": pp, "gen_tokens": tg, "reps": reps, "parallel": parallel,
                   "depth": depth, "context": info.context, "kv_bytes_per_token": engine.kv_bytes_per_token(),
                   "kv_type": info.kv_type.name(),
                   "isa": info.isa, "weight_mb": info.weight_bytes as f64 / 1e6,
                   "kernels": kernels(info), "architecture": info.config.arch_name,
                   "rope_scaling": info.config.rope_scaling(info.context)})
        );
    } else {
        println!(
            "model {} ({}, RoPE {})  threads {}  pp{pp}{at} {pp_s:.1} tok/s  tg{tg}{at}{par} {tg_s:.1} tok/s  peak RSS {rss:.0} MB  KV {} {:.1} KiB/token",
            r.name,
            info.config.arch_name,
            info.config.rope_scaling(info.context),
            info.threads,
            info.kv_type,
            engine.kv_bytes_per_token() as f64 / 1024.0
        );
    }
    Ok(())
}

/// `{tensor type: kernel}` (with `"kernel ×count"` when a type's tensors
/// take several kernels).
fn kernels(info: &inference::ModelInfo) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (ty, k, n) in &info.kernels {
        let entry = m.entry(ty.clone()).or_insert_with(|| serde_json::Value::String(String::new()));
        let s = entry.as_str().unwrap_or_default();
        let add = format!("{k} x{n}");
        *entry = serde_json::Value::String(if s.is_empty() { add } else { format!("{s}, {add}") });
    }
    serde_json::Value::Object(m)
}

/// Aggregate decode speed of `n` sequences generating `tg` tokens each in
/// shared steps (how `serve` runs concurrent completions). Each starts from
/// 8 prompt tokens of its own; end-of-turn tokens are forbidden so every
/// sequence runs its full length; the prefill step is not timed.
fn decode_together(engine: &inference::Engine, ids: &[u32], tg: usize, n: usize) -> Result<f64> {
    use std::sync::atomic::AtomicBool;
    let params = inference::GenParams {
        max_tokens: tg,
        forbid: engine.info().stop_tokens.clone(),
        // Plain decode steps, as llama-bench's (drafts would measure the
        // random prompt's repetitions).
        speculate: 0,
        ..inference::GenParams::default()
    };
    let no = AtomicBool::new(false);
    let mut sessions: Vec<_> = (0..n).map(|_| engine.session()).collect();
    let mut gens = Vec::with_capacity(n);
    for (k, s) in sessions.iter_mut().enumerate() {
        let at = k % ids.len().saturating_sub(8).max(1);
        gens.push(engine.begin(s, &ids[at..(at + 8).min(ids.len())], &params)?);
    }
    let mut t = None;
    while gens.iter().any(|g| !g.is_done()) {
        let mut sinks: Vec<_> = (0..n).map(|_| |_: &str| {}).collect();
        let mut steps: Vec<inference::Step<'_>> = sessions
            .iter_mut()
            .zip(gens.iter_mut())
            .zip(sinks.iter_mut())
            .map(|((session, gen), sink)| inference::Step {
                session,
                gen,
                cancel: &no,
                on_text: sink as &mut dyn FnMut(&str),
            })
            .collect();
        engine.step(&mut steps)?;
        t.get_or_insert_with(Instant::now);
    }
    let made: usize = gens.iter().map(|g| g.generated()).sum();
    let secs = t.map_or(0.0, |t| t.elapsed().as_secs_f64());
    Ok(if secs > 0.0 { made as f64 / secs } else { 0.0 })
}
