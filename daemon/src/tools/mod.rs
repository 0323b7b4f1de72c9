//! The built-in tools the daemon executes: `search_sources` and
//! `read_source` over the `--corpus` folders (run-scoped source handles
//! `S1`, `S2`, …) and `save_note`, a write under `--notes`. Failures go back
//! to the model as results; they never end the loop.

pub(crate) mod corpus;

use corpus::Corpus;
use prompts::ToolDef;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

/// Whether a tool only reads or also changes something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// A tool call's result, as the model and the events see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolResult {
    pub(crate) ok: bool,
    /// JSON text.
    pub(crate) content: String,
}

fn error(code: &str, message: impl Into<String>) -> ToolResult {
    ToolResult {
        ok: false,
        content: json!({"error": {"code": code, "message": message.into()}}).to_string(),
    }
}

/// One registered handle, as stored with the run (for recovery).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandleRec {
    pub(crate) handle: String,
    pub(crate) path: String,
    pub(crate) segment: usize,
    pub(crate) title: String,
    /// Seconds since the Unix epoch when it was issued.
    pub(crate) issued: u64,
    pub(crate) read_ok: bool,
}

fn epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Run-scoped source handles: a source (file and segment) keeps the handle
/// it was first given. Capacity and lifetime come from policies; a failed
/// registration is never returned as a handle.
#[derive(Debug, Default)]
pub(crate) struct Handles {
    by_source: HashMap<(String, usize), String>,
    recs: HashMap<String, HandleRec>,
    read_ok: BTreeSet<String>,
    next: usize,
    capacity: usize,
    lifetime: u64,
    /// Records changed since the last `take_changed`.
    changed: Vec<String>,
}

impl Handles {
    fn new(capacity: usize, lifetime: u64) -> Handles {
        Handles { capacity, lifetime, ..Handles::default() }
    }

    /// The handle of a source, registering it; `None` when the registry is
    /// full.
    fn register(&mut self, path: &str, segment: usize, title: &str) -> Option<String> {
        if let Some(h) = self.by_source.get(&(path.to_owned(), segment)) {
            return Some(h.clone());
        }
        if self.recs.len() >= self.capacity {
            return None;
        }
        self.next += 1;
        let h = format!("S{}", self.next);
        self.by_source.insert((path.to_owned(), segment), h.clone());
        let rec = HandleRec {
            handle: h.clone(),
            path: path.into(),
            segment,
            title: title.into(),
            issued: epoch(),
            read_ok: false,
        };
        self.recs.insert(h.clone(), rec);
        self.changed.push(h.clone());
        Some(h)
    }

    fn lookup(&self, h: &str) -> Result<&HandleRec, String> {
        let r = self
            .recs
            .get(h)
            .ok_or_else(|| format!("{h:?} is not a handle from search_sources in this run"))?;
        if epoch().saturating_sub(r.issued) > self.lifetime {
            return Err(format!("{h} expired ({} s after it was issued)", self.lifetime));
        }
        Ok(r)
    }

    fn mark_read(&mut self, h: &str) {
        self.read_ok.insert(h.to_owned());
        if let Some(r) = self.recs.get_mut(h) {
            r.read_ok = true;
            self.changed.push(h.to_owned());
        }
    }

    /// Handles read successfully in this run.
    pub(crate) fn read(&self) -> &BTreeSet<String> {
        &self.read_ok
    }

    /// Title of a handle.
    #[allow(dead_code)]
    pub(crate) fn title(&self, h: &str) -> Option<&str> {
        self.recs.get(h).map(|r| r.title.as_str())
    }

    /// Records registered or read since the last call (to store with the run).
    pub(crate) fn take_changed(&mut self) -> Vec<HandleRec> {
        let mut hs = std::mem::take(&mut self.changed);
        hs.dedup();
        hs.iter().filter_map(|h| self.recs.get(h).cloned()).collect()
    }

    /// Restores handles stored with a run (recovery).
    pub(crate) fn restore(&mut self, recs: Vec<HandleRec>) {
        for r in recs {
            let n: usize = r.handle.trim_start_matches('S').parse().unwrap_or(0);
            self.next = self.next.max(n);
            self.by_source.insert((r.path.clone(), r.segment), r.handle.clone());
            if r.read_ok {
                self.read_ok.insert(r.handle.clone());
            }
            self.recs.insert(r.handle.clone(), r);
        }
    }
}

/// The tool limits of a run (from its policies).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) results_per_search: usize,
    pub(crate) searches: usize,
    pub(crate) reads: usize,
    pub(crate) handle_capacity: usize,
    pub(crate) handle_lifetime: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            results_per_search: 5,
            searches: 32,
            reads: 64,
            handle_capacity: 256,
            handle_lifetime: 7200,
        }
    }
}

/// The tools of one run.
#[derive(Debug)]
pub(crate) struct Host {
    corpus: Option<Corpus>,
    notes: Option<PathBuf>,
    pub(crate) handles: Handles,
    limits: Limits,
    pub(crate) searches: usize,
    pub(crate) reads: usize,
}

/// Why a tool is not offered (or a call is refused) right now.
pub(crate) fn unavailable(name: &str, why: &str) -> ToolResult {
    error("TOOL_NOT_AVAILABLE", format!("{name} cannot run now: {why}"))
}

const SEARCH: &str = "search_sources";
const READ: &str = "read_source";
const NOTE: &str = "save_note";

impl Host {
    pub(crate) fn new(corpus: Option<Corpus>, notes: Option<PathBuf>, limits: Limits) -> Host {
        Host {
            corpus,
            notes,
            handles: Handles::new(limits.handle_capacity, limits.handle_lifetime),
            limits,
            searches: 0,
            reads: 0,
        }
    }

    /// Why `name` cannot run now (quota spent), if it cannot.
    pub(crate) fn spent(&self, name: &str) -> Option<String> {
        match name {
            SEARCH if self.searches >= self.limits.searches => Some(format!(
                "the search quota of {} per reply is spent; read the sources already found",
                self.limits.searches
            )),
            READ if self.reads >= self.limits.reads => {
                Some(format!("the read quota of {} per reply is spent", self.limits.reads))
            }
            _ => None,
        }
    }

    /// The kind of a tool, `None` when unknown.
    pub(crate) fn kind(name: &str) -> Option<Kind> {
        match name {
            SEARCH | READ => Some(Kind::Read),
            NOTE => Some(Kind::Write),
            _ => None,
        }
    }

    /// Tools this host can run.
    pub(crate) fn tools(&self) -> Vec<ToolDef> {
        let mut v = Vec::new();
        if self.corpus.is_some() {
            v.push(ToolDef {
                name: SEARCH.into(),
                description: "Search the local sources. Returns matching sources with handles (S1, S2, …) to read and cite.".into(),
                parameters: json!({"type": "object", "properties": {
                    "query": {"type": "string", "description": "words to look for"},
                    "limit": {"type": "integer", "description": "most results (default 5)"}},
                    "required": ["query"]}),
            });
            v.push(ToolDef {
                name: READ.into(),
                description: "Read a source found by search_sources, by its handle. Long sources come in segments.".into(),
                parameters: json!({"type": "object", "properties": {
                    "handle": {"type": "string", "description": "a handle such as S1"},
                    "segment": {"type": "integer", "description": "which segment, from 1"}},
                    "required": ["handle"]}),
            });
        }
        if self.notes.is_some() {
            v.push(ToolDef {
                name: NOTE.into(),
                description: "Save a note (a markdown file) for the user.".into(),
                parameters: json!({"type": "object", "properties": {
                    "title": {"type": "string"}, "text": {"type": "string"}},
                    "required": ["title", "text"]}),
            });
        }
        v
    }

    /// Runs one call. Never fails: problems become error results.
    pub(crate) fn execute(&mut self, name: &str, arguments: &str) -> ToolResult {
        let args: Value = match serde_json::from_str(arguments) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return error(
                    "INVALID_ARGUMENTS",
                    format!("arguments must be a JSON object, got {arguments:?}"),
                )
            }
        };
        if let Some(why) = self.spent(name) {
            return unavailable(name, &why);
        }
        match name {
            SEARCH => {
                self.searches += 1;
                self.search(&args)
            }
            READ => {
                self.reads += 1;
                self.read(&args)
            }
            NOTE => self.save_note(&args),
            _ => error(
                "UNKNOWN_TOOL",
                format!(
                    "no tool named {name:?}; available: {}",
                    self.tools().iter().map(|t| t.name.clone()).collect::<Vec<_>>().join(", ")
                ),
            ),
        }
    }

    fn search(&mut self, args: &Value) -> ToolResult {
        let Some(corpus) = &self.corpus else {
            return error("NOT_AVAILABLE", "no corpus was given (--corpus DIR)");
        };
        let Some(query) =
            args.get("query").and_then(Value::as_str).filter(|q| !q.trim().is_empty())
        else {
            return error("INVALID_ARGUMENTS", "`query` must be a non-empty string");
        };
        let max = self.limits.results_per_search.max(1);
        let limit = args
            .get("limit")
            .and_then(Value::as_u64)
            .map(|l| l as usize)
            .unwrap_or(max)
            .clamp(1, max);
        let hits = match corpus.search(query, limit) {
            Ok(h) => h,
            Err(e) => return error("SEARCH_FAILED", format!("{e:#}")),
        };
        let mut partial = false;
        let results: Vec<Value> = hits
            .iter()
            .filter_map(|h| match self.handles.register(&h.path, h.segment, &h.title) {
                Some(handle) => Some(json!({"handle": handle, "title": h.title, "path": h.path, "segment": h.segment, "snippet": h.snippet})),
                None => {
                    // Never hand out a handle that was not registered.
                    partial = true;
                    None
                }
            })
            .collect();
        let mut out =
            json!({"results": results, "coverage": if partial { "partial" } else { "complete" }});
        if partial {
            out["note"] = json!(format!(
                "the handle registry is full ({} handles); only sources that could be registered are listed",
                self.limits.handle_capacity
            ));
        }
        ToolResult { ok: true, content: out.to_string() }
    }

    fn read(&mut self, args: &Value) -> ToolResult {
        let Some(corpus) = &self.corpus else {
            return error("NOT_AVAILABLE", "no corpus was given (--corpus DIR)");
        };
        let Some(handle) = args.get("handle").and_then(Value::as_str) else {
            return error("INVALID_ARGUMENTS", "`handle` must be a string such as \"S1\"");
        };
        let handle = handle.trim().trim_matches(|c| c == '[' || c == ']');
        let (path, seg) = match self.handles.lookup(handle) {
            Ok(r) => (r.path.clone(), r.segment),
            Err(why) => return error("INVALID_SOURCE", why),
        };
        let want = args.get("segment").and_then(Value::as_u64).map(|s| s as usize).unwrap_or(seg);
        match corpus.read(&path, want) {
            Ok(Some(s)) if want >= 1 && want <= s.segments => {
                // Another segment of the same file gets its own handle.
                let h = if want == seg {
                    handle.to_owned()
                } else {
                    match self.handles.register(&path, want, &s.title) {
                        Some(h) => h,
                        None => {
                            return error(
                                "REGISTRY_FULL",
                                format!("segment {want} of {handle} cannot get a handle: the registry holds {} handles", self.limits.handle_capacity),
                            )
                        }
                    }
                };
                self.handles.mark_read(&h);
                ToolResult {
                    ok: true,
                    content: json!({"handle": h, "title": s.title, "segment": s.segment, "segments": s.segments, "text": s.text}).to_string(),
                }
            }
            Ok(Some(s)) => error(
                "INVALID_SEGMENT",
                format!("{handle} has segments 1 to {}, not {want}", s.segments),
            ),
            Ok(None) => error(
                "INVALID_SOURCE",
                format!("the file behind {handle} is no longer in the corpus"),
            ),
            Err(e) => error("READ_FAILED", format!("{e:#}")),
        }
    }

    fn save_note(&mut self, args: &Value) -> ToolResult {
        let Some(dir) = &self.notes else {
            return error("NOT_AVAILABLE", "no notes folder was given (--notes DIR)");
        };
        let (Some(title), Some(text)) =
            (args.get("title").and_then(Value::as_str), args.get("text").and_then(Value::as_str))
        else {
            return error("INVALID_ARGUMENTS", "`title` and `text` must be strings");
        };
        let mut slug: String = title
            .chars()
            .map(|c| if c.is_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
            .collect::<String>()
            .split('-')
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("-");
        slug.truncate(60);
        if slug.is_empty() {
            slug = "note".into();
        }
        if let Err(e) = std::fs::create_dir_all(dir) {
            return error("WRITE_FAILED", format!("cannot create {}: {e}", dir.display()));
        }
        let mut name = format!("{slug}.md");
        let mut n = 2;
        while dir.join(&name).exists() {
            name = format!("{slug}-{n}.md");
            n += 1;
        }
        match std::fs::write(dir.join(&name), format!("# {title}\n\n{text}\n")) {
            Ok(()) => ToolResult { ok: true, content: json!({"saved": name}).to_string() },
            Err(e) => error("WRITE_FAILED", format!("cannot write {name}: {e}")),
        }
    }
}
