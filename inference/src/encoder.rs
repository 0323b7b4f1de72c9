//! The encoders: BERT-family embedding models (`bert`: all-MiniLM, bge,
//! mxbai-embed-large, and rerankers such as bge-reranker with their
//! classification head; `nomic-bert`: nomic-embed-text) as llama.cpp's
//! `src/models/bert.cpp` graph computes them, on the same packed matrix
//! kernels as the decoders (`model::Linear`).
//!
//! One pass per input, all of it in one batch (llama.cpp refuses an
//! encoder input larger than its physical batch), every token attending to
//! every other (no causal mask, no cache):
//!
//! - input: token row + token-type row 0 ("sentence A", as llama.cpp
//!   hard-codes) + position row (`bert`), then the embedding LayerNorm;
//! - per layer: q, k, v (with biases; `nomic-bert`: one fused `attn_qkv`
//!   and NeoX RoPE on q and k), softmax(q·kᵀ/√head)·v, the output matrix
//!   (+ bias), the residual and the attention LayerNorm; the feed-forward
//!   (`bert`: up + bias, GELU, down + bias; `nomic-bert`: SwiGLU of gate
//!   and up, down), its residual and the output LayerNorm;
//! - the states after the last layer are the token embeddings the pooling
//!   reads (`embed.rs`); a reranker's head (`cls` + bias, tanh,
//!   `cls.output` + bias) turns the first token's state into its score.
//!
//! Every tensor of the file must be read (`model::refuse_unread`), as for
//! the decoders.

use crate::arch::{Arch, Config};
use crate::error::{model_err, Error, ErrorKind, Result};
use crate::gguf::{GgmlType, Gguf};
use crate::kernels::attn::{
    attend_tiled, attend_vec, swiglu, thresholds, Lane, Mode, TiledRow, TiledScratch, MAX_HEAD,
};
use crate::kernels::OutRows;
use crate::kernels::{rows_mut, Acts};
use crate::model::{opt_vector, vector, Embedding, Linear};
use crate::pool::Pool;
use half::f16;

/// Query rows per tiled-attention task.
const ROWS: usize = 16;

/// A LayerNorm's weight and bias.
#[derive(Debug)]
struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

impl Norm {
    fn load(g: &mut Gguf, name: &str, d: usize) -> Result<Norm> {
        Ok(Norm {
            w: vector(g, &format!("{name}.weight"), d)?,
            b: vector(g, &format!("{name}.bias"), d)?,
        })
    }

    /// `((x − mean) / √(var + eps)) · w + b`, as ggml's `norm` (AVX-512
    /// build: the sum in f64 rounded to f32, the mean in f32, the squares
    /// of 16 lanes summed in f32 as `_mm512_reduce_add_ps` and those sums
    /// in f64) then `mul` and `add`.
    #[inline(always)]
    fn apply(&self, x: &mut [f32], eps: f32) {
        let n = x.len();
        let sum = x.iter().map(|&v| v as f64).sum::<f64>() as f32;
        let mean = sum / n as f32;
        x.iter_mut().for_each(|v| *v -= mean);
        let mut var = 0f64;
        let body = n / 16 * 16;
        for c in x[..body].chunks_exact(16) {
            var += crate::kernels::scalar::sum16(std::array::from_fn(|i| c[i] * c[i])) as f64;
        }
        for v in &x[body..] {
            var += (v * v) as f64;
        }
        let variance = (var / n as f64) as f32;
        let scale = 1.0 / (variance + eps).sqrt();
        for ((v, w), b) in x.iter_mut().zip(&self.w).zip(&self.b) {
            *v = (*v * scale) * w + b;
        }
    }
}

/// A matrix with an optional bias, applied to rows.
#[derive(Debug)]
struct Dense {
    m: Linear,
    bias: Option<Vec<f32>>,
}

impl Dense {
    fn load(g: &mut Gguf, names: &[&str], bias: &[String], rows: usize) -> Result<Dense> {
        let m = Linear::load(g, names)?;
        if m.rows() != rows {
            return Err(model_err(format!(
                "tensor `{}` has {} rows, want {rows} for this model's shape",
                names[0],
                m.rows()
            )));
        }
        let mut b = Vec::new();
        for name in bias {
            if !g.has(name) {
                continue;
            }
            let (_, r, c) = g.shape(name)?;
            b.extend(vector(g, name, r * c)?);
        }
        if !b.is_empty() && b.len() != rows {
            return Err(model_err(format!(
                "the biases of `{}` have {} values, want {rows}",
                names[0],
                b.len()
            )));
        }
        Ok(Dense { m, bias: (!b.is_empty()).then_some(b) })
    }

    /// The product alone, `out[c · rows + r]` for the `n` rows of `x`: the
    /// caller adds [`Dense::bias`] in its next pass over the rows (ggml's
    /// `ggml_add` of the bias, the same sum).
    fn product(
        &self,
        pool: &Pool,
        x: &[f32],
        n: usize,
        s: &mut Route,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.m.forward(pool, x, n, &s.grouped, &s.wide, &mut s.acts, out)
    }

    fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }
}

/// `x ← norm(x + (proj + bias))` row by row: a product's bias, the
/// residual and the LayerNorm after it, in one pass (ggml's
/// `add(add(mul_mat, b), inp)` then `norm`).
fn residual_norm(
    pool: &Pool,
    x: &mut [f32],
    proj: &[f32],
    bias: Option<&[f32]>,
    norm: &Norm,
    eps: f32,
) {
    let d = norm.w.len();
    rows_mut(pool, x, d, |i, x| {
        let p = &proj[i * d..(i + 1) * d];
        match bias {
            Some(b) => x.iter_mut().zip(p).zip(b).for_each(|((x, p), b)| *x += p + b),
            None => x.iter_mut().zip(p).for_each(|(x, p)| *x += p),
        }
        norm.apply(x, eps);
    });
}

/// The route of a pass's columns through the matrix kernels: each input's
/// as its own physical batch (`kernels::attn::thresholds`).
#[derive(Debug, Default)]
struct Route {
    grouped: Vec<bool>,
    wide: Vec<bool>,
    acts: Acts,
}

impl Route {
    /// Each input's columns routed as that input's own batch.
    fn set(&mut self, spans: &[std::ops::Range<usize>]) {
        self.grouped.clear();
        self.wide.clear();
        for span in spans {
            let (gu, wu) = thresholds(&(0..span.len()));
            self.grouped.extend((0..span.len()).map(|c| c < gu));
            self.wide.extend((0..span.len()).map(|c| c < wu));
        }
    }
}

#[derive(Debug)]
struct Layer {
    qkv: Dense,
    wo: Dense,
    attn_norm: Norm,
    /// bert: `ffn_up` (n_ff rows); nomic-bert: `ffn_gate` then `ffn_up`.
    up: Dense,
    down: Dense,
    out_norm: Norm,
}

/// A small matrix (`rows × cols`) with an optional bias, for the
/// reranker's head: one product per input, its rows read as the token
/// tables are (`model::Embedding`).
#[derive(Debug)]
struct Small {
    /// ggml rounds the input to f16 for an f16 matrix (its `vec_dot_type`).
    f16_input: bool,
    w: Embedding,
    rows: usize,
    cols: usize,
    bias: Option<Vec<f32>>,
}

impl Small {
    fn load(g: &mut Gguf, name: &str, cols: usize) -> Result<Option<Small>> {
        let weight = format!("{name}.weight");
        if !g.has(&weight) {
            return Ok(None);
        }
        let (ty, rows, c) = g.shape(&weight)?;
        if c != cols || rows == 0 {
            return Err(model_err(format!("tensor `{weight}` is {rows}×{c}, want rows of {cols}")));
        }
        let w = Embedding::table(g, &weight, cols)?;
        let bias = opt_vector(g, &format!("{name}.bias"), rows)?;
        Ok(Some(Small { f16_input: ty == GgmlType::F16, w, rows, cols, bias }))
    }

    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let x: Vec<f32> = if self.f16_input {
            x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
        } else {
            x.to_vec()
        };
        let mut row = vec![0f32; self.cols];
        (0..self.rows)
            .map(|r| {
                self.w.row(r, self.cols, &mut row);
                let dot: f32 = row.iter().zip(&x).map(|(w, x)| w * x).sum();
                dot + self.bias.as_ref().map_or(0.0, |b| b[r])
            })
            .collect()
    }
}

/// A reranker's classification head (llama.cpp's `build_pooling`, rank).
#[derive(Debug)]
struct Head {
    cls: Option<Small>,
    out: Option<Small>,
}

/// A loaded encoder.
#[derive(Debug)]
pub(crate) struct Encoder {
    cfg: Config,
    tokens: Embedding,
    /// Token-type row 0, added to every token.
    type0: Option<Vec<f32>>,
    /// bert's absolute position rows.
    positions: Option<Embedding>,
    embd_norm: Norm,
    layers: Vec<Layer>,
    rope: Option<crate::rope::Rope>,
    head: Option<Head>,
    bytes: usize,
}

/// Buffers of one pass.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    route: Route,
    /// The layer's keys and values as f16 (`[position][head][head size]`).
    k: Vec<f16>,
    v: Vec<f16>,
    /// Each input's rows.
    spans: Vec<std::ops::Range<usize>>,
}

thread_local! {
    /// Each pool thread's buffers for the tiled attention path.
    static TILED: std::cell::RefCell<(TiledScratch, Vec<f32>)> = Default::default();
}

impl Encoder {
    /// Loads the encoder of `g` (an architecture with
    /// [`Arch::is_encoder`]).
    pub(crate) fn load(g: &mut Gguf, context: usize) -> Result<Encoder> {
        let cfg = Config::read(g)?;
        let d = cfg.n_embd;
        if !cfg.arch.is_encoder() {
            return Err(model_err(format!("{} is not an encoder", cfg.arch_name)));
        }
        if cfg.n_kv != cfg.n_head {
            return Err(model_err(format!(
                "an encoder with {} key/value heads for {} query heads: llama.cpp's bert graph has one per head",
                cfg.n_kv, cfg.n_head
            )));
        }
        let tokens = Embedding::table(g, "token_embd.weight", d)?;
        let type0 = if g.has("token_types.weight") {
            let (_, rows, cols) = g.shape("token_types.weight")?;
            if cols != d || rows == 0 {
                return Err(model_err(format!(
                    "tensor `token_types.weight` is {rows}×{cols}, want rows of {d}"
                )));
            }
            let table = Embedding::table(g, "token_types.weight", d)?;
            let mut row = vec![0f32; d];
            table.row(0, d, &mut row);
            Some(row)
        } else {
            None
        };
        let positions = match cfg.arch {
            Arch::Bert => Some(Embedding::table(g, "position_embd.weight", d)?),
            _ => None,
        };
        let embd_norm = Norm::load(g, "token_embd_norm", d)?;
        let qd = cfg.n_head * cfg.head_dim;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let t = |s: &str| format!("blk.{i}.{s}");
            let qkv = if g.has(&t("attn_qkv.weight")) {
                Dense::load(g, &[&t("attn_qkv.weight")], &[t("attn_qkv.bias")], 3 * qd)?
            } else {
                Dense::load(
                    g,
                    &[&t("attn_q.weight"), &t("attn_k.weight"), &t("attn_v.weight")],
                    &[t("attn_q.bias"), t("attn_k.bias"), t("attn_v.bias")],
                    3 * qd,
                )?
            };
            let wo = Dense::load(g, &[&t("attn_output.weight")], &[t("attn_output.bias")], d)?;
            let attn_norm = Norm::load(g, &t("attn_output_norm"), d)?;
            let up = match cfg.arch {
                Arch::NomicBert => Dense::load(
                    g,
                    &[&t("ffn_gate.weight"), &t("ffn_up.weight")],
                    &[],
                    2 * cfg.n_ff,
                )?,
                _ => Dense::load(g, &[&t("ffn_up.weight")], &[t("ffn_up.bias")], cfg.n_ff)?,
            };
            let down = Dense::load(g, &[&t("ffn_down.weight")], &[t("ffn_down.bias")], d)?;
            let out_norm = Norm::load(g, &t("layer_output_norm"), d)?;
            layers.push(Layer { qkv, wo, attn_norm, up, down, out_norm });
        }
        let rope = match cfg.arch {
            Arch::NomicBert => crate::model::load_ropes(g, &cfg, context)?.into_iter().next(),
            _ => None,
        };
        let cls = Small::load(g, "cls", d)?;
        let out = Small::load(g, "cls.output", cls.as_ref().map_or(d, |c| c.rows))?;
        let head = (cls.is_some() || out.is_some()).then_some(Head { cls, out });
        crate::model::refuse_unread(g, &cfg)?;
        let mut bytes = tokens.bytes() + positions.as_ref().map_or(0, |p| p.bytes());
        for l in &layers {
            bytes += l.qkv.m.bytes() + l.wo.m.bytes() + l.up.m.bytes() + l.down.m.bytes();
        }
        Ok(Encoder { cfg, tokens, type0, positions, embd_norm, layers, rope, head, bytes })
    }

    /// Bytes of weights held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the file has a reranker's classification head.
    pub(crate) fn has_head(&self) -> bool {
        self.head.is_some()
    }

    /// The score of a reranker's head for the first token's state `cls`
    /// (llama.cpp's rank pooling: `cls` + bias, tanh, `cls.output` + bias;
    /// the first output is the score).
    pub(crate) fn score(&self, cls: &[f32]) -> Result<f32> {
        let Some(head) = &self.head else {
            return Err(Error::new(
                ErrorKind::Input,
                format!("the {} file has no classification head (`cls.output`): it embeds, it does not rerank", self.cfg.arch_name),
            ));
        };
        let mut x = cls.to_vec();
        if let Some(c) = &head.cls {
            x = c.apply(&x).into_iter().map(f32::tanh).collect();
        }
        if let Some(o) = &head.out {
            x = o.apply(&x);
        }
        Ok(x.first().copied().unwrap_or(0.0))
    }

    /// Runs `inputs` (each from position 0, attending only to itself)
    /// through the encoder in one pass and leaves every token's final state
    /// in `out` (the inputs' rows in order, `n_embd` values each). The
    /// matrices run on all rows at once; each row's numbers are those of
    /// its input run alone (per-row norms, per-column products with the
    /// route of the input's own batch, per-input attention).
    pub(crate) fn forward(
        &self,
        pool: &Pool,
        inputs: &[&[u32]],
        s: &mut Scratch,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let d = cfg.n_embd;
        let limit = if self.positions.is_some() { cfg.n_ctx_train } else { usize::MAX };
        s.spans.clear();
        for tokens in inputs {
            let n = tokens.len();
            if n == 0 {
                return Err(Error::new(ErrorKind::Input, "an empty input has no embedding"));
            }
            if n > limit {
                return Err(Error::new(
                    ErrorKind::Input,
                    format!(
                        "an input of {n} tokens is longer than the {limit} positions the model has"
                    ),
                ));
            }
            let at = s.spans.last().map_or(0, |r| r.end);
            s.spans.push(at..at + n);
        }
        let n = s.spans.last().map_or(0, |r| r.end);
        s.x.resize(n * d, 0.0);
        let mut pos = vec![0f32; d];
        for (tokens, span) in inputs.iter().zip(&s.spans) {
            for (i, &t) in tokens.iter().enumerate() {
                let x = &mut s.x[(span.start + i) * d..(span.start + i + 1) * d];
                if !self.tokens.row(t as usize, d, x) {
                    return Err(Error::new(
                        ErrorKind::Input,
                        format!("token id {t} is outside the vocabulary ({} tokens)", cfg.n_vocab),
                    ));
                }
                if let Some(t0) = &self.type0 {
                    x.iter_mut().zip(t0).for_each(|(v, t)| *v += t);
                }
                if let Some(p) = &self.positions {
                    p.row(i, d, &mut pos);
                    x.iter_mut().zip(&pos).for_each(|(v, p)| *v += p);
                }
            }
        }
        let eps = cfg.eps;
        rows_mut(pool, &mut s.x[..n * d], d, |_, x| self.embd_norm.apply(x, eps));
        s.route.set(&s.spans);
        let hd = cfg.head_dim;
        let qd = cfg.n_head * hd;
        let w = 3 * qd;
        let rd = cfg.rope_dims.min(hd);
        let mut rope_tab = Vec::new();
        if let Some(r) = &self.rope {
            let longest = s.spans.iter().map(|r| r.len()).max().unwrap_or(0);
            rope_tab.resize(longest * rd, 0.0);
            for i in 0..longest {
                r.cache(i, &mut rope_tab[i * rd..(i + 1) * rd]);
            }
        }
        // Each row's position in its input.
        let posn: Vec<usize> = s.spans.iter().flat_map(|r| 0..r.len()).collect();
        // Each matrix's bias is added in the pass over the rows that
        // follows its product (with RoPE, the residual and the norm, or the
        // activation): the same sums as ggml's separate adds, in fewer
        // passes over the rows.
        for layer in &self.layers {
            layer.qkv.product(pool, &s.x, n, &mut s.route, &mut s.qkv)?;
            if self.rope.is_some() || layer.qkv.bias().is_some() {
                let (tab, posn, bias) = (&rope_tab, &posn, layer.qkv.bias());
                let rope = self.rope.is_some();
                rows_mut(pool, &mut s.qkv[..n * w], w, |i, row| {
                    if let Some(b) = bias {
                        row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
                    }
                    if rope {
                        let p = posn[i];
                        let cache = &tab[p * rd..(p + 1) * rd];
                        crate::rope::rotate(&mut row[..qd], cache, hd, rd, true);
                        crate::rope::rotate(&mut row[qd..2 * qd], cache, hd, rd, true);
                    }
                });
            }
            self.attention(pool, n, s);
            layer.wo.product(pool, &s.att, n, &mut s.route, &mut s.proj)?;
            residual_norm(pool, &mut s.x[..n * d], &s.proj, layer.wo.bias(), &layer.attn_norm, eps);
            layer.up.product(pool, &s.x, n, &mut s.route, &mut s.up)?;
            let ff = cfg.n_ff;
            s.act.resize(n * ff, 0.0);
            let (up, bias) = (&s.up, layer.up.bias());
            match cfg.arch {
                Arch::NomicBert => rows_mut(pool, &mut s.act[..n * ff], ff, |i, a| {
                    let row = &up[i * 2 * ff..(i + 1) * 2 * ff];
                    match bias {
                        Some(b) => {
                            let biased: Vec<f32> = row.iter().zip(b).map(|(v, b)| v + b).collect();
                            let (g, u) = biased.split_at(ff);
                            swiglu(g, u, a);
                        }
                        None => {
                            let (g, u) = row.split_at(ff);
                            swiglu(g, u, a);
                        }
                    }
                }),
                _ => rows_mut(pool, &mut s.act[..n * ff], ff, |i, a| {
                    crate::kernels::attn::gelu_biased(&up[i * ff..(i + 1) * ff], bias, a)
                }),
            }
            layer.down.product(pool, &s.act, n, &mut s.route, &mut s.proj)?;
            residual_norm(
                pool,
                &mut s.x[..n * d],
                &s.proj,
                layer.down.bias(),
                &layer.out_norm,
                eps,
            );
        }
        out.clear();
        out.extend_from_slice(&s.x[..n * d]);
        Ok(())
    }

    /// Every query over every key (no mask), as llama.cpp's flash
    /// attention computes it when there is no cache: K and V cast to f16,
    /// one query at a time below `attn::TILE` rows, else the tiled path
    /// (`kernels::attn`); softmax(q·kᵀ/√head)·v per head.
    fn attention(&self, pool: &Pool, n: usize, s: &mut Scratch) {
        let cfg = &self.cfg;
        let hd = cfg.head_dim;
        let qd = cfg.n_head * hd;
        let w = 3 * qd;
        s.k.resize(n * qd, f16::ZERO);
        s.v.resize(n * qd, f16::ZERO);
        let qkv = &s.qkv;
        // Cast a row at a time (F16C where the CPU has it): ggml_cast's values.
        use half::slice::HalfFloatSliceExt;
        rows_mut(pool, &mut s.k[..n * qd], qd, |i, k| {
            k.convert_from_f32_slice(&qkv[i * w + qd..i * w + 2 * qd])
        });
        rows_mut(pool, &mut s.v[..n * qd], qd, |i, v| {
            v.convert_from_f32_slice(&qkv[i * w + 2 * qd..(i + 1) * w])
        });
        s.att.resize(n * qd, 0.0);
        let scale = 1.0 / (hd as f32).sqrt();
        let (kc, vc, qkv) = (&s.k[..], &s.v[..], &s.qkv);
        let q = |i: usize, h: usize| &qkv[i * w + h * hd..i * w + (h + 1) * hd];
        // Tasks: per input, its rows in blocks (one query each on the
        // one-query path, ROWS on the tiled one), times the heads.
        let mut blocks: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (j, span) in s.spans.iter().enumerate() {
            let step = match Mode::for_batch(span.len()) {
                Mode::Vec => 1,
                Mode::Tiled => ROWS,
            };
            blocks.extend(span.clone().step_by(step).map(|b| (j, b..(b + step).min(span.end))));
        }
        let spans = &s.spans;
        let out = OutRows::new(&mut s.att, qd);
        pool.run(blocks.len() * cfg.n_head, &|task| {
            let ((j, rows), h) = (&blocks[task / cfg.n_head], task % cfg.n_head);
            let span = &spans[*j];
            // The input's own keys and values, positions from 0.
            let (kc, vc) =
                (&kc[span.start * qd..span.end * qd], &vc[span.start * qd..span.end * qd]);
            let len = span.len();
            let lane = Lane { stride: qd, offset: h * hd };
            match Mode::for_batch(len) {
                Mode::Vec => {
                    let i = rows.start;
                    let mut o = [0f32; MAX_HEAD];
                    attend_vec(q(i, h), kc, vc, lane, 0, len, scale, None, &mut o[..hd]);
                    for (jj, v) in o[..hd].iter().enumerate() {
                        // SAFETY: task (row i, head h) alone writes head h of row i.
                        unsafe { out.set(i, h * hd + jj, *v) };
                    }
                }
                Mode::Tiled => {
                    let trows: Vec<TiledRow<'_>> =
                        rows.clone().map(|i| TiledRow { q: q(i, h), from: 0, upto: len }).collect();
                    TILED.with_borrow_mut(|(tile, o)| {
                        o.resize(trows.len() * hd, 0.0);
                        attend_tiled(&trows, kc, vc, lane, scale, None, tile, o);
                        for (r, i) in rows.clone().enumerate() {
                            for (jj, v) in o[r * hd..(r + 1) * hd].iter().enumerate() {
                                // SAFETY: task (block, head h) alone writes
                                // head h of the block's rows.
                                unsafe { out.set(i, h * hd + jj, *v) };
                            }
                        }
                    });
                }
            }
        });
    }
}
