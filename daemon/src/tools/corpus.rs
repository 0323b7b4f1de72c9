//! The searchable corpus: the `--corpus` folders' markdown, text and source
//! files, split into segments and indexed with tantivy under
//! `$AGENTD_HOME/index/`. The index is rebuilt when any file changes (size
//! or modification time), when files come or go, or when the segment size
//! changes. Runs that open the same index at once — threads of one daemon,
//! or several `agentd` processes on one home — take turns
//! ([`IndexLock`]): the first to find it stale rebuilds it, the others wait
//! and then open what it built.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};
use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, STORED, STRING,
};
use tantivy::snippet::SnippetGenerator;
use tantivy::{doc, Index, IndexReader, ReloadPolicy, TantivyDocument};

const EXTENSIONS: &[&str] = &[
    "md",
    "markdown",
    "txt",
    "text",
    "rst",
    "adoc",
    "org",
    "rs",
    "py",
    "js",
    "ts",
    "tsx",
    "jsx",
    "go",
    "java",
    "kt",
    "c",
    "h",
    "cc",
    "cpp",
    "hpp",
    "cs",
    "rb",
    "php",
    "swift",
    "scala",
    "sh",
    "bash",
    "zsh",
    "toml",
    "yaml",
    "yml",
    "json",
    "ini",
    "cfg",
    "conf",
    "sql",
    "html",
    "css",
    "tex",
    "csv",
    "lua",
    "pl",
    "r",
    "jl",
    "hs",
    "ml",
    "ex",
    "exs",
    "erl",
    "clj",
    "vim",
    "dockerfile",
    "makefile",
];
const SKIP_DIRS: &[&str] =
    &[".git", "target", "node_modules", ".venv", "__pycache__", ".hg", ".svn"];
/// Files larger than this are not indexed (bytes).
const MAX_FILE: u64 = 4 << 20;
/// Bumped when what is indexed changes (2: the title field also holds the
/// file's path, titles come from markdown front matter first; 3: English
/// stemming; 4: section headings).
const SCHEMA_VERSION: u32 = 4;

/// One indexed piece of a file.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    #[allow(dead_code)] // kept for diagnostics
    pub(crate) path: String,
    pub(crate) title: String,
    pub(crate) segment: usize,
    pub(crate) segments: usize,
    pub(crate) text: String,
    /// The markdown heading in effect where the segment starts (the
    /// section it continues; empty when none).
    pub(crate) heading: String,
}

/// A search hit.
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    pub(crate) path: String,
    pub(crate) segment: usize,
    pub(crate) title: String,
    pub(crate) snippet: String,
}

/// The indexed corpus.
pub(crate) struct Corpus {
    /// Each folder (canonical) with the name its sources' paths start with
    /// (`names`): unique within the corpus.
    roots: Vec<(String, PathBuf)>,
    index: Index,
    reader: IndexReader,
    f_title: Field,
    f_heading: Field,
    f_body: Field,
    f_path: Field,
    f_seg: Field,
    segment_chars: usize,
    /// The segments' vectors, when an embedding model is configured
    /// (`vectors.rs`).
    vectors: Option<super::vectors::Vectors>,
}

impl std::fmt::Debug for Corpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Corpus").field("roots", &self.roots).finish()
    }
}

#[derive(Debug, Clone, PartialEq)]
struct FileStamp {
    rel: String,
    abs: PathBuf,
    size: u64,
    mtime: u128,
}

fn wanted(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_ascii_lowercase();
    if name.starts_with('.') {
        return false;
    }
    let ext = p.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext {
        Some(e) => EXTENSIONS.contains(&e.as_str()),
        None => {
            matches!(name.as_str(), "readme" | "license" | "makefile" | "dockerfile" | "changelog")
        }
    }
}

/// The name of each folder, in order, that its sources' paths start with:
/// its own name (`corpus` for one without, such as `/`), and when an
/// earlier folder took that name, the name with the first free `-2`, `-3`
/// … added — so `a/docs` and `b/docs` are `docs` and `docs-2`, every path
/// leads back to one folder, and the names stay the same for the same
/// `--corpus` list.
fn names(roots: &[PathBuf]) -> Vec<String> {
    let mut taken: Vec<String> = Vec::new();
    for r in roots {
        let base = r
            .file_name()
            .map(|n| n.to_string_lossy().replace(['/', '\\'], "_"))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "corpus".to_owned());
        let mut name = base.clone();
        let mut n = 2;
        while taken.contains(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        taken.push(name);
    }
    taken
}

fn walk(top: &str, root: &Path, dir: &Path, out: &mut Vec<FileStamp>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            let name = e.file_name().to_string_lossy().to_string();
            if !name.starts_with('.') && !SKIP_DIRS.contains(&name.as_str()) {
                walk(top, root, &p, out);
            }
        } else if ft.is_file() && wanted(&p) {
            if let Ok(m) = e.metadata() {
                if m.len() > MAX_FILE {
                    continue;
                }
                let mtime = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                let rel = p.strip_prefix(root).unwrap_or(&p).to_string_lossy().replace('\\', "/");
                let rel = format!("{top}/{rel}");
                out.push(FileStamp { rel, abs: p.clone(), size: m.len(), mtime });
            }
        }
    }
}

/// The markdown headings (`#` to `######`, outside code fences) of
/// `text`, in order; `fenced` carries an open fence across segments.
fn headings<'a>(text: &'a str, fenced: &mut bool) -> Vec<&'a str> {
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            *fenced = !*fenced;
        } else if !*fenced && t.starts_with('#') {
            let h = t.trim_start_matches('#');
            if t.len() - h.len() <= 6 && (h.is_empty() || h.starts_with(' ')) {
                out.push(h.trim());
            }
        }
    }
    out
}

/// The last heading of `segments`, as text: the section a following
/// segment continues.
pub(crate) fn heading_before(segments: &[String]) -> String {
    let mut fenced = false;
    let mut last = "";
    for s in segments {
        if let Some(h) = headings(s, &mut fenced).last() {
            last = h;
        }
    }
    last.to_owned()
}

/// For each segment, the headings it stands under: the one in effect where
/// it starts, then those in it (what the index's `heading` field holds).
fn section_headings(segments: &[String]) -> Vec<String> {
    let mut fenced = false;
    let mut last = String::new();
    segments
        .iter()
        .map(|s| {
            let inner = headings(s, &mut fenced);
            let mut all = vec![last.clone()];
            all.extend(inner.iter().map(|h| h.to_string()));
            if let Some(h) = inner.last() {
                last = h.to_string();
            }
            all.retain(|h| !h.is_empty());
            all.join("\n")
        })
        .collect()
}

/// How much a match in a segment's section headings counts against one in
/// its text or its file's title (measured on the research-qa set: 0.5
/// answered one question more than without the field, 1.0 one fewer, 2.0
/// two fewer — a heading word is also in the text it heads).
const HEADING_BOOST: f32 = 0.5;

/// A file's title and its segments, each with the section headings it
/// stands under — what the index holds of it (and the vectors embed);
/// `None` when it cannot be read as UTF-8 text.
fn file_segments(f: &FileStamp, segment_chars: usize) -> Option<(String, Vec<(String, String)>)> {
    let text = String::from_utf8(std::fs::read(&f.abs).ok()?).ok()?;
    let segs = split_segments(&text, segment_chars);
    let heads = section_headings(&segs);
    Some((title_of(&f.rel, &text), segs.into_iter().zip(heads).collect()))
}

/// A segment's first 200 characters: the snippet of a hit the index has no
/// highlight for.
fn opening(text: &str) -> String {
    text.chars().take(200).collect::<String>().trim().to_owned()
}

/// How deep each ranking goes into a fusion (`Corpus::search`).
const FUSED: usize = 30;

/// Splits `text` into segments of about `max` characters, at paragraph
/// breaks where it can, else at line breaks, else anywhere.
pub(crate) fn split_segments(text: &str, max: usize) -> Vec<String> {
    let max = max.max(64);
    let mut out = Vec::new();
    let mut cur = String::new();
    for para in text.split_inclusive("\n\n") {
        if cur.chars().count() + para.chars().count() <= max {
            cur.push_str(para);
            continue;
        }
        if !cur.trim().is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        cur.clear();
        if para.chars().count() <= max {
            cur.push_str(para);
            continue;
        }
        // A long paragraph: break at lines, then at characters.
        for line in para.split_inclusive('\n') {
            if cur.chars().count() + line.chars().count() > max && !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            let mut l = line;
            while l.chars().count() > max {
                let cut = l.char_indices().nth(max).map(|(i, _)| i).unwrap_or(l.len());
                out.push(l[..cut].to_owned());
                l = &l[cut..];
            }
            cur.push_str(l);
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    if out.is_empty() {
        out.push(String::new());
    }
    out
}

/// A file's title: its markdown front matter's `title`, else its first
/// heading, else its file name.
fn title_of(rel: &str, text: &str) -> String {
    if let Some(fm) = text.strip_prefix("---\n") {
        for line in fm.lines().take(40).take_while(|l| l.trim() != "---") {
            if let Some(t) = line.strip_prefix("title:") {
                let t = t.trim().trim_matches('"').trim_matches('\'').trim();
                if !t.is_empty() {
                    return t.chars().take(120).collect();
                }
            }
        }
    }
    for line in text.lines().take(40) {
        let t = line.trim();
        if let Some(h) = t.strip_prefix('#') {
            let h = h.trim_start_matches('#').trim();
            if !h.is_empty() {
                return h.chars().take(120).collect();
            }
        }
    }
    rel.rsplit('/').next().unwrap_or(rel).to_owned()
}

/// The `--corpus` folders, checked: each exists and is a folder, given
/// once, with the name its sources' paths start with ([`names`]).
#[derive(Debug)]
pub(crate) struct Folders(Vec<(String, PathBuf)>);

impl Folders {
    /// Checks `roots`, naming the first that is not a folder.
    pub(crate) fn check(roots: &[PathBuf]) -> Result<Folders> {
        let mut canon = Vec::new();
        for r in roots {
            let c = r
                .canonicalize()
                .with_context(|| format!("corpus folder {} does not exist", r.display()))?;
            if !c.is_dir() {
                anyhow::bail!("corpus {} is not a folder", r.display());
            }
            // The same folder given twice is one folder.
            if !canon.contains(&c) {
                canon.push(c);
            }
        }
        Ok(Folders(names(&canon).into_iter().zip(canon).collect()))
    }
}

/// How long a run waits for another process's turn at an index (its
/// rebuild) before it gives up with an error naming the lock file.
const LOCK_WAIT: Duration = Duration::from_secs(600);

/// A turn at one index folder: held while a run checks whether the index
/// is fresh, rebuilds it if not, and opens its reader, so two runs never
/// rebuild it together (tantivy allows one writer per folder; a second
/// fails `LockBusy`) nor open it while it is being replaced. Inside this
/// process a mutex per folder orders the threads; across processes an
/// exclusive lock on `FOLDER.lock` beside the folder (released by the
/// system when a process dies, so a crashed build never blocks the next).
struct IndexLock<'a> {
    _file: Option<File>,
    _thread: MutexGuard<'a, ()>,
}

/// The mutex of each index folder this process has opened.
fn folder_mutex(dir: &Path) -> Arc<Mutex<()>> {
    static FOLDERS: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = OnceLock::new();
    let mut all =
        FOLDERS.get_or_init(Default::default).lock().unwrap_or_else(PoisonError::into_inner);
    Arc::clone(all.entry(dir.to_owned()).or_default())
}

impl<'a> IndexLock<'a> {
    /// Waits for the turn at `dir` (within `wait` for another process's).
    fn take(dir: &Path, thread: &'a Mutex<()>, wait: Duration) -> Result<IndexLock<'a>> {
        // A thread that panicked while holding it left nothing half-done
        // that the next one does not check again.
        let guard = thread.lock().unwrap_or_else(PoisonError::into_inner);
        let path = dir.with_extension("lock");
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open the index lock {}", path.display()))?;
        let start = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(IndexLock { _file: Some(file), _thread: guard }),
                Err(TryLockError::WouldBlock) if start.elapsed() < wait => {
                    std::thread::sleep(Duration::from_millis(25));
                }
                Err(TryLockError::WouldBlock) => anyhow::bail!(
                    "another agentd process has held the corpus index lock {} for over {} s (building the index of a large corpus?); wait for it to finish, or stop it, and ask again",
                    path.display(),
                    wait.as_secs()
                ),
                Err(TryLockError::Error(e)) if e.kind() == std::io::ErrorKind::Unsupported => {
                    // A file system without locks: threads still take
                    // turns; processes cannot be kept apart here.
                    tracing::warn!(
                        "the file system of {} has no file locks: agentd processes sharing this home may rebuild the corpus index together",
                        path.display()
                    );
                    return Ok(IndexLock { _file: None, _thread: guard });
                }
                Err(TryLockError::Error(e)) => {
                    return Err(e).with_context(|| {
                        format!("cannot lock the corpus index lock {}", path.display())
                    })
                }
            }
        }
    }
}

impl Corpus {
    /// Opens (building or refreshing as needed) the index of `roots`.
    #[cfg(test)]
    pub(crate) fn open(roots: &[PathBuf], segment_chars: usize) -> Result<Corpus> {
        Corpus::index(Folders::check(roots)?, segment_chars, None)
    }

    /// Opens (building or refreshing as needed) the index of `folders`, and
    /// with `embedder` the segments' vectors beside it (`vectors.rs`),
    /// made under the same turn as the index.
    pub(crate) fn index(
        folders: Folders,
        segment_chars: usize,
        embedder: Option<Arc<super::vectors::Embedder>>,
    ) -> Result<Corpus> {
        let roots = folders.0;
        let mut h = Sha256::new();
        for (_, r) in &roots {
            h.update(r.to_string_lossy().as_bytes());
            h.update([0]);
        }
        let key: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
        let dir = crate::state::home::home().join("index").join(key);
        // Whether the index is fresh is decided, and a stale one rebuilt,
        // by one run at a time, on the files as they are then.
        let mutex = folder_mutex(&dir);
        let _turn = IndexLock::take(&dir, &mutex, LOCK_WAIT)?;
        let mut files = Vec::new();
        for (top, r) in &roots {
            walk(top, r, r, &mut files);
        }
        let manifest: String = std::iter::once(format!("v{SCHEMA_VERSION} seg{segment_chars}"))
            .chain(files.iter().map(|f| format!("{}\t{}\t{}", f.rel, f.size, f.mtime)))
            .collect::<Vec<_>>()
            .join("\n");
        let mut sb = Schema::builder();
        // English stemming (tantivy's `en_stem`), so a question's
        // `remove` finds a page about `removal`.
        let text = TextOptions::default().set_stored().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer("en_stem")
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        );
        let f_title = sb.add_text_field("title", text.clone());
        // The section headings a segment stands under (the one in effect
        // where it starts and those in it): what its text is about, so a
        // question naming an API or a setting finds its section.
        let f_heading = sb.add_text_field("heading", text.clone());
        let f_body = sb.add_text_field("body", text);
        let f_path = sb.add_text_field("path", STRING | STORED);
        let f_seg = sb.add_u64_field("segment", STORED);
        let schema = sb.build();
        let fresh = std::fs::read_to_string(dir.join("manifest.txt")).ok().as_deref()
            == Some(manifest.as_str());
        let index = if fresh { Index::open_in_dir(&dir).ok() } else { None };
        let index = match index {
            Some(i) => i,
            None => {
                std::fs::remove_dir_all(&dir).ok();
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                let index = Index::create_in_dir(&dir, schema.clone()).or_else(|_| {
                    Ok::<_, tantivy::TantivyError>(Index::create_in_ram(schema.clone()))
                })?;
                let mut w = index.writer_with_num_threads(1, 15_000_000).with_context(|| {
                    format!("cannot open the index writer in {}", dir.display())
                })?;
                for f in &files {
                    let Some((title, segs)) = file_segments(f, segment_chars) else { continue };
                    // The path's words (folder and file name) are searched
                    // with the title: they name what a file is about.
                    let title = format!("{title} {}", f.rel);
                    for (i, (seg, head)) in segs.into_iter().enumerate() {
                        w.add_document(doc!(f_title => title.clone(), f_heading => head, f_body => seg, f_path => f.rel.clone(), f_seg => (i + 1) as u64))?;
                    }
                }
                w.commit()
                    .with_context(|| format!("cannot write the index in {}", dir.display()))?;
                std::fs::write(dir.join("manifest.txt"), &manifest).ok();
                index
            }
        };
        // The reader keeps the segments it opened for the whole run (no
        // reloading while another run replaces the index later).
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .with_context(|| format!("cannot read the corpus index in {}", dir.display()))?;
        let vectors = match embedder {
            None => None,
            Some(e) => Some(super::vectors::Vectors::open(e, &dir, &manifest, || {
                // The index's segments, as it was built from the same files.
                let mut out = Vec::new();
                for f in &files {
                    let Some((title, segs)) = file_segments(f, segment_chars) else { continue };
                    for (i, (seg, head)) in segs.into_iter().enumerate() {
                        let entry = super::vectors::Entry { path: f.rel.clone(), segment: i + 1 };
                        out.push((entry, format!("{title}\n{head}\n{seg}")));
                    }
                }
                out
            })?),
        };
        Ok(Corpus {
            roots,
            index,
            reader,
            f_title,
            f_heading,
            f_body,
            f_path,
            f_seg,
            segment_chars,
            vectors,
        })
    }

    /// The `limit` best segments for `query`: the full-text index's
    /// ([`Corpus::text_search`]) or, with vectors, the reciprocal rank
    /// fusion of its ranking and the vectors' (`vectors.rs`), each list
    /// [`FUSED`] deep.
    pub(crate) fn search(&self, query: &str, limit: usize) -> Result<Vec<Hit>> {
        let Some(vectors) = &self.vectors else { return self.text_search(query, limit) };
        let text = self.text_search(query, FUSED.max(limit))?;
        let near = vectors.nearest(query, FUSED.max(limit))?;
        let key = |p: &str, s: usize| (p.to_owned(), s);
        let fused = super::vectors::fuse(&[
            text.iter().map(|h| key(&h.path, h.segment)).collect(),
            near.iter().map(|e| key(&e.path, e.segment)).collect(),
        ]);
        let mut hits = Vec::with_capacity(limit);
        for (path, segment) in fused.into_iter().take(limit) {
            if let Some(h) = text.iter().find(|h| h.path == path && h.segment == segment) {
                hits.push(h.clone());
                continue;
            }
            // Found by its vector alone: its opening as the snippet.
            let Some(seg) = self.read(&path, segment)? else { continue };
            let snippet = opening(&seg.text);
            hits.push(Hit { path, segment, title: seg.title, snippet });
        }
        Ok(hits)
    }

    /// Full-text search; each query term is matched on its own (OR), stop
    /// words dropped, words stemmed.
    pub(crate) fn text_search(&self, query: &str, limit: usize) -> Result<Vec<Hit>> {
        let searcher = self.reader.searcher();
        let mut qp =
            QueryParser::for_index(&self.index, vec![self.f_title, self.f_heading, self.f_body]);
        qp.set_field_boost(self.f_heading, HEADING_BOOST);
        // Punctuation that is query syntax is meaningless in a model's query.
        let cleaned: String = query
            .chars()
            .map(|c| {
                if c.is_alphanumeric() || c.is_whitespace() || c == '_' || c == '-' {
                    c
                } else {
                    ' '
                }
            })
            .collect();
        // Words such as "what", "the", "does" carry no topic: a question
        // searches by its topic words.
        let (q, _errors) = qp.parse_query_lenient(&prompts::evidence::query(&cleaned));
        let top = searcher.search(&q, &TopDocs::with_limit(limit.max(1)))?;
        let mut gen = SnippetGenerator::create(&searcher, &*q, self.f_body)?;
        gen.set_max_num_chars(220);
        let mut hits = Vec::new();
        for (_score, addr) in top {
            let d: TantivyDocument = searcher.doc(addr)?;
            let s =
                |f: Field| d.get_first(f).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
            let mut snippet = gen.snippet_from_doc(&d).fragment().trim().to_owned();
            if snippet.is_empty() {
                snippet = opening(&s(self.f_body));
            }
            let path = s(self.f_path);
            let indexed = s(self.f_title);
            let title = indexed.strip_suffix(&format!(" {path}")).unwrap_or(&indexed).to_owned();
            hits.push(Hit {
                path,
                segment: d.get_first(self.f_seg).and_then(|v| v.as_u64()).unwrap_or(1) as usize,
                title,
                snippet,
            });
        }
        Ok(hits)
    }

    /// Segment `segment` (1-based) of the file at `rel`, read from disk now.
    pub(crate) fn read(&self, rel: &str, segment: usize) -> Result<Option<Segment>> {
        let Some(abs) = self.abs_path(rel) else { return Ok(None) };
        let text = std::fs::read_to_string(&abs).with_context(|| format!("cannot read {rel}"))?;
        let segs = split_segments(&text, self.segment_chars);
        if segment == 0 || segment > segs.len() {
            return Ok(Some(Segment {
                path: rel.into(),
                title: title_of(rel, &text),
                segment,
                segments: segs.len(),
                text: String::new(),
                heading: String::new(),
            }));
        }
        Ok(Some(Segment {
            path: rel.into(),
            title: title_of(rel, &text),
            segment,
            segments: segs.len(),
            text: segs[segment - 1].clone(),
            heading: heading_before(&segs[..segment - 1]),
        }))
    }

    /// The whole file at `rel` (title and text), read from disk now.
    pub(crate) fn read_all(&self, rel: &str) -> Result<Option<(String, String)>> {
        let Some(abs) = self.abs_path(rel) else { return Ok(None) };
        let text = std::fs::read_to_string(&abs).with_context(|| format!("cannot read {rel}"))?;
        Ok(Some((title_of(rel, &text), text)))
    }

    fn abs_path(&self, rel: &str) -> Option<PathBuf> {
        let (top, rest) = rel.split_once('/')?;
        let (_, root) = self.roots.iter().find(|(name, _)| name == top)?;
        let p = root.join(rest);
        // Never leave the corpus folder.
        let c = p.canonicalize().ok()?;
        c.starts_with(root).then_some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any file text (a corpus file is arbitrary input): its segments'
        /// headings are found without a panic, one entry per segment, and
        /// each segment's heading in effect is the last of those before it.
        #[test]
        fn any_text_has_its_section_headings(text in "(\\PC|[\n#`~ ]){0,400}", max in 64usize..200) {
            let segs = split_segments(&text, max);
            let heads = section_headings(&segs);
            proptest::prop_assert_eq!(heads.len(), segs.len());
            for i in 0..segs.len() {
                let before = heading_before(&segs[..i]);
                proptest::prop_assert!(before.is_empty() || heads[i].starts_with(&before));
            }
        }
    }

    #[test]
    fn a_segment_knows_the_heading_it_continues() {
        let segs = [
            "# Top\n\n## `main`\n\nThe main field.\n".to_owned(),
            "```sh\n# a comment, not a heading\n```\n".to_owned(),
        ];
        assert_eq!(heading_before(&segs[..1]), "`main`");
        assert_eq!(heading_before(&segs), "`main`", "a comment in code is no heading");
        assert_eq!(heading_before(&[]), "");
        assert_eq!(heading_before(&["#hashtag\n".to_owned()]), "");
        assert_eq!(section_headings(&segs), ["Top\n`main`", "`main`"]);
    }

    #[test]
    fn segments_respect_the_size_and_keep_all_text() {
        let text = "# T\n\npara one is here.\n\npara two is here too.\n\n".repeat(20);
        let segs = split_segments(&text, 100);
        assert!(segs.len() > 5);
        assert!(segs.iter().all(|s| s.chars().count() <= 100));
        assert_eq!(segs.concat(), text);
        let long = "x".repeat(1000);
        assert_eq!(split_segments(&long, 100).concat(), long);
    }

    #[test]
    fn every_folder_gets_a_name_of_its_own() {
        let roots: Vec<PathBuf> = ["/a/docs", "/b/docs", "/c/docs-2", "/d/docs", "/", "/e/notes"]
            .map(PathBuf::from)
            .into();
        assert_eq!(names(&roots), ["docs", "docs-2", "docs-2-2", "docs-3", "corpus", "notes"]);
    }

    #[test]
    fn titles_come_from_the_first_heading() {
        assert_eq!(title_of("a/b.md", "intro\n## Budget rules\n"), "Budget rules");
        assert_eq!(title_of("a/b.rs", "fn main() {}"), "b.rs");
        assert_eq!(
            title_of("a/c.md", "---\ntitle: npm-ping\nsection: 1\n---\n### Synopsis\n"),
            "npm-ping"
        );
    }
}
