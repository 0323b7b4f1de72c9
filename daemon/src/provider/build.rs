//! The ENGINE options (docs/cli.md) and what they build:
//! the model file they resolve to (pulled when missing), the loaded engine,
//! and the provider they name (`local`, `openai` or `scripted`).

use super::local::Local;
use super::openai::{OpenAi, Retry};
use super::scripted::Scripted;
use super::Provider;
use crate::state::policy::{self, Policies};
use crate::state::registry::{Entry, Registry};
use anyhow::{bail, Context, Result};
use clap::Args;
use inference::{Engine, EngineOptions, KvType};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;
use toolparse::Format;

/// `--device` when none is given.
const DEVICE: &str = "auto";
/// `--provider` when none is given.
const PROVIDER: &str = "local";

/// Options shared by commands that run a model (docs/cli.md "ENGINE"). A
/// run's admission snapshot keeps them as their serde form (every field,
/// `null` for an unset one); an option a snapshot lacks reads as its
/// default.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct EngineArgs {
    /// Registry name or path to a .gguf file (default: the registry's default)
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// Where to run: auto, cpu, cuda[:N], metal, candle-cpu (the GPU code path on the CPU, for checking it)
    #[arg(long, default_value = DEVICE)]
    pub(crate) device: String,
    /// Compute threads (default: all available CPUs)
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Who runs the model: local, openai (an OpenAI-compatible server), scripted (tests)
    #[arg(long, default_value = PROVIDER)]
    pub(crate) provider: String,
    /// Base URL of the OpenAI-compatible server (e.g. http://127.0.0.1:8080/v1)
    #[arg(long)]
    pub(crate) base_url: Option<String>,
    /// Environment variable that holds the API key for --provider openai
    #[arg(long)]
    pub(crate) api_key_env: Option<String>,
    /// Tool-call format of the model's text (default: from models.toml, else hermes)
    #[arg(long)]
    pub(crate) tool_format: Option<String>,
    /// Turns file for --provider scripted
    #[arg(long)]
    pub(crate) script: Option<PathBuf>,
    /// Who drives research: `model` (its own tool rounds) or `host` (the
    /// host searches with the question and reads first; the model answers
    /// from what was read). Default: models.toml's `research`, else by the
    /// model's size (local), else `model`.
    #[arg(long, value_parser = ["model", "host"])]
    pub(crate) research: Option<String>,
    /// Tokens drafted per decode step by prompt lookup: the words that
    /// followed the context's last ones where they occurred before (quoted
    /// evidence), verified in one pass; output is the same with any value,
    /// 0 turns it off
    #[arg(long, env = "AGENTD_DRAFT", default_value_t = DRAFT, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub(crate) draft: u16,
    /// A smaller model of the same vocabulary (registry name or .gguf path)
    /// whose greedy tokens are the drafts, instead of prompt lookup's:
    /// verified the same way, so output is the same. Default: models.toml's
    /// `draft` for the model, else none
    #[arg(long, env = "AGENTD_DRAFT_MODEL")]
    pub(crate) draft_model: Option<String>,
    /// Element type of the K/V cache: f16, q8_0 (half the bytes) or q4_0
    /// (about a quarter), numbers as llama.cpp's `-ctk T -ctv T`. Default:
    /// models.toml's `kv_type`, else f16 unless the whole context's f16
    /// cache would take more than a quarter of the machine's memory
    #[arg(long, env = "AGENTD_KV_TYPE", value_parser = parse_kv_type)]
    pub(crate) kv_type: Option<String>,
}

/// `--kv-type`'s value, checked and spelled as the engine names it.
fn parse_kv_type(s: &str) -> std::result::Result<String, String> {
    s.parse::<KvType>().map(|t| t.name().to_owned()).map_err(|e| e.to_string())
}

/// Default of `--draft`: the engine's.
pub(crate) const DRAFT: u16 = inference::SPECULATE as u16;

/// A model to run: its file and, for registry models, the entry.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) path: PathBuf,
    pub(crate) entry: Option<Entry>,
    pub(crate) name: String,
}

/// Finds (and pulls when missing) the model named by `--model`.
pub(crate) fn resolve(model: Option<&str>) -> Result<Resolved> {
    let reg = Registry::load()?;
    let name = model.unwrap_or(&reg.default);
    let as_path = PathBuf::from(name);
    if !reg.entries.contains_key(name)
        && (as_path.is_file() || name.ends_with(".gguf") || name.contains('/'))
    {
        if !as_path.is_file() {
            bail!("model file {} does not exist", as_path.display());
        }
        let entry = reg.by_file(&as_path).cloned();
        return Ok(Resolved { path: as_path, entry, name: name.to_owned() });
    }
    if !reg.entries.contains_key(name) {
        // A file in the models folder, by its name or stem (`agentd pull
        // hf:…` puts files there).
        let dir = crate::state::home::models_dir();
        for file in [dir.join(name), dir.join(format!("{name}.gguf"))] {
            if file.is_file() && file.extension().is_some_and(|x| x == "gguf") {
                let entry = reg.by_file(&file).cloned();
                return Ok(Resolved { path: file, entry, name: name.to_owned() });
            }
        }
    }
    let entry = reg.get(name)?.clone();
    let path = crate::state::pull::ensure(&entry)?;
    Ok(Resolved { path, name: entry.name.clone(), entry: Some(entry) })
}

/// What the command line gives when no option is set.
impl Default for EngineArgs {
    fn default() -> EngineArgs {
        EngineArgs {
            model: None,
            device: DEVICE.into(),
            threads: None,
            provider: PROVIDER.into(),
            base_url: None,
            api_key_env: None,
            tool_format: None,
            script: None,
            research: None,
            draft: DRAFT,
            draft_model: None,
            kv_type: None,
        }
    }
}

impl EngineArgs {
    pub(crate) fn load(&self) -> Result<(Resolved, Engine)> {
        self.load_with(None)
    }

    /// Loads the model alone, without a draft model: for benchmarks, which
    /// never draft.
    pub(crate) fn load_plain(&self) -> Result<(Resolved, Engine)> {
        self.load_inner(None, false, false)
    }

    /// Loads the model with a context of exactly `context` tokens (whatever
    /// its registry entry says), without a draft model: for benchmarks that
    /// need a longer one.
    pub(crate) fn load_context(&self, context: usize) -> Result<(Resolved, Engine)> {
        self.load_inner(Some(context), true, false)
    }

    /// Loads the model with its context bounded by `cap` tokens, and its
    /// draft model when one is named (`--draft-model`, models.toml's
    /// `draft`) and drafting is on.
    pub(crate) fn load_with(&self, cap: Option<usize>) -> Result<(Resolved, Engine)> {
        self.load_inner(cap, false, true)
    }

    fn load_inner(
        &self,
        cap: Option<usize>,
        exact: bool,
        with_draft: bool,
    ) -> Result<(Resolved, Engine)> {
        if self.provider != "local" {
            anyhow::bail!(
                "this command runs the local engine; --provider {} is for `ask` and `serve`",
                self.provider
            );
        }
        let r = resolve(self.model.as_deref())?;
        let device = self.device.parse()?;
        let context = match (r.entry.as_ref().and_then(|e| e.context), cap) {
            _ if exact => cap,
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let kv_type = match (&self.kv_type, r.entry.as_ref().and_then(|e| e.kv_type.as_deref())) {
            (Some(t), _) => Some(t.parse::<KvType>()?),
            (None, Some(name)) => Some(
                name.parse::<KvType>()
                    .with_context(|| format!("models.toml: model {}: kv_type", r.name))?,
            ),
            (None, None) => None,
        };
        let t = Instant::now();
        let opts = EngineOptions { threads: self.threads, device, context, kv_type };
        let mut engine = Engine::load(&r.path, &opts)
            .with_context(|| format!("cannot load {}", r.path.display()))?;
        tracing_note(&format!("loaded {} in {:.2}s", r.name, t.elapsed().as_secs_f64()));
        let draft =
            self.draft_model.as_deref().or(r.entry.as_ref().and_then(|e| e.draft.as_deref()));
        if let Some(name) = draft.filter(|_| with_draft && self.draft > 0) {
            let t = Instant::now();
            let d = resolve(Some(name)).with_context(|| format!("draft model {name}"))?;
            engine.load_draft(&d.path).with_context(|| {
                format!("cannot load {} as the draft model of {}", d.path.display(), r.name)
            })?;
            tracing_note(&format!("loaded draft {} in {:.2}s", d.name, t.elapsed().as_secs_f64()));
        }
        Ok((r, engine))
    }
}

fn tracing_note(msg: &str) {
    if std::env::var_os("AGENTD_VERBOSE").is_some() {
        eprintln!("agentd: {msg}");
    }
}

/// The `openai` provider `args` name (`ask`, and `serve` in front of an
/// upstream), its retries under the provider layer's policies.
pub(crate) fn openai(args: &EngineArgs, policies: &Policies) -> Result<OpenAi> {
    let retry = Retry::from_policies(policies);
    let base = args
        .base_url
        .as_deref()
        .context("--provider openai needs --base-url (e.g. http://127.0.0.1:8080/v1)")?;
    let key = match &args.api_key_env {
        Some(var) => Some(
            std::env::var(var)
                .with_context(|| format!("--api-key-env {var}: the variable is not set"))?,
        ),
        None => None,
    };
    let model = args.model.clone().unwrap_or_else(|| "default".into());
    let format = match &args.tool_format {
        Some(f) => Format::from_name(f)?,
        None => Registry::load()
            .ok()
            .and_then(|r| r.entries.get(&model).and_then(|e| e.tool_format.clone()))
            .map(|f| Format::from_name(&f))
            .transpose()?
            .or_else(|| Format::for_model(&model))
            .unwrap_or(Format::Hermes),
    };
    Ok(OpenAi::new(base, key, &model, format, retry))
}

/// The provider for `args`, under a run's policies: a local model's context
/// is bounded by `prompts/context-budget`, an upstream's retries follow the
/// provider layer's policies.
pub(crate) fn build(args: &EngineArgs, policies: &Policies) -> Result<Box<dyn Provider + Send>> {
    let context_cap = Some(policies.get(policy::CONTEXT) as usize);
    match args.provider.as_str() {
        "local" => Ok(Box::new(Local::load(args, args.tool_format.as_deref(), context_cap)?)),
        "openai" => Ok(Box::new(openai(args, policies)?)),
        "scripted" => {
            let path = args.script.as_deref().context("--provider scripted needs --script FILE")?;
            let format = Format::from_name(args.tool_format.as_deref().unwrap_or("hermes"))?;
            let mut s = Scripted::load(path, format)?;
            if s.wants_section_model() {
                let local = EngineArgs { provider: "local".into(), ..args.clone() };
                s.set_workers(Local::load(&local, None, context_cap)?);
            }
            Ok(Box::new(s))
        }
        other => bail!("unknown provider {other:?}: use local, openai or scripted"),
    }
}
