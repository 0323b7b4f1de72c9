//! Embeddings: how a model's token states become one vector per input, as
//! llama.cpp's `llama-embedding` and llama-server's embedding routes compute
//! it — the pooling the GGUF names (`{arch}.pooling_type`: mean, CLS, last),
//! or the one a caller asks for on a chat model that names none, over the
//! hidden states after the output norm (`t_embd`), then the Euclidean
//! normalization `common_embd_normalize` applies by default.
//!
//! The forward pass that yields the states is `Engine::embed` (`engine.rs`):
//! every token of the input is an output row, so the last layer runs on all
//! of them (`model::Scratch::all_rows`), in the physical batches llama.cpp
//! evaluates a prompt in.

use crate::error::{model_err, Error, ErrorKind, Result};
use crate::gguf::Gguf;

/// How token states are pooled into one vector (llama.cpp's
/// `llama_pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every token's state.
    Mean,
    /// The first token's state (BERT's `[CLS]`).
    Cls,
    /// The last token's state (decoder embedding models: Qwen3-Embedding).
    Last,
    /// A reranker's classification head over the first token's state: one
    /// relevance score per input, not a vector (`Engine::rerank`).
    Rank,
}

impl Pooling {
    /// The name used on the command line and in replies.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }

    /// Reads `{arch}.pooling_type` (0 none, 1 mean, 2 cls, 3 last, 4 rank):
    /// `None` when absent or `none`. A rank head (a reranker's classifier)
    /// runs on the encoders only (`encoder.rs`); a decoder naming it is
    /// refused, naming the key.
    pub(crate) fn read(g: &Gguf, arch: &str) -> Result<Option<Pooling>> {
        let key = format!("{arch}.pooling_type");
        match g.u32(&key) {
            None | Some(0) => Ok(None),
            Some(1) => Ok(Some(Pooling::Mean)),
            Some(2) => Ok(Some(Pooling::Cls)),
            Some(3) => Ok(Some(Pooling::Last)),
            Some(4) if matches!(arch, "bert" | "nomic-bert") => Ok(Some(Pooling::Rank)),
            Some(4) => Err(model_err(format!(
                "metadata `{key}` is 4 (rank: a reranker's classification head), which this engine runs on bert and nomic-bert files only, not on {arch}: refusing the file rather than computing other numbers"
            ))),
            Some(other) => Err(model_err(format!(
                "metadata `{key}` is {other}, which names no pooling llama.cpp knows (0 none, 1 mean, 2 cls, 3 last, 4 rank)"
            ))),
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = Error;

    fn from_str(s: &str) -> Result<Pooling> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            other => Err(Error::new(
                ErrorKind::Input,
                format!("pooling `{other}` is not one of mean, cls, last (a reranker's `rank` head is the file's own: POST /v1/rerank)"),
            )),
        }
    }
}

/// One input's embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    /// The pooled, normalized vector (`n_embd` values, Euclidean norm 1
    /// unless every value is 0).
    pub vector: Vec<f32>,
    /// The input's tokens.
    pub tokens: usize,
    /// The pooling applied.
    pub pooling: Pooling,
}

/// Accumulates token states (`d` values each, in position order) into a
/// pooled vector.
#[derive(Debug)]
pub(crate) struct Pooler {
    pooling: Pooling,
    d: usize,
    /// Mean: the running sum of state · 1/n; CLS: the first state; last:
    /// the latest state.
    acc: Vec<f32>,
    inv_n: f32,
    seen: usize,
}

impl Pooler {
    /// A pool for an input of `n` tokens (n > 0) of `d`-value states.
    pub(crate) fn new(pooling: Pooling, d: usize, n: usize) -> Pooler {
        Pooler { pooling, d, acc: vec![0.0; d], inv_n: 1.0 / n as f32, seen: 0 }
    }

    /// Adds the next rows' states (`rows.len()` a multiple of `d`).
    pub(crate) fn add(&mut self, rows: &[f32]) {
        for row in rows.chunks_exact(self.d) {
            match self.pooling {
                // llama.cpp multiplies the states by a matrix of 1/n.
                Pooling::Mean => {
                    self.acc.iter_mut().zip(row).for_each(|(a, v)| *a += v * self.inv_n)
                }
                // A reranker's head reads the first token's state too
                // (llama.cpp's `pooling_type_cls` default).
                Pooling::Cls | Pooling::Rank if self.seen == 0 => self.acc.copy_from_slice(row),
                Pooling::Cls | Pooling::Rank => {}
                Pooling::Last => self.acc.copy_from_slice(row),
            }
            self.seen += 1;
        }
    }

    /// The pooled vector, normalized to Euclidean length 1 as
    /// `common_embd_normalize(…, 2)` does (squares summed in f64; a zero
    /// vector stays zero).
    pub(crate) fn finish(self) -> Vec<f32> {
        normalize(self.acc)
    }
}

/// `common_embd_normalize` with norm 2: `v` scaled to Euclidean length 1
/// (squares summed in f64; a zero vector stays zero).
pub fn normalize(mut v: Vec<f32>) -> Vec<f32> {
    let sum: f64 = v.iter().map(|x| (*x as f64) * (*x as f64)).sum();
    let norm = if sum > 0.0 { (1.0 / sum.sqrt()) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= norm);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_cls_and_last_pool_the_rows_they_name() {
        let rows = [3.0, 0.0, 0.0, 4.0, 3.0, 4.0];
        let pooled = |p: Pooling| {
            let mut pool = Pooler::new(p, 2, 3);
            pool.add(&rows[..4]);
            pool.add(&rows[4..]);
            pool.finish()
        };
        assert_eq!(pooled(Pooling::Cls), vec![1.0, 0.0]);
        assert_eq!(pooled(Pooling::Last), vec![0.6, 0.8]);
        let m = pooled(Pooling::Mean);
        assert!((m[0] - 0.6).abs() < 1e-6 && (m[1] - 0.8).abs() < 1e-6, "{m:?}");
    }

    #[test]
    fn a_zero_vector_stays_zero_and_names_parse() {
        assert_eq!(normalize(vec![0.0; 3]), vec![0.0; 3]);
        for p in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
            assert_eq!(p.as_str().parse::<Pooling>().unwrap(), p);
        }
        assert!("rank".parse::<Pooling>().is_err());
    }
}
