//! The llama family (llama, mistral, qwen2, qwen3) on the fast CPU path:
//! weights packed for the kernels, a preallocated-per-session f16 KV cache,
//! and a forward pass over a chunk of tokens that returns the last logits.
//!
//! INVARIANT: every number a token's forward pass produces depends only on
//! the tokens up to it and the attention path (`kernels::attn::Mode`) each
//! of them was run with, never on how the prompt was split into chunks
//! (per-column matmuls, per-row norms, per-query attention), so a cached
//! prefix continues bit-identically when its paths are the ones a fresh
//! run would take (`Session` checks).

use crate::error::{model_err, Result};
use crate::gguf::Gguf;
use crate::kernels::attn::{
    attend_tiled, attend_vec, swiglu, Lane, Mode, TiledRow, TiledScratch, MAX_HEAD,
};
use crate::kernels::{Acts, OutRows, Packed};
use crate::pool::Pool;
use crate::quant::{dequantize_row, QType};
use candle_core::quantized::{GgmlDType, QMatMul};
use half::f16;

/// Architectures this forward pass implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// llama, SmolLM2, Llama 3.x, Mistral (normal RoPE).
    Llama,
    /// qwen2 (NeoX RoPE, q/k/v biases).
    Qwen2,
    /// qwen3 (NeoX RoPE, per-head q/k RMS norms).
    Qwen3,
}

/// Hyper-parameters read from the GGUF metadata.
#[derive(Debug, Clone)]
pub struct Config {
    /// The architecture.
    pub arch: Arch,
    /// The GGUF `general.architecture` string.
    pub arch_name: String,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Feed-forward size.
    pub n_ff: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Context the model was trained for.
    pub n_ctx_train: usize,
    rope_base: f32,
    rope_dims: usize,
    rope_neox: bool,
    eps: f32,
}

impl Config {
    pub(crate) fn read(g: &Gguf) -> Result<Config> {
        let arch_name = g
            .string("general.architecture")
            .ok_or_else(|| model_err("GGUF metadata `general.architecture` is missing"))?
            .to_owned();
        let arch = match arch_name.as_str() {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            other => {
                return Err(model_err(format!(
                "architecture `{other}` is not supported (supported: llama, mistral, qwen2, qwen3)"
            )))
            }
        };
        let k = |s: &str| format!("{arch_name}.{s}");
        let n_embd = g.need_u32(&k("embedding_length"))? as usize;
        let n_head = g.need_u32(&k("attention.head_count"))? as usize;
        let n_kv = g.u32(&k("attention.head_count_kv")).map(|v| v as usize).unwrap_or(n_head);
        let head_dim =
            g.u32(&k("attention.key_length")).map(|v| v as usize).unwrap_or(n_embd / n_head.max(1));
        let (_, n_vocab, _) = g.shape("token_embd.weight")?;
        let cfg = Config {
            arch,
            arch_name: arch_name.clone(),
            n_layer: g.need_u32(&k("block_count"))? as usize,
            n_embd,
            n_head,
            n_kv,
            head_dim,
            n_ff: g.need_u32(&k("feed_forward_length"))? as usize,
            n_vocab,
            n_ctx_train: g.u32(&k("context_length")).unwrap_or(4096) as usize,
            rope_base: g.f32(&k("rope.freq_base")).unwrap_or(10_000.0),
            rope_dims: g.u32(&k("rope.dimension_count")).map(|v| v as usize).unwrap_or(head_dim),
            rope_neox: arch != Arch::Llama,
            eps: g.f32(&k("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        };
        if cfg.n_head == 0
            || cfg.n_kv == 0
            || !cfg.n_head.is_multiple_of(cfg.n_kv)
            || !cfg.head_dim.is_multiple_of(2)
        {
            return Err(model_err(format!(
                "inconsistent attention shape: {} heads, {} kv heads, head size {}",
                cfg.n_head, cfg.n_kv, cfg.head_dim
            )));
        }
        Ok(cfg)
    }
}

/// A linear layer: the fast packed kernels, or candle's quantized matmul
/// for tensor types the fast path does not have.
#[derive(Debug)]
pub(crate) enum Linear {
    Packed(Packed),
    Candle {
        mm: QMatMul,
        rows: usize,
        cols: usize,
    },
    /// Several layers applied to the same input, outputs side by side.
    Stack(Vec<Linear>),
}

impl Linear {
    pub(crate) fn rows(&self) -> usize {
        match self {
            Linear::Packed(p) => p.rows,
            Linear::Candle { rows, .. } => *rows,
            Linear::Stack(v) => v.iter().map(Linear::rows).sum(),
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            Linear::Packed(p) => p.bytes(),
            Linear::Candle { rows, cols, .. } => rows * cols,
            Linear::Stack(v) => v.iter().map(Linear::bytes).sum(),
        }
    }

    /// `out[c · rows + r]` for the `n` columns of `x` (`[n × cols]`).
    pub(crate) fn forward(
        &self,
        pool: &Pool,
        x: &[f32],
        n: usize,
        acts: &mut Acts,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let rows = self.rows();
        out.clear();
        out.resize(n * rows, 0.0);
        match self {
            Linear::Packed(p) => {
                acts.prepare(x, n, p.cols, p, pool);
                let tiles = p.tiles();
                // Enough chunks to balance, few enough to keep dispatch cheap.
                let per = (tiles / (pool.threads() * 8)).max(1);
                let chunks = tiles.div_ceil(per);
                let o = OutRows::new(out, rows);
                let acts = &*acts;
                pool.run(chunks, &|i| {
                    let t0 = i * per;
                    p.matmul_tiles(acts, t0..(t0 + per).min(tiles), &o);
                });
            }
            Linear::Candle { mm, cols, .. } => {
                use candle_core::Module;
                let t = candle_core::Tensor::from_slice(
                    &x[..n * cols],
                    (n, *cols),
                    &candle_core::Device::Cpu,
                )?;
                let y = mm.forward(&t)?.flatten_all()?.to_vec1::<f32>()?;
                out.copy_from_slice(&y);
            }
            Linear::Stack(parts) => {
                let mut off = 0;
                let mut tmp = Vec::new();
                for part in parts {
                    let pr = part.rows();
                    part.forward(pool, x, n, acts, &mut tmp)?;
                    for c in 0..n {
                        out[c * rows + off..c * rows + off + pr]
                            .copy_from_slice(&tmp[c * pr..(c + 1) * pr]);
                    }
                    off += pr;
                }
            }
        }
        Ok(())
    }

    /// Loads the tensors `names` (same column count) as one layer whose
    /// rows are theirs stacked in order.
    fn load(g: &mut Gguf, names: &[&str]) -> Result<Linear> {
        let mut shapes = Vec::new();
        for n in names {
            shapes.push(g.shape(n)?);
        }
        let cols = shapes[0].2;
        let ty = shapes[0].0;
        let same = shapes.iter().all(|s| s.0 == ty && s.2 == cols);
        if same
            && matches!(ty, GgmlDType::Q4_1 | GgmlDType::Q8_0 | GgmlDType::F32 | GgmlDType::F16)
            && cols % 32 == 0
        {
            let rows: usize = shapes.iter().map(|s| s.1).sum();
            if matches!(ty, GgmlDType::Q4_1 | GgmlDType::Q8_0) {
                // Repacked a slice of rows at a time: a tensor is never held
                // twice (the tied output matrix alone is 30 MB on the default
                // model, and peak RSS is a target).
                let mut p = Packed::empty(ty == GgmlDType::Q8_0, rows, cols);
                let row_bytes = cols / 32 * ty.type_size();
                let mut buf = Vec::new();
                let mut base = 0;
                for (n, s) in names.iter().zip(&shapes) {
                    let mut r = 0;
                    while r < s.1 {
                        let take = (s.1 - r).min(256);
                        buf.resize(take * row_bytes, 0);
                        g.read_rows(n, r, &mut buf)?;
                        p.fill(base + r, &buf);
                        r += take;
                    }
                    base += s.1;
                }
                return Ok(Linear::Packed(p));
            }
            let mut raw = Vec::new();
            for n in names {
                raw.extend_from_slice(&g.bytes(n)?);
            }
            let qt = if ty == GgmlDType::F32 { QType::F32 } else { QType::F16 };
            let mut w = vec![0f32; rows * cols];
            for (r, chunk) in w.chunks_exact_mut(cols).enumerate() {
                let rb = qt.row_bytes(cols);
                dequantize_row(qt, &raw[r * rb..(r + 1) * rb], chunk);
            }
            return Ok(Linear::Packed(Packed::f32(w, rows, cols)));
        }
        let mut parts = Vec::new();
        for (n, (_, rows, cols)) in names.iter().zip(&shapes) {
            let qt = g.qtensor(n)?;
            parts.push(Linear::Candle { mm: QMatMul::from_qtensor(qt)?, rows: *rows, cols: *cols });
        }
        Ok(if parts.len() == 1 { parts.pop().expect("one part") } else { Linear::Stack(parts) })
    }
}

#[derive(Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    qkv: Linear,
    bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    wo: Linear,
    ffn_norm: Vec<f32>,
    gate_up: Linear,
    down: Linear,
}

#[derive(Debug)]
enum Embedding {
    /// Rows looked up in the (packed) output matrix.
    Tied,
    /// Raw GGUF rows of a type the fast path reads.
    Raw { ty: QType, data: Vec<u8> },
    /// Dequantized rows.
    F32(Vec<f32>),
}

/// The loaded weights.
#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) cfg: Config,
    emb: Embedding,
    layers: Vec<Layer>,
    out_norm: Vec<f32>,
    output: Linear,
}

fn vector(g: &mut Gguf, name: &str, len: usize) -> Result<Vec<f32>> {
    let (ty, rows, cols) = g.shape(name)?;
    if rows * cols != len {
        return Err(model_err(format!("tensor `{name}` has {} values, want {len}", rows * cols)));
    }
    let raw = g.bytes(name)?;
    let qt = match ty {
        GgmlDType::F32 => QType::F32,
        GgmlDType::F16 => QType::F16,
        other => return Err(model_err(format!("tensor `{name}` has type {other:?}, want F32"))),
    };
    let mut v = vec![0f32; len];
    dequantize_row(qt, &raw, &mut v);
    Ok(v)
}

fn qtype(ty: GgmlDType) -> Option<QType> {
    Some(match ty {
        GgmlDType::F32 => QType::F32,
        GgmlDType::F16 => QType::F16,
        GgmlDType::Q4_0 => QType::Q4_0,
        GgmlDType::Q4_1 => QType::Q4_1,
        GgmlDType::Q8_0 => QType::Q8_0,
        _ => return None,
    })
}

impl Model {
    pub(crate) fn load(g: &mut Gguf) -> Result<Model> {
        let cfg = Config::read(g)?;
        let d = cfg.n_embd;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let t = |s: &str| format!("blk.{i}.{s}");
            let (q, k, v) = (t("attn_q.weight"), t("attn_k.weight"), t("attn_v.weight"));
            let bias = if g.has(&t("attn_q.bias")) {
                let mut b = vector(g, &t("attn_q.bias"), cfg.n_head * cfg.head_dim)?;
                b.extend(vector(g, &t("attn_k.bias"), cfg.n_kv * cfg.head_dim)?);
                b.extend(vector(g, &t("attn_v.bias"), cfg.n_kv * cfg.head_dim)?);
                Some(b)
            } else {
                None
            };
            let q_norm = if g.has(&t("attn_q_norm.weight")) {
                Some(vector(g, &t("attn_q_norm.weight"), cfg.head_dim)?)
            } else {
                None
            };
            let k_norm = if g.has(&t("attn_k_norm.weight")) {
                Some(vector(g, &t("attn_k_norm.weight"), cfg.head_dim)?)
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: vector(g, &t("attn_norm.weight"), d)?,
                qkv: Linear::load(g, &[&q, &k, &v])?,
                bias,
                q_norm,
                k_norm,
                wo: Linear::load(g, &[&t("attn_output.weight")])?,
                ffn_norm: vector(g, &t("ffn_norm.weight"), d)?,
                gate_up: Linear::load(g, &[&t("ffn_gate.weight"), &t("ffn_up.weight")])?,
                down: Linear::load(g, &[&t("ffn_down.weight")])?,
            });
        }
        let out_norm = vector(g, "output_norm.weight", d)?;
        let (emb_ty, _, _) = g.shape("token_embd.weight")?;
        let (output, emb) = if g.has("output.weight") {
            let output = Linear::load(g, &["output.weight"])?;
            let emb = match qtype(emb_ty) {
                Some(ty) => Embedding::Raw { ty, data: g.bytes("token_embd.weight")? },
                None => Embedding::F32(
                    g.qtensor("token_embd.weight")?
                        .dequantize(&candle_core::Device::Cpu)?
                        .flatten_all()?
                        .to_vec1()?,
                ),
            };
            (output, emb)
        } else {
            let output = Linear::load(g, &["token_embd.weight"])?;
            let emb = match &output {
                Linear::Packed(_) => Embedding::Tied,
                _ => Embedding::F32(
                    g.qtensor("token_embd.weight")?
                        .dequantize(&candle_core::Device::Cpu)?
                        .flatten_all()?
                        .to_vec1()?,
                ),
            };
            (output, emb)
        };
        Ok(Model { cfg, emb, layers, out_norm, output })
    }

    /// Bytes of weights held.
    pub(crate) fn bytes(&self) -> usize {
        let mut n = self.output.bytes();
        for l in &self.layers {
            n += l.qkv.bytes() + l.wo.bytes() + l.gate_up.bytes() + l.down.bytes();
        }
        n + match &self.emb {
            Embedding::Tied => 0,
            Embedding::Raw { data, .. } => data.len(),
            Embedding::F32(v) => 4 * v.len(),
        }
    }

    fn embed(&self, token: u32, out: &mut [f32]) -> Result<()> {
        let d = self.cfg.n_embd;
        let t = token as usize;
        if t >= self.cfg.n_vocab {
            return Err(crate::error::Error::new(
                crate::error::ErrorKind::Input,
                format!("token id {token} is outside the vocabulary ({} tokens)", self.cfg.n_vocab),
            ));
        }
        match &self.emb {
            Embedding::Tied => match &self.output {
                Linear::Packed(p) => p.dequantize_row(t, out),
                _ => unreachable!("tied embeddings are packed"),
            },
            Embedding::Raw { ty, data } => {
                let rb = ty.row_bytes(d);
                dequantize_row(*ty, &data[t * rb..(t + 1) * rb], out);
            }
            Embedding::F32(v) => out.copy_from_slice(&v[t * d..(t + 1) * d]),
        }
        Ok(())
    }
}

/// Positions by which the KV cache's storage grows.
const KV_STEP: usize = 128;
/// Positions per feed-forward slice of a prompt batch.
const FFN_SLICE: usize = 64;

/// A session's key/value cache: per layer, `[position][kv head][head size]`
/// as f16, grown as positions are added.
#[derive(Debug, Default)]
pub(crate) struct KvCache {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    len: usize,
}

impl KvCache {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Forgets positions from `len` on.
    pub(crate) fn truncate(&mut self, len: usize, cfg: &Config) {
        let row = cfg.n_kv * cfg.head_dim;
        self.len = self.len.min(len);
        for l in self.k.iter_mut().chain(self.v.iter_mut()) {
            l.truncate(self.len * row);
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|l| l.capacity() * 2).sum()
    }
}

/// Buffers reused from one forward pass to the next.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gu: Vec<f32>,
    act: Vec<f32>,
    acts: Acts,
    /// RoPE cos/sin pairs of the positions being run.
    rope: Vec<f32>,
    /// Each row's sequence (index into the pass's `Seq`s) and position.
    rows: Vec<(usize, usize)>,
    /// Rows on the one-query attention path.
    vec_rows: Vec<usize>,
    /// Runs of rows (one sequence each) on the tiled path.
    spans: Vec<std::ops::Range<usize>>,
    pub(crate) logits: Vec<f32>,
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// [`rms_norm`] in place (the per-head q/k norms).
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (v, g) in x.iter_mut().zip(w) {
        *v = (*v * scale) * g;
    }
}

/// As llama.cpp's `ggml_compute_forward_rms_norm_f32` (fused with the
/// weight's MUL: `x · scale · w`): squares summed in order in f64, the mean
/// rounded to f32.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// llama.cpp's RoPE cache for one position (`ggml_rope_cache_init`,
/// no YaRN): `θ = pos · base^(-2i/dims)` by repeated multiplication, then
/// `cos θ`, `sin θ` per rotated pair.
fn rope_cache(pos: usize, cfg: &Config, out: &mut [f32]) {
    let dims = cfg.rope_dims.min(cfg.head_dim);
    let scale = cfg.rope_base.powf(-2.0 / dims as f32);
    let mut theta = pos as f32;
    for pair in out[..dims].chunks_exact_mut(2) {
        pair[0] = theta.cos();
        pair[1] = theta.sin();
        theta *= scale;
    }
}

/// Rotates every head of `x` by a position's [`rope_cache`]: llama.cpp's
/// `rotate_pairs`, whose `x0·cos − x1·sin` and `x0·sin + x1·cos` GCC
/// contracts (`-ffp-contract=fast`) into one fma on the first product.
fn rope(x: &mut [f32], cache: &[f32], cfg: &Config) {
    let dims = cfg.rope_dims.min(cfg.head_dim);
    for head in x.chunks_exact_mut(cfg.head_dim) {
        for (i, cs) in cache[..dims].chunks_exact(2).enumerate() {
            let (c, s) = (cs[0], cs[1]);
            let (a, b) = if cfg.rope_neox { (i, i + dims / 2) } else { (2 * i, 2 * i + 1) };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0.mul_add(c, -(x1 * s));
            head[b] = x0.mul_add(s, x1 * c);
        }
    }
}

/// Query positions per tiled-attention task.
const TILED_ROWS: usize = 16;

thread_local! {
    /// Each pool thread's buffers for the tiled attention path.
    static TILED: std::cell::RefCell<(TiledScratch, Vec<f32>)> = Default::default();
}

/// One sequence of a batched forward pass: its cache, how many of the
/// pass's tokens (consecutive, in `seqs` order) are its, and where its last
/// token's logits go.
pub(crate) struct Seq<'a> {
    pub(crate) kv: &'a mut KvCache,
    pub(crate) n: usize,
    /// The attention path of its rows (llama.cpp's, see `kernels::attn`).
    pub(crate) mode: Mode,
    pub(crate) logits: &'a mut Vec<f32>,
}

impl Model {
    /// Runs `tokens` (at positions `kv.len()..`) through the model, appends
    /// their keys and values, and leaves the logits of the last token in
    /// `scratch.logits`. Attention takes llama.cpp's path `mode` for every
    /// token (see `kernels::attn`); nothing else depends on how tokens are
    /// grouped into calls.
    pub(crate) fn forward(
        &self,
        pool: &Pool,
        tokens: &[u32],
        mode: Mode,
        kv: &mut KvCache,
        s: &mut Scratch,
    ) -> Result<()> {
        let mut logits = std::mem::take(&mut s.logits);
        let seq = Seq { kv, n: tokens.len(), mode, logits: &mut logits };
        let r = self.forward_seqs(pool, tokens, &mut [seq], s);
        s.logits = logits;
        r
    }

    /// [`Model::forward`] for several sequences at once, each with its own
    /// cache, positions and attention path (decode steps of some, a prompt
    /// chunk of another): the weights are read once for all of them (the
    /// point of batching across requests). Every row's numbers are the ones
    /// a pass of that sequence alone gives (per-column matmuls, per-row
    /// norms and attention), so batching never changes an output.
    pub(crate) fn forward_seqs(
        &self,
        pool: &Pool,
        tokens: &[u32],
        seqs: &mut [Seq<'_>],
        s: &mut Scratch,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (n, d) = (tokens.len(), cfg.n_embd);
        assert_eq!(n, seqs.iter().map(|q| q.n).sum::<usize>(), "tokens and sequences disagree");
        if n == 0 {
            return Ok(());
        }
        let (qd, kd) = (cfg.n_head * cfg.head_dim, cfg.n_kv * cfg.head_dim);
        // Each row's sequence and absolute position; the rows that take the
        // one-query path; the runs of rows that take the tiled one.
        s.rows.clear();
        s.vec_rows.clear();
        s.spans.clear();
        for (j, q) in seqs.iter_mut().enumerate() {
            let r0 = s.rows.len();
            match q.mode {
                Mode::Vec => s.vec_rows.extend(r0..r0 + q.n),
                Mode::Tiled => s.spans.extend(
                    (r0..r0 + q.n).step_by(TILED_ROWS).map(|b| b..(b + TILED_ROWS).min(r0 + q.n)),
                ),
            }
            if q.kv.k.len() != cfg.n_layer {
                q.kv.k = vec![Vec::new(); cfg.n_layer];
                q.kv.v = vec![Vec::new(); cfg.n_layer];
            }
            s.rows.extend((0..q.n).map(|t| (j, q.kv.len + t)));
            // KV storage grows in steps of KV_STEP positions, exactly: Vec's
            // doubling would hold up to twice the cache (peak RSS is a target).
            let want = (q.kv.len + q.n).div_ceil(KV_STEP) * KV_STEP * kd;
            for c in q.kv.k.iter_mut().chain(q.kv.v.iter_mut()) {
                if c.capacity() < want {
                    c.reserve_exact(want - c.len());
                }
            }
        }
        s.x.resize(n * d, 0.0);
        for (i, &t) in tokens.iter().enumerate() {
            self.embed(t, &mut s.x[i * d..(i + 1) * d])?;
        }
        s.h.resize(n * d, 0.0);
        s.att.resize(n * qd, 0.0);
        let rd = cfg.rope_dims.min(cfg.head_dim);
        s.rope.resize(n * rd, 0.0);
        for (i, &(_, pos)) in s.rows.iter().enumerate() {
            rope_cache(pos, cfg, &mut s.rope[i * rd..(i + 1) * rd]);
        }
        for (li, layer) in self.layers.iter().enumerate() {
            for i in 0..n {
                rms_norm(
                    &s.x[i * d..(i + 1) * d],
                    &layer.attn_norm,
                    cfg.eps,
                    &mut s.h[i * d..(i + 1) * d],
                );
            }
            layer.qkv.forward(pool, &s.h, n, &mut s.acts, &mut s.qkv)?;
            let w = qd + 2 * kd;
            for i in 0..n {
                let row = &mut s.qkv[i * w..(i + 1) * w];
                if let Some(b) = &layer.bias {
                    row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                }
                if let Some(qn) = &layer.q_norm {
                    for h in row[..qd].chunks_exact_mut(cfg.head_dim) {
                        rms_norm_in_place(h, qn, cfg.eps);
                    }
                }
                if let Some(kn) = &layer.k_norm {
                    for h in row[qd..qd + kd].chunks_exact_mut(cfg.head_dim) {
                        rms_norm_in_place(h, kn, cfg.eps);
                    }
                }
                let cache = &s.rope[i * rd..(i + 1) * rd];
                rope(&mut row[..qd], cache, cfg);
                rope(&mut row[qd..qd + kd], cache, cfg);
                let kv = &mut *seqs[s.rows[i].0].kv;
                kv.k[li].extend(row[qd..qd + kd].iter().map(|&v| f16::from_f32(v)));
                kv.v[li].extend(row[qd + kd..].iter().map(|&v| f16::from_f32(v)));
            }
            self.attention(pool, li, seqs, s);
            layer.wo.forward(pool, &s.att, n, &mut s.acts, &mut s.proj)?;
            s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
            for i in 0..n {
                rms_norm(
                    &s.x[i * d..(i + 1) * d],
                    &layer.ffn_norm,
                    cfg.eps,
                    &mut s.h[i * d..(i + 1) * d],
                );
            }
            // The feed-forward block, FFN_SLICE positions at a time: its
            // activations are the widest (2·n_ff per position), and each
            // position's arithmetic does not depend on its neighbours.
            let ff = cfg.n_ff;
            for c0 in (0..n).step_by(FFN_SLICE) {
                let m = (n - c0).min(FFN_SLICE);
                layer.gate_up.forward(
                    pool,
                    &s.h[c0 * d..(c0 + m) * d],
                    m,
                    &mut s.acts,
                    &mut s.gu,
                )?;
                s.act.resize(m * ff, 0.0);
                for i in 0..m {
                    let (g, u) = s.gu[i * 2 * ff..(i + 1) * 2 * ff].split_at(ff);
                    swiglu(g, u, &mut s.act[i * ff..(i + 1) * ff]);
                }
                layer.down.forward(pool, &s.act, m, &mut s.acts, &mut s.proj)?;
                s.x[c0 * d..(c0 + m) * d].iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
            }
        }
        // Each sequence's last row: final norm, then one output matmul.
        let m = seqs.len();
        s.h.resize(m * d, 0.0);
        let mut last = 0;
        for (j, q) in seqs.iter_mut().enumerate() {
            q.kv.len += q.n;
            last += q.n;
            let r = last - 1;
            rms_norm(
                &s.x[r * d..(r + 1) * d],
                &self.out_norm,
                cfg.eps,
                &mut s.h[j * d..(j + 1) * d],
            );
        }
        let mut out = std::mem::take(&mut s.proj);
        self.output.forward(pool, &s.h[..m * d], m, &mut s.acts, &mut out)?;
        let vocab = out.len() / m;
        for (j, q) in seqs.iter_mut().enumerate() {
            q.logits.clear();
            q.logits.extend_from_slice(&out[j * vocab..(j + 1) * vocab]);
        }
        s.proj = out;
        Ok(())
    }

    /// Attention of the pass's rows (`s.rows`: sequence and position) over
    /// their sequences' caches, which already hold the rows' own keys: the
    /// one-query path for `s.vec_rows`, the tiled one for `s.spans`.
    fn attention(&self, pool: &Pool, li: usize, seqs: &[Seq<'_>], s: &mut Scratch) {
        let cfg = &self.cfg;
        let hd = cfg.head_dim;
        assert!(hd <= MAX_HEAD, "head size {hd} is over {MAX_HEAD}");
        let (qd, kd) = (cfg.n_head * hd, cfg.n_kv * hd);
        let w = qd + 2 * kd;
        let group = cfg.n_head / cfg.n_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        let (rows, vec_rows, spans) = (&s.rows, &s.vec_rows, &s.spans);
        let cache = |i: usize| {
            let kv = &*seqs[rows[i].0].kv;
            (&kv.k[li][..], &kv.v[li][..])
        };
        let qkv = &s.qkv;
        let out = OutRows::new(&mut s.att, qd);
        let q = |i: usize, h: usize| &qkv[i * w + h * hd..i * w + (h + 1) * hd];
        if !vec_rows.is_empty() {
            pool.run(vec_rows.len() * cfg.n_head, &|task| {
                let (i, h) = (vec_rows[task / cfg.n_head], task % cfg.n_head);
                let lane = Lane { stride: kd, offset: (h / group) * hd };
                let (kc, vc) = cache(i);
                let mut o = [0f32; MAX_HEAD];
                attend_vec(q(i, h), kc, vc, lane, rows[i].1 + 1, scale, &mut o[..hd]);
                for (j, v) in o[..hd].iter().enumerate() {
                    out.set(i, h * hd + j, *v);
                }
            });
        }
        if !spans.is_empty() {
            // Per task: a run of positions of one sequence and the query
            // heads of one KV head, so each key tile is converted once
            // for all of them.
            pool.run(spans.len() * cfg.n_kv, &|task| {
                let (b, g) = (task / cfg.n_kv, task % cfg.n_kv);
                let lane = Lane { stride: kd, offset: g * hd };
                let pos = spans[b].clone();
                let (kc, vc) = cache(pos.start);
                let heads = g * group..(g + 1) * group;
                let trows: Vec<TiledRow<'_>> = pos
                    .clone()
                    .flat_map(|i| heads.clone().map(move |h| (i, h)))
                    .map(|(i, h)| TiledRow { q: q(i, h), upto: rows[i].1 + 1 })
                    .collect();
                TILED.with_borrow_mut(|(tile, o)| {
                    o.resize(trows.len() * hd, 0.0);
                    attend_tiled(&trows, kc, vc, lane, scale, tile, o);
                    let mut at = 0;
                    for i in pos {
                        for h in heads.clone() {
                            for (j, v) in o[at..at + hd].iter().enumerate() {
                                out.set(i, h * hd + j, *v);
                            }
                            at += hd;
                        }
                    }
                });
            });
        }
    }
}
