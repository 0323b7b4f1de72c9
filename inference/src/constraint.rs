//! Constrained decoding: which tokens a generation may take next.
//!
//! Grammars are llguidance's (Lark with inline `%json` schemas) over a
//! `toktrie` built from this model's vocabulary — the raw bytes of every
//! token, control tokens behind toktrie's `0xFF` marker — so a mask is a
//! set of token ids. [`Grammars`] (one per engine, so per vocabulary)
//! compiles grammar text and keeps compiled grammars by their text; a
//! [`Constraint`] on [`crate::GenParams`] says how a generation uses them:
//!
//! - [`Constraint::Grammar`]: the whole output follows the grammar, and the
//!   generation ends when it is complete (or at a stop token it allows).
//! - [`Constraint::Lazy`]: free text until the text ends with `marker` (a
//!   tool call's start, e.g. `<tool_call>`); from that token boundary the
//!   grammar governs until it is complete, then free text again. A token
//!   that would complete the marker and run on past it is masked, so the
//!   grammar always starts at a token boundary. Free text costs no mask.
//! - [`Constraint::Forbid`]: free text that can never complete any of the
//!   markers: at each step every token that would complete one (a token
//!   holding it, or ending a marker begun by the tokens before) is masked.
//!
//! The mask is applied inside [`crate::Engine::step`] per generation, so
//! constrained and free generations share one batched pass; tokens the
//! grammar forces (llguidance's fast-forward tokens) join the generation's
//! next pass together instead of one pass each.
//!
//! Markers are matched on token bytes (control tokens as their text), the
//! same text the tool-call parser sees.

use crate::error::{Error, ErrorKind, Result};
use crate::tokenizer::Tok;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Compiled grammars kept per engine (the vocabulary is the engine's).
const CACHED: usize = 64;

/// Most forced tokens run in one pass (the rest follow in later passes).
pub(crate) const MAX_FF: usize = 32;

/// Within this many tokens of the limit, a grammar in progress takes a
/// closing token (`"`, `}`, `]`, a stop token) whenever it allows one, so
/// output cut by the limit is rare: strings end, open values close.
pub(crate) const CLOSE_WITHIN: usize = 48;

/// How a generation is constrained (see the module documentation).
#[derive(Debug, Clone)]
pub enum Constraint {
    /// The whole output follows `grammar`.
    Grammar(Grammar),
    /// Free text; `grammar` governs from each token boundary where the text
    /// ends with `marker` until it is complete.
    Lazy {
        /// What engages the grammar.
        marker: Marker,
        /// What follows the marker.
        grammar: Grammar,
    },
    /// Free text that never completes any of these markers.
    Forbid(Vec<Marker>),
}

/// A compiled grammar, cheap to clone; each generation runs its own copy
/// (sharing the lexer's caches).
#[derive(Clone)]
pub struct Grammar(Arc<Mutex<TokenParser>>, Arc<Vec<u32>>);

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

impl Grammar {
    fn matcher(&self) -> Matcher {
        let parser = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Matcher::new(Ok(parser))
    }
}

/// A marker's matching automaton over this vocabulary: for each state (how
/// much of the marker the text ends with), the tokens that would complete
/// it, and whether each completes it exactly at its own end.
#[derive(Clone)]
pub struct Marker(Arc<MarkerTable>);

impl std::fmt::Debug for Marker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Marker({:?})", String::from_utf8_lossy(&self.0.bytes))
    }
}

struct MarkerTable {
    bytes: Vec<u8>,
    /// `next[state * 256 + byte]`: the KMP automaton as a table.
    next: Vec<u16>,
    /// Per state: (token, completes exactly at its last byte).
    completing: Vec<Vec<(u32, bool)>>,
}

impl Marker {
    /// The marker's text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.bytes).into_owned()
    }

    /// Token ids that would complete the marker after text ending in
    /// `state` bytes of it (0: text with no part of it at its end).
    pub fn completing(&self, state: usize) -> Vec<u32> {
        self.0
            .completing
            .get(state)
            .map(|c| c.iter().map(|&(t, _)| t).collect())
            .unwrap_or_default()
    }

    /// The state after `bytes` from `state`; `len()` means complete.
    pub fn advance(&self, mut state: usize, bytes: &[u8]) -> usize {
        for &b in bytes {
            state = self.0.next[state * 256 + b as usize] as usize;
        }
        state
    }

    /// Bytes in the marker.
    pub fn len(&self) -> usize {
        self.0.bytes.len()
    }

    /// Whether the marker is empty (never: [`Grammars::marker`] refuses it).
    pub fn is_empty(&self) -> bool {
        self.0.bytes.is_empty()
    }
}

/// Compiled grammars by their text, with when each was last used (a use
/// counter first).
type Cache = (u64, HashMap<String, (u64, Grammar)>);

/// The engine's grammar compiler and cache: llguidance's parser factory
/// over the vocabulary's toktrie.
pub struct Grammars {
    factory: ParserFactory,
    pieces: Arc<Vec<Vec<u8>>>,
    closing: Arc<Vec<u32>>,
    cache: Mutex<Cache>,
    markers: Mutex<HashMap<Vec<u8>, Marker>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("vocab", &self.pieces.len()).finish_non_exhaustive()
    }
}

/// The vocabulary as llguidance sees it: the trie, and our tokenizer for
/// canonical tokenization of forced text.
/// Tokens that only close (`"`, `}`, `]`, with blanks), and stop tokens.
fn closing(pieces: &[Vec<u8>], stops: &[u32]) -> Vec<u32> {
    let mut v: Vec<u32> = pieces
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            p.iter().all(|b| b"\"}] \n".contains(b)) && p.iter().any(|b| b"\"}]".contains(b))
        })
        .map(|(i, _)| i as u32)
        .collect();
    v.extend_from_slice(stops);
    v
}

struct Env {
    trie: TokTrie,
    tok: Arc<Tok>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => match self.tok.encode(text, false) {
                Ok(ids) => ids,
                Err(_) => self.trie.greedy_tokenize(s),
            },
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

fn grammar_err(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Grammar, msg)
}

impl Grammars {
    /// Builds the trie of `tok` for a model with `n_vocab` logits whose
    /// generations end at `stops`.
    pub(crate) fn new(tok: Arc<Tok>, n_vocab: usize, stops: &[u32]) -> Result<Grammars> {
        let mut words = Vec::with_capacity(n_vocab);
        let mut pieces = Vec::with_capacity(n_vocab);
        for id in 0..n_vocab as u32 {
            let piece = tok.piece(id).to_vec();
            if tok.is_control(id) {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(&piece);
                words.push(w);
            } else {
                words.push(piece.clone());
            }
            pieces.push(piece);
        }
        let eos = stops.first().copied().unwrap_or(0);
        let trie = TokTrie::from(&TokRxInfo::new(n_vocab as u32, eos), &words);
        let trie = trie.with_eos_tokens(stops);
        let env: TokEnv = Arc::new(Env { trie, tok });
        let caps = llguidance::toktrie::InferenceCapabilities {
            ff_tokens: true,
            conditional_ff_tokens: false,
            backtrack: false,
            fork: false,
        };
        let mut factory = ParserFactory::new(
            &env,
            caps,
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| grammar_err(format!("cannot build the grammar vocabulary: {e}")))?;
        factory.quiet();
        // A bounded free-text value that must not hold its closing tag (the
        // XML-style call formats) builds many lexer states on a real
        // vocabulary the first time a mask meets them: 10x llguidance's
        // default fuel per mask and for building the lexer (about 140 ms
        // and 200 ms at worst, once per state and per grammar).
        factory.limits_mut().step_lexer_fuel = 2_000_000;
        factory.limits_mut().initial_lexer_fuel = 10_000_000;
        Ok(Grammars {
            factory,
            closing: Arc::new(closing(&pieces, stops)),
            pieces: Arc::new(pieces),
            cache: Mutex::new((0, HashMap::new())),
            markers: Mutex::new(HashMap::new()),
        })
    }

    /// Compiles a Lark grammar (llguidance's dialect: `%json {…}` inlines a
    /// JSON schema, `<[id]>` is a token), or returns the cached one of the
    /// same text. An error says what llguidance refused
    /// ([`ErrorKind::Grammar`]).
    pub fn compile(&self, lark: &str) -> Result<Grammar> {
        {
            let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            c.0 += 1;
            let now = c.0;
            if let Some((used, g)) = c.1.get_mut(lark) {
                *used = now;
                return Ok(g.clone());
            }
        }
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_lark(lark.to_owned()))
            .map_err(|e| grammar_err(e.to_string()))?;
        let g = Grammar(Arc::new(Mutex::new(parser)), Arc::clone(&self.closing));
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let now = c.0;
        if c.1.len() >= CACHED {
            if let Some(old) = c.1.iter().min_by_key(|(_, (u, _))| *u).map(|(k, _)| k.clone()) {
                c.1.remove(&old);
            }
        }
        c.1.insert(lark.to_owned(), (now, g.clone()));
        Ok(g)
    }

    /// Replays `tokens` through a fresh run of `grammar`, computing the mask
    /// before each token (as a generation does) and returns the time of each
    /// mask; stops at the first token the grammar refuses. For benchmarks.
    pub fn time_masks(&self, grammar: &Grammar, tokens: &[u32]) -> Vec<std::time::Duration> {
        let mut m = grammar.matcher();
        let mut times = Vec::with_capacity(tokens.len());
        let mut logits = vec![0f32; self.pieces.len()];
        for &t in tokens {
            let t0 = std::time::Instant::now();
            if !apply_matcher(&mut m, &mut logits) {
                break;
            }
            times.push(t0.elapsed());
            if m.consume_token(t).is_err() || m.is_stopped() {
                break;
            }
        }
        times
    }

    /// How many compiled grammars are cached.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).1.len()
    }

    /// The automaton of `text` over this vocabulary (cached per text).
    pub fn marker(&self, text: &str) -> Result<Marker> {
        let bytes = text.as_bytes().to_vec();
        if bytes.is_empty() || bytes.len() > 255 {
            return Err(grammar_err(format!(
                "a marker must have 1 to 255 bytes, not {}",
                bytes.len()
            )));
        }
        let mut markers = self.markers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = markers.get(&bytes) {
            return Ok(m.clone());
        }
        let m = bytes.len();
        // KMP failure function, then the full transition table.
        let mut fail = vec![0usize; m + 1];
        let mut k = 0;
        for i in 1..m {
            while k > 0 && bytes[i] != bytes[k] {
                k = fail[k];
            }
            if bytes[i] == bytes[k] {
                k += 1;
            }
            fail[i + 1] = k;
        }
        let mut next = vec![0u16; (m + 1) * 256];
        for s in 0..=m {
            for b in 0..256usize {
                let mut q = if s == m { fail[m] } else { s };
                loop {
                    if q < m && bytes[q] as usize == b {
                        q += 1;
                        break;
                    }
                    if q == 0 {
                        break;
                    }
                    q = fail[q];
                }
                next[s * 256 + b] = q as u16;
            }
        }
        let mut completing = vec![Vec::new(); m];
        for (state, list) in completing.iter_mut().enumerate() {
            for (id, piece) in self.pieces.iter().enumerate() {
                let mut q = state;
                for (i, &b) in piece.iter().enumerate() {
                    q = next[q * 256 + b as usize] as usize;
                    if q == m {
                        list.push((id as u32, i + 1 == piece.len()));
                        break;
                    }
                }
            }
        }
        let marker = Marker(Arc::new(MarkerTable { bytes, next, completing }));
        markers.insert(marker.0.bytes.clone(), marker.clone());
        Ok(marker)
    }
}

/// A generation's constraint in progress.
pub(crate) struct Guide {
    kind: GuideKind,
    /// The closing tokens of the grammar (empty for markers).
    closing: Arc<Vec<u32>>,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guide")
    }
}

enum GuideKind {
    Grammar(Box<Matcher>),
    Lazy { marker: Marker, state: usize, grammar: Grammar, active: Option<Box<Matcher>> },
    Forbid(Vec<(Marker, usize)>),
}

/// What committing a token left.
pub(crate) enum Commit {
    /// Go on; these forced tokens follow (already accepted by the grammar).
    Go(Vec<u32>),
    /// The grammar is complete once these forced tokens are delivered: the
    /// generation ends.
    Done(Vec<u32>),
}

impl Guide {
    pub(crate) fn new(c: &Constraint) -> Guide {
        let closing = match c {
            Constraint::Grammar(g) | Constraint::Lazy { grammar: g, .. } => Arc::clone(&g.1),
            Constraint::Forbid(_) => Arc::new(Vec::new()),
        };
        let kind = match c {
            Constraint::Grammar(g) => GuideKind::Grammar(Box::new(g.matcher())),
            Constraint::Lazy { marker, grammar } => GuideKind::Lazy {
                marker: marker.clone(),
                state: 0,
                grammar: grammar.clone(),
                active: None,
            },
            Constraint::Forbid(ms) => {
                GuideKind::Forbid(ms.iter().map(|m| (m.clone(), 0)).collect())
            }
        };
        Guide { kind, closing }
    }

    /// Tokens forced before anything is sampled (a grammar that begins
    /// with fixed text).
    pub(crate) fn initial(&mut self, max: usize) -> Vec<u32> {
        match &mut self.kind {
            GuideKind::Grammar(m) => forced(m, max),
            _ => Vec::new(),
        }
    }

    /// Masks the logits of tokens the constraint does not allow now, with
    /// `left` tokens left before the limit. Returns false when it allows
    /// none (the generation must end).
    pub(crate) fn mask(&mut self, logits: &mut [f32], left: usize) -> bool {
        let ok = self.mask_now(logits);
        if ok && left <= CLOSE_WITHIN && self.engaged() {
            // Near the limit: only closing tokens, when the grammar allows any.
            let allowed = |t: &u32| logits.get(*t as usize).is_some_and(|l| l.is_finite());
            if self.closing.iter().any(allowed) {
                let mut keep = vec![f32::NEG_INFINITY; logits.len()];
                for &t in self.closing.iter() {
                    if let Some(&l) = logits.get(t as usize) {
                        keep[t as usize] = l;
                    }
                }
                logits.copy_from_slice(&keep);
            }
        }
        ok
    }

    fn mask_now(&mut self, logits: &mut [f32]) -> bool {
        match &mut self.kind {
            GuideKind::Grammar(m) => apply_matcher(m, logits),
            GuideKind::Lazy { active: Some(m), .. } => apply_matcher(m, logits),
            GuideKind::Lazy { marker, state, active: None, .. } => {
                for &(t, at_end) in &marker.0.completing[*state] {
                    if !at_end {
                        if let Some(l) = logits.get_mut(t as usize) {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
                true
            }
            GuideKind::Forbid(ms) => {
                for (marker, state) in ms.iter() {
                    for &(t, _) in &marker.0.completing[*state] {
                        if let Some(l) = logits.get_mut(t as usize) {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
                true
            }
        }
    }

    /// Takes the sampled token `id` (with its bytes `piece`), and returns
    /// up to `max_ff` tokens the grammar now forces.
    pub(crate) fn commit(&mut self, id: u32, piece: &[u8], max_ff: usize) -> Commit {
        match &mut self.kind {
            GuideKind::Grammar(m) => {
                if m.consume_token(id).is_err() {
                    return Commit::Done(Vec::new());
                }
                let ff = forced(m, max_ff);
                if m.is_stopped() {
                    return Commit::Done(ff);
                }
                Commit::Go(ff)
            }
            GuideKind::Lazy { marker, state, grammar, active } => {
                if let Some(m) = active {
                    let ok = m.consume_token(id).is_ok();
                    let ff = if ok { forced(m, max_ff) } else { Vec::new() };
                    if !ok || m.is_stopped() {
                        *active = None;
                        *state = 0;
                    }
                    return Commit::Go(ff);
                }
                *state = marker.advance(*state, piece);
                if *state == marker.len() {
                    let mut m = Box::new(grammar.matcher());
                    let ff = forced(&mut m, max_ff);
                    *active = Some(m);
                    *state = 0;
                    return Commit::Go(ff);
                }
                Commit::Go(Vec::new())
            }
            GuideKind::Forbid(ms) => {
                for (marker, state) in ms.iter_mut() {
                    *state = marker.advance(*state, piece);
                    if *state == marker.len() {
                        *state = 0;
                    }
                }
                Commit::Go(Vec::new())
            }
        }
    }

    /// How many of `drafts`, in a row, the constraint allows now (after
    /// the tokens committed so far). Only a governing grammar checks, and
    /// consumes nothing; markers allow all. A proposal only: the masks of
    /// the verifying rows decide what is confirmed.
    pub(crate) fn allows(&mut self, drafts: &[u32]) -> usize {
        match &mut self.kind {
            GuideKind::Grammar(m) | GuideKind::Lazy { active: Some(m), .. } => {
                m.validate_tokens(drafts).unwrap_or(0)
            }
            _ => drafts.len(),
        }
    }

    /// Whether a grammar is governing right now (for tests and diagnostics).
    pub(crate) fn engaged(&self) -> bool {
        matches!(self.kind, GuideKind::Grammar(_) | GuideKind::Lazy { active: Some(_), .. })
    }
}

/// Forced tokens, at most `max`, consumed.
fn forced(m: &mut Matcher, max: usize) -> Vec<u32> {
    if max == 0 || m.is_stopped() {
        return Vec::new();
    }
    let mut ff = m.compute_ff_tokens();
    ff.truncate(max);
    if !ff.is_empty() && m.consume_tokens(&ff).is_err() {
        return Vec::new();
    }
    ff
}

fn apply_matcher(m: &mut Matcher, logits: &mut [f32]) -> bool {
    let mask = match m.compute_mask() {
        Ok(mask) => mask,
        Err(_) => return false,
    };
    apply_mask(&mask, logits)
}

/// Sets the logits of tokens outside `mask` to −∞; false when none is in it.
fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) -> bool {
    let mut any = false;
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX && chunk.len() == 32 {
            any = true;
            continue;
        }
        if bits == 0 {
            chunk.iter_mut().for_each(|l| *l = f32::NEG_INFINITY);
            continue;
        }
        any = true;
        for (i, l) in chunk.iter_mut().enumerate() {
            if bits & (1 << i) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    any
}
