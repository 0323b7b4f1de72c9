//! The tokenizer, built from the GGUF metadata (or a `tokenizer.json` beside
//! the model, which wins), and the bytes of every token for streaming text.
//!
//! Three vocabularies, as llama.cpp names them in `tokenizer.ggml.model`:
//!
//! - `gpt2` (byte-level BPE): the `tokenizers` crate, with pre-tokenizers
//!   after llama.cpp's `tokenizer.ggml.pre` names: `smollm` splits digits one
//!   by one, then byte-level BPE *without* a prefix space (so "user" is
//!   4093, not "Ġuser"); `qwen2` and `llama3` use their regexes.
//! - `llama` (SentencePiece: Llama 2, Mistral v0.x, Gemma): llama.cpp's
//!   algorithm (`llm_tokenizer_spm`) — spaces become `▁` (with a prefix
//!   space when the file says so), UTF-8 characters are merged pairwise by
//!   the score of the token they form (ties: leftmost first), and what forms
//!   no token falls back to its bytes (`<0xXX>`). Written here rather than
//!   as a `tokenizers` BPE because that needs a merges table derived from
//!   the scores (over a million pairs for Gemma's 262k vocabulary, tens of
//!   megabytes) and breaks score ties by rank, not by position.
//!
//! - `bert` (WordPiece: BERT-family embedding models): llama.cpp's WPM
//!   rules through the `tokenizers` crate ([`wordpiece`]); a prompt is
//!   `[CLS] … [SEP]`.
//!
//! Control tokens are parsed only when asked (`parse_special`), as llama.cpp
//! does; user-defined tokens always are. Whether a prompt starts with BOS
//! is the file's `tokenizer.ggml.add_bos_token` ([`Tok::bos_to_add`]).

use crate::error::{Error, ErrorKind, Result};
use crate::gguf::Gguf;
use std::path::Path;
use std::sync::Mutex;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::tokenizer::SplitDelimiterBehavior;
use tokenizers::{AddedToken, Tokenizer};

const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const REGEX_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn tok_err(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Tokenizer, msg)
}

/// Token types of the GGUF vocabulary (llama.cpp's `llama_token_type`).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

const UNKNOWN: i64 = 2;
const BYTE: i64 = 6;

/// llama.cpp's WordPiece (`llm_tokenizer_wpm`) as a `tokenizers` pipeline:
/// NFD, then BERT's normalizer (control characters and combining marks
/// dropped, Chinese characters split off, lower case), words split at
/// whitespace and punctuation (ASCII symbols included), each word matched
/// greedily longest-first against the vocabulary — which the converter
/// stores in "phantom space" form (word starts prefixed with `▁`,
/// continuations without BERT's `##`), turned back here — and a word with
/// an unmatched rest is `[UNK]` whole.
fn wordpiece(g: &Gguf, tokens: &[String], types: &[i64]) -> Result<Tokenizer> {
    use tokenizers::models::wordpiece::WordPiece;
    use tokenizers::normalizers::{BertNormalizer, Sequence as Norms, NFD};
    use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
    let mut vocab = std::collections::HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        let key = if types[i] == CONTROL {
            t.clone()
        } else if let Some(word) = t.strip_prefix('\u{2581}') {
            word.to_owned()
        } else {
            format!("##{t}")
        };
        vocab.entry(key).or_insert(i as u32);
    }
    let unk = g.u32("tokenizer.ggml.unknown_token_id").unwrap_or(100) as usize;
    let unk = tokens.get(unk).cloned().unwrap_or_else(|| "[UNK]".to_owned());
    let wp = WordPiece::builder()
        .vocab(vocab.into_iter().collect::<Vocab>())
        .unk_token(unk)
        .continuing_subword_prefix("##".to_owned())
        .max_input_chars_per_word(usize::MAX)
        .build()
        .map_err(|e| tok_err(format!("cannot build the WordPiece vocabulary: {e}")))?;
    let mut tk = Tokenizer::new(wp);
    let norms =
        Norms::new(vec![NFD.into(), BertNormalizer::new(true, true, Some(true), true).into()]);
    tk.with_normalizer(Some(norms)).map_err(|e| tok_err(e.to_string()))?;
    tk.with_pre_tokenizer(Some(BertPreTokenizer));
    tk.with_truncation(None).map_err(|e| tok_err(e.to_string()))?;
    tk.with_padding(None);
    Ok(tk)
}

/// Text ↔ token ids for one model.
#[derive(Debug)]
pub struct Tok {
    model: Model,
    /// The bytes each token stands for.
    pieces: Vec<Vec<u8>>,
    /// Control tokens (never shown as text).
    control: Vec<bool>,
    /// Token text → id (every token).
    ids: std::collections::HashMap<Box<str>, u32>,
    /// The BOS id when the file says prompts start with it.
    add_bos: Option<u32>,
    /// The [SEP] id a WordPiece (`bert`) prompt ends with.
    add_sep: Option<u32>,
}

#[derive(Debug)]
enum Model {
    Bpe(Box<Mutex<Tokenizer>>),
    Spm(Box<Spm>),
}

/// llama.cpp's SentencePiece tokenizer (`llm_tokenizer_spm`).
#[derive(Debug)]
struct Spm {
    scores: Vec<f32>,
    /// Control, user-defined and unknown tokens: (text, id, control or
    /// unknown), longest first — llama.cpp's partition order.
    specials: Vec<(String, u32, bool)>,
    /// `<0xXX>` token of each byte.
    bytes: [Option<u32>; 256],
    /// Prefix a space to the text after a special token or at the start.
    add_space_prefix: bool,
}

fn split(regex: &str) -> Result<PreTokenizerWrapper> {
    Split::new(SplitPattern::Regex(regex.to_owned()), SplitDelimiterBehavior::Isolated, false)
        .map(Into::into)
        .map_err(|e| tok_err(format!("bad pre-tokenizer regex: {e}")))
}

/// GPT-2's byte ↔ printable-char table, reversed.
fn byte_decoder() -> std::collections::HashMap<char, u8> {
    let mut bs: Vec<u32> =
        (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    bs.into_iter().zip(cs).filter_map(|(b, c)| char::from_u32(c).map(|c| (c, b as u8))).collect()
}

impl Tok {
    /// Reads only the tokenizer of the GGUF at `path` (no weights).
    pub fn load(path: &Path) -> Result<Tok> {
        let g = Gguf::open(path)?;
        Tok::from_gguf(&g, path)
    }

    /// Builds the tokenizer of the GGUF `g`; `tokenizer.json` beside
    /// `model_path` wins when present.
    pub(crate) fn from_gguf(g: &Gguf, model_path: &Path) -> Result<Tok> {
        let tokens = g
            .strings("tokenizer.ggml.tokens")
            .ok_or_else(|| tok_err("GGUF metadata `tokenizer.ggml.tokens` is missing"))?;
        let types = g.ints("tokenizer.ggml.token_type").unwrap_or_else(|| vec![1; tokens.len()]);
        if types.len() != tokens.len() {
            return Err(tok_err(format!(
                "GGUF metadata `tokenizer.ggml.token_type` has {} entries for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        let kind = g.string("tokenizer.ggml.model").unwrap_or("gpt2").to_owned();
        let mut ids = std::collections::HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            ids.entry(t.as_str().into()).or_insert(i as u32);
        }
        let spm = kind == "llama";
        // llama.cpp: SentencePiece vocabularies add BOS unless told not to.
        let add_bos = g.bool("tokenizer.ggml.add_bos_token").unwrap_or(spm);
        let bos = g.u32("tokenizer.ggml.bos_token_id").filter(|&b| (b as usize) < tokens.len());
        let add_bos = if add_bos { bos } else { None };
        let mut pieces = Vec::with_capacity(tokens.len());
        let mut control = Vec::with_capacity(tokens.len());
        let dec = byte_decoder();
        for (i, t) in tokens.iter().enumerate() {
            let ty = types[i];
            control.push(ty == CONTROL);
            if spm && ty == BYTE {
                let b = t
                    .strip_prefix("<0x")
                    .and_then(|h| h.strip_suffix('>'))
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                pieces.push(b.map_or_else(|| t.clone().into_bytes(), |b| vec![b]));
            } else if ty == CONTROL || ty == USER_DEFINED || kind != "gpt2" {
                pieces.push(t.replace('\u{2581}', " ").into_bytes());
            } else {
                pieces.push(t.chars().map(|c| dec.get(&c).copied().unwrap_or(b'?')).collect());
            }
        }
        if spm {
            let scores =
                g.floats("tokenizer.ggml.scores").unwrap_or_else(|| vec![0.0; tokens.len()]);
            if scores.len() != tokens.len() {
                return Err(tok_err(format!(
                    "GGUF metadata `tokenizer.ggml.scores` has {} entries for {} tokens",
                    scores.len(),
                    tokens.len()
                )));
            }
            let mut specials: Vec<(String, u32, bool)> = tokens
                .iter()
                .enumerate()
                .filter(|(i, t)| {
                    !t.is_empty() && matches!(types[*i], CONTROL | USER_DEFINED | UNKNOWN)
                })
                .map(|(i, t)| (t.clone(), i as u32, types[i] != USER_DEFINED))
                .collect();
            specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
            let mut bytes = [None; 256];
            for (b, slot) in bytes.iter_mut().enumerate() {
                *slot = ids.get(format!("<0x{b:02X}>").as_str()).copied();
            }
            let add_space_prefix = g.bool("tokenizer.ggml.add_space_prefix").unwrap_or(true);
            let model = Model::Spm(Box::new(Spm { scores, specials, bytes, add_space_prefix }));
            return Ok(Tok { model, pieces, control, ids, add_bos, add_sep: None });
        }
        if kind == "bert" {
            let tk = wordpiece(g, &tokens, &types)?;
            let model = Model::Bpe(Box::new(Mutex::new(tk)));
            // llama.cpp's WPM vocabularies end a prompt with [SEP].
            let add_sep = g
                .bool("tokenizer.ggml.add_sep_token")
                .unwrap_or(true)
                .then(|| g.u32("tokenizer.ggml.seperator_token_id").unwrap_or(102))
                .filter(|&s| (s as usize) < tokens.len());
            let add_bos = g
                .bool("tokenizer.ggml.add_bos_token")
                .unwrap_or(true)
                .then(|| g.u32("tokenizer.ggml.bos_token_id").unwrap_or(101))
                .filter(|&b| (b as usize) < tokens.len());
            return Ok(Tok { model, pieces, control, ids, add_bos, add_sep });
        }
        let beside = model_path.with_file_name("tokenizer.json");
        let mut tk = if beside.is_file() {
            Tokenizer::from_file(&beside)
                .map_err(|e| tok_err(format!("cannot read {}: {e}", beside.display())))?
        } else {
            if kind != "gpt2" {
                return Err(tok_err(format!(
                    "tokenizer model `{kind}` cannot be built from GGUF metadata here; put the model's tokenizer.json beside {}",
                    model_path.display()
                )));
            }
            let vocab: Vocab =
                tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
            let merges: Vec<(String, String)> = g
                .strings("tokenizer.ggml.merges")
                .ok_or_else(|| tok_err("GGUF metadata `tokenizer.ggml.merges` is missing"))?
                .into_iter()
                .filter_map(|m| m.split_once(' ').map(|(a, b)| (a.to_owned(), b.to_owned())))
                .collect();
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .build()
                .map_err(|e| tok_err(format!("cannot build BPE: {e}")))?;
            let mut tk = Tokenizer::new(bpe);
            let pre = g.string("tokenizer.ggml.pre").unwrap_or("gpt2");
            let pretok: PreTokenizerWrapper = match pre {
                "smollm" => Sequence::new(vec![
                    Digits::new(true).into(),
                    ByteLevel::new(false, true, true).into(),
                ])
                .into(),
                "qwen2" | "deepseek-r1-qwen" => {
                    tk.with_normalizer(Some(NFC)).map_err(|e| tok_err(e.to_string()))?;
                    Sequence::new(vec![
                        split(REGEX_QWEN2)?,
                        ByteLevel::new(false, false, false).into(),
                    ])
                    .into()
                }
                "llama3" | "llama-bpe" | "smaug-bpe" | "dbrx" => Sequence::new(vec![
                    split(REGEX_LLAMA3)?,
                    ByteLevel::new(false, true, false).into(),
                ])
                .into(),
                _ => ByteLevel::new(false, true, true).into(),
            };
            tk.with_pre_tokenizer(Some(pretok));
            tk.with_decoder(Some(ByteLevelDecoder::default()));
            let mut added = Vec::new();
            for (i, t) in tokens.iter().enumerate() {
                match types.get(i).copied() {
                    Some(CONTROL) => added.push(AddedToken::from(t.clone(), true)),
                    Some(USER_DEFINED) => added.push(AddedToken::from(t.clone(), false)),
                    _ => {}
                }
            }
            tk.add_special_tokens(added.iter().filter(|a| a.special).cloned().collect::<Vec<_>>())
                .map_err(|e| tok_err(e.to_string()))?;
            tk.add_tokens(added.iter().filter(|a| !a.special).cloned().collect::<Vec<_>>())
                .map_err(|e| tok_err(e.to_string()))?;
            tk
        };
        tk.with_truncation(None).map_err(|e| tok_err(e.to_string()))?;
        tk.with_padding(None);
        let model = Model::Bpe(Box::new(Mutex::new(tk)));
        Ok(Tok { model, pieces, control, ids, add_bos, add_sep: None })
    }

    /// Token ids of `text`; control tokens written in it are parsed as such
    /// only with `parse_special`. No BOS is added (see [`Tok::bos_to_add`]).
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        match &self.model {
            Model::Bpe(tk) => {
                let mut tk = tk.lock().unwrap_or_else(|e| e.into_inner());
                tk.set_encode_special_tokens(!parse_special);
                let enc = tk
                    .encode_fast(text, false)
                    .map_err(|e| tok_err(format!("cannot tokenize: {e}")))?;
                Ok(enc.get_ids().to_vec())
            }
            Model::Spm(spm) => Ok(spm.encode(&self.ids, text, parse_special)),
        }
    }

    /// The BOS token a prompt should start with (the file's
    /// `tokenizer.ggml.add_bos_token`), if any.
    pub fn bos_to_add(&self) -> Option<u32> {
        self.add_bos
    }

    /// [`Tok::encode`] for a whole prompt: BOS first when the model wants it
    /// and the text does not already start with it (a chat template that
    /// writes `<bos>` itself).
    pub fn encode_prompt(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = self.encode(text, parse_special)?;
        if let Some(b) = self.add_bos {
            if ids.first() != Some(&b) {
                ids.insert(0, b);
            }
        }
        if let Some(sep) = self.add_sep {
            if ids.last() != Some(&sep) {
                ids.push(sep);
            }
        }
        Ok(ids)
    }

    /// The bytes token `id` stands for (control tokens: their text).
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Whether `id` is a control token.
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    /// The id of the token written exactly `text`, if there is one.
    pub fn id_of(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Vocabulary size.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Text of `ids` (lossy where a token sequence is not UTF-8).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| self.piece(i).iter().copied()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Spm {
    /// llama.cpp's `tokenize_impl` for SentencePiece, without BOS/EOS:
    /// special tokens split the text first (longest first; control tokens
    /// only with `parse_special`), each raw piece is then tokenized.
    fn encode(
        &self,
        ids: &std::collections::HashMap<Box<str>, u32>,
        text: &str,
        parse_special: bool,
    ) -> Vec<u32> {
        // Fragments: Ok(raw text range) or Err(token id).
        let mut frags: Vec<Result<(usize, usize), u32>> = vec![Ok((0, text.len()))];
        let mut present = [false; 256];
        text.bytes().for_each(|b| present[b as usize] = true);
        for (tok, id, control) in &self.specials {
            if *control && !parse_special {
                continue;
            }
            if !present[tok.as_bytes()[0] as usize] || tok.len() > text.len() {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                let Ok((mut a, b)) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(i) = text[a..b].find(tok.as_str()) {
                    if i > 0 {
                        next.push(Ok((a, a + i)));
                    }
                    next.push(Err(*id));
                    a += i + tok.len();
                }
                if a < b {
                    next.push(Ok((a, b)));
                }
            }
            frags = next;
        }
        let mut out = Vec::new();
        let mut prev_special = true;
        for f in frags {
            match f {
                Err(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Ok((a, b)) => {
                    let mut t = String::with_capacity(b - a + 4);
                    if self.add_space_prefix && prev_special {
                        t.push(' ');
                    }
                    t.push_str(&text[a..b]);
                    self.piece(ids, &t.replace(' ', "\u{2581}"), &mut out);
                    prev_special = false;
                }
            }
        }
        out
    }

    /// `llm_tokenizer_spm_session::tokenize` on one escaped piece.
    fn piece(
        &self,
        ids: &std::collections::HashMap<Box<str>, u32>,
        text: &str,
        out: &mut Vec<u32>,
    ) {
        #[derive(Clone, Copy)]
        struct Sym {
            start: usize,
            len: usize,
            prev: isize,
            next: isize,
        }
        let mut syms: Vec<Sym> = Vec::new();
        for (i, (at, ch)) in text.char_indices().enumerate() {
            let len = ch.len_utf8();
            let next = if at + len == text.len() { -1 } else { i as isize + 1 };
            syms.push(Sym { start: at, len, prev: i as isize - 1, next });
        }
        // Max-heap by score, then by leftmost position (llama.cpp's
        // `llm_bigram_spm::comparator`).
        #[derive(PartialEq)]
        struct Bigram {
            score: f32,
            left: usize,
            right: usize,
            size: usize,
        }
        impl Eq for Bigram {}
        impl PartialOrd for Bigram {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }
        impl Ord for Bigram {
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
            }
        }
        let mut heap = std::collections::BinaryHeap::new();
        let try_add = |syms: &[Sym],
                       heap: &mut std::collections::BinaryHeap<Bigram>,
                       l: isize,
                       r: isize| {
            if l < 0 || r < 0 {
                return;
            }
            let (a, b) = (syms[l as usize], syms[r as usize]);
            let s = &text[a.start..a.start + a.len + b.len];
            if let Some(&id) = ids.get(s) {
                if let Some(&score) = self.scores.get(id as usize) {
                    heap.push(Bigram { score, left: l as usize, right: r as usize, size: s.len() });
                }
            }
        };
        for i in 1..syms.len() {
            try_add(&syms, &mut heap, i as isize - 1, i as isize);
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (syms[bg.left], syms[bg.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.size {
                continue;
            }
            syms[bg.left].len += r.len;
            syms[bg.right].len = 0;
            syms[bg.left].next = r.next;
            if r.next >= 0 {
                syms[r.next as usize].prev = bg.left as isize;
            }
            let lp = syms[bg.left].prev;
            let ln = syms[bg.left].next;
            try_add(&syms, &mut heap, lp, bg.left as isize);
            try_add(&syms, &mut heap, bg.left as isize, ln);
        }
        let mut i: isize = if syms.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = syms[i as usize];
            let t = &text[s.start..s.start + s.len];
            match ids.get(t) {
                Some(&id) => out.push(id),
                None => {
                    for b in t.bytes() {
                        // A vocabulary without this byte token has no way to
                        // say it; llama.cpp fails there, the unknown token is
                        // what SentencePiece itself emits.
                        out.extend(self.bytes[b as usize].or_else(|| ids.get("<unk>").copied()));
                    }
                }
            }
            i = s.next;
        }
    }
}
