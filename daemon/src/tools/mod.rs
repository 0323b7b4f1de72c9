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
    ToolResult { ok: false, content: json!({"error": {"code": code, "message": message.into()}}).to_string() }
}

/// Run-scoped source handles: a source (file and segment) keeps the handle
/// it was first given.
#[derive(Debug, Default)]
pub(crate) struct Handles {
    by_source: HashMap<(String, usize), String>,
    by_handle: HashMap<String, (String, usize, String)>,
    read_ok: BTreeSet<String>,
    next: usize,
}

impl Handles {
    fn register(&mut self, path: &str, segment: usize, title: &str) -> String {
        if let Some(h) = self.by_source.get(&(path.to_owned(), segment)) {
            return h.clone();
        }
        self.next += 1;
        let h = format!("S{}", self.next);
        self.by_source.insert((path.to_owned(), segment), h.clone());
        self.by_handle.insert(h.clone(), (path.to_owned(), segment, title.to_owned()));
        h
    }

    /// Handles read successfully in this run.
    pub(crate) fn read(&self) -> &BTreeSet<String> {
        &self.read_ok
    }

    /// Title of a handle.
    pub(crate) fn title(&self, h: &str) -> Option<&str> {
        self.by_handle.get(h).map(|(_, _, t)| t.as_str())
    }
}

/// The tools of one run.
#[derive(Debug)]
pub(crate) struct Host {
    corpus: Option<Corpus>,
    notes: Option<PathBuf>,
    pub(crate) handles: Handles,
}

const SEARCH: &str = "search_sources";
const READ: &str = "read_source";
const NOTE: &str = "save_note";

impl Host {
    pub(crate) fn new(corpus: Option<Corpus>, notes: Option<PathBuf>) -> Host {
        Host { corpus, notes, handles: Handles::default() }
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
            _ => return error("INVALID_ARGUMENTS", format!("arguments must be a JSON object, got {arguments:?}")),
        };
        match name {
            SEARCH => self.search(&args),
            READ => self.read(&args),
            NOTE => self.save_note(&args),
            _ => error("UNKNOWN_TOOL", format!("no tool named {name:?}; available: {}", self.tools().iter().map(|t| t.name.clone()).collect::<Vec<_>>().join(", "))),
        }
    }

    fn search(&mut self, args: &Value) -> ToolResult {
        let Some(corpus) = &self.corpus else {
            return error("NOT_AVAILABLE", "no corpus was given (--corpus DIR)");
        };
        let Some(query) = args.get("query").and_then(Value::as_str).filter(|q| !q.trim().is_empty()) else {
            return error("INVALID_ARGUMENTS", "`query` must be a non-empty string");
        };
        let limit = args.get("limit").and_then(Value::as_u64).unwrap_or(5).clamp(1, 20) as usize;
        let hits = match corpus.search(query, limit) {
            Ok(h) => h,
            Err(e) => return error("SEARCH_FAILED", format!("{e:#}")),
        };
        let results: Vec<Value> = hits
            .iter()
            .map(|h| {
                let handle = self.handles.register(&h.path, h.segment, &h.title);
                json!({"handle": handle, "title": h.title, "path": h.path, "segment": h.segment, "snippet": h.snippet})
            })
            .collect();
        ToolResult { ok: true, content: json!({"results": results, "coverage": "complete"}).to_string() }
    }

    fn read(&mut self, args: &Value) -> ToolResult {
        let Some(corpus) = &self.corpus else {
            return error("NOT_AVAILABLE", "no corpus was given (--corpus DIR)");
        };
        let Some(handle) = args.get("handle").and_then(Value::as_str) else {
            return error("INVALID_ARGUMENTS", "`handle` must be a string such as \"S1\"");
        };
        let handle = handle.trim().trim_matches(|c| c == '[' || c == ']');
        let Some((path, seg, _title)) = self.handles.by_handle.get(handle).cloned() else {
            return error("INVALID_SOURCE", format!("{handle:?} is not a handle from search_sources in this run"));
        };
        let want = args.get("segment").and_then(Value::as_u64).map(|s| s as usize).unwrap_or(seg);
        match corpus.read(&path, want) {
            Ok(Some(s)) if want >= 1 && want <= s.segments => {
                // Another segment of the same file gets its own handle.
                let h = if want == seg { handle.to_owned() } else { self.handles.register(&path, want, &s.title) };
                self.handles.read_ok.insert(h.clone());
                ToolResult {
                    ok: true,
                    content: json!({"handle": h, "title": s.title, "segment": s.segment, "segments": s.segments, "text": s.text}).to_string(),
                }
            }
            Ok(Some(s)) => error("INVALID_SEGMENT", format!("{handle} has segments 1 to {}, not {want}", s.segments)),
            Ok(None) => error("INVALID_SOURCE", format!("the file behind {handle} is no longer in the corpus")),
            Err(e) => error("READ_FAILED", format!("{e:#}")),
        }
    }

    fn save_note(&mut self, args: &Value) -> ToolResult {
        let Some(dir) = &self.notes else {
            return error("NOT_AVAILABLE", "no notes folder was given (--notes DIR)");
        };
        let (Some(title), Some(text)) = (args.get("title").and_then(Value::as_str), args.get("text").and_then(Value::as_str)) else {
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
