//! Building the provider an `ENGINE` option set names.

use crate::commands::engine::EngineArgs;
use crate::provider::local::Local;
use crate::provider::openai::{OpenAi, Retry};
use crate::provider::scripted::Scripted;
use crate::provider::Provider;
use anyhow::{bail, Context, Result};
use toolparse::Format;

/// The provider for `args`.
/// `context_cap` bounds the context a local model is given (tokens).
pub(crate) fn build(
    args: &EngineArgs,
    retry: Retry,
    context_cap: Option<usize>,
) -> Result<Box<dyn Provider>> {
    match args.provider.as_str() {
        "local" => Ok(Box::new(Local::load(args, args.tool_format.as_deref(), context_cap)?)),
        "openai" => {
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
                None => crate::state::registry::Registry::load()
                    .ok()
                    .and_then(|r| r.entries.get(&model).and_then(|e| e.tool_format.clone()))
                    .map(|f| Format::from_name(&f))
                    .transpose()?
                    .or_else(|| Format::for_model(&model))
                    .unwrap_or(Format::Hermes),
            };
            Ok(Box::new(OpenAi::new(base, key, &model, format, retry)))
        }
        "scripted" => {
            let path = args.script.as_deref().context("--provider scripted needs --script FILE")?;
            let format = Format::from_name(args.tool_format.as_deref().unwrap_or("hermes"))?;
            Ok(Box::new(Scripted::load(path, format)?))
        }
        other => bail!("unknown provider {other:?}: use local, openai or scripted"),
    }
}
