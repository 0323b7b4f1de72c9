//! The decoder-only transformers this engine runs on the fast CPU path —
//! the llama family (llama, mistral, qwen2, qwen3, phi3) and the gemma family
//! (gemma2, gemma3) — as one forward pass whose per-family differences are
//! the options of [`Config`] (read in `arch.rs`): weights kept as the file
//! stores them (or packed for AVX-512), a per-session f16 KV cache grown as
//! it fills, and a pass over a chunk of tokens that returns the last logits.
//! RoPE and its scalings are `rope.rs`'s. A fused tensor (`attn_qkv`, phi3's
//! gate and up in `ffn_up`) is one part of a [`Linear`] whose rows are the
//! separate tensors' in order.
//!
//! Every tensor of the file must be read by [`Model::load`]: one left over
//! (an output bias, a reranker head, factors of a scaling the architecture
//! does not take) would change llama.cpp's numbers or make it refuse the
//! file, so the engine refuses it, naming the tensor.
//!
//! INVARIANT: every number a token's forward pass produces depends only on
//! the tokens up to it and the attention path (`kernels::attn::Mode`) each
//! of them was run with, never on how the prompt was split into chunks
//! (per-column matmuls, per-row norms, per-query attention), so a cached
//! prefix continues bit-identically when its paths are the ones a fresh
//! run would take (`Session` checks).

use crate::arch::Arch;
pub(crate) use crate::arch::Config;
use crate::error::{model_err, Error, ErrorKind, Result};
use crate::gguf::{GgmlType, Gguf};
use crate::kernels::attn::{
    attend_heads, attend_quant, attend_tiled, fwht, glu, Lane, Mode, Rotation, TiledRow,
    TiledScratch, GROUP, MAX_HEAD,
};
use crate::kernels::rows::Fmt;
use crate::kernels::{Acts, Needs, OutRows, Packed};
use crate::kv::{KvCache, KvType};
use crate::pool::Pool;
use crate::quant::dequantize_row;
use candle_core::quantized::QMatMul;

/// One tensor of a layer: the fast kernels, or candle's quantized matmul
/// for tensor types the fast path does not have (Q2_K whose rows do not
/// come in eights).
#[derive(Debug)]
pub(crate) enum Part {
    Fast(Packed),
    Candle { mm: QMatMul, rows: usize, ty: GgmlType },
}

impl Part {
    fn rows(&self) -> usize {
        match self {
            Part::Fast(p) => p.rows,
            Part::Candle { rows, .. } => *rows,
        }
    }
}

/// Tasks per thread of a prompt's matmul (compute-bound: balance).
const PROMPT_TASKS: usize = 8;
/// Tasks per thread of a decode's matmul. A decode streams the weights
/// once; each task's rows are one contiguous stream whose first kilobytes
/// miss the cache until the prefetches ahead of it catch up, and many small
/// tasks handed alternately to the threads pay that again and again: one
/// task per thread and part measured 1.09× faster on the 135M files at 2
/// threads than 8 (and 16: 0.84×). A thread that is late still loses
/// nothing: the caller claims its task.
const DECODE_TASKS: usize = 1;

/// A linear layer: one or several tensors applied to the same input, their
/// outputs side by side (q, k and v; gate and up).
#[derive(Debug)]
pub(crate) struct Linear {
    parts: Vec<Part>,
    rows: usize,
    cols: usize,
}

impl Linear {
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn bytes(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Fast(p) => p.bytes(),
                Part::Candle { rows, .. } => rows * self.cols,
            })
            .sum()
    }

    /// `(tensor type, kernel)` of each part, for reports.
    pub(crate) fn kernels(&self, g: &[GgmlType]) -> Vec<(GgmlType, String)> {
        self.parts
            .iter()
            .zip(g)
            .map(|(p, &ty)| match p {
                Part::Fast(p) => (ty, p.kernel()),
                Part::Candle { ty, .. } => (*ty, "candle".to_owned()),
            })
            .collect()
    }

    /// `out[c · rows + r]` for the `n` columns of `x` (`[n × cols]`);
    /// `grouped[c]` and `wide[c]` say how llama.cpp computes column `c`
    /// (`attn::Route`; empty: plainly, as one decode column).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        pool: &Pool,
        x: &[f32],
        n: usize,
        grouped: &[bool],
        wide: &[bool],
        acts: &mut Acts,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let rows = self.rows;
        // Every element is written below (the kernels set each row of each
        // column, candle's parts are copied in), so a reused buffer is not
        // cleared first: only growth is zero-filled.
        out.resize(n * rows, 0.0);
        let need = self.parts.iter().fold(Needs::default(), |a, p| match p {
            Part::Fast(p) => a.or(p.needs()),
            Part::Candle { .. } => a,
        });
        acts.prepare(x, n, self.cols, need, pool);
        acts.set_route(grouped, wide);
        // Every fast part's row tiles as tasks of one pool job: on a prompt
        // enough chunks to balance, few enough to keep dispatch cheap; on a
        // decode one contiguous stream per thread (see DECODE_TASKS).
        let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
        let mut off = 0;
        let mut offs = Vec::with_capacity(self.parts.len());
        for (i, p) in self.parts.iter().enumerate() {
            offs.push(off);
            if let Part::Fast(p) = p {
                let tiles = p.tiles();
                let align = p.tile_align();
                let split = if n == 1 { DECODE_TASKS } else { PROMPT_TASKS };
                let per = (tiles / (pool.threads() * split)).max(1).next_multiple_of(align);
                tasks.extend((0..tiles).step_by(per).map(|t| (i, t, (t + per).min(tiles))));
            }
            off += p.rows();
        }
        {
            let o = OutRows::new(out, rows);
            let acts = &*acts;
            pool.run(tasks.len(), &|t| {
                let (i, t0, t1) = tasks[t];
                if let Part::Fast(p) = &self.parts[i] {
                    // SAFETY: task t alone has tiles t0..t1 of part i (the
                    // tasks split each part's tiles into disjoint ranges).
                    unsafe { p.matmul_tiles(acts, t0..t1, &o.part(offs[i], p.rows)) };
                }
            });
        }
        for (i, p) in self.parts.iter().enumerate() {
            if let Part::Candle { mm, rows: pr, .. } = p {
                use candle_core::Module;
                let t = candle_core::Tensor::from_slice(
                    &x[..n * self.cols],
                    (n, self.cols),
                    &candle_core::Device::Cpu,
                )?;
                let y = mm.forward(&t)?.flatten_all()?.to_vec1::<f32>()?;
                for c in 0..n {
                    out[c * rows + offs[i]..c * rows + offs[i] + pr]
                        .copy_from_slice(&y[c * pr..(c + 1) * pr]);
                }
            }
        }
        Ok(())
    }

    /// Loads the tensors `names` (same column count) as one layer whose
    /// rows are theirs stacked in order.
    pub(crate) fn load(g: &mut Gguf, names: &[&str]) -> Result<Linear> {
        let mut parts = Vec::with_capacity(names.len());
        let mut cols = None;
        let mut rows = 0;
        for name in names {
            let (ty, r, c) = g.shape(name)?;
            if *cols.get_or_insert(c) != c {
                return Err(model_err(format!(
                    "tensor `{name}` has rows of {c} values, but `{}` has {}",
                    names[0],
                    cols.unwrap_or(0)
                )));
            }
            parts.push(load_part(g, name, ty, r, c)?);
            rows += r;
        }
        Ok(Linear { parts, rows, cols: cols.unwrap_or(0) })
    }
}

fn load_part(g: &mut Gguf, name: &str, ty: GgmlType, rows: usize, cols: usize) -> Result<Part> {
    load_rows(g, name, ty, 0, rows, cols)
}

/// Rows `row0 .. row0 + rows` of tensor `name` (all of a 2-D tensor, or one
/// expert of a 3-D one, `moe.rs`) as a part.
pub(crate) fn load_rows(
    g: &mut Gguf,
    name: &str,
    ty: GgmlType,
    row0: usize,
    rows: usize,
    cols: usize,
) -> Result<Part> {
    let read = |g: &mut Gguf| -> Result<Vec<u8>> {
        let mut buf = crate::kernels::weight_buffer(rows * ty.row_bytes(cols).unwrap_or(0));
        g.read_rows(name, row0, &mut buf)?;
        Ok(buf)
    };
    if Packed::tiles_for(ty) && cols.is_multiple_of(32) {
        // Repacked a slice of rows at a time: a tensor is never held twice.
        let mut p = Packed::empty(ty == GgmlType::Q8_0, rows, cols);
        let row_bytes = ty.row_bytes(cols).unwrap_or(0);
        let mut buf = Vec::new();
        let mut r = 0;
        while r < rows {
            let take = (rows - r).min(256);
            buf.resize(take * row_bytes, 0);
            g.read_rows(name, row0 + r, &mut buf)?;
            p.fill(r, &buf);
            r += take;
        }
        return Ok(Part::Fast(p));
    }
    if ty == GgmlType::F32 {
        let raw = read(g)?;
        let mut w = vec![0f32; rows * cols];
        dequantize_row(ty, &raw, &mut w);
        return Ok(Part::Fast(Packed::f32(w, rows, cols)));
    }
    // Q2_K has the kernels of ggml's repacked numbers only (rows in
    // eights); other Q2_K tensors go to candle.
    if let Some(fmt) = Fmt::from_ggml(ty).filter(|f| *f != Fmt::Q2K || f.chain(rows)) {
        return Ok(Part::Fast(Packed::rows(fmt, read(g)?, rows, cols)));
    }
    let qt = g.qtensor_rows(name, row0, rows)?;
    Ok(Part::Candle { mm: QMatMul::from_qtensor(qt)?, rows, ty })
}

#[derive(Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    qkv: Linear,
    qkv_types: Vec<GgmlType>,
    bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    wo: Linear,
    wo_type: GgmlType,
    /// gemma: norms of the attention and feed-forward outputs.
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate_up: Linear,
    gate_up_types: Vec<GgmlType>,
    down: Linear,
    down_type: GgmlType,
    post_ffn_norm: Option<Vec<f32>>,
    /// A mixture of experts in place of `gate_up`/`down` (empty then).
    moe: Option<crate::moe::Moe>,
    /// Sliding-window attention in this layer (the window is `Config::swa`).
    swa: bool,
    /// Which of [`Model::ropes`] rotates this layer's queries and keys.
    rope: usize,
}

#[derive(Debug)]
pub(crate) enum Embedding {
    /// Rows looked up in the output matrix (tied weights).
    Tied,
    /// Raw GGUF rows, dequantized on lookup.
    Raw { ty: GgmlType, data: Vec<u8>, row_bytes: usize },
    /// Raw GGUF rows read from the file on lookup (a decoder's token
    /// table): the table is not held in memory — llama.cpp maps the file
    /// and touches only the rows a prompt uses; a 128k vocabulary at n_embd
    /// 4096 is ~280 MB of Q4_K that no step reads whole.
    #[cfg(unix)]
    File { ty: GgmlType, file: std::fs::File, start: u64, row_bytes: usize, rows: usize },
    /// Dequantized rows (types the fast path cannot read).
    F32(Vec<f32>),
}

impl Embedding {
    /// The rows of the 2-D tensor `name` (rows of `d` values) for lookups:
    /// kept as stored and dequantized on lookup where `quant.rs` reads the
    /// type, else dequantized once by candle.
    pub(crate) fn table(g: &mut Gguf, name: &str, d: usize) -> Result<Embedding> {
        let (ty, _, _) = g.shape(name)?;
        if crate::quant::dequantizes(ty) {
            Ok(Embedding::Raw { ty, data: g.bytes(name)?, row_bytes: ty.row_bytes(d).unwrap_or(0) })
        } else {
            Ok(Embedding::F32(
                g.qtensor(name)?.dequantize(&candle_core::Device::Cpu)?.flatten_all()?.to_vec1()?,
            ))
        }
    }

    /// [`Embedding::table`], a table whose rows are read from the file on
    /// lookup where the system reads at an offset (unix) and `quant.rs`
    /// reads the type.
    pub(crate) fn table_on_file(g: &mut Gguf, name: &str, d: usize) -> Result<Embedding> {
        #[cfg(unix)]
        {
            let (ty, rows, _) = g.shape(name)?;
            if crate::quant::dequantizes(ty) {
                let (file, start) = g.data_handle(name)?;
                let row_bytes = ty.row_bytes(d).unwrap_or(0);
                return Ok(Embedding::File { ty, file, start, row_bytes, rows });
            }
        }
        Embedding::table(g, name, d)
    }

    /// Row `t` of a file-backed table into `out` (`d` values).
    #[cfg(unix)]
    fn read_row(
        (ty, file, start, row_bytes, rows): (GgmlType, &std::fs::File, u64, usize, usize),
        t: usize,
        out: &mut [f32],
    ) -> Result<()> {
        use std::os::unix::fs::FileExt;
        if t >= rows {
            return Err(Error::new(ErrorKind::Input, format!("row {t} of a {rows}-row table")));
        }
        thread_local! {
            // One row's bytes, kept between lookups (a lookup per token).
            static RAW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let at = start + (t * row_bytes) as u64;
        RAW.with_borrow_mut(|raw| {
            raw.resize(row_bytes, 0);
            file.read_exact_at(raw, at).map_err(|e| {
                model_err(format!(
                    "cannot read token row {t} at byte {at} of the model file: {e}; the file may have been truncated, re-download it with `agentd pull`"
                ))
            })?;
            dequantize_row(ty, raw, out);
            Ok(())
        })
    }

    /// Row `t` (of `d` values) of a table read by [`Embedding::table`];
    /// false when it has no such row (or the table is tied to the output
    /// matrix, which only [`Model`] reads).
    pub(crate) fn row(&self, t: usize, d: usize, out: &mut [f32]) -> bool {
        match self {
            Embedding::Raw { ty, data, row_bytes } => {
                match data.get(t * row_bytes..(t + 1) * row_bytes) {
                    Some(raw) => dequantize_row(*ty, raw, &mut out[..d]),
                    None => return false,
                }
            }
            Embedding::F32(v) => match v.get(t * d..(t + 1) * d) {
                Some(r) => out[..d].copy_from_slice(r),
                None => return false,
            },
            #[cfg(unix)]
            Embedding::File { ty, file, start, row_bytes, rows } => {
                return Embedding::read_row(
                    (*ty, file, *start, *row_bytes, *rows),
                    t,
                    &mut out[..d],
                )
                .is_ok();
            }
            Embedding::Tied => return false,
        }
        true
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Embedding::Tied => 0,
            Embedding::Raw { data, .. } => data.len(),
            Embedding::F32(v) => 4 * v.len(),
            #[cfg(unix)]
            Embedding::File { .. } => 0,
        }
    }
}

/// The loaded weights.
#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) cfg: Config,
    emb: Embedding,
    emb_type: GgmlType,
    layers: Vec<Layer>,
    out_norm: Vec<f32>,
    output: Linear,
    output_type: GgmlType,
    /// qwen2's optional `output.bias`, added to the logits.
    output_bias: Option<Vec<f32>>,
    /// The RoPE of the layers: the model's, and gemma's sliding-window
    /// layers' when their base or scale differ.
    ropes: Vec<crate::rope::Rope>,
    /// The element type of the caches it fills (`kv`).
    pub(crate) kv_type: KvType,
}

pub(crate) fn vector(g: &mut Gguf, name: &str, len: usize) -> Result<Vec<f32>> {
    let (ty, rows, cols) = g.shape(name)?;
    if rows * cols != len {
        return Err(model_err(format!("tensor `{name}` has {} values, want {len}", rows * cols)));
    }
    if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return Err(model_err(format!("tensor `{name}` has type {ty}, want f32")));
    }
    let raw = g.bytes(name)?;
    let mut v = vec![0f32; len];
    dequantize_row(ty, &raw, &mut v);
    Ok(v)
}

pub(crate) fn opt_vector(g: &mut Gguf, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
    if g.has(name) {
        Ok(Some(vector(g, name, len)?))
    } else {
        Ok(None)
    }
}

/// The RoPE of the model's layers (`rope.rs`): the file's base and scale
/// with its frequency factors — `rope_freqs`, or the long or short longrope
/// factors at this context (both are read: a file's tensors are all
/// consumed) — and, when gemma's sliding-window layers have another base or
/// scale, theirs.
pub(crate) fn load_ropes(
    g: &mut Gguf,
    cfg: &Config,
    context: usize,
) -> Result<Vec<crate::rope::Rope>> {
    use crate::rope::{long_factors, Factors, Rope};
    let rd = cfg.rope_dims.min(cfg.head_dim);
    let r = &cfg.rope;
    let factors = match r.factors {
        Factors::None => None,
        Factors::Freqs => Some(vector(g, "rope_freqs.weight", rd / 2)?),
        Factors::LongShort => {
            let long = opt_vector(g, "rope_factors_long.weight", rd / 2)?;
            let short = opt_vector(g, "rope_factors_short.weight", rd / 2)?;
            // llama.cpp's `get_rope_factors`: one of the two, absent or not.
            if long_factors(context, r.n_ctx_orig) {
                long
            } else {
                short
            }
        }
    };
    let mut ropes = vec![Rope::new(r, rd, cfg.rope_base, r.freq_scale, factors.clone())];
    let swa = (0..cfg.n_layer).any(|il| cfg.layer_swa(il));
    if swa && (cfg.rope_base_swa != cfg.rope_base || cfg.rope_scale_swa != r.freq_scale) {
        ropes.push(Rope::new(r, rd, cfg.rope_base_swa, cfg.rope_scale_swa, factors));
    }
    Ok(ropes)
}

/// Refuses a file with a tensor the loader did not read: the engine would
/// run without it and compute other numbers than the file asks for (or than
/// llama.cpp, which refuses a file with tensors its loader leaves over).
pub(crate) fn refuse_unread(g: &Gguf, cfg: &Config) -> Result<()> {
    let unread = g.unread();
    let Some(first) = unread.first() else { return Ok(()) };
    let more = match unread.len() {
        1 => String::new(),
        2 => format!(" (and `{}`)", unread[1]),
        n => format!(" (and {} more: `{}`…)", n - 1, unread[1]),
    };
    Err(model_err(format!(
        "{}: tensor `{first}`{more} is not used by the engine's {} forward pass, and it would change the numbers: refusing the file rather than running without it",
        g.path.display(),
        cfg.arch_name
    )))
}

impl Model {
    /// Loads the weights of `g` for a context of `context` positions (which
    /// of phi3's longrope factors apply depends on it, `rope.rs`).
    pub(crate) fn load(g: &mut Gguf, context: usize) -> Result<Model> {
        let cfg = Config::read(g)?;
        let d = cfg.n_embd;
        let (qd, kd) = (cfg.n_head * cfg.head_dim, cfg.n_kv * cfg.head_dim);
        let ropes = load_ropes(g, &cfg, context)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let t = |s: &str| format!("blk.{i}.{s}");
            let (q, k, v) = (t("attn_q.weight"), t("attn_k.weight"), t("attn_v.weight"));
            let shape = |g: &Gguf, n: &str, rows: usize, cols: usize| -> Result<GgmlType> {
                let (ty, r, c) = g.shape(n)?;
                if (r, c) != (rows, cols) {
                    return Err(model_err(format!(
                        "tensor `{n}` is {r}×{c}, want {rows}×{cols} for this model's shape"
                    )));
                }
                Ok(ty)
            };
            // q, k and v, or one fused `attn_qkv` holding them in that order
            // (phi3; llama.cpp's `create_tensor_qkv` takes it on every
            // architecture here).
            let fused_qkv = t("attn_qkv.weight");
            let (qkv_names, qkv_types) = if g.has(&fused_qkv) {
                let ty = shape(g, &fused_qkv, qd + 2 * kd, d)?;
                (vec![fused_qkv], vec![ty])
            } else {
                let types = vec![shape(g, &q, qd, d)?, shape(g, &k, kd, d)?, shape(g, &v, kd, d)?];
                (vec![q, k, v], types)
            };
            let wo_type = shape(g, &t("attn_output.weight"), d, qd)?;
            // A mixture of experts has no dense feed-forward matrices.
            let moe = match cfg.moe {
                Some(m) => Some(crate::moe::Moe::load(g, m, d, cfg.act, i)?),
                None => None,
            };
            let (ffn_gate_up, ffn_down) = match moe {
                Some(_) => (Vec::new(), Vec::new()),
                // phi3: gate and up in one `ffn_up` of 2·n_ff rows, gate first
                // (ggml_swiglu on the product's two halves).
                None if cfg.arch == Arch::Phi3 => {
                    (vec![t("ffn_up.weight")], vec![t("ffn_down.weight")])
                }
                None => {
                    (vec![t("ffn_gate.weight"), t("ffn_up.weight")], vec![t("ffn_down.weight")])
                }
            };
            // 2·n_ff rows in all, in one or two tensors.
            let gate_up_types = ffn_gate_up
                .iter()
                .map(|n| shape(g, n, 2 * cfg.n_ff / ffn_gate_up.len(), d))
                .collect::<Result<Vec<_>>>()?;
            let down_type = match ffn_down.first() {
                Some(n) => shape(g, n, d, cfg.n_ff)?,
                None => GgmlType::F32,
            };
            let bias = if g.has(&t("attn_qkv.bias")) {
                Some(vector(g, &t("attn_qkv.bias"), qd + 2 * kd)?)
            } else if g.has(&t("attn_q.bias")) {
                let mut b = vector(g, &t("attn_q.bias"), qd)?;
                b.extend(vector(g, &t("attn_k.bias"), kd)?);
                b.extend(vector(g, &t("attn_v.bias"), kd)?);
                Some(b)
            } else {
                None
            };
            let swa = cfg.layer_swa(i);
            layers.push(Layer {
                attn_norm: vector(g, &t("attn_norm.weight"), d)?,
                qkv: Linear::load(g, &qkv_names.iter().map(|n| n.as_str()).collect::<Vec<_>>())?,
                qkv_types,
                bias,
                q_norm: opt_vector(g, &t("attn_q_norm.weight"), cfg.head_dim)?,
                k_norm: opt_vector(g, &t("attn_k_norm.weight"), cfg.head_dim)?,
                wo: Linear::load(g, &[&t("attn_output.weight")])?,
                wo_type,
                post_attn_norm: opt_vector(g, &t("post_attention_norm.weight"), d)?,
                ffn_norm: vector(g, &t("ffn_norm.weight"), d)?,
                gate_up: Linear::load(
                    g,
                    &ffn_gate_up.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
                )?,
                gate_up_types,
                down: Linear::load(g, &ffn_down.iter().map(|n| n.as_str()).collect::<Vec<_>>())?,
                down_type,
                post_ffn_norm: opt_vector(g, &t("post_ffw_norm.weight"), d)?,
                moe,
                swa,
                rope: usize::from(swa && ropes.len() > 1),
            });
        }
        let out_norm = vector(g, "output_norm.weight", d)?;
        let (emb_type, _, _) = g.shape("token_embd.weight")?;
        let raw_emb = |g: &mut Gguf| Embedding::table_on_file(g, "token_embd.weight", d);
        let (output, output_type, emb) = if g.has("output.weight") {
            let (ot, _, _) = g.shape("output.weight")?;
            (Linear::load(g, &["output.weight"])?, ot, raw_emb(g)?)
        } else {
            let output = Linear::load(g, &["token_embd.weight"])?;
            let emb = match output.parts.first() {
                Some(Part::Fast(_)) => Embedding::Tied,
                _ => raw_emb(g)?,
            };
            (output, emb_type, emb)
        };
        if output.rows() != cfg.n_vocab {
            return Err(model_err(format!(
                "the output matrix has {} rows but the vocabulary {} tokens",
                output.rows(),
                cfg.n_vocab
            )));
        }
        // Only llama.cpp's qwen2 graph adds an output bias (phi3's loader
        // has none: such a file is refused below, as llama.cpp refuses it).
        let output_bias = match cfg.arch {
            Arch::Qwen2 => opt_vector(g, "output.bias", cfg.n_vocab)?,
            _ => None,
        };
        refuse_unread(g, &cfg)?;
        Ok(Model {
            cfg,
            emb,
            emb_type,
            layers,
            out_norm,
            output,
            output_type,
            output_bias,
            ropes,
            kv_type: KvType::F16,
        })
    }

    /// Whether some matrix's numbers depend on llama.cpp's grouping of
    /// columns and on the width of its products (`attn::Route`).
    pub(crate) fn route_matters(&self) -> (bool, bool) {
        let mut r = (false, false);
        let mut see = |l: &Linear| {
            for p in &l.parts {
                if let Part::Fast(p) = p {
                    let (g, w) = p.route_matters();
                    r = (r.0 || g, r.1 || w);
                }
            }
        };
        see(&self.output);
        for l in &self.layers {
            see(&l.qkv);
            see(&l.wo);
            see(&l.gate_up);
            see(&l.down);
            if let Some(m) = &l.moe {
                see(m.router());
            }
        }
        // Experts are never grouped (ggml's `mul_mat_id` takes one column
        // at a time), but may be wide (`moe.rs`).
        let wide = self.layers.iter().any(|l| l.moe.as_ref().is_some_and(|m| m.wide_matters()));
        (r.0, r.1 || wide)
    }

    /// Whether this is a mixture of experts, whose numbers depend on its
    /// physical batches beyond `attn::Route` (a router row alone in its
    /// batch takes ggml's `vec_dot`, an expert chosen by 8 rows or more its
    /// tiled kernel, `moe.rs`): the engine then runs a prompt a whole
    /// `attn::UBATCH` per pass and reuses a cached prefix only from a
    /// batch's start, so that its batches are llama.cpp's.
    pub(crate) fn moe_batches(&self) -> bool {
        self.layers.iter().any(|l| l.moe.is_some())
    }

    /// Bytes of weights held.
    pub(crate) fn bytes(&self) -> usize {
        let mut n = self.output.bytes();
        for l in &self.layers {
            n += l.qkv.bytes() + l.wo.bytes() + l.gate_up.bytes() + l.down.bytes();
            n += l.moe.as_ref().map_or(0, |m| m.bytes());
        }
        n + self.emb.bytes()
    }

    /// Which kernel runs each tensor type, with how many tensors of it
    /// (`agentd bench --json` reports it).
    pub(crate) fn kernels(&self) -> Vec<(String, String, usize)> {
        let mut all: Vec<(GgmlType, String)> = Vec::new();
        for l in &self.layers {
            all.extend(l.qkv.kernels(&l.qkv_types));
            all.extend(l.wo.kernels(&[l.wo_type]));
            all.extend(l.gate_up.kernels(&l.gate_up_types));
            all.extend(l.down.kernels(&[l.down_type]));
            all.extend(l.moe.iter().flat_map(|m| m.kernels()));
        }
        all.extend(self.output.kernels(&[self.output_type]));
        let emb = match &self.emb {
            Embedding::Tied => None,
            Embedding::Raw { ty, .. } => Some((*ty, "dequantize-rows".to_owned())),
            #[cfg(unix)]
            Embedding::File { ty, .. } => Some((*ty, "dequantize-rows-from-file".to_owned())),
            Embedding::F32(_) => Some((self.emb_type, "f32-rows".to_owned())),
        };
        all.extend(emb);
        let mut out: Vec<(String, String, usize)> = Vec::new();
        for (ty, k) in all {
            match out.iter_mut().find(|(t, kk, _)| t == ty.name() && *kk == k) {
                Some(e) => e.2 += 1,
                None => out.push((ty.name().to_owned(), k, 1)),
            }
        }
        out
    }

    fn embed(&self, token: u32, out: &mut [f32]) -> Result<()> {
        let d = self.cfg.n_embd;
        let t = token as usize;
        if t >= self.cfg.n_vocab {
            return Err(Error::new(
                ErrorKind::Input,
                format!("token id {token} is outside the vocabulary ({} tokens)", self.cfg.n_vocab),
            ));
        }
        match &self.emb {
            Embedding::Tied => match self.output.parts.first() {
                Some(Part::Fast(p)) => p.dequantize_row(t, out),
                _ => return Err(model_err("tied embeddings need a fast output matrix")),
            },
            Embedding::Raw { ty, data, row_bytes } => {
                dequantize_row(*ty, &data[t * row_bytes..(t + 1) * row_bytes], out)
            }
            #[cfg(unix)]
            Embedding::File { ty, file, start, row_bytes, rows } => {
                Embedding::read_row((*ty, file, *start, *row_bytes, *rows), t, &mut out[..d])?
            }
            Embedding::F32(v) => out.copy_from_slice(&v[t * d..(t + 1) * d]),
        }
        if let Some(s) = self.cfg.embd_scale {
            out.iter_mut().for_each(|v| *v *= s);
        }
        Ok(())
    }
}

/// Positions by which the KV cache's storage grows.
const KV_STEP: usize = 128;
/// Positions per feed-forward slice of a prompt batch.
const FFN_SLICE: usize = 64;

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
    /// The mixture-of-experts blocks' buffers.
    moe: crate::moe::Scratch,
    /// RoPE cos/sin pairs of the positions being run, per [`Model::ropes`].
    rope: Vec<Vec<f32>>,
    /// Each row's sequence (index into the pass's `Seq`s) and position.
    rows: Vec<(usize, usize)>,
    /// Each row's `attn::Route::grouped` and `wide`.
    grouped: Vec<bool>,
    wide: Vec<bool>,
    /// Rows that are their sequence's last (the last layer's feed-forward
    /// runs only on them, as llama.cpp's does on its output rows).
    last: Vec<usize>,
    /// Rows on the one-query attention path.
    vec_rows: Vec<usize>,
    /// Runs of rows (one sequence each) on the tiled path.
    spans: Vec<std::ops::Range<usize>>,
    pub(crate) logits: Vec<f32>,
    /// Keep every row to the end (embeddings): the last layer runs on all
    /// rows, as llama.cpp's does when every token is an output, and the
    /// pass leaves each row's final-normed hidden state in [`Scratch::hidden`]
    /// instead of computing logits.
    pub(crate) all_rows: bool,
    /// The rows' hidden states after the output norm, with `all_rows`.
    pub(crate) hidden: Vec<f32>,
}

/// How a pass's one-query attention rows cut their `n_head` heads into
/// tasks: contiguous ranges, as many per row as the threads need to stay
/// busy (one per thread for a lone decode row, whole rows once there are
/// twice as many rows as threads).
fn head_parts(n_head: usize, rows: usize, threads: usize) -> Vec<std::ops::Range<usize>> {
    let parts = match rows {
        0 | 1 => threads,
        r if r >= 2 * threads => 1,
        r => (2 * threads).div_ceil(r),
    };
    let parts = parts.clamp(1, n_head.max(1));
    (0..parts).map(|k| k * n_head / parts..(k + 1) * n_head / parts).collect()
}

#[inline(always)]
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// [`rms_norm`] in place (the per-head q/k norms, gemma's output norms).
#[inline(always)]
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (v, g) in x.iter_mut().zip(w) {
        *v = (*v * scale) * g;
    }
}

/// As llama.cpp's `ggml_compute_forward_rms_norm_f32` (fused with the
/// weight's MUL: `x · scale · w`): squares summed in order in f64, the mean
/// rounded to f32.
#[inline(always)]
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
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
    /// Its positions below this are `attn::Route::grouped`, below the
    /// other `wide`.
    pub(crate) grouped_upto: usize,
    pub(crate) wide_upto: usize,
    /// Logits of every row, one after another (a speculative step's
    /// verification), instead of the last row's alone. Each row's numbers
    /// are still those of a pass that ended at it: the output rows of the
    /// last layer and the output matmul are per column.
    pub(crate) every_row: bool,
    pub(crate) logits: &'a mut Vec<f32>,
}

impl Model {
    /// Runs `tokens` (at positions `kv.len()..`) through the model, appends
    /// their keys and values, and leaves the logits of the last token in
    /// `scratch.logits`. Attention takes llama.cpp's path `mode` for every
    /// token (see `kernels::attn`); nothing else depends on how tokens are
    /// grouped into calls.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        pool: &Pool,
        tokens: &[u32],
        mode: Mode,
        grouped_upto: usize,
        wide_upto: usize,
        kv: &mut KvCache,
        s: &mut Scratch,
    ) -> Result<()> {
        let mut logits = std::mem::take(&mut s.logits);
        let n = tokens.len();
        let seq =
            Seq { kv, n, mode, grouped_upto, wide_upto, every_row: false, logits: &mut logits };
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
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::isa().avx2() {
            // SAFETY: the CPU has AVX2, FMA and F16C (`isa`).
            return unsafe { self.forward_seqs_avx2(pool, tokens, seqs, s) };
        }
        self.forward_impl(pool, tokens, seqs, s)
    }

    /// [`Model::forward_seqs`] compiled for AVX2 and FMA: the element-wise
    /// steps (norms, RoPE, residuals) vectorise and their fused
    /// multiply-adds stay instructions instead of library calls. The
    /// numbers are the same.
    ///
    /// # Safety
    /// The CPU must support avx2, fma and f16c.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn forward_seqs_avx2(
        &self,
        pool: &Pool,
        tokens: &[u32],
        seqs: &mut [Seq<'_>],
        s: &mut Scratch,
    ) -> Result<()> {
        self.forward_impl(pool, tokens, seqs, s)
    }

    #[inline(always)]
    fn forward_impl(
        &self,
        pool: &Pool,
        tokens: &[u32],
        seqs: &mut [Seq<'_>],
        s: &mut Scratch,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (n, d) = (tokens.len(), cfg.n_embd);
        if n != seqs.iter().map(|q| q.n).sum::<usize>() {
            return Err(Error::new(ErrorKind::Input, "tokens and sequences disagree"));
        }
        if n == 0 {
            return Ok(());
        }
        let (qd, kd) = (cfg.n_head * cfg.head_dim, cfg.n_kv * cfg.head_dim);
        // Each row's sequence and absolute position; the rows that take the
        // one-query path; the runs of rows that take the tiled one.
        s.rows.clear();
        s.grouped.clear();
        s.wide.clear();
        s.last.clear();
        s.vec_rows.clear();
        s.spans.clear();
        for (j, q) in seqs.iter_mut().enumerate() {
            let r0 = s.rows.len();
            // A block-type cache has one path, llama.cpp's one-query one.
            let mode = if self.kv_type.is_quantized() { Mode::Vec } else { q.mode };
            match mode {
                Mode::Vec => s.vec_rows.extend(r0..r0 + q.n),
                Mode::Tiled => s.spans.extend(
                    (r0..r0 + q.n).step_by(TILED_ROWS).map(|b| b..(b + TILED_ROWS).min(r0 + q.n)),
                ),
            }
            if q.kv.len > 0 && q.kv.ty != self.kv_type {
                return Err(Error::new(
                    ErrorKind::Input,
                    format!(
                        "a session's cache holds {} keys and values but the model runs a {} cache: start a new session",
                        q.kv.ty, self.kv_type
                    ),
                ));
            }
            q.kv.prepare(self.kv_type, cfg.n_layer * cfg.n_kv);
            s.rows.extend((0..q.n).map(|t| (j, q.kv.len + t)));
            if q.n == 0 {
                return Err(Error::new(ErrorKind::Input, "a sequence of the batch has no tokens"));
            }
            s.grouped.extend((0..q.n).map(|t| q.kv.len + t < q.grouped_upto));
            s.wide.extend((0..q.n).map(|t| q.kv.len + t < q.wide_upto));
            if q.every_row {
                s.last.extend(r0..s.rows.len());
            } else {
                s.last.push(s.rows.len() - 1);
            }
            // KV storage grows in steps of KV_STEP positions.
            q.kv.reserve((q.kv.len + q.n).div_ceil(KV_STEP) * KV_STEP, cfg.head_dim);
        }
        s.x.resize(n * d, 0.0);
        for (i, &t) in tokens.iter().enumerate() {
            self.embed(t, &mut s.x[i * d..(i + 1) * d])?;
        }
        s.h.resize(n * d, 0.0);
        s.att.resize(n * qd, 0.0);
        let rd = cfg.rope_dims.min(cfg.head_dim);
        s.rope.resize_with(self.ropes.len(), Vec::new);
        for (rope, tab) in self.ropes.iter().zip(s.rope.iter_mut()) {
            tab.resize(n * rd, 0.0);
            for (i, &(_, pos)) in s.rows.iter().enumerate() {
                rope.cache(pos, &mut tab[i * rd..(i + 1) * rd]);
            }
        }
        let rotation = Rotation::of(self.kv_type, cfg.head_dim);
        // Per-row steps (norms, RoPE, residuals, the GLU) run over the pool
        // when a pass has many rows; each row's numbers are its own.
        for (li, layer) in self.layers.iter().enumerate() {
            let x = &s.x;
            crate::kernels::rows_mut(pool, &mut s.h[..n * d], d, |i, h| {
                rms_norm(&x[i * d..(i + 1) * d], &layer.attn_norm, cfg.eps, h)
            });
            layer.qkv.forward(pool, &s.h, n, &s.grouped, &s.wide, &mut s.acts, &mut s.qkv)?;
            let w = qd + 2 * kd;
            let rope_tab = &s.rope[layer.rope];
            let rope_rows = |i: usize, row: &mut [f32]| {
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
                let cache = &rope_tab[i * rd..(i + 1) * rd];
                let (hd, neox) = (cfg.head_dim, cfg.rope_neox);
                crate::rope::rotate(&mut row[..qd], cache, hd, rd, neox);
                crate::rope::rotate(&mut row[qd..qd + kd], cache, hd, rd, neox);
                if let Some(qs) = cfg.q_scale {
                    row[..qd].iter_mut().for_each(|v| *v *= qs);
                }
                if let Some(rot) = rotation {
                    // Queries and keys, then values, in llama.cpp's chunks.
                    row[..qd + kd].chunks_exact_mut(rot.k).for_each(fwht);
                    row[qd + kd..].chunks_exact_mut(rot.v).for_each(fwht);
                }
            };
            crate::kernels::rows_mut(pool, &mut s.qkv[..n * w], w, rope_rows);
            let hd = cfg.head_dim;
            for i in 0..n {
                let row = &s.qkv[i * w..(i + 1) * w];
                let kv = &mut *seqs[s.rows[i].0].kv;
                for g in 0..cfg.n_kv {
                    let (k, v) = (qd + g * hd, qd + kd + g * hd);
                    let at = li * cfg.n_kv + g;
                    kv.push(at, &row[k..k + hd], &row[v..v + hd]);
                }
            }
            self.attention(pool, li, layer.swa, seqs, s);
            if let Some(rot) = rotation {
                // The output back from the values' rotation (its own inverse).
                crate::kernels::rows_mut(pool, &mut s.att[..n * qd], qd, |_, a| {
                    a.chunks_exact_mut(rot.v).for_each(fwht)
                });
            }
            layer.wo.forward(pool, &s.att, n, &s.grouped, &s.wide, &mut s.acts, &mut s.proj)?;
            if let Some(pn) = &layer.post_attn_norm {
                crate::kernels::rows_mut(pool, &mut s.proj[..n * d], d, |_, p| {
                    rms_norm_in_place(p, pn, cfg.eps)
                });
            }
            let proj = &s.proj;
            crate::kernels::rows_mut(pool, &mut s.x[..n * d], d, |i, x| {
                x.iter_mut().zip(&proj[i * d..(i + 1) * d]).for_each(|(x, p)| *x += p)
            });
            // In the last layer only each sequence's last row goes on (its
            // keys and values are cached already): llama.cpp's output rows,
            // one column each.
            let nr = if li + 1 == self.layers.len() && !s.all_rows {
                for (j, &r) in s.last.iter().enumerate() {
                    s.x.copy_within(r * d..(r + 1) * d, j * d);
                }
                s.grouped.iter_mut().for_each(|g| *g = false);
                s.wide.iter_mut().for_each(|g| *g = false);
                s.last.len()
            } else {
                n
            };
            let x = &s.x;
            crate::kernels::rows_mut(pool, &mut s.h[..nr * d], d, |i, h| {
                rms_norm(&x[i * d..(i + 1) * d], &layer.ffn_norm, cfg.eps, h)
            });
            if let Some(moe) = &layer.moe {
                // `s.rows` names the rows' sequences (a sequence's rows in a
                // pass are one batch); the last layer's rows are each
                // sequence's output row, alone.
                let (h, g, w) = (&s.h[..nr * d], &s.grouped[..nr], &s.wide[..nr]);
                let at =
                    if li + 1 == self.layers.len() && !s.all_rows { &[][..] } else { &s.rows[..] };
                moe.forward(pool, h, nr, g, w, at, &mut s.moe, &mut s.proj)?;
                let proj = &s.proj;
                crate::kernels::rows_mut(pool, &mut s.x[..nr * d], d, |i, x| {
                    x.iter_mut().zip(&proj[i * d..(i + 1) * d]).for_each(|(x, p)| *x += p)
                });
                continue;
            }
            // The feed-forward block, FFN_SLICE positions at a time: its
            // activations are the widest (2·n_ff per position), and each
            // position's arithmetic does not depend on its neighbours.
            let ff = cfg.n_ff;
            for c0 in (0..nr).step_by(FFN_SLICE) {
                let m = (nr - c0).min(FFN_SLICE);
                layer.gate_up.forward(
                    pool,
                    &s.h[c0 * d..(c0 + m) * d],
                    m,
                    &s.grouped[c0..c0 + m],
                    &s.wide[c0..c0 + m],
                    &mut s.acts,
                    &mut s.gu,
                )?;
                s.act.resize(m * ff, 0.0);
                let gu = &s.gu;
                crate::kernels::rows_mut(pool, &mut s.act[..m * ff], ff, |i, a| {
                    let (g, u) = gu[i * 2 * ff..(i + 1) * 2 * ff].split_at(ff);
                    glu(cfg.act, g, u, a);
                });
                layer.down.forward(
                    pool,
                    &s.act,
                    m,
                    &s.grouped[c0..c0 + m],
                    &s.wide[c0..c0 + m],
                    &mut s.acts,
                    &mut s.proj,
                )?;
                if let Some(pn) = &layer.post_ffn_norm {
                    crate::kernels::rows_mut(pool, &mut s.proj[..m * d], d, |_, p| {
                        rms_norm_in_place(p, pn, cfg.eps)
                    });
                }
                let proj = &s.proj;
                crate::kernels::rows_mut(pool, &mut s.x[c0 * d..(c0 + m) * d], d, |i, x| {
                    x.iter_mut().zip(&proj[i * d..(i + 1) * d]).for_each(|(x, p)| *x += p)
                });
            }
        }
        if s.all_rows {
            // Every row's hidden state after the output norm (llama.cpp's
            // `t_embd`), no logits.
            seqs.iter_mut().for_each(|q| q.kv.len += q.n);
            let (x, norm) = (&s.x, &self.out_norm);
            s.hidden.resize(n * d, 0.0);
            crate::kernels::rows_mut(pool, &mut s.hidden[..n * d], d, |i, h| {
                rms_norm(&x[i * d..(i + 1) * d], norm, cfg.eps, h)
            });
            return Ok(());
        }
        // Each sequence's last row, or all its rows (`Seq::every_row`),
        // compacted in the last layer: final norm, then one output matmul.
        let m = s.last.len();
        s.h.resize(m * d, 0.0);
        seqs.iter_mut().for_each(|q| q.kv.len += q.n);
        for j in 0..m {
            rms_norm(
                &s.x[j * d..(j + 1) * d],
                &self.out_norm,
                cfg.eps,
                &mut s.h[j * d..(j + 1) * d],
            );
        }
        let mut out = std::mem::take(&mut s.proj);
        self.output.forward(pool, &s.h[..m * d], m, &[], &[], &mut s.acts, &mut out)?;
        if let Some(b) = &self.output_bias {
            // ggml_add of the bias to each sequence's logits.
            for row in out.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        }
        if let Some(cap) = cfg.final_softcap {
            // ggml_scale, ggml_tanh, ggml_scale.
            out.iter_mut().for_each(|v| *v = (*v * (1.0 / cap)).tanh() * cap);
        }
        let vocab = out.len() / m;
        let mut j = 0;
        for q in seqs.iter_mut() {
            let rows = if q.every_row { q.n } else { 1 };
            q.logits.clear();
            q.logits.extend_from_slice(&out[j * vocab..(j + rows) * vocab]);
            j += rows;
        }
        s.proj = out;
        Ok(())
    }

    /// Attention of the pass's rows (`s.rows`: sequence and position) over
    /// their sequences' caches, which already hold the rows' own keys: the
    /// one-query path for `s.vec_rows`, the tiled one for `s.spans`. A
    /// sliding-window layer sees only the last `Config::swa` positions.
    #[inline(always)]
    fn attention(&self, pool: &Pool, li: usize, swa: bool, seqs: &[Seq<'_>], s: &mut Scratch) {
        let cfg = &self.cfg;
        let hd = cfg.head_dim;
        let (qd, kd) = (cfg.n_head * hd, cfg.n_kv * hd);
        let w = qd + 2 * kd;
        let group = cfg.n_head / cfg.n_kv;
        let scale = cfg.attn_scale;
        let softcap = cfg.attn_softcap;
        let window = if swa { cfg.swa } else { None };
        // The first position a query at `pos` sees.
        let from = |pos: usize| window.map_or(0, |wn| (pos + 1).saturating_sub(wn));
        let (rows, vec_rows, spans) = (&s.rows, &s.vec_rows, &s.spans);
        // Row i's cache of KV head g, one stream of `hd` per position.
        let cache = |i: usize, g: usize| {
            let kv = &*seqs[rows[i].0].kv;
            (&kv.k[li * cfg.n_kv + g][..], &kv.v[li * cfg.n_kv + g][..])
        };
        let qcache = |i: usize, g: usize| {
            let kv = &*seqs[rows[i].0].kv;
            (&kv.kq[li * cfg.n_kv + g][..], &kv.vq[li * cfg.n_kv + g][..])
        };
        let quant = self.kv_type.is_quantized();
        let lane = Lane { stride: hd, offset: 0 };
        let qkv = &s.qkv;
        let out = OutRows::new(&mut s.att, qd);
        let q = |i: usize, h: usize| &qkv[i * w + h * hd..i * w + (h + 1) * hd];
        if !vec_rows.is_empty() {
            // Per task: one row's heads `parts[p]`, run a KV head's query
            // heads at a time (`attend_heads` reads each key once for them).
            // A lone decode row is cut into one part per thread.
            let parts = head_parts(cfg.n_head, vec_rows.len(), pool.threads());
            pool.run(vec_rows.len() * parts.len(), &|task| {
                let (i, heads) = (vec_rows[task / parts.len()], parts[task % parts.len()].clone());
                let pos = rows[i].1;
                let mut o = [0f32; GROUP * MAX_HEAD];
                let mut h = heads.start;
                while h < heads.end {
                    let g = h / group;
                    let end = heads.end.min((g + 1) * group).min(h + GROUP);
                    let o = &mut o[..(end - h) * hd];
                    let qs = &qkv[i * w + h * hd..i * w + end * hd];
                    if quant {
                        let (kc, vc) = qcache(i, g);
                        let ty = self.kv_type;
                        attend_quant(qs, hd, ty, kc, vc, from(pos), pos + 1, scale, softcap, o);
                    } else {
                        let (kc, vc) = cache(i, g);
                        attend_heads(qs, hd, kc, vc, lane, from(pos), pos + 1, scale, softcap, o);
                    }
                    for (j, v) in o.iter().enumerate() {
                        // SAFETY: task (i, part) alone writes these heads of
                        // row i.
                        unsafe { out.set(i, h * hd + j, *v) };
                    }
                    h = end;
                }
            });
        }
        if !spans.is_empty() {
            // Per task: a run of positions of one sequence and the query
            // heads of one KV head, so each key tile is converted once
            // for all of them.
            pool.run(spans.len() * cfg.n_kv, &|task| {
                let (b, g) = (task / cfg.n_kv, task % cfg.n_kv);
                let pos = spans[b].clone();
                let (kc, vc) = cache(pos.start, g);
                let heads = g * group..(g + 1) * group;
                let trows: Vec<TiledRow<'_>> = pos
                    .clone()
                    .flat_map(|i| heads.clone().map(move |h| (i, h)))
                    .map(|(i, h)| TiledRow {
                        q: q(i, h),
                        from: from(rows[i].1),
                        upto: rows[i].1 + 1,
                    })
                    .collect();
                TILED.with_borrow_mut(|(tile, o)| {
                    o.resize(trows.len() * hd, 0.0);
                    attend_tiled(&trows, kc, vc, lane, scale, softcap, tile, o);
                    let mut at = 0;
                    for i in pos {
                        for h in heads.clone() {
                            for (j, v) in o[at..at + hd].iter().enumerate() {
                                // SAFETY: task (span b, KV head g) alone
                                // writes the heads of g in the rows of b.
                                unsafe { out.set(i, h * hd + j, *v) };
                            }
                            at += hd;
                        }
                    }
                });
            });
        }
    }
}
