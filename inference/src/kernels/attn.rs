//! Attention and SwiGLU as llama.cpp's CPU backend computes them
//! (`ggml/src/ggml-cpu/ops.cpp`, `ggml_compute_forward_flash_attn_ext_f16`;
//! `vec.h`/`vec.cpp`), bit for bit, so greedy decoding reproduces its tokens.
//!
//! llama.cpp runs flash attention on the CPU (f16 KV cache) and takes one of
//! two paths per evaluated batch, by the number of query rows of the batch:
//!
//! - [`Mode::Vec`] (`..._f16_one_chunk`), fewer than [`TILE`] rows: decode,
//!   and prompts shorter than 64 tokens. Per query: the query rounded to f16;
//!   each score a `ggml_vec_dot_f16` (four 16-lane partial sums, a fixed
//!   reduction, summed in f64), scaled; an online softmax with the C
//!   library's `expf` per key; the weighted values accumulated in an f16
//!   vector (`ggml_vec_mad_f16`, `ggml_vec_scale_f16`); `S = S·ms + vs`
//!   fused.
//! - [`Mode::Tiled`] (`..._tiled`), batches of 64 rows or more: f32
//!   throughout. Keys in tiles of 64 from position 0; per tile each score is
//!   a sequential fused-multiply-add chain over the head (`simd_gemm`), the
//!   running max moves per tile (`expf` rescale), the tile's exponentials
//!   are ggml's vector `expf` summed per 16 lanes (`_mm512_reduce_add_ps`)
//!   into an f64, and each output element is a sequential fma chain over the
//!   tile's keys.
//!
//! Both depend on nothing but the query row and the cached keys and values,
//! so how a prompt is cut into chunks, or spread over threads, never changes
//! a number; but the two paths give different numbers for the same
//! position, which is why a session remembers the mode of every cached
//! position (`engine.rs`). Which batches a prompt is evaluated in, and so
//! each position's path, is [`Prompt`]'s: llama-server's.
//!
//! Every function here has a portable version that defines the numbers and,
//! on AVX-512, a SIMD version bit-identical to it (`x86.rs`, tested below).

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::kv::{KvType, QK};

/// llama.cpp's flash-attention tile (`GGML_FA_TILE_Q`, `GGML_FA_TILE_KV`):
/// the tiled path runs for batches of at least this many rows, over keys in
/// tiles of this many.
pub(crate) const TILE: usize = 64;

/// Keys `at[from..]` of a tile, transposed into `kt` (`kt[d · TILE + t]`)
/// one value at a time: the keys past the register transposes of
/// `x86::tiled_load` and `avx2::tiled_load`.
pub(super) fn transpose_tail(kc: &[f16], at: &[usize], from: usize, hd: usize, kt: &mut [f32]) {
    for (t, &a) in at.iter().enumerate().skip(from) {
        for (d, k) in kc[a..a + hd].iter().enumerate() {
            kt[d * TILE + t] = k.to_f32();
        }
    }
}

/// llama.cpp's physical batch (`n_ubatch`, default 512): a longer prompt is
/// evaluated in batches of this many tokens.
pub(crate) const UBATCH: usize = 512;

/// Largest head size the attention kernels take.
pub(crate) const MAX_HEAD: usize = 256;

/// Which of llama.cpp's flash-attention paths computes a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One query at a time, f16 query and accumulator (`_one_chunk`).
    Vec,
    /// 64×64 tiles in f32 (`_tiled`).
    Tiled,
}

impl Mode {
    /// The path llama.cpp takes for a batch of `n` query rows.
    pub(crate) fn for_batch(n: usize) -> Mode {
        if n >= TILE {
            Mode::Tiled
        } else {
            Mode::Vec
        }
    }
}

/// How llama.cpp computes a position: its attention path, and the two
/// choices of its matrix products whose numbers depend on the batch the
/// position was evaluated in:
///
/// - `grouped`: ggml's repacked Q4_K `gemm` takes four columns at a time and
///   rounds per 64 values, where its one-column `gemv` rounds per 256;
/// - `wide`: a product of 8 columns or more takes ggml's tiled K-quant
///   kernel (Q6_K, Q5_K, Q4_K not repacked), which rounds once per
///   super-block, where `vec_dot` keeps eight lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    pub(crate) attn: Mode,
    pub(crate) grouped: bool,
    pub(crate) wide: bool,
}

/// Columns from which ggml's matrix product takes its tiled K-quant kernel
/// (`ggml_tiled_min_batch`).
pub(crate) const WIDE: usize = 8;

impl Route {
    /// A generated token: one query, one column.
    #[cfg(test)]
    pub(crate) const DECODE: Route = Route { attn: Mode::Vec, grouped: false, wide: false };
}

/// How many tokens before a prompt's end llama-server ends a batch when the
/// model has sliding-window layers: `checkpoint_offsets` in llama.cpp's
/// `tools/server/server-context.cpp` (`4 + n_ubatch` and 4, in this order),
/// so that it can checkpoint the window's cache there.
const CHECKPOINT_OFFSETS: [usize; 2] = [4 + UBATCH, 4];

/// The physical batches in which llama.cpp evaluates a prompt from an empty
/// cache, as `llama-server` (which `llama-cli` runs too) feeds it: batches of
/// [`UBATCH`] from the start; and, for a model with sliding-window layers
/// (llama.cpp's `n_swa > 0`: gemma2, gemma3), also a batch ending 4 tokens
/// before the end and, past [`UBATCH`] + 4 tokens, one ending `UBATCH` + 4
/// before it, after which the server checkpoints the window's cache. A
/// 21-token gemma3 prompt is thus two batches, 17 tokens and 4; a position's
/// numbers depend on its batch ([`Route`]), enough to change gemma3's greedy
/// tokens, so the engine evaluates a prompt in the same batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prompt {
    len: usize,
    /// Whether the model has sliding-window layers (the server's batch
    /// ends at [`CHECKPOINT_OFFSETS`]).
    checkpoints: bool,
}

impl Prompt {
    pub(crate) fn new(len: usize, checkpoints: bool) -> Prompt {
        Prompt { len, checkpoints }
    }

    /// The physical batch that computes position `p` (`p < len`).
    pub(crate) fn batch(&self, p: usize) -> std::ops::Range<usize> {
        // The ends of the server's batches before the last, in order; each
        // batch is cut into physical batches of `UBATCH` from its start.
        let ends = CHECKPOINT_OFFSETS
            .map(|o| self.len.checked_sub(o).filter(|&e| e > 0 && self.checkpoints));
        let (mut start, mut end) = (0, self.len);
        for e in ends.into_iter().flatten() {
            if p < e {
                end = e;
                break;
            }
            start = e;
        }
        let b = start + (p - start) / UBATCH * UBATCH;
        b..(b + UBATCH).min(end)
    }

    /// The path of position `p`: that of its physical batch ([`thresholds`]).
    pub(crate) fn route(&self, p: usize) -> Route {
        let b = self.batch(p);
        let (grouped, wide) = thresholds(&b);
        Route { attn: Mode::for_batch(b.len()), grouped: p < grouped, wide: p < wide }
    }
}

/// The route of a physical batch over positions `b`, as the thresholds the
/// forward pass takes (`model::Seq`): its positions below the first are
/// grouped — columns go in groups of four, the rest one by one, so all but
/// the batch's last `len % 4` — and below the second wide — all of them in
/// a batch of [`WIDE`] tokens or more, none otherwise.
pub(crate) fn thresholds(b: &std::ops::Range<usize>) -> (usize, usize) {
    let n = b.len();
    (b.end - n % 4, if n >= WIDE { b.end } else { b.start })
}

/// ggml's AVX-512 `expf` (`ggml_v_expf`, max error 1.45 ulp + 0.5), one lane.
#[inline]
pub(crate) fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3FB8_AA3B), r); // 0x1.715476p+0
    let n = z - r;
    if n.abs() > 192.0 {
        // ggml's blend: infinity above, zero below (and for -inf).
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let b = (-n).mul_add(f32::from_bits(0x35BF_BE8E), (-n).mul_add(f32::from_bits(0x3F31_7200), x));
    let u = b * b;
    let j = f32::from_bits(0x3C07_2010)
        .mul_add(b, f32::from_bits(0x3D2B_9F17))
        .mul_add(u, f32::from_bits(0x3E2A_AF33).mul_add(b, f32::from_bits(0x3EFF_FEDB)))
        .mul_add(u, f32::from_bits(0x3F7F_FFF6).mul_add(b, 1.0));
    scalef(j, n)
}

/// `j · 2^n` rounded once, as `_mm512_scalef_ps` (|n| ≤ 192, integral).
#[inline]
fn scalef(j: f32, n: f32) -> f32 {
    // Exact in f64 (24-bit mantissa, |exponent| < 400); one rounding to f32.
    let p = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (j as f64 * p) as f32
}

/// `act(g) · u`: the feed-forward block's gated activation.
pub(crate) fn glu(act: crate::arch::Act, g: &[f32], u: &[f32], out: &mut [f32]) {
    match act {
        crate::arch::Act::SwiGlu => swiglu(g, u, out),
        crate::arch::Act::GeGlu => geglu(g, u, out),
    }
}

/// `silu(g) · u` as ggml's `ggml_vec_swiglu_f32`: 16 lanes at a time with
/// `x / (1 + ggml_v_expf(0 - x))`, the rest with the C library's `expf`.
pub(crate) fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = out.len().min(g.len()).min(u.len());
    let body = n / 16 * 16;
    #[cfg(target_arch = "x86_64")]
    {
        if super::isa() == super::Isa::Avx512Vnni {
            // SAFETY: the CPU has the features (`isa`).
            unsafe { super::x86::swiglu(&g[..body], &u[..body], &mut out[..body]) };
            swiglu_tail(&g[body..n], &u[body..n], &mut out[body..n]);
            return;
        }
        if super::isa().avx2() {
            // SAFETY: the CPU has the features (`isa`).
            unsafe { super::avx2::swiglu(&g[..body], &u[..body], &mut out[..body]) };
            swiglu_tail(&g[body..n], &u[body..n], &mut out[body..n]);
            return;
        }
    }
    swiglu_scalar(&g[..body], &u[..body], &mut out[..body]);
    swiglu_tail(&g[body..n], &u[body..n], &mut out[body..n]);
}

pub(crate) fn swiglu_scalar(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + v_expf(0.0 - g)) * u;
    }
}

fn swiglu_tail(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// ggml's `ggml_gelu_f32` (tanh approximation), as GCC compiles it for the
/// CPU backend: `1 + a·x·x` contracted into one fused multiply-add.
fn gelu_f32(x: f32) -> f32 {
    const A: f32 = 0.044715;
    const S: f32 = 0.797_884_6;
    let inner = (A * x).mul_add(x, 1.0);
    (0.5 * x) * (1.0 + (S * x * inner).tanh())
}

/// ggml's `ggml_table_gelu_f16`: GELU of every f16 value, rounded to f16
/// (65,536 entries; one more, zero, lets a 4-byte gather read the last).
fn gelu_table() -> &'static [f16] {
    static T: std::sync::OnceLock<Vec<f16>> = std::sync::OnceLock::new();
    let t = T.get_or_init(|| {
        let mut t: Vec<f16> =
            (0..=u16::MAX).map(|i| f16::from_f32(gelu_f32(f16::from_bits(i).to_f32()))).collect();
        t.push(f16::ZERO);
        t
    });
    &t[..65536]
}

/// [`gelu_table`] with its padding entry, as bits (for the SIMD gather).
#[cfg(target_arch = "x86_64")]
fn gelu_table_padded() -> &'static [u16] {
    let t = gelu_table();
    // SAFETY: `gelu_table` returns the first 65,536 entries of a Vec of
    // 65,537 that lives for the program; f16 and u16 share size and layout.
    unsafe { std::slice::from_raw_parts(t.as_ptr() as *const u16, 65537) }
}

/// ggml's GELU of one value (GGML_GELU_FP16): 0 below −10, the value
/// above 10, else the table `t` ([`gelu_table`]) at it rounded to f16.
#[inline(always)]
pub(crate) fn gelu_at(t: &[f16], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        t[f16::from_f32(x).to_bits() as usize].to_f32()
    }
}

/// `gelu(g) · u` as ggml's `ggml_vec_geglu_f32` (GGML_GELU_FP16): 0 below
/// −10 (whatever `u`), `g · u` above 10, else the f16 table at `g` rounded
/// to f16, times `u`.
pub(crate) fn geglu(g: &[f32], u: &[f32], out: &mut [f32]) {
    let t = gelu_table();
    for ((o, &x), &u) in out.iter_mut().zip(g).zip(u) {
        *o = if x <= -10.0 { 0.0 } else { gelu_at(t, x) * u };
    }
}

/// `gelu(x + bias)` as ggml's `ggml_add` then `ggml_vec_gelu_f32`
/// (GGML_GELU_FP16): 0 below −10, the value above 10, else the f16 table
/// at it (the encoders' feed-forward).
pub(crate) fn gelu_biased(x: &[f32], bias: Option<&[f32]>, out: &mut [f32]) {
    assert!(x.len() == out.len() && bias.is_none_or(|b| b.len() == out.len()));
    // Values done 16 at a time on AVX-512; the rest one by one.
    #[cfg(target_arch = "x86_64")]
    let done = if super::isa() == super::Isa::Avx512Vnni {
        let n = out.len() / 16 * 16;
        let b = bias.map(|b| &b[..n]);
        // SAFETY: the CPU has the features (`isa`); equal lengths, a
        // multiple of 16; the padded table has 65,537 entries.
        unsafe { super::x86::gelu_biased(&x[..n], b, gelu_table_padded(), &mut out[..n]) };
        n
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    let t = gelu_table();
    for i in done..out.len() {
        out[i] = gelu_at(t, bias.map_or(x[i], |b| x[i] + b[i]));
    }
}

/// A cache layout: position `t`'s vector for this head starts at
/// `t · stride + offset`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lane {
    pub(crate) stride: usize,
    pub(crate) offset: usize,
}

impl Lane {
    #[inline]
    fn at(&self, t: usize) -> usize {
        t * self.stride + self.offset
    }
}

/// `2^(i/32)` as f64 bits, less `i << 47` (the exponent bits the index adds
/// back): the table of glibc's `expf` (2^(k/32) for any k as
/// `tab[k % 32] + (k << 47)`), computed here from the definition (each
/// entry is 2^(i/32) correctly rounded).
pub(crate) const EXPF_TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// The constants of [`expf`]: 32/ln 2, the rounding shift 1.5·2^52, and
/// the cubic for 2^(r/32) - 1 (its coefficients over 32³, 32², 32).
pub(crate) const EXPF_INV_LN2_N: f64 = f64::from_bits(0x40471547652b82fe); // 0x1.71547652b82fep+0 · 32
pub(crate) const EXPF_SHIFT: f64 = f64::from_bits(0x4338000000000000); // 0x1.8p52
pub(crate) const EXPF_POLY: [f64; 3] = [
    f64::from_bits(0x3ebc6af84b912394), // 0x1.c6af84b912394p-5 / 32³
    f64::from_bits(0x3f2ebfce50fac4f3), // 0x1.ebfce50fac4f3p-3 / 32²
    f64::from_bits(0x3f962e42ff0c52d6), // 0x1.62e42ff0c52d6p-1 / 32
];

/// `expf` as the C library computes it, inline: the value of glibc's
/// `expf` (2.27 on; its FMA build, which x86-64 CPUs with FMA run) for
/// |x| < 88, every one of those 2.2·10⁹ inputs checked against it on this
/// machine (a table of 2^(k/32) and a cubic in double precision, the
/// scaled argument and its remainder each one fused multiply-add); larger
/// |x|, infinities and NaN go to the library itself. llama.cpp's one-query
/// attention calls `expf` per key; called through the library from a SIMD
/// loop, every live vector register is saved around each call.
#[inline(always)]
pub(crate) fn expf(x: f32) -> f32 {
    if (x.to_bits() >> 20) & 0x7ff >= 0x42b || cfg!(not(target_env = "gnu")) {
        return x.exp();
    }
    let xd = x as f64;
    let kd = EXPF_INV_LN2_N.mul_add(xd, EXPF_SHIFT);
    let ki = kd.to_bits();
    let kd = kd - EXPF_SHIFT;
    let r = EXPF_INV_LN2_N.mul_add(xd, -kd);
    let s = f64::from_bits(EXPF_TAB[(ki % 32) as usize].wrapping_add(ki << 47));
    let [c0, c1, c2] = EXPF_POLY;
    let z = c0.mul_add(r, c1);
    let y = c2.mul_add(r, 1.0);
    (z.mul_add(r * r, y) * s) as f32
}

/// llama.cpp's sum of 16 lanes (`_mm512_reduce_add_ps`: halves folded).
#[inline]
pub(crate) fn reduce16(l: &[f32; 16]) -> f32 {
    let a: [f32; 8] = std::array::from_fn(|i| l[i + 8] + l[i]);
    let b: [f32; 4] = std::array::from_fn(|i| a[i + 4] + a[i]);
    (b[0] + b[2]) + (b[1] + b[3])
}

/// The body of `ggml_vec_dot_f32` / `ggml_vec_dot_f16` (AVX-512 build) over
/// the first `n & !63` values of `a · b` (`n` the shorter length): four
/// 16-lane fma accumulators over 64-value steps, folded `(0+2)+(1+3)` and
/// reduced ([`reduce16`]). The caller adds the tail its way.
///
/// Every `mul_add` is one rounding whatever the CPU; with FMA the compiler
/// emits the instruction instead of the C library's `fmaf` (a call per
/// product: a mixture's f32 router took ~9% of a decode step that way).
pub(crate) fn dot64(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::isa().avx2() {
        // SAFETY: the CPU has AVX2 and FMA (`isa`).
        return unsafe { dot64_fma(a, b) };
    }
    dot64_body(a, b)
}

/// [`dot64_body`] compiled for FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot64_fma(a: &[f32], b: &[f32]) -> f32 {
    dot64_body(a, b)
}

#[inline(always)]
fn dot64_body(a: &[f32], b: &[f32]) -> f32 {
    let mut sum = [[0f32; 16]; 4];
    for (a, b) in a.chunks_exact(64).zip(b.chunks_exact(64)) {
        for (j, s) in sum.iter_mut().enumerate() {
            let (a, b) = (&a[16 * j..16 * j + 16], &b[16 * j..16 * j + 16]);
            for ((lane, &a), &b) in s.iter_mut().zip(a).zip(b) {
                *lane = a.mul_add(b, *lane);
            }
        }
    }
    let x0: [f32; 16] = std::array::from_fn(|l| (sum[0][l] + sum[2][l]) + (sum[1][l] + sum[3][l]));
    reduce16(&x0)
}

/// `ggml_vec_dot_f16` (AVX-512 build): four 16-lane fma accumulators over
/// 64-element steps, folded `(0+2)+(1+3)`, reduced, then the tail in f64.
#[inline]
fn dot_f16(q: &[f16], k: &[f16]) -> f32 {
    let n = q.len();
    let np = n & !63;
    let mut sum = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, s) in sum.iter_mut().enumerate() {
            for (l, lane) in s.iter_mut().enumerate() {
                let at = i + 16 * j + l;
                *lane = k[at].to_f32().mul_add(q[at].to_f32(), *lane);
            }
        }
    }
    let x0: [f32; 16] = std::array::from_fn(|l| (sum[0][l] + sum[2][l]) + (sum[1][l] + sum[3][l]));
    let mut s = reduce16(&x0) as f64;
    for i in np..n {
        s += (k[i].to_f32() * q[i].to_f32()) as f64;
    }
    s as f32
}

/// Most query heads [`attend_heads`] runs together over one KV head.
pub(crate) const GROUP: usize = 4;

/// [`attend_vec`] for the query heads of one KV head together: `q` and
/// `out` hold `q.len() / hd` heads (1 to [`GROUP`]) one after another; each
/// head's numbers are exactly its own [`attend_vec`]'s. On AVX-512 each key
/// and value row is then read and converted once for all of them, and their
/// dependency chains interleave.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_heads(
    q: &[f32],
    hd: usize,
    kc: &[f16],
    vc: &[f16],
    lane: Lane,
    from: usize,
    upto: usize,
    scale: f32,
    softcap: Option<f32>,
    out: &mut [f32],
) {
    assert!(hd > 0 && q.len().is_multiple_of(hd) && (1..=GROUP).contains(&(q.len() / hd)));
    assert!(hd <= MAX_HEAD && out.len() == q.len() && from <= upto);
    assert!(upto == 0 || lane.at(upto - 1) + hd <= kc.len().min(vc.len()));
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(16) && super::isa() == super::Isa::Avx512Vnni {
        let scale = softcap.map_or(scale, |c| scale / c);
        // SAFETY: the CPU has the features (`isa`); sizes asserted above.
        unsafe { super::x86::attend_heads(q, hd, kc, vc, lane, from, upto, scale, softcap, out) };
        return;
    }
    for (q, out) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        attend_vec(q, kc, vc, lane, from, upto, scale, softcap, out);
    }
}

/// Soft-capped scores (gemma2): each of `s`, already scaled over the cap,
/// becomes `cap · tanh(s)` with the C library's `tanhf`, as llama.cpp's
/// attention calls it per score. The vector paths gather a block's or a
/// tile's scores and call this on them.
pub(crate) fn soft_cap(s: &mut [f32], cap: f32) {
    s.iter_mut().for_each(|v| *v = cap * v.tanh());
}

/// [`Mode::Vec`] for one query over positions `from..upto` (a sliding
/// window starts at `from`; ggml skips the masked positions). With a
/// soft-cap (gemma2) each score is `cap · tanh(s · scale / cap)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_vec(
    q: &[f32],
    kc: &[f16],
    vc: &[f16],
    lane: Lane,
    from: usize,
    upto: usize,
    scale: f32,
    softcap: Option<f32>,
    out: &mut [f32],
) {
    assert!(q.len() <= MAX_HEAD && out.len() == q.len() && from <= upto);
    assert!(upto == 0 || lane.at(upto - 1) + q.len() <= kc.len().min(vc.len()));
    #[cfg(target_arch = "x86_64")]
    if q.len().is_multiple_of(16) {
        let (hd, cap) = (q.len(), softcap);
        let scale = softcap.map_or(scale, |c| scale / c);
        if super::isa() == super::Isa::Avx512Vnni {
            // SAFETY: the CPU has the features (`isa`); sizes asserted above.
            unsafe { super::x86::attend_heads(q, hd, kc, vc, lane, from, upto, scale, cap, out) };
            return;
        }
        if super::isa().avx2() {
            // SAFETY: the CPU has the features (`isa`); sizes asserted above.
            unsafe { super::avx2::attend_vec(q, kc, vc, lane, from, upto, scale, cap, out) };
            return;
        }
    }
    attend_vec_scalar(q, kc, vc, lane, from, upto, scale, softcap, out)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_vec_scalar(
    q: &[f32],
    kc: &[f16],
    vc: &[f16],
    lane: Lane,
    from: usize,
    upto: usize,
    scale: f32,
    softcap: Option<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    let mut qh = [f16::ZERO; MAX_HEAD];
    let mut acc = [f16::ZERO; MAX_HEAD];
    let (qh, acc) = (&mut qh[..hd], &mut acc[..hd]);
    qh.iter_mut().zip(q).for_each(|(h, &v)| *h = f16::from_f32(v));
    let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
    let scale = softcap.map_or(scale, |c| scale / c);
    for t in from..upto {
        let at = lane.at(t);
        let mut s = dot_f16(qh, &kc[at..at + hd]) * scale;
        if let Some(c) = softcap {
            s = c * s.tanh();
        }
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let old = m;
            m = s;
            ms = (old - m).exp();
            for v in acc.iter_mut() {
                *v = f16::from_f32(v.to_f32() * ms);
            }
        } else {
            vs = (s - m).exp();
        }
        for (a, v) in acc.iter_mut().zip(&vc[at..at + hd]) {
            *a = f16::from_f32(v.to_f32().mul_add(vs, a.to_f32()));
        }
        s_sum = s_sum.mul_add(ms, vs);
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, a) in out.iter_mut().zip(acc.iter()) {
        *o = a.to_f32() * inv;
    }
}

/// [`Mode::Vec`] over a block-type cache (`KvType::Q8_0`, `Q4_0`), as
/// llama.cpp's one-query path computes it for such a cache: the query
/// quantized to Q8_0 (`quantize_row_q8_0`), each score the type's
/// `vec_dot` with it (eight lanes of four products per block, each lane a
/// fused multiply-add of the block's two scales, folded as
/// `hsum_float_8`), the online softmax with the C library's `expf`, and
/// each value row converted to f32 (exact) and accumulated in f32
/// (`ggml_vec_mad_f32`). `q` and `out` hold 1 to [`GROUP`] heads of `hd`
/// values that share the KV head whose rows are `kc` and `vc` (position
/// `t` at `t · ty.bytes(hd)`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_quant(
    q: &[f32],
    hd: usize,
    ty: KvType,
    kc: &[u8],
    vc: &[u8],
    from: usize,
    upto: usize,
    scale: f32,
    softcap: Option<f32>,
    out: &mut [f32],
) {
    assert!(ty.is_quantized() && hd > 0 && hd <= MAX_HEAD && hd.is_multiple_of(QK));
    assert!(q.len().is_multiple_of(hd) && (1..=GROUP).contains(&(q.len() / hd)));
    assert!(out.len() == q.len() && from <= upto);
    let row = ty.bytes(hd);
    assert!(upto * row <= kc.len().min(vc.len()));
    #[cfg(target_arch = "x86_64")]
    if super::isa() == super::Isa::Avx512Vnni {
        let scale = softcap.map_or(scale, |c| scale / c);
        // SAFETY: the CPU has the features (`isa`); sizes asserted above.
        unsafe { super::x86::attend_quant(q, hd, ty, kc, vc, from, upto, scale, softcap, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::isa().avx2() {
        let scale = softcap.map_or(scale, |c| scale / c);
        for (q, out) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
            // SAFETY: the CPU has the features (`isa`); sizes asserted above.
            unsafe { super::avx2::attend_quant(q, ty, kc, vc, from, upto, scale, softcap, out) };
        }
        return;
    }
    for (q, out) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        attend_quant_scalar(q, ty, kc, vc, from, upto, scale, softcap, out);
    }
}

/// The Walsh–Hadamard rotations llama.cpp applies around a block-type
/// cache (`attn_rot_k`, `attn_rot_v` in `src/llama-kv-cache.cpp`): with
/// a quantized cache and heads whose size is a multiple of 64, queries and
/// keys are rotated in chunks of the largest power of two (from 64) that
/// divides the head size, values in chunks of 64, and the attention output
/// rotated back in chunks of 64; the rotation spreads a head's outlying
/// values over its chunk, so the blocks of 32 quantize it with less error.
/// Dot products are unchanged (the rotation is orthonormal), so the numbers
/// are attention's, as llama.cpp rounds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rotation {
    /// Chunk of the query and key rotation.
    pub(crate) k: usize,
    /// Chunk of the value and output rotation.
    pub(crate) v: usize,
}

impl Rotation {
    /// The rotation of a cache of type `ty` for heads of `hd`, if any.
    pub(crate) fn of(ty: KvType, hd: usize) -> Option<Rotation> {
        if !ty.is_quantized() || hd == 0 || !hd.is_multiple_of(64) {
            return None;
        }
        let mut k = 64;
        while hd.is_multiple_of(2 * k) {
            k *= 2;
        }
        Some(Rotation { k, v: 64 })
    }
}

/// Rotates `x` in place by the orthonormal Walsh–Hadamard matrix of its
/// length (a power of two), as ggml's `ggml_compute_forward_fwht` does: each
/// value scaled by `1/√n` first, then the butterflies `(u + v, u − v)` at
/// distances 1, 2, 4 … n/2.
pub(crate) fn fwht(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let scale = 1.0 / (n as f32).sqrt();
    x.iter_mut().for_each(|v| *v *= scale);
    let mut len = 1;
    while len < n {
        for i in (0..n).step_by(2 * len) {
            let (a, b) = x[i..i + 2 * len].split_at_mut(len);
            for (u, v) in a.iter_mut().zip(b.iter_mut()) {
                let (p, q) = (*u, *v);
                *u = p + q;
                *v = p - q;
            }
        }
        len *= 2;
    }
}

/// A query quantized to Q8_0 for [`attend_quant`]: values and each
/// block's scale (rounded to f16, as stored).
pub(crate) fn quantize_query(q: &[f32], qq: &mut [i8], qd: &mut [f32]) {
    for ((blk, o), d) in q.chunks_exact(QK).zip(qq.chunks_exact_mut(QK)).zip(qd.iter_mut()) {
        let (v, s, _) = crate::quant::quantize_block_q8(blk);
        o.copy_from_slice(&v);
        *d = s;
    }
}

/// Block `b`'s scale and 32 values of a Q8_0/Q4_0 row.
#[inline(always)]
pub(crate) fn kv_block(ty: KvType, row: &[u8], b: usize) -> (f32, [i8; QK]) {
    let blk = &row[b * ty.block_bytes()..(b + 1) * ty.block_bytes()];
    let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
    let mut v = [0i8; QK];
    match ty {
        KvType::Q4_0 => {
            for j in 0..QK / 2 {
                v[j] = (blk[2 + j] & 15) as i8 - 8;
                v[j + QK / 2] = (blk[2 + j] >> 4) as i8 - 8;
            }
        }
        _ => v.iter_mut().zip(&blk[2..]).for_each(|(o, &b)| *o = b as i8),
    }
    (d, v)
}

/// `ggml_vec_dot_q8_0_q8_0` / `ggml_vec_dot_q4_0_q8_0` (AVX2 build): per
/// block, eight lanes of four integer products, each lane
/// `fma(d_k · d_q, lane, acc)`; the lanes folded as `hsum_float_8`.
pub(crate) fn dot_kv_block(ty: KvType, k: &[u8], qq: &[i8], qd: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (b, (q, &dq)) in qq.chunks_exact(QK).zip(qd).enumerate() {
        let (dk, kv) = kv_block(ty, k, b);
        let d = dk * dq;
        for (j, a) in acc.iter_mut().enumerate() {
            let l: i32 = (4 * j..4 * j + 4).map(|e| kv[e] as i32 * q[e] as i32).sum();
            *a = d.mul_add(l as f32, *a);
        }
    }
    super::hsum8(&acc)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_quant_scalar(
    q: &[f32],
    ty: KvType,
    kc: &[u8],
    vc: &[u8],
    from: usize,
    upto: usize,
    scale: f32,
    softcap: Option<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    let (nb, row) = (hd / QK, ty.bytes(hd));
    let (mut qq, mut qd) = ([0i8; MAX_HEAD], [0f32; MAX_HEAD / QK]);
    let (qq, qd) = (&mut qq[..hd], &mut qd[..nb]);
    quantize_query(q, qq, qd);
    let mut acc = [0f32; MAX_HEAD];
    let acc = &mut acc[..hd];
    let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
    let scale = softcap.map_or(scale, |c| scale / c);
    for t in from..upto {
        let (k, v) = (&kc[t * row..(t + 1) * row], &vc[t * row..(t + 1) * row]);
        let mut s = dot_kv_block(ty, k, qq, qd) * scale;
        if let Some(c) = softcap {
            s = c * s.tanh();
        }
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let old = m;
            m = s;
            ms = expf(old - m);
            acc.iter_mut().for_each(|a| *a *= ms);
        } else {
            vs = expf(s - m);
        }
        for b in 0..nb {
            let (d, vals) = kv_block(ty, v, b);
            for (a, &x) in acc[b * QK..(b + 1) * QK].iter_mut().zip(&vals) {
                *a = (x as f32 * d).mul_add(vs, *a);
            }
        }
        s_sum = s_sum.mul_add(ms, vs);
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, a) in out.iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
}

/// One query of a [`Mode::Tiled`] batch: its vector and the positions it
/// sees, `from..upto` (`upto` is its own position + 1).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TiledRow<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) from: usize,
    pub(crate) upto: usize,
}

/// Buffers of the tiled path: a key tile transposed to f32
/// (`[head][TILE]`), the value tile in f32 (`[TILE][head]`), per-row
/// running max and sum.
#[derive(Debug, Default)]
pub(crate) struct TiledScratch {
    krow: Vec<f32>,
    at: Vec<usize>,
    kt: Vec<f32>,
    v32: Vec<f32>,
    m: Vec<f32>,
    s: Vec<f32>,
}

/// [`Mode::Tiled`] for queries that share one KV head (`lane`); row `r`'s
/// output goes to `out[r · head ..]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_tiled(
    rows: &[TiledRow<'_>],
    kc: &[f16],
    vc: &[f16],
    lane: Lane,
    scale: f32,
    softcap: Option<f32>,
    tile: &mut TiledScratch,
    out: &mut [f32],
) {
    let Some(first) = rows.first() else { return };
    let hd = first.q.len();
    assert!(out.len() >= rows.len() * hd && rows.iter().all(|r| r.q.len() == hd));
    let upto = rows.iter().map(|r| r.upto).max().unwrap_or(0);
    assert!(upto == 0 || lane.at(upto - 1) + hd <= kc.len().min(vc.len()));
    tile.krow.resize(hd, 0.0);
    tile.kt.resize(hd * TILE, 0.0);
    tile.v32.resize(TILE * hd, 0.0);
    tile.m.clear();
    tile.m.resize(rows.len(), f32::NEG_INFINITY);
    tile.s.clear();
    tile.s.resize(rows.len(), 0.0);
    out[..rows.len() * hd].iter_mut().for_each(|v| *v = 0.0);
    #[cfg(target_arch = "x86_64")]
    let simd = super::isa() == super::Isa::Avx512Vnni && hd % 16 == 0;
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    #[cfg(target_arch = "x86_64")]
    let simd2 = !simd && super::isa().avx2() && hd % 16 == 0;
    #[cfg(not(target_arch = "x86_64"))]
    let simd2 = false;
    let from = rows.iter().map(|r| r.from).min().unwrap_or(0);
    let scale = softcap.map_or(scale, |c| scale / c);
    let mut kqs = [[0f32; TILE]; 2];
    // Tiles of keys from position 0, as ggml's; tiles wholly before every
    // row's window are masked entirely and skipped.
    for c in (from / TILE * TILE..upto).step_by(TILE) {
        // The tile's keys transposed (`[head][TILE]`) and its values, in
        // f32 (exact); whole rows converted at once.
        let nk = TILE.min(upto - c);
        if simd || simd2 {
            tile.at.clear();
            tile.at.extend((c..c + nk).map(|t| lane.at(t)));
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has the features (`isa`: AVX-512 for `simd`,
            // AVX2 and F16C for `simd2`); `hd % 16 == 0`, every key's head
            // lies within the caches (asserted above), `kt` and `v32` hold
            // `hd · TILE` values.
            unsafe {
                let (at, kt, v32) = (&tile.at, &mut tile.kt, &mut tile.v32);
                if simd {
                    super::x86::tiled_load(kc, vc, at, hd, kt, v32)
                } else {
                    super::avx2::tiled_load(kc, vc, at, hd, kt, v32)
                }
            };
        } else {
            for t in 0..nk {
                let at = lane.at(c + t);
                kc[at..at + hd].convert_to_f32_slice(&mut tile.krow);
                for (row, &k) in tile.kt.chunks_exact_mut(TILE).zip(&tile.krow) {
                    row[t] = k;
                }
                vc[at..at + hd].convert_to_f32_slice(&mut tile.v32[t * hd..(t + 1) * hd]);
            }
        }
        // The keys of this tile row `x` sees: positions `lo..valid` of it,
        // `valid == 0` when it sees none.
        let seen = |x: &TiledRow<'_>| {
            if x.upto <= c || x.from >= c + TILE {
                (0, 0)
            } else {
                (x.from.saturating_sub(c), TILE.min(x.upto - c))
            }
        };
        let mut r = 0;
        while r < rows.len() {
            let row = &rows[r];
            let (lo, valid) = seen(row);
            if valid == 0 {
                r += 1;
                continue;
            }
            if simd {
                // The run of (up to four) rows from `r` that see the same
                // keys, through one pass over the tile.
                let n = rows[r..].iter().take(4).take_while(|x| seen(x) == (lo, valid)).count();
                let (m, s) = (&mut tile.m[r..r + n], &mut tile.s[r..r + n]);
                let acc = &mut out[r * hd..(r + n) * hd];
                let (kt, v32) = (&tile.kt[..], &tile.v32[..]);
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has the features (`isa`); every query
                // holds `hd` values (asserted above), a multiple of 16;
                // `kt` and `v32` hold `hd · TILE` values; `m`, `s` and
                // `acc` are the `n` rows'; `lo < valid <= TILE` (a row's
                // window ends after it starts).
                unsafe {
                    let q = |k: usize| rows[r + k].q;
                    macro_rules! group {
                        ($($k:literal),+) => {
                            super::x86::tiled_group([$(q($k)),+], kt, v32, (scale, softcap), (lo, valid), m, s, acc)
                        };
                    }
                    match n {
                        4 => group!(0, 1, 2, 3),
                        3 => group!(0, 1, 2),
                        2 => group!(0, 1),
                        _ => group!(0),
                    }
                }
                r += n;
                continue;
            }
            // On AVX2, the run of (up to two) rows from `r` that see the
            // same keys: their scores and values share each load of the
            // tile. Each row's operations are those of a row alone.
            let n = match simd2 {
                true => rows[r..].iter().take(2).take_while(|x| seen(x) == (lo, valid)).count(),
                false => 1,
            };
            if simd2 {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has the features (`isa`: AVX2 and F16C);
                // `kt` holds `hd · TILE` values, `v32` `TILE · hd`, `hd %
                // 16 == 0`; the queries hold `hd` values.
                unsafe {
                    let kt = &tile.kt[..];
                    if n == 2 {
                        super::avx2::tiled_scores([row.q, rows[r + 1].q], kt, scale, &mut kqs)
                    } else {
                        let one = <&mut [[f32; TILE]; 1]>::try_from(&mut kqs[..1]);
                        super::avx2::tiled_scores([row.q], kt, scale, one.expect("one row"))
                    }
                };
            } else {
                tiled_scores(row.q, &tile.kt, scale, &mut kqs[0]);
            }
            for (i, kq) in kqs.iter_mut().enumerate().take(n) {
                let acc = &mut out[(r + i) * hd..(r + i + 1) * hd];
                if let Some(cap) = softcap {
                    soft_cap(kq, cap);
                }
                kq[valid..].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                kq[..lo].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                let tile_max = kq[..valid].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let (m, s) = (&mut tile.m[r + i], &mut tile.s[r + i]);
                let mnew = m.max(tile_max);
                if mnew > *m {
                    let ms = (*m - mnew).exp();
                    acc.iter_mut().for_each(|v| *v *= ms);
                    *s *= ms;
                }
                *m = mnew;
                let sum = if simd2 {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above.
                    unsafe {
                        super::avx2::tiled_softmax(kq, mnew)
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    unreachable!()
                } else {
                    tiled_softmax(kq, mnew)
                };
                *s = (*s as f64 + sum) as f32;
                if !simd2 {
                    tiled_accumulate(&kq[..valid], &tile.v32, acc);
                }
            }
            if simd2 {
                let acc = &mut out[r * hd..(r + n) * hd];
                let v32 = &tile.v32[..];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above; `acc` holds the `n` rows' outputs and
                // `v32` at least `valid` rows of `hd` values.
                unsafe {
                    let p = |i: usize| &kqs[i][..valid];
                    if n == 2 {
                        super::avx2::tiled_accumulate([p(0), p(1)], v32, hd, acc)
                    } else {
                        super::avx2::tiled_accumulate([p(0)], v32, hd, acc)
                    }
                };
            }
            r += n;
        }
    }
    for (r, acc) in out[..rows.len() * hd].chunks_exact_mut(hd).enumerate() {
        let s = tile.s[r];
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        acc.iter_mut().for_each(|v| *v *= inv);
    }
}

/// Scores of `q` against the 64 keys of a transposed tile, each a
/// sequential fma chain over the head, then scaled (`simd_gemm`,
/// `ggml_vec_scale_f32`).
pub(crate) fn tiled_scores(q: &[f32], kt: &[f32], scale: f32, kq: &mut [f32; TILE]) {
    *kq = [0.0; TILE];
    for (d, &qd) in q.iter().enumerate() {
        let col = &kt[d * TILE..(d + 1) * TILE];
        for (s, &k) in kq.iter_mut().zip(col) {
            *s = k.mul_add(qd, *s);
        }
    }
    kq.iter_mut().for_each(|s| *s *= scale);
}

/// `ggml_vec_soft_max_f32` over a tile: `kq[i] = v_expf(kq[i] - max)`, the
/// sum of each 16 lanes reduced and added in f64.
pub(crate) fn tiled_softmax(kq: &mut [f32; TILE], max: f32) -> f64 {
    let mut sum = 0f64;
    for chunk in kq.chunks_exact_mut(16) {
        let mut e = [0f32; 16];
        for (e, x) in e.iter_mut().zip(chunk.iter_mut()) {
            *e = v_expf(*x - max);
            *x = *e;
        }
        sum += reduce16(&e) as f64;
    }
    sum
}

/// `acc[d] += Σ_t p[t] · v[t][d]`, one fma per key in key order
/// (`simd_gemm`).
pub(crate) fn tiled_accumulate(p: &[f32], v32: &[f32], acc: &mut [f32]) {
    let hd = acc.len();
    for (t, &pt) in p.iter().enumerate() {
        for (a, &v) in acc.iter_mut().zip(&v32[t * hd..(t + 1) * hd]) {
            *a = v.mul_add(pt, *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::rng;
    use crate::kernels::{isa, Isa};

    /// A block-type cache of `len` positions of `hd` random values, and
    /// the same values dequantized.
    fn quant_cache(
        ty: KvType,
        len: usize,
        hd: usize,
        seed: u64,
        spread: f32,
    ) -> (Vec<u8>, Vec<f32>) {
        let mut r = rng(seed);
        let mut raw = Vec::new();
        for _ in 0..len {
            let x: Vec<f32> =
                (0..hd).map(|_| ((r() % 2001) as f32 / 1000.0 - 1.0) * spread).collect();
            crate::kv::quantize_row(ty, &x, &mut raw);
        }
        let row = ty.bytes(hd);
        let mut deq = Vec::new();
        for t in 0..len {
            for b in 0..hd / QK {
                let (d, v) = kv_block(ty, &raw[t * row..(t + 1) * row], b);
                deq.extend(v.iter().map(|&x| x as f32 * d));
            }
        }
        (raw, deq)
    }

    /// The rotation is the Hadamard matrix (entries ±1/√n by the parity of
    /// i & j), is its own inverse, and sizes follow llama.cpp's rule.
    #[test]
    fn fwht_is_the_orthonormal_hadamard_rotation() {
        for n in [64usize, 128, 256] {
            let mut r = rng(n as u64);
            let x: Vec<f32> = (0..n).map(|_| (r() % 2001) as f32 / 1000.0 - 1.0).collect();
            let mut y = x.clone();
            fwht(&mut y);
            for (i, &yi) in y.iter().enumerate() {
                let want: f64 = (0..n)
                    .map(|j| if (i & j).count_ones() % 2 == 0 { x[j] as f64 } else { -x[j] as f64 })
                    .sum::<f64>()
                    / (n as f64).sqrt();
                assert!((yi as f64 - want).abs() < 1e-5, "n {n} [{i}]");
            }
            fwht(&mut y);
            assert!(y.iter().zip(&x).all(|(a, b)| (a - b).abs() < 1e-5));
        }
        assert_eq!(Rotation::of(KvType::Q8_0, 64), Some(Rotation { k: 64, v: 64 }));
        assert_eq!(Rotation::of(KvType::Q4_0, 256), Some(Rotation { k: 256, v: 64 }));
        assert_eq!(Rotation::of(KvType::Q8_0, 192), Some(Rotation { k: 64, v: 64 }));
        assert_eq!(Rotation::of(KvType::Q8_0, 96), None);
        assert_eq!(Rotation::of(KvType::F16, 128), None);
    }

    /// The AVX-512 quantized path gives the portable one's numbers to the
    /// bit, for every head size and group it takes.
    #[test]
    fn quantized_attention_simd_matches_scalar() {
        for ty in [KvType::Q8_0, KvType::Q4_0] {
            for hd in [32, 64, 96, 128, 256] {
                for heads in 1..=GROUP {
                    let len = 70;
                    let (kc, _) = quant_cache(ty, len, hd, 3 + hd as u64, 4.0);
                    let (vc, _) = quant_cache(ty, len, hd, 9 + heads as u64, 2.0);
                    let mut r = rng(hd as u64 * 7 + heads as u64);
                    let q: Vec<f32> = (0..heads * hd)
                        .map(|_| ((r() % 2001) as f32 / 1000.0 - 1.0) * 2.0)
                        .collect();
                    let spans = [(0, 1), (0, 33), (5, 70)];
                    for ((from, upto), cap) in
                        spans.into_iter().flat_map(|s| [(s, None), (s, Some(2.0))])
                    {
                        let mut got = vec![0f32; heads * hd];
                        attend_quant(&q, hd, ty, &kc, &vc, from, upto, 0.125, cap, &mut got);
                        let mut want = vec![0f32; heads * hd];
                        for (qh, o) in q.chunks_exact(hd).zip(want.chunks_exact_mut(hd)) {
                            attend_quant_scalar(qh, ty, &kc, &vc, from, upto, 0.125, cap, o);
                        }
                        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{ty} hd {hd} heads {heads} {from}..{upto} cap {cap:?}");
                    }
                }
            }
        }
    }

    /// The quantized path is attention: against softmax(q·k)·v in f64
    /// over the dequantized keys and values and the query as quantized.
    #[test]
    fn quantized_attention_is_attention() {
        for ty in [KvType::Q8_0, KvType::Q4_0] {
            for (hd, len, from) in [(64, 1, 0), (64, 37, 0), (128, 300, 10), (256, 5, 2)] {
                let (kc, kd) = quant_cache(ty, len, hd, 7 + len as u64, 3.0);
                let (vc, vd) = quant_cache(ty, len, hd, 11 + hd as u64, 2.0);
                let mut r = rng(5);
                let q: Vec<f32> = (0..hd).map(|_| (r() % 2001) as f32 / 1000.0 - 1.0).collect();
                let (mut qq, mut qd) = (vec![0i8; hd], vec![0f32; hd / QK]);
                quantize_query(&q, &mut qq, &mut qd);
                let qf: Vec<f64> = (0..hd).map(|i| qq[i] as f64 * qd[i / QK] as f64).collect();
                let scale = 1.0 / (hd as f32).sqrt();
                let s: Vec<f64> = (from..len)
                    .map(|t| {
                        (0..hd).map(|i| qf[i] * kd[t * hd + i] as f64).sum::<f64>() * scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = w.iter().sum();
                let mut out = vec![0f32; hd];
                attend_quant(&q, hd, ty, &kc, &vc, from, len, scale, None, &mut out);
                for i in 0..hd {
                    let want: f64 = w
                        .iter()
                        .enumerate()
                        .map(|(j, w)| w * vd[(from + j) * hd + i] as f64)
                        .sum::<f64>()
                        / z;
                    assert!(
                        (out[i] as f64 - want).abs() < 1e-4,
                        "{ty} hd {hd} len {len} [{i}]: {} vs {want}",
                        out[i]
                    );
                }
            }
        }
    }

    fn cache(len: usize, seed: u64, spread: f32) -> Vec<f16> {
        let mut r = rng(seed);
        (0..len)
            .map(|_| f16::from_f32(((r() % 20001) as f32 - 10000.0) / 10000.0 * spread))
            .collect()
    }

    fn vector(len: usize, seed: u64, spread: f32) -> Vec<f32> {
        let mut r = rng(seed);
        (0..len).map(|_| ((r() % 20001) as f32 - 10000.0) / 10000.0 * spread).collect()
    }

    /// Attention of one query (`q`, f32, RoPE'd) over positions `0..upto` of
    /// the caches in `mode`; writes the head's output to `out`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        mode: Mode,
        q: &[f32],
        kc: &[f16],
        vc: &[f16],
        lane: Lane,
        upto: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        match mode {
            Mode::Vec => attend_vec(q, kc, vc, lane, 0, upto, scale, None, out),
            Mode::Tiled => {
                let rows = [TiledRow { q, from: 0, upto }];
                let mut tile = TiledScratch::default();
                attend_tiled(&rows, kc, vc, lane, scale, None, &mut tile, out);
            }
        }
    }

    /// A plain f64 softmax-attention, to check both paths compute attention.
    fn reference(
        q: &[f32],
        kc: &[f16],
        vc: &[f16],
        lane: Lane,
        upto: usize,
        scale: f32,
    ) -> Vec<f64> {
        let hd = q.len();
        let s: Vec<f64> = (0..upto)
            .map(|t| {
                (0..hd).map(|d| q[d] as f64 * kc[lane.at(t) + d].to_f64()).sum::<f64>()
                    * scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let tot: f64 = w.iter().sum();
        (0..hd)
            .map(|d| (0..upto).map(|t| w[t] * vc[lane.at(t) + d].to_f64()).sum::<f64>() / tot)
            .collect()
    }

    #[test]
    fn v_expf_simd_matches_scalar_everywhere() {
        let mut xs: Vec<f32> = vector(4096, 5, 120.0);
        xs.extend([
            0.0, -0.0, 1.0, -1.0, 88.3, 88.4, 89.0, -87.0, -103.9, -104.0, -104.5, -110.0, -149.0,
            -200.0,
        ]);
        xs.extend([f32::NEG_INFINITY, f32::INFINITY, 1e-30, -1e-30, 200.0, -1000.0]);
        while !xs.len().is_multiple_of(16) {
            xs.push(0.5);
        }
        for &x in &xs {
            let e = v_expf(x);
            let want = (x as f64).exp();
            if x > -80.0 && x < 80.0 {
                assert!(((e as f64) - want).abs() <= want * 4e-7, "{x}: {e} vs {want}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if isa() == Isa::Avx512Vnni {
            // SAFETY: `isa()` reports AVX-512 VNNI only when the CPU has it.
            let simd = unsafe { crate::kernels::x86::v_expf_all(&xs) };
            for (x, s) in xs.iter().zip(simd) {
                assert_eq!(s.to_bits(), v_expf(*x).to_bits(), "v_expf({x})");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if isa().avx2() {
            // SAFETY: the CPU has AVX2 and FMA (`isa`).
            let simd = unsafe { crate::kernels::avx2::v_expf_all(&xs) };
            for (x, s) in xs.iter().zip(simd) {
                assert_eq!(s.to_bits(), v_expf(*x).to_bits(), "avx2 v_expf({x})");
            }
        }
    }

    /// The inline `expf` (scalar and 8-lane) is the C library's, bit for
    /// bit, on a sweep of every float's neighbourhood (every 61st bit
    /// pattern, both signs, and the edges of the inline range).
    #[test]
    fn inline_expf_is_the_c_librarys() {
        let mut xs: Vec<f32> = (0..u32::MAX / 61).map(|i| f32::from_bits(i * 61)).collect();
        xs.extend([0x42af_ffffu32, 0x42b0_0000, 0xc2af_ffff, 0xc2b0_0000].map(f32::from_bits));
        xs.extend([f32::NEG_INFINITY, f32::INFINITY, f32::NAN, -0.0, 0.0, -103.9, -88.0, 88.0]);
        for &x in &xs {
            let (a, b) = (x.exp(), expf(x));
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "expf({x:e}): {a:e} vs {b:e}"
            );
        }
        #[cfg(target_arch = "x86_64")]
        if isa() == Isa::Avx512Vnni {
            let mut ys = xs.clone();
            // SAFETY: `isa()` reports AVX-512 VNNI only when the CPU has it.
            unsafe { crate::kernels::x86::expf_lanes(&mut ys) };
            for (x, y) in xs.iter().zip(&ys) {
                let a = x.exp();
                assert!(
                    a.to_bits() == y.to_bits() || (a.is_nan() && y.is_nan()),
                    "lanes expf({x:e})"
                );
            }
        }
    }

    /// The query heads of one KV head run together give each head exactly
    /// its own one-query result, for every group size the kernel takes, the
    /// common head sizes, windows, an empty range and soft-capped scores
    /// (gemma2; a cap of 2 so that scores of a few units reach its bend).
    #[test]
    fn heads_together_are_each_head_alone() {
        // 96, 80, 48 and 16: a tail past the 64-value steps (all of it).
        for hd in [64usize, 128, 256, 96, 80, 48, 16] {
            let (kv_heads, len) = (2usize, 173usize);
            let kc = cache(len * kv_heads * hd, 7, 2.0);
            let vc = cache(len * kv_heads * hd, 8, 1.5);
            let lane = Lane { stride: kv_heads * hd, offset: hd };
            for (heads, cap) in (1..=GROUP).flat_map(|h| [(h, None), (h, Some(2.0))]) {
                let q = vector(heads * hd, heads as u64 + hd as u64, 3.0);
                for (from, upto) in [(0usize, len), (40, 100), (5, 5), (0, 1)] {
                    let mut together = vec![0f32; heads * hd];
                    attend_heads(&q, hd, &kc, &vc, lane, from, upto, 0.125, cap, &mut together);
                    for h in 0..heads {
                        let mut alone = vec![0f32; hd];
                        let qh = &q[h * hd..(h + 1) * hd];
                        attend_vec_scalar(qh, &kc, &vc, lane, from, upto, 0.125, cap, &mut alone);
                        assert_eq!(
                            &together[h * hd..(h + 1) * hd],
                            &alone[..],
                            "hd {hd}, {heads} heads, head {h}, {from}..{upto}, cap {cap:?}"
                        );
                        let mut one = vec![0f32; hd];
                        attend_vec(qh, &kc, &vc, lane, from, upto, 0.125, cap, &mut one);
                        assert_eq!(one, alone, "one head: hd {hd}, {from}..{upto}, cap {cap:?}");
                    }
                }
            }
        }
    }

    /// A sliding window (`from > 0`): the one-query paths agree with each
    /// other and with the exact attention over the window; the tiled path
    /// skips the keys before it.
    #[test]
    fn windowed_attention_sees_only_the_window() {
        let (hd, heads, len) = (64usize, 2usize, 300usize);
        let kc = cache(len * heads * hd, 3, 2.0);
        let vc = cache(len * heads * hd, 4, 1.5);
        let scale = 0.125;
        for (from, upto) in [(0usize, 10usize), (5, 10), (100, 300), (299, 300), (70, 130)] {
            let lane = Lane { stride: heads * hd, offset: hd };
            let q = vector(hd, from as u64 + 1, 3.0);
            let mut a = vec![0f32; hd];
            let mut b = vec![0f32; hd];
            attend_vec_scalar(&q, &kc, &vc, lane, from, upto, scale, None, &mut a);
            attend_vec(&q, &kc, &vc, lane, from, upto, scale, None, &mut b);
            assert_eq!(a, b, "vec {from}..{upto}");
            // The window alone, shifted to start at 0, is the same attention.
            let shift = lane.at(from) - lane.offset;
            let mut c = vec![0f32; hd];
            attend_vec_scalar(
                &q,
                &kc[shift..],
                &vc[shift..],
                lane,
                0,
                upto - from,
                scale,
                None,
                &mut c,
            );
            assert_eq!(a, c, "vec window {from}..{upto}");
            let rows = [TiledRow { q: &q, from, upto }];
            let mut t = vec![0f32; hd];
            attend_tiled(&rows, &kc, &vc, lane, scale, None, &mut TiledScratch::default(), &mut t);
            let want = reference(&q, &kc[shift..], &vc[shift..], lane, upto - from, scale);
            for d in 0..hd {
                assert!((t[d] as f64 - want[d]).abs() < 1e-4, "tiled {from}..{upto} {d}");
            }
        }
    }

    /// ggml's GELU table, as `ggml_cpu_init` fills it: the FNV-1a hash of
    /// the little-endian f16 values at every finite input of a llama.cpp
    /// build's `ggml_table_gelu_f16` (commit 0c1e570, dumped after
    /// `ggml_cpu_init`; NaN payloads are nobody's business).
    #[test]
    fn gelu_table_is_ggmls() {
        let t = gelu_table();
        assert_eq!(t.len(), 65536);
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let finite = t.iter().enumerate().filter(|(i, _)| f16::from_bits(*i as u16).is_finite());
        for b in finite.flat_map(|(_, v)| v.to_bits().to_le_bytes()) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        assert_eq!(h, 0xdd1e_e17e_273b_67fa, "the GELU table differs from ggml's");
        assert_eq!(gelu_table()[f16::from_f32(1.0).to_bits() as usize].to_f32(), 0.8413086);
        // The SIMD path (16 at a time, a tail of 7) equals the table
        // lookup, with and without a bias, across the ±10 ends.
        let xs = vector(4103, 10, 24.0);
        let bs = vector(4103, 11, 3.0);
        for bias in [None, Some(&bs[..])] {
            let mut got = vec![0f32; xs.len()];
            gelu_biased(&xs, bias, &mut got);
            for (i, g) in got.iter().enumerate() {
                let v = bias.map_or(xs[i], |b| xs[i] + b[i]);
                let want = gelu_at(t, v);
                assert_eq!(g.to_bits(), want.to_bits(), "gelu({v})");
            }
        }
        let g = vector(4096, 8, 14.0);
        let u = vector(4096, 9, 2.0);
        let mut out = vec![0f32; 4096];
        geglu(&g, &u, &mut out);
        for i in 0..4096 {
            let x = g[i] as f64;
            let want =
                0.5 * x * (1.0 + (0.7978845608 * (x + 0.044715 * x * x * x)).tanh()) * u[i] as f64;
            assert!(
                (out[i] as f64 - want).abs() < 1e-2 * (1.0 + want.abs()),
                "{i}: {} vs {want}",
                out[i]
            );
        }
    }

    #[test]
    fn swiglu_simd_matches_scalar() {
        let g = vector(1000, 11, 12.0);
        let u = vector(1000, 12, 3.0);
        let mut a = vec![0f32; 1000];
        let mut b = vec![0f32; 1000];
        swiglu(&g, &u, &mut a);
        swiglu_scalar(&g[..992], &u[..992], &mut b[..992]);
        swiglu_tail(&g[992..], &u[992..], &mut b[992..]);
        assert_eq!(a, b);
        for i in 0..1000 {
            let want = g[i] as f64 / (1.0 + (-g[i] as f64).exp()) * u[i] as f64;
            assert!((a[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()), "{i}");
        }
    }

    /// Both paths, SIMD and portable, bit-identical, and close to the exact
    /// attention; the tiled path does not depend on which rows share a call.
    #[test]
    fn attention_paths_simd_match_scalar() {
        for hd in [64usize, 128, 256, 48] {
            let (heads, len) = (3usize, 200usize);
            let kc = cache(len * heads * hd, hd as u64, 2.0);
            let vc = cache(len * heads * hd, hd as u64 + 1, 1.5);
            let scale = 1.0 / (hd as f32).sqrt();
            for (head, upto) in [(0usize, 1usize), (1, 63), (2, 64), (1, 65), (0, 130), (2, 200)] {
                let lane = Lane { stride: heads * hd, offset: head * hd };
                let q = vector(hd, upto as u64 * 7 + head as u64, 3.0);
                let want = reference(&q, &kc, &vc, lane, upto, scale);
                let mut vec_s = vec![0f32; hd];
                attend_vec_scalar(&q, &kc, &vc, lane, 0, upto, scale, None, &mut vec_s);
                let mut vec_d = vec![0f32; hd];
                attend_vec(&q, &kc, &vc, lane, 0, upto, scale, None, &mut vec_d);
                assert_eq!(vec_s, vec_d, "vec hd={hd} upto={upto}");
                let mut tiled = vec![0f32; hd];
                attend(Mode::Tiled, &q, &kc, &vc, lane, upto, scale, &mut tiled);
                for d in 0..hd {
                    assert!(
                        (vec_s[d] as f64 - want[d]).abs() < 2e-2,
                        "vec {d}: {} vs {}",
                        vec_s[d],
                        want[d]
                    );
                    assert!(
                        (tiled[d] as f64 - want[d]).abs() < 1e-4,
                        "tiled {d}: {} vs {}",
                        tiled[d],
                        want[d]
                    );
                }
                // The same row among others, through the portable kernels.
                let other = vector(hd, 99, 3.0);
                let rows = [
                    TiledRow { q: &other, from: 0, upto: 3 },
                    TiledRow { q: &q, from: 0, upto },
                    TiledRow { q: &other, from: 0, upto: 200 },
                ];
                let mut out = vec![0f32; 3 * hd];
                attend_tiled(
                    &rows,
                    &kc,
                    &vc,
                    lane,
                    scale,
                    None,
                    &mut TiledScratch::default(),
                    &mut out,
                );
                assert_eq!(&out[hd..2 * hd], &tiled[..], "tiled rows hd={hd} upto={upto}");
                let mut portable = vec![0f32; hd];
                tiled_portable(&q, &kc, &vc, lane, (0, upto), (scale, None), &mut portable);
                assert_eq!(portable, tiled, "tiled simd hd={hd} upto={upto}");
            }
        }
    }

    /// Many rows of one KV head — runs that see the same keys of a tile
    /// (one position's query heads, whole tiles inside every window) and
    /// rows that see other keys — each give what the portable kernels give
    /// it alone, bit for bit.
    #[test]
    fn tiled_rows_together_are_each_row_alone() {
        for hd in [64usize, 128, 48, 256] {
            let (heads, len) = (2usize, 300usize);
            let kc = cache(len * heads * hd, hd as u64 + 5, 2.0);
            let vc = cache(len * heads * hd, hd as u64 + 6, 1.5);
            let scale = 1.0 / (hd as f32).sqrt();
            let lane = Lane { stride: heads * hd, offset: hd };
            // (from, upto) per position; three query heads each.
            let spans: Vec<(usize, usize)> = (0..23)
                .map(|i| match i % 5 {
                    0 => (0, 1 + i * 13 % len),
                    1 => (i * 7 % 100, 150 + i),
                    2 => (0, 300),
                    3 => (63, 64 + i),
                    _ => (0, 64 * (1 + i % 4)),
                })
                .collect();
            let qs: Vec<Vec<f32>> =
                (0..spans.len() * 3).map(|i| vector(hd, 31 * i as u64 + hd as u64, 3.0)).collect();
            let rows: Vec<TiledRow<'_>> = qs
                .iter()
                .enumerate()
                .map(|(i, q)| TiledRow { q, from: spans[i / 3].0, upto: spans[i / 3].1 })
                .collect();
            // Without and with Gemma 2's soft cap (50: scores reach it).
            for softcap in [None, Some(50.0)] {
                let mut out = vec![0f32; rows.len() * hd];
                let mut tile = TiledScratch::default();
                attend_tiled(&rows, &kc, &vc, lane, scale, softcap, &mut tile, &mut out);
                for (i, row) in rows.iter().enumerate() {
                    let mut alone = vec![0f32; hd];
                    let span = (row.from, row.upto);
                    tiled_portable(row.q, &kc, &vc, lane, span, (scale, softcap), &mut alone);
                    let got = &out[i * hd..(i + 1) * hd];
                    assert_eq!(got, &alone[..], "hd={hd} row {i} softcap {softcap:?}");
                }
            }
        }
    }

    /// The tiled path through the portable kernels only.
    fn tiled_portable(
        q: &[f32],
        kc: &[f16],
        vc: &[f16],
        lane: Lane,
        (from, upto): (usize, usize),
        (scale, softcap): (f32, Option<f32>),
        out: &mut [f32],
    ) {
        let hd = q.len();
        let scale = softcap.map_or(scale, |c| scale / c);
        let mut kt = vec![0f32; hd * TILE];
        let mut v32 = vec![0f32; TILE * hd];
        let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
        out.iter_mut().for_each(|v| *v = 0.0);
        let mut kq = [0f32; TILE];
        for c in (from / TILE * TILE..upto).step_by(TILE) {
            let valid = TILE.min(upto - c);
            for t in 0..valid {
                for d in 0..hd {
                    kt[d * TILE + t] = kc[lane.at(c + t) + d].to_f32();
                    v32[t * hd + d] = vc[lane.at(c + t) + d].to_f32();
                }
            }
            tiled_scores(q, &kt, scale, &mut kq);
            if let Some(cap) = softcap {
                kq.iter_mut().for_each(|v| *v = cap * v.tanh());
            }
            kq[valid..].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
            kq[..from.saturating_sub(c)].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
            let mnew = m.max(kq[..valid].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)));
            if mnew > m {
                let ms = (m - mnew).exp();
                out.iter_mut().for_each(|v| *v *= ms);
                s *= ms;
            }
            m = mnew;
            s = (s as f64 + tiled_softmax(&mut kq, mnew)) as f32;
            tiled_accumulate(&kq[..valid], &v32, out);
        }
        let inv = 1.0 / s;
        out.iter_mut().for_each(|v| *v *= inv);
    }

    #[test]
    fn prompt_modes_follow_llama_cpp_batches() {
        let route = |p: usize, len: usize| Prompt::new(len, false).route(p);
        let mode = |p: usize, len: usize| route(p, len).attn;
        assert_eq!(mode(0, 37), Mode::Vec);
        assert_eq!(mode(36, 63), Mode::Vec);
        assert_eq!(mode(0, 64), Mode::Tiled);
        assert_eq!(mode(511, 540), Mode::Tiled);
        assert_eq!(mode(512, 540), Mode::Vec);
        assert_eq!(mode(512, 600), Mode::Tiled);
        // ggml's repacked gemm groups four columns; the rest go one by one.
        assert!(route(0, 7).grouped && route(3, 7).grouped);
        assert!(!route(4, 7).grouped && !route(6, 7).grouped);
        assert!(route(599, 600).grouped && !route(600, 601).grouped);
        assert!(!route(0, 1).grouped && !Route::DECODE.grouped);
        assert!(route(0, 8).wide && !route(0, 7).wide);
        assert!(route(511, 519).wide && !route(512, 519).wide);
        const { assert!(!Route::DECODE.wide) };
        let batch = |p: usize, len: usize| Prompt::new(len, false).batch(p);
        assert_eq!(
            (batch(0, 5), batch(1023, 1030), batch(1024, 1030)),
            (0..5, 512..1024, 1024..1030)
        );
    }

    /// With sliding-window layers, llama-server also ends a batch 4 tokens
    /// before the prompt's end, and `UBATCH` + 4 before that.
    #[test]
    fn sliding_window_prompts_take_the_servers_checkpoint_batches() {
        let batch = |p: usize, len: usize| Prompt::new(len, true).batch(p);
        let route = |p: usize, len: usize| Prompt::new(len, true).route(p);
        // Up to 4 tokens: one batch.
        assert_eq!((batch(0, 1), batch(3, 4)), (0..1, 0..4));
        assert_eq!((batch(0, 5), batch(1, 5), batch(4, 5)), (0..1, 1..5, 1..5));
        // The 21-token gemma3 prompt: 17 tokens (grouped but the last one,
        // wide), then 4 (grouped, not wide).
        assert_eq!((batch(16, 21), batch(17, 21)), (0..17, 17..21));
        assert!(route(15, 21).grouped && !route(16, 21).grouped && route(16, 21).wide);
        assert!(route(17, 21).grouped && route(20, 21).grouped && !route(17, 21).wide);
        // 100 tokens: the first 96 tiled, the last 4 by the one-query path.
        assert_eq!((route(95, 100).attn, route(96, 100).attn), (Mode::Tiled, Mode::Vec));
        assert_eq!(batch(516, 516), 512..516);
        assert_eq!((batch(0, 517), batch(1, 517), batch(513, 517)), (0..1, 1..513, 513..517));
        // 1200 tokens: 512, then 172 (to 1200 - 516), 512, 4.
        let ends: Vec<_> =
            [0, 511, 512, 683, 684, 1195, 1196, 1199].iter().map(|&p| batch(p, 1200)).collect();
        assert_eq!(
            ends,
            [0..512, 0..512, 512..684, 512..684, 684..1196, 684..1196, 1196..1200, 1196..1200]
        );
        // Past the server's 2048-token batches, still 512s from the start.
        assert_eq!(
            (batch(2047, 3000), batch(2048, 3000), batch(2483, 3000)),
            (1536..2048, 2048..2484, 2048..2484)
        );
        assert_eq!((batch(2484, 3000), batch(2996, 3000)), (2484..2996, 2996..3000));
    }
}
