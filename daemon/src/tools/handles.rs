//! Run-scoped source handles (`S1`, `S2`, …): search registers them, read
//! accepts them, citations are checked against the ones read. A source
//! (file and segment) keeps the handle it was first given; capacity and
//! lifetime come from the run's policies, and a failed registration is
//! never handed out as a handle.

use crate::state::store::HandleRec;
use std::collections::{BTreeSet, HashMap};

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
    pub(super) fn new(capacity: usize, lifetime: u64) -> Handles {
        Handles { capacity, lifetime, ..Handles::default() }
    }

    /// The handle of a source, registering it; `None` when the registry is
    /// full.
    pub(super) fn register(&mut self, path: &str, segment: usize, title: &str) -> Option<String> {
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

    pub(super) fn lookup(&self, h: &str) -> Result<&HandleRec, String> {
        let r = self
            .recs
            .get(h)
            .ok_or_else(|| format!("{h:?} is not a handle from search_sources in this run"))?;
        if epoch().saturating_sub(r.issued) > self.lifetime {
            return Err(format!("{h} expired ({} s after it was issued)", self.lifetime));
        }
        Ok(r)
    }

    pub(crate) fn mark_read(&mut self, h: &str) {
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
