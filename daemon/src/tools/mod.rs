//! The built-in tools the daemon runs for a research run (`Host`):
//! `search_sources` and `read_source` over the `--corpus` folders
//! (`corpus`), through run-scoped source handles (`handles`), and
//! `save_note`, a write under `--notes`; beside them the tools of the MCP
//! servers (`mcp`), under the same projection and authorization. Every call returns a typed
//! `ToolOutput` (`output`); failures go back to the model as error results,
//! they never end the loop. The host owns the tools' policies (`tools/…`)
//! and authorizes every call against its quotas.

pub(crate) mod corpus;
mod handles;
pub(crate) mod mcp;
mod output;
#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod vectors;

pub(crate) use handles::Handles;
pub(crate) use output::{Analysis, Coverage, Finding, Hit, ToolOutput};

use crate::state::policy::{self, Policies};
use corpus::Corpus;
use output::{Found, Passage};
use prompts::ToolDef;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;

/// Whether a tool only reads or also changes something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

fn error(code: &'static str, message: impl Into<String>) -> ToolOutput {
    ToolOutput::error(code, message)
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

impl Limits {
    /// The limits a set of policies allows.
    pub(crate) fn from_policies(p: &Policies) -> Limits {
        Limits {
            results_per_search: p.get(policy::RESULTS) as usize,
            searches: p.get(policy::SEARCHES) as usize,
            reads: p.get(policy::READS) as usize,
            handle_capacity: p.get(policy::HANDLE_CAPACITY) as usize,
            handle_lifetime: p.get(policy::HANDLE_LIFETIME) as u64,
        }
    }
}

/// The tools of one run.
#[derive(Debug)]
pub(crate) struct Host {
    corpus: Option<Corpus>,
    /// Why the corpus that was given could not be opened (its index could
    /// not be built or read): its tools are offered and answer this.
    corpus_failed: Option<String>,
    notes: Option<PathBuf>,
    pub(crate) handles: Handles,
    limits: Limits,
    searches: usize,
    reads: usize,
    /// The run's view of the MCP servers, when there are any.
    mcp: Option<mcp::RunTools>,
}

/// A whole source, for section analysis.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub(crate) handle: String,
    #[allow(dead_code)] // kept for diagnostics
    pub(crate) path: String,
    pub(crate) title: String,
    pub(crate) text: String,
}

/// The largest char boundary of `s` at or below `at` (`str::floor_char_boundary`,
/// which is not stable yet).
fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    (0..=at).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// Why a tool is not offered (or a call is refused) right now.
pub(crate) fn unavailable(name: &str, why: &str) -> ToolOutput {
    error("TOOL_NOT_AVAILABLE", format!("{name} cannot run now: {why}"))
}

/// A call that did not run because its row in the run's ledger of tool
/// calls could not be written (the ledger fails closed).
pub(crate) fn unrecorded(name: &str) -> ToolOutput {
    error(
        "LEDGER_WRITE_FAILED",
        format!("{name} did not run: the run's ledger could not record it, so no tool call or model request goes out after it"),
    )
}

/// How a call of a run ended, for the run's ledger of tool calls.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It never ran (budget, server down, bad arguments); why.
    Refused(String),
    /// Its row could not be written, so it never ran.
    Unrecorded,
    /// It ran (or was sent); the detail says how it ended.
    Sent { ok: bool, detail: String },
}

impl Ended {
    /// A call that ran, ended with `output`.
    pub(crate) fn ran(output: &ToolOutput) -> Ended {
        match output {
            ToolOutput::Error(e) => Ended::Sent { ok: false, detail: e.message.clone() },
            _ => Ended::Sent { ok: true, detail: "ok".into() },
        }
    }
}

pub(crate) const SEARCH: &str = "search_sources";
pub(crate) const READ: &str = "read_source";
/// Runs in the research loop (`research::sections`): it needs the model.
pub(crate) const ANALYZE: &str = "analyze_source";
const NOTE: &str = "save_note";

impl Host {
    pub(crate) fn new(corpus: Option<Corpus>, notes: Option<PathBuf>, limits: Limits) -> Host {
        Host {
            corpus,
            corpus_failed: None,
            notes,
            handles: Handles::new(limits.handle_capacity, limits.handle_lifetime),
            limits,
            searches: 0,
            reads: 0,
            mcp: None,
        }
    }

    /// The host of a run: its corpus folders indexed at the segment size of
    /// `policies`, its notes folder, the tool limits of `policies`, the
    /// MCP servers of `servers`. A corpus folder that is missing fails
    /// here; an index that cannot be built or read does not fail the run:
    /// its tools answer `SEARCH_FAILED` with the reason, and the run goes
    /// on to its answer.
    pub(crate) fn for_run(
        corpus: &[PathBuf],
        notes: Option<PathBuf>,
        policies: &Policies,
        servers: Option<Arc<mcp::Hub>>,
    ) -> anyhow::Result<Host> {
        let (corpus, failed) = if corpus.is_empty() {
            (None, None)
        } else {
            let folders = corpus::Folders::check(corpus)?;
            // A configured embedding model that cannot load fails the
            // index as any other cause does (the run goes on).
            let opened = vectors::Embedder::configured()
                .and_then(|e| Corpus::index(folders, policies.get(policy::SEGMENT) as usize, e));
            match opened {
                Ok(c) => (Some(c), None),
                Err(e) => {
                    let why = format!("the corpus index could not be opened: {e:#}; the sources cannot be searched in this run (ask again once the cause is fixed)");
                    tracing::warn!("{why}");
                    (None, Some(why))
                }
            }
        };
        let mut host = Host::new(corpus, notes, Limits::from_policies(policies));
        host.corpus_failed = failed;
        host.mcp = servers.map(|hub| mcp::RunTools::new(hub, policies));
        Ok(host)
    }

    /// Counts a call of `name` a recovered run made before, against the
    /// quota it spent.
    pub(crate) fn count_recovered(&mut self, name: &str) {
        match name {
            SEARCH => self.searches += 1,
            READ | ANALYZE => self.reads += 1,
            _ => {
                if let Some(m) = &mut self.mcp {
                    m.count_recovered(name);
                }
            }
        }
    }

    /// Why `name` cannot run now (quota spent), if it cannot.
    pub(crate) fn spent(&self, name: &str) -> Option<String> {
        match name {
            SEARCH if self.searches >= self.limits.searches => Some(format!(
                "the search quota of {} per reply is spent; read the sources already found",
                self.limits.searches
            )),
            READ | ANALYZE if self.reads >= self.limits.reads => {
                Some(format!("the read quota of {} per reply is spent", self.limits.reads))
            }
            _ => self.mcp.as_ref().and_then(|m| m.spent(name)),
        }
    }

    /// The kind of a tool, `None` when unknown.
    pub(crate) fn kind(&self, name: &str) -> Option<Kind> {
        match name {
            SEARCH | READ | ANALYZE => Some(Kind::Read),
            NOTE => Some(Kind::Write),
            _ => self.mcp.as_ref().and_then(|m| m.kind(name)),
        }
    }

    /// Tools this host can run.
    pub(crate) fn tools(&self) -> Vec<ToolDef> {
        let mut v = Vec::new();
        if self.corpus.is_some() || self.corpus_failed.is_some() {
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
            v.push(ToolDef {
                name: ANALYZE.into(),
                description: "Analyze a whole long source section by section, by the handle of any of its segments; returns findings that bear on the question (and the focus), cited by section.".into(),
                parameters: json!({"type": "object", "properties": {
                    "handle": {"type": "string", "description": "a handle such as S1"},
                    "focus": {"type": "string", "description": "what to look for (optional)"}},
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
        if let Some(m) = &self.mcp {
            v.extend(m.tools());
        }
        v
    }

    /// Runs a call of a run. `record` writes the call's row to the run's
    /// ledger of tool calls just before the call runs (after the checks
    /// that refuse it without running it) and answers whether the row was
    /// written: a call whose row could not be written never runs, built-in
    /// or MCP, read or write. Never fails: problems become error results,
    /// and the `Ended` says whether the call ran and how it ended.
    pub(crate) fn call_in_run(
        &mut self,
        name: &str,
        arguments: &str,
        record: &mut dyn FnMut() -> bool,
    ) -> (ToolOutput, Ended) {
        if let Some(m) = self.mcp.as_mut().filter(|m| m.owns(name)) {
            let args: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
            return m.call(name, args, record);
        }
        if !record() {
            return (unrecorded(name), Ended::Unrecorded);
        }
        let output = self.call(name, arguments);
        let ended = Ended::ran(&output);
        (output, ended)
    }

    /// What the ledger of tool calls says of `name`: `read` for a tool
    /// that only reads, `write` for any other (an unknown one included).
    pub(crate) fn kind_label(&self, name: &str) -> &'static str {
        match self.kind(name) {
            Some(Kind::Read) => "read",
            _ => "write",
        }
    }

    /// Runs one call. Never fails: problems become error results.
    pub(crate) fn call(&mut self, name: &str, arguments: &str) -> ToolOutput {
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
            ANALYZE => error("NOT_AVAILABLE", "analyze_source runs only inside a research run"),
            _ => error(
                "UNKNOWN_TOOL",
                format!(
                    "no tool named {name:?}; available: {}",
                    self.tools().iter().map(|t| t.name.clone()).collect::<Vec<_>>().join(", ")
                ),
            ),
        }
    }

    /// Whether the run has a corpus (an answer over it should cite it).
    pub(crate) fn has_corpus(&self) -> bool {
        self.corpus.is_some()
    }

    /// The whole source a handle belongs to (any of its segments), for
    /// `analyze_source`: counted against the read quota. The handle
    /// returned is the source's first segment's (registered if needed).
    pub(crate) fn whole_source(&mut self, args: &Value) -> Result<Source, ToolOutput> {
        let Some(corpus) = &self.corpus else {
            return Err(self.no_corpus());
        };
        let Some(handle) = args.get("handle").and_then(Value::as_str) else {
            return Err(error("INVALID_ARGUMENTS", "`handle` must be a string such as \"S1\""));
        };
        if let Some(why) = self.spent(ANALYZE) {
            return Err(unavailable(ANALYZE, &why));
        }
        let handle = handle.trim().trim_matches(|c| c == '[' || c == ']');
        let path = match self.handles.lookup(handle) {
            Ok(r) => r.path.clone(),
            Err(why) => return Err(error("INVALID_SOURCE", why)),
        };
        self.reads += 1;
        match corpus.read_all(&path) {
            Ok(Some((title, text))) => Ok(Source { handle: handle.to_owned(), path, title, text }),
            Ok(None) => Err(error(
                "INVALID_SOURCE",
                format!("the file behind {handle} is no longer in the corpus"),
            )),
            Err(e) => Err(error("READ_FAILED", format!("{e:#}"))),
        }
    }

    /// The answer of a corpus tool without a corpus: none was given, or
    /// its index failed.
    fn no_corpus(&self) -> ToolOutput {
        match &self.corpus_failed {
            Some(why) => error("SEARCH_FAILED", why.clone()),
            None => error("NOT_AVAILABLE", "no corpus was given (--corpus DIR)"),
        }
    }

    /// Marks `handle` as read (its source was analyzed).
    pub(crate) fn mark_analyzed(&mut self, handle: &str) {
        self.handles.mark_read(handle);
    }

    fn search(&mut self, args: &Value) -> ToolOutput {
        let Some(corpus) = &self.corpus else {
            return self.no_corpus();
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
        let mut coverage = Coverage::Complete;
        let hits: Vec<Hit> = hits
            .into_iter()
            .filter_map(|h| match self.handles.register(&h.path, h.segment, &h.title) {
                Some(handle) => Some(Hit {
                    handle,
                    title: h.title,
                    path: h.path,
                    segment: h.segment,
                    snippet: h.snippet,
                }),
                None => {
                    // Never hand out a handle that was not registered.
                    coverage = Coverage::Partial;
                    None
                }
            })
            .collect();
        let note = (coverage == Coverage::Partial).then(|| {
            format!(
                "the handle registry is full ({} handles); only sources that could be registered are listed",
                self.limits.handle_capacity
            )
        });
        ToolOutput::Search(Found { hits, coverage, note })
    }

    fn read(&mut self, args: &Value) -> ToolOutput {
        let Some(corpus) = &self.corpus else {
            return self.no_corpus();
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
                ToolOutput::Read(Passage {
                    handle: h,
                    title: s.title,
                    segment: s.segment,
                    segments: s.segments,
                    text: s.text,
                    heading: s.heading,
                })
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

    fn save_note(&mut self, args: &Value) -> ToolOutput {
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
        // At most 60 bytes, cut at a character boundary: a title is model
        // output and may be any text.
        slug.truncate(floor_char_boundary(&slug, 60));
        if slug.is_empty() {
            slug = "note".into();
        }
        if let Err(e) = std::fs::create_dir_all(dir) {
            return error("WRITE_FAILED", format!("cannot create {}: {e}", dir.display()));
        }
        // A new file, created exclusively (O_EXCL): never an existing one,
        // and never through a link someone left in the folder (a dangling
        // one would lead the write out of it).
        let mut name = format!("{slug}.md");
        let mut n = 2;
        let file = loop {
            match std::fs::OpenOptions::new().write(true).create_new(true).open(dir.join(&name)) {
                Ok(f) => break f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 10_000 => {
                    name = format!("{slug}-{n}.md");
                    n += 1;
                }
                Err(e) => return error("WRITE_FAILED", format!("cannot create {name}: {e}")),
            }
        };
        let mut file = file;
        match std::io::Write::write_all(&mut file, format!("# {title}\n\n{text}\n").as_bytes()) {
            Ok(()) => ToolOutput::Saved(name),
            Err(e) => error("WRITE_FAILED", format!("cannot write {name}: {e}")),
        }
    }
}

/// `agentd search`: the corpus of `folders` searched for `query` as
/// `search_sources` searches it (the segment size in force; vectors fused in
/// when `AGENTD_CORPUS_EMBED_MODEL` names a model), each hit printed as one
/// JSON object `{"path", "segment", "title", "snippet"}`, best first.
pub(crate) fn search_cmd(folders: &[PathBuf], limit: usize, query: &str) -> anyhow::Result<()> {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        path: &'a str,
        segment: usize,
        title: &'a str,
        snippet: &'a str,
    }
    let folders = corpus::Folders::check(folders)?;
    let store = crate::state::store::Store::open()?;
    let segment = crate::state::policy::Policies::load(&store)?.get(policy::SEGMENT) as usize;
    let corpus = Corpus::index(folders, segment, vectors::Embedder::configured()?)?;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for h in corpus.search(query, limit.max(1))? {
        let line = Line { path: &h.path, segment: h.segment, title: &h.title, snippet: &h.snippet };
        match writeln!(out, "{}", serde_json::to_string(&line)?) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            r => r?,
        }
    }
    Ok(())
}
