//! The model manager of `agentd serve` (local engine): every GGUF file in
//! the models folder (and each `--models DIR`) and every registry model
//! present is served; a request names its model, which loads on first use
//! — once, however many requests ask at the same time — on an engine
//! thread of its own (`worker.rs`). A model serving a request holds a
//! [`Lease`] and is never unloaded; an idle one unloads after its
//! keep-alive (`server/keep-alive`, or the request's `keep_alive`), and
//! loading past `server/max-loaded-models` unloads the least recently used
//! idle one first.

use super::metrics::Metrics;
use super::worker::Worker;
use crate::provider::build::EngineArgs;
use crate::provider::engine::{Batch, Card};
use crate::research::RunConfig;
use crate::state::policy::{self, Policies};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

/// A loaded model and its engine thread.
#[derive(Debug)]
pub(crate) struct Served {
    pub(crate) name: String,
    pub(crate) worker: Worker,
    pub(crate) card: Arc<Card>,
    pub(crate) context: usize,
    /// Why its engine failed for good, once it has (`/health`).
    pub(crate) failed: Arc<Mutex<Option<String>>>,
    /// Requests holding a lease now.
    busy: AtomicUsize,
    /// When the last request ended (or the model loaded), and how long it
    /// stays loaded idle after that.
    idle: Mutex<(Instant, Duration)>,
}

impl Served {
    fn idle_until(&self) -> Option<Instant> {
        if self.busy.load(Ordering::SeqCst) > 0 {
            return None;
        }
        self.idle.lock().ok().map(|g| g.0 + g.1)
    }

    /// When an idle model unloads, as wall-clock time (`/api/ps`).
    pub(crate) fn expires_at(&self) -> SystemTime {
        let (since, keep) = self.idle.lock().map(|g| *g).unwrap_or((Instant::now(), FOREVER));
        let left = (since + keep).saturating_duration_since(Instant::now());
        SystemTime::now() + left.min(FOREVER)
    }
}

/// How long a model stays loaded when a request says "keep it" (a
/// negative `keep_alive`): far beyond any daemon's life.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A request's hold on its model: while one exists, the model is not
/// unloaded. Dropping it (the request ended) starts the model's idle time,
/// with the request's own keep-alive when it gave one.
#[derive(Debug)]
pub(crate) struct Lease {
    served: Arc<Served>,
    keep: Option<Duration>,
    models: Weak<Models>,
}

impl Lease {
    /// The request's `keep_alive`, applied when it ends.
    pub(crate) fn keep_alive(&mut self, keep: Option<Duration>) {
        if keep.is_some() {
            self.keep = keep;
        }
    }

    /// Whether the request asked to unload the model when it ends
    /// (`keep_alive: 0`).
    pub(crate) fn unloads(&self) -> bool {
        self.keep.is_some_and(|k| k.is_zero())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Ok(mut g) = self.served.idle.lock() {
            g.0 = Instant::now();
            if let Some(k) = self.keep {
                g.1 = k;
            }
        }
        self.served.busy.fetch_sub(1, Ordering::SeqCst);
        if let Some(m) = self.models.upgrade() {
            m.changed.notify_all();
        }
    }
}

/// Why a model cannot serve a request.
#[derive(Debug)]
pub(crate) enum ModelError {
    /// No served model has that name.
    Unknown { name: String, looked_in: Vec<PathBuf> },
    /// The file is there but could not be loaded.
    Load { name: String, why: String },
    /// The model alone is bigger than the memory budget.
    TooBig { name: String, bytes: u64, budget: u64 },
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelError::Unknown { name, looked_in } => write!(
                f,
                "model {name:?} not found: models are looked for in {} and the registry (GET /api/tags lists them; `agentd pull` fetches one)",
                looked_in.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
            ModelError::Load { name, why } => write!(f, "model {name:?} could not be loaded: {why}"),
            ModelError::TooBig { name, bytes, budget } => write!(
                f,
                "model {name:?} needs {} MB but loaded models may take {} MB together (policy server/model-memory-mb)",
                bytes >> 20,
                budget >> 20
            ),
        }
    }
}

/// A model that can be served: its name and file.
#[derive(Debug, Clone)]
pub(crate) struct Available {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    /// The registry's sha256, when the model is a registry entry.
    pub(crate) sha256: Option<String>,
}

enum Slot {
    /// Being loaded; its file's size in bytes.
    Loading(u64),
    Ready(Arc<Served>),
}

/// What every engine thread is started with.
pub(crate) struct Template {
    pub(crate) engine: EngineArgs,
    pub(crate) policies: Policies,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) config: RunConfig,
    pub(crate) capacity: usize,
    /// Folders of GGUF files besides the models folder (`--models DIR`).
    pub(crate) dirs: Vec<PathBuf>,
}

impl std::fmt::Debug for Models {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Models").field("default", &self.default).finish_non_exhaustive()
    }
}

/// What a model's engine thread reports once the model is loaded.
struct Loaded {
    name: String,
    card: Arc<Card>,
    context: usize,
    failed: Arc<Mutex<Option<String>>>,
}

impl Template {
    /// Starts an engine thread that loads the model `args` names on itself
    /// (`Worker::start_loading`) and serves it.
    fn load(&self, args: EngineArgs) -> anyhow::Result<(Worker, Loaded)> {
        let p = &self.policies;
        let (context_cap, batch) =
            (p.get(policy::CONTEXT) as usize, p.get(policy::DECODE_BATCH) as usize);
        Worker::start_loading(
            move || Batch::load(&args, context_cap, batch),
            |b: &Batch| Loaded {
                name: b.name(),
                card: Arc::new(b.card()),
                context: b.context(),
                failed: b.health(),
            },
            self.policies.clone(),
            Arc::clone(&self.metrics),
            self.config.clone(),
            self.capacity,
        )
    }
}

/// The models a daemon serves, and the loaded ones.
pub(crate) struct Models {
    template: Template,
    /// The model a request that names none gets, and its file (served
    /// whether or not it lies in a models folder, loaded or not).
    pub(crate) default: String,
    default_path: PathBuf,
    max_loaded: usize,
    /// Bytes loaded models may take together.
    memory: u64,
    keep_alive: Duration,
    slots: Mutex<HashMap<String, Slot>>,
    changed: Condvar,
    loads: Mutex<BTreeMap<String, u64>>,
    /// Cards of model files read from their headers (for listings of
    /// models not loaded), by path, with the modification time read.
    cards: Mutex<HashMap<PathBuf, Described>>,
}

/// What the listings say of a model: its card and context, and the file's
/// modification time when it was read.
#[derive(Clone)]
struct Described {
    card: Arc<Card>,
    context: usize,
    modified: Option<std::time::SystemTime>,
}

impl Models {
    /// The manager, with the default model (`template.engine`'s, loaded
    /// now, so a broken default model fails the start) and the thread that
    /// unloads idle models.
    pub(crate) fn start(template: Template) -> anyhow::Result<Arc<Models>> {
        let (worker, loaded) = template.load(template.engine.clone())?;
        let p = &template.policies;
        let models = Arc::new(Models {
            default: loaded.name.clone(),
            default_path: loaded.card.path.clone(),
            max_loaded: (p.get(policy::MAX_LOADED_MODELS) as usize).max(1),
            memory: (p.get(policy::MODEL_MEMORY).max(1) as u64) << 20,
            keep_alive: Duration::from_secs(p.get(policy::KEEP_ALIVE) as u64),
            slots: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            loads: Mutex::new(BTreeMap::new()),
            cards: Mutex::new(HashMap::new()),
            template,
        });
        let served = models.served(worker, loaded);
        if let Ok(mut s) = models.slots.lock() {
            s.insert(served.name.clone(), Slot::Ready(served));
        }
        let weak = Arc::downgrade(&models);
        std::thread::Builder::new().name("agentd-models".into()).spawn(move || reap(&weak))?;
        Ok(models)
    }

    /// Where GGUF files are looked for.
    pub(crate) fn dirs(&self) -> Vec<PathBuf> {
        let mut d = vec![crate::state::home::models_dir()];
        d.extend(self.template.dirs.iter().cloned());
        d
    }

    /// Every model that can be served: the default, registry models present
    /// here, and GGUF files in the folders (named by their file stem).
    pub(crate) fn available(&self) -> Vec<Available> {
        let mut out: Vec<Available> = Vec::new();
        let mut push =
            |a: Available| match out.iter_mut().find(|o| o.name == a.name || o.path == a.path) {
                // The default model is also a registry entry: keep its checksum.
                Some(o) => {
                    if o.sha256.is_none() {
                        o.sha256 = a.sha256;
                    }
                }
                None => out.push(a),
            };
        push(Available {
            name: self.default.clone(),
            path: self.default_path.clone(),
            sha256: None,
        });
        if let Ok(reg) = crate::state::registry::Registry::load() {
            for (name, e) in &reg.entries {
                let path = e.local_path();
                if path.is_file() {
                    push(Available { name: name.clone(), path, sha256: Some(e.sha256.clone()) });
                }
            }
        }
        for dir in self.dirs() {
            for path in crate::state::home::gguf_files(&dir) {
                let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
                push(Available { name, path, sha256: None });
            }
        }
        out
    }

    /// The served model a client's name means: `NAME`, `NAME:latest`, a
    /// file name or stem, a suffix of the name; the default for none (or
    /// `default`, `agentd`).
    pub(crate) fn find(&self, requested: Option<&str>) -> Result<Available, ModelError> {
        let all = self.available();
        let Some(m) = wanted(requested) else {
            if let Some(d) = all.iter().find(|a| a.name == self.default) {
                return Ok(d.clone());
            }
            return Err(ModelError::Unknown { name: self.default.clone(), looked_in: self.dirs() });
        };
        let stem = |a: &Available| a.path.file_stem().and_then(|s| s.to_str()).map(str::to_owned);
        let file = |a: &Available| a.path.file_name().and_then(|s| s.to_str()).map(str::to_owned);
        let hit = all
            .iter()
            .find(|a| a.name == m)
            .or_else(|| {
                all.iter().find(|a| stem(a).as_deref() == Some(m) || file(a).as_deref() == Some(m))
            })
            .or_else(|| all.iter().find(|a| a.path.to_str() == Some(m)))
            .or_else(|| all.iter().find(|a| a.name.ends_with(m) && m.len() >= 3));
        hit.cloned()
            .ok_or_else(|| ModelError::Unknown { name: m.to_owned(), looked_in: self.dirs() })
    }

    /// The card and context of the model `requested` names, without
    /// loading it: the loaded model's, else what its file's header says
    /// (read once per version of the file). Blocking: call it off the
    /// async threads.
    pub(crate) fn describe(
        &self,
        requested: Option<&str>,
    ) -> Result<(String, Arc<Card>, usize), ModelError> {
        let want = self.find(requested)?;
        if let Some(Slot::Ready(s)) =
            self.slots.lock().unwrap_or_else(|p| p.into_inner()).get(&want.name)
        {
            return Ok((want.name, Arc::clone(&s.card), s.context));
        }
        let modified = std::fs::metadata(&want.path).and_then(|m| m.modified()).ok();
        let mut cards = self.cards.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = cards.get(&want.path).filter(|d| d.modified == modified) {
            return Ok((want.name, Arc::clone(&d.card), d.context));
        }
        let cap = self.template.policies.get(policy::CONTEXT) as usize;
        let (card, context) = crate::provider::engine::file_card(&want.path, cap)
            .map_err(|e| ModelError::Load { name: want.name.clone(), why: format!("{e:#}") })?;
        let card = Arc::new(card);
        cards.insert(want.path, Described { card: Arc::clone(&card), context, modified });
        Ok((want.name, card, context))
    }

    /// The model `requested` names, loaded (waiting for a load another
    /// request started), with a lease on it. Blocking: call it off the
    /// async threads.
    pub(crate) fn get(self: &Arc<Self>, requested: Option<&str>) -> Result<Lease, ModelError> {
        let want = self.find(requested)?;
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match slots.get(&want.name) {
                Some(Slot::Ready(s)) => return Ok(self.lease(s)),
                Some(Slot::Loading(_)) => {
                    slots = self.changed.wait(slots).unwrap_or_else(|p| p.into_inner());
                }
                None => break,
            }
        }
        let bytes = std::fs::metadata(&want.path).map_or(0, |m| m.len());
        if bytes > self.memory {
            return Err(ModelError::TooBig { name: want.name.clone(), bytes, budget: self.memory });
        }
        // This request loads it; others asking meanwhile wait for it.
        slots.insert(want.name.clone(), Slot::Loading(bytes));
        self.make_room(&mut slots);
        drop(slots);
        let mut args = self.template.engine.clone();
        args.model = Some(want.path.to_string_lossy().into_owned());
        // `--draft-model` drafts for the default model; any other takes its
        // registry entry's `draft` (`resolve` finds the entry of a file
        // named by its path, with its context, KV type and the rest).
        if want.path != self.default_path {
            args.draft_model = None;
        }
        let started = self.template.load(args);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let result = match started {
            Ok((worker, loaded)) => {
                let served = self.served(worker, Loaded { name: want.name.clone(), ..loaded });
                slots.insert(want.name.clone(), Slot::Ready(Arc::clone(&served)));
                Ok(self.lease(&served))
            }
            Err(e) => {
                slots.remove(&want.name);
                Err(ModelError::Load { name: want.name.clone(), why: format!("{e:#}") })
            }
        };
        self.changed.notify_all();
        result
    }

    /// A request's hold on `served`.
    fn lease(self: &Arc<Self>, served: &Arc<Served>) -> Lease {
        served.busy.fetch_add(1, Ordering::SeqCst);
        Lease { served: Arc::clone(served), keep: None, models: Arc::downgrade(self) }
    }

    /// A loaded model's entry, counting the load.
    fn served(&self, worker: Worker, loaded: Loaded) -> Arc<Served> {
        let Loaded { name, card, context, failed } = loaded;
        if let Ok(mut l) = self.loads.lock() {
            *l.entry(name.clone()).or_default() += 1;
        }
        tracing::info!(model = name, "model loaded");
        Arc::new(Served {
            name,
            worker,
            card,
            context,
            failed,
            busy: AtomicUsize::new(0),
            idle: Mutex::new((Instant::now(), self.keep_alive)),
        })
    }

    /// Unloads idle models, least recently used first, until the loaded
    /// ones and those loading fit under `server/max-loaded-models` and
    /// `server/model-memory-mb` (a busy model is never unloaded: then the
    /// limits are exceeded until one goes idle).
    fn make_room(&self, slots: &mut HashMap<String, Slot>) {
        loop {
            let count = slots.len();
            let bytes: u64 = slots
                .values()
                .map(|s| match s {
                    Slot::Ready(s) => s.card.file_bytes,
                    Slot::Loading(b) => *b,
                })
                .sum();
            if count <= self.max_loaded && bytes <= self.memory {
                return;
            }
            let lru = slots
                .iter()
                .filter_map(|(n, s)| match s {
                    Slot::Ready(s) if s.busy.load(Ordering::SeqCst) == 0 => Some((n, s)),
                    _ => None,
                })
                .min_by_key(|(_, s)| s.idle.lock().map(|g| g.0).unwrap_or_else(|_| Instant::now()))
                .map(|(n, _)| n.clone());
            let Some(name) = lru else { return };
            unload(slots, &name, "to make room");
        }
    }

    /// The loaded models (`/api/ps`).
    pub(crate) fn loaded(&self) -> Vec<Arc<Served>> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<Arc<Served>> = slots
            .values()
            .filter_map(|s| match s {
                Slot::Ready(s) => Some(Arc::clone(s)),
                Slot::Loading(_) => None,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Unloads `name` now if it is loaded and idle (`keep_alive: 0` with no
    /// prompt); `false` when it is busy.
    pub(crate) fn unload_now(&self, name: &str) -> bool {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        match slots.get(name) {
            Some(Slot::Ready(s)) if s.busy.load(Ordering::SeqCst) > 0 => false,
            Some(Slot::Ready(_)) => {
                unload(&mut slots, name, "on request");
                true
            }
            _ => true,
        }
    }

    /// Loads per model since the daemon started (`/metrics`).
    pub(crate) fn loads(&self) -> BTreeMap<String, u64> {
        self.loads.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl Lease {
    /// The model this lease holds.
    pub(crate) fn served(&self) -> &Arc<Served> {
        &self.served
    }
}

/// Takes `name` out of the loaded set and stops its engine thread (which
/// ends once idle, freeing the model's memory).
fn unload(slots: &mut HashMap<String, Slot>, name: &str, why: &str) {
    if let Some(Slot::Ready(s)) = slots.remove(name) {
        tracing::info!(model = name, why, "model unloaded");
        s.worker.stop();
    }
}

/// The thread that unloads models idle past their keep-alive; it wakes
/// when a request ends and at the next expiry.
fn reap(models: &Weak<Models>) {
    loop {
        let Some(m) = models.upgrade() else { return };
        let mut slots = m.slots.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let expired: Vec<String> = slots
            .iter()
            .filter_map(|(n, s)| match s {
                Slot::Ready(s) if s.idle_until().is_some_and(|t| t <= now) => Some(n.clone()),
                _ => None,
            })
            .collect();
        for name in expired {
            unload(&mut slots, &name, "keep-alive ended");
        }
        let next = slots
            .values()
            .filter_map(|s| match s {
                Slot::Ready(s) => s.idle_until(),
                Slot::Loading(_) => None,
            })
            .min()
            .map_or(Duration::from_secs(60), |t| t.saturating_duration_since(now))
            .clamp(Duration::from_millis(10), Duration::from_secs(60));
        let (slots, _) = m.changed.wait_timeout(slots, next).unwrap_or_else(|p| p.into_inner());
        drop(slots);
        drop(m);
    }
}

/// The model name a client asked for, as served: trimmed, Ollama's
/// `:latest` dropped; `None` when it asks for the default (no name, an
/// empty one, `default` or `agentd`).
pub(crate) fn wanted(requested: Option<&str>) -> Option<&str> {
    let m = requested.unwrap_or("").trim();
    let m = m.strip_suffix(":latest").unwrap_or(m);
    (!(m.is_empty() || m == "default" || m == "agentd")).then_some(m)
}

/// A request's `keep_alive` (Ollama's conventions): a duration string
/// (`"10m"`, `"30s"`, `"1h"`, `"500ms"`), a number of seconds, `0` (unload
/// when done) or negative (keep loaded); `None` when absent.
pub(crate) fn keep_alive(v: Option<&serde_json::Value>) -> Result<Option<Duration>, String> {
    use serde_json::Value;
    let secs = |s: f64| {
        if s < 0.0 {
            FOREVER
        } else {
            Duration::from_secs_f64(s.min(FOREVER.as_secs_f64()))
        }
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(Some(secs(n.as_f64().unwrap_or(0.0)))),
        Some(Value::String(s)) => {
            let s = s.trim();
            let (num, unit) =
                s.find(|c: char| c.is_ascii_alphabetic()).map_or((s, "s"), |i| (&s[..i], &s[i..]));
            let n: f64 = num.trim().parse().map_err(|_| {
                format!("`keep_alive` {s:?} is not a duration (write \"10m\", \"30s\", seconds, 0 or -1)")
            })?;
            let scale = match unit {
                "ms" => 0.001,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(format!("`keep_alive` {s:?}: the unit must be ms, s, m or h")),
            };
            Ok(Some(secs(n * scale)))
        }
        Some(_) => Err("`keep_alive` must be a duration string or a number of seconds".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keep_alive_reads_ollama_durations() {
        assert_eq!(keep_alive(None).unwrap(), None);
        assert_eq!(keep_alive(Some(&json!("10m"))).unwrap(), Some(Duration::from_secs(600)));
        assert_eq!(keep_alive(Some(&json!("30s"))).unwrap(), Some(Duration::from_secs(30)));
        assert_eq!(keep_alive(Some(&json!("1.5h"))).unwrap(), Some(Duration::from_secs(5400)));
        assert_eq!(keep_alive(Some(&json!(0))).unwrap(), Some(Duration::ZERO));
        assert_eq!(keep_alive(Some(&json!("0"))).unwrap(), Some(Duration::ZERO));
        assert_eq!(keep_alive(Some(&json!(-1))).unwrap(), Some(FOREVER));
        assert_eq!(keep_alive(Some(&json!(300))).unwrap(), Some(Duration::from_secs(300)));
        assert!(keep_alive(Some(&json!("soon"))).is_err());
        assert!(keep_alive(Some(&json!("5d"))).is_err());
        assert!(keep_alive(Some(&json!([1]))).is_err());
    }

    proptest::proptest! {
        /// Any `keep_alive` a client sends (a string, a number) is read or
        /// refused, never a panic; what is read is at most "forever".
        #[test]
        fn any_keep_alive_is_read_or_refused(s in "\\PC{0,12}", n in proptest::num::f64::NORMAL) {
            for v in [json!(s), json!(n)] {
                if let Ok(Some(d)) = keep_alive(Some(&v)) {
                    proptest::prop_assert!(d <= FOREVER);
                }
            }
        }

        /// Any model name: `wanted` never panics, and what it keeps is the
        /// name as sent, trimmed, less at most a `:latest` tag.
        #[test]
        fn any_model_name_is_read(s in "\\PC{0,24}") {
            if let Some(m) = wanted(Some(&s)) {
                let t = s.trim();
                let tagged = format!("{m}:latest");
                proptest::prop_assert!(m == t || tagged == t);
            }
        }
    }
}
