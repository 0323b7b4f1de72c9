//! The engine a caller holds: a loaded model, its tokenizer and its thread
//! pool; sessions that keep a KV cache so a request that extends the cached
//! tokens prefills only the new part; and generation that streams UTF-8-safe
//! text deltas.

use crate::candle_path::CandleModel;
use crate::constraint::{Commit, Constraint, Grammars, Guide, MAX_FF};
use crate::embed::{Embedding, Pooler, Pooling};
use crate::encoder::Encoder;
use crate::error::{Error, ErrorKind, Result};
use crate::gguf::Gguf;
use crate::kernels::attn::{thresholds, Mode, Prompt, Route, UBATCH};
use crate::kv::{KvCache, KvType};
use crate::model::{Config, Model, Scratch, Seq};
use crate::pool::Pool;
use crate::sampler::{sample, Rng, Sampling};
use crate::tokenizer::Tok;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Most tokens an encoder runs in one pass of [`Engine::embed_many`]
/// (llama-server's default logical batch).
pub(crate) const ENCODER_BATCH: usize = 2048;

/// Session ids for backends that keep one shared cache.
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The best available: a GPU when the build has its backend and the
    /// machine has one, else the CPU fast path.
    #[default]
    Auto,
    /// The CPU fast path.
    Cpu,
    /// An NVIDIA GPU (`cuda` feature).
    Cuda(usize),
    /// Apple GPU (`metal` feature).
    Metal,
    /// candle's own model code on candle's CPU backend: the code path the
    /// GPU devices take, runnable anywhere (slow; for checking that path).
    CandleCpu,
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Metal => f.write_str("metal"),
            Device::CandleCpu => f.write_str("candle-cpu"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Device> {
        let s = s.trim().to_ascii_lowercase();
        Ok(match s.as_str() {
            "auto" => Device::Auto,
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda(0),
            "metal" => Device::Metal,
            "candle-cpu" => Device::CandleCpu,
            _ => match s.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
                Some(n) => Device::Cuda(n),
                None => {
                    return Err(Error::new(
                        ErrorKind::Input,
                        format!(
                        "unknown device {s:?}: use auto, cpu, cuda, cuda:N, metal or candle-cpu"
                    ),
                    ))
                }
            },
        })
    }
}

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// Compute threads (default: the CPUs available to this process).
    pub threads: Option<usize>,
    /// Where to run.
    pub device: Device,
    /// Context length to allow (default: the model's, at most 8192).
    pub context: Option<usize>,
    /// Element type of the K/V cache; none: [`Engine::load`]'s policy
    /// (f16 unless the context's cache would take more than a quarter of
    /// the machine's memory).
    pub kv_type: Option<KvType>,
}

/// What a loaded model is.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The file it came from.
    pub path: PathBuf,
    /// Hyper-parameters.
    pub config: Config,
    /// Context length in use.
    pub context: usize,
    /// Element type of the K/V cache in use.
    pub kv_type: KvType,
    /// The GGUF's chat template, if it has one.
    pub chat_template: Option<String>,
    /// Tokens that end a turn (EOS, EOT, `<|im_end|>`…).
    pub stop_tokens: Vec<u32>,
    /// BOS token text and whether the template adds it.
    pub bos: Option<String>,
    /// EOS token text.
    pub eos: Option<String>,
    /// Bytes of weights in memory.
    pub weight_bytes: usize,
    /// Compute threads.
    pub threads: usize,
    /// The instruction set of the CPU kernels (`avx512-vnni`, `avx2`,
    /// `scalar`), or the candle device.
    pub isa: String,
    /// Per GGUF tensor type, the kernel that runs it and how many tensors
    /// it has: `(type, kernel, count)`.
    pub kernels: Vec<(String, String, usize)>,
}

/// What a GGUF file says about its model, from its header alone (no
/// weights read): what a model listing shows before the model is loaded.
#[derive(Debug)]
pub struct Facts {
    /// The file.
    pub path: PathBuf,
    /// Hyper-parameters.
    pub config: Config,
    /// The context a load with the same `context` option would use.
    pub context: usize,
    /// The GGUF's chat template, if it has one.
    pub chat_template: Option<String>,
    /// Bytes of the tensors' data as stored.
    pub weight_bytes: usize,
    /// Matrices (tensors of two or more dimensions) per GGUF tensor type:
    /// `(type, count)`, most first.
    pub types: Vec<(String, usize)>,
    /// The vocabulary.
    pub tokenizer: Tok,
}

/// Reads what `path`'s header says about its model (see [`Facts`]);
/// `context` as in [`EngineOptions`].
pub fn inspect(path: &Path, context: Option<usize>) -> Result<Facts> {
    let g = Gguf::open(path)?;
    let tokenizer = Tok::from_gguf(&g, path)?;
    let config = Config::read(&g)?;
    let mut types: Vec<(String, usize)> = Vec::new();
    let mut weight_bytes = 0;
    for t in g.header.tensors.values() {
        weight_bytes += t.bytes;
        if t.dims.len() < 2 {
            continue;
        }
        match types.iter_mut().find(|(n, _)| n == t.ty.name()) {
            Some(e) => e.1 += 1,
            None => types.push((t.ty.name().to_owned(), 1)),
        }
    }
    types.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(Facts {
        path: path.to_owned(),
        context: context_of(&config, context),
        chat_template: g.string("tokenizer.chat_template").map(str::to_owned),
        weight_bytes,
        types,
        tokenizer,
        config,
    })
}

/// The context a model is loaded with: the one asked for, else the
/// model's own, at most 8192.
fn context_of(cfg: &Config, asked: Option<usize>) -> usize {
    asked.unwrap_or(cfg.n_ctx_train.min(8192)).max(16)
}

/// The K/V cache type of a model: the one asked for, which a block type's
/// blocks of 32 must fit (every head's size a multiple of 32); else f16
/// unless the whole context's f16 cache would take more than a quarter of
/// the machine's memory, then Q8_0 if that fits, else Q4_0 (`kv::choose`).
fn kv_policy(cfg: &Config, context: usize, asked: Option<KvType>) -> Result<KvType> {
    let blocks_fit = cfg.head_dim.is_multiple_of(crate::kv::QK);
    let per_position = cfg.n_layer * 2 * cfg.n_kv * cfg.head_dim;
    match asked {
        Some(t) if t.is_quantized() && cfg.arch.is_encoder() => Err(Error::new(
            ErrorKind::Input,
            format!(
                "{} is an encoder, which keeps no K/V cache: drop --kv-type {t}",
                cfg.arch_name
            ),
        )),
        Some(t) if t.is_quantized() && !blocks_fit => Err(Error::new(
            ErrorKind::Input,
            format!(
                "a {t} K/V cache needs heads whose size is a multiple of 32; {} has {}: use f16",
                cfg.arch_name, cfg.head_dim
            ),
        )),
        Some(t) => Ok(t),
        None if !blocks_fit || cfg.arch.is_encoder() => Ok(KvType::F16),
        None => {
            Ok(crate::kv::choose(context, per_position, memory_total().map_or(u64::MAX, |m| m / 4)))
        }
    }
}

/// The machine's memory in bytes (`MemTotal` of `/proc/meminfo`), where
/// the system says.
fn memory_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Which forward pass runs the model.
#[derive(Debug)]
enum Backend {
    /// This crate's CPU path (`model`, `kernels`).
    Fast(Model),
    /// candle's model code on a candle device (`candle_path`).
    Candle(CandleModel),
    /// An embedding model's encoder on this crate's CPU path (`encoder.rs`).
    Encoder(Box<Encoder>),
}

/// How llama-server lays out a reranker's input (`format_prompt_rerank`):
/// the file's `rerank` template with `{query}` and `{document}` filled in,
/// else `[BOS] query [EOS] [SEP] document [EOS]`, each special token where
/// the vocabulary adds it (EOS falling back to SEP).
#[derive(Debug, Clone, Default)]
struct RerankFormat {
    template: Option<String>,
    bos: Option<u32>,
    eos: Option<u32>,
    sep: Option<u32>,
}

/// A loaded model, ready to generate.
#[derive(Debug)]
pub struct Engine {
    backend: Backend,
    /// Whether some matrix's numbers depend on llama.cpp's grouping of
    /// columns and on the width of its products (`Route::grouped`,
    /// `Route::wide`); a flag no matrix depends on is not tracked.
    route: (bool, bool),
    /// Whether the model's numbers depend on its physical batches beyond
    /// `Route` (a mixture of experts, `Model::moe_batches`): a pass then
    /// holds one whole batch of each of its sequences, and a cached position
    /// is reused only from the batch a fresh run would compute it in
    /// (`Session::batches`).
    moe_batches: bool,
    /// Buffers of batched decode steps (a session's own serve it alone).
    batch: std::sync::Mutex<Scratch>,
    /// Buffers of an encoder's passes.
    encoder_scratch: std::sync::Mutex<crate::encoder::Scratch>,
    tok: Arc<Tok>,
    /// The grammar compiler over this vocabulary, built on first use.
    grammars: OnceLock<Arc<Grammars>>,
    /// Shared with a draft model loaded for this one (`Engine::load_draft`):
    /// the two never run at once, and one pool keeps idle workers of one
    /// from spinning while the other computes.
    pool: Arc<Pool>,
    info: ModelInfo,
    rerank: RerankFormat,
    /// A smaller model of the same vocabulary whose greedy tokens are the
    /// drafts verified in a decode step (`Engine::load_draft`); none:
    /// prompt lookup drafts.
    draft: Option<Box<Engine>>,
}

/// Per-conversation state: the tokens whose keys and values are cached.
///
/// INVARIANT: `modes[p]` is the path (llama.cpp's, see `kernels::attn::Route`:
/// attention path, and whether grouped with other columns) that computed
/// cached position `p`: a prompt's positions take the path llama.cpp takes
/// for that prompt, generated tokens the one-query, one-column path. The
/// paths give different numbers, so a position is reused only if a fresh
/// run of the new prompt would compute it the same way; positions from
/// decoding (or from a shorter prompt) are recomputed when the new prompt's
/// path differs. That keeps greedy output with reuse equal to output
/// without it.
#[derive(Debug, Default)]
pub struct Session {
    /// Names the session to a backend that keeps one shared cache (candle's);
    /// 0 until the first forward pass there.
    id: u64,
    tokens: Vec<u32>,
    modes: Vec<Route>,
    /// `batches[p]`: the positions of the physical batch (one pass) that
    /// computed cached position `p`, for models whose experts depend on it
    /// (`Engine::moe_batches`).
    batches: Vec<(usize, usize)>,
    kv: KvCache,
    scratch: Scratch,
    /// Rows of logits the last pass left in `scratch.logits`: one, or one
    /// per token of a speculative step's verification (`Seq::every_row`).
    logit_rows: usize,
    /// The draft model's cache of this conversation (`Engine::load_draft`).
    draft: Option<Box<DraftCache>>,
}

/// What a draft model has cached of a session's context: its tokens from
/// `start` on. Its numbers follow no path of llama.cpp's (a draft is only
/// a proposal, verified by the target's own rows), so it is kept and cut
/// by token prefix alone, not by `Session`'s INVARIANT.
#[derive(Debug, Default)]
struct DraftCache {
    start: usize,
    session: Session,
}

impl Session {
    /// The logits after the last token run (for tests and diagnostics).
    pub fn logits(&self) -> &[f32] {
        let l = &self.scratch.logits;
        &l[l.len() - l.len() / self.logit_rows.max(1)..]
    }

    /// Drops the cached positions from `len` on (rejected drafts).
    fn cut(&mut self, len: usize, cfg: &Config) {
        self.kv.truncate(len, cfg.head_dim);
        self.tokens.truncate(len);
        self.modes.truncate(len);
        self.batches.truncate(len);
    }

    /// Tokens currently cached.
    pub fn cached(&self) -> &[u32] {
        &self.tokens
    }

    /// Bytes of KV cache held.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How to pick tokens.
    pub sampling: Sampling,
    /// Extra token ids that end generation (the model's own are always on).
    pub stop_tokens: Vec<u32>,
    /// Strings that end generation; the text stops before them.
    pub stop_strings: Vec<String>,
    /// Token ids sampling may never pick.
    pub forbid: Vec<u32>,
    /// Prompt tokens processed per step (cancellation is checked between).
    pub chunk: usize,
    /// What the output must follow (see [`Constraint`]); none: free text.
    pub constraint: Option<Constraint>,
    /// Most tokens drafted per step by prompt lookup (0: none). Drafts are
    /// the tokens that followed the latest earlier occurrence of the
    /// context's last words (evidence being quoted); one pass verifies them
    /// and each is kept only if sampling picks it from its own row's logits,
    /// which are those of a plain decode step: the output never changes.
    /// Under a grammar the drafts are cut to the run it allows, and each
    /// row is masked as its decode step would be.
    pub speculate: usize,
}

impl Default for GenParams {
    fn default() -> GenParams {
        GenParams {
            max_tokens: 256,
            sampling: Sampling::default(),
            stop_tokens: Vec::new(),
            stop_strings: Vec::new(),
            forbid: Vec::new(),
            chunk: 128,
            constraint: None,
            speculate: SPECULATE,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// The cancel flag was raised.
    Cancelled,
}

impl Finish {
    /// `stop`, `length` or `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// What a generation produced.
#[derive(Debug, Clone)]
pub struct Output {
    /// Generated ids; the stop token that ended it is included.
    pub ids: Vec<u32>,
    /// The text delivered (stop strings excluded).
    pub text: String,
    /// Why it ended.
    pub finish: Finish,
    /// Which of [`GenParams::stop_strings`] ended it (its index), if one did.
    pub stop_string: Option<usize>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the cache instead of computed.
    pub reused_tokens: usize,
    /// Time spent on the prompt.
    pub prompt_time: Duration,
    /// Time from the start to the first generated token.
    pub first_token: Duration,
    /// Time spent generating after the prompt.
    pub gen_time: Duration,
    /// Tokens drafted by prompt lookup and verified (`GenParams::speculate`).
    pub drafted: usize,
    /// Of those, the ones sampling confirmed (they cost no pass of their own).
    pub accepted: usize,
}

impl Engine {
    /// Loads a GGUF model.
    pub fn load(path: &Path, opts: &EngineOptions) -> Result<Engine> {
        Engine::load_in(path, opts, None)
    }

    /// Loads `path` as this engine's draft model: from then on a decode
    /// step's drafts are its greedy tokens after the context (the last
    /// [`DRAFT_WINDOW`] tokens of it at most) instead of prompt lookup's,
    /// verified as those are — output never changes; a draft that sampling
    /// confirms spares a pass of this model. The draft runs on this
    /// engine's threads (one pool) and must have the same vocabulary, token
    /// for token; both must run on the CPU path.
    pub fn load_draft(&mut self, path: &Path) -> Result<()> {
        if !self.speculates() {
            return Err(Error::new(
                ErrorKind::Input,
                format!(
                    "{} cannot verify drafts (only the CPU path of a dense model can): load it without a draft model",
                    self.info.path.display()
                ),
            ));
        }
        let opts = EngineOptions {
            threads: Some(self.info.threads),
            device: Device::Cpu,
            context: Some(self.info.context),
            kv_type: None,
        };
        let draft = Engine::load_in(path, &opts, Some(Arc::clone(&self.pool)))?;
        if !matches!(draft.backend, Backend::Fast(_)) {
            return Err(Error::new(
                ErrorKind::Input,
                format!("draft model {}: it does not generate text", path.display()),
            ));
        }
        let (a, b) = (&*self.tok, &*draft.tok);
        let differs = (a.len() != b.len())
            .then_some(None)
            .or_else(|| (0..a.len() as u32).find(|&i| a.piece(i) != b.piece(i)).map(Some));
        if let Some(at) = differs {
            let what = match at {
                None => format!("{} tokens against {}", b.len(), a.len()),
                Some(i) => format!(
                    "token {i} is {:?} there and {:?} here",
                    String::from_utf8_lossy(b.piece(i)),
                    String::from_utf8_lossy(a.piece(i))
                ),
            };
            return Err(Error::new(
                ErrorKind::Input,
                format!(
                    "draft model {} has another vocabulary than {} ({what}): a draft model must share the model's tokenizer (a smaller model of the same family)",
                    path.display(),
                    self.info.path.display()
                ),
            ));
        }
        self.draft = Some(Box::new(draft));
        Ok(())
    }

    /// The draft model, if one is loaded ([`Engine::load_draft`]).
    pub fn draft(&self) -> Option<&Engine> {
        self.draft.as_deref()
    }

    /// [`Engine::load`] on `pool` when one is given (a draft model's).
    fn load_in(path: &Path, opts: &EngineOptions, pool: Option<Arc<Pool>>) -> Result<Engine> {
        let device = match opts.device {
            Device::Auto if cfg!(feature = "cuda") && candle_core::utils::cuda_is_available() => {
                Device::Cuda(0)
            }
            Device::Auto if cfg!(feature = "metal") && candle_core::utils::metal_is_available() => {
                Device::Metal
            }
            Device::Auto => Device::Cpu,
            d => d,
        };
        // Fail on a missing device before reading hundreds of MB.
        let candle_device = match device {
            Device::Cpu => None,
            d => Some(crate::candle_path::device(d)?),
        };
        let mut g = Gguf::open(path)?;
        let tok = Tok::from_gguf(&g, path)?;
        let cfg = crate::model::Config::read(&g)?;
        if tok.len() > cfg.n_vocab {
            return Err(crate::error::model_err(format!(
                "tokenizer has {} tokens but the model only {}",
                tok.len(),
                cfg.n_vocab
            )));
        }
        let threads = opts
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
            .max(1);
        let name = |k: &str| g.u32(k).and_then(|id| tok_name(&g, id));
        let mut stop_tokens = Vec::new();
        for key in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            if let Some(id) = g.u32(key) {
                stop_tokens.push(id);
            }
        }
        for t in [
            "<|im_end|>",
            "<|eot_id|>",
            "<|end_of_text|>",
            "<|endoftext|>",
            "<end_of_turn>",
            "</s>",
        ] {
            if let Some(id) = tok.id_of(t) {
                if tok.is_control(id) && !stop_tokens.contains(&id) {
                    stop_tokens.push(id);
                }
            }
        }
        let chat_template = g.string("tokenizer.chat_template").map(str::to_owned);
        let (bos, eos) = (name("tokenizer.ggml.bos_token_id"), name("tokenizer.ggml.eos_token_id"));
        let rerank = {
            let sep = g.u32("tokenizer.ggml.seperator_token_id");
            // llama.cpp's defaults: WordPiece and SentencePiece add no EOS,
            // WordPiece adds SEP.
            let wpm = g.string("tokenizer.ggml.model") == Some("bert");
            let add_eos = g.bool("tokenizer.ggml.add_eos_token").unwrap_or(false);
            let add_sep = g.bool("tokenizer.ggml.add_sep_token").unwrap_or(wpm);
            RerankFormat {
                template: g.string("tokenizer.chat_template.rerank").map(str::to_owned),
                bos: tok.bos_to_add(),
                eos: add_eos.then(|| g.u32("tokenizer.ggml.eos_token_id").or(sep)).flatten(),
                sep: add_sep.then_some(sep).flatten(),
            }
        };
        // The vocabulary arrays (tens of MB as parsed values) are in the
        // tokenizer now; freeing them before the weights are read keeps
        // them out of peak RSS.
        g.drop_vocab();
        let backend = match candle_device {
            None if cfg.arch.is_encoder() => {
                Backend::Encoder(Box::new(Encoder::load(&mut g, context_of(&cfg, opts.context))?))
            }
            None => Backend::Fast(Model::load(&mut g, context_of(&cfg, opts.context))?),
            Some(_) if cfg.arch.is_encoder() => {
                return Err(Error::new(
                    ErrorKind::Device,
                    format!(
                        "{} (an embedding model) runs on the CPU path only (--device cpu)",
                        cfg.arch_name
                    ),
                ))
            }
            Some(d) => {
                drop(g);
                if !cfg.rope.is_plain() {
                    // candle's model code reads `rope.freq_base` only.
                    return Err(Error::new(
                        ErrorKind::Device,
                        format!(
                            "RoPE scaling {} runs on the CPU path only (--device cpu): candle's model code computes plain RoPE",
                            cfg.rope_scaling(context_of(&cfg, opts.context))
                        ),
                    ));
                }
                Backend::Candle(CandleModel::load(path, cfg.arch, d)?)
            }
        };
        let mut backend = backend;
        let kv_type = kv_policy(&cfg, context_of(&cfg, opts.context), opts.kv_type)?;
        match &mut backend {
            Backend::Fast(m) => m.kv_type = kv_type,
            _ if kv_type.is_quantized() => {
                return Err(Error::new(
                    ErrorKind::Device,
                    format!("a {kv_type} K/V cache runs on the CPU path only (--device cpu)"),
                ))
            }
            _ => {}
        }
        let weight_bytes = match &backend {
            Backend::Fast(m) => m.bytes(),
            Backend::Candle(m) => m.bytes(),
            Backend::Encoder(m) => m.bytes(),
        };
        let (isa, kernels) = match &backend {
            Backend::Fast(m) => (crate::kernels::isa().as_str().to_owned(), m.kernels()),
            Backend::Candle(_) => (format!("candle {device}"), Vec::new()),
            Backend::Encoder(_) => (crate::kernels::isa().as_str().to_owned(), Vec::new()),
        };
        let info = ModelInfo {
            path: path.to_owned(),
            context: context_of(&cfg, opts.context),
            kv_type,
            chat_template,
            stop_tokens,
            bos,
            eos,
            weight_bytes,
            threads,
            isa,
            kernels,
            config: cfg,
        };
        let route = match &backend {
            Backend::Fast(m) => m.route_matters(),
            Backend::Candle(_) | Backend::Encoder(_) => (false, false),
        };
        let moe_batches = matches!(&backend, Backend::Fast(m) if m.moe_batches());
        Ok(Engine {
            backend,
            route,
            moe_batches,
            batch: Default::default(),
            encoder_scratch: Default::default(),
            tok: Arc::new(tok),
            grammars: OnceLock::new(),
            pool: pool.unwrap_or_else(|| Arc::new(Pool::new(threads))),
            info,
            rerank,
            draft: None,
        })
    }

    /// What is loaded.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tok {
        &self.tok
    }

    /// The grammar compiler and cache over this model's vocabulary (built
    /// on first use: the vocabulary's trie takes tens of milliseconds).
    pub fn grammars(&self) -> Result<Arc<Grammars>> {
        if let Some(g) = self.grammars.get() {
            return Ok(Arc::clone(g));
        }
        let g = Arc::new(Grammars::new(
            Arc::clone(&self.tok),
            self.info.config.n_vocab,
            &self.info.stop_tokens,
        )?);
        Ok(Arc::clone(self.grammars.get_or_init(|| g)))
    }

    /// Token ids of `text` (no BOS added).
    pub fn tokenize(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        self.tok.encode(text, parse_special)
    }

    /// Token ids of a whole prompt: BOS first when the model's file asks
    /// for it (and the text does not start with it already).
    pub fn tokenize_prompt(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        self.tok.encode_prompt(text, parse_special)
    }

    /// Runs `tokens` through the model after what `session` caches (no
    /// sampling): for benchmarks and warm-ups. Leaves the last logits.
    pub fn eval(&self, session: &mut Session, tokens: &[u32]) -> Result<()> {
        self.can_generate()?;
        if session.tokens.len() + tokens.len() >= self.info.context {
            return Err(Error::new(
                ErrorKind::Input,
                format!(
                    "{} more tokens do not fit: {} are cached and the context holds {}",
                    tokens.len(),
                    session.tokens.len(),
                    self.info.context
                ),
            ));
        }
        // As one llama.cpp decode call: physical batches of `UBATCH`.
        for part in tokens.chunks(UBATCH) {
            let at = session.tokens.len();
            let upto = thresholds(&(at..at + part.len()));
            self.step_one(session, part, self.attn_mode(part.len()), upto)?;
        }
        Ok(())
    }

    /// Forgets what `session` caches from position `len` on, so the next
    /// [`Engine::eval`] continues from there (benchmarks at a depth rewind
    /// instead of prefilling again). candle's shared cache cannot be cut:
    /// there the session is emptied unless `len` keeps all of it.
    pub fn rewind(&self, session: &mut Session, len: usize) {
        if matches!(self.backend, Backend::Candle(_)) && len < session.tokens.len() {
            *session = self.session();
            return;
        }
        let len = len.min(session.tokens.len());
        session.kv.truncate(len, self.info.config.head_dim);
        session.tokens.truncate(len);
        session.modes.truncate(len);
        session.batches.truncate(len);
    }

    /// Bytes of K/V cache one position takes (every layer's keys and
    /// values, in the cache's type).
    pub fn kv_bytes_per_token(&self) -> usize {
        let c = &self.info.config;
        self.info.kv_type.bytes(c.n_layer * 2 * c.n_kv * c.head_dim)
    }

    /// The attention path of a batch of `n` rows: llama.cpp's for the
    /// batch (`Mode::for_batch`), and its one-query path for every batch
    /// over a block-type cache.
    fn attn_mode(&self, n: usize) -> Mode {
        self.attn_path(Mode::for_batch(n))
    }

    /// `f16`, the path an f16 cache takes, as this engine's cache takes it
    /// (a block-type cache has the one-query path alone).
    fn attn_path(&self, f16: Mode) -> Mode {
        if self.info.kv_type.is_quantized() {
            Mode::Vec
        } else {
            f16
        }
    }

    /// The embedding of `tokens` (one input: see [`Engine::embed_text`]):
    /// every token's hidden state after the output norm, pooled as
    /// `pooling` says (else as the file says, else the mean) and normalized
    /// as llama.cpp's `llama-embedding` does by default (`embed.rs`). A
    /// decoder's input runs from an empty cache in llama.cpp's physical
    /// batches of [`UBATCH`], every token an output row; an encoder's in one
    /// pass (`encoder.rs`). CPU path only.
    pub fn embed(&self, tokens: &[u32], pooling: Option<Pooling>) -> Result<Embedding> {
        let pooling = self.pooling(pooling)?;
        self.check_input(tokens)?;
        let m = match &self.backend {
            Backend::Fast(m) => m,
            Backend::Encoder(_) => {
                let mut one = self.embed_many(&[tokens], Some(pooling))?;
                return one.pop().ok_or_else(|| Error::new(ErrorKind::Input, "no input"));
            }
            Backend::Candle(_) => {
                return Err(Error::new(
                    ErrorKind::Device,
                    "embeddings run on the CPU path only (--device cpu)",
                ))
            }
        };
        let d = self.info.config.n_embd;
        let mut pooler = Pooler::new(pooling, d, tokens.len());
        let (mut kv, mut scratch) = (KvCache::default(), Scratch::default());
        scratch.all_rows = true;
        let prompt = Prompt::new(tokens.len(), false);
        let mut at = 0;
        while at < tokens.len() {
            let b = prompt.batch(at);
            let n = b.len();
            let (gu, wu) = self.mask(thresholds(&b));
            let part = &tokens[b.clone()];
            m.forward(&self.pool, part, Mode::for_batch(n), gu, wu, &mut kv, &mut scratch)?;
            pooler.add(&scratch.hidden[..n * d]);
            at = b.end;
        }
        Ok(Embedding { vector: pooler.finish(), tokens: tokens.len(), pooling })
    }

    /// [`Engine::embed`] of each of `inputs`, the same vectors: an
    /// encoder runs several inputs in one pass (up to [`ENCODER_BATCH`]
    /// tokens, each attending only to itself), so the matrices are read once
    /// for all of them; a decoder embeds them one after another.
    pub fn embed_many(
        &self,
        inputs: &[&[u32]],
        pooling: Option<Pooling>,
    ) -> Result<Vec<Embedding>> {
        let Backend::Encoder(e) = &self.backend else {
            return inputs.iter().map(|t| self.embed(t, pooling)).collect();
        };
        let pooling = self.pooling(pooling)?;
        let d = self.info.config.n_embd;
        let mut out = Vec::with_capacity(inputs.len());
        self.encode(e, inputs, |t, rows| {
            let mut pooler = Pooler::new(pooling, d, t.len());
            pooler.add(rows);
            out.push(Embedding { vector: pooler.finish(), tokens: t.len(), pooling });
            Ok(())
        })?;
        Ok(out)
    }

    /// The pooling an embedding takes: the one asked for, else the file's,
    /// else the mean; a reranker's `rank` is refused (it scores, it does not
    /// embed: [`Engine::rerank`]).
    fn pooling(&self, asked: Option<Pooling>) -> Result<Pooling> {
        let pooling = asked.or(self.info.config.pooling).unwrap_or(Pooling::Mean);
        if pooling == Pooling::Rank {
            return Err(Error::new(
                ErrorKind::Input,
                format!(
                    "{} is a reranker (its file pools by `rank`): it scores a query against documents (POST /v1/rerank), or embeds with a pooling asked for (mean, cls, last)",
                    self.info.path.display()
                ),
            ));
        }
        Ok(pooling)
    }

    /// Refuses an input that has no embedding (empty) or does not fit.
    fn check_input(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::new(ErrorKind::Input, "an empty input has no embedding"));
        }
        if tokens.len() > self.info.context {
            return Err(Error::new(
                ErrorKind::Input,
                format!(
                    "an input of {} tokens does not fit the context of {} (load the model with a larger context, or split the input)",
                    tokens.len(),
                    self.info.context
                ),
            ));
        }
        Ok(())
    }

    /// Runs `inputs` through the encoder `e` in passes of whole inputs (up
    /// to [`ENCODER_BATCH`] tokens, at least one input), handing each input
    /// and its tokens' final states to `each`, in order.
    fn encode(
        &self,
        e: &Encoder,
        inputs: &[&[u32]],
        mut each: impl FnMut(&[u32], &[f32]) -> Result<()>,
    ) -> Result<()> {
        inputs.iter().try_for_each(|t| self.check_input(t))?;
        let d = self.info.config.n_embd;
        let mut rows = Vec::new();
        let mut at = 0;
        while at < inputs.len() {
            let mut end = at + 1;
            let mut total = inputs[at].len();
            while end < inputs.len() && total + inputs[end].len() <= ENCODER_BATCH {
                total += inputs[end].len();
                end += 1;
            }
            {
                // The buffers of the last pass, reused (each pass sets
                // what it reads).
                let mut s = self.encoder_scratch.lock().unwrap_or_else(|p| p.into_inner());
                e.forward(&self.pool, &inputs[at..end], &mut s, &mut rows)?;
            }
            let mut row = 0;
            for t in &inputs[at..end] {
                each(t, &rows[row * d..(row + t.len()) * d])?;
                row += t.len();
            }
            at = end;
        }
        Ok(())
    }

    /// Whether the model is a reranker: an encoder with a classification
    /// head (`POST /v1/rerank`).
    pub fn reranks(&self) -> bool {
        matches!(&self.backend, Backend::Encoder(e) if e.has_head())
    }

    /// Whether the model generates text (an embedding model does not).
    pub fn is_generative(&self) -> bool {
        !matches!(self.backend, Backend::Encoder(_))
    }

    /// `Ok` when the model generates text; else an input error that says
    /// what the model is for (an embedding model embeds).
    pub fn can_generate(&self) -> Result<()> {
        if self.is_generative() {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Input,
            format!(
                "{} is an embedding model ({}): it embeds text (`agentd embed`, POST /v1/embeddings{}) and does not generate",
                self.info.path.display(),
                self.info.config.arch_name,
                if self.reranks() { ", POST /v1/rerank" } else { "" }
            ),
        ))
    }

    /// The tokens llama-server scores for `query` and `document` on a
    /// reranker (its `format_prompt_rerank`; see [`RerankFormat`]). The
    /// texts are read as text, never as control tokens.
    pub fn rerank_tokens(&self, query: &str, document: &str) -> Result<Vec<u32>> {
        let f = &self.rerank;
        let text = |t: &str| self.tok.encode(t, false);
        if let Some(tpl) = &f.template {
            // The template's own markup is parsed for special tokens; the
            // query and document are text.
            let mut out = Vec::new();
            let mut rest = tpl.as_str();
            while !rest.is_empty() {
                let q = rest.find("{query}");
                let d = rest.find("{document}");
                let (at, len, fill) = match (q, d) {
                    (Some(q), Some(d)) if q < d => (q, 7, query),
                    (Some(q), None) => (q, 7, query),
                    (_, Some(d)) => (d, 10, document),
                    (None, None) => (rest.len(), 0, ""),
                };
                out.extend(self.tok.encode(&rest[..at], true)?);
                if len > 0 {
                    out.extend(text(fill)?);
                }
                rest = &rest[at + len..];
            }
            return Ok(out);
        }
        let mut out = Vec::new();
        out.extend(f.bos);
        out.extend(text(query)?);
        out.extend(f.eos);
        out.extend(f.sep);
        out.extend(text(document)?);
        out.extend(f.eos);
        Ok(out)
    }

    /// A reranker's relevance score for each of `inputs` (from
    /// [`Engine::rerank_tokens`]): its classification head over the first
    /// token's final state, as llama-server's `/v1/rerank` reports it (no
    /// sigmoid). The inputs run together as [`Engine::embed_many`]'s do.
    pub fn rerank(&self, inputs: &[&[u32]]) -> Result<Vec<f32>> {
        let Backend::Encoder(e) = &self.backend else {
            return Err(Error::new(
                ErrorKind::Input,
                format!("{} is not a reranker (no classification head)", self.info.path.display()),
            ));
        };
        let d = self.info.config.n_embd;
        let mut out = Vec::with_capacity(inputs.len());
        self.encode(e, inputs, |_, rows| {
            out.push(e.score(&rows[..d])?);
            Ok(())
        })?;
        Ok(out)
    }

    /// The embedding of `text`, tokenized as llama.cpp's embedding tools
    /// tokenize an input (BOS where the file asks for it), with control
    /// tokens written in it read as text: [`Engine::embed`].
    pub fn embed_text(&self, text: &str, pooling: Option<Pooling>) -> Result<Embedding> {
        let tokens = self.tokenize_prompt(text, false)?;
        self.embed(&tokens, pooling)
    }

    /// Runs `part` after what `session` caches, by attention path `mode`
    /// (the fast path's; candle has one path) with its positions below
    /// `upto.0` grouped and below `upto.1` wide (`Route`), and records it as
    /// cached.
    fn step_one(
        &self,
        session: &mut Session,
        part: &[u32],
        mode: Mode,
        upto: (usize, usize),
    ) -> Result<()> {
        let (gu, wu) = self.mask(upto);
        let start = session.tokens.len();
        match &self.backend {
            Backend::Fast(m) => {
                m.forward(&self.pool, part, mode, gu, wu, &mut session.kv, &mut session.scratch)?
            }
            Backend::Candle(m) => {
                if session.id == 0 {
                    session.id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
                }
                m.forward(session.id, &session.tokens, part, &mut session.scratch.logits)?
            }
            Backend::Encoder(_) => self.can_generate()?,
        }
        session.tokens.extend_from_slice(part);
        session.logit_rows = 1;
        session.batches.extend((start..start + part.len()).map(|_| (start, start + part.len())));
        session.modes.extend((start..start + part.len()).map(|p| Route {
            attn: mode,
            grouped: p < gu,
            wide: p < wu,
        }));
        Ok(())
    }

    /// The physical batches llama.cpp evaluates a prompt of `len` tokens in
    /// from an empty cache: the server's, which end a batch before the
    /// prompt's end on a model with sliding-window layers (`Prompt`).
    fn prompt(&self, len: usize) -> Prompt {
        Prompt::new(len, self.info.config.swa.is_some())
    }

    /// The route thresholds `upto` with the flags no matrix of this model
    /// depends on cleared (so they never block the reuse of a prefix).
    fn mask(&self, upto: (usize, usize)) -> (usize, usize) {
        (if self.route.0 { upto.0 } else { 0 }, if self.route.1 { upto.1 } else { 0 })
    }

    /// A fresh session.
    pub fn session(&self) -> Session {
        Session::default()
    }

    /// Prefills `prompt` into `session` (reusing what it already caches)
    /// and generates, calling `on_text` with each text delta. `cancel` is
    /// checked between tokens and between prompt chunks.
    pub fn generate(
        &self,
        session: &mut Session,
        prompt: &[u32],
        params: &GenParams,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Output> {
        let mut gen = self.begin(session, prompt, params)?;
        while !gen.is_done() {
            self.step(&mut [Step { session, gen: &mut gen, cancel, on_text }])?;
        }
        Ok(self.end(gen, on_text))
    }

    /// Starts a generation of `prompt` in `session`, reusing what the
    /// session already caches; the rest is prefilled by the first steps, a
    /// chunk (`params.chunk` tokens) per step. Drive it with
    /// [`Engine::step`] until [`Generation::is_done`], then [`Engine::end`].
    /// Generations of different sessions may share steps.
    pub fn begin(
        &self,
        session: &mut Session,
        prompt: &[u32],
        params: &GenParams,
    ) -> Result<Generation> {
        let t0 = Instant::now();
        self.can_generate()?;
        let cfg = &self.info.config;
        if prompt.is_empty() {
            return Err(Error::new(ErrorKind::Input, "the prompt is empty"));
        }
        if prompt.len() >= self.info.context {
            return Err(Error::new(
                ErrorKind::Input,
                format!(
                    "the prompt has {} tokens but the context holds {}: shorten the input or raise the context",
                    prompt.len(),
                    self.info.context
                ),
            ));
        }
        // Reuse the cached prefix that a fresh run of `prompt` would compute
        // alike: same tokens, each by the attention path the prompt gives its
        // position (Session's INVARIANT). At least one token must run for
        // logits.
        let fresh = self.prompt(prompt.len());
        let plan = |p: usize| {
            let r = fresh.route(p);
            let attn = self.attn_path(r.attn);
            Route { attn, grouped: r.grouped && self.route.0, wide: r.wide && self.route.1 }
        };
        // A mixture's position also needs the batch a fresh run gives it
        // (`Prompt::batch`), and is reused only with all of that batch
        // before it.
        let batch = |p: usize| {
            let b = fresh.batch(p);
            (b.start, b.end)
        };
        let same_batch = |p: usize| !self.moe_batches || session.batches.get(p) == Some(&batch(p));
        let reuse = match &self.backend {
            Backend::Fast(_) => (session.tokens.iter().zip(&session.modes).zip(prompt).enumerate())
                .take_while(|&(p, ((a, m), b))| a == b && *m == plan(p) && same_batch(p))
                .count()
                .min(prompt.len() - 1)
                .min(session.kv.len()),
            // candle's cache cannot be cut: it continues only a prompt that
            // extends all of it.
            Backend::Encoder(_) => 0,
            Backend::Candle(_) => {
                if prompt.len() > session.tokens.len() && prompt.starts_with(&session.tokens) {
                    session.tokens.len()
                } else {
                    0
                }
            }
        };
        let reuse = if self.moe_batches { reuse.min(batch(reuse).0) } else { reuse };
        session.cut(reuse, cfg);
        let mut banned = vec![false; cfg.n_vocab];
        for &f in &params.forbid {
            if let Some(b) = banned.get_mut(f as usize) {
                *b = true;
            }
        }
        Ok(Generation {
            out: Output {
                ids: Vec::new(),
                text: String::new(),
                finish: Finish::Stop,
                stop_string: None,
                prompt_tokens: prompt.len(),
                reused_tokens: reuse,
                prompt_time: Duration::ZERO,
                first_token: Duration::ZERO,
                gen_time: Duration::ZERO,
                drafted: 0,
                accepted: 0,
            },
            stops: self.info.stop_tokens.iter().chain(&params.stop_tokens).copied().collect(),
            banned,
            rng: Rng::new(params.sampling.seed),
            guide: params.constraint.as_ref().map(Guide::new),
            free_from: 0,
            started: false,
            text: TextStream::new(params.stop_strings.clone()),
            forced: Vec::new(),
            drafts: Vec::new(),
            speculate: if self.speculates() { params.speculate } else { 0 },
            spec_paused: false,
            drafter: Drafter::default(),
            params: params.clone(),
            prompt: prompt.to_vec(),
            at: reuse,
            t0,
            t1: t0,
            done: false,
        })
    }

    /// Advances every generation that is not done: one prompt chunk for a
    /// generation still prefilling, else one token (sampled from its
    /// session's logits, its text delivered). All of them then run through
    /// the model in one pass, so the weights are read once for the whole
    /// batch. A generation's tokens are the same whether it steps alone or
    /// with others. An error fails the whole step.
    pub fn step(&self, items: &mut [Step<'_>]) -> Result<()> {
        let mut go: Vec<Run> = Vec::with_capacity(items.len());
        for (k, it) in items.iter_mut().enumerate() {
            let (g, session) = (&mut *it.gen, &mut *it.session);
            if g.done {
                continue;
            }
            if it.cancel.load(Ordering::Relaxed) {
                g.out.finish = Finish::Cancelled;
                g.done = true;
                if g.at < g.prompt.len() {
                    g.out.prompt_time = g.t0.elapsed();
                    g.t1 = Instant::now();
                }
                continue;
            }
            if g.at < g.prompt.len() {
                // A chunk lies within one of the physical batches llama.cpp
                // evaluates the prompt in (`Prompt`), whose path it takes.
                // A mixture runs whole batches (`moe_batches`): cancellation
                // waits for one.
                let b = self.prompt(g.prompt.len()).batch(g.at);
                let n = b.len();
                let end =
                    if self.moe_batches { b.end } else { b.end.min(g.at + g.params.chunk.max(1)) };
                let upto = thresholds(&b);
                let tokens = g.prompt[g.at..end].to_vec();
                go.push(Run::new(k, tokens, self.attn_mode(n), upto, Some(end)));
                continue;
            }
            if let Some(r) = self.decode(k, g, session, it.on_text) {
                go.push(r);
            }
        }
        let rows = go.iter().any(|r| r.every_row);
        match (&self.backend, go.len()) {
            (_, 0) => {}
            (Backend::Fast(m), n) if n > 1 || rows => {
                let tokens: Vec<u32> = go.iter().flat_map(|r| r.tokens.iter().copied()).collect();
                let mut seqs = Vec::with_capacity(n);
                let mut want = go.iter().peekable();
                for (k, it) in items.iter_mut().enumerate() {
                    if let Some(r) = want.next_if(|r| r.item == k) {
                        let session = &mut *it.session;
                        let (gu, wu) = self.mask(r.upto);
                        seqs.push(Seq {
                            kv: &mut session.kv,
                            n: r.tokens.len(),
                            mode: r.mode,
                            grouped_upto: gu,
                            wide_upto: wu,
                            every_row: r.every_row,
                            logits: &mut session.scratch.logits,
                        });
                    }
                }
                let mut scratch = self.batch.lock().unwrap_or_else(|p| p.into_inner());
                m.forward_seqs(&self.pool, &tokens, &mut seqs, &mut scratch)?;
                drop(seqs);
                for r in &go {
                    let session = &mut *items[r.item].session;
                    let start = session.tokens.len();
                    let (gu, wu) = self.mask(r.upto);
                    let n = r.tokens.len();
                    session.tokens.extend_from_slice(&r.tokens);
                    session.logit_rows = if r.every_row { n } else { 1 };
                    // A verified row is computed as a decode step of its own.
                    session.batches.extend((start..start + n).map(|p| match r.every_row {
                        true => (p, p + 1),
                        false => (start, start + n),
                    }));
                    session.modes.extend((start..start + n).map(|p| Route {
                        attn: r.mode,
                        grouped: p < gu,
                        wide: p < wu,
                    }));
                }
            }
            _ => {
                for r in &go {
                    self.step_one(items[r.item].session, &r.tokens, r.mode, r.upto)?;
                }
            }
        }
        for r in go {
            if let Some(end) = r.end {
                let g = &mut *items[r.item].gen;
                g.at = end;
                if end == g.prompt.len() {
                    g.out.prompt_time = g.t0.elapsed();
                    g.t1 = Instant::now();
                }
            }
        }
        Ok(())
    }

    /// Whether drafts can be verified in one pass with each row's numbers
    /// those of a decode step: the fast path, and no mixture whose numbers
    /// depend on its batches.
    fn speculates(&self) -> bool {
        matches!(self.backend, Backend::Fast(_)) && !self.moe_batches
    }

    /// One decode step of generation `g` (item `k` of the step), prefill
    /// done: takes the token(s) its session's logits give (each row of a
    /// verified draft in turn, as many as sampling confirms, then one more),
    /// delivers them, and returns what runs next, drafts included; `None`
    /// when it is done.
    fn decode(
        &self,
        k: usize,
        g: &mut Generation,
        session: &mut Session,
        on_text: &mut dyn FnMut(&str),
    ) -> Option<Run> {
        let cfg = &self.info.config;
        let mut drafts = std::mem::take(&mut g.drafts);
        if session.logit_rows != drafts.len() + 1 || !session.tokens.ends_with(&drafts) {
            // The pass that was to verify them did not complete (it failed):
            // nothing of theirs is there to take.
            drafts.clear();
        }
        // The drafts are cached after `base` positions; row j of the logits
        // follows position base - 1 + j.
        let base = session.tokens.len() - drafts.len();
        let rows = drafts.len() + 1;
        let mut logits = std::mem::take(&mut session.scratch.logits);
        let vocab = logits.len() / rows;
        let mut run = Vec::new();
        // Rows consumed: drafts confirmed so far.
        let mut j = 0;
        loop {
            let at = base + j;
            let out = &mut g.out;
            if out.ids.len() >= g.params.max_tokens {
                out.finish = Finish::Length;
                g.done = true;
                break;
            }
            // Room for tokens this step: the limit and the context (a last
            // token is still delivered when the context is full).
            let room = (g.params.max_tokens - out.ids.len())
                .min(self.info.context.saturating_sub(at + 1).max(1));
            if !g.started {
                g.started = true;
                // Text the grammar fixes before any choice: no sampling.
                if let Some(guide) = g.guide.as_mut() {
                    run = guide.initial(room.min(MAX_FF));
                }
            }
            // Tokens the caller forced (`Generation::force`): written, not
            // sampled.
            if run.is_empty() && !g.forced.is_empty() {
                let n = g.forced.len().min(room);
                run = g.forced.drain(..n).collect();
            }
            let governed = g.guide.as_ref().is_some_and(Guide::engaged);
            let mut grammar_done = false;
            let mut confirmed = false;
            if run.is_empty() {
                let row = &mut logits[j * vocab..(j + 1) * vocab];
                if let Some(guide) = g.guide.as_mut() {
                    if !guide.mask(row, room) {
                        // Nothing is allowed: the constraint cannot go on.
                        out.finish = Finish::Stop;
                        g.done = true;
                        break;
                    }
                }
                // The penalties look at the session's last tokens, prompt
                // included; the n-gram rule at the output since the last
                // grammar-governed span, and at nothing while one governs.
                let recent =
                    &session.tokens[at.saturating_sub(g.params.sampling.repeat_last_n)..at];
                let free = if governed { &[][..] } else { &out.ids[g.free_from..] };
                let id = sample(row, &g.params.sampling, recent, free, &g.banned, &mut g.rng);
                run.push(id);
                if let Some(guide) = g.guide.as_mut() {
                    match guide.commit(id, self.tok.piece(id), (room - 1).min(MAX_FF)) {
                        Commit::Go(ff) => run.extend(ff),
                        Commit::Done(ff) => {
                            run.extend(ff);
                            grammar_done = true;
                        }
                    }
                }
                // Confirmed: the drafts hold what runs next (a grammar's
                // forced tokens after the sampled one included), so it is
                // cached already and its rows of logits are there.
                confirmed = drafts.get(j..).is_some_and(|d| d.starts_with(&run));
            }
            if out.ids.is_empty() {
                out.first_token = g.t0.elapsed();
            }
            let mut ended = false;
            for &id in &run {
                out.ids.push(id);
                if g.stops.contains(&id) || g.text.push(self.tok.piece(id), on_text) {
                    ended = true;
                    break;
                }
            }
            if governed || grammar_done || g.guide.as_ref().is_some_and(Guide::engaged) {
                // A grammar governed these tokens (or engaged on them): the
                // free text starts after them.
                g.free_from = out.ids.len();
            }
            if ended || grammar_done {
                out.finish = Finish::Stop;
                g.done = true;
                break;
            }
            if at + run.len() >= self.info.context {
                out.finish = Finish::Length;
                g.done = true;
                break;
            }
            if !confirmed {
                break;
            }
            // The drafts are the tokens sampling picked (and the grammar
            // forced after it): already cached, and the next row's logits
            // follow them.
            out.accepted += run.len();
            j += run.len();
            run.clear();
        }
        g.drafter.verified(drafts.len(), j, g.speculate);
        session.cut(base + j, cfg);
        // Row j follows the last cached position: it alone stays.
        logits.copy_within(j * vocab..(j + 1) * vocab, 0);
        logits.truncate(vocab);
        session.scratch.logits = logits;
        session.logit_rows = 1;
        if g.done {
            return None;
        }
        if run.len() > 1 {
            // Forced tokens run together, as one short prompt chunk.
            let (at, n) = (session.tokens.len(), run.len());
            return Some(Run::new(k, run, self.attn_mode(n), thresholds(&(at..at + n)), None));
        }
        // Drafts: not past the limit or the context. Under a grammar
        // (quoted evidence) only the run of them the grammar allows after
        // the token about to run; each row is then masked as a decode
        // step's would be, so what sampling confirms is the same.
        let left = (g.params.max_tokens - g.out.ids.len())
            .min(self.info.context.saturating_sub(session.tokens.len() + 2));
        let spec = if g.speculate == 0 || g.spec_paused { 0 } else { g.drafter.next().min(left) };
        let mut tokens = run;
        if spec > 0 {
            // The context with the token about to run, without copying it.
            session.tokens.extend_from_slice(&tokens);
            g.drafts = match &self.draft {
                Some(d) => {
                    d.propose(&mut session.draft, &session.tokens, spec, &self.info.stop_tokens)
                }
                None => lookup(&session.tokens, spec),
            };
            session.tokens.truncate(session.tokens.len() - tokens.len());
            if let Some(guide) = g.guide.as_mut() {
                let ok = guide.allows(&g.drafts);
                g.drafts.truncate(ok);
            }
            g.out.drafted += g.drafts.len();
        }
        if g.drafts.is_empty() {
            return Some(Run::new(k, tokens, Mode::Vec, (0, 0), None));
        }
        tokens.extend_from_slice(&g.drafts);
        Some(Run { every_row: true, ..Run::new(k, tokens, Mode::Vec, (0, 0), None) })
    }

    /// Up to `max` greedy tokens of this (draft) model after `context`,
    /// ending at one of `stops`: its cache (`cache`, made on first use) is
    /// cut to what it shares with the context and the rest run; it sees the
    /// context from where its cache starts, a start moved to the last
    /// [`DRAFT_WINDOW`] tokens when more than that would run (or the cache
    /// would outgrow its context). None when a pass fails: drafts are only
    /// proposals.
    fn propose(
        &self,
        cache: &mut Option<Box<DraftCache>>,
        context: &[u32],
        max: usize,
        stops: &[u32],
    ) -> Vec<u32> {
        let c = cache.get_or_insert_with(Default::default);
        let seen = context.get(c.start..).unwrap_or(&[]);
        let mut common = c.session.tokens.iter().zip(seen).take_while(|(a, b)| a == b).count();
        if c.start >= context.len()
            || seen.len() - common > DRAFT_WINDOW
            || seen.len() + max >= self.info.context
        {
            c.start = context.len().saturating_sub(DRAFT_WINDOW);
            common = 0;
        }
        // At least the last token runs, for its logits.
        let common = common.min(context.len() - c.start - 1);
        self.rewind(&mut c.session, common);
        let mut out = Vec::with_capacity(max);
        if self.eval(&mut c.session, &context[c.start + common..]).is_err() {
            c.session = self.session();
            return out;
        }
        while out.len() < max {
            let id = crate::sampler::argmax(c.session.logits());
            out.push(id);
            if stops.contains(&id) || out.len() == max {
                break;
            }
            if self.eval(&mut c.session, &[id]).is_err() {
                c.session = self.session();
                break;
            }
        }
        out
    }

    /// Finishes a generation: releases text held back for stop strings and
    /// returns what it produced.
    pub fn end(&self, gen: Generation, on_text: &mut dyn FnMut(&str)) -> Output {
        let Generation { mut out, mut text, t1, .. } = gen;
        let stopped = out.finish == Finish::Stop && text.stopped;
        text.finish(stopped, on_text);
        out.stop_string = if stopped { text.stopped_by } else { None };
        out.text = text.delivered;
        out.gen_time = t1.elapsed();
        out
    }
}

/// What a step runs for one generation.
struct Run {
    /// Its index in the step's items.
    item: usize,
    tokens: Vec<u32>,
    /// Their attention path.
    mode: Mode,
    /// Positions below these are grouped, wide (`Route`).
    upto: (usize, usize),
    /// The prompt's end if this is a prompt chunk.
    end: Option<usize>,
    /// Logits of every token (a draft's verification), not the last alone.
    every_row: bool,
}

impl Run {
    fn new(
        item: usize,
        tokens: Vec<u32>,
        mode: Mode,
        upto: (usize, usize),
        end: Option<usize>,
    ) -> Run {
        Run { item, tokens, mode, upto, end, every_row: false }
    }
}

/// How many tokens a generation drafts next. A verified draft costs part of
/// a pass per token (its row of every product), so the length follows the
/// text: it doubles while drafts are confirmed whole, falls to what was
/// confirmed plus one at a miss, and after drafts rejected outright drafting
/// pauses for a number of steps that doubles with each such miss in a row
/// (free text that quotes nothing costs little).
#[derive(Debug, Clone, Copy)]
struct Drafter {
    len: usize,
    skip: usize,
    backoff: usize,
}

impl Default for Drafter {
    fn default() -> Drafter {
        Drafter { len: 4, skip: 0, backoff: 1 }
    }
}

/// The most steps drafting pauses after rejected drafts.
const MAX_BACKOFF: usize = 16;

impl Drafter {
    /// Tokens to draft this step (0 while paused).
    fn next(&mut self) -> usize {
        if self.skip > 0 {
            self.skip -= 1;
            return 0;
        }
        self.len
    }

    /// `accepted` of `drafted` tokens were confirmed; `max` bounds the length.
    fn verified(&mut self, drafted: usize, accepted: usize, max: usize) {
        if drafted == 0 {
            return;
        }
        if accepted == drafted {
            self.len = (self.len * 2).min(max).max(1);
            self.backoff = 1;
        } else if accepted == 0 {
            self.len = (self.len / 2).max(1);
            self.skip = self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        } else {
            self.len = (accepted + 1).min(max).max(1);
            self.backoff = 1;
        }
    }
}

/// Default of [`GenParams::speculate`].
pub const SPECULATE: usize = 8;

/// The most context tokens a draft model runs to catch up with a session
/// ([`Engine::load_draft`]): it sees the context from at most this far back
/// when it starts, so its prefill stays a fraction of the model's.
pub const DRAFT_WINDOW: usize = 1024;

/// Longest and shortest run of last tokens prompt lookup matches.
const LOOKUP_MAX: usize = 4;
const LOOKUP_MIN: usize = 3;

/// Prompt-lookup drafts: the tokens (at most `max`) that followed the latest
/// earlier occurrence of `history`'s last `LOOKUP_MAX` tokens, else of
/// fewer, down to `LOOKUP_MIN`; none if no such run recurs.
fn lookup(history: &[u32], max: usize) -> Vec<u32> {
    let len = history.len();
    for n in (LOOKUP_MIN..=LOOKUP_MAX.min(len.saturating_sub(1))).rev() {
        let tail = &history[len - n..];
        // Latest first: an occurrence ending before the tail's last token.
        if let Some(i) = (0..len - n).rev().find(|&i| &history[i..i + n] == tail) {
            let from = i + n;
            return history[from..(from + max).min(len)].to_vec();
        }
    }
    Vec::new()
}

/// A generation in progress: see [`Engine::begin`].
#[derive(Debug)]
pub struct Generation {
    params: GenParams,
    /// The prompt, and how much of it is in the session (prefill runs in
    /// steps, a chunk at a time, until `at` reaches its end).
    prompt: Vec<u32>,
    at: usize,
    out: Output,
    banned: Vec<bool>,
    stops: Vec<u32>,
    rng: Rng,
    /// The constraint in progress.
    guide: Option<Guide>,
    /// Where the output the n-gram rule looks at starts: after the last
    /// token a grammar governed.
    free_from: usize,
    /// Whether decoding has begun (forced opening tokens are taken then).
    started: bool,
    text: TextStream,
    t0: Instant,
    t1: Instant,
    done: bool,
    /// Tokens to write next instead of sampling them.
    forced: Vec<u32>,
    /// Drafts the last pass verified: the session caches them, and its
    /// logits hold a row for each after the row of the token before them.
    drafts: Vec<u32>,
    /// Most tokens drafted per step now (`GenParams::speculate`, 0 where the
    /// model cannot verify drafts).
    speculate: usize,
    /// The caller paused speculation (`Generation::set_speculation`).
    spec_paused: bool,
    /// How many tokens to draft next.
    drafter: Drafter,
}

impl Generation {
    /// Queues `ids` to be written next instead of sampled (the caller's
    /// decision, e.g. closing a reasoning block whose budget is spent);
    /// they reach the output and the text like sampled ones. While a
    /// grammar governs nothing is forced: it decides every token there (a
    /// lazy one that has not engaged does not see the forced tokens).
    pub fn force(&mut self, ids: &[u32]) {
        if !self.constrained() && !self.done {
            self.forced.extend_from_slice(ids);
        }
    }

    /// Pauses (`false`) or resumes speculation: a caller that decides
    /// something after each token (a reasoning budget counted in steps)
    /// pauses it, so every step delivers one token. Resuming never exceeds
    /// `GenParams::speculate`.
    pub fn set_speculation(&mut self, on: bool) {
        self.spec_paused = !on;
    }

    /// Whether it has finished (stop, length or cancelled).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.out.ids.len()
    }

    /// Token ids generated so far.
    pub fn ids(&self) -> &[u32] {
        &self.out.ids
    }

    /// Whether a grammar governs the next token (a [`Constraint::Grammar`],
    /// or a lazy one that its marker engaged).
    pub fn constrained(&self) -> bool {
        self.guide.as_ref().is_some_and(Guide::engaged)
    }
}

impl std::fmt::Debug for Step<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step").field("gen", &self.gen).finish_non_exhaustive()
    }
}

/// One generation's part in an [`Engine::step`].
pub struct Step<'a> {
    /// The session it generates into.
    pub session: &'a mut Session,
    /// The generation.
    pub gen: &'a mut Generation,
    /// Its cancel flag.
    pub cancel: &'a AtomicBool,
    /// Where its text deltas go.
    pub on_text: &'a mut dyn FnMut(&str),
}

fn tok_name(g: &Gguf, id: u32) -> Option<String> {
    g.strings("tokenizer.ggml.tokens").and_then(|t| t.get(id as usize).cloned())
}

/// Turns token bytes into text deltas: never splits a UTF-8 character and
/// holds back what could be the start of a stop string.
#[derive(Debug)]
struct TextStream {
    stops: Vec<String>,
    bytes: Vec<u8>,
    text: String,
    delivered: String,
    stopped: bool,
    /// The stop string that ended the text (its index in `stops`).
    stopped_by: Option<usize>,
}

impl TextStream {
    fn new(stops: Vec<String>) -> TextStream {
        TextStream {
            stops,
            bytes: Vec::new(),
            text: String::new(),
            delivered: String::new(),
            stopped: false,
            stopped_by: None,
        }
    }

    /// Adds a token's bytes; returns true when a stop string was reached.
    fn push(&mut self, piece: &[u8], on_text: &mut dyn FnMut(&str)) -> bool {
        self.bytes.extend_from_slice(piece);
        let valid = match std::str::from_utf8(&self.bytes) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(e) => {
                // Invalid bytes: replace them so the stream goes on.
                let upto = e.valid_up_to() + e.error_len().unwrap_or(1);
                let lossy = String::from_utf8_lossy(&self.bytes[..upto]).into_owned();
                self.text.push_str(&lossy);
                self.bytes.drain(..upto);
                return self.push(&[], on_text);
            }
        };
        if valid > 0 {
            let s = std::str::from_utf8(&self.bytes[..valid]).unwrap_or_default().to_owned();
            self.text.push_str(&s);
            self.bytes.drain(..valid);
        }
        let done = self.delivered.len();
        // A stop string may begin in held text (before `done` is not
        // possible: held text is never delivered).
        // The stop string that begins first (the first listed of those
        // that begin there).
        let mut stop_at: Option<(usize, usize)> = None;
        for (k, s) in self.stops.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
            if let Some(i) = self.text[done..].find(s.as_str()) {
                if stop_at.is_none_or(|(a, _)| done + i < a) {
                    stop_at = Some((done + i, k));
                }
            }
        }
        if let Some((at, k)) = stop_at {
            self.emit(at, on_text);
            self.stopped = true;
            self.stopped_by = Some(k);
            return true;
        }
        // Hold back the longest tail that could still grow into a stop string.
        let mut hold = 0;
        let pending = &self.text[done..];
        for s in &self.stops {
            for (k, _) in s.char_indices().skip(1) {
                if k <= pending.len() && pending.ends_with(&s[..k]) {
                    hold = hold.max(k);
                }
            }
        }
        self.emit(self.text.len() - hold, on_text);
        false
    }

    fn emit(&mut self, upto: usize, on_text: &mut dyn FnMut(&str)) {
        let done = self.delivered.len();
        if upto > done && self.text.is_char_boundary(upto) {
            let delta = self.text[done..upto].to_owned();
            on_text(&delta);
            self.delivered.push_str(&delta);
        }
    }

    /// Releases held text (unless a stop string ended the stream).
    fn finish(&mut self, stopped: bool, on_text: &mut dyn FnMut(&str)) {
        if !stopped {
            if !self.bytes.is_empty() {
                let rest = String::from_utf8_lossy(&self.bytes).into_owned();
                self.text.push_str(&rest);
                self.bytes.clear();
            }
            self.emit(self.text.len(), on_text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_drafts_what_followed_the_latest_match() {
        // [6, 7, 8] occurs at 1 and 6; the latest is followed by 9, 4, 6, 7, 8.
        let h = [1, 6, 7, 8, 2, 3, 6, 7, 8, 9, 4, 6, 7, 8];
        assert_eq!(lookup(&h, 3), vec![9, 4, 6]);
        assert_eq!(lookup(&h, 10), vec![9, 4, 6, 7, 8]);
        // The longest match wins over a later, shorter one: [4, 5, 6, 7]
        // occurs at 0, [5, 6, 7] also at 6.
        let h = [4, 5, 6, 7, 1, 9, 5, 6, 7, 2, 4, 5, 6, 7];
        assert_eq!(lookup(&h, 2), vec![1, 9]);
        // Two tokens are not a match (`LOOKUP_MIN`); nothing longer recurs.
        assert!(lookup(&[1, 2, 3, 9, 2, 3], 4).is_empty());
        assert!(lookup(&[], 4).is_empty());
        assert!(lookup(&[3], 4).is_empty());
    }

    #[test]
    fn the_draft_length_follows_what_is_confirmed() {
        let mut d = Drafter::default();
        assert_eq!(d.next(), 4);
        d.verified(4, 4, 8);
        assert_eq!(d.next(), 8);
        d.verified(8, 8, 8);
        assert_eq!(d.next(), 8, "bounded by the most");
        d.verified(8, 2, 8);
        assert_eq!(d.next(), 3, "what was confirmed, plus one");
        // Rejected outright: a pause of 1 step, then 2, then 4 …
        d.verified(3, 0, 8);
        assert_eq!((d.next(), d.next()), (0, 1));
        d.verified(1, 0, 8);
        assert_eq!((d.next(), d.next(), d.next()), (0, 0, 1));
        d.verified(1, 1, 8);
        assert_eq!(d.next(), 2);
        d.verified(0, 0, 8);
        assert_eq!(d.next(), 2, "no draft, no change");
    }

    fn run(pieces: &[&[u8]], stops: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut ts = TextStream::new(stops);
        let mut out = Vec::new();
        let mut stopped = false;
        for p in pieces {
            if ts.push(p, &mut |d| out.push(d.to_owned())) {
                stopped = true;
                break;
            }
        }
        ts.finish(stopped, &mut |d| out.push(d.to_owned()));
        (out, stopped)
    }

    #[test]
    fn utf8_is_never_split() {
        let e = "é".as_bytes();
        let (out, _) = run(&[b"a", &e[..1], &e[1..], b"b"], &[]);
        assert_eq!(out, ["a", "é", "b"]);
    }

    #[test]
    fn stop_strings_are_held_back_and_cut() {
        let (out, stopped) = run(&[b"Hello <", b"|im", b"_end|> more"], &["<|im_end|>"]);
        assert!(stopped);
        assert_eq!(out.concat(), "Hello ");
        let (out, stopped) = run(&[b"a <", b"b"], &["<|x"]);
        assert!(!stopped);
        assert_eq!(out.concat(), "a <b");
        let e = "É".as_bytes();
        let (out, stopped) = run(
            &[b"L'", &e[..1], &e[1..], b"toile \xc3", b"\xa9"],
            &["\u{e9}t\u{e9}", "<|im_end|>"],
        );
        assert!(!stopped);
        assert_eq!(out.concat(), "L'Étoile é");
        let (out, stopped) = run(&[b"ab\xc3\xa9", b"t\xc3\xa9 z"], &["\u{e9}t\u{e9}"]);
        assert!(stopped);
        assert_eq!(out.concat(), "ab");
    }

    #[test]
    fn the_stop_string_that_begins_first_is_the_one_named() {
        let stops = ["END", "x E", "zz"].map(String::from).to_vec();
        let mut ts = TextStream::new(stops);
        assert!(!ts.push(b"ab x ", &mut |_| {}));
        assert!(ts.push(b"END", &mut |_| {}));
        // "x E" begins before "END": it is the one that stopped the text.
        assert_eq!(ts.stopped_by, Some(1));
        let mut ts = TextStream::new(["b", "ab"].map(String::from).to_vec());
        assert!(ts.push(b"cab", &mut |_| {}));
        assert_eq!(ts.stopped_by, Some(1));
    }
}
