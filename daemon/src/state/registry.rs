//! The model registry: `models.toml` (built in) plus the user's
//! `$AGENTD_HOME/models.toml`, whose entries add to or replace the built-in
//! ones by name.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

const BUILTIN: &str = include_str!("../../../models.toml");

/// One registry entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Entry {
    #[serde(skip)]
    pub(crate) name: String,
    pub(crate) repo: String,
    pub(crate) file: String,
    #[serde(default)]
    pub(crate) revision: Option<String>,
    pub(crate) sha256: String,
    #[serde(default)]
    pub(crate) size: Option<u64>,
    #[serde(default)]
    pub(crate) mirrors: Vec<String>,
    #[serde(default)]
    pub(crate) architecture: Option<String>,
    #[serde(default)]
    pub(crate) context: Option<usize>,
    #[serde(default)]
    pub(crate) chat_template: Option<String>,
    #[serde(default)]
    pub(crate) tool_format: Option<String>,
    #[serde(default)]
    pub(crate) stop: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct File {
    #[serde(default)]
    default: Option<String>,
    #[serde(default)]
    models: BTreeMap<String, Entry>,
}

/// All entries and the default model's name.
#[derive(Debug)]
pub(crate) struct Registry {
    pub(crate) default: String,
    pub(crate) entries: BTreeMap<String, Entry>,
}

fn parse(text: &str, origin: &str) -> Result<File> {
    let mut f: File =
        toml::from_str(text).with_context(|| format!("{origin} is not a valid model registry"))?;
    for (name, e) in f.models.iter_mut() {
        e.name = name.clone();
        if e.sha256.len() != 64 || !e.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("{origin}: model {name}: sha256 must be 64 hex digits, got {:?}", e.sha256);
        }
        if let Some(f) = &e.tool_format {
            toolparse::Format::from_name(f).with_context(|| format!("{origin}: model {name}"))?;
        }
    }
    Ok(f)
}

impl Registry {
    /// The built-in registry plus the user's file, if any.
    pub(crate) fn load() -> Result<Registry> {
        let builtin = parse(BUILTIN, "the built-in models.toml")?;
        let mut default =
            builtin.default.context("the built-in models.toml names no default model")?;
        let mut entries = builtin.models;
        let user: PathBuf = super::home::home().join("models.toml");
        if user.is_file() {
            let text = std::fs::read_to_string(&user)
                .with_context(|| format!("cannot read {}", user.display()))?;
            let f = parse(&text, &user.display().to_string())?;
            if let Some(d) = f.default {
                default = d;
            }
            entries.extend(f.models);
        }
        if !entries.contains_key(&default) {
            bail!("the default model {default:?} is not in the registry");
        }
        Ok(Registry { default, entries })
    }

    /// The entry called `name`, with a message listing the known ones.
    pub(crate) fn get(&self, name: &str) -> Result<&Entry> {
        self.entries.get(name).with_context(|| {
            format!(
                "unknown model {name:?}: known models are {} (or pass a path to a .gguf file)",
                self.entries.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
    }
}

impl Entry {
    /// Where the file lives once pulled.
    pub(crate) fn local_path(&self) -> PathBuf {
        super::home::models_dir().join(&self.file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_registry_parses_and_names_its_default() {
        let f = parse(BUILTIN, "builtin").expect("parses");
        let d = f.default.expect("default");
        let e = &f.models[&d];
        assert_eq!(e.file, "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert_eq!(e.tool_format.as_deref(), Some("hermes"));
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        let bad = "[models.x]\nrepo = \"a/b\"\nfile = \"x.gguf\"\nsha256 = \"abc\"\n";
        let e = parse(bad, "test").unwrap_err();
        assert!(format!("{e:#}").contains("64 hex digits"), "{e:#}");
    }
}
