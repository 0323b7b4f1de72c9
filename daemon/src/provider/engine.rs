//! The local engine as a batched backend (`Batch`): the loaded model, the
//! chat requests decoding together (one batched pass per token, each
//! getting exactly the tokens it would get alone), and what a request
//! failure or a panic does to them (that request fails; after an unwind
//! through the engine every request in the batch fails and the model is
//! loaded again). What admits requests, in which order and how many wait,
//! is the server's (`server/worker.rs`); the model's description for
//! listings is its [`Card`].

use super::build::EngineArgs;
use super::chat::{ChatMsg, ChatOutput, ChatParams, Sampling};
use super::local::{ChatRun, ChatStep, Local};
use super::{Provider, ProviderError, Research};
use crate::state::registry::SamplingKnobs;
use prompts::{Message, ToolDef};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// What the Ollama routes say about the model served (`/api/show`,
/// `/api/tags`, `/api/ps`), read once at start.
#[derive(Debug, Clone, Default)]
pub(crate) struct Card {
    pub(crate) path: std::path::PathBuf,
    pub(crate) arch: String,
    /// The chat template's source.
    pub(crate) template: String,
    /// Bytes of the file, and of the weights in memory.
    pub(crate) file_bytes: u64,
    pub(crate) weight_bytes: u64,
    /// `sha256:…`: the registry's checksum, else one of the path, size and
    /// modification time (it names the file, not its bytes).
    pub(crate) digest: String,
    pub(crate) parameters: u64,
    /// The GGUF tensor type most weights have (`Q4_1`).
    pub(crate) quantization: String,
    pub(crate) embedding: usize,
    /// An embedding model (an encoder: it embeds, it does not generate).
    pub(crate) encoder: bool,
    /// A reranker (its file pools by `rank`: `POST /v1/rerank`).
    pub(crate) reranker: bool,
    pub(crate) layers: usize,
    pub(crate) heads: (usize, usize),
    /// Fill-in-the-middle tokens (prefix, suffix, middle), when the
    /// vocabulary has them: what `suffix` in `/api/generate` needs.
    pub(crate) fim: Option<[String; 3]>,
    pub(crate) stop: Vec<String>,
    /// The model's sampling defaults (models.toml), under a request's knobs.
    pub(crate) sampling: SamplingKnobs,
    pub(crate) modified: Option<std::time::SystemTime>,
}

/// One input to embed: text (tokenized as llama.cpp's embedding tools do,
/// control tokens read as text) or token ids.
#[derive(Debug, Clone)]
pub(crate) enum EmbedInput {
    Text(String),
    Tokens(Vec<u32>),
    /// A reranker's input: its answer is an [`inference::Embedding`] whose
    /// one value is the score (pooling `rank`).
    Rerank {
        query: String,
        document: String,
    },
}

/// One chat request for the batch.
#[derive(Debug)]
pub(crate) struct ChatJob {
    pub(crate) messages: Vec<Message>,
    pub(crate) tools: Vec<ToolDef>,
    pub(crate) params: ChatParams,
    /// Stops this request (its client went away, or its caller stopped it).
    pub(crate) cancel: Arc<AtomicBool>,
    /// A second flag that stops it too: the research run it belongs to.
    pub(crate) run: Option<Arc<AtomicBool>>,
    pub(crate) tx: UnboundedSender<ChatMsg>,
    /// Kept until the request ends (the server's hold on its model).
    pub(crate) hold: Option<Box<dyn std::any::Any + Send>>,
}

/// A chat request decoding in the batch.
struct Active {
    run: ChatRun,
    cancel: Arc<AtomicBool>,
    also: Option<Arc<AtomicBool>>,
    tx: UnboundedSender<ChatMsg>,
    started: Instant,
    _hold: Option<Box<dyn std::any::Any + Send>>,
}

/// The loaded model and the requests decoding on it.
pub(crate) struct Batch {
    local: Local,
    active: Vec<Active>,
    /// Set when the model could not be loaded again after a panic: why
    /// every request now fails (shared with whoever reports health).
    broken: Arc<std::sync::Mutex<Option<String>>>,
    /// What loads the model again.
    args: EngineArgs,
    context_cap: usize,
    /// Most requests decoding at once.
    size: usize,
}

impl Batch {
    /// Loads the model `args` names, its context capped at `context_cap`,
    /// to decode up to `size` requests at once.
    pub(crate) fn load(
        args: &EngineArgs,
        context_cap: usize,
        size: usize,
    ) -> anyhow::Result<Batch> {
        let local = Local::load(args, args.tool_format.as_deref(), Some(context_cap))?;
        Ok(Batch {
            local,
            active: Vec::new(),
            broken: Arc::default(),
            args: args.clone(),
            context_cap,
            size: size.max(1),
        })
    }

    /// Where the batch reports that its model failed for good (`None`
    /// while it works): for `/health`.
    pub(crate) fn health(&self) -> Arc<std::sync::Mutex<Option<String>>> {
        Arc::clone(&self.broken)
    }

    /// Why every request fails, once the model failed for good.
    fn broken(&self) -> Option<String> {
        self.broken.lock().ok().and_then(|b| b.clone())
    }

    /// The model's description (`/api/show`, `/api/tags`, `/api/ps`).
    pub(crate) fn card(&self) -> Card {
        card(&self.local)
    }

    /// The model's name (registry name or file stem).
    pub(crate) fn name(&self) -> String {
        self.local.resolved.name.clone()
    }

    /// The model's context (tokens).
    pub(crate) fn context(&self) -> usize {
        self.local.engine.info().context
    }

    /// How research turns sample on this model.
    pub(crate) fn sampling(&self) -> Sampling {
        self.local.sampling.clone()
    }

    /// Who drives research with this model.
    pub(crate) fn research(&self) -> Research {
        self.local.research()
    }

    /// Requests decoding now.
    pub(crate) fn len(&self) -> usize {
        self.active.len()
    }

    /// Whether another request can join.
    pub(crate) fn has_room(&self) -> bool {
        self.active.len() < self.size
    }

    /// Prompt tokens of `messages` with `tools` (tokenizing reads the
    /// engine, never changes it).
    pub(crate) fn count(
        &self,
        messages: &[Message],
        tools: &[ToolDef],
    ) -> Result<usize, ProviderError> {
        if let Some(why) = self.broken() {
            return Err(ProviderError::Failed(why));
        }
        catch_unwind(AssertUnwindSafe(|| self.local.prompt_tokens(messages, tools)))
            .unwrap_or_else(|_| Err(ProviderError::Failed("internal error".into())))
    }

    /// The embeddings of `inputs` (`inference::Engine::embed_many`: the
    /// file's pooling, else the mean; each input's vector is the one it
    /// gets alone), or a reranker's scores of `Rerank` inputs. An input
    /// longer than the context is cut to it with `truncate`, else refused.
    pub(crate) fn embed(
        &self,
        inputs: &[EmbedInput],
        truncate: bool,
    ) -> Result<Vec<inference::Embedding>, ProviderError> {
        if let Some(why) = self.broken() {
            return Err(ProviderError::Failed(why));
        }
        let engine = &self.local.engine;
        let limit = engine.info().context;
        let fail = |e: inference::Error| match e.kind() {
            inference::ErrorKind::Input => ProviderError::Invalid(e.to_string()),
            _ => ProviderError::Failed(e.to_string()),
        };
        catch_unwind(AssertUnwindSafe(|| {
            let mut ids = Vec::with_capacity(inputs.len());
            for input in inputs {
                let mut t = match input {
                    EmbedInput::Text(t) => engine.tokenize_prompt(t, false).map_err(fail)?,
                    EmbedInput::Tokens(t) => t.clone(),
                    EmbedInput::Rerank { query, document } => {
                        engine.rerank_tokens(query, document).map_err(fail)?
                    }
                };
                if t.len() > limit {
                    if !truncate {
                        return Err(ProviderError::Context { need: t.len(), limit });
                    }
                    t.truncate(limit);
                }
                ids.push(t);
            }
            // An encoder runs the inputs together (the same numbers).
            let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
            if inputs.iter().any(|i| matches!(i, EmbedInput::Rerank { .. })) {
                let scores = engine.rerank(&refs).map_err(fail)?;
                return Ok(scores
                    .into_iter()
                    .zip(&ids)
                    .map(|(score, t)| inference::Embedding {
                        vector: vec![score],
                        tokens: t.len(),
                        pooling: inference::Pooling::Rank,
                    })
                    .collect());
            }
            engine.embed_many(&refs, None).map_err(fail)
        }))
        .unwrap_or_else(|_| Err(ProviderError::Failed("internal error".into())))
    }

    /// Starts a request: it joins the batch, or ends at once (cancelled
    /// before it began, refused by the engine, or the model is broken).
    pub(crate) fn start(&mut self, job: ChatJob) {
        let ChatJob { messages, tools, params, cancel, run, tx, hold } = job;
        if let Some(why) = self.broken() {
            let _ = tx.send(ChatMsg::Done(Err(ProviderError::Failed(why))));
            return;
        }
        let stopped =
            |f: &Option<Arc<AtomicBool>>| f.as_ref().is_some_and(|f| f.load(Ordering::Relaxed));
        if cancel.load(Ordering::Relaxed) || stopped(&run) {
            let _ = tx.send(ChatMsg::Done(Ok(ChatOutput::cancelled())));
            return;
        }
        let started = Instant::now();
        // One request's failure never takes the worker down.
        let local = &mut self.local;
        let begun = catch_unwind(AssertUnwindSafe(|| local.begin_chat(&messages, &tools, &params)));
        match begun {
            Ok(Ok(chat)) => {
                self.active.push(Active { run: chat, cancel, also: run, tx, started, _hold: hold })
            }
            Ok(Err(e)) => {
                let _ = tx.send(ChatMsg::Done(Err(e)));
            }
            Err(_) => {
                tracing::error!("a request panicked; the model is loaded again");
                let _ = tx.send(ChatMsg::Done(Err(ProviderError::Failed(
                    "internal error while starting the reply".into(),
                ))));
                // The engine is not trusted after an unwind through it.
                self.fail_all("internal error in another reply; the model is loaded again");
                self.reload();
            }
        }
    }

    /// One batched step of every request decoding; the ones that finish
    /// end (`done` hears each one's output and time).
    pub(crate) fn step(&mut self, done: &mut dyn FnMut(&ChatOutput, Duration)) {
        if self.active.is_empty() {
            return;
        }
        for a in &self.active {
            // A research run stopped: its request stops at this step.
            if a.also.as_ref().is_some_and(|f| f.load(Ordering::Relaxed)) {
                a.cancel.store(true, Ordering::Relaxed);
            }
        }
        let local = &mut self.local;
        let active = &mut self.active;
        let stepped = catch_unwind(AssertUnwindSafe(|| {
            let mut parts: Vec<_> = active
                .iter_mut()
                .map(|a| {
                    let Active { run, cancel, tx, .. } = a;
                    let cancel: &AtomicBool = cancel;
                    let sink = move |e: toolparse::Event| {
                        if tx.send(ChatMsg::Event(e)).is_err() {
                            // The client went away: stop within one token.
                            cancel.store(true, Ordering::Relaxed);
                        }
                    };
                    (run, cancel, sink)
                })
                .collect();
            let mut runs: Vec<ChatStep<'_>> = parts
                .iter_mut()
                .map(|(run, cancel, sink)| {
                    (&mut **run, *cancel, sink as &mut dyn FnMut(toolparse::Event))
                })
                .collect();
            local.step_chats(&mut runs)
        }));
        match stepped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.fail_all(&e.to_string());
                return;
            }
            Err(_) => {
                tracing::error!(
                    "a decode step panicked; its replies fail, the model is loaded again"
                );
                self.fail_all("internal error while generating");
                // The engine is not trusted after an unwind through it.
                self.reload();
                return;
            }
        }
        let mut i = 0;
        while i < self.active.len() {
            if !self.active[i].run.is_done() {
                i += 1;
                continue;
            }
            let Active { run, cancel, tx, started, .. } = self.active.swap_remove(i);
            let out = self.local.end_chat(run, &mut |e| {
                if tx.send(ChatMsg::Event(e)).is_err() {
                    cancel.store(true, Ordering::Relaxed);
                }
            });
            done(&out, started.elapsed());
            let _ = tx.send(ChatMsg::Done(Ok(out)));
        }
    }

    /// Ends every request in the batch with `msg`.
    fn fail_all(&mut self, msg: &str) {
        for a in self.active.drain(..) {
            let _ = a.tx.send(ChatMsg::Done(Err(ProviderError::Failed(msg.to_owned()))));
        }
    }

    /// Loads the model again after a panic unwound through the engine (its
    /// sessions and buffers are not trusted after that); when it cannot be
    /// loaded, every request fails, saying so.
    fn reload(&mut self) {
        let why =
            match Local::load(&self.args, self.args.tool_format.as_deref(), Some(self.context_cap))
            {
                Ok(local) => {
                    self.local = local;
                    None
                }
                Err(e) => {
                    let why = format!(
                    "the model failed and could not be loaded again ({e:#}); restart agentd serve"
                );
                    tracing::error!("{why}");
                    Some(why)
                }
            };
        if let Ok(mut b) = self.broken.lock() {
            *b = why;
        }
    }
}

/// What a model's card is made from: a loaded engine, or a file's header.
struct Source<'a> {
    path: &'a std::path::Path,
    config: &'a inference::Config,
    chat_template: Option<&'a str>,
    weight_bytes: usize,
    /// The GGUF tensor type most matrices have (`q4_1`).
    quantization: &'a str,
    tokenizer: &'a inference::Tok,
    entry: Option<&'a crate::state::registry::Entry>,
}

/// What the Ollama routes say about the loaded model.
fn card(local: &Local) -> Card {
    let info = local.engine.info();
    let quantization =
        info.kernels.iter().max_by_key(|k| k.2).map(|k| k.0.as_str()).unwrap_or_default();
    card_of(Source {
        path: &info.path,
        config: &info.config,
        chat_template: info.chat_template.as_deref(),
        weight_bytes: info.weight_bytes,
        quantization,
        tokenizer: local.engine.tokenizer(),
        entry: local.resolved.entry.as_ref(),
    })
}

/// A model file's card and the context it would load with (under
/// `context_cap`), from its header alone: what the listings show of a
/// model that is not loaded, without loading it.
pub(crate) fn file_card(
    path: &std::path::Path,
    context_cap: usize,
) -> anyhow::Result<(Card, usize)> {
    let resolved = super::build::resolve(Some(&path.to_string_lossy()))?;
    let context = match resolved.entry.as_ref().and_then(|e| e.context) {
        Some(c) => c.min(context_cap),
        None => context_cap,
    };
    let facts = inference::inspect(path, Some(context))
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let quantization = facts.types.first().map(|t| t.0.as_str()).unwrap_or_default();
    let card = card_of(Source {
        path,
        config: &facts.config,
        chat_template: facts.chat_template.as_deref(),
        weight_bytes: facts.weight_bytes,
        quantization,
        tokenizer: &facts.tokenizer,
        entry: resolved.entry.as_ref(),
    });
    Ok((card, facts.context))
}

/// A model's card from what is known of it.
fn card_of(src: Source<'_>) -> Card {
    let c = src.config;
    let meta = std::fs::metadata(src.path).ok();
    let file_bytes = meta.as_ref().map_or(0, std::fs::Metadata::len);
    let modified = meta.as_ref().and_then(|m| m.modified().ok());
    let digest = match src.entry {
        Some(e) => e.sha256.clone(),
        None => {
            use sha2::Digest;
            let mut h = sha2::Sha256::new();
            h.update(src.path.to_string_lossy().as_bytes());
            h.update(file_bytes.to_le_bytes());
            h.update(format!("{modified:?}").as_bytes());
            h.finalize().iter().map(|b| format!("{b:02x}")).collect()
        }
    };
    let (e, hd) = (c.n_embd as u64, c.head_dim as u64);
    let attn = e * hd * (2 * c.n_head as u64 + 2 * c.n_kv as u64);
    let parameters = c.n_layer as u64 * (attn + 3 * e * c.n_ff as u64) + c.n_vocab as u64 * e;
    let tok = src.tokenizer;
    let fim = [
        ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
        ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
    ]
    .into_iter()
    .find(|set| set.iter().all(|t| tok.id_of(t).is_some()))
    .map(|set| set.map(str::to_owned));
    let template = src
        .entry
        .and_then(|e| e.chat_template.as_deref())
        .filter(|t| *t != "gguf")
        .and_then(|p| std::fs::read_to_string(p).ok())
        .or_else(|| src.chat_template.map(str::to_owned))
        .unwrap_or_default();
    Card {
        path: src.path.to_owned(),
        arch: c.arch_name.clone(),
        template,
        file_bytes,
        weight_bytes: src.weight_bytes as u64,
        digest: format!("sha256:{digest}"),
        parameters,
        quantization: src.quantization.to_ascii_uppercase(),
        embedding: c.n_embd,
        encoder: c.arch.is_encoder(),
        reranker: c.pooling == Some(inference::Pooling::Rank),
        layers: c.n_layer,
        heads: (c.n_head, c.n_kv),
        fim,
        stop: src.entry.map(|e| e.stop.clone()).unwrap_or_default(),
        sampling: src.entry.and_then(|e| e.sampling.clone()).unwrap_or_default(),
        modified,
    }
}
