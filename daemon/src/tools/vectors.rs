//! Vector search over the corpus: when an embedding model is configured
//! (`AGENTD_CORPUS_EMBED_MODEL`: a registry name, a file in the models
//! folder or a path to a GGUF — an encoder such as all-MiniLM, bge or
//! nomic-embed-text, or any chat model, pooled by the mean), every indexed
//! segment's vector is stored beside the full-text index
//! (`vectors.json` + `vectors.f32` in its folder, named for the model file)
//! and rebuilt with it; `search_sources` then ranks by full text and vector
//! similarity together, by reciprocal rank fusion (`fuse`). With none,
//! search is the full-text index's alone.

use anyhow::{Context, Result};
use inference::{Engine, EngineOptions};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The environment variable that names the corpus's embedding model.
pub(crate) const ENV: &str = "AGENTD_CORPUS_EMBED_MODEL";

/// Reciprocal rank fusion's constant (Cormack et al.: 60).
const RRF_K: f64 = 60.0;

/// Most tokens of a segment embedded (its beginning; the rest is cut).
const MAX_TOKENS: usize = 512;

/// An embedding model, loaded once per process and shared by runs.
pub(crate) struct Embedder {
    engine: Arc<Engine>,
    /// The model file, and a stamp that changes with it (size, mtime).
    path: PathBuf,
    stamp: String,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder").field("path", &self.path).finish()
    }
}

impl Embedder {
    /// The model `AGENTD_CORPUS_EMBED_MODEL` names, loaded (once per
    /// process); `None` when it is unset or empty.
    pub(crate) fn configured() -> Result<Option<Arc<Embedder>>> {
        let Some(name) = std::env::var(ENV).ok().filter(|v| !v.trim().is_empty()) else {
            return Ok(None);
        };
        let r = crate::provider::build::resolve(Some(name.trim()))
            .with_context(|| format!("{ENV}={name}"))?;
        static LOADED: OnceLock<Mutex<HashMap<PathBuf, Arc<Embedder>>>> = OnceLock::new();
        let mut all =
            LOADED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = all.get(&r.path) {
            return Ok(Some(Arc::clone(e)));
        }
        let meta = std::fs::metadata(&r.path)
            .with_context(|| format!("{ENV}: cannot read {}", r.path.display()))?;
        let stamp = format!("{}:{:?}", meta.len(), meta.modified().ok());
        let engine = Engine::load(&r.path, &EngineOptions::default())
            .with_context(|| format!("{ENV}: cannot load {}", r.path.display()))?;
        let e = Arc::new(Embedder { engine: Arc::new(engine), path: r.path.clone(), stamp });
        all.insert(r.path, Arc::clone(&e));
        Ok(Some(e))
    }

    /// The vector of each text, its tokens cut to [`MAX_TOKENS`] (and to
    /// the model's context).
    fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let limit = MAX_TOKENS.min(self.engine.info().context);
        let mut ids = Vec::with_capacity(texts.len());
        for t in texts {
            let mut t = self.engine.tokenize_prompt(t, false)?;
            t.truncate(limit);
            if t.is_empty() {
                t = self.engine.tokenize_prompt(" ", false)?;
            }
            ids.push(t);
        }
        let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        Ok(self.engine.embed_many(&refs, None)?.into_iter().map(|e| e.vector).collect())
    }

    /// The file's name for the vectors of this model.
    fn file_key(&self) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(self.path.to_string_lossy().as_bytes());
        h.update(self.stamp.as_bytes());
        h.finalize().iter().take(6).map(|b| format!("{b:02x}")).collect()
    }
}

/// One segment's entry beside its vector.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub(crate) path: String,
    pub(crate) segment: usize,
}

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    /// The index manifest the vectors were made for.
    manifest: String,
    model: String,
    dims: usize,
    entries: Vec<Entry>,
}

/// The segments' vectors of one index.
#[derive(Debug)]
pub(crate) struct Vectors {
    embedder: Arc<Embedder>,
    entries: Vec<Entry>,
    dims: usize,
    /// `entries.len() × dims`, each of length 1.
    data: Vec<f32>,
}

impl Vectors {
    /// The vectors of the index in `dir` (made for `manifest`), read when
    /// stored for this model and manifest, else computed from `segments`
    /// (`(entry, text to embed)`, the index's segments) and stored.
    pub(crate) fn open(
        embedder: Arc<Embedder>,
        dir: &Path,
        manifest: &str,
        segments: impl FnOnce() -> Vec<(Entry, String)>,
    ) -> Result<Vectors> {
        let key = embedder.file_key();
        let (meta_path, data_path) =
            (dir.join(format!("vectors-{key}.json")), dir.join(format!("vectors-{key}.f32")));
        let stored = std::fs::read(&meta_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Meta>(&b).ok())
            .filter(|m| m.manifest == manifest)
            .and_then(|m| {
                let bytes = std::fs::read(&data_path).ok()?;
                (bytes.len() == m.entries.len() * m.dims * 4).then(|| {
                    let data = bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    (m, data)
                })
            });
        if let Some((m, data)) = stored {
            return Ok(Vectors { embedder, entries: m.entries, dims: m.dims, data });
        }
        let (entries, texts): (Vec<Entry>, Vec<String>) = segments().into_iter().unzip();
        let vectors = embedder.embed(&texts)?;
        let dims = vectors.first().map_or(0, Vec::len);
        let data: Vec<f32> = vectors.into_iter().flatten().collect();
        let meta = Meta {
            manifest: manifest.to_owned(),
            model: embedder.path.display().to_string(),
            dims,
            entries: entries.clone(),
        };
        // Stored as a cache: a run that cannot write it still searches.
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        if std::fs::write(&data_path, bytes).is_ok() {
            if let Ok(json) = serde_json::to_vec(&meta) {
                std::fs::write(&meta_path, json).ok();
            }
        }
        Ok(Vectors { embedder, entries, dims, data })
    }

    /// The `limit` segments most similar to `query` (cosine), best first.
    pub(crate) fn nearest(&self, query: &str, limit: usize) -> Result<Vec<&Entry>> {
        let q = self.embedder.embed(&[query.to_owned()])?.pop().unwrap_or_default();
        if q.len() != self.dims || self.dims == 0 {
            return Ok(Vec::new());
        }
        let mut scored: Vec<(f32, usize)> = self
            .data
            .chunks_exact(self.dims)
            .enumerate()
            .map(|(i, v)| (v.iter().zip(&q).map(|(a, b)| a * b).sum(), i))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        Ok(scored.into_iter().take(limit).map(|(_, i)| &self.entries[i]).collect())
    }
}

/// Reciprocal rank fusion of ranked lists of `(path, segment)`: each
/// item's score is Σ 1 / (60 + rank) over the lists it is in; best first
/// (ties by the first list's order, then the second's).
pub(crate) fn fuse(lists: &[Vec<(String, usize)>]) -> Vec<(String, usize)> {
    let mut score: HashMap<(String, usize), (f64, usize)> = HashMap::new();
    let mut order = 0;
    for list in lists {
        for (rank, item) in list.iter().enumerate() {
            let e = score.entry(item.clone()).or_insert_with(|| {
                order += 1;
                (0.0, order)
            });
            e.0 += 1.0 / (RRF_K + rank as f64 + 1.0);
        }
    }
    let mut all: Vec<((String, usize), (f64, usize))> = score.into_iter().collect();
    all.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0).then(a.1 .1.cmp(&b.1 .1)));
    all.into_iter().map(|(k, _)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusion_ranks_what_both_lists_agree_on_first() {
        let l = |v: &[(&str, usize)]| v.iter().map(|(p, s)| (p.to_string(), *s)).collect();
        let text = l(&[("a", 1), ("b", 1), ("c", 1)]);
        let vec = l(&[("c", 1), ("d", 2), ("b", 1)]);
        let fused = fuse(&[text, vec]);
        assert_eq!(fused.len(), 4);
        // b and c are in both lists; c is first in one and third in the other, b second and
        // third.
        assert_eq!(fused[0], ("c".into(), 1));
        assert_eq!(fused[1], ("b".into(), 1));
        // One list alone keeps its order.
        let one = fuse(&[l(&[("x", 1), ("y", 1)])]);
        assert_eq!(one, l(&[("x", 1), ("y", 1)]));
    }
}
