//! Budget policies (docs/budgets.md "Every limit has an owner", "Limits
//! must compose"): every limit
//! is declared once by the module that enforces it — id, owner, version,
//! unit, default, hard maximum — and runtime code reads policies instead of
//! keeping shadow constants. Two different declarations of one id refuse to
//! start; so does a composition of limits that cannot support one complete
//! path (search → read → answer). Model output, user text and tool payloads
//! never reach this module: only configuration can set values, and never
//! above a hard maximum.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// What a policy counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Unit {
    Requests,
    Rounds,
    Seconds,
    Milliseconds,
    Tokens,
    Handles,
    Calls,
    Results,
    Characters,
    Bytes,
    Megabytes,
    Models,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Unit::Requests => "requests",
            Unit::Rounds => "rounds",
            Unit::Seconds => "seconds",
            Unit::Milliseconds => "milliseconds",
            Unit::Tokens => "tokens",
            Unit::Handles => "handles",
            Unit::Calls => "calls",
            Unit::Results => "results",
            Unit::Characters => "characters",
            Unit::Bytes => "bytes",
            Unit::Megabytes => "megabytes",
            Unit::Models => "models",
        }
    }
}

/// A declared limit.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct Policy {
    pub(crate) id: String,
    pub(crate) owner: String,
    pub(crate) version: String,
    pub(crate) unit: Unit,
    pub(crate) default: i64,
    pub(crate) hard_max: i64,
    /// The user setting that sets it, when it is user-facing.
    #[serde(default)]
    pub(crate) setting: Option<String>,
}

pub(super) fn p(
    id: &str,
    owner: &str,
    version: &str,
    unit: Unit,
    default: i64,
    hard_max: i64,
    setting: Option<&str>,
) -> Policy {
    Policy {
        id: id.into(),
        owner: owner.into(),
        version: version.into(),
        unit,
        default,
        hard_max,
        setting: setting.map(Into::into),
    }
}

pub(crate) const ROUNDS: &str = "research-runtime/tool-research-rounds";
pub(crate) const TOTAL_REQUESTS: &str = "research-runtime/total-model-requests";
pub(crate) const RESERVE: &str = "research-runtime/finalization-request-reserve";
pub(crate) const DEADLINE: &str = "research-runtime/run-deadline";
pub(crate) const RESEARCH_SHARE: &str = "research-runtime/research-deadline-share-percent";
pub(crate) const SECTION_REQUESTS: &str = "research/section-requests";
pub(crate) const ENTRY_READS: &str = "research/entry-reads";
pub(crate) const COMPOSED_VIEW: &str = "research/composed-view-tokens";
pub(crate) const SECTION_SIZE: &str = "research/section-size";
pub(crate) const SECTION_TOKENS: &str = "research/section-output-tokens";
pub(crate) const SECTION_WORKERS: &str = "research/section-workers";
pub(crate) const SEARCHES: &str = "tools/searches-per-run";
pub(crate) const RESULTS: &str = "tools/results-per-search";
pub(crate) const READS: &str = "tools/reads-per-run";
pub(crate) const HANDLE_LIFETIME: &str = "tools/source-handle-lifetime";
pub(crate) const HANDLE_CAPACITY: &str = "tools/handle-registry-capacity";
pub(crate) const SEGMENT: &str = "tools/segment-size";
pub(crate) const RETRIES: &str = "provider/transient-retries";
pub(crate) const BACKOFF: &str = "provider/retry-backoff";
pub(crate) const TIMEOUT: &str = "provider/request-timeout";
pub(crate) const CONTEXT: &str = "prompts/context-budget";
pub(crate) const TURN_TOKENS: &str = "prompts/turn-output-tokens";
pub(crate) const QUEUE: &str = "server/request-queue-capacity";
pub(crate) const BODY_LIMIT: &str = "server/request-body-limit";
pub(crate) const HEADER_TIMEOUT: &str = "server/header-timeout";
pub(crate) const BODY_TIMEOUT: &str = "server/body-timeout";
pub(crate) const DECODE_BATCH: &str = "server/decode-batch";
pub(crate) const UPSTREAM_CONCURRENCY: &str = "server/upstream-concurrency";
pub(crate) const MAX_LOADED_MODELS: &str = "server/max-loaded-models";
pub(crate) const KEEP_ALIVE: &str = "server/keep-alive";
pub(crate) const MODEL_MEMORY: &str = "server/model-memory-mb";

/// Half of this machine's memory in MB (`/proc/meminfo`; 8 GB where it
/// cannot be read): the default memory budget of loaded models.
fn half_the_memory_mb() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<i64>().ok())
        })
        .map_or(8192, |kb| (kb / 1024 / 2).max(1))
}
pub(crate) const REPEAT_LAST_N: &str = "sampling/repeat-last-n";
pub(crate) const NO_REPEAT_NGRAM: &str = "sampling/no-repeat-ngram";

/// Tokens a section worker's request needs besides its section and reply
/// (instructions, question, focus), for the composition check.
pub(crate) const SECTION_OVERHEAD: i64 = 256;

/// The research runtime's declarations.
fn research_runtime() -> Vec<Policy> {
    let o = "research-runtime";
    let v = "research-runtime-policy@1";
    vec![
        p(ROUNDS, o, v, Unit::Rounds, 12, 64, Some("chat.max_tool_iters")),
        // Never binds before 64 rounds, the final turn and its correction.
        p(TOTAL_REQUESTS, o, v, Unit::Requests, 200, 1000, None),
        p(RESERVE, o, v, Unit::Requests, 2, 2, None),
        p(DEADLINE, o, v, Unit::Seconds, 1800, 86_400, Some("chat.run_deadline_secs")),
        p(RESEARCH_SHARE, o, v, Unit::Seconds, 80, 95, None),
        // Section analysis (docs/budgets.md "Section analysis spends research,
        // never the reserve"): workers spend the research allowance.
        p(SECTION_REQUESTS, o, v, Unit::Requests, 24, 256, None),
        p(SECTION_SIZE, o, v, Unit::Characters, 3000, 32_000, None),
        p(SECTION_TOKENS, o, v, Unit::Tokens, 256, 4096, None),
        p(SECTION_WORKERS, o, v, Unit::Requests, 4, 16, None),
        // Host-led entry research: segments read before the first model
        // turn (spent from the tools' read quota).
        p(ENTRY_READS, o, v, Unit::Calls, 3, 16, None),
        // What a composed answer's request shows the model, which only
        // orders sentences already chosen: the evidence cut to this, oldest
        // tool results (the search listing) first.
        p(COMPOSED_VIEW, o, v, Unit::Tokens, 1024, 131_072, None),
    ]
}

/// The tools' declarations.
fn tools() -> Vec<Policy> {
    let o = "tools";
    let v = "tools-policy@1";
    vec![
        p(SEARCHES, o, v, Unit::Calls, 32, 256, Some("tools.max_searches")),
        p(RESULTS, o, v, Unit::Results, 5, 20, None),
        p(READS, o, v, Unit::Calls, 64, 512, None),
        p(HANDLE_LIFETIME, o, v, Unit::Seconds, 7200, 604_800, None),
        p(HANDLE_CAPACITY, o, v, Unit::Handles, 256, 4096, None),
        p(SEGMENT, o, v, Unit::Characters, 1500, 16_000, None),
    ]
}

/// The provider layer's declarations.
fn provider() -> Vec<Policy> {
    let o = "provider";
    let v = "provider-policy@1";
    vec![
        p(RETRIES, o, v, Unit::Requests, 2, 5, None),
        p(BACKOFF, o, v, Unit::Milliseconds, 250, 10_000, None),
        p(TIMEOUT, o, v, Unit::Seconds, 120, 3600, None),
    ]
}

/// The prompts layer's declarations.
fn prompts() -> Vec<Policy> {
    let o = "prompts";
    let v = "prompts-policy@1";
    vec![
        p(CONTEXT, o, v, Unit::Tokens, 8192, 131_072, None),
        p(TURN_TOKENS, o, v, Unit::Tokens, 512, 8192, None),
    ]
}

/// The server's declarations.
fn server() -> Vec<Policy> {
    let o = "server";
    let v = "server-policy@1";
    vec![
        p(QUEUE, o, v, Unit::Requests, 32, 4096, None),
        p(BODY_LIMIT, o, v, Unit::Bytes, 4 << 20, 256 << 20, None),
        // How long a client may take to send a request's headers (and a
        // kept-alive connection may idle), then its body: a client that
        // sends half a request is dropped instead of holding a connection.
        p(HEADER_TIMEOUT, o, v, Unit::Seconds, 20, 600, None),
        p(BODY_TIMEOUT, o, v, Unit::Seconds, 30, 3600, None),
        // Chat completions decoding together (one batched pass per token).
        p(DECODE_BATCH, o, v, Unit::Requests, 8, 64, None),
        // Requests in flight to an upstream engine (`serve --provider
        // openai`): sized for a batching server; more wait in the queue.
        p(UPSTREAM_CONCURRENCY, o, v, Unit::Requests, 16, 1024, None),
        // Models loaded at once (each on its engine thread); loading one
        // more unloads the least recently used idle one.
        p(MAX_LOADED_MODELS, o, v, Unit::Models, 3, 64, None),
        // How long an idle model stays loaded (a request's `keep_alive`
        // overrides it for that model).
        p(KEEP_ALIVE, o, v, Unit::Seconds, 300, 31_536_000, None),
        // The memory loaded models may take together (their files' sizes);
        // loading past it unloads idle models, and a model bigger than it
        // is refused (507).
        p(MODEL_MEMORY, o, v, Unit::Megabytes, half_the_memory_mb(), 16 << 20, None),
    ]
}

/// The sampling rules' declarations: how far back a request's or a model
/// entry's repetition rules may look. Requests are held to the values in
/// force (`SamplingLimits::in_force`); models.toml, read before policies
/// load, to the hard maxima (`SamplingLimits::declared`).
fn sampling() -> Vec<Policy> {
    let o = "sampling";
    let v = "sampling-policy@1";
    vec![
        // Tokens the penalties count over, per sampled token.
        p(REPEAT_LAST_N, o, v, Unit::Tokens, 4096, 131_072, None),
        // The longest n-gram the no-repeat rule may be asked to ban.
        p(NO_REPEAT_NGRAM, o, v, Unit::Tokens, 32, 256, None),
    ]
}

/// The bounds of the sampling knobs that are policies (see `sampling()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SamplingLimits {
    /// Most tokens `repeat_last_n` may name.
    pub(crate) repeat_last_n: usize,
    /// Largest `no_repeat_ngram`.
    pub(crate) no_repeat_ngram: usize,
}

impl SamplingLimits {
    /// The declared hard maxima: what configuration may set.
    pub(crate) fn declared() -> SamplingLimits {
        let max = |id: &str| {
            sampling().into_iter().find(|p| p.id == id).map_or(0, |p| p.hard_max as usize)
        };
        SamplingLimits { repeat_last_n: max(REPEAT_LAST_N), no_repeat_ngram: max(NO_REPEAT_NGRAM) }
    }

    /// The values in force: what a request may ask for.
    pub(crate) fn in_force(ps: &Policies) -> SamplingLimits {
        SamplingLimits {
            repeat_last_n: ps.get(REPEAT_LAST_N) as usize,
            no_repeat_ngram: ps.get(NO_REPEAT_NGRAM) as usize,
        }
    }
}

/// Declared policies and the values in force.
#[derive(Debug, Clone)]
pub(crate) struct Policies {
    pub(crate) decls: BTreeMap<String, Policy>,
    pub(crate) values: BTreeMap<String, i64>,
    /// The values before the user settings: the declarations' defaults
    /// with the configuration file's values (what [`Policies::with_settings`]
    /// puts the settings stored now over).
    configured: BTreeMap<String, i64>,
}

/// The optional configuration file (`$AGENTD_HOME/policies.toml`, or
/// `AGENTD_POLICIES`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// Values for declared policies (within their hard maximum).
    #[serde(default)]
    values: BTreeMap<String, i64>,
    /// Further declarations (a module's own, or a deployment's).
    #[serde(default)]
    declare: Vec<Policy>,
}

impl Policies {
    /// Declares `p`; a different declaration of the same id is refused,
    /// naming both.
    fn declare(&mut self, p: Policy, origin: &str) -> Result<()> {
        if p.default > p.hard_max || p.default < 0 {
            bail!(
                "{origin}: policy {} declares default {} outside 0..={}",
                p.id,
                p.default,
                p.hard_max
            );
        }
        if let Some(old) = self.decls.get(&p.id) {
            if *old != p {
                bail!(
                    "conflicting declarations of policy {}: owner {} {} ({}, default {}, max {}) and owner {} {} ({}, default {}, max {}) from {origin}; refusing to start",
                    p.id, old.owner, old.version, old.unit.as_str(), old.default, old.hard_max,
                    p.owner, p.version, p.unit.as_str(), p.default, p.hard_max
                );
            }
            return Ok(());
        }
        self.values.insert(p.id.clone(), p.default);
        self.decls.insert(p.id.clone(), p);
        Ok(())
    }

    /// Every module's declarations, the configuration file, the user
    /// settings; then the composition checks.
    pub(crate) fn load(store: &super::store::Store) -> Result<Policies> {
        Policies::load_with(store, None)
    }

    /// What [`Policies::load`] would give were `key` stored as `value`:
    /// whether a setting composes with the other limits before it is
    /// stored (a value that breaks a composition would stop the next run,
    /// and the next start).
    pub(crate) fn admit_setting(store: &super::store::Store, key: &str, value: i64) -> Result<()> {
        Policies::load_with(store, Some((key, value))).map(|_| ())
    }

    fn load_with(store: &super::store::Store, candidate: Option<(&str, i64)>) -> Result<Policies> {
        let mut ps = Policies {
            decls: BTreeMap::new(),
            values: BTreeMap::new(),
            configured: BTreeMap::new(),
        };
        for (origin, list) in [
            ("research-runtime", research_runtime()),
            ("tools", tools()),
            ("provider", provider()),
            ("prompts", prompts()),
            ("server", server()),
            ("sampling", sampling()),
            ("mcp", super::mcp_policy::declarations()),
        ] {
            for p in list {
                ps.declare(p, origin)?;
            }
        }
        let path = std::env::var_os("AGENTD_POLICIES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| super::home::home().join("policies.toml"));
        if path.is_file() {
            let origin = path.display().to_string();
            let text =
                std::fs::read_to_string(&path).with_context(|| format!("cannot read {origin}"))?;
            let f: File = toml::from_str(&text)
                .with_context(|| format!("{origin} is not a valid policy file"))?;
            for d in f.declare {
                ps.declare(d, &origin)?;
            }
            for (id, v) in f.values {
                ps.set(&id, v, &origin)?;
            }
        }
        ps.configured = ps.values.clone();
        ps.apply_settings(store, candidate)?;
        ps.check()?;
        Ok(ps)
    }

    /// The user settings as they are stored now (or `candidate` for its
    /// key, unless the environment sets it) over the configured values.
    fn apply_settings(
        &mut self,
        store: &super::store::Store,
        candidate: Option<(&str, i64)>,
    ) -> Result<()> {
        use super::settings::{self, Source};
        self.values = self.configured.clone();
        for d in settings::DEFS {
            if let Some(p) =
                self.decls.values().find(|p| p.setting.as_deref() == Some(d.key)).cloned()
            {
                let e = settings::get(store, d.key)?;
                let value = match candidate {
                    Some((key, v)) if key == d.key && e.source != Source::Env => Some(v),
                    // A setting left at its default does not override the file.
                    _ => (e.source != Source::Default).then_some(e.value),
                };
                if let Some(v) = value {
                    self.set(&p.id, v, &format!("setting {}", d.key))?;
                }
            }
        }
        Ok(())
    }

    /// These policies with the user settings as they are stored now: what
    /// a new run is admitted under, so a setting changed while the daemon
    /// runs applies to its next run. The configuration file is not read
    /// again (it is read at start-up).
    pub(crate) fn with_settings(&self, store: &super::store::Store) -> Result<Policies> {
        let mut ps = self.clone();
        ps.apply_settings(store, None)?;
        ps.check()?;
        Ok(ps)
    }

    fn set(&mut self, id: &str, v: i64, origin: &str) -> Result<()> {
        let Some(p) = self.decls.get(id) else {
            bail!(
                "{origin}: no policy {id} is declared (known: {})",
                self.decls.keys().cloned().collect::<Vec<_>>().join(", ")
            );
        };
        if v < 0 || v > p.hard_max {
            bail!(
                "{origin}: policy {id} = {v} is outside 0..={} ({})",
                p.hard_max,
                p.unit.as_str()
            );
        }
        self.values.insert(id.into(), v);
        Ok(())
    }

    /// The value in force of a declared policy.
    pub(crate) fn get(&self, id: &str) -> i64 {
        // INVARIANT: only ids declared in this module are read.
        self.values
            .get(id)
            .copied()
            .unwrap_or_else(|| panic!("policy {id} is read but not declared"))
    }

    /// Composition checks: each failure names both limits.
    pub(crate) fn check(&self) -> Result<()> {
        let g = |id| self.get(id);
        if g(HANDLE_LIFETIME) < g(DEADLINE) {
            bail!(
                "{HANDLE_LIFETIME} = {} s is shorter than {DEADLINE} = {} s: handles found early in a run would expire before it ends",
                g(HANDLE_LIFETIME), g(DEADLINE)
            );
        }
        if g(HANDLE_CAPACITY) < g(SEARCHES) * g(RESULTS) {
            bail!(
                "{HANDLE_CAPACITY} = {} is less than {SEARCHES} × {RESULTS} = {} × {} = {}: permitted searches could return sources that cannot be registered",
                g(HANDLE_CAPACITY), g(SEARCHES), g(RESULTS), g(SEARCHES) * g(RESULTS)
            );
        }
        let reserve_max = self.decls[RESERVE].hard_max;
        if g(RESERVE) > reserve_max {
            bail!("{RESERVE} = {} exceeds its hard maximum {reserve_max}", g(RESERVE));
        }
        if g(RESERVE) >= g(TOTAL_REQUESTS) {
            bail!(
                "{RESERVE} = {} leaves no research allowance within {TOTAL_REQUESTS} = {}",
                g(RESERVE),
                g(TOTAL_REQUESTS)
            );
        }
        if g(RESERVE) < 1 {
            bail!("{RESERVE} = 0 reserves no final answer turn");
        }
        if g(TIMEOUT) * (g(RETRIES) + 1) > g(DEADLINE) {
            bail!(
                "{TIMEOUT} × ({RETRIES} + 1) = {} × {} = {} s exceeds {DEADLINE} = {} s: one request with its retries could outlive the run",
                g(TIMEOUT), g(RETRIES) + 1, g(TIMEOUT) * (g(RETRIES) + 1), g(DEADLINE)
            );
        }
        if g(SEARCHES) < 1 || g(READS) < 1 || g(RESULTS) < 1 {
            bail!("{SEARCHES}, {READS} and {RESULTS} must each be at least 1 for a search → read → answer path");
        }
        if g(SECTION_SIZE) < 200 || g(SECTION_WORKERS) < 1 || g(SECTION_TOKENS) < 16 {
            bail!(
                "{SECTION_SIZE} = {} (at least 200), {SECTION_WORKERS} = {} (at least 1) and {SECTION_TOKENS} = {} (at least 16) cannot analyze a section",
                g(SECTION_SIZE), g(SECTION_WORKERS), g(SECTION_TOKENS)
            );
        }
        // A worker's request holds one section (at worst a token per 3
        // characters), the question and the worker's reply.
        let worker = g(SECTION_SIZE) / 3 + g(SECTION_TOKENS) + SECTION_OVERHEAD;
        if worker > g(CONTEXT) {
            bail!(
                "{SECTION_SIZE} = {} characters (about {} tokens) + {SECTION_TOKENS} = {} + {SECTION_OVERHEAD} for the question and instructions exceeds {CONTEXT} = {} tokens: a section worker's request could not fit the context; lower {SECTION_SIZE}",
                g(SECTION_SIZE), g(SECTION_SIZE) / 3, g(SECTION_TOKENS), g(CONTEXT)
            );
        }
        if g(TOTAL_REQUESTS) - g(RESERVE) < 2 {
            bail!(
                "{TOTAL_REQUESTS} = {} less {RESERVE} = {} leaves fewer than the 2 research requests a search and a read need",
                g(TOTAL_REQUESTS), g(RESERVE)
            );
        }
        super::mcp_policy::check(self)
    }

    /// The values in force, for a run's admission snapshot.
    pub(crate) fn snapshot(&self) -> Value {
        let mut m = serde_json::Map::new();
        for (id, v) in &self.values {
            m.insert(id.clone(), json!(v));
        }
        Value::Object(m)
    }

    /// Every declaration with its value, for listings.
    pub(crate) fn describe(&self) -> Vec<Value> {
        self.decls
            .values()
            .map(|p| {
                json!({"id": p.id, "owner": p.owner, "version": p.version, "unit": p.unit.as_str(),
                       "default": p.default, "hard_max": p.hard_max, "value": self.get(&p.id), "setting": p.setting})
            })
            .collect()
    }

    /// Policies restored from an admission snapshot (values outside the
    /// snapshot keep their declared defaults, never newer settings).
    pub(crate) fn from_snapshot(snapshot: &Value) -> Result<Policies> {
        let mut ps = Policies {
            decls: BTreeMap::new(),
            values: BTreeMap::new(),
            configured: BTreeMap::new(),
        };
        for list in [
            research_runtime(),
            tools(),
            provider(),
            prompts(),
            server(),
            sampling(),
            super::mcp_policy::declarations(),
        ] {
            for p in list {
                ps.declare(p, "built-in")?;
            }
        }
        for (id, v) in snapshot.as_object().into_iter().flatten() {
            if let (Some(v), true) = (v.as_i64(), ps.decls.contains_key(id)) {
                ps.values.insert(id.clone(), v);
            }
        }
        ps.configured = ps.values.clone();
        Ok(ps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Policies {
        Policies::from_snapshot(&json!({})).unwrap()
    }

    #[test]
    fn defaults_compose() {
        defaults().check().unwrap();
    }

    #[test]
    fn conflicting_declarations_are_refused_naming_both() {
        let mut ps = defaults();
        let mut other = research_runtime().into_iter().find(|p| p.id == RESERVE).unwrap();
        other.owner = "tools".into();
        let e = ps.declare(other, "policies.toml").unwrap_err().to_string();
        assert!(
            e.contains("research-runtime") && e.contains("tools") && e.contains(RESERVE),
            "{e}"
        );
        // The same declaration again is fine.
        let same = research_runtime().into_iter().find(|p| p.id == RESERVE).unwrap();
        ps.declare(same, "again").unwrap();
    }

    #[test]
    fn compositions_that_cannot_finish_are_refused_naming_both_limits() {
        let cases: Vec<(&str, i64, &[&str])> = vec![
            (HANDLE_LIFETIME, 60, &[HANDLE_LIFETIME, DEADLINE]),
            (HANDLE_CAPACITY, 50, &[HANDLE_CAPACITY, SEARCHES, RESULTS]),
            (TOTAL_REQUESTS, 2, &[RESERVE, TOTAL_REQUESTS]),
            (TIMEOUT, 1000, &[TIMEOUT, RETRIES, DEADLINE]),
            (SECTION_SIZE, 30_000, &[SECTION_SIZE, SECTION_TOKENS, CONTEXT]),
        ];
        for (id, v, names) in cases {
            let mut ps = defaults();
            ps.set(id, v, "test").unwrap();
            let e = ps.check().unwrap_err().to_string();
            for n in names {
                assert!(e.contains(n), "{id}={v}: {e}");
            }
        }
        let mut ps = defaults();
        assert!(ps.set(RESERVE, 3, "test").is_err(), "above the hard maximum");
    }

    /// A setting stored after the policies were loaded applies through
    /// `with_settings` (what each new run of the daemon is admitted under),
    /// a forgotten one gives the configured value back, and a value that
    /// would break a composition is refused before it is stored.
    #[test]
    fn settings_stored_later_apply_to_the_policies_of_the_next_run() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::store::Store::open_at(dir.path().join("s.db")).unwrap();
        let mut started = defaults();
        started.configured.insert(SEARCHES.into(), 20);
        let now = started.with_settings(&store).unwrap();
        assert_eq!((now.get(ROUNDS), now.get(SEARCHES)), (12, 20));
        super::super::settings::set(&store, "chat.max_tool_iters", "3").unwrap();
        super::super::settings::set(&store, "tools.max_searches", "7").unwrap();
        let now = started.with_settings(&store).unwrap();
        assert_eq!((now.get(ROUNDS), now.get(SEARCHES)), (3, 7));
        assert_eq!(started.get(ROUNDS), 12, "the policies a run was admitted under stay");
        super::super::settings::reset(&store, "tools.max_searches").unwrap();
        assert_eq!(started.with_settings(&store).unwrap().get(SEARCHES), 20);
        // 120 s × 3 tries exceeds a 30 s deadline.
        let e = super::super::settings::set(&store, "chat.run_deadline_secs", "30").unwrap_err();
        assert!(format!("{e:#}").contains(DEADLINE), "{e:#}");
        assert_eq!(store.setting("chat.run_deadline_secs").unwrap(), None);
    }

    #[test]
    fn sampling_limits_are_the_declared_policies() {
        let mut ps = defaults();
        let d = SamplingLimits::declared();
        assert_eq!(d.repeat_last_n as i64, ps.decls[REPEAT_LAST_N].hard_max);
        assert_eq!(d.no_repeat_ngram as i64, ps.decls[NO_REPEAT_NGRAM].hard_max);
        assert_eq!(
            SamplingLimits::in_force(&ps),
            SamplingLimits { repeat_last_n: 4096, no_repeat_ngram: 32 }
        );
        ps.set(REPEAT_LAST_N, 256, "test").unwrap();
        assert_eq!(SamplingLimits::in_force(&ps).repeat_last_n, 256);
        assert!(ps.set(NO_REPEAT_NGRAM, 257, "test").is_err(), "above the hard maximum");
    }
}
