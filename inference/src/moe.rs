//! Mixture-of-experts feed-forward blocks (qwen3moe: Qwen3-30B-A3B and its
//! kin) as llama.cpp computes them (`build_moe_ffn` in its
//! `src/llama-graph.cpp`, the CPU backend's `mul_mat_id`):
//!
//! 1. router logits `ffn_gate_inp · x` (a dense product, usually f32: by
//!    tinyBLAS, or by `ggml_vec_dot_f32` for a row alone in its batch —
//!    a decode step, the last layer's output row — where llamafile's
//!    `sgemm` declines a one-column product);
//! 2. `softmax` over every expert in f32 (`ggml_vec_soft_max_f32`: 16 lanes
//!    of `ggml_v_expf` reduced and added in f64, the rest with `expf`, then
//!    one multiply by `1 / sum`);
//! 3. the top `k` by `std::sort` of the indices, descending (libstdc++'s
//!    introsort, whose order of equal values is its own: [`argsort_desc`]);
//! 4. the chosen probabilities renormalized (qwen3moe's `norm_w`): divided
//!    by their sum (accumulated in f64, clamped below at 2⁻¹⁴);
//! 5. each chosen expert's `down(silu(gate · x) · (up · x))`, multiplied by
//!    its weight, and the `k` products added in the order of the top-k
//!    (`((e₀ + e₁) + e₂) + …`).
//!
//! The experts run on the fast kernels, each expert's matrices as packed
//! parts of their own ([`model::Part`]): on a prompt the rows routed to
//! expert `e` are gathered and multiplied by its matrices only, one product
//! per used expert, every used expert's row tiles in one pool job; on a
//! decode only the `k` chosen experts' rows are read. Activations are
//! quantized per column exactly as the dense path quantizes them (ggml's
//! `mul_mat_id` converts `src1` with the same `from_float`).
//!
//! INVARIANT: a column's numbers depend on which columns run with it in one
//! way only, as they do in llama.cpp: ggml's tiled K-quant kernel (Q6_K,
//! Q5_K, Q4_K not repacked) takes an expert's product when 8 or more rows of
//! one physical batch are routed to it (`ggml_compute_forward_mul_mat_id_tiled`),
//! so a column is `wide` when its row's batch sends 8 or more rows to that
//! expert. Repacked Q4_K and Q4_0 experts always take ggml's one-column
//! `gemv` (never grouped). And an f32 router's row alone in its batch takes
//! `ggml_vec_dot_f32`, not tinyBLAS. The engine gives a mixture one whole
//! physical batch of each sequence per pass (a prompt's `UBATCH`es, as
//! llama.cpp splits it; `Model::moe_batches`, `Engine::step`), so a
//! sequence's rows in a pass are its batch, and the count and the row
//! alone are llama.cpp's.

use crate::arch::{Act, Arch};
use crate::error::{model_err, Result};
use crate::gguf::{GgmlType, Gguf};
use crate::kernels::attn::{glu, reduce16, v_expf, WIDE};
use crate::kernels::{Acts, Needs, OutRows, Packed};
use crate::model::{Linear, Part};
use crate::pool::Pool;

/// Experts llama.cpp accepts (`LLAMA_MAX_EXPERTS`).
const MAX_EXPERTS: usize = 1024;

/// Columns (routed rows) per slice of a prompt's expert products: bounds the
/// gathered activations while keeping each expert's batch wide (a whole
/// `UBATCH` of Qwen3-30B-A3B's 8 experts a token is one slice, so each
/// expert's weights are read once a batch).
const SLICE_COLS: usize = 4096;

/// Rows of a pass past which its gathered buffers are released after it: a
/// prompt's are large (tens of MB at Qwen3-30B-A3B's size) and a session
/// keeps its scratch; a decode's are small and reused.
const KEEP_ROWS: usize = 64;

/// Tasks per thread of a prompt's expert products (as the dense path's).
const PROMPT_TASKS: usize = 8;

/// The experts of a mixture-of-experts model, from its GGUF metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MoeConfig {
    /// Experts per layer (`{arch}.expert_count`).
    pub(crate) n_expert: usize,
    /// Experts each token uses (`{arch}.expert_used_count`).
    pub(crate) n_used: usize,
    /// Feed-forward size of one expert (`{arch}.expert_feed_forward_length`,
    /// else `feed_forward_length / n_used` as llama.cpp falls back).
    pub(crate) n_ff: usize,
}

impl MoeConfig {
    /// The expert counts of `arch` (None for a dense model). A qwen3moe file
    /// without them, with counts no model has, or another architecture that
    /// declares experts (the engine runs no other mixture) is refused with
    /// an error naming the key.
    pub(crate) fn read(g: &Gguf, arch: Arch, arch_name: &str) -> Result<Option<MoeConfig>> {
        let k = |s: &str| format!("{arch_name}.{s}");
        let count = |s: &str| -> Result<Option<usize>> {
            match g.get(&k(s)) {
                None => Ok(None),
                Some(_) => g.u32(&k(s)).map(|v| Some(v as usize)).ok_or_else(|| {
                    model_err(format!(
                        "metadata `{}` is not a single count (per-layer counts are not supported)",
                        k(s)
                    ))
                }),
            }
        };
        let n_expert = count("expert_count")?;
        if arch != Arch::Qwen3Moe {
            return match n_expert {
                Some(n) if n > 0 => Err(model_err(format!(
                    "architecture `{arch_name}` with {n} experts (`{}`) is not supported: the only mixture-of-experts architecture this engine runs is qwen3moe",
                    k("expert_count")
                ))),
                _ => Ok(None),
            };
        }
        let n_expert = n_expert.ok_or_else(|| {
            model_err(format!("qwen3moe metadata `{}` is missing", k("expert_count")))
        })?;
        let n_used = count("expert_used_count")?.ok_or_else(|| {
            model_err(format!("qwen3moe metadata `{}` is missing", k("expert_used_count")))
        })?;
        if n_expert == 0 || n_expert > MAX_EXPERTS {
            return Err(model_err(format!(
                "metadata `{}` is {n_expert}, want 1 to {MAX_EXPERTS}",
                k("expert_count")
            )));
        }
        if n_used == 0 || n_used > n_expert {
            return Err(model_err(format!(
                "metadata `{}` is {n_used}, want 1 to `{}` ({n_expert})",
                k("expert_used_count"),
                k("expert_count")
            )));
        }
        let n_ff = match count("expert_feed_forward_length")? {
            Some(v) => v,
            None => count("feed_forward_length")?.map_or(0, |v| v / n_used),
        };
        if n_ff == 0 || !n_ff.is_multiple_of(32) || n_ff > 1 << 20 {
            return Err(model_err(format!(
                "metadata `{}` is {n_ff} (or missing), want a positive multiple of 32",
                k("expert_feed_forward_length")
            )));
        }
        Ok(Some(MoeConfig { n_expert, n_used, n_ff }))
    }
}

/// One 3-D expert tensor (`experts × rows × cols`): each expert's rows as a
/// part of its own.
#[derive(Debug)]
struct Experts {
    ty: GgmlType,
    parts: Vec<Part>,
}

/// How ggml's `mul_mat_id` multiplies float experts: `ggml_vec_dot_f16` on
/// activations rounded to f16, or `ggml_vec_dot_f32` (not the dense path's
/// tinyBLAS), so these run here rather than on the dense kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Float {
    F16,
    F32,
}

impl Experts {
    fn float(&self) -> Option<Float> {
        match self.ty {
            GgmlType::F16 => Some(Float::F16),
            GgmlType::F32 => Some(Float::F32),
            _ => None,
        }
    }
}

impl Experts {
    /// Loads `name`, which must be `n_expert × rows × cols`.
    fn load(
        g: &mut Gguf,
        name: &str,
        n_expert: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Experts> {
        let info = g.info(name)?;
        let ty = info.ty;
        if info.dims != [cols, rows, n_expert] {
            return Err(model_err(format!(
                "tensor `{name}` has dimensions {:?}, want [{cols}, {rows}, {n_expert}] (columns, rows, experts) for this model's shape",
                info.dims
            )));
        }
        let parts = (0..n_expert)
            .map(|e| crate::model::load_rows(g, name, ty, e * rows, rows, cols))
            .collect::<Result<Vec<_>>>()?;
        Ok(Experts { ty, parts })
    }

    fn bytes(&self, cols: usize) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Fast(p) => p.bytes(),
                Part::Candle { rows, ty, .. } => ty.row_bytes(cols).unwrap_or(0) * rows,
            })
            .sum()
    }

    fn kernel(&self) -> (GgmlType, String) {
        match self.parts.first() {
            Some(Part::Fast(p)) => (self.ty, p.kernel()),
            _ => (self.ty, "candle".to_owned()),
        }
    }

    /// Whether ggml's tiled kernel may take these experts' products
    /// (`attn::Route::wide` matters).
    fn wide_matters(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Fast(p) if p.route_matters().1))
    }
}

/// A layer's mixture-of-experts feed-forward block.
#[derive(Debug)]
pub(crate) struct Moe {
    cfg: MoeConfig,
    n_embd: usize,
    act: Act,
    router: Linear,
    router_type: GgmlType,
    /// An f32 or f16 router's rows as f32, for rows alone in their batch.
    router_rows: Option<(Float, Vec<f32>)>,
    gate: Experts,
    up: Experts,
    down: Experts,
}

impl Moe {
    /// Layer `il`'s router and experts (`blk.{il}.ffn_gate_inp`,
    /// `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`).
    pub(crate) fn load(
        g: &mut Gguf,
        cfg: MoeConfig,
        n_embd: usize,
        act: Act,
        il: usize,
    ) -> Result<Moe> {
        let t = |s: &str| format!("blk.{il}.{s}");
        let router_name = t("ffn_gate_inp.weight");
        let info = g.info(&router_name)?;
        if info.dims != [n_embd, cfg.n_expert] {
            return Err(model_err(format!(
                "tensor `{router_name}` has dimensions {:?}, want [{n_embd}, {}] (`expert_count` routes of the hidden size)",
                info.dims, cfg.n_expert
            )));
        }
        let router_type = info.ty;
        let (e, ff) = (cfg.n_expert, cfg.n_ff);
        let router_rows = match router_type {
            GgmlType::F32 => Some(Float::F32),
            GgmlType::F16 => Some(Float::F16),
            _ => None,
        }
        .map(|f| -> Result<(Float, Vec<f32>)> {
            let raw = g.bytes(&router_name)?;
            let mut w = vec![0f32; e * n_embd];
            crate::quant::dequantize_row(router_type, &raw, &mut w);
            Ok((f, w))
        })
        .transpose()?;
        Ok(Moe {
            router_rows,
            cfg,
            n_embd,
            act,
            router: Linear::load(g, &[&router_name])?,
            router_type,
            gate: Experts::load(g, &t("ffn_gate_exps.weight"), e, ff, n_embd)?,
            up: Experts::load(g, &t("ffn_up_exps.weight"), e, ff, n_embd)?,
            down: Experts::load(g, &t("ffn_down_exps.weight"), e, n_embd, ff)?,
        })
    }

    /// Bytes of weights held (router and every expert).
    pub(crate) fn bytes(&self) -> usize {
        self.router.bytes()
            + self.gate.bytes(self.n_embd)
            + self.up.bytes(self.n_embd)
            + self.down.bytes(self.cfg.n_ff)
    }

    /// `(tensor type, kernel)` of the router and of each expert tensor.
    pub(crate) fn kernels(&self) -> Vec<(GgmlType, String)> {
        let mut v = self.router.kernels(&[self.router_type]);
        for x in [&self.gate, &self.up, &self.down] {
            let (ty, k) = x.kernel();
            v.push((ty, format!("{k}-experts")));
        }
        v
    }

    /// The router: a dense product (its `attn::Route` matters as any
    /// dense matrix's).
    pub(crate) fn router(&self) -> &Linear {
        &self.router
    }

    /// Whether an expert's numbers depend on how many rows of a physical
    /// batch are routed to it (the module INVARIANT).
    pub(crate) fn wide_matters(&self) -> bool {
        self.gate.wide_matters() || self.up.wide_matters() || self.down.wide_matters()
    }

    /// The block's output `out` (`[n × n_embd]`, without the residual) for
    /// the `n` rows of `x` (normed). `grouped`/`wide` are the rows' routes
    /// for the router (a dense product), and `at[i].0` is row `i`'s
    /// sequence: a sequence's rows are one physical batch (the module
    /// INVARIANT), whose counts decide which experts take the tiled kernel
    /// (rows that are not wide were evaluated in a batch of fewer than 8
    /// rows and never do), and a row alone in its batch takes
    /// `ggml_vec_dot_f32` for an f32 router. `at` empty: each row is its
    /// sequence's output row (the last layer), alone.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        pool: &Pool,
        x: &[f32],
        n: usize,
        grouped: &[bool],
        wide: &[bool],
        at: &[(usize, usize)],
        s: &mut Scratch,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (d, ne, k) = (self.n_embd, self.cfg.n_expert, self.cfg.n_used);
        self.router.forward(pool, x, n, grouped, wide, &mut s.acts, &mut s.logits)?;
        // A row alone in its batch: llamafile's sgemm takes no one-column
        // product, so ggml's vec_dot computes an f32/f16 router's logits.
        let seq = |i: usize| at.get(i).map(|a| a.0);
        let alone = |i: usize| {
            at.is_empty()
                || ((i == 0 || seq(i - 1) != seq(i)) && (i + 1 == n || seq(i + 1) != seq(i)))
        };
        if let Some((f, w)) = &self.router_rows {
            for i in (0..n).filter(|&i| alone(i)) {
                float_columns(Some(*f), &x[i * d..(i + 1) * d], &mut s.probs);
                for e in 0..ne {
                    s.logits[i * ne + e] = dot_float(*f, &w[e * d..(e + 1) * d], &s.probs);
                }
            }
        }
        s.sel.resize(n * k, 0);
        s.w.resize(n * k, 0.0);
        for i in 0..n {
            route(
                &s.logits[i * ne..(i + 1) * ne],
                k,
                &mut s.probs,
                &mut s.order,
                &mut s.sel[i * k..(i + 1) * k],
                &mut s.w[i * k..(i + 1) * k],
            );
        }
        // Which (row, slot) columns take the tiled kernel: a sequence's rows
        // are consecutive, so each batch is a run of equal keys.
        let key = |i: usize| wide.get(i).copied().unwrap_or(false).then(|| seq(i)).flatten();
        s.tiled.clear();
        s.tiled.resize(n * k, false);
        s.count.resize(ne, 0);
        let mut i0 = 0;
        while i0 < n {
            let kk = key(i0);
            let mut i1 = i0 + 1;
            while i1 < n && key(i1) == kk {
                i1 += 1;
            }
            if kk.is_some() {
                s.count.iter_mut().for_each(|c| *c = 0);
                for &e in &s.sel[i0 * k..i1 * k] {
                    s.count[e as usize] += 1;
                }
                for j in i0 * k..i1 * k {
                    s.tiled[j] = s.count[s.sel[j] as usize] as usize >= WIDE;
                }
            }
            i0 = i1;
        }
        out.resize(n * d, 0.0);
        if s.experts.len() < ne {
            s.experts.resize_with(ne, Default::default);
        }
        // Slices of whole rows, so every row's k products finish together.
        let per = (SLICE_COLS / k).max(1);
        for r0 in (0..n).step_by(per) {
            let r1 = (r0 + per).min(n);
            self.slice(pool, x, n, r0..r1, s, out)?;
        }
        if n > KEEP_ROWS {
            s.experts.iter_mut().for_each(|ex| *ex = ExpertScratch::default());
        }
        Ok(())
    }

    /// Rows `rows` of [`Moe::forward`] (routes already in `s`).
    fn slice(
        &self,
        pool: &Pool,
        x: &[f32],
        n: usize,
        rows: std::ops::Range<usize>,
        s: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        let (d, k, ff) = (self.n_embd, self.cfg.n_used, self.cfg.n_ff);
        for ex in s.experts.iter_mut() {
            ex.cols.clear();
            ex.tiled.clear();
        }
        s.col.resize(n * k, 0);
        for i in rows.clone() {
            for j in i * k..(i + 1) * k {
                let ex = &mut s.experts[s.sel[j] as usize];
                s.col[j] = ex.cols.len() as u32;
                ex.cols.push(i as u32);
                ex.tiled.push(s.tiled[j]);
            }
        }
        let used: Vec<usize> =
            (0..self.cfg.n_expert).filter(|&e| !s.experts[e].cols.is_empty()).collect();
        // One row alone (a decode step): every chosen expert reads the same
        // activations, quantized once.
        let single = rows.len() == 1;
        let gu_float = self.gate.float().or(self.up.float());
        let gu_need = used.iter().fold(Needs::default(), |a, &e| {
            a.or(needs(&self.gate.parts[e])).or(needs(&self.up.parts[e]))
        });
        if single {
            let i = rows.start;
            let xi = &x[i * d..(i + 1) * d];
            s.shared.prepare(xi, 1, d, gu_need, pool);
            s.shared.set_route(&[], &[]);
            float_columns(gu_float, xi, &mut s.shared_x);
        }
        for &e in &used {
            let ex = &mut s.experts[e];
            let m = ex.cols.len();
            if !single {
                ex.x.resize(m * d, 0.0);
                for (c, &i) in ex.cols.iter().enumerate() {
                    let i = i as usize;
                    ex.x[c * d..(c + 1) * d].copy_from_slice(&x[i * d..(i + 1) * d]);
                }
                ex.acts.prepare(&ex.x, m, d, gu_need, pool);
                ex.acts.set_route(&[], &ex.tiled);
                float_columns(gu_float, &ex.x[..m * d], &mut ex.xf);
            }
            ex.gu.resize(m * 2 * ff, 0.0);
        }
        // Gate and up of every used expert: one pool job.
        {
            let mut jobs: Vec<Job<'_>> = Vec::new();
            let mut outs: Vec<OutRows<'_>> = Vec::with_capacity(used.len());
            let mut ins: Vec<(&Acts, &[f32])> = Vec::with_capacity(used.len());
            let Scratch { experts, shared, shared_x, .. } = &mut *s;
            let mut used_it = used.iter().peekable();
            for (e, ex) in experts.iter_mut().enumerate() {
                if used_it.next_if(|&&u| u == e).is_none() {
                    continue;
                }
                let slot = outs.len();
                let m = ex.cols.len();
                outs.push(OutRows::new(&mut ex.gu[..m * 2 * ff], 2 * ff));
                ins.push(if single { (&*shared, &shared_x[..]) } else { (&ex.acts, &ex.xf[..]) });
                for (x, off) in [(&self.gate, 0), (&self.up, ff)] {
                    jobs.extend(Job::new(&x.parts[e], x.float(), slot, off, m));
                }
            }
            run_jobs(pool, &jobs, &ins, &outs);
        }
        let down_float = self.down.float();
        for &e in &used {
            let ex = &mut s.experts[e];
            let m = ex.cols.len();
            for (p, off) in [(&self.gate.parts[e], 0), (&self.up.parts[e], ff)] {
                if let Part::Candle { mm, .. } = p {
                    let i = rows.start;
                    let src = if single { &x[i * d..(i + 1) * d] } else { &ex.x[..m * d] };
                    candle_rows(mm, src, m, d, ff, &mut ex.gu, 2 * ff, off)?;
                }
            }
            ex.a.resize(m * ff, 0.0);
            let (gu, act) = (&ex.gu, self.act);
            crate::kernels::rows_mut(pool, &mut ex.a[..m * ff], ff, |c, a| {
                let (g, u) = gu[c * 2 * ff..(c + 1) * 2 * ff].split_at(ff);
                glu(act, g, u, a);
            });
            float_columns(down_float, &ex.a[..m * ff], &mut ex.xf);
        }
        // Down: each expert over its own gated activations.
        let down_need =
            used.iter().fold(Needs::default(), |a, &e| a.or(needs(&self.down.parts[e])));
        for &e in &used {
            let ex = &mut s.experts[e];
            let m = ex.cols.len();
            ex.acts.prepare(&ex.a, m, ff, down_need, pool);
            ex.acts.set_route(&[], if single { &[] } else { &ex.tiled });
            ex.y.resize(m * d, 0.0);
        }
        {
            let mut jobs: Vec<Job<'_>> = Vec::new();
            let mut outs: Vec<OutRows<'_>> = Vec::with_capacity(used.len());
            let mut ins: Vec<(&Acts, &[f32])> = Vec::with_capacity(used.len());
            let mut used_it = used.iter().peekable();
            for (e, ex) in s.experts.iter_mut().enumerate() {
                if used_it.next_if(|&&u| u == e).is_none() {
                    continue;
                }
                let slot = outs.len();
                let m = ex.cols.len();
                outs.push(OutRows::new(&mut ex.y[..m * d], d));
                ins.push((&ex.acts, &ex.xf[..]));
                jobs.extend(Job::new(&self.down.parts[e], down_float, slot, 0, m));
            }
            run_jobs(pool, &jobs, &ins, &outs);
        }
        for &e in &used {
            if let Part::Candle { mm, .. } = &self.down.parts[e] {
                let ex = &mut s.experts[e];
                let m = ex.cols.len();
                candle_rows(mm, &ex.a[..m * ff], m, ff, d, &mut ex.y, d, 0)?;
            }
        }
        // Each row: its k weighted expert outputs added in top-k order.
        let (experts, sel, col, w) = (&s.experts, &s.sel, &s.col, &s.w);
        let r0 = rows.start;
        crate::kernels::rows_mut(pool, &mut out[rows.start * d..rows.end * d], d, |i, o| {
            let i = r0 + i;
            for j in 0..k {
                let (e, c, wj) = (sel[i * k + j] as usize, col[i * k + j] as usize, w[i * k + j]);
                let y = &experts[e].y[c * d..(c + 1) * d];
                if j == 0 {
                    o.iter_mut().zip(y).for_each(|(o, &v)| *o = v * wj);
                } else {
                    o.iter_mut().zip(y).for_each(|(o, &v)| *o += v * wj);
                }
            }
        });
        Ok(())
    }
}

/// The activations a part's kernels read (none for candle's).
fn needs(p: &Part) -> Needs {
    match p {
        Part::Fast(p) => p.needs(),
        Part::Candle { .. } => Needs::default(),
    }
}

/// One expert matrix of a pool job: its rows go to rows `off..` of output
/// `slot`, against the `cols` columns of input `slot`.
struct Job<'a> {
    mat: &'a Packed,
    float: Option<Float>,
    slot: usize,
    off: usize,
    cols: usize,
}

impl<'a> Job<'a> {
    /// The job of a part on the fast kernels (none for candle's).
    fn new(
        p: &'a Part,
        float: Option<Float>,
        slot: usize,
        off: usize,
        cols: usize,
    ) -> Option<Job<'a>> {
        match p {
            Part::Fast(mat) => Some(Job { mat, float, slot, off, cols }),
            Part::Candle { .. } => None,
        }
    }
}

/// Every job's row tiles as tasks of one pool job: on a decode one task per
/// thread and matrix (a contiguous weight stream each, as the dense path),
/// on a prompt about `PROMPT_TASKS` per thread in all, shared out by each
/// matrix's work. `ins[slot]` are a slot's activations (quantized, and as
/// f32 columns for float experts).
fn run_jobs(pool: &Pool, jobs: &[Job<'_>], ins: &[(&Acts, &[f32])], outs: &[OutRows<'_>]) {
    let threads = pool.threads();
    let work: usize = jobs.iter().map(|j| j.mat.tiles() * j.cols).sum();
    let decode = jobs.iter().all(|j| j.cols == 1);
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    for (ji, j) in jobs.iter().enumerate() {
        let tiles = j.mat.tiles();
        let pieces = if decode {
            threads
        } else {
            (threads * PROMPT_TASKS * tiles * j.cols).div_ceil(work.max(1)).max(1)
        };
        let per = (tiles / pieces).max(1).next_multiple_of(j.mat.tile_align());
        tasks.extend((0..tiles).step_by(per).map(|t| (ji, t, (t + per).min(tiles))));
    }
    pool.run(tasks.len(), &|t| {
        let (ji, t0, t1) = tasks[t];
        let j = &jobs[ji];
        let out = outs[j.slot].part(j.off, j.mat.rows);
        match j.float {
            // SAFETY: task t alone has tiles t0..t1 of job ji's matrix, and
            // each job writes its own rows (`off..off + rows`) of its own
            // output.
            None => unsafe { j.mat.matmul_tiles(ins[j.slot].0, t0..t1, &out) },
            Some(f) => float_rows(j.mat, f, ins[j.slot].1, j.cols, t0..t1, &out),
        }
    });
}

/// Rows of tiles `tiles` of a float expert against `cols` f32 columns
/// (`x`, rounded through f16 for f16 weights: [`float_columns`]) as ggml's
/// `ggml_vec_dot_f16`/`ggml_vec_dot_f32` compute them.
fn float_rows(
    mat: &Packed,
    f: Float,
    x: &[f32],
    cols: usize,
    tiles: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    use crate::kernels::PackedKind;
    let k = mat.cols;
    let rows = tiles.start * crate::kernels::ROW_TILE
        ..(tiles.end * crate::kernels::ROW_TILE).min(mat.rows);
    let (mut buf, mut w) = (Vec::new(), vec![0f32; k]);
    for r in rows {
        let row: &[f32] = match &mat.kind {
            PackedKind::F32 { w } => &w[r * k..(r + 1) * k],
            PackedKind::Rows(m) => {
                let raw = m.row(r, &mut buf);
                for (o, b) in w.iter_mut().zip(raw.chunks_exact(2)) {
                    *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
                &w
            }
            _ => unreachable!("float experts are f32 or f16 rows"),
        };
        for c in 0..cols {
            let v = dot_float(f, row, &x[c * k..(c + 1) * k]);
            // SAFETY: the caller's task owns these rows of `out`.
            unsafe { out.set(c, r, v) };
        }
    }
}

/// `ggml_vec_dot_f16` / `ggml_vec_dot_f32` of the AVX-512 build: four
/// 16-lane fma accumulators over 64-value steps, folded `(0+2)+(1+3)` and
/// reduced; the tail added in f64 (f16) or fused into the f32 sum (f32).
fn dot_float(f: Float, w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let np = n & !63;
    let r = crate::kernels::attn::dot64(&w[..np], &x[..np]);
    match f {
        Float::F16 => {
            let mut s = r as f64;
            for i in np..n {
                s += (w[i] * x[i]) as f64;
            }
            s as f32
        }
        Float::F32 => (np..n).fold(r, |s, i| w[i].mul_add(x[i], s)),
    }
}

/// The f32 columns a float expert meets: `x` rounded through f16 for f16
/// weights (ggml converts `src1` to the weights' type), as is for f32;
/// nothing for quantized experts.
fn float_columns(f: Option<Float>, x: &[f32], out: &mut Vec<f32>) {
    out.clear();
    match f {
        Some(Float::F16) => out.extend(x.iter().map(|&v| half::f16::from_f32(v).to_f32())),
        Some(Float::F32) => out.extend_from_slice(x),
        None => {}
    }
}

/// `out[c · stride + off + r]` for candle's part `mm` (`rows × cols`) over
/// the `m` columns of `x`.
#[allow(clippy::too_many_arguments)]
fn candle_rows(
    mm: &candle_core::quantized::QMatMul,
    x: &[f32],
    m: usize,
    cols: usize,
    rows: usize,
    out: &mut [f32],
    stride: usize,
    off: usize,
) -> Result<()> {
    use candle_core::Module;
    let t = candle_core::Tensor::from_slice(&x[..m * cols], (m, cols), &candle_core::Device::Cpu)?;
    let y = mm.forward(&t)?.flatten_all()?.to_vec1::<f32>()?;
    for c in 0..m {
        out[c * stride + off..c * stride + off + rows]
            .copy_from_slice(&y[c * rows..(c + 1) * rows]);
    }
    Ok(())
}

/// Buffers of [`Moe::forward`], reused from pass to pass.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// The router's activations.
    acts: Acts,
    /// A decode step's activations, shared by its experts' gate and up
    /// (quantized, and as float experts meet them).
    shared: Acts,
    shared_x: Vec<f32>,
    /// Router logits `[n × n_expert]`.
    logits: Vec<f32>,
    probs: Vec<f32>,
    order: Vec<u32>,
    /// Per row and slot: the expert, its weight, whether its product is
    /// tiled, and the row's column in the expert's batch.
    sel: Vec<u32>,
    w: Vec<f32>,
    tiled: Vec<bool>,
    col: Vec<u32>,
    /// Rows of one physical batch routed to each expert.
    count: Vec<u32>,
    experts: Vec<ExpertScratch>,
}

/// One expert's batch in a slice.
#[derive(Debug, Default)]
struct ExpertScratch {
    /// The rows routed to it, in order, and whether each is tiled.
    cols: Vec<u32>,
    tiled: Vec<bool>,
    /// Their inputs, quantized activations, gate‖up outputs, gated
    /// activations and outputs.
    x: Vec<f32>,
    acts: Acts,
    /// The columns float experts meet (`float_columns`) of `x`, then of `a`.
    xf: Vec<f32>,
    gu: Vec<f32>,
    a: Vec<f32>,
    y: Vec<f32>,
}

/// Routes one row: `sel` gets the `k` experts of the largest softmax
/// probabilities of `logits` (llama.cpp's order), `w` their weights
/// renormalized to sum to one.
pub(crate) fn route(
    logits: &[f32],
    k: usize,
    probs: &mut Vec<f32>,
    order: &mut Vec<u32>,
    sel: &mut [u32],
    w: &mut [f32],
) {
    softmax(logits, probs);
    argsort_desc(probs, order);
    sel.copy_from_slice(&order[..k]);
    let mut sum = 0f64;
    for (w, &e) in w.iter_mut().zip(sel.iter()) {
        *w = probs[e as usize];
        sum += *w as f64;
    }
    // ggml_sum_rows (f64, rounded), ggml_clamp (MAX(MIN(x, ∞), 2⁻¹⁴)), ggml_div.
    let sum = sum as f32;
    let sum = if sum < f32::INFINITY { sum } else { f32::INFINITY };
    let floor = 1.0 / 16384.0;
    let sum = if sum > floor { sum } else { floor };
    w.iter_mut().for_each(|w| *w /= sum);
}

/// `ggml_soft_max` of one row as the AVX-512 build computes it: the max
/// (`MAX(max, x)`), `ggml_v_expf(x − max)` 16 lanes at a time with each
/// group's `_mm512_reduce_add_ps` added in f64, the rest with `expf` added
/// one by one, then every value multiplied by `(f32)(1 / sum)`.
pub(crate) fn softmax(x: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.resize(x.len(), 0.0);
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v });
    let body = x.len() / 16 * 16;
    let mut sum = 0f64;
    for (o, v) in out[..body].chunks_exact_mut(16).zip(x[..body].chunks_exact(16)) {
        let mut e = [0f32; 16];
        for ((e, o), &v) in e.iter_mut().zip(o.iter_mut()).zip(v) {
            *e = v_expf(v - max);
            *o = *e;
        }
        sum += reduce16(&e) as f64;
    }
    for (o, &v) in out[body..].iter_mut().zip(&x[body..]) {
        *o = (v - max).exp();
        sum += *o as f64;
    }
    let scale = (1.0 / sum) as f32;
    out.iter_mut().for_each(|o| *o *= scale);
}

/// The indices of `p` sorted by descending value as ggml's `argsort`
/// (`GGML_SORT_ORDER_DESC`) sorts them: libstdc++'s `std::sort` with
/// `p[a] > p[b]`, step by step (introsort: median-of-three partitions down
/// to runs of 16, heapsort past `2·⌊log₂ n⌋` levels, a final insertion
/// sort), so equal values come out in its order. Out-of-range reads that
/// libstdc++ would make on an inconsistent order (NaN) stop instead.
pub(crate) fn argsort_desc(p: &[f32], idx: &mut Vec<u32>) {
    idx.clear();
    idx.extend(0..p.len() as u32);
    let n = idx.len();
    if n < 2 {
        return;
    }
    let gt = |a: u32, b: u32| p[a as usize] > p[b as usize];
    let lg = (usize::BITS - 1 - n.leading_zeros()) as usize;
    introsort_loop(idx, 0, n, 2 * lg, &gt);
    if n > SORT_THRESHOLD {
        insertion_sort(idx, 0, SORT_THRESHOLD, &gt);
        for i in SORT_THRESHOLD..n {
            linear_insert(idx, i, &gt);
        }
    } else {
        insertion_sort(idx, 0, n, &gt);
    }
}

/// libstdc++'s `_S_threshold`.
const SORT_THRESHOLD: usize = 16;

type Cmp<'a> = dyn Fn(u32, u32) -> bool + 'a;

fn introsort_loop(v: &mut [u32], first: usize, mut last: usize, mut depth: usize, comp: &Cmp<'_>) {
    while last - first > SORT_THRESHOLD {
        if depth == 0 {
            heap_sort(&mut v[first..last], comp);
            return;
        }
        depth -= 1;
        // __unguarded_partition_pivot: the median of (first + 1, mid,
        // last − 1) moved to first, then a partition around it.
        let mid = first + (last - first) / 2;
        let (a, b, c) = (first + 1, mid, last - 1);
        let pick = if comp(v[a], v[b]) {
            if comp(v[b], v[c]) {
                b
            } else if comp(v[a], v[c]) {
                c
            } else {
                a
            }
        } else if comp(v[a], v[c]) {
            a
        } else if comp(v[b], v[c]) {
            c
        } else {
            b
        };
        v.swap(first, pick);
        let (mut lo, mut hi) = (first + 1, last);
        let cut = loop {
            while lo < last && comp(v[lo], v[first]) {
                lo += 1;
            }
            hi -= 1;
            while hi > first && comp(v[first], v[hi]) {
                hi -= 1;
            }
            if lo >= hi {
                break lo;
            }
            v.swap(lo, hi);
            lo += 1;
        };
        introsort_loop(v, cut, last, depth, comp);
        last = cut;
    }
}

/// `std::__partial_sort(first, last, last)`: `__make_heap`, then
/// `__sort_heap`.
fn heap_sort(v: &mut [u32], comp: &Cmp<'_>) {
    let len = v.len();
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let value = v[parent];
            adjust_heap(v, parent, len, value, comp);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    let mut last = len;
    while last > 1 {
        last -= 1;
        let value = v[last];
        v[last] = v[0];
        adjust_heap(&mut v[..last], 0, last, value, comp);
    }
}

/// libstdc++'s `__adjust_heap` with its `__push_heap`.
fn adjust_heap(v: &mut [u32], mut hole: usize, len: usize, value: u32, comp: &Cmp<'_>) {
    let top = hole;
    let mut second = hole;
    while second < (len - 1) / 2 {
        second = 2 * (second + 1);
        if comp(v[second], v[second - 1]) {
            second -= 1;
        }
        v[hole] = v[second];
        hole = second;
    }
    if len.is_multiple_of(2) && second == (len - 2) / 2 {
        second = 2 * (second + 1);
        v[hole] = v[second - 1];
        hole = second - 1;
    }
    while hole > top {
        let parent = (hole - 1) / 2;
        if !comp(v[parent], value) {
            break;
        }
        v[hole] = v[parent];
        hole = parent;
    }
    v[hole] = value;
}

/// `__insertion_sort` of `first..last`.
fn insertion_sort(v: &mut [u32], first: usize, last: usize, comp: &Cmp<'_>) {
    for i in first + 1..last {
        if comp(v[i], v[first]) {
            let val = v[i];
            v.copy_within(first..i, first + 1);
            v[first] = val;
        } else {
            linear_insert(v, i, comp);
        }
    }
}

/// `__unguarded_linear_insert` of `v[last]` (stopping at 0, where a
/// consistent order never reaches).
fn linear_insert(v: &mut [u32], mut last: usize, comp: &Cmp<'_>) {
    let val = v[last];
    while last > 0 && comp(val, v[last - 1]) {
        v[last] = v[last - 1];
        last -= 1;
    }
    v[last] = val;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64, as the C++ program that made [`LIBSTDCXX`] seeded it.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    fn values(n: usize, levels: u64, seed: u64) -> Vec<f32> {
        let mut r = rng(seed);
        (0..n).map(|_| (r() % levels) as f32 / 7.0).collect()
    }

    /// `(n, levels, seed, std::sort, std::partial_sort(first, last, last))`
    /// of the indices of [`values`] by `p[a] > p[b]`, as g++ 12's libstdc++
    /// orders them (few levels: many ties).
    #[rustfmt::skip]
    #[allow(clippy::type_complexity)]
    const LIBSTDCXX: &[(usize, u64, u64, &[u32], &[u32])] = &[
        (16, 4, 1, &[6, 8, 11, 14, 15, 1, 2, 7, 9, 13, 0, 5, 10, 12, 3, 4], &[14, 8, 11, 15, 6, 7, 9, 1, 2, 13, 0, 10, 5, 12, 3, 4]),
        (17, 3, 2, &[8, 16, 13, 11, 7, 6, 5, 2, 0, 9, 10, 14, 1, 4, 3, 12, 15], &[8, 11, 6, 7, 5, 16, 2, 13, 9, 1, 10, 0, 14, 3, 15, 4, 12]),
        (40, 5, 3, &[33, 27, 25, 4, 22, 0, 10, 15, 1, 24, 35, 19, 16, 38, 11, 6, 5, 12, 17, 37, 8, 13, 31, 3, 26, 2, 32, 34, 28, 23, 7, 39, 36, 30, 29, 21, 20, 18, 14, 9], &[0, 22, 10, 33, 25, 27, 4, 15, 38, 16, 35, 1, 11, 24, 5, 19, 6, 31, 17, 37, 3, 8, 12, 26, 13, 2, 32, 7, 34, 23, 28, 36, 18, 39, 9, 20, 21, 29, 14, 30]),
        (128, 6, 4, &[16, 32, 88, 86, 90, 94, 36, 83, 80, 78, 47, 105, 61, 123, 64, 65, 56, 57, 116, 62, 68, 35, 59, 37, 81, 42, 72, 55, 48, 31, 54, 71, 51, 30, 12, 11, 10, 114, 101, 19, 115, 6, 4, 22, 97, 25, 26, 92, 119, 126, 127, 66, 0, 110, 69, 107, 103, 75, 77, 99, 98, 96, 84, 43, 8, 50, 17, 46, 112, 41, 111, 14, 106, 34, 15, 18, 28, 21, 27, 23, 24, 40, 9, 3, 124, 52, 58, 1, 95, 113, 117, 120, 122, 102, 20, 125, 2, 85, 76, 79, 45, 74, 87, 73, 49, 70, 29, 67, 82, 121, 5, 118, 7, 53, 60, 44, 63, 39, 13, 109, 108, 38, 104, 33, 89, 100, 91, 93], &[56, 86, 16, 88, 80, 78, 64, 105, 94, 32, 65, 47, 116, 36, 83, 61, 90, 123, 57, 35, 71, 4, 72, 31, 19, 37, 42, 114, 92, 54, 22, 68, 97, 81, 101, 11, 6, 26, 48, 115, 12, 59, 51, 55, 62, 10, 25, 30, 127, 66, 69, 17, 75, 77, 84, 8, 0, 43, 46, 96, 98, 99, 50, 103, 107, 110, 119, 126, 15, 111, 34, 3, 18, 9, 40, 41, 1, 21, 23, 24, 14, 52, 106, 112, 27, 28, 58, 124, 67, 70, 73, 74, 76, 79, 20, 85, 87, 45, 95, 49, 102, 113, 117, 120, 29, 122, 2, 125, 63, 7, 33, 38, 39, 82, 44, 89, 91, 93, 100, 104, 5, 53, 108, 109, 13, 118, 60, 121]),
        (128, 1000000, 5, &[12, 121, 26, 11, 90, 31, 66, 112, 122, 97, 35, 111, 18, 107, 79, 2, 63, 61, 41, 54, 39, 58, 9, 64, 102, 105, 67, 94, 13, 52, 7, 96, 5, 25, 48, 120, 80, 36, 47, 40, 89, 95, 3, 118, 104, 127, 30, 46, 24, 93, 103, 83, 109, 117, 87, 113, 59, 77, 110, 119, 17, 27, 49, 78, 71, 85, 0, 1, 100, 33, 69, 74, 98, 76, 101, 6, 123, 22, 72, 37, 43, 75, 116, 8, 45, 125, 114, 88, 29, 126, 60, 32, 106, 86, 124, 53, 42, 65, 82, 57, 10, 91, 38, 62, 16, 23, 50, 14, 44, 15, 108, 70, 68, 51, 84, 21, 81, 73, 115, 99, 55, 34, 28, 4, 19, 20, 92, 56], &[12, 121, 26, 11, 90, 31, 66, 112, 122, 97, 35, 111, 18, 107, 79, 2, 63, 61, 41, 54, 39, 58, 9, 64, 102, 105, 67, 94, 13, 52, 7, 96, 5, 25, 48, 120, 80, 36, 47, 40, 89, 95, 3, 118, 104, 127, 30, 46, 24, 93, 103, 83, 109, 117, 87, 113, 59, 77, 110, 119, 17, 27, 49, 78, 71, 85, 0, 1, 100, 33, 69, 74, 98, 76, 101, 6, 123, 22, 72, 37, 43, 75, 116, 8, 45, 125, 114, 88, 29, 126, 60, 32, 106, 86, 124, 53, 42, 65, 82, 57, 10, 91, 38, 62, 16, 23, 50, 14, 44, 15, 108, 70, 68, 51, 84, 21, 81, 73, 115, 99, 55, 34, 28, 4, 19, 20, 92, 56]),
        (128, 2, 6, &[64, 82, 79, 78, 77, 74, 72, 71, 70, 69, 67, 85, 60, 56, 55, 53, 52, 51, 49, 47, 46, 44, 104, 125, 124, 122, 121, 120, 117, 115, 112, 110, 106, 1, 103, 101, 100, 98, 95, 94, 92, 91, 90, 86, 43, 17, 18, 16, 20, 21, 23, 12, 24, 11, 26, 28, 29, 32, 7, 34, 3, 37, 41, 0, 39, 5, 2, 35, 36, 99, 102, 123, 13, 14, 4, 15, 97, 96, 126, 127, 118, 105, 10, 107, 108, 109, 9, 111, 8, 113, 114, 119, 116, 6, 57, 66, 65, 33, 63, 62, 61, 59, 58, 68, 54, 38, 50, 40, 48, 42, 45, 80, 19, 89, 88, 87, 22, 84, 83, 81, 93, 25, 76, 75, 27, 73, 30, 31], &[78, 94, 1, 70, 110, 18, 86, 23, 24, 26, 32, 28, 34, 74, 51, 82, 20, 90, 91, 98, 11, 106, 5, 56, 117, 64, 122, 85, 16, 79, 72, 17, 37, 71, 39, 95, 41, 46, 43, 21, 92, 35, 47, 103, 100, 52, 104, 12, 53, 49, 112, 0, 29, 115, 120, 121, 3, 124, 44, 77, 36, 67, 7, 69, 101, 55, 60, 125, 2, 63, 127, 15, 65, 66, 33, 68, 73, 8, 75, 76, 38, 80, 19, 40, 81, 9, 83, 84, 42, 87, 88, 89, 45, 4, 10, 22, 93, 96, 48, 97, 99, 50, 102, 25, 105, 107, 108, 54, 109, 111, 27, 113, 114, 57, 116, 13, 58, 118, 59, 119, 31, 61, 123, 6, 14, 30, 62, 126]),
        (200, 7, 7, &[72, 42, 155, 20, 90, 89, 59, 185, 27, 41, 180, 167, 31, 32, 33, 63, 35, 47, 146, 142, 13, 139, 53, 131, 172, 137, 118, 119, 196, 133, 198, 170, 48, 51, 171, 79, 168, 165, 74, 1, 82, 92, 98, 101, 113, 114, 127, 129, 11, 21, 177, 22, 3, 192, 186, 14, 156, 69, 29, 138, 162, 161, 158, 112, 88, 150, 93, 96, 121, 46, 128, 0, 43, 56, 197, 39, 178, 135, 9, 116, 34, 120, 195, 10, 12, 143, 134, 16, 111, 130, 126, 105, 190, 107, 151, 140, 71, 174, 50, 176, 173, 40, 57, 58, 60, 62, 36, 66, 30, 68, 181, 153, 18, 78, 24, 87, 160, 73, 86, 159, 199, 189, 149, 132, 157, 141, 194, 169, 163, 152, 183, 70, 2, 4, 7, 17, 19, 23, 44, 49, 54, 65, 94, 95, 99, 102, 109, 110, 25, 55, 108, 145, 175, 38, 28, 184, 52, 115, 187, 188, 117, 193, 8, 6, 123, 124, 148, 91, 125, 164, 75, 84, 77, 103, 80, 81, 83, 104, 26, 136, 191, 15, 97, 144, 122, 100, 5, 147, 154, 85, 166, 182, 37, 179, 45, 76, 61, 64, 106, 67], &[185, 89, 137, 42, 53, 27, 35, 142, 72, 59, 167, 118, 172, 63, 139, 180, 13, 131, 41, 196, 146, 198, 155, 133, 31, 33, 119, 47, 90, 32, 20, 129, 192, 14, 92, 127, 171, 3, 177, 165, 170, 22, 21, 186, 74, 101, 11, 51, 48, 168, 82, 98, 79, 114, 1, 113, 128, 69, 34, 150, 121, 156, 162, 158, 161, 9, 135, 178, 46, 88, 39, 93, 96, 195, 197, 112, 56, 116, 120, 29, 0, 138, 43, 130, 181, 134, 16, 68, 140, 143, 71, 36, 151, 18, 78, 160, 40, 86, 174, 87, 176, 66, 10, 190, 153, 24, 50, 73, 105, 12, 107, 173, 111, 57, 58, 60, 30, 62, 126, 65, 132, 7, 70, 141, 17, 149, 152, 157, 159, 19, 169, 163, 4, 44, 183, 94, 189, 95, 194, 23, 199, 49, 102, 99, 109, 54, 110, 2, 145, 148, 75, 8, 38, 77, 80, 81, 164, 83, 84, 175, 91, 184, 187, 188, 193, 103, 25, 52, 108, 55, 115, 28, 117, 6, 123, 124, 125, 15, 64, 67, 136, 144, 147, 37, 76, 154, 166, 85, 179, 182, 45, 191, 97, 100, 5, 104, 106, 26, 122, 61]),
    ];

    #[test]
    fn argsort_orders_ties_as_libstdcxx() {
        for &(n, levels, seed, sort, heap) in LIBSTDCXX {
            let p = values(n, levels, seed);
            let mut v = Vec::new();
            argsort_desc(&p, &mut v);
            assert_eq!(v, sort, "std::sort of n = {n}, {levels} levels");
            let mut h: Vec<u32> = (0..n as u32).collect();
            heap_sort(&mut h, &|a, b| p[a as usize] > p[b as usize]);
            assert_eq!(h, heap, "std::partial_sort of n = {n}, {levels} levels");
        }
    }

    #[test]
    fn softmax_sums_to_one_and_top_k_is_renormalized() {
        let logits: Vec<f32> = values(128, 1000, 9).iter().map(|v| v - 60.0).collect();
        let mut probs = Vec::new();
        softmax(&logits, &mut probs);
        let total: f64 = probs.iter().map(|&p| p as f64).sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        let (mut order, mut sel, mut w) = (Vec::new(), [0u32; 8], [0f32; 8]);
        route(&logits, 8, &mut probs, &mut order, &mut sel, &mut w);
        // The experts of the eight largest logits, largest first.
        let mut by_logit: Vec<u32> = (0..128).collect();
        by_logit
            .sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        let mut want: Vec<u32> = by_logit[..8].to_vec();
        let mut got = sel.to_vec();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want);
        assert!(w.windows(2).all(|p| p[0] >= p[1]), "{w:?}");
        let s: f32 = w.iter().sum();
        assert!((s - 1.0).abs() < 1e-6, "{s}");
        // A tie between two routes keeps the lower index first (an
        // insertion sort below 17 experts).
        let tied = [0.5f32, 2.0, 1.0, 2.0, -1.0, 0.0, 0.0, 0.0];
        let mut sel2 = [0u32; 2];
        let mut w2 = [0f32; 2];
        route(&tied, 2, &mut probs, &mut order, &mut sel2, &mut w2);
        assert_eq!(sel2, [1, 3]);
        assert_eq!(w2, [0.5, 0.5]);
    }

    /// ggml's softmax: the 16-lane body through `v_expf`, the tail through
    /// `expf`, one `1 / sum` in f64 rounded to f32.
    #[test]
    fn softmax_follows_ggml_steps() {
        let x: Vec<f32> = values(21, 100, 3).iter().map(|v| v * 0.9 - 3.0).collect();
        let mut p = Vec::new();
        softmax(&x, &mut p);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| if i < 16 { v_expf(v - max) } else { (v - max).exp() })
            .collect();
        let mut sum = reduce16(&e[..16].try_into().unwrap()) as f64;
        for &v in &e[16..] {
            sum += v as f64;
        }
        let scale = (1.0 / sum) as f32;
        for (i, (&p, &e)) in p.iter().zip(&e).enumerate() {
            assert_eq!(p.to_bits(), (e * scale).to_bits(), "{i}");
        }
    }
}
