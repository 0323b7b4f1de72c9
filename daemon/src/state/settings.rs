//! User settings: declared with their metadata, stored in SQLite, overridden
//! by environment variables, reset to their defaults.

use super::store::Store;
use anyhow::{bail, Result};
use serde::Serialize;
use serde_json::Value;

/// A setting's declaration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Def {
    pub(crate) key: &'static str,
    pub(crate) label: &'static str,
    pub(crate) description: &'static str,
    pub(crate) default: i64,
    pub(crate) min: i64,
    pub(crate) max: i64,
    pub(crate) env: &'static str,
    /// When a stored change takes effect.
    pub(crate) applies: Applies,
}

/// When a stored change of a setting takes effect in a running daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Applies {
    /// From the next run admitted (a run admitted before keeps the
    /// snapshot it was admitted under, and so does its resume).
    NextRun,
    /// Sized when the daemon starts: from its next start.
    #[allow(dead_code)] // no setting is sized at start-up yet
    Restart,
}

/// Every setting.
pub(crate) const DEFS: &[Def] = &[
    Def {
        key: "chat.max_tool_iters",
        label: "Tool research rounds",
        description:
            "Model turns that call tools before the reserved final answer (not individual calls)",
        default: 12,
        min: 1,
        max: 64,
        env: "AGENTD_CHAT_MAX_TOOL_ITERS",
        applies: Applies::NextRun,
    },
    Def {
        key: "chat.run_deadline_secs",
        label: "Run deadline (seconds)",
        description:
            "Wall time a reply may take; research stops at its share so the answer still fits",
        default: 1800,
        min: 30,
        max: 86_400,
        env: "AGENTD_CHAT_RUN_DEADLINE_SECS",
        applies: Applies::NextRun,
    },
    Def {
        key: "tools.max_searches",
        label: "Searches per reply",
        description: "search_sources calls one reply may make; reading stays available after",
        default: 32,
        min: 1,
        max: 256,
        env: "AGENTD_TOOLS_MAX_SEARCHES",
        applies: Applies::NextRun,
    },
];

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Source {
    Default,
    Stored,
    Env,
}

/// A setting's value in force; its JSON (`GET /v1/settings`, docs/http.md)
/// is [`Listing`].
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(into = "Listing")]
pub(crate) struct Effective {
    pub(crate) def: Def,
    pub(crate) value: i64,
    pub(crate) source: Source,
}

/// A setting as clients see it: its declaration's fields with the value
/// and its source placed among them (`env` and `applies` last) and the
/// constant `type`,
/// so a flattened [`Def`] would not keep the order.
#[derive(Debug, Serialize)]
struct Listing {
    key: &'static str,
    label: &'static str,
    description: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    default: i64,
    min: i64,
    max: i64,
    value: i64,
    source: Source,
    env: &'static str,
    applies: Applies,
}

impl From<Effective> for Listing {
    fn from(e: Effective) -> Listing {
        let Def { key, label, description, default, min, max, env, applies } = e.def;
        Listing {
            key,
            label,
            description,
            kind: "integer",
            default,
            min,
            max,
            value: e.value,
            source: e.source,
            env,
            applies,
        }
    }
}

impl Effective {
    pub(crate) fn to_json(self) -> Value {
        // Infallible: strings and integers under string keys.
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// The declaration of `key`, or an error listing the known keys.
pub(crate) fn def(key: &str) -> Result<Def> {
    DEFS.iter().copied().find(|d| d.key == key).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown setting {key:?}; known settings: {}",
            DEFS.iter().map(|d| d.key).collect::<Vec<_>>().join(", ")
        )
    })
}

/// Parses `raw` as a value of `d`, checking its bounds.
pub(crate) fn parse(d: Def, raw: &str) -> Result<i64> {
    let v: i64 = match raw.trim().parse() {
        Ok(v) => v,
        Err(_) => bail!(
            "{} ({}) must be an integer from {} to {}, got {raw:?}",
            d.key,
            d.label,
            d.min,
            d.max
        ),
    };
    if v < d.min || v > d.max {
        bail!("{} ({}) must be between {} and {}, got {v}", d.key, d.label, d.min, d.max);
    }
    Ok(v)
}

/// The value in force: the environment, else the stored value, else the
/// default.
pub(crate) fn get(store: &Store, key: &str) -> Result<Effective> {
    let d = def(key)?;
    if let Ok(raw) = std::env::var(d.env) {
        let value =
            parse(d, &raw).map_err(|e| anyhow::anyhow!("environment variable {}: {e}", d.env))?;
        return Ok(Effective { def: d, value, source: Source::Env });
    }
    if let Some(raw) = store.setting(key)? {
        if let Ok(value) = parse(d, &raw) {
            return Ok(Effective { def: d, value, source: Source::Stored });
        }
    }
    Ok(Effective { def: d, value: d.default, source: Source::Default })
}

/// Stores a value after checking it — its bounds, and that the policies
/// it sets still compose with the other limits; nothing is stored when it
/// is refused.
pub(crate) fn set(store: &Store, key: &str, raw: &str) -> Result<Effective> {
    let d = def(key)?;
    let v = parse(d, raw)?;
    super::policy::Policies::admit_setting(store, key, v)
        .map_err(|e| anyhow::anyhow!("{key} = {v} cannot apply: {e:#}"))?;
    store.set_setting(key, &v.to_string())?;
    get(store, key)
}

/// Forgets the stored value.
pub(crate) fn reset(store: &Store, key: &str) -> Result<Effective> {
    def(key)?;
    store.reset_setting(key)?;
    get(store, key)
}

/// Every setting's value in force.
pub(crate) fn list(store: &Store) -> Result<Vec<Effective>> {
    DEFS.iter().map(|d| get(store, d.key)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bounds_are_enforced_and_nothing_is_stored_when_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_at(dir.path().join("s.db")).unwrap();
        let k = "chat.max_tool_iters";
        assert_eq!(get(&s, k).unwrap().value, 12);
        for bad in ["0", "65", "x", "-1"] {
            let e = set(&s, k, bad).unwrap_err().to_string();
            assert!(e.contains('1') && e.contains("64"), "{e}");
            assert_eq!(s.setting(k).unwrap(), None);
        }
        assert_eq!(set(&s, k, "6").unwrap().value, 6);
        assert_eq!(get(&s, k).unwrap().source, Source::Stored);
        assert_eq!(reset(&s, k).unwrap().value, 12);
        assert!(def("nope").is_err());
    }

    /// The listing's JSON, field for field and in order.
    #[test]
    fn a_setting_lists_as_its_pinned_json() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_at(dir.path().join("s.db")).unwrap();
        let got: Vec<String> = DEFS
            .iter()
            .map(|d| Effective { def: *d, value: d.default, source: Source::Default })
            .map(|e| e.to_json().to_string())
            .collect();
        let want = [
            r#"{"key":"chat.max_tool_iters","label":"Tool research rounds","description":"Model turns that call tools before the reserved final answer (not individual calls)","type":"integer","default":12,"min":1,"max":64,"value":12,"source":"default","env":"AGENTD_CHAT_MAX_TOOL_ITERS","applies":"next_run"}"#,
            r#"{"key":"chat.run_deadline_secs","label":"Run deadline (seconds)","description":"Wall time a reply may take; research stops at its share so the answer still fits","type":"integer","default":1800,"min":30,"max":86400,"value":1800,"source":"default","env":"AGENTD_CHAT_RUN_DEADLINE_SECS","applies":"next_run"}"#,
            r#"{"key":"tools.max_searches","label":"Searches per reply","description":"search_sources calls one reply may make; reading stays available after","type":"integer","default":32,"min":1,"max":256,"value":32,"source":"default","env":"AGENTD_TOOLS_MAX_SEARCHES","applies":"next_run"}"#,
        ];
        assert_eq!(got, want);
        let e = set(&s, "tools.max_searches", "5").unwrap().to_json();
        assert_eq!((&e["value"], &e["source"]), (&json!(5), &json!("stored")));
    }
}
