//! The model registry: `models.toml` (built in) plus the user's
//! `$AGENTD_HOME/models.toml`, whose entries add to or replace the built-in
//! ones by name.
//!
//! An entry's optional `[models.NAME.sampling]` table holds the model's
//! sampling defaults (`SamplingKnobs`): what the research turns use, and
//! what a chat request gets for every knob it leaves out. The same type,
//! built from a request, is checked by the same ranges (`SamplingKnobs::check`);
//! the integer bounds are the `sampling/…` policies (`policy::SamplingLimits`).

use super::policy::{self, SamplingLimits};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

const BUILTIN: &str = include_str!("../../../models.toml");

/// Sampling defaults of a model (models.toml), or the knobs a chat request
/// sets: each one unset leaves the value beneath it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SamplingKnobs {
    pub(crate) temperature: Option<f32>,
    pub(crate) top_k: Option<usize>,
    pub(crate) top_p: Option<f32>,
    pub(crate) min_p: Option<f32>,
    pub(crate) repeat_penalty: Option<f32>,
    pub(crate) repeat_last_n: Option<usize>,
    pub(crate) frequency_penalty: Option<f32>,
    pub(crate) presence_penalty: Option<f32>,
    pub(crate) no_repeat_ngram: Option<usize>,
}

/// A knob outside its range: the field and what it must be.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OutOfRange {
    pub(crate) field: &'static str,
    /// `must be between -2 and 2 (got 3)`.
    pub(crate) must: String,
}

impl SamplingKnobs {
    /// The first knob outside its range, if any. `limits` bound the integer
    /// knobs (the `sampling/…` policies).
    pub(crate) fn check(&self, limits: SamplingLimits) -> Result<(), OutOfRange> {
        let real = |field: &'static str, v: Option<f32>, ok: fn(f32) -> bool, range: &str| match v {
            Some(x) if !ok(x) => {
                Err(OutOfRange { field, must: format!("must be {range} (got {x})") })
            }
            _ => Ok(()),
        };
        real("temperature", self.temperature, |x| (0.0..=2.0).contains(&x), "between 0 and 2")?;
        real("top_p", self.top_p, |x| x > 0.0 && x <= 1.0, "in (0, 1]")?;
        real("min_p", self.min_p, |x| (0.0..=1.0).contains(&x), "between 0 and 1")?;
        real("repeat_penalty", self.repeat_penalty, |x| x > 0.0 && x <= 2.0, "in (0, 2]")?;
        let penalty = |x: f32| (-2.0..=2.0).contains(&x);
        real("frequency_penalty", self.frequency_penalty, penalty, "between -2 and 2")?;
        real("presence_penalty", self.presence_penalty, penalty, "between -2 and 2")?;
        let int = |field: &'static str, v: Option<usize>, max: usize, policy: &str| match v {
            Some(n) if n > max => Err(OutOfRange {
                field,
                must: format!("must be from 0 to {max}, the policy {policy} (got {n})"),
            }),
            _ => Ok(()),
        };
        int("repeat_last_n", self.repeat_last_n, limits.repeat_last_n, policy::REPEAT_LAST_N)?;
        int(
            "no_repeat_ngram",
            self.no_repeat_ngram,
            limits.no_repeat_ngram,
            policy::NO_REPEAT_NGRAM,
        )?;
        Ok(())
    }

    /// These knobs over `below`: each one set here wins.
    pub(crate) fn over(&self, below: &SamplingKnobs) -> SamplingKnobs {
        SamplingKnobs {
            temperature: self.temperature.or(below.temperature),
            top_k: self.top_k.or(below.top_k),
            top_p: self.top_p.or(below.top_p),
            min_p: self.min_p.or(below.min_p),
            repeat_penalty: self.repeat_penalty.or(below.repeat_penalty),
            repeat_last_n: self.repeat_last_n.or(below.repeat_last_n),
            frequency_penalty: self.frequency_penalty.or(below.frequency_penalty),
            presence_penalty: self.presence_penalty.or(below.presence_penalty),
            no_repeat_ngram: self.no_repeat_ngram.or(below.no_repeat_ngram),
        }
    }

    /// The knobs that are set, as `name value` lines (Ollama's `parameters`).
    pub(crate) fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                out.push(format!("{k} {v}"));
            }
        };
        put("temperature", self.temperature.map(|v| v.to_string()));
        put("top_k", self.top_k.map(|v| v.to_string()));
        put("top_p", self.top_p.map(|v| v.to_string()));
        put("min_p", self.min_p.map(|v| v.to_string()));
        put("repeat_penalty", self.repeat_penalty.map(|v| v.to_string()));
        put("repeat_last_n", self.repeat_last_n.map(|v| v.to_string()));
        put("frequency_penalty", self.frequency_penalty.map(|v| v.to_string()));
        put("presence_penalty", self.presence_penalty.map(|v| v.to_string()));
        put("no_repeat_ngram", self.no_repeat_ngram.map(|v| v.to_string()));
        out
    }
}

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
    /// The model's sampling defaults (`[models.NAME.sampling]`).
    #[serde(default)]
    pub(crate) sampling: Option<SamplingKnobs>,
    /// Who drives research: the model's own tool rounds, or the host's
    /// entry research and a grounded answer (`research::Mode`); unset:
    /// chosen by the model's size.
    #[serde(default)]
    pub(crate) research: Option<String>,
    /// The K/V cache type of this model (`f16`, `q8_0`, `q4_0`); unset:
    /// the engine's policy (`--kv-type`).
    #[serde(default)]
    pub(crate) kv_type: Option<String>,
    /// The draft model of this one (a registry name or a .gguf path: a
    /// smaller model of the same vocabulary, `--draft-model`); unset: none.
    #[serde(default)]
    pub(crate) draft: Option<String>,
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
        if let Some(r) = &e.research {
            if !matches!(r.as_str(), "model" | "host") {
                bail!("{origin}: model {name}: research must be \"model\" or \"host\", got {r:?}");
            }
        }
        if let Some(f) = &e.tool_format {
            toolparse::Format::from_name(f).with_context(|| format!("{origin}: model {name}"))?;
        }
        if let Some(k) = &e.sampling {
            if let Err(bad) = k.check(SamplingLimits::declared()) {
                bail!("{origin}: model {name}: sampling.{} {}", bad.field, bad.must);
            }
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

    /// The entry whose pulled file is `path` (the same file, however the
    /// path spells it): a model named by its file keeps its entry's
    /// context, KV type, draft, template, stops and sampling.
    pub(crate) fn by_file(&self, path: &std::path::Path) -> Option<&Entry> {
        let canon = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
        let want = canon(path);
        self.entries.values().find(|e| canon(&e.local_path()) == want)
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

    #[test]
    fn a_sampling_table_is_read_and_checked_naming_the_field_and_range() {
        let head = format!(
            "[models.x]\nrepo = \"a/b\"\nfile = \"x.gguf\"\nsha256 = \"{}\"\n[models.x.sampling]\n",
            "0".repeat(64)
        );
        let f = parse(&format!("{head}repeat_penalty = 1.1\nno_repeat_ngram = 4\n"), "t").unwrap();
        let k = f.models["x"].sampling.clone().unwrap();
        assert_eq!(k.repeat_penalty, Some(1.1));
        assert_eq!(k.no_repeat_ngram, Some(4));
        assert_eq!(k.temperature, None);
        let cases = [
            ("repeat_penalty = 0", "sampling.repeat_penalty must be in (0, 2] (got 0)"),
            ("repeat_penalty = 2.5", "sampling.repeat_penalty must be in (0, 2]"),
            ("frequency_penalty = -3", "sampling.frequency_penalty must be between -2 and 2"),
            ("presence_penalty = 2.01", "sampling.presence_penalty must be between -2 and 2"),
            ("temperature = 3", "sampling.temperature must be between 0 and 2"),
            ("top_p = 0", "sampling.top_p must be in (0, 1]"),
            ("min_p = 1.5", "sampling.min_p must be between 0 and 1"),
            ("repeat_last_n = 1000000", "sampling.repeat_last_n must be from 0 to 131072, the policy sampling/repeat-last-n"),
            ("no_repeat_ngram = 300", "sampling.no_repeat_ngram must be from 0 to 256, the policy sampling/no-repeat-ngram"),
        ];
        for (line, want) in cases {
            let e = format!("{:#}", parse(&format!("{head}{line}\n"), "t").unwrap_err());
            assert!(e.contains("model x") && e.contains(want), "{line}: {e}");
        }
        // The built-in default model's table is within its ranges.
        let f = parse(BUILTIN, "builtin").unwrap();
        let k = f.models[f.default.as_deref().unwrap()].sampling.clone().expect("a table");
        assert_eq!(k.check(SamplingLimits::declared()), Ok(()));
        assert!(k.no_repeat_ngram.is_some_and(|n| n > 0), "{k:?}");
        // Unknown knobs and negative counts are refused by the schema.
        for line in ["repetition_penalty = 1.1", "repeat_last_n = -1"] {
            assert!(parse(&format!("{head}{line}\n"), "t").is_err(), "{line}");
        }
    }

    #[test]
    fn knobs_set_win_over_those_below() {
        let model = SamplingKnobs {
            repeat_penalty: Some(1.1),
            no_repeat_ngram: Some(4),
            ..SamplingKnobs::default()
        };
        let req = SamplingKnobs {
            repeat_penalty: Some(1.0),
            temperature: Some(0.5),
            ..SamplingKnobs::default()
        };
        let k = req.over(&model);
        assert_eq!(
            (k.repeat_penalty, k.no_repeat_ngram, k.temperature, k.top_p),
            (Some(1.0), Some(4), Some(0.5), None)
        );
        assert_eq!(model.lines(), ["repeat_penalty 1.1", "no_repeat_ngram 4"]);
    }
}
