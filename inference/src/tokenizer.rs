//! The tokenizer, built from the GGUF metadata (or a `tokenizer.json` beside
//! the model, which wins), and the bytes of every token for streaming text.
//!
//! Pre-tokenizers follow llama.cpp's `tokenizer.ggml.pre` names: `smollm`
//! splits digits one by one, then byte-level BPE *without* a prefix space
//! (so "user" is 4093, not "Ġuser"); `qwen2` and `llama3` use their regexes.
//! Control tokens are parsed only when asked (`parse_special`), as llama.cpp
//! does; user-defined tokens always are.

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

/// Text ↔ token ids for one model.
#[derive(Debug)]
pub struct Tok {
    inner: Mutex<Tokenizer>,
    /// The bytes each token stands for.
    pieces: Vec<Vec<u8>>,
    /// Control tokens (never shown as text).
    control: Vec<bool>,
    /// The token strings.
    names: Vec<String>,
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
        let kind = g.string("tokenizer.ggml.model").unwrap_or("gpt2").to_owned();
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
        let dec = byte_decoder();
        let mut pieces = Vec::with_capacity(tokens.len());
        let mut control = Vec::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            let ty = types.get(i).copied().unwrap_or(1);
            control.push(ty == CONTROL);
            if ty == CONTROL || ty == USER_DEFINED || kind != "gpt2" {
                pieces.push(t.replace('\u{2581}', " ").into_bytes());
            } else {
                pieces.push(t.chars().map(|c| dec.get(&c).copied().unwrap_or(b'?')).collect());
            }
        }
        Ok(Tok { inner: Mutex::new(tk), pieces, control, names: tokens })
    }

    /// Token ids of `text`; control tokens written in it are parsed as such
    /// only with `parse_special`. No BOS is added.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut tk = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        tk.set_encode_special_tokens(!parse_special);
        let enc =
            tk.encode_fast(text, false).map_err(|e| tok_err(format!("cannot tokenize: {e}")))?;
        Ok(enc.get_ids().to_vec())
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
        self.names.iter().position(|n| n == text).map(|i| i as u32)
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
