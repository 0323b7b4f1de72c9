//! AVX2 kernels over row-major GGUF matrices (`rows.rs`), bit-identical to
//! the portable ones there: the same integer lanes (`vpmaddubsw` pairs
//! summed by `vpmaddwd`, as llama.cpp's AVX2 `ggml_vec_dot_*` form them)
//! and the same float steps in the same order.
//!
//! Each format is a [`Kern`], specialised at compile time; a call computes
//! `R` rows against `N` columns with its accumulators in registers: one row
//! of one column at a time when decoding (one prefetched weight stream;
//! paired formats two blocks per step, `Kern::dec`), one row against up to
//! eight columns on a short prompt, and on a wide one rows decoded once for
//! all columns (`Kern::wide`).
//! Also the attention, SwiGLU and softmax kernels of `attn.rs`.

// Register arrays are indexed in lock step; index loops read clearest here.
#![allow(clippy::needless_range_loop)]

use super::rows::{self, Fmt, RowMat};
use super::{hsum8, Acts, OutRows, WIDE_MIN};
use crate::quant::{QK, QK_K};
use std::arch::x86_64::*;

/// Whether this CPU runs these kernels.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Rows per call when the product has one column (decode).
const DEC_ROWS: usize = 1;

/// Columns up to which `Kern::dec` is tried on a product of several
/// (below `WIDE_MIN`, where a wide product takes over).
const MULTI_DEC: usize = WIDE_MIN - 1;

/// Columns `q4k_dec8` runs against one block read.
const DEC_COLS: usize = 4;
/// Columns per call on wider products.
const COLS: usize = 8;
/// Rows that share a group of columns (their weights stay in L1).
const ROW_BLOCK: usize = 16;

/// How far ahead of the block being read the kernels ask for memory.
const PF_DIST: usize = 1024;

/// How far ahead the one-column (decode) loops of paired rows ask for
/// memory: they stream faster than the prompt kernels, so further.
const DEC_PF: usize = 2048;

/// How far ahead the eight-row 512-bit decode kernels (`q4k_dec8_512`,
/// `q6k_dec8_512`) ask for each group's run of bytes. Measured on the 8B
/// file's decode (2 threads, Sapphire Rapids, huge pages): 1 KiB 5.5–6.2
/// tok/s, 2 KiB 4.8–5.3, 4–8 KiB 3.8–3.9 (lines requested that far ahead
/// hold L1's fill buffers while the nearer ones wait); a second, L2-only
/// prefetch further on gave nothing at 4–8 KiB (but see [`DEC8_PF_L2`]).
const DEC8_PF: usize = 1024;

/// How far ahead the same kernels also ask for each group's bytes into L2
/// only (`prefetcht1`): the lines are on their way from memory when the L1
/// prefetch at [`DEC8_PF`] asks for them, without holding L1's fill
/// buffers. Measured (2 threads, Sapphire Rapids, alternating runs): the 8B
/// file's decode 5.7–5.9 → 6.1–6.4 tok/s at 3 KiB (2 KiB: 5.9–6.1, 4 KiB
/// 5.7–6.0, 6–8 KiB 5.5–5.8), the 1B 34 → 35.5, the mixture 710–745 →
/// 815–870; the 135M and the dense twin of the mixture (whose weights stay
/// in the last-level cache) within noise.
const DEC8_PF_L2: usize = 3072;

/// Prefetches the `lines` cache lines of a run of bytes `DEC8_PF` ahead of
/// `p` into L1 and `DEC8_PF_L2` ahead into L2 (hints: never fault).
#[inline(always)]
fn prefetch_run(p: *const u8, lines: usize) {
    for l in 0..lines {
        prefetch(p.wrapping_add(DEC8_PF + 64 * l));
    }
    for l in 0..lines {
        // SAFETY: prefetch is a hint and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(DEC8_PF_L2 + 64 * l) as *const i8) };
    }
}

/// Hints the cache to fetch the line at `p` (never faults, any address).
#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: prefetch is a hint and never faults.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
}

/// One format's kernel: rows `r0..r0 + R` against columns `c0..c0 + N`.
trait Kern {
    /// Columns per call on wide products (what fits the registers).
    const COLS: usize = COLS;

    /// Rows per call on a decode (one column), at most 4.
    const DEC_ROWS: usize = DEC_ROWS;

    /// A product of many columns done another way (rows decoded once for
    /// all columns); `false` when the format has none.
    ///
    /// # Safety
    /// As [`Kern::run`].
    #[inline(always)]
    unsafe fn wide(
        _w: &RowMat,
        _acts: &Acts,
        _rows: std::ops::Range<usize>,
        _out: &OutRows<'_>,
    ) -> bool {
        false
    }

    /// A one-column product (decode) done another way (several rows in
    /// the lanes); `false` when the format has none.
    ///
    /// # Safety
    /// As [`Kern::run`].
    #[inline(always)]
    unsafe fn dec(
        _w: &RowMat,
        _acts: &Acts,
        _rows: std::ops::Range<usize>,
        _out: &OutRows<'_>,
    ) -> bool {
        false
    }

    /// [`Kern::dec`] of several ungrouped columns at once, each with the
    /// numbers it has alone; `false` when the format has none.
    ///
    /// # Safety
    /// As [`Kern::run`].
    #[inline(always)]
    unsafe fn dec_many(
        _w: &RowMat,
        _acts: &Acts,
        _rows: std::ops::Range<usize>,
        _out: &OutRows<'_>,
    ) -> bool {
        false
    }

    /// # Safety
    /// The CPU has avx2, fma and f16c; the rows and columns exist in `w`
    /// and `acts` (each kernel asserts its bounds).
    unsafe fn run<const R: usize, const N: usize>(
        w: &RowMat,
        acts: &Acts,
        r0: usize,
        c0: usize,
        out: &mut [[f32; N]; R],
    );
}

/// See `rows::matmul`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c (`available()`), and no other
/// thread reads or writes rows `rows` of `out` during the call.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matmul(
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    if matches!(w.fmt, Fmt::F16 | Fmt::BF16) {
        if super::isa() == super::Isa::Avx512Vnni && acts.n > 1 {
            // A prompt on AVX-512: sixteen-lane registers
            // (`rows::float_tiles`), one per sum. A decode streams the rows
            // with `float_matmul`'s prefetch either way (phi3-bench-f16 on
            // Sapphire Rapids: 77–79 tok/s here, 152–164 there; the prompt
            // 925–934 here, 700–725 there).
            // SAFETY: the rows are this call's (its contract).
            unsafe { super::rows::matmul(w, acts, rows, out) };
        } else {
            // SAFETY: the caller's features and rows.
            unsafe { float_matmul(w, acts, rows, out) };
        }
        return;
    }
    if w.fmt == Fmt::Q4K && !w.chain {
        // Rare: Q4_K with a row count ggml does not repack takes the
        // portable path (compiled here with AVX2 and FMA).
        // SAFETY: the rows are this call's (its contract).
        unsafe { super::rows::matmul(w, acts, rows, out) };
        return;
    }
    assert!(w.bytes().len() >= rows.end * w.row_bytes);
    // SAFETY: features checked by the caller; rows are within `w` (asserted)
    // and every kernel asserts the activation bounds of its columns.
    unsafe {
        match (w.fmt, w.chain) {
            (Fmt::Q8_0, _) => drive::<B32<0, false>>(w, acts, rows, out),
            (Fmt::Q4_0, false) => drive::<B32<1, false>>(w, acts, rows, out),
            (Fmt::Q4_0, true) => drive::<B32<1, true>>(w, acts, rows, out),
            (Fmt::Q5_0, _) => drive::<B32<2, false>>(w, acts, rows, out),
            (Fmt::Q4_1, _) => drive::<B32<3, false>>(w, acts, rows, out),
            (Fmt::Q5_1, _) => drive::<B32<4, false>>(w, acts, rows, out),
            (Fmt::Q4K, _) => drive::<Q4KChain>(w, acts, rows, out),
            (Fmt::Q5K, _) => drive::<Q5K>(w, acts, rows, out),
            (Fmt::Q6K, _) => drive::<Q6K>(w, acts, rows, out),
            (Fmt::Q3K, _) => drive::<Q3K>(w, acts, rows, out),
            (Fmt::Q2K, _) => drive::<Q2K>(w, acts, rows, out),
            (Fmt::F16 | Fmt::BF16, _) => unreachable!("handled above"),
        }
    }
}

/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// rows `rows` of `out` are the caller's (`OutRows::set`).
#[inline(always)]
unsafe fn drive<K: Kern>(w: &RowMat, acts: &Acts, rows: std::ops::Range<usize>, out: &OutRows<'_>) {
    // `R` rows from `r`, `N` columns from `c`, into `out`.
    macro_rules! call {
        ($r:expr, $c:expr, $R:literal, $N:literal) => {{
            let mut o = [[0f32; $N]; $R];
            K::run::<$R, $N>(w, acts, $r, $c, &mut o);
            for (i, row) in o.iter().enumerate() {
                for (j, v) in row.iter().enumerate() {
                    out.set($c + j, $r + i, *v);
                }
            }
        }};
    }
    // SAFETY: forwarded from `matmul`.
    unsafe {
        if acts.n == 1 {
            if K::dec(w, acts, rows.clone(), out) {
                return;
            }
            let mut r = rows.start;
            while r < rows.end {
                let m = (rows.end - r).min(K::DEC_ROWS);
                match m {
                    4 => call!(r, 0, 4, 1),
                    3 => call!(r, 0, 3, 1),
                    2 => call!(r, 0, 2, 1),
                    _ => call!(r, 0, 1, 1),
                }
                r += m;
            }
            return;
        }
        if acts.n >= WIDE_MIN && K::wide(w, acts, rows.clone(), out) {
            return;
        }
        // Ungrouped columns of a format whose decode kernel takes several
        // (weights read once for all of them).
        if acts.n <= MULTI_DEC && K::dec_many(w, acts, rows.clone(), out) {
            return;
        }
        // A block of rows against each group of columns in turn: the rows'
        // weights and the group's activations stay in L1 together.
        for rb in rows.clone().step_by(ROW_BLOCK) {
            let re = (rb + ROW_BLOCK).min(rows.end);
            let mut c = 0;
            while c < acts.n {
                let n = (acts.n - c).min(K::COLS);
                for r in rb..re {
                    match n {
                        8 => call!(r, c, 1, 8),
                        7 => call!(r, c, 1, 7),
                        6 => call!(r, c, 1, 6),
                        5 => call!(r, c, 1, 5),
                        4 => call!(r, c, 1, 4),
                        3 => call!(r, c, 1, 3),
                        2 => call!(r, c, 1, 2),
                        _ => call!(r, c, 1, 1),
                    }
                }
                c += n;
            }
        }
    }
}

/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels).
#[inline(always)]
unsafe fn hsum8_reg(v: __m256) -> f32 {
    let mut l = [0f32; 8];
    // SAFETY: eight floats stored into an eight-float array.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
    hsum8(&l)
}

/// [`hsum8`] of eight registers at once: lane `i` is `hsum8` of `a[i]`'s
/// lanes, bit for bit (the same additions of the same pairs in the same
/// order, lane by lane: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels).
#[inline(always)]
unsafe fn hsum8_x8(a: &[__m256; 8]) -> __m256 {
    // SAFETY: register arithmetic only.
    unsafe {
        // u(i) = [l0+l4, l1+l5, l2+l6, l3+l7] of a[i]; rows i, j in the
        // low and high halves.
        let u = |i: usize, j: usize| {
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(a[i], a[j]),
                _mm256_permute2f128_ps::<0x31>(a[i], a[j]),
            )
        };
        // [u0+u2, u1+u3] of two rows per half.
        let v = |x: __m256, y: __m256| {
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
                _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
            )
        };
        let lo = v(u(0, 1), u(2, 3));
        let hi = v(u(4, 5), u(6, 7));
        // Rows [0, 2, 4, 6 | 1, 3, 5, 7], then in order.
        let t = _mm256_hadd_ps(lo, hi);
        _mm256_permutevar8x32_ps(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

/// Runs `row(r)` (a row's eight-lane accumulator and its scalar offset)
/// for every row of `rows` and sets `hsum8(acc) + offset` in column 0,
/// the horizontal sums of eight rows at a time ([`hsum8_x8`]).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// rows `rows` of `out` are the caller's.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn decode_rows(
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
    mut row: impl FnMut(usize) -> (__m256, f32),
) {
    // SAFETY: forwarded (the caller's rows).
    unsafe {
        decode_rows_n::<1>(rows, 0, out, |r| {
            let (a, o) = row(r);
            ([a], [o])
        })
    }
}

/// [`decode_rows`] for columns `c0..c0 + N`: `row(r)` gives each column's
/// accumulator and offset.
///
/// # Safety
/// As [`decode_rows`]; the columns exist in `out`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn decode_rows_n<const N: usize>(
    rows: std::ops::Range<usize>,
    c0: usize,
    out: &OutRows<'_>,
    mut row: impl FnMut(usize) -> ([__m256; N], [f32; N]),
) {
    // SAFETY: register arithmetic and stores into local arrays; `out.set`
    // on rows of `rows`, which are the caller's.
    unsafe {
        let mut r0 = rows.start;
        while r0 < rows.end {
            let n = (rows.end - r0).min(8);
            let mut acc = [[_mm256_setzero_ps(); 8]; N];
            let mut off = [[0f32; 8]; N];
            for i in 0..n {
                let (a, o) = row(r0 + i);
                for j in 0..N {
                    (acc[j][i], off[j][i]) = (a[j], o[j]);
                }
            }
            for j in 0..N {
                let mut v = [0f32; 8];
                _mm256_storeu_ps(
                    v.as_mut_ptr(),
                    _mm256_add_ps(hsum8_x8(&acc[j]), _mm256_loadu_ps(off[j].as_ptr())),
                );
                for (i, &x) in v.iter().take(n).enumerate() {
                    out.set(c0 + j, r0 + i, x);
                }
            }
            r0 += n;
        }
    }
}

/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: register arithmetic only.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<1>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// The exact integer sums of eight registers, all at once: lane j is
/// `hsum_i32(s[j])` (integer additions, so their order does not matter).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels).
#[inline(always)]
unsafe fn hsum_i32_x8(s: &[__m256i]) -> __m256i {
    assert!(s.len() == 8);
    // SAFETY: register arithmetic only.
    unsafe {
        let a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        let b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(a, b),
            _mm256_permute2x128_si256::<0x31>(a, b),
        )
    }
}

/// An f16 at `p` as f32 (F16C).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// `p` points to two readable bytes.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: caller guarantees 2 readable bytes at p.
    unsafe {
        let bits = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

/// 32 nibbles of 16 bytes as 32 bytes: low nibbles first, then high
/// (ggml's `bytes_from_nibbles_32`).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// `p` points to 16 readable bytes.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes at p.
    unsafe {
        let t = _mm_loadu_si128(p as *const __m128i);
        let b = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
        _mm256_and_si256(b, _mm256_set1_epi8(0x0F))
    }
}

/// 32 bits to 32 bytes 0x00/0xFF (ggml's `bytes_from_bits_32`).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// `p` points to 4 readable bytes.
#[inline(always)]
unsafe fn bits(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 4 readable bytes at p.
    unsafe {
        let x = (p as *const u32).read_unaligned();
        let shuf = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let b = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
        let b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
        _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1))
    }
}

/// Eight lanes of four products: unsigned `u` × signed `s`.
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels).
#[inline(always)]
unsafe fn us_lanes(u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: register arithmetic only.
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
}

/// 0x10 at byte `j` where the high bit of value `j` is set, from a register
/// holding a Q5_0 pair's eight high-bit bytes four times (`rows::q5_pair`),
/// block a's bits in place (bit `4 + j / 8` of byte `j % 8`).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels).
#[inline(always)]
unsafe fn q5_high_of(q: __m256i) -> __m256i {
    // SAFETY: register arithmetic only.
    unsafe {
        let lane_bit = _mm256_setr_epi64x(
            0x1010_1010_1010_1010,
            0x2020_2020_2020_2020,
            0x4040_4040_4040_4040,
            0x8080_8080_8080_8080u64 as i64,
        );
        _mm256_min_epu8(_mm256_and_si256(q, lane_bit), _mm256_set1_epi8(0x10))
    }
}

/// A decode of paired Q5_0 rows against columns `c0..c0 + N`, a pair of
/// blocks per step: one 32-byte load gives both blocks' nibbles, one
/// broadcast their high bits, one conversion both scales, for all the
/// columns. Each column's lanes and fused multiply-adds are [`B32::run`]'s
/// (values + 16 less `Acts::g16`), block after block, so a column has the
/// numbers it has alone. `false` (nothing done) when the rows are not
/// paired or the columns have no `g16`.
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// rows `rows` of `out` are the caller's.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q5_decode_pairs<const N: usize>(
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    c0: usize,
    out: &OutRows<'_>,
) -> bool {
    let k = acts.k;
    let nb = k / QK;
    if !w.pairs() || !nb.is_multiple_of(2) || (c0 + N) * nb * 8 > acts.g16.len() {
        return false;
    }
    assert!((c0 + N) * k <= acts.q.len() && (c0 + N) * nb <= acts.d.len());
    assert!(w.row_bytes >= nb * 22);
    assert!(rows.end * w.row_bytes <= w.bytes().len());
    // SAFETY: every load is within the rows (asserted: nb/2 pairs of 44
    // bytes per row) or the columns' activations (asserted above).
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let second = _mm256_set1_epi32(1);
        decode_rows_n::<N>(rows, c0, out, |r| {
            let row = w.bytes().as_ptr().add(r * w.row_bytes);
            let mut acc = [_mm256_setzero_ps(); N];
            for p in 0..nb / 2 {
                let pp = row.add(p * rows::Q5_PAIR);
                prefetch(pp.wrapping_add(DEC_PF));
                let dw = _mm_cvtph_ps(_mm_cvtsi32_si128((pp as *const i32).read_unaligned()));
                let v = _mm256_loadu_si256(pp.add(12) as *const __m256i);
                let lo = _mm256_and_si256(v, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                let q = _mm256_set1_epi64x((pp.add(4) as *const i64).read_unaligned());
                let xa = _mm256_or_si256(_mm256_permute2x128_si256::<0x20>(lo, hi), q5_high_of(q));
                let xb = _mm256_or_si256(
                    _mm256_permute2x128_si256::<0x31>(lo, hi),
                    q5_high_of(_mm256_slli_epi16::<4>(q)),
                );
                for (j, acc) in acc.iter_mut().enumerate() {
                    let c = c0 + j;
                    // Both blocks' `d · d_a` in one conversion and one
                    // product (the same f32 products as one at a time).
                    let da = _mm_castsi128_ps(_mm_loadl_epi64(
                        acts.d.as_ptr().add(c * nb + 2 * p) as *const __m128i
                    ));
                    let s = _mm_mul_ps(dw, da);
                    let (sa, sb) = (
                        _mm256_broadcastss_ps(s),
                        _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), second),
                    );
                    let y = acts.q.as_ptr().add(c * k + 2 * p * QK) as *const __m256i;
                    let g = acts.g16.as_ptr().add((c * nb + 2 * p) * 8) as *const __m256i;
                    let la = _mm256_sub_epi32(
                        us_lanes(xa, _mm256_loadu_si256(y)),
                        _mm256_loadu_si256(g),
                    );
                    let lb = _mm256_sub_epi32(
                        us_lanes(xb, _mm256_loadu_si256(y.add(1))),
                        _mm256_loadu_si256(g.add(1)),
                    );
                    *acc = _mm256_fmadd_ps(sa, _mm256_cvtepi32_ps(la), *acc);
                    *acc = _mm256_fmadd_ps(sb, _mm256_cvtepi32_ps(lb), *acc);
                }
            }
            // `+ 0.0` as `B32::run` finishes a signed format's row.
            (acc, [0.0; N])
        });
    }
    true
}

/// Block `b` of a paired row at `row` (`RowMat::pairs`; `F` as [`B32`]):
/// its scale `d`, its minimum `m` (Q4_1, Q5_1; 0 else) and its 32 values
/// (Q5_0: plus 16, unsigned, as the decode lanes take them).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// the row holds block `b`'s pair; `F` is 0, 2, 3 or 4.
#[inline(always)]
pub(super) unsafe fn pair_block<const F: u8>(row: *const u8, b: usize) -> (f32, f32, __m256i) {
    let h = b % 2;
    // SAFETY: the pair of block b lies within the row (the caller's
    // contract), laid out as `rows::pair_blocks` says.
    unsafe {
        match F {
            0 => {
                let p = row.add((b / 2) * rows::Q8_PAIR);
                (f16_at(p.add(2 * h)), 0.0, _mm256_loadu_si256(p.add(4 + 32 * h) as *const __m256i))
            }
            2 => {
                let p = row.add((b / 2) * rows::Q5_PAIR);
                let q = _mm256_set1_epi64x((p.add(4) as *const i64).read_unaligned());
                let q = if h == 1 { _mm256_slli_epi16::<4>(q) } else { q };
                let x = _mm256_or_si256(nibbles(p.add(12 + 16 * h)), q5_high_of(q));
                (f16_at(p.add(2 * h)), 0.0, x)
            }
            3 => {
                let p = row.add((b / 2) * rows::Q4_1_PAIR);
                (f16_at(p.add(2 * h)), f16_at(p.add(4 + 2 * h)), nibbles(p.add(8 + 16 * h)))
            }
            4 => {
                let p = row.add((b / 2) * rows::Q5_1_PAIR);
                let q = _mm256_set1_epi64x((p.add(8) as *const i64).read_unaligned());
                let q = if h == 1 { _mm256_slli_epi16::<4>(q) } else { q };
                let x = _mm256_or_si256(nibbles(p.add(16 + 16 * h)), q5_high_of(q));
                (f16_at(p.add(2 * h)), f16_at(p.add(4 + 2 * h)), x)
            }
            _ => unreachable!("no pairs of format {F}"),
        }
    }
}

/// A decode (one column) of paired Q4_1 (`F` = 3) or Q5_1 (4) rows, a pair
/// of blocks per step: both scales and minimums converted at once, both
/// blocks' nibbles from one 32-byte load (Q5_1: their high bits from one
/// broadcast). The lanes, the fused multiply-adds and the `Σ m·s` chain
/// are [`B32::run`]'s, block after block. `false` (nothing done) when the
/// rows are not paired.
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// rows `rows` of `out` are the caller's.
#[inline(always)]
unsafe fn q4_1_decode_pairs<const F: u8>(
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) -> bool {
    let k = acts.k;
    let nb = k / QK;
    if !w.pairs() || !nb.is_multiple_of(2) {
        return false;
    }
    // Bytes of a pair, and the offset of its nibbles.
    let (pb, qs) = if F == 4 { (rows::Q5_1_PAIR, 16) } else { (rows::Q4_1_PAIR, 8) };
    assert!(F == 3 || F == 4);
    assert!(
        k <= acts.q.len() && nb <= acts.d.len().min(acts.s.len()) && w.row_bytes >= nb / 2 * pb
    );
    assert!(rows.end * w.row_bytes <= w.bytes().len());
    // SAFETY: every load is within the rows (asserted: nb/2 pairs of `pb`
    // bytes per row) or column 0's activations (asserted above).
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let second = _mm256_set1_epi32(1);
        decode_rows(rows, out, |r| {
            let row = w.bytes().as_ptr().add(r * w.row_bytes);
            let mut acc = _mm256_setzero_ps();
            // `Σ m·s` in lane 0, one scalar fused multiply-add a block.
            let mut summs = _mm_setzero_ps();
            for p in 0..nb / 2 {
                let pp = row.add(p * pb);
                prefetch(pp.wrapping_add(DEC_PF));
                // d_a d_b m_a m_b.
                let dm = _mm_cvtph_ps(_mm_loadl_epi64(pp as *const __m128i));
                let da =
                    _mm_castsi128_ps(_mm_loadl_epi64(acts.d.as_ptr().add(2 * p) as *const __m128i));
                let s = _mm_mul_ps(dm, da);
                let (sa, sb) = (
                    _mm256_broadcastss_ps(s),
                    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), second),
                );
                let v = _mm256_loadu_si256(pp.add(qs) as *const __m256i);
                let lo = _mm256_and_si256(v, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                let mut xa = _mm256_permute2x128_si256::<0x20>(lo, hi);
                let mut xb = _mm256_permute2x128_si256::<0x31>(lo, hi);
                if F == 4 {
                    let q = _mm256_set1_epi64x((pp.add(8) as *const i64).read_unaligned());
                    xa = _mm256_or_si256(xa, q5_high_of(q));
                    xb = _mm256_or_si256(xb, q5_high_of(_mm256_slli_epi16::<4>(q)));
                }
                let y = acts.q.as_ptr().add(2 * p * QK) as *const __m256i;
                let la = us_lanes(xa, _mm256_loadu_si256(y));
                let lb = us_lanes(xb, _mm256_loadu_si256(y.add(1)));
                acc = _mm256_fmadd_ps(sa, _mm256_cvtepi32_ps(la), acc);
                let ma = _mm_movehl_ps(dm, dm);
                let sm = acts.s.as_ptr().add(2 * p);
                summs = _mm_fmadd_ss(ma, _mm_load_ss(sm), summs);
                acc = _mm256_fmadd_ps(sb, _mm256_cvtepi32_ps(lb), acc);
                summs = _mm_fmadd_ss(_mm_movehdup_ps(ma), _mm_load_ss(sm.add(1)), summs);
            }
            (acc, _mm_cvtss_f32(summs))
        });
    }
    true
}

/// A decode (one column) of paired Q8_0 rows, a pair of blocks per step:
/// both scales converted and multiplied by the activations' in one
/// instruction each. The lanes (ggml's sign trick) and the fused
/// multiply-adds are [`B32::run`]'s, block after block. `false` (nothing
/// done) when the rows are not paired.
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// rows `rows` of `out` are the caller's.
#[inline(always)]
unsafe fn q8_decode_pairs(
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) -> bool {
    let k = acts.k;
    let nb = k / QK;
    if !w.pairs() || !nb.is_multiple_of(2) {
        return false;
    }
    assert!(k <= acts.q.len() && nb <= acts.d.len() && w.row_bytes >= nb * 34);
    assert!(rows.end * w.row_bytes <= w.bytes().len());
    // SAFETY: every load is within the rows (asserted: nb/2 pairs of 68
    // bytes per row) or column 0's activations (asserted above).
    unsafe {
        let second = _mm256_set1_epi32(1);
        decode_rows(rows, out, |r| {
            let row = w.bytes().as_ptr().add(r * w.row_bytes);
            let mut acc = _mm256_setzero_ps();
            for p in 0..nb / 2 {
                let pp = row.add(p * rows::Q8_PAIR);
                prefetch(pp.wrapping_add(DEC_PF));
                prefetch(pp.wrapping_add(DEC_PF + 64));
                let dw = _mm_cvtph_ps(_mm_cvtsi32_si128((pp as *const i32).read_unaligned()));
                let da =
                    _mm_castsi128_ps(_mm_loadl_epi64(acts.d.as_ptr().add(2 * p) as *const __m128i));
                let s = _mm_mul_ps(dw, da);
                let (sa, sb) = (
                    _mm256_broadcastss_ps(s),
                    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), second),
                );
                let xa = _mm256_loadu_si256(pp.add(4) as *const __m256i);
                let xb = _mm256_loadu_si256(pp.add(36) as *const __m256i);
                let y = acts.q.as_ptr().add(2 * p * QK) as *const __m256i;
                let (ya, yb) = (_mm256_loadu_si256(y), _mm256_loadu_si256(y.add(1)));
                let la = us_lanes(_mm256_sign_epi8(xa, xa), _mm256_sign_epi8(ya, xa));
                let lb = us_lanes(_mm256_sign_epi8(xb, xb), _mm256_sign_epi8(yb, xb));
                acc = _mm256_fmadd_ps(sa, _mm256_cvtepi32_ps(la), acc);
                acc = _mm256_fmadd_ps(sb, _mm256_cvtepi32_ps(lb), acc);
            }
            // `+ 0.0` as `B32::run` finishes a signed format's row.
            (acc, 0.0)
        });
    }
    true
}

/// Each column's 32 activation bytes at `p(j)` for a call of `R` rows:
/// loaded once for all rows when several rows share them; with one row left
/// to [`act_at`] (an array of them held in registers would spill).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// with `R > 1`, `p(j)` points to 32 readable bytes for every `j < N`.
#[inline(always)]
unsafe fn preload<const R: usize, const N: usize>(p: impl Fn(usize) -> *const i8) -> [__m256i; N] {
    // SAFETY: the caller's contract.
    std::array::from_fn(|j| unsafe {
        if R > 1 {
            _mm256_loadu_si256(p(j) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        }
    })
}

/// A column's activations from [`preload`]: `pre` when several rows share
/// them, else read at `p` where they are used.
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// with `R == 1`, `p` points to 32 readable bytes.
#[inline(always)]
unsafe fn act_at<const R: usize>(pre: __m256i, p: *const i8) -> __m256i {
    if R > 1 {
        pre
    } else {
        // SAFETY: the caller's contract (32 readable bytes at `p`).
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
}

/// Blocks of 32 with Q8_0/Q8_1 activations. `F`: 0 Q8_0, 1 Q4_0, 2 Q5_0
/// (signed values: ggml's sign trick), 3 Q4_1, 4 Q5_1 (unsigned, plus
/// `Σ m·s`); `CH`: the *chain* numerics (repacked Q4_0).
struct B32<const F: u8, const CH: bool>;

impl<const F: u8, const CH: bool> Kern for B32<F, CH> {
    // Q4_1/Q5_1 carry a second accumulator per column.
    const COLS: usize = if F >= 3 { 4 } else { COLS };

    #[inline(always)]
    unsafe fn wide(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        if CH {
            // Chain Q4_0 (rows in lanes, `q4_0_wide`) when the product
            // has its `Acts::off8`.
            // SAFETY: forwarded.
            return F == 1 && unsafe { q4_0_wide(w, acts, rows, out) };
        }
        // SAFETY: forwarded.
        unsafe { b32_wide::<F>(w, acts, rows, out) };
        true
    }

    #[inline(always)]
    unsafe fn dec(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        match F {
            // SAFETY: forwarded.
            0 => unsafe { q8_decode_pairs(w, acts, rows, out) },
            // SAFETY: forwarded.
            3 => unsafe { q4_1_decode_pairs::<3>(w, acts, rows, out) },
            // SAFETY: forwarded.
            4 => unsafe { q4_1_decode_pairs::<4>(w, acts, rows, out) },
            // SAFETY: forwarded.
            2 => !CH && unsafe { q5_decode_pairs::<1>(w, acts, rows, 0, out) },
            // SAFETY: forwarded.
            1 if CH => unsafe { q4_0_decode(w, acts, rows, out) },
            _ => false,
        }
    }

    #[inline(always)]
    unsafe fn dec_many(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        if F != 2 || CH || (0..acts.n).any(|c| acts.grouped(c)) {
            return false;
        }
        // Blocks of rows, each against the columns four at a time (a
        // chunk's accumulators stay in registers): a block's pairs come
        // from memory for the first chunk, from the cache for the others.
        for rb in rows.clone().step_by(ROW_BLOCK) {
            let block = rb..(rb + ROW_BLOCK).min(rows.end);
            let mut c = 0;
            while c < acts.n {
                let n = (acts.n - c).min(4);
                // SAFETY: forwarded; each call checks its columns' bounds.
                let done = unsafe {
                    match n {
                        4 => q5_decode_pairs::<4>(w, acts, block.clone(), c, out),
                        3 => q5_decode_pairs::<3>(w, acts, block.clone(), c, out),
                        2 => q5_decode_pairs::<2>(w, acts, block.clone(), c, out),
                        _ => q5_decode_pairs::<1>(w, acts, block.clone(), c, out),
                    }
                };
                if !done {
                    // Decided by the rows' layout and `g16`, the same for
                    // every call: nothing has been written yet.
                    debug_assert!(c == 0 && rb == rows.start);
                    return false;
                }
                c += n;
            }
        }
        true
    }

    #[inline(always)]
    unsafe fn run<const R: usize, const N: usize>(
        w: &RowMat,
        acts: &Acts,
        r0: usize,
        c0: usize,
        out: &mut [[f32; N]; R],
    ) {
        let k = acts.k;
        let nb = k / QK;
        let bb = [34, 18, 22, 20, 24][F as usize];
        let signed = F < 3;
        let at = w.at(r0, R);
        assert!(w.row_bytes >= nb * bb);
        assert!((c0 + N) * k <= acts.q.len() && (c0 + N) * nb <= acts.d.len().min(acts.s.len()));
        let u5 = F == 2 && !CH && (c0 + N) * nb * 8 <= acts.g16.len();
        // SAFETY: loads within the R rows (`at`), the N columns asserted
        // above and their `g16` lanes (checked in `u5`).
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); N]; R];
            let mut facc = [[0f32; N]; R];
            let base = w.bytes().as_ptr().add(at.base);
            let pairs = w.pairs();
            for b in 0..nb {
                for r in 0..R {
                    let blk = base.add(r * at.row + b * at.block);
                    prefetch(blk.wrapping_add(if N == 1 { DEC_PF } else { PF_DIST }));
                    let (dw, m, x) = if pairs {
                        let (dw, m, x) = pair_block::<F>(base.add(r * at.row), b);
                        (
                            dw,
                            m,
                            if F == 2 && !u5 {
                                _mm256_sub_epi8(x, _mm256_set1_epi8(16))
                            } else {
                                x
                            },
                        )
                    } else {
                        (
                            f16_at(blk),
                            if signed { 0.0 } else { f16_at(blk.add(2)) },
                            match F {
                                0 => _mm256_loadu_si256(blk.add(2) as *const __m256i),
                                1 => _mm256_sub_epi8(nibbles(blk.add(2)), _mm256_set1_epi8(8)),
                                // Q5_0 on a decode: the values as `x + 16`
                                // (unsigned, no sign trick), each lane later less
                                // its `16 · Σ a` (the same integers).
                                2 if u5 => {
                                    let hi =
                                        _mm256_and_si256(bits(blk.add(2)), _mm256_set1_epi8(0x10));
                                    _mm256_or_si256(nibbles(blk.add(6)), hi)
                                }
                                2 => {
                                    let hi = _mm256_andnot_si256(
                                        bits(blk.add(2)),
                                        _mm256_set1_epi8(0xF0u8 as i8),
                                    );
                                    _mm256_or_si256(nibbles(blk.add(6)), hi)
                                }
                                3 => nibbles(blk.add(4)),
                                _ => {
                                    let hi =
                                        _mm256_and_si256(bits(blk.add(4)), _mm256_set1_epi8(0x10));
                                    _mm256_or_si256(nibbles(blk.add(8)), hi)
                                }
                            },
                        )
                    };
                    let ax = if signed && !u5 { _mm256_sign_epi8(x, x) } else { x };
                    for j in 0..N {
                        let y = _mm256_loadu_si256(
                            acts.q.as_ptr().add((c0 + j) * k + b * QK) as *const __m256i
                        );
                        let da = *acts.d.get_unchecked((c0 + j) * nb + b);
                        let lanes = if u5 {
                            let g = acts.g16.as_ptr().add(((c0 + j) * nb + b) * 8);
                            _mm256_sub_epi32(
                                us_lanes(x, y),
                                _mm256_loadu_si256(g as *const __m256i),
                            )
                        } else {
                            let sy = if signed { _mm256_sign_epi8(y, x) } else { y };
                            us_lanes(ax, sy)
                        };
                        if CH {
                            let isum = hsum_i32(lanes);
                            facc[r][j] = (isum as f32).mul_add(dw * da, facc[r][j]);
                        } else {
                            acc[r][j] = _mm256_fmadd_ps(
                                _mm256_set1_ps(dw * da),
                                _mm256_cvtepi32_ps(lanes),
                                acc[r][j],
                            );
                            if !signed {
                                let sa = *acts.s.get_unchecked((c0 + j) * nb + b);
                                facc[r][j] = m.mul_add(sa, facc[r][j]);
                            }
                        }
                    }
                }
            }
            for r in 0..R {
                for j in 0..N {
                    out[r][j] = if CH { facc[r][j] } else { hsum8_reg(acc[r][j]) + facc[r][j] };
                }
            }
        }
    }
}

/// Chain Q4_0 rows against one column (a decode step), eight rows a
/// register, a row per lane, read as the matrix keeps them (each block of
/// a group of eight rows together, one stream): a block of eight rows is
/// four 16-byte loads into each of four registers (lane half h of
/// register i: row 4h + i's nibbles), transposed in place to four
/// bytes of a row per lane, low and high nibbles apart; eight `maddubs`
/// against the column's four activation bytes (broadcast) summed as i16
/// (sixteen products of at most 15 · 128: exact), one `madd`, less the
/// column's `8 · Σ a` (`Acts::off8`), give each row's exact `Σ (q − 8)
/// · a`; then `fma(isum, d · d_a, acc)` lane by lane, as `rows::dot` —
/// bit-identical, without a horizontal sum per row and block. `false`
/// (nothing written) when the column has no `off8`.
///
/// # Safety
/// The CPU has avx2, fma and f16c; rows `rows` of `out` are the caller's.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_decode(
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) -> bool {
    let k = acts.k;
    let nb = k / QK;
    let rb = w.row_bytes;
    if acts.n != 1 || acts.off8.len() < nb || w.fmt != Fmt::Q4_0 || w.group() != 8 {
        return false;
    }
    assert!(rb >= nb * 18 && k <= acts.q.len() && nb <= acts.d.len());
    // Whole groups of eight rows (ranges start at a group, `tile_align`;
    // chain matrices have rows in eights), as `q4_0_wide_in`.
    assert!(rows.start.is_multiple_of(8) && rows.end.is_multiple_of(8));
    // SAFETY: every load is within rows `rows` (asserted within the matrix)
    // or the column's activations (asserted); rows are the caller's.
    unsafe {
        let data = w.bytes().as_ptr();
        let q = acts.q.as_ptr();
        let ones = _mm256_set1_epi16(1);
        for r0 in rows.step_by(8) {
            // The group's blocks: block b of row r0 + r at `b·block + r·18`.
            let at = w.at(r0, 8);
            let (base, rs) = (data.add(at.base), at.row);
            let mut acc = _mm256_setzero_ps();
            for b in 0..nb {
                let blk = base.add(b * at.block);
                prefetch(blk.wrapping_add(DEC_PF));
                prefetch(blk.wrapping_add(DEC_PF + 64));
                prefetch(blk.wrapping_add(DEC_PF + 128));
                let (v, dw) = q4_0_group8(blk, rs);
                let a = q.add(b * QK);
                let mut s16 = _mm256_setzero_si256();
                for (j, &vj) in v.iter().enumerate() {
                    let aj = _mm256_set1_epi32((a.add(4 * j) as *const i32).read_unaligned());
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(vj, aj));
                }
                let off = _mm256_set1_epi32(*acts.off8.get_unchecked(b));
                let isum = _mm256_sub_epi32(_mm256_madd_epi16(s16, ones), off);
                let da = _mm256_set1_ps(*acts.d.get_unchecked(b));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da), acc);
            }
            let mut col = [0f32; 8];
            _mm256_storeu_ps(col.as_mut_ptr(), acc);
            out.set_run(0, r0, &col);
        }
    }
    true
}

/// Block `b` of a group of eight chain Q4_0 rows, at `blk` (the rows'
/// blocks `rs` bytes apart): register j, lane r holds row r's values 4j ..
/// 4j + 3 (unsigned nibbles: the low halves of its bytes 4j .. 4j + 3 for
/// j < 4, the high halves of bytes 4(j − 4) .. for j ≥ 4), and the rows'
/// scales. Four 16-byte loads into each of four registers (lane half h of
/// register i: row 4h + i), transposed in place.
///
/// # Safety
/// The CPU has avx2 and f16c; the eight blocks are readable.
#[inline(always)]
pub(super) unsafe fn q4_0_group8(blk: *const u8, rs: usize) -> ([__m256i; 8], __m256) {
    // SAFETY: the eight 18-byte blocks (the caller's contract).
    unsafe {
        let ld = |r: usize| _mm_loadu_si128(blk.add(r * rs + 2) as *const __m128i);
        let reg = |i: usize| _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(ld(i)), ld(4 + i));
        let (x0, x1, x2, x3) = (reg(0), reg(1), reg(2), reg(3));
        let t0 = _mm256_unpacklo_epi32(x0, x1);
        let t1 = _mm256_unpackhi_epi32(x0, x1);
        let t2 = _mm256_unpacklo_epi32(x2, x3);
        let t3 = _mm256_unpackhi_epi32(x2, x3);
        // g[j], lane r: bytes 4j .. 4j + 3 of row r's nibbles.
        let g = [
            _mm256_unpacklo_epi64(t0, t2),
            _mm256_unpackhi_epi64(t0, t2),
            _mm256_unpacklo_epi64(t1, t3),
            _mm256_unpackhi_epi64(t1, t3),
        ];
        let nib = _mm256_set1_epi8(0x0F);
        let lo = |j: usize| _mm256_and_si256(g[j], nib);
        let hi = |j: usize| _mm256_and_si256(_mm256_srli_epi16::<4>(g[j]), nib);
        let dh: [u16; 8] =
            std::array::from_fn(|r| (blk.add(r * rs) as *const u16).read_unaligned());
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr() as *const __m128i));
        ([lo(0), lo(1), lo(2), lo(3), hi(0), hi(1), hi(2), hi(3)], dw)
    }
}

/// Registers of eight rows per block of a decoded Q4_0 block of rows: eight
/// of values (register g: values 4g .. 4g + 3 of each row, unsigned
/// nibbles), one of scales (f32 bits).
const Q4W_SLOTS: usize = 9;
/// Columns met together by one pass over a decoded Q4_0 block of rows.
const Q4W_COLS: usize = 4;

thread_local! {
    /// Each thread's decoded Q4_0 block of rows for `q4_0_wide`.
    static Q4W: std::cell::RefCell<Vec<__m256i>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Chain Q4_0 rows (`rows.rs`) against many columns, eight rows at a time,
/// a row per lane: every block of a block of rows is decoded once into
/// scratch (four nibble bytes of a row per lane, low and high halves
/// apart, and the rows' scales), then the columns meet it four at a time
/// (more spill registers: six ran a 1B prompt at 0.8× the speed of four). Per block, register and column: eight `maddubs` of
/// the nibbles (unsigned) against the column's four activation bytes
/// (broadcast) summed as i16 (sixteen products of at most 15 · 128 each:
/// no overflow), one `madd` to i32 — the row's exact `Σ q · a` — less the
/// column's `8 · Σ a` (`Acts::off8`), then `fma(isum, d · d_a, acc)` as
/// `rows::dot` does: bit-identical. `false` (nothing written) when the
/// product has no `off8`.
///
/// # Safety
/// The CPU has avx2, fma and f16c; rows `rows` of `out` are the caller's.
#[inline(always)]
unsafe fn q4_0_wide(
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) -> bool {
    let nb = acts.k / QK;
    if acts.off8.len() < acts.n * nb || rows.is_empty() || w.fmt != Fmt::Q4_0 {
        return false;
    }
    // SAFETY: the caller has the features; the scratch is this thread's.
    Q4W.with_borrow_mut(|dec| unsafe { q4_0_wide_in(dec, w, acts, rows, out) });
    true
}

/// The body of [`q4_0_wide`], out of the thread-local's closure.
///
/// # Safety
/// As [`q4_0_wide`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_wide_in(
    dec: &mut Vec<__m256i>,
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    let (k, n) = (acts.k, acts.n);
    let nb = k / QK;
    let rb = w.row_bytes;
    assert!(rb >= nb * 18);
    assert!(n * k <= acts.q.len() && n * nb <= acts.d.len() && n * nb <= acts.off8.len());
    let per = Q4W_SLOTS;
    dec.resize(nb * per, _mm256_setzero_si256());
    // Groups of eight rows (`RowMat` keeps chain Q4_0 in eights).
    assert!(rows.start.is_multiple_of(8) && rows.end.is_multiple_of(8));
    for r0 in rows.step_by(8) {
        let at = w.at(r0, 8);
        for b in 0..nb {
            // SAFETY: the group's block b lies within the matrix (`at`);
            // slots below `per · nb` (`dec`'s size).
            unsafe {
                let (v, dw) = q4_0_group8(w.bytes().as_ptr().add(at.base + b * at.block), at.row);
                let o = dec.as_mut_ptr().add(b * per);
                for (j, &vj) in v.iter().enumerate() {
                    o.add(j).write(vj);
                }
                o.add(8).write(_mm256_castps_si256(dw));
            }
        }
        let mut c = 0;
        while c < n {
            let len = (n - c).min(Q4W_COLS);
            let d = dec.as_ptr();
            // SAFETY: `dec` holds nb decoded blocks; the columns' bounds
            // are asserted above; the rows are the caller's.
            unsafe {
                match len {
                    4 => q4_0_wide_cols::<4>(d, acts, nb, r0, c, out),
                    3 => q4_0_wide_cols::<3>(d, acts, nb, r0, c, out),
                    2 => q4_0_wide_cols::<2>(d, acts, nb, r0, c, out),
                    _ => q4_0_wide_cols::<1>(d, acts, nb, r0, c, out),
                }
            }
            c += len;
        }
    }
}

/// A decoded Q4_0 group of rows (see [`q4_0_wide`]) against columns `c ..
/// c + N`: rows `r0 .. r0 + 8`.
///
/// # Safety
/// The CPU has avx2, fma and f16c; `dec` holds `nb` decoded blocks;
/// columns `c .. c + N` exist in `acts` with their `q`, `d` and `off8`;
/// the rows are the caller's.
#[inline(always)]
unsafe fn q4_0_wide_cols<const N: usize>(
    dec: *const __m256i,
    acts: &Acts,
    nb: usize,
    r0: usize,
    c: usize,
    out: &OutRows<'_>,
) {
    let k = acts.k;
    // SAFETY: within the decoded blocks and the N columns (the caller's
    // contract).
    unsafe {
        let q = acts.q.as_ptr();
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); N];
        for b in 0..nb {
            let o = dec.add(b * Q4W_SLOTS);
            let mut s16 = [_mm256_setzero_si256(); N];
            for g in 0..8 {
                for (j, sj) in s16.iter_mut().enumerate() {
                    let a = _mm256_set1_epi32(
                        (q.add((c + j) * k + b * QK + 4 * g) as *const i32).read_unaligned(),
                    );
                    let p = _mm256_maddubs_epi16(*o.add(g), a);
                    *sj = if g == 0 { p } else { _mm256_add_epi16(*sj, p) };
                }
            }
            let dw = _mm256_castsi256_ps(*o.add(8));
            for j in 0..N {
                let da = _mm256_set1_ps(*acts.d.get_unchecked((c + j) * nb + b));
                let off = _mm256_set1_epi32(*acts.off8.get_unchecked((c + j) * nb + b));
                let isum = _mm256_sub_epi32(_mm256_madd_epi16(s16[j], ones), off);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da), acc[j]);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            let mut col = [0f32; 8];
            _mm256_storeu_ps(col.as_mut_ptr(), *a);
            out.set_run(c + j, r0, &col);
        }
    }
}

thread_local! {
    /// Each thread's decoded rows for `b32_wide`.
    static DECODED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`B32`] on a product of many columns: each block of rows is decoded once
/// (signed formats as value and magnitude, 32 bytes each, plus `d`, `m`)
/// into scratch, then met by the columns eight at a time: each group of four
/// weight values is broadcast against the same group of eight columns
/// (`Acts::qi`), so lane j of accumulator g is column j's lane g of
/// `B32::run`, and the scales come from the transposed `Acts::dt`/`st`
/// eight at once with no shuffles. Same numbers as `B32::run` (the same
/// lanes, the same fused multiply-adds per block, the same final sum).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// rows `rows` of `out` are the caller's (`OutRows::set`); `w` and `acts`
/// hold them (bounds are asserted).
#[inline(always)]
unsafe fn b32_wide<const F: u8>(
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    // SAFETY: the caller has the features; the scratch is this thread's.
    DECODED.with_borrow_mut(|dec| unsafe { b32_wide_in::<F>(dec, w, acts, rows, out) });
}

/// The body of [`b32_wide`], out of the thread-local's closure (which
/// would not inherit the target features).
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn b32_wide_in<const F: u8>(
    dec: &mut Vec<u8>,
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    let k = acts.k;
    let n = acts.n;
    let nb = k / QK;
    let bb = [34usize, 18, 22, 20, 24][F as usize];
    let signed = F < 3;
    let dtw = n + 8;
    assert!(w.row_bytes >= nb * bb);
    assert!(n * k <= acts.q.len() && nb * dtw <= acts.dt.len().min(acts.st.len()));
    assert!(n.div_ceil(8) * nb * 256 <= acts.qi.len());
    // Per row and block: 32 bytes x, 32 bytes |x| (signed formats), then
    // d and m as f32 after all blocks.
    let per_block = if signed { 64 } else { 32 };
    let row_scratch = nb * per_block + nb * 8;
    {
        dec.resize(ROW_BLOCK * row_scratch + 32, 0);
        // SAFETY: every pointer below stays within `dec` (sized above), the
        // rows (asserted), `acts.qi` (256 bytes per panel of eight columns
        // and block, asserted) and `acts.dt`/`st` (nb rows of n + 8, so a
        // load of 8 from any column < n fits).
        unsafe {
            let dp = dec.as_mut_ptr();
            for rb in rows.clone().step_by(ROW_BLOCK) {
                let re = (rb + ROW_BLOCK).min(rows.end);
                for r in rb..re {
                    let at = w.at(r, 1);
                    let row = w.bytes().as_ptr().add(at.base);
                    let o = dp.add((r - rb) * row_scratch);
                    let scales = o.add(nb * per_block) as *mut f32;
                    let pairs = w.pairs();
                    for b in 0..nb {
                        let blk = row.add(b * at.block);
                        let (dw, m, x) = if pairs {
                            let (dw, m, x) = pair_block::<F>(row, b);
                            (
                                dw,
                                m,
                                if F == 2 { _mm256_sub_epi8(x, _mm256_set1_epi8(16)) } else { x },
                            )
                        } else {
                            (
                                f16_at(blk),
                                if signed { 0.0 } else { f16_at(blk.add(2)) },
                                match F {
                                    0 => _mm256_loadu_si256(blk.add(2) as *const __m256i),
                                    1 => _mm256_sub_epi8(nibbles(blk.add(2)), _mm256_set1_epi8(8)),
                                    2 => {
                                        let hi = _mm256_andnot_si256(
                                            bits(blk.add(2)),
                                            _mm256_set1_epi8(0xF0u8 as i8),
                                        );
                                        _mm256_or_si256(nibbles(blk.add(6)), hi)
                                    }
                                    3 => nibbles(blk.add(4)),
                                    _ => {
                                        let hi = _mm256_and_si256(
                                            bits(blk.add(4)),
                                            _mm256_set1_epi8(0x10),
                                        );
                                        _mm256_or_si256(nibbles(blk.add(8)), hi)
                                    }
                                },
                            )
                        };
                        let at = o.add(b * per_block) as *mut __m256i;
                        _mm256_storeu_si256(at, x);
                        if signed {
                            _mm256_storeu_si256(at.add(1), _mm256_sign_epi8(x, x));
                        }
                        scales.add(b).write_unaligned(dw);
                        scales.add(nb + b).write_unaligned(m);
                    }
                }
                let mut c = 0;
                while c < n {
                    let m = (n - c).min(8);
                    // This panel's values: block b, group g of four values,
                    // eight columns (`Acts::qi`).
                    let panel = acts.qi.as_ptr().add((c / 8) * nb * 256);
                    for r in rb..re {
                        let o = dp.add((r - rb) * row_scratch) as *const u8;
                        let scales = o.add(nb * per_block) as *const f32;
                        // acc[g]: lane j is column c + j's lane g of ggml's
                        // per-block product (the same four values), so each
                        // lane meets the same fused multiply-adds as there.
                        let mut acc = [_mm256_setzero_ps(); 8];
                        let mut summs = _mm256_setzero_ps();
                        for b in 0..nb {
                            let xb = o.add(b * per_block);
                            let dw = scales.add(b).read_unaligned();
                            let dv = _mm256_mul_ps(
                                _mm256_set1_ps(dw),
                                _mm256_loadu_ps(acts.dt.as_ptr().add(b * dtw + c)),
                            );
                            if !signed {
                                let mw = scales.add(nb + b).read_unaligned();
                                let sv = _mm256_loadu_ps(acts.st.as_ptr().add(b * dtw + c));
                                summs = _mm256_fmadd_ps(_mm256_set1_ps(mw), sv, summs);
                            }
                            let yb = panel.add(b * 256);
                            macro_rules! group {
                                ($g:literal) => {{
                                    let y = _mm256_loadu_si256(yb.add($g * 32) as *const __m256i);
                                    let x = _mm256_set1_epi32(
                                        (xb.add($g * 4) as *const i32).read_unaligned(),
                                    );
                                    let lanes = if signed {
                                        let ax = _mm256_set1_epi32(
                                            (xb.add(32 + $g * 4) as *const i32).read_unaligned(),
                                        );
                                        us_lanes(ax, _mm256_sign_epi8(y, x))
                                    } else {
                                        us_lanes(x, y)
                                    };
                                    acc[$g] =
                                        _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(lanes), acc[$g]);
                                }};
                            }
                            group!(0);
                            group!(1);
                            group!(2);
                            group!(3);
                            group!(4);
                            group!(5);
                            group!(6);
                            group!(7);
                        }
                        // `hsum8` of each column's eight lanes, all eight
                        // columns at once (the same additions in the same
                        // order, lane by lane), then `+ Σ m·s`.
                        let sum = _mm256_add_ps(
                            _mm256_add_ps(
                                _mm256_add_ps(acc[0], acc[4]),
                                _mm256_add_ps(acc[2], acc[6]),
                            ),
                            _mm256_add_ps(
                                _mm256_add_ps(acc[1], acc[5]),
                                _mm256_add_ps(acc[3], acc[7]),
                            ),
                        );
                        let mut o = [0f32; 8];
                        _mm256_storeu_ps(o.as_mut_ptr(), _mm256_add_ps(sum, summs));
                        for j in 0..m {
                            out.set(c + j, r, o[j]);
                        }
                    }
                    c += m;
                }
            }
        }
    }
}

/// Scales and minimums of a Q4_K/Q5_K block (12 packed bytes at `p`) as
/// bytes, the way ggml's AVX2 kernels unpack them: `[sc0..8, m0..8]`.
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// `p` points to 12 readable bytes.
#[inline(always)]
unsafe fn k4_scales(p: *const u8) -> [u8; 16] {
    const M1: u32 = 0x3f3f_3f3f;
    const M2: u32 = 0x0f0f_0f0f;
    const M3: u32 = 0x0303_0303;
    // SAFETY: caller guarantees 12 readable bytes at p.
    let (a, b, c) = unsafe {
        (
            (p as *const u32).read_unaligned(),
            (p.add(4) as *const u32).read_unaligned(),
            (p.add(8) as *const u32).read_unaligned(),
        )
    };
    let u3 = ((c >> 4) & M2) | (((b >> 6) & M3) << 4);
    let u2 = b & M1;
    let u1 = (c & M2) | (((a >> 6) & M3) << 4);
    let u0 = a & M1;
    let mut out = [0u8; 16];
    out[..4].copy_from_slice(&u0.to_le_bytes());
    out[4..8].copy_from_slice(&u1.to_le_bytes());
    out[8..12].copy_from_slice(&u2.to_le_bytes());
    out[12..].copy_from_slice(&u3.to_le_bytes());
    out
}

/// `Σ m_s · bsum32_s` over sub-blocks `subs`.
#[inline(always)]
fn k_mins(sm: &[u8; 16], bs: &[i16], subs: std::ops::Range<usize>) -> i32 {
    subs.map(|s| sm[8 + s] as i32 * (bs[2 * s] as i32 + bs[2 * s + 1] as i32)).sum()
}

/// [`k_mins`] over all eight sub-blocks in vector registers: the same
/// exact integer (pair sums of the 16 bsums fit i16: |x| ≤ 4064).
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels).
#[inline(always)]
unsafe fn k_mins8(sm: &[u8; 16], bs: &[i16]) -> i32 {
    assert!(bs.len() >= 16);
    // SAFETY: 16 i16 read from `bs` (asserted), 8 bytes from `sm[8..]`.
    unsafe {
        let bsp = _mm_hadd_epi16(
            _mm_loadu_si128(bs.as_ptr() as *const __m128i),
            _mm_loadu_si128(bs.as_ptr().add(8) as *const __m128i),
        );
        let m = _mm_cvtepu8_epi16(_mm_loadl_epi64(sm.as_ptr().add(8) as *const __m128i));
        let p = _mm_madd_epi16(m, bsp);
        let p = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
        let p = _mm_add_epi32(p, _mm_shuffle_epi32::<1>(p));
        _mm_cvtsi128_si32(p)
    }
}

/// Q4_K on the *chain* numerics (ggml's repacked `q4_K_8x8` gemv, or its
/// gemm for a grouped column: one step per 64 values).
struct Q4KChain;

impl Kern for Q4KChain {
    #[inline(always)]
    unsafe fn wide(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        // SAFETY: forwarded.
        unsafe {
            // No column grouped (a mixture's experts always take ggml's
            // gemv): the one-column kernel over every column, each block
            // read once for several, instead of the wide kernel's per-row
            // fallback.
            if !(0..acts.n).any(|c| acts.grouped(c)) {
                return Self::dec_many(w, acts, rows, out);
            }
            q4k_wide(w, acts, rows, out)
        };
        true
    }

    #[inline(always)]
    unsafe fn dec(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        if acts.grouped(0) {
            return false;
        }
        // SAFETY: forwarded; the 512-bit variant only where the CPU has it.
        unsafe {
            if super::isa() == super::Isa::Avx512Vnni {
                q4k_dec8_512(w, acts, rows, out)
            } else {
                q4k_dec8(w, acts, rows, out)
            }
        };
        true
    }

    #[inline(always)]
    unsafe fn dec_many(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        // SAFETY: forwarded; the 512-bit variant only where the CPU has it.
        // Both take grouped columns (a short prompt's).
        unsafe {
            if super::isa() == super::Isa::Avx512Vnni {
                q4k_dec8_512(w, acts, rows, out)
            } else {
                q4k_dec8(w, acts, rows, out)
            }
        };
        true
    }

    #[inline(always)]
    unsafe fn run<const R: usize, const N: usize>(
        w: &RowMat,
        acts: &Acts,
        r0: usize,
        c0: usize,
        out: &mut [[f32; N]; R],
    ) {
        let k = acts.k;
        let nb = k / QK_K;
        let at = w.at(r0, R);
        assert!(w.row_bytes >= nb * 144);
        assert!((c0 + N) * k <= acts.kq.len() && (c0 + N) * nb <= acts.kd.len());
        assert!((c0 + N) * nb * 16 <= acts.kbs.len());
        // SAFETY: loads within the R rows (`at`) and N columns asserted above.
        unsafe {
            let mut acc = [[0f32; N]; R];
            let mut accm = [[0f32; N]; R];
            let m4 = _mm256_set1_epi8(0x0F);
            let grouped: [bool; N] = std::array::from_fn(|j| acts.grouped(c0 + j));
            let base = w.bytes().as_ptr().add(at.base);
            for b in 0..nb {
                let mut dw = [0f32; R];
                let mut dmin = [0f32; R];
                let mut sm = [[0u8; 16]; R];
                for r in 0..R {
                    let blk = base.add(r * at.row + b * at.block);
                    for l in 0..3 {
                        prefetch(blk.wrapping_add(PF_DIST + 64 * l));
                    }
                    dw[r] = f16_at(blk);
                    dmin[r] = f16_at(blk.add(2));
                    sm[r] = k4_scales(blk.add(4));
                }
                let mut da = [0f32; N];
                for j in 0..N {
                    da[j] = *acts.kd.get_unchecked((c0 + j) * nb + b);
                }
                let mut isum = [[_mm256_setzero_si256(); N]; R];
                for g in 0..4 {
                    // This group's activations of each column (`preload`).
                    let act = |j: usize| acts.kq.as_ptr().add((c0 + j) * k + b * QK_K + 64 * g);
                    let al = preload::<R, N>(act);
                    let ah = preload::<R, N>(|j| act(j).add(32));
                    for r in 0..R {
                        let q = _mm256_loadu_si256(
                            base.add(r * at.row + b * at.block + 16 + 32 * g) as *const __m256i,
                        );
                        let lo = _mm256_and_si256(q, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                        let sl = _mm256_set1_epi16(sm[r][2 * g] as i16);
                        let sh = _mm256_set1_epi16(sm[r][2 * g + 1] as i16);
                        for j in 0..N {
                            let al = act_at::<R>(al[j], act(j));
                            let ah = act_at::<R>(ah[j], act(j).add(32));
                            let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, al), sl);
                            let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ah), sh);
                            isum[r][j] = _mm256_add_epi32(isum[r][j], _mm256_add_epi32(pl, ph));
                            if grouped[j] {
                                let bs = acts.kbs.get_unchecked((c0 + j) * nb * 16 + b * 16..);
                                let i = hsum_i32(isum[r][j]);
                                isum[r][j] = _mm256_setzero_si256();
                                let im = k_mins(&sm[r], bs, 2 * g..2 * g + 2);
                                acc[r][j] = (i as f32).mul_add(dw[r] * da[j], acc[r][j]);
                                accm[r][j] = (im as f32).mul_add(dmin[r] * da[j], accm[r][j]);
                            }
                        }
                    }
                }
                for r in 0..R {
                    for j in 0..N {
                        if grouped[j] {
                            continue;
                        }
                        let bs = acts.kbs.get_unchecked((c0 + j) * nb * 16 + b * 16..);
                        let i = hsum_i32(isum[r][j]);
                        acc[r][j] = (i as f32).mul_add(dw[r] * da[j], acc[r][j]);
                        accm[r][j] =
                            (k_mins8(&sm[r], bs) as f32).mul_add(dmin[r] * da[j], accm[r][j]);
                    }
                }
            }
            for r in 0..R {
                for j in 0..N {
                    out[r][j] = acc[r][j] - accm[r][j];
                }
            }
        }
    }
}

/// A wide Q4_K product on the chain numerics, eight rows at once with the
/// rows in the lanes: per 64 values each row's integer sum, then the same
/// `fma(isum, d·da, acc)` and `fma(Σmin·bsum, dmin·da, accm)` per lane as
/// `Q4KChain::run` does per row, so the numbers are identical. The eight
/// rows' nibbles and scales are decoded once per block for all columns.
#[inline(always)]
unsafe fn q4k_wide(w: &RowMat, acts: &Acts, rows: std::ops::Range<usize>, out: &OutRows<'_>) {
    // SAFETY: the caller has the features; the scratch is this thread's.
    DECODED.with_borrow_mut(|dec| unsafe { q4k_wide_in(dec, w, acts, rows, out) });
}

/// The body of [`q4k_wide`]. Per block, the eight rows' nibbles are laid
/// out as 64 registers `wv[s][c]` (sub-block `s`, four-value chunk `c`)
/// whose 32-bit lane `r` holds row `r`'s four values: one `maddubs` with the
/// column's four activations broadcast gives every row's pair sums, the
/// eight chunks of a sub-block add exactly in i16 (|x| ≤ 8 · 3840), and one
/// `madd` with the rows' scales gives each row's sub-block sum in its own
/// lane, so no horizontal adds are needed. Integer sums are exact in any
/// order: the numbers are those of `Q4KChain::run`'s grouped fold.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_wide_in(
    dec: &mut Vec<u8>,
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    let k = acts.k;
    let n = acts.n;
    let nb = k / QK_K;
    assert!(w.row_bytes >= nb * 144);
    assert!(n * k <= acts.kq.len() && n * nb <= acts.kd.len() && n * nb * 16 <= acts.kbs.len());
    // Accumulators per column: acc and accm, eight rows each.
    let acc_bytes = 2 * n * 32;
    dec.resize(acc_bytes + 32, 0);
    let full = rows.start + (rows.end - rows.start) / 8 * 8;
    let cols: Vec<usize> = (0..n).filter(|&c| acts.grouped(c)).collect();
    // SAFETY: loads stay within the eight rows of each group (asserted
    // rows), the columns' activations (asserted) and the accumulators
    // (2·n vectors in `dec`, 32-byte aligned below).
    unsafe {
        let base = dec.as_mut_ptr();
        let accs = base.add(base.align_offset(32)) as *mut __m256;
        let m4 = _mm256_set1_epi8(0x0F);
        let mut wv = [[_mm256_setzero_si256(); 8]; 8];
        for rb in (rows.start..full).step_by(8) {
            let at = w.at(rb, 8);
            let wp = w.bytes().as_ptr().add(at.base);
            for c in 0..2 * n {
                accs.add(c).write(_mm256_setzero_ps());
            }
            for b in 0..nb {
                let mut mins = [[0i32; 8]; 8];
                let mut scs = [[0i32; 8]; 8];
                let mut dw = [0f32; 8];
                let mut dm = [0f32; 8];
                for r in 0..8 {
                    let blk = wp.add(r * at.row + b * at.block);
                    dw[r] = f16_at(blk);
                    dm[r] = f16_at(blk.add(2));
                    let sm = k4_scales(blk.add(4));
                    for s in 0..8 {
                        scs[s][r] = sm[s] as i32 * 0x1_0001;
                        mins[s][r] = sm[8 + s] as i32;
                    }
                }
                let sc: [__m256i; 8] =
                    std::array::from_fn(|s| _mm256_loadu_si256(scs[s].as_ptr() as *const __m256i));
                // The nibbles: per half h of a group's 32 bytes, rows p and
                // p + 4 side by side (low nibbles: sub-block 2g, high: 2g + 1),
                // then a 4 × 4 transpose of 32-bit lanes within each 128-bit
                // half puts chunk c of rows 0..4 | 4..8 in one register.
                for g in 0..4 {
                    for h in 0..2 {
                        let mut lo = [_mm256_setzero_si256(); 4];
                        let mut hi = [_mm256_setzero_si256(); 4];
                        for p in 0..4 {
                            let qa = wp.add(p * at.row + b * at.block + 16 + 32 * g + 16 * h);
                            let qb = wp.add((p + 4) * at.row + b * at.block + 16 + 32 * g + 16 * h);
                            let q = _mm256_setr_m128i(
                                _mm_loadu_si128(qa as *const __m128i),
                                _mm_loadu_si128(qb as *const __m128i),
                            );
                            lo[p] = _mm256_and_si256(q, m4);
                            hi[p] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                        }
                        for (s, x) in [(2 * g, &lo), (2 * g + 1, &hi)] {
                            wv[s][4 * h..4 * h + 4].copy_from_slice(&transpose4_epi32(x));
                        }
                    }
                }
                let dwv = _mm256_loadu_ps(dw.as_ptr());
                let dmv = _mm256_loadu_ps(dm.as_ptr());
                // Per group of 64 values, each row's two mins as an i16 pair
                // (≤ 63): one madd with the pair of bsum sums gives Σ min·bsum.
                let minp: [__m256i; 4] = std::array::from_fn(|g| {
                    let m: [i32; 8] =
                        std::array::from_fn(|r| mins[2 * g][r] | (mins[2 * g + 1][r] << 16));
                    _mm256_loadu_si256(m.as_ptr() as *const __m256i)
                });
                let mut pairs = cols.chunks_exact(2);
                for cp in pairs.by_ref() {
                    q4k_wide_cols::<2>([cp[0], cp[1]], acts, b, &wv, &sc, &minp, dwv, dmv, accs);
                }
                for &c in pairs.remainder() {
                    q4k_wide_cols::<1>([c], acts, b, &wv, &sc, &minp, dwv, dmv, accs);
                }
            }
            for c in 0..n {
                if acts.grouped(c) {
                    let v = _mm256_sub_ps(accs.add(2 * c).read(), accs.add(2 * c + 1).read());
                    set_rows8(out, c, rb, v);
                } else {
                    for r in rb..rb + 8 {
                        let mut o = [[0f32; 1]; 1];
                        Q4KChain::run::<1, 1>(w, acts, r, c, &mut o);
                        out.set(c, r, o[0][0]);
                    }
                }
            }
        }
        // Rows past the last group of eight: one at a time.
        for r in full..rows.end {
            for c in 0..n {
                let mut o = [[0f32; 1]; 1];
                Q4KChain::run::<1, 1>(w, acts, r, c, &mut o);
                out.set(c, r, o[0][0]);
            }
        }
    }
}

/// One block of [`q4k_wide_in`] for `N` grouped columns `cs`: each load of
/// the rows' nibbles serves the `N` columns.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; `cs` are grouped columns of
/// `acts` and block `b` lies within its rows; `accs` holds two vectors per
/// column of `acts`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn q4k_wide_cols<const N: usize>(
    cs: [usize; N],
    acts: &Acts,
    b: usize,
    wv: &[[__m256i; 8]; 8],
    sc: &[__m256i; 8],
    minp: &[__m256i; 4],
    dwv: __m256,
    dmv: __m256,
    accs: *mut __m256,
) {
    let k = acts.k;
    let nb = k / QK_K;
    // SAFETY: as the caller promises (columns, block and accumulators).
    unsafe {
        let a0: [*const u8; N] =
            std::array::from_fn(|j| acts.kq.as_ptr().add(cs[j] * k + b * QK_K) as *const u8);
        let mut acc: [__m256; N] = std::array::from_fn(|j| accs.add(2 * cs[j]).read());
        let mut accm: [__m256; N] = std::array::from_fn(|j| accs.add(2 * cs[j] + 1).read());
        let mut dd = [_mm256_setzero_ps(); N];
        let mut ddm = [_mm256_setzero_ps(); N];
        let mut ps = [[0i32; 4]; N];
        for j in 0..N {
            let da = _mm256_set1_ps(*acts.kd.get_unchecked(cs[j] * nb + b));
            dd[j] = _mm256_mul_ps(dwv, da);
            ddm[j] = _mm256_mul_ps(dmv, da);
            // i32 lane g: the bsum sums of sub-blocks 2g and 2g + 1 as an
            // i16 pair (for `minp`'s madd).
            _mm_storeu_si128(ps[j].as_mut_ptr() as *mut __m128i, bsum_pairs(acts, cs[j], b));
        }
        for g in 0..4 {
            let mut iv = [_mm256_setzero_si256(); N];
            for s in 2 * g..2 * g + 2 {
                let mut sum = [_mm256_setzero_si256(); N];
                for c in 0..8 {
                    let wr = wv[s][c];
                    for j in 0..N {
                        let a = _mm256_set1_epi32(
                            (a0[j].add(32 * s + 4 * c) as *const i32).read_unaligned(),
                        );
                        sum[j] = _mm256_add_epi16(sum[j], _mm256_maddubs_epi16(wr, a));
                    }
                }
                for j in 0..N {
                    iv[j] = _mm256_add_epi32(iv[j], _mm256_madd_epi16(sum[j], sc[s]));
                }
            }
            for j in 0..N {
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iv[j]), dd[j], acc[j]);
                let im = _mm256_madd_epi16(minp[g], _mm256_set1_epi32(ps[j][g]));
                accm[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), ddm[j], accm[j]);
            }
        }
        for j in 0..N {
            accs.add(2 * cs[j]).write(acc[j]);
            accs.add(2 * cs[j] + 1).write(accm[j]);
        }
    }
}

/// A Q4_K product on the chain numerics (ggml's repacked gemv, one column
/// at a time; a grouped column, its gemm's, folds per 64 values instead),
/// eight rows at once with the rows in the lanes: per super-block each
/// row's exact integer sum and `Σ min·bsum`, then the same `fma(isum, d·da, acc)` and
/// `fma(imin, dmin·da, accm)` per lane as `Q4KChain::run` does per row, so
/// the numbers are identical. The rows of a group are interleaved block by
/// block (`RowMat::group`), so the eight rows are one stream of memory; with
/// several columns (decode steps of several sequences, a verified draft)
/// each block is read from memory once and its scales unpacked once for
/// [`DEC_COLS`] columns. Rows past the last group of eight go through
/// `Q4KChain::run`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; rows `rows` of `out` are the
/// caller's (`OutRows::set`); `w` and `acts` hold them (bounds are
/// asserted).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_dec8(w: &RowMat, acts: &Acts, rows: std::ops::Range<usize>, out: &OutRows<'_>) {
    let k = acts.k;
    let nb = k / QK_K;
    let n = acts.n;
    assert!(w.row_bytes >= nb * 144);
    assert!(n * k <= acts.kq.len() && n * nb <= acts.kd.len() && n * nb * 16 <= acts.kbs.len());
    let full = rows.start + (rows.end - rows.start) / 8 * 8;
    // SAFETY: loads stay within the eight rows of each group (asserted
    // rows) and the column's activations (asserted).
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        // Byte s of each half's 16 scale/min bytes as an i16 in every lane
        // (the high byte's index has its top bit set: a zero).
        let pick: [__m256i; 8] =
            std::array::from_fn(|s| _mm256_set1_epi16((0xFF00u16 | s as u16) as i16));
        // Plain nested loops: a `flat_map` here stayed a call per group
        // (3% of a mixture's decode step).
        for rb in (rows.start..full).step_by(8) {
            for c0 in (0..n).step_by(DEC_COLS) {
                let cn = (n - c0).min(DEC_COLS);
                let at = w.at(rb, 8);
                let base = w.bytes().as_ptr().add(at.base);
                let mut acc = [_mm256_setzero_ps(); DEC_COLS];
                let mut accm = [_mm256_setzero_ps(); DEC_COLS];
                for b in 0..nb {
                    let blk: [*const u8; 8] =
                        std::array::from_fn(|r| base.add(r * at.row + b * at.block));
                    for p in blk {
                        for l in 0..3 {
                            prefetch(p.wrapping_add(2 * PF_DIST + 64 * l));
                        }
                    }
                    let (dh, dmh, t) = q4k_group_header(&blk);
                    for j in 0..cn {
                        let Q4KColumn { dd, ddm, a0, u, um } =
                            q4k_column(acts, c0 + j, b, dh, dmh, &t);
                        // Each pair of rows' lane sums over the whole block:
                        // integer sums, exact in any order, so one hadd tree per
                        // block gives what one per group of 64 would.
                        let mut vs = [_mm256_setzero_si256(); 4];
                        for g in 0..4 {
                            let mut a = [_mm256_setzero_si256(); 4];
                            for (h, a) in a.iter_mut().enumerate() {
                                *a = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                    a0.add(64 * g + 16 * h) as *const __m128i,
                                ));
                            }
                            for p in 0..4 {
                                let qa = blk[p].add(16 + 32 * g);
                                let qb = blk[p + 4].add(16 + 32 * g);
                                let q0 = _mm256_setr_m128i(
                                    _mm_loadu_si128(qa as *const __m128i),
                                    _mm_loadu_si128(qb as *const __m128i),
                                );
                                let q1 = _mm256_setr_m128i(
                                    _mm_loadu_si128(qa.add(16) as *const __m128i),
                                    _mm_loadu_si128(qb.add(16) as *const __m128i),
                                );
                                let l0 = _mm256_maddubs_epi16(_mm256_and_si256(q0, m4), a[0]);
                                let l1 = _mm256_maddubs_epi16(_mm256_and_si256(q1, m4), a[1]);
                                let h0 = _mm256_maddubs_epi16(
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(q0), m4),
                                    a[2],
                                );
                                let h1 = _mm256_maddubs_epi16(
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(q1), m4),
                                    a[3],
                                );
                                // Two maddubs sums of one sub-block add exactly in
                                // i16 (|x| ≤ 7680); the scale bytes as i16 pairs.
                                let sl = _mm256_shuffle_epi8(t[p], pick[2 * g]);
                                let sh = _mm256_shuffle_epi8(t[p], pick[2 * g + 1]);
                                let pl = _mm256_madd_epi16(_mm256_add_epi16(l0, l1), sl);
                                let ph = _mm256_madd_epi16(_mm256_add_epi16(h0, h1), sh);
                                vs[p] = _mm256_add_epi32(vs[p], _mm256_add_epi32(pl, ph));
                            }
                            if let Some(um) = &um {
                                chain_step(
                                    &mut acc[j],
                                    &mut accm[j],
                                    hadd_rows(&vs),
                                    um[g],
                                    dd,
                                    ddm,
                                );
                                vs = [_mm256_setzero_si256(); 4];
                            }
                        }
                        if um.is_none() {
                            chain_step(
                                &mut acc[j],
                                &mut accm[j],
                                hadd_rows(&vs),
                                hadd_rows(&u),
                                dd,
                                ddm,
                            );
                        }
                    }
                }
                for j in 0..cn {
                    set_rows8(out, c0 + j, rb, _mm256_sub_ps(acc[j], accm[j]));
                }
            }
        }
        for r in full..rows.end {
            for c in 0..n {
                let mut o = [[0f32; 1]; 1];
                Q4KChain::run::<1, 1>(w, acts, r, c, &mut o);
                out.set(c, r, o[0][0]);
            }
        }
    }
}

/// A group's super-block header, as `q4k_dec8` and `q4k_dec8_512` read it
/// from the eight rows' blocks `blk`: `d` and `dmin` of rows 0..8 in lane
/// order, and per p < 4 the 16 unpacked scale and min bytes (`k4_scales`)
/// of rows p and p + 4 in the two halves.
///
/// # Safety
/// Each pointer has 16 readable bytes; the CPU has avx2 and f16c.
// The features named (not `inline(always)` alone) so that the closures
// below inherit them and their intrinsics inline: without them each
// intrinsic was a call (perf: `_mm256_and_si256` 3% of a decode).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q4k_group_header(blk: &[*const u8; 8]) -> (__m256, __m256, [__m256i; 4]) {
    // SAFETY: 16 bytes at each pointer (the caller's); register work.
    unsafe {
        // Rows p and p + 4's first 16 bytes (d, dmin, the 12 packed
        // scale bytes) in the two halves.
        let v: [__m256i; 4] = std::array::from_fn(|p| {
            _mm256_setr_m128i(
                _mm_loadu_si128(blk[p] as *const __m128i),
                _mm_loadu_si128(blk[p + 4] as *const __m128i),
            )
        });
        // d and dmin of the eight rows, in row order (lane 0 of each).
        let dv = _mm256_unpacklo_epi64(
            _mm256_unpacklo_epi32(v[0], v[1]),
            _mm256_unpacklo_epi32(v[2], v[3]),
        );
        let halves = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(
            _mm256_and_si256(dv, _mm256_set1_epi32(0xFFFF)),
            _mm256_srli_epi32::<16>(dv),
        ));
        let dh = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
        let dmh = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(halves));
        // Rows p and p + 4's 16 scale and min bytes (`k4_scales`) in
        // the two halves: from the 12 packed bytes [a, b, c] (u32
        // lanes 1..4 of `v`), [a & M1, (c & M2) | ((a >> 6) & M3) << 4, b & M1,
        // ((c >> 4) & M2) | ((b >> 6) & M3) << 4].
        let t: [__m256i; 4] = std::array::from_fn(|p| {
            let x = _mm256_shuffle_epi32::<0b11_10_11_01>(v[p]); // a c b c
            let y = _mm256_shuffle_epi32::<0b10_10_01_01>(v[p]); // a a b b
            let lo = _mm256_and_si256(
                _mm256_srlv_epi32(x, _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4)),
                _mm256_setr_epi32(
                    0x3f3f_3f3f,
                    0x0f0f_0f0f,
                    0x3f3f_3f3f,
                    0x0f0f_0f0f,
                    0x3f3f_3f3f,
                    0x0f0f_0f0f,
                    0x3f3f_3f3f,
                    0x0f0f_0f0f,
                ),
            );
            let hi = _mm256_slli_epi32::<4>(_mm256_and_si256(
                _mm256_srli_epi32::<6>(y),
                _mm256_setr_epi32(0, 0x0303_0303, 0, 0x0303_0303, 0, 0x0303_0303, 0, 0x0303_0303),
            ));
            _mm256_or_si256(lo, hi)
        });
        (dh, dmh, t)
    }
}

/// [`q4k_dec8`] with its integer work in 512-bit registers (AVX-512BW):
/// one register holds a row's 32 nibble bytes of a sub-block pair and
/// those of the row four on, so each `maddubs`/`madd` covers 64 values of
/// two rows (twice `q4k_dec8`'s), each scale's multiply-add and the sum
/// are one `vpdpwssd`, and each row's sum is folded once per super-block
/// instead of per 64 values. Integer sums are exact whatever their order,
/// so the float steps per lane, and the numbers, are `q4k_dec8`'s.
///
/// # Safety
/// As [`q4k_dec8`]; the CPU must also support avx512f, avx512bw, avx512vl
/// and avx512vnni.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_dec8_512(w: &RowMat, acts: &Acts, rows: std::ops::Range<usize>, out: &OutRows<'_>) {
    let k = acts.k;
    let nb = k / QK_K;
    let n = acts.n;
    assert!(w.row_bytes >= nb * 144);
    assert!(n * k <= acts.kq.len() && n * nb <= acts.kd.len() && n * nb * 16 <= acts.kbs.len());
    let full = rows.start + (rows.end - rows.start) / 8 * 8;
    // SAFETY: loads stay within the eight rows of each group (asserted
    // rows) and the column's activations (asserted).
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        // Byte s of each 128-bit lane's scale bytes as an i16 in every
        // i16 of the lane (the high byte's index has its top bit set: 0).
        let pick: [__m512i; 8] =
            std::array::from_fn(|s| _mm512_set1_epi16((0xFF00u16 | s as u16) as i16));
        // Plain nested loops: a `flat_map` here stayed a call per group
        // (3% of a mixture's decode step).
        for rb in (rows.start..full).step_by(8) {
            for c0 in (0..n).step_by(DEC_COLS) {
                let cn = (n - c0).min(DEC_COLS);
                let at = w.at(rb, 8);
                let base = w.bytes().as_ptr().add(at.base);
                let mut acc = [_mm256_setzero_ps(); DEC_COLS];
                let mut accm = [_mm256_setzero_ps(); DEC_COLS];
                for b in 0..nb {
                    let blk: [*const u8; 8] =
                        std::array::from_fn(|r| base.add(r * at.row + b * at.block));
                    // The group's eight blocks are one run of 1152 bytes: its
                    // lines further on.
                    prefetch_run(blk[0], 18);
                    let (dh, dmh, t) = q4k_group_header(&blk);
                    // Row p's scale bytes in 128-bit lanes 0 and 1, row p + 4's
                    // in lanes 2 and 3: each half of a 512-bit register below.
                    let t2: [__m512i; 4] = std::array::from_fn(|p| {
                        let z = _mm512_castsi256_si512(t[p]);
                        _mm512_shuffle_i32x4::<0x50>(z, z)
                    });
                    for j in 0..cn {
                        let Q4KColumn { dd, ddm, a0, u, um } =
                            q4k_column(acts, c0 + j, b, dh, dmh, &t);
                        // Per p: rows p (i32 lanes 0..8) and p + 4 (8..16).
                        let mut iv = [_mm512_setzero_si512(); 4];
                        for g in 0..4 {
                            let alo = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                a0.add(64 * g) as *const __m256i
                            ));
                            let ahi = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                a0.add(64 * g + 32) as *const __m256i,
                            ));
                            for p in 0..4 {
                                let z = _mm512_inserti64x4::<1>(
                                    _mm512_castsi256_si512(_mm256_loadu_si256(
                                        blk[p].add(16 + 32 * g) as *const __m256i,
                                    )),
                                    _mm256_loadu_si256(
                                        blk[p + 4].add(16 + 32 * g) as *const __m256i
                                    ),
                                );
                                let lo = _mm512_maddubs_epi16(_mm512_and_si512(z, m4), alo);
                                let hi = _mm512_maddubs_epi16(
                                    _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4),
                                    ahi,
                                );
                                // Each scale's multiply-add and the sum in one
                                // (`vpdpwssd`; integer, so exact in any order).
                                let sl = _mm512_shuffle_epi8(t2[p], pick[2 * g]);
                                let sh = _mm512_shuffle_epi8(t2[p], pick[2 * g + 1]);
                                iv[p] =
                                    _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(iv[p], lo, sl), hi, sh);
                            }
                            if let Some(um) = &um {
                                chain_step(
                                    &mut acc[j],
                                    &mut accm[j],
                                    rows_of_pairs(&iv),
                                    um[g],
                                    dd,
                                    ddm,
                                );
                                iv = [_mm512_setzero_si512(); 4];
                            }
                        }
                        if um.is_none() {
                            chain_step(
                                &mut acc[j],
                                &mut accm[j],
                                rows_of_pairs(&iv),
                                hadd_rows(&u),
                                dd,
                                ddm,
                            );
                        }
                    }
                }
                for j in 0..cn {
                    set_rows8(out, c0 + j, rb, _mm256_sub_ps(acc[j], accm[j]));
                }
            }
        }
        for r in full..rows.end {
            for c in 0..n {
                let mut o = [[0f32; 1]; 1];
                Q4KChain::run::<1, 1>(w, acts, r, c, &mut o);
                out.set(c, r, o[0][0]);
            }
        }
    }
}

/// The eight rows' i32 sums of [`q4k_dec8_512`]'s accumulators `iv` (per
/// p, row p's eight lanes, then row p + 4's), in row order: the two 128-bit
/// lanes of each half added, then transposed sums.
///
/// # Safety
/// The CPU must support avx512f.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
unsafe fn rows_of_pairs(iv: &[__m512i; 4]) -> __m256i {
    let y: [__m512i; 4] = std::array::from_fn(|p| {
        _mm512_add_epi32(iv[p], _mm512_shuffle_i32x4::<0b10_11_00_01>(iv[p], iv[p]))
    });
    let t01 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(y[0], y[1]), _mm512_unpackhi_epi32(y[0], y[1]));
    let t23 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(y[2], y[3]), _mm512_unpackhi_epi32(y[2], y[3]));
    let u = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
    _mm512_castsi512_si256(_mm512_shuffle_i32x4::<0b10_00_10_00>(u, u))
}

/// Rows `rb..rb + 8` of column `c` from the eight lanes of `v` (the
/// eight-row decode kernels' results).
///
/// # Safety
/// The CPU must support avx; as [`OutRows::set_run`] for those rows.
#[target_feature(enable = "avx")]
#[inline]
unsafe fn set_rows8(out: &OutRows<'_>, c: usize, rb: usize, v: __m256) {
    let mut o = [0f32; 8];
    // SAFETY: eight floats stored into eight.
    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) };
    // SAFETY: the caller's.
    unsafe { out.set_run(c, rb, &o) };
}

/// Column `c`'s part of block `b` of a Q4_K decode group (`q4k_dec8`,
/// `q4k_dec8_512`), from the group's super-block scales `dh`/`dmh` and
/// scale bytes `t` (`q4k_group_header`): the scales times the column's,
/// its quantized values, each row's minimums against the column's sums
/// per pair of sub-blocks (row p's in i32 lanes 0..4, p + 4's in 4..8),
/// and, for a grouped column (ggml's four-column `gemm`, which rounds per
/// 64 values: its sums fold and scale after each group, as
/// `Q4KChain::run` does), those minimums by pair.
struct Q4KColumn {
    dd: __m256,
    ddm: __m256,
    a0: *const i8,
    u: [__m256i; 4],
    um: Option<[__m256i; 4]>,
}

/// [`Q4KColumn`] of column `c` and block `b`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; `c < acts.n` and block `b` is
/// within the column's activations (`acts.kd`, `acts.kq`, `acts.kbs`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q4k_column(
    acts: &Acts,
    c: usize,
    b: usize,
    dh: __m256,
    dmh: __m256,
    t: &[__m256i; 4],
) -> Q4KColumn {
    let nb = acts.k / QK_K;
    // The eight mins (bytes 8..16 of each half's scale bytes) as i16.
    let mins16 = _mm256_setr_epi8(
        8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15, -1, 8, -1, 9, -1, 10, -1, 11, -1,
        12, -1, 13, -1, 14, -1, 15, -1,
    );
    // SAFETY: block b of column c is within the activations (the caller's).
    unsafe {
        let da = _mm256_set1_ps(*acts.kd.get_unchecked(c * nb + b));
        let a0 = acts.kq.as_ptr().add(c * acts.k + b * QK_K);
        // Sums of bsum pairs, one i16 per pair of sub-blocks, in both halves.
        let bsp = bsum_pairs(acts, c, b);
        let bsp = _mm256_setr_m128i(bsp, bsp);
        let u: [__m256i; 4] =
            std::array::from_fn(|p| _mm256_madd_epi16(_mm256_shuffle_epi8(t[p], mins16), bsp));
        // Per group g (sub-blocks 2g and 2g + 1), the eight rows' minimum
        // sums in row order.
        let um = if acts.grouped(c) { Some(transpose4_epi32(&u)) } else { None };
        Q4KColumn { dd: _mm256_mul_ps(dh, da), ddm: _mm256_mul_ps(dmh, da), a0, u, um }
    }
}

/// Column `c`'s block `b` of Q8_K bsums (sixteen, one per 16 values)
/// added in pairs: i16 lane s is sub-block s's sum (exact in i16).
///
/// # Safety
/// The CPU must support avx2; block b of column c is within `acts.kbs`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn bsum_pairs(acts: &Acts, c: usize, b: usize) -> __m128i {
    let nb = acts.k / QK_K;
    // SAFETY: the caller's (the block's 16 bsums are within `kbs`).
    unsafe {
        let bs = acts.kbs.as_ptr().add((c * nb + b) * 16);
        _mm_hadd_epi16(
            _mm_loadu_si128(bs as *const __m128i),
            _mm_loadu_si128(bs.add(8) as *const __m128i),
        )
    }
}

/// A 4 × 4 transpose of 32-bit lanes in each 128-bit half: lane i of
/// result c's half is lane c of `u[i]`'s half. With `u[p]` holding row p's
/// four values in the low half and row p + 4's in the high, result c holds
/// value c of the eight rows in row order.
///
/// # Safety
/// The CPU must support avx2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn transpose4_epi32(u: &[__m256i; 4]) -> [__m256i; 4] {
    let a = _mm256_unpacklo_epi32(u[0], u[1]);
    let b = _mm256_unpacklo_epi32(u[2], u[3]);
    let c = _mm256_unpackhi_epi32(u[0], u[1]);
    let d = _mm256_unpackhi_epi32(u[2], u[3]);
    [
        _mm256_unpacklo_epi64(a, b),
        _mm256_unpackhi_epi64(a, b),
        _mm256_unpacklo_epi64(c, d),
        _mm256_unpackhi_epi64(c, d),
    ]
}

/// The eight rows' sums in row order from four registers of row pairs (per
/// p, row p's four i32 lanes in the low half, row p + 4's in the high): one
/// hadd tree.
///
/// # Safety
/// The CPU must support avx2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn hadd_rows(v: &[__m256i; 4]) -> __m256i {
    _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]))
}

/// The chain numerics' float step for eight rows (lanes): `acc +=
/// isum · (d·da)` and `accm += imin · (dmin·da)`, each one fused
/// multiply-add of the converted integer sum, as `Q4KChain::run` does per
/// row (per super-block, or per 64 values for a grouped column).
///
/// # Safety
/// The CPU must support avx2 and fma.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn chain_step(
    acc: &mut __m256,
    accm: &mut __m256,
    isum: __m256i,
    imin: __m256i,
    dd: __m256,
    ddm: __m256,
) {
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, *acc);
    *accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), ddm, *accm);
}

/// Q5_K (ggml's AVX2 `ggml_vec_dot_q5_K_q8_K`, or its tiled kernel for a
/// wide product).
struct Q5K;

impl Kern for Q5K {
    #[inline(always)]
    unsafe fn run<const R: usize, const N: usize>(
        w: &RowMat,
        acts: &Acts,
        r0: usize,
        c0: usize,
        out: &mut [[f32; N]; R],
    ) {
        let k = acts.k;
        let nb = k / QK_K;
        let at = w.at(r0, R);
        assert!(w.row_bytes >= nb * 176);
        assert!((c0 + N) * k <= acts.kq.len() && (c0 + N) * nb <= acts.kd.len());
        assert!((c0 + N) * nb * 16 <= acts.kbs.len());
        // SAFETY: loads within the R rows (`at`) and N columns asserted above.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); N]; R];
            let mut facc = [[0f32; N]; R];
            let m4 = _mm256_set1_epi8(0x0F);
            let wide: [bool; N] = std::array::from_fn(|j| acts.wide(c0 + j));
            let all_wide = N == 8 && wide.iter().all(|&w| w);
            let panel_mins =
                all_wide && c0.is_multiple_of(8) && (c0 / 8 + 1) * nb * 32 <= acts.kbp.len();
            let mut fv = [_mm256_setzero_ps(); R];
            let base = w.bytes().as_ptr().add(at.base);
            for b in 0..nb {
                let mut dw = [0f32; R];
                let mut dminw = [0f32; R];
                let mut sm = [[0u8; 16]; R];
                for r in 0..R {
                    let blk = base.add(r * at.row + b * at.block);
                    for l in 0..3 {
                        prefetch(blk.wrapping_add(if N == 1 { DEC_PF } else { PF_DIST } + 64 * l));
                    }
                    dw[r] = f16_at(blk);
                    dminw[r] = f16_at(blk.add(2));
                    sm[r] = k4_scales(blk.add(4));
                }
                let mut sumi = [[_mm256_setzero_si256(); N]; R];
                // Each row's eight scales as i16, in both halves: a group's
                // scale is then one byte shuffle away (the same values).
                let sc16: [__m256i; R] = std::array::from_fn(|r| {
                    _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(
                        sm[r].as_ptr() as *const __m128i
                    )))
                });
                for g in 0..4 {
                    // This group's activations of each column (`preload`).
                    let act = |j: usize| acts.kq.as_ptr().add((c0 + j) * k + b * QK_K + 64 * g);
                    // Byte indices of i16 scale s in every pair of bytes.
                    let pick = |s: usize| _mm256_set1_epi16((((2 * s + 1) << 8) | (2 * s)) as i16);
                    let (pl_idx, ph_idx) = (pick(2 * g), pick(2 * g + 1));
                    let al = preload::<R, N>(act);
                    let ah = preload::<R, N>(|j| act(j).add(32));
                    for r in 0..R {
                        let blk = base.add(r * at.row + b * at.block);
                        let hbits = _mm256_loadu_si256(blk.add(16) as *const __m256i);
                        let q = _mm256_loadu_si256(blk.add(48 + 32 * g) as *const __m256i);
                        let h0 = _mm256_and_si256(hbits, _mm256_set1_epi8(1 << (2 * g)));
                        let h1 = _mm256_and_si256(hbits, _mm256_set1_epi8(2 << (2 * g)));
                        // The chosen bit moved to bit 4 of its byte.
                        let (h0, h1) = match g {
                            0 => (_mm256_slli_epi16::<4>(h0), _mm256_slli_epi16::<3>(h1)),
                            1 => (_mm256_slli_epi16::<2>(h0), _mm256_slli_epi16::<1>(h1)),
                            2 => (h0, _mm256_srli_epi16::<1>(h1)),
                            _ => (_mm256_srli_epi16::<2>(h0), _mm256_srli_epi16::<3>(h1)),
                        };
                        let lo = _mm256_add_epi8(_mm256_and_si256(q, m4), h0);
                        let hi =
                            _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), h1);
                        // (A decode shuffles; a prompt's broadcast is
                        // shared by its columns and measured faster.)
                        let (sl, sh) = if N == 1 {
                            (
                                _mm256_shuffle_epi8(sc16[r], pl_idx),
                                _mm256_shuffle_epi8(sc16[r], ph_idx),
                            )
                        } else {
                            (
                                _mm256_set1_epi16(sm[r][2 * g] as i16),
                                _mm256_set1_epi16(sm[r][2 * g + 1] as i16),
                            )
                        };
                        for j in 0..N {
                            let al = act_at::<R>(al[j], act(j));
                            let ah = act_at::<R>(ah[j], act(j).add(32));
                            let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, al), sl);
                            let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ah), sh);
                            sumi[r][j] = _mm256_add_epi32(sumi[r][j], _mm256_add_epi32(pl, ph));
                        }
                    }
                }
                if all_wide {
                    // ggml's tiled kernel for eight columns at once: lane j
                    // is `fma(fma(-dmin, Σ min·bsum, d · Σ s), da, facc)`.
                    let mut dav = [0f32; 8];
                    for j in 0..N {
                        dav[j] = *acts.kd.get_unchecked((c0 + j) * nb + b);
                    }
                    let dav = _mm256_loadu_ps(dav.as_ptr());
                    for r in 0..R {
                        // Σ min·bsum of the eight columns: per pair of
                        // sub-blocks one madd of the row's two mins with
                        // the panel's pairs of sums (`Acts::kbp`), exact.
                        let imv = if panel_mins {
                            let pp = acts.kbp.as_ptr().add(((c0 / 8) * nb + b) * 32);
                            let mut iv = _mm256_setzero_si256();
                            for t in 0..4 {
                                let mm = sm[r][8 + 2 * t] as i32 | (sm[r][9 + 2 * t] as i32) << 16;
                                let p = _mm256_loadu_si256(pp.add(8 * t) as *const __m256i);
                                iv = _mm256_add_epi32(
                                    iv,
                                    _mm256_madd_epi16(p, _mm256_set1_epi32(mm)),
                                );
                            }
                            iv
                        } else {
                            let mut im = [0i32; 8];
                            for j in 0..N {
                                let bs = acts.kbs.get_unchecked(((c0 + j) * nb + b) * 16..);
                                im[j] = k_mins8(&sm[r], bs);
                            }
                            _mm256_loadu_si256(im.as_ptr() as *const __m256i)
                        };
                        let imv = _mm256_cvtepi32_ps(imv);
                        let iv = _mm256_cvtepi32_ps(hsum_i32_x8(&sumi[r]));
                        let v = _mm256_fmadd_ps(
                            _mm256_set1_ps(-dminw[r]),
                            imv,
                            _mm256_mul_ps(_mm256_set1_ps(dw[r]), iv),
                        );
                        fv[r] = _mm256_fmadd_ps(v, dav, fv[r]);
                    }
                    continue;
                }
                for j in 0..N {
                    let col = c0 + j;
                    let da = *acts.kd.get_unchecked(col * nb + b);
                    let bs = acts.kbs.get_unchecked((col * nb + b) * 16..);
                    for r in 0..R {
                        let im = k_mins8(&sm[r], bs) as f32;
                        if wide[j] {
                            // ggml's tiled kernel (see `rows::dot`).
                            let v = (-dminw[r]).mul_add(im, dw[r] * hsum_i32(sumi[r][j]) as f32);
                            facc[r][j] = v.mul_add(da, facc[r][j]);
                            continue;
                        }
                        acc[r][j] = _mm256_fmadd_ps(
                            _mm256_set1_ps(da * dw[r]),
                            _mm256_cvtepi32_ps(sumi[r][j]),
                            acc[r][j],
                        );
                        facc[r][j] = (-da * dminw[r]).mul_add(im, facc[r][j]);
                    }
                }
            }
            for r in 0..R {
                if all_wide {
                    let mut o = [0f32; 8];
                    _mm256_storeu_ps(o.as_mut_ptr(), fv[r]);
                    out[r].copy_from_slice(&o[..N]);
                    continue;
                }
                for j in 0..N {
                    out[r][j] =
                        if wide[j] { facc[r][j] } else { hsum8_reg(acc[r][j]) + facc[r][j] };
                }
            }
        }
    }
}

/// The 32 values (0..64) of chunk `kk` of half `h` of the Q6_K block at
/// `blk`: the low (kk < 2) or high nibbles of the ql half, bits 2·kk.. of
/// qh at bit 4.
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// `blk` points to a whole Q6_K block (210 bytes).
#[inline(always)]
unsafe fn q6k_chunk(blk: *const u8, h: usize, kk: usize) -> __m256i {
    // SAFETY: within the block (the caller's contract).
    unsafe {
        let m15 = _mm256_set1_epi8(15);
        let ql = _mm256_loadu_si256(blk.add(64 * h + 32 * (kk & 1)) as *const __m256i);
        let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
        let low = if kk < 2 {
            _mm256_and_si256(ql, m15)
        } else {
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql), m15)
        };
        let hb = match kk {
            0 => _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(3))),
            1 => _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(12))),
            2 => _mm256_and_si256(qh, _mm256_set1_epi8(48)),
            _ => _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(-64))),
        };
        _mm256_or_si256(low, hb)
    }
}

/// The shuffle that picks chunk `kk` of half `h`'s two scales from a Q6_K
/// block's sixteen scale bytes: byte s eight times, then s + 1.
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels).
#[inline(always)]
unsafe fn q6k_pick(h: usize, kk: usize) -> __m128i {
    let s = (8 * h + 2 * kk) as i8;
    // SAFETY: register arithmetic only.
    unsafe { _mm_unpacklo_epi64(_mm_set1_epi8(s), _mm_set1_epi8(s + 1)) }
}

thread_local! {
    /// Each thread's decoded Q6_K rows for `q6k_wide`.
    static Q6_DECODED: std::cell::RefCell<Vec<__m256i>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Registers per decoded Q6_K block in `q6k_wide`'s scratch: eight chunks
/// of 32 values, their eight scale pairs, the sixteen scales, `d`.
const Q6_SLOTS: usize = 18;

/// [`Q6K`] on a product of many columns, all on ggml's tiled numbers
/// (`Acts::wide`): each block of rows is decoded once (values, scale pairs,
/// scales, `d`) into scratch and met there by every group of eight columns,
/// instead of once per group. The same integer lanes and the same
/// epilogue per block as `Q6K::run`'s wide columns, so the same numbers.
///
/// # Safety
/// The CPU has avx2, fma and f16c (it is called from the AVX2 kernels);
/// rows `rows` of `out` are the caller's (`OutRows::set`); `w` and `acts`
/// hold them (bounds are asserted).
#[inline(always)]
unsafe fn q6k_wide(
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) -> bool {
    if !(0..acts.n).all(|c| acts.wide(c)) {
        return false;
    }
    // SAFETY: the caller has the features; the scratch is this thread's.
    Q6_DECODED.with_borrow_mut(|dec| unsafe {
        if w.fmt == Fmt::Q3K {
            q6k_wide_in::<true>(dec, w, acts, rows, out)
        } else {
            q6k_wide_in::<false>(dec, w, acts, rows, out)
        }
    });
    true
}

/// The body of [`q6k_wide`], out of the thread-local's closure (which
/// would not inherit the target features).
///
/// # Safety
/// The CPU must support avx2, fma and f16c; as [`q6k_wide`].
///
/// `Q3`: Q3_K rows (`Q3K`) in the same scratch: their codes (two low bits
/// and the high bit at 4, unsigned 0 ..= 7), scale pairs and scales less
/// 32, `d`; the columns' offset is then `4 · Σ s·bsum`, ggml's act-bias.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_wide_in<const Q3: bool>(
    dec: &mut Vec<__m256i>,
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    let k = acts.k;
    let n = acts.n;
    let nb = k / QK_K;
    assert!(w.row_bytes >= nb * if Q3 { 110 } else { 210 });
    assert!(n * k <= acts.kq.len() && n * nb <= acts.kd.len());
    assert!(n * nb * 16 <= acts.kbs.len());
    dec.resize(ROW_BLOCK * nb * Q6_SLOTS, _mm256_setzero_si256());
    // SAFETY: every pointer below stays within the rows (asserted), `dec`
    // (sized above: ROW_BLOCK rows of nb blocks) and the n columns'
    // activations (asserted).
    unsafe {
        for rb in rows.clone().step_by(ROW_BLOCK) {
            let re = (rb + ROW_BLOCK).min(rows.end);
            for r in rb..re {
                let at = w.at(r, 1);
                let row = w.bytes().as_ptr().add(at.base);
                for b in 0..nb {
                    let blk = row.add(b * at.block);
                    let o = dec.as_mut_ptr().add(((r - rb) * nb + b) * Q6_SLOTS);
                    if Q3 {
                        let sc8 = q3k_scales8(blk);
                        let qs = [
                            _mm256_loadu_si256(blk.add(32) as *const __m256i),
                            _mm256_loadu_si256(blk.add(64) as *const __m256i),
                        ];
                        let hm = _mm256_loadu_si256(blk as *const __m256i);
                        for h in 0..2 {
                            for kk in 0..4 {
                                let ch = 4 * h + kk;
                                let low = _mm256_and_si256(
                                    _mm256_srl_epi16(qs[h], _mm_cvtsi32_si128(2 * kk as i32)),
                                    _mm256_set1_epi8(3),
                                );
                                let hb = _mm256_and_si256(
                                    _mm256_srl_epi16(hm, _mm_cvtsi32_si128(ch as i32)),
                                    _mm256_set1_epi8(1),
                                );
                                o.add(ch).write(_mm256_or_si256(low, _mm256_slli_epi16::<2>(hb)));
                                o.add(8 + ch).write(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                                    sc8,
                                    q6k_pick(h, kk),
                                )));
                            }
                        }
                        o.add(16).write(_mm256_cvtepi8_epi16(sc8));
                        o.add(17).write(_mm256_castps_si256(_mm256_set1_ps(f16_at(blk.add(108)))));
                        continue;
                    }
                    let sc8 = _mm_loadu_si128(blk.add(192) as *const __m128i);
                    for h in 0..2 {
                        for kk in 0..4 {
                            let pick = q6k_pick(h, kk);
                            let ch = 4 * h + kk;
                            o.add(ch).write(q6k_chunk(blk, h, kk));
                            o.add(8 + ch).write(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick)));
                        }
                    }
                    o.add(16).write(_mm256_cvtepi8_epi16(sc8));
                    o.add(17).write(_mm256_castps_si256(_mm256_set1_ps(f16_at(blk.add(208)))));
                }
            }
            let mut c = 0;
            while c < n {
                let m = (n - c).min(8);
                for r in rb..re {
                    let d = dec.as_ptr().add((r - rb) * nb * Q6_SLOTS);
                    let v = match m {
                        8 => q6k_cols::<8, Q3>(d, acts, c, nb),
                        7 => q6k_cols::<7, Q3>(d, acts, c, nb),
                        6 => q6k_cols::<6, Q3>(d, acts, c, nb),
                        5 => q6k_cols::<5, Q3>(d, acts, c, nb),
                        4 => q6k_cols::<4, Q3>(d, acts, c, nb),
                        3 => q6k_cols::<3, Q3>(d, acts, c, nb),
                        2 => q6k_cols::<2, Q3>(d, acts, c, nb),
                        _ => q6k_cols::<1, Q3>(d, acts, c, nb),
                    };
                    for (j, x) in v.iter().take(m).enumerate() {
                        out.set(c + j, r, *x);
                    }
                }
                c += m;
            }
        }
    }
}

/// One decoded Q6_K row (`d`: its blocks in `q6k_wide`'s scratch) against
/// columns `c .. c + M` on the tiled numbers: per block each column's
/// exact lanes less `32 · Σ s·bsum`, summed, then `fma(d · Σ, d_a, acc)`,
/// eight columns in the lanes.
///
/// # Safety
/// The CPU has avx2, fma and f16c; `d` holds `nb` decoded blocks; the
/// columns' activations exist (asserted by the caller).
#[inline(always)]
unsafe fn q6k_cols<const M: usize, const Q3: bool>(
    d: *const __m256i,
    acts: &Acts,
    c: usize,
    nb: usize,
) -> [f32; 8] {
    let k = acts.k;
    // SAFETY: within the decoded row and the columns (the caller's
    // contract).
    unsafe {
        let mut fv = _mm256_setzero_ps();
        for b in 0..nb {
            let o = d.add(b * Q6_SLOTS);
            let mut sumi = [_mm256_setzero_si256(); M];
            for ch in 0..8 {
                let wq = *o.add(ch);
                let sv = *o.add(8 + ch);
                for (j, s) in sumi.iter_mut().enumerate() {
                    let a =
                        _mm256_loadu_si256(acts.kq.as_ptr().add((c + j) * k + b * QK_K + 32 * ch)
                            as *const __m256i);
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(_mm256_maddubs_epi16(wq, a), sv));
                }
            }
            let scales16 = *o.add(16);
            let mut sv = [_mm256_setzero_si256(); 8];
            let mut dav = [0f32; 8];
            for j in 0..M {
                let col = c + j;
                dav[j] = *acts.kd.get_unchecked(col * nb + b);
                let bs = _mm256_loadu_si256(
                    acts.kbs.as_ptr().add((col * nb + b) * 16) as *const __m256i
                );
                let p = _mm256_madd_epi16(bs, scales16);
                let corr = if Q3 { _mm256_slli_epi32::<2>(p) } else { _mm256_slli_epi32::<5>(p) };
                sv[j] = _mm256_sub_epi32(sumi[j], corr);
            }
            let iv = _mm256_cvtepi32_ps(hsum_i32_x8(&sv));
            let v = _mm256_mul_ps(_mm256_castsi256_ps(*o.add(17)), iv);
            fv = _mm256_fmadd_ps(v, _mm256_loadu_ps(dav.as_ptr()), fv);
        }
        let mut r = [0f32; 8];
        _mm256_storeu_ps(r.as_mut_ptr(), fv);
        r
    }
}

/// Q6_K decode columns (ungrouped, not wide) on 512-bit registers, eight
/// rows a pass: one register holds a 32-value chunk of row p and of row
/// p + 4, so each `maddubs` and `vpdpwssd` (the scale's multiply-add and
/// the sum in one) covers two rows, and the header work is shared. Each
/// row keeps its eight i32 lanes of `Q6K::run` (integer sums are exact in
/// any order) and its float steps per lane — `(da · dw) · lanes + acc`,
/// then `hsum8_reg` — so its numbers.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512vnni, avx2,
/// fma and f16c; rows `rows` of `out` are the caller's (`OutRows::set`);
/// `w` and `acts` hold them (bounds are asserted).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k_dec8_512(w: &RowMat, acts: &Acts, rows: std::ops::Range<usize>, out: &OutRows<'_>) {
    let k = acts.k;
    let nb = k / QK_K;
    let n = acts.n;
    assert!(w.row_bytes >= nb * 210 && w.bytes().len() >= rows.end * w.row_bytes);
    assert!(n * k <= acts.kq.len() && n * nb <= acts.kd.len() && n * nb * 16 <= acts.kbs.len());
    let full = rows.start + (rows.end - rows.start) / 8 * 8;
    // Per chunk i = 4h + kk (scales s = 2i and s + 1): the i16 indices of
    // scale s eight times then s + 1 eight times, in row p's sixteen
    // scales (the low half) and in row p + 4's (the high half).
    let mut pick = [[0i16; 32]; 8];
    for (i, p) in pick.iter_mut().enumerate() {
        for (l, v) in p.iter_mut().enumerate() {
            *v = (l / 16 * 16 + 2 * i + l % 16 / 8) as i16;
        }
    }
    // SAFETY: the groups' rows are within `rows` (asserted against `w`),
    // the columns within `acts` (asserted); the features are this
    // function's.
    unsafe {
        for rb in (rows.start..full).step_by(8) {
            for c0 in (0..n).step_by(DEC_COLS) {
                match (n - c0).min(DEC_COLS) {
                    1 => q6k_group_512::<1>(w, acts, rb, c0, &pick, out),
                    2 => q6k_group_512::<2>(w, acts, rb, c0, &pick, out),
                    3 => q6k_group_512::<3>(w, acts, rb, c0, &pick, out),
                    _ => q6k_group_512::<4>(w, acts, rb, c0, &pick, out),
                }
            }
        }
        for r in full..rows.end {
            for c in 0..n {
                let mut o = [[0f32; 1]; 1];
                Q6K::run::<1, 1>(w, acts, r, c, &mut o);
                out.set(c, r, o[0][0]);
            }
        }
    }
}

/// Rows `rb..rb + 8` and columns `c0..c0 + N` of [`q6k_dec8_512`] (the
/// column count fixed, so the sums stay in registers).
///
/// # Safety
/// As [`q6k_dec8_512`], whose assertions it relies on: the eight rows and
/// the `N` columns are within `w` and `acts`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k_group_512<const N: usize>(
    w: &RowMat,
    acts: &Acts,
    rb: usize,
    c0: usize,
    pick: &[[i16; 32]; 8],
    out: &OutRows<'_>,
) {
    let k = acts.k;
    let nb = k / QK_K;
    // SAFETY: loads stay within the eight rows' blocks and the columns'
    // activations (the caller's contract).
    unsafe {
        let m15 = _mm512_set1_epi8(15);
        let mut pk = [_mm512_setzero_si512(); 8];
        for (v, p) in pk.iter_mut().zip(pick) {
            *v = _mm512_loadu_si512(p.as_ptr().cast());
        }
        let at = w.at(rb, 8);
        let grouped = at.row < at.block;
        let base = w.bytes().as_ptr().add(at.base);
        let mut acc = [[_mm512_setzero_ps(); 4]; N];
        for b in 0..nb {
            let mut blk = [base; 8];
            for (r, p) in blk.iter_mut().enumerate() {
                *p = base.add(r * at.row + b * at.block);
            }
            if grouped {
                // The eight blocks are one run of 1680 bytes: its lines
                // further on.
                prefetch_run(blk[0], 27);
            } else {
                for p in blk {
                    for l in 0..4 {
                        prefetch(p.wrapping_add(DEC8_PF + 64 * l));
                    }
                }
            }
            let mut iv = [[_mm512_setzero_si512(); 4]; N];
            let mut sc = [_mm512_setzero_si512(); 4];
            for p in 0..4 {
                // Rows p and p + 4's 32 bytes at offset `o` in one register.
                let pair = |o: usize| {
                    _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(_mm256_loadu_si256(blk[p].add(o) as *const __m256i)),
                        _mm256_loadu_si256(blk[p + 4].add(o) as *const __m256i),
                    )
                };
                sc[p] = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(
                        blk[p].add(192) as *const __m128i
                    ))),
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(blk[p + 4].add(192) as *const __m128i)),
                );
                for h in 0..2 {
                    let ql = [pair(64 * h), pair(64 * h + 32)];
                    let qh = pair(128 + 32 * h);
                    for kk in 0..4 {
                        // `q6k_chunk` on both rows.
                        let low = if kk < 2 {
                            _mm512_and_si512(ql[kk & 1], m15)
                        } else {
                            _mm512_and_si512(_mm512_srli_epi16::<4>(ql[kk & 1]), m15)
                        };
                        let hb = match kk {
                            0 => _mm512_slli_epi16::<4>(_mm512_and_si512(qh, _mm512_set1_epi8(3))),
                            1 => _mm512_slli_epi16::<2>(_mm512_and_si512(qh, _mm512_set1_epi8(12))),
                            2 => _mm512_and_si512(qh, _mm512_set1_epi8(48)),
                            _ => {
                                _mm512_srli_epi16::<2>(_mm512_and_si512(qh, _mm512_set1_epi8(-64)))
                            }
                        };
                        let q = _mm512_or_si512(low, hb);
                        let s = _mm512_permutexvar_epi16(pk[4 * h + kk], sc[p]);
                        for (j, iv) in iv.iter_mut().enumerate() {
                            let a = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                acts.kq.as_ptr().add((c0 + j) * k + b * QK_K + 128 * h + 32 * kk)
                                    as *const __m256i,
                            ));
                            iv[p] = _mm512_dpwssd_epi32(iv[p], _mm512_maddubs_epi16(q, a), s);
                        }
                    }
                }
            }
            // Each pair's `dw` in its half.
            let mut dw = [_mm512_setzero_ps(); 4];
            for (p, d) in dw.iter_mut().enumerate() {
                *d = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                    _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(f16_at(
                        blk[p].add(208),
                    )))),
                    _mm256_castps_pd(_mm256_set1_ps(f16_at(blk[p + 4].add(208)))),
                ));
            }
            for (j, acc) in acc.iter_mut().enumerate() {
                let col = c0 + j;
                let da = _mm512_set1_ps(*acts.kd.get_unchecked(col * nb + b));
                let bs = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    acts.kbs.as_ptr().add((col * nb + b) * 16) as *const __m256i,
                ));
                for p in 0..4 {
                    let corr = _mm512_slli_epi32::<5>(_mm512_madd_epi16(bs, sc[p]));
                    let s = _mm512_sub_epi32(iv[j][p], corr);
                    acc[p] =
                        _mm512_fmadd_ps(_mm512_mul_ps(dw[p], da), _mm512_cvtepi32_ps(s), acc[p]);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            for (p, a) in acc.iter().enumerate() {
                out.set(c0 + j, rb + p, hsum8_reg(_mm512_castps512_ps256(*a)));
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a)));
                out.set(c0 + j, rb + p + 4, hsum8_reg(hi));
            }
        }
    }
}

/// Q6_K (ggml's AVX2 `ggml_vec_dot_q6_K_q8_K`, or its tiled kernel for a
/// wide product).
struct Q6K;

impl Kern for Q6K {
    #[inline(always)]
    unsafe fn dec(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        // SAFETY: forwarded.
        unsafe { Self::dec_many(w, acts, rows, out) }
    }

    #[inline(always)]
    unsafe fn dec_many(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        if super::isa() != super::Isa::Avx512Vnni || (0..acts.n).any(|c| acts.wide(c)) {
            return false;
        }
        // SAFETY: forwarded; the CPU has the 512-bit features (`isa`).
        unsafe { q6k_dec8_512(w, acts, rows, out) };
        true
    }

    #[inline(always)]
    unsafe fn wide(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        // SAFETY: forwarded.
        unsafe { q6k_wide(w, acts, rows, out) }
    }

    #[inline(always)]
    unsafe fn run<const R: usize, const N: usize>(
        w: &RowMat,
        acts: &Acts,
        r0: usize,
        c0: usize,
        out: &mut [[f32; N]; R],
    ) {
        let k = acts.k;
        let nb = k / QK_K;
        let at = w.at(r0, R);
        assert!(w.row_bytes >= nb * 210);
        assert!((c0 + N) * k <= acts.kq.len() && (c0 + N) * nb <= acts.kd.len());
        assert!((c0 + N) * nb * 16 <= acts.kbs.len());
        // SAFETY: loads within the R rows (`at`) and N columns asserted above.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); N]; R];
            let mut facc = [[0f32; N]; R];
            let wide: [bool; N] = std::array::from_fn(|j| acts.wide(c0 + j));
            let all_wide = N == 8 && wide.iter().all(|&w| w);
            let mut fv = [_mm256_setzero_ps(); R];
            let base = w.bytes().as_ptr().add(at.base);
            for b in 0..nb {
                for r in 0..R {
                    let blk = base.add(r * at.row + b * at.block);
                    for l in 0..4 {
                        prefetch(blk.wrapping_add(PF_DIST + 64 * l));
                    }
                }
                let mut sumi = [[_mm256_setzero_si256(); N]; R];
                // Each row's sixteen scale bytes, loaded once a block.
                let sc8: [__m128i; R] = std::array::from_fn(|r| {
                    _mm_loadu_si128(base.add(r * at.row + b * at.block + 192) as *const __m128i)
                });
                for h in 0..2 {
                    for kk in 0..4 {
                        // This chunk's activations of each column (`preload`).
                        let act = |j: usize| {
                            acts.kq.as_ptr().add((c0 + j) * k + b * QK_K + 128 * h + 32 * kk)
                        };
                        // Bytes s (eight times), then s + 1: the two scales
                        // of this chunk's halves, widened below.
                        let pick = q6k_pick(h, kk);
                        let av = preload::<R, N>(act);
                        for r in 0..R {
                            let blk = base.add(r * at.row + b * at.block);
                            let wq = q6k_chunk(blk, h, kk);
                            // Scale s in the low half, s + 1 in the high
                            // one, as i16 (the same values).
                            let sv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8[r], pick));
                            for j in 0..N {
                                let a = act_at::<R>(av[j], act(j));
                                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, a), sv);
                                sumi[r][j] = _mm256_add_epi32(sumi[r][j], p);
                            }
                        }
                    }
                }
                for r in 0..R {
                    let blk = base.add(r * at.row + b * at.block);
                    let dw = f16_at(blk.add(208));
                    let scales16 =
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i));
                    if all_wide {
                        // ggml's tiled kernel for eight columns at once:
                        // lane j is `(dw · Σ s_j) · da_j + facc_j`.
                        let mut sv = [_mm256_setzero_si256(); N];
                        let mut dav = [0f32; 8];
                        for j in 0..N {
                            let col = c0 + j;
                            dav[j] = *acts.kd.get_unchecked(col * nb + b);
                            let bs = _mm256_loadu_si256(
                                acts.kbs.as_ptr().add((col * nb + b) * 16) as *const __m256i
                            );
                            let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, scales16));
                            sv[j] = _mm256_sub_epi32(sumi[r][j], corr);
                        }
                        let iv = _mm256_cvtepi32_ps(hsum_i32_x8(&sv));
                        let v = _mm256_mul_ps(_mm256_set1_ps(dw), iv);
                        fv[r] = _mm256_fmadd_ps(v, _mm256_loadu_ps(dav.as_ptr()), fv[r]);
                        continue;
                    }
                    for j in 0..N {
                        let col = c0 + j;
                        let da = *acts.kd.get_unchecked(col * nb + b);
                        let bs = _mm256_loadu_si256(
                            acts.kbs.as_ptr().add((col * nb + b) * 16) as *const __m256i
                        );
                        let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, scales16));
                        let s = _mm256_sub_epi32(sumi[r][j], corr);
                        if wide[j] {
                            // ggml's tiled kernel (see `rows::dot`).
                            facc[r][j] = (dw * hsum_i32(s) as f32).mul_add(da, facc[r][j]);
                        } else {
                            acc[r][j] = _mm256_fmadd_ps(
                                _mm256_set1_ps(da * dw),
                                _mm256_cvtepi32_ps(s),
                                acc[r][j],
                            );
                        }
                    }
                }
            }
            for r in 0..R {
                if all_wide {
                    let mut o = [0f32; 8];
                    _mm256_storeu_ps(o.as_mut_ptr(), fv[r]);
                    out[r].copy_from_slice(&o[..N]);
                    continue;
                }
                for j in 0..N {
                    out[r][j] = if wide[j] { facc[r][j] } else { hsum8_reg(acc[r][j]) };
                }
            }
        }
    }
}

/// Q2_K rows on the chain numbers of ggml's repacked `q2_K_8x8` (see
/// `rows::dot`): per super-block, row and column the exact integers of each
/// half (values through `maddubs`, sub-block scales by `madd`) and of the
/// minimums against the column's sums of 16 (`madd`), then one fused
/// multiply-add per super-block into each accumulator — two, one per half,
/// for a column ggml's gemm grouped.
struct Q2K;

impl Kern for Q2K {
    const DEC_ROWS: usize = 4;

    #[inline(always)]
    unsafe fn wide(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        // SAFETY: the caller has the features; the scratch is this thread's.
        Q6_DECODED.with_borrow_mut(|dec| unsafe { q2k_wide_in(dec, w, acts, rows, out) });
        true
    }

    #[inline(always)]
    unsafe fn run<const R: usize, const N: usize>(
        w: &RowMat,
        acts: &Acts,
        r0: usize,
        c0: usize,
        out: &mut [[f32; N]; R],
    ) {
        let k = acts.k;
        let nb = k / QK_K;
        let at = w.at(r0, R);
        assert!(w.row_bytes >= nb * 84);
        assert!((c0 + N) * k <= acts.kq.len() && (c0 + N) * nb <= acts.kd.len());
        assert!((c0 + N) * nb * 16 <= acts.kbs.len());
        // SAFETY: loads within the R rows (`at`) and N columns asserted above.
        unsafe {
            let mut acc = [[0f32; N]; R];
            let mut accm = [[0f32; N]; R];
            let grouped: [bool; N] = std::array::from_fn(|j| acts.grouped(c0 + j));
            let base = w.bytes().as_ptr().add(at.base);
            let m3 = _mm256_set1_epi8(3);
            let m4 = _mm_set1_epi8(15);
            for b in 0..nb {
                for r in 0..R {
                    let blk = base.add(r * at.row + b * at.block);
                    prefetch(blk.wrapping_add(PF_DIST));
                    prefetch(blk.wrapping_add(PF_DIST + 64));
                }
                for r in 0..R {
                    let blk = base.add(r * at.row + b * at.block);
                    let sc16 = _mm_loadu_si128(blk as *const __m128i);
                    let scl = _mm_and_si128(sc16, m4);
                    let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc16), m4));
                    let (dw, dmin) = (f16_at(blk.add(80)), f16_at(blk.add(82)));
                    for j in 0..N {
                        let col = c0 + j;
                        let a0 = acts.kq.as_ptr().add(col * k + b * QK_K);
                        let mut half = [0i32; 2];
                        for (h, hv) in half.iter_mut().enumerate() {
                            let qs = _mm256_loadu_si256(blk.add(16 + 32 * h) as *const __m256i);
                            let mut s = _mm256_setzero_si256();
                            for g in 0..4 {
                                let q = _mm256_and_si256(
                                    _mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * g as i32)),
                                    m3,
                                );
                                let a =
                                    _mm256_loadu_si256(a0.add(128 * h + 32 * g) as *const __m256i);
                                let sv =
                                    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scl, q6k_pick(h, g)));
                                s = _mm256_add_epi32(
                                    s,
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), sv),
                                );
                            }
                            *hv = hsum_i32(s);
                        }
                        let bs = _mm256_loadu_si256(
                            acts.kbs.as_ptr().add((col * nb + b) * 16) as *const __m256i
                        );
                        // Lanes 0-3: sub-blocks 0-7, lanes 4-7: 8-15.
                        let pm = _mm256_madd_epi16(bs, mins);
                        let lo = _mm256_castsi256_si128(pm);
                        let hi = _mm256_extracti128_si256::<1>(pm);
                        let sum4 = |v: __m128i| {
                            let v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
                            _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32::<1>(v)))
                        };
                        let mins2 = [sum4(lo), sum4(hi)];
                        let da = *acts.kd.get_unchecked(col * nb + b);
                        if grouped[j] {
                            for h in 0..2 {
                                acc[r][j] = (half[h] as f32).mul_add(dw * da, acc[r][j]);
                                accm[r][j] = (mins2[h] as f32).mul_add(dmin * da, accm[r][j]);
                            }
                        } else {
                            let (i, m) = (half[0] + half[1], mins2[0] + mins2[1]);
                            acc[r][j] = (i as f32).mul_add(dw * da, acc[r][j]);
                            accm[r][j] = (m as f32).mul_add(dmin * da, accm[r][j]);
                        }
                    }
                }
            }
            for r in 0..R {
                for j in 0..N {
                    out[r][j] = acc[r][j] - accm[r][j];
                }
            }
        }
    }
}

/// Registers per decoded Q2_K block in `q2k_wide_in`'s scratch: eight
/// chunks of 32 codes, their eight scale pairs, the sixteen minimums,
/// `d`, `dmin`.
const Q2_SLOTS: usize = 19;

/// [`Q2K`] on a product of many columns: each block of rows is decoded
/// once into scratch and met there by every group of eight columns, the
/// columns in the lanes — each half's integer and the minimums' of eight
/// columns summed at once (`hsum_i32_x8`), then the chain's fused
/// multiply-adds lane by lane: one per super-block for a column ggml's
/// gemv runs, one per half for a column its gemm grouped. The numbers of
/// `Q2K::run`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; rows `rows` of `out` are the
/// caller's; `w` and `acts` hold them (bounds are asserted).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2k_wide_in(
    dec: &mut Vec<__m256i>,
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    let (k, n) = (acts.k, acts.n);
    let nb = k / QK_K;
    assert!(w.row_bytes >= nb * 84);
    assert!(n * k <= acts.kq.len() && n * nb <= acts.kd.len());
    assert!(n * nb * 16 <= acts.kbs.len());
    dec.resize(ROW_BLOCK * nb * Q2_SLOTS, _mm256_setzero_si256());
    // SAFETY: every pointer below stays within the rows (`w.at`), `dec`
    // (ROW_BLOCK rows of nb blocks) and the n columns' activations
    // (asserted).
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(15);
        for rb in rows.clone().step_by(ROW_BLOCK) {
            let re = (rb + ROW_BLOCK).min(rows.end);
            for r in rb..re {
                let at = w.at(r, 1);
                let row = w.bytes().as_ptr().add(at.base);
                for b in 0..nb {
                    let blk = row.add(b * at.block);
                    let o = dec.as_mut_ptr().add(((r - rb) * nb + b) * Q2_SLOTS);
                    let sc16 = _mm_loadu_si128(blk as *const __m128i);
                    let scl = _mm_and_si128(sc16, m4);
                    for h in 0..2 {
                        let qs = _mm256_loadu_si256(blk.add(16 + 32 * h) as *const __m256i);
                        for g in 0..4 {
                            let sh = _mm_cvtsi32_si128(2 * g as i32);
                            o.add(4 * h + g).write(_mm256_and_si256(_mm256_srl_epi16(qs, sh), m3));
                            o.add(8 + 4 * h + g)
                                .write(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(scl, q6k_pick(h, g))));
                        }
                    }
                    let mins = _mm_and_si128(_mm_srli_epi16::<4>(sc16), m4);
                    o.add(16).write(_mm256_cvtepu8_epi16(mins));
                    o.add(17).write(_mm256_castps_si256(_mm256_set1_ps(f16_at(blk.add(80)))));
                    o.add(18).write(_mm256_castps_si256(_mm256_set1_ps(f16_at(blk.add(82)))));
                }
            }
            let mut c = 0;
            while c < n {
                let m = (n - c).min(8);
                for r in rb..re {
                    let d = dec.as_ptr().add((r - rb) * nb * Q2_SLOTS);
                    let v = match m {
                        8 => q2k_cols::<8>(d, acts, c, nb),
                        7 => q2k_cols::<7>(d, acts, c, nb),
                        6 => q2k_cols::<6>(d, acts, c, nb),
                        5 => q2k_cols::<5>(d, acts, c, nb),
                        4 => q2k_cols::<4>(d, acts, c, nb),
                        3 => q2k_cols::<3>(d, acts, c, nb),
                        2 => q2k_cols::<2>(d, acts, c, nb),
                        _ => q2k_cols::<1>(d, acts, c, nb),
                    };
                    for (j, x) in v.iter().take(m).enumerate() {
                        out.set(c + j, r, *x);
                    }
                }
                c += m;
            }
        }
    }
}

/// One decoded Q2_K row (`d`: its blocks in `q2k_wide_in`'s scratch)
/// against columns `c .. c + M`, a column per lane.
///
/// # Safety
/// The CPU has avx2, fma and f16c; `d` holds `nb` decoded blocks; the
/// columns' activations exist (asserted by the caller).
#[inline(always)]
unsafe fn q2k_cols<const M: usize>(
    d: *const __m256i,
    acts: &Acts,
    c: usize,
    nb: usize,
) -> [f32; 8] {
    let k = acts.k;
    // SAFETY: within the decoded row and the columns (the caller's
    // contract).
    unsafe {
        let grouped: [i32; 8] = std::array::from_fn(|j| -((j < M && acts.grouped(c + j)) as i32));
        let gmask = _mm256_castsi256_ps(_mm256_loadu_si256(grouped.as_ptr() as *const __m256i));
        let lo4 = _mm256_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0);
        let (mut acc, mut accm) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for b in 0..nb {
            let o = d.add(b * Q2_SLOTS);
            // Each half's eight column accumulators in registers, one half
            // at a time (a loop: a closure would not inherit the target
            // features).
            let mut halves = [_mm256_setzero_si256(); 2];
            for (h, hv) in halves.iter_mut().enumerate() {
                let mut s = [_mm256_setzero_si256(); 8];
                for ch in 4 * h..4 * h + 4 {
                    let (wq, sv) = (*o.add(ch), *o.add(8 + ch));
                    for (j, sj) in s.iter_mut().enumerate().take(M) {
                        let a = _mm256_loadu_si256(
                            acts.kq.as_ptr().add((c + j) * k + b * QK_K + 32 * ch)
                                as *const __m256i,
                        );
                        *sj = _mm256_add_epi32(
                            *sj,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(wq, a), sv),
                        );
                    }
                }
                *hv = hsum_i32_x8(&s);
            }
            let [lo, hi] = halves;
            let mins16 = *o.add(16);
            let mut ml = [_mm256_setzero_si256(); 8];
            let mut mh = [_mm256_setzero_si256(); 8];
            let mut dav = [0f32; 8];
            for j in 0..M {
                let col = c + j;
                dav[j] = *acts.kd.get_unchecked(col * nb + b);
                let bs = _mm256_loadu_si256(
                    acts.kbs.as_ptr().add((col * nb + b) * 16) as *const __m256i
                );
                let pm = _mm256_madd_epi16(bs, mins16);
                ml[j] = _mm256_and_si256(pm, lo4);
                mh[j] = _mm256_andnot_si256(lo4, pm);
            }
            let (mlo, mhi) = (hsum_i32_x8(&ml), hsum_i32_x8(&mh));
            let da = _mm256_loadu_ps(dav.as_ptr());
            let dd = _mm256_mul_ps(_mm256_castsi256_ps(*o.add(17)), da);
            let dm = _mm256_mul_ps(_mm256_castsi256_ps(*o.add(18)), da);
            let acc_g = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(hi),
                dd,
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), dd, acc),
            );
            let accm_g = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(mhi),
                dm,
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(mlo), dm, accm),
            );
            let acc_u = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)), dd, acc);
            let accm_u = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(mlo, mhi)), dm, accm);
            acc = _mm256_blendv_ps(acc_u, acc_g, gmask);
            accm = _mm256_blendv_ps(accm_u, accm_g, gmask);
        }
        let mut r = [0f32; 8];
        _mm256_storeu_ps(r.as_mut_ptr(), _mm256_sub_ps(acc, accm));
        r
    }
}

/// Q3_K rows (see `rows::dot`): per super-block and column, each lane's
/// exact integer as ggml's AVX2 `vec_dot_q3_K` forms it — the two low bits
/// through `maddubs` less four through `maddubs` where the high bit is
/// clear, `madd` with the sub-block scales (less 32) — then `fma(d_a · d,
/// lane, acc)` and ggml's lane sum; a column ggml computes tiled
/// (`Acts::wide`) takes the whole super-block's integer, `(d · Σ) · d_a`
/// fused into its accumulator.
struct Q3K;

/// A Q3_K block's sixteen scales less 32 as bytes (`rows::q3k_scales`),
/// unpacked as ggml's AVX2 kernel does.
///
/// # Safety
/// The CPU has avx2; `blk` is a whole Q3_K block (110 bytes).
#[inline(always)]
unsafe fn q3k_scales8(blk: *const u8) -> __m128i {
    const KM1: u32 = 0x0303_0303;
    const KM2: u32 = 0x0f0f_0f0f;
    // SAFETY: bytes 96..108 of the block (the caller's contract).
    unsafe {
        let w = |i: usize| (blk.add(96 + 4 * i) as *const u32).read_unaligned();
        let (a0, a1, t) = (w(0), w(1), w(2));
        let v = _mm_set_epi32(
            (((a1 >> 4) & KM2) | (((t >> 6) & KM1) << 4)) as i32,
            (((a0 >> 4) & KM2) | (((t >> 4) & KM1) << 4)) as i32,
            ((a1 & KM2) | (((t >> 2) & KM1) << 4)) as i32,
            ((a0 & KM2) | ((t & KM1) << 4)) as i32,
        );
        _mm_sub_epi8(v, _mm_set1_epi8(32))
    }
}

impl Kern for Q3K {
    const DEC_ROWS: usize = 2;

    #[inline(always)]
    unsafe fn wide(
        w: &RowMat,
        acts: &Acts,
        rows: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) -> bool {
        // SAFETY: forwarded (`q6k_wide` takes Q3_K rows too).
        unsafe { q6k_wide(w, acts, rows, out) }
    }

    #[inline(always)]
    unsafe fn run<const R: usize, const N: usize>(
        w: &RowMat,
        acts: &Acts,
        r0: usize,
        c0: usize,
        out: &mut [[f32; N]; R],
    ) {
        let k = acts.k;
        let nb = k / QK_K;
        let at = w.at(r0, R);
        assert!(w.row_bytes >= nb * 110);
        assert!((c0 + N) * k <= acts.kq.len() && (c0 + N) * nb <= acts.kd.len());
        // SAFETY: loads within the R rows (`at`) and N columns asserted above.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); N]; R];
            let mut facc = [[0f32; N]; R];
            let wide: [bool; N] = std::array::from_fn(|j| acts.wide(c0 + j));
            let base = w.bytes().as_ptr().add(at.base);
            let m3 = _mm256_set1_epi8(3);
            let one = _mm256_set1_epi8(1);
            for b in 0..nb {
                for r in 0..R {
                    let blk = base.add(r * at.row + b * at.block);
                    prefetch(blk.wrapping_add(PF_DIST));
                    prefetch(blk.wrapping_add(PF_DIST + 64));
                }
                let mut sumi = [[_mm256_setzero_si256(); N]; R];
                let sc8: [__m128i; R] =
                    std::array::from_fn(|r| q3k_scales8(base.add(r * at.row + b * at.block)));
                for h in 0..2 {
                    for kk in 0..4 {
                        let act = |j: usize| {
                            acts.kq.as_ptr().add((c0 + j) * k + b * QK_K + 128 * h + 32 * kk)
                        };
                        let pick = q6k_pick(h, kk);
                        let av = preload::<R, N>(act);
                        let bit = 4 * h + kk;
                        for r in 0..R {
                            let blk = base.add(r * at.row + b * at.block);
                            let qs = _mm256_loadu_si256(blk.add(32 + 32 * h) as *const __m256i);
                            let hm = _mm256_loadu_si256(blk as *const __m256i);
                            let low = _mm256_and_si256(
                                _mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * kk as i32)),
                                m3,
                            );
                            // 4 where the high bit is clear, else 0.
                            let mask = _mm256_sll_epi16(one, _mm_cvtsi32_si128(bit as i32));
                            let high = _mm256_slli_epi16::<2>(_mm256_srl_epi16(
                                _mm256_andnot_si256(hm, mask),
                                _mm_cvtsi32_si128(bit as i32),
                            ));
                            let sv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8[r], pick));
                            for j in 0..N {
                                let a = act_at::<R>(av[j], act(j));
                                let p = _mm256_sub_epi16(
                                    _mm256_maddubs_epi16(low, a),
                                    _mm256_maddubs_epi16(high, a),
                                );
                                sumi[r][j] = _mm256_add_epi32(sumi[r][j], _mm256_madd_epi16(p, sv));
                            }
                        }
                    }
                }
                for r in 0..R {
                    let blk = base.add(r * at.row + b * at.block);
                    let dw = f16_at(blk.add(108));
                    for j in 0..N {
                        let da = *acts.kd.get_unchecked((c0 + j) * nb + b);
                        if wide[j] {
                            facc[r][j] = (dw * hsum_i32(sumi[r][j]) as f32).mul_add(da, facc[r][j]);
                        } else {
                            acc[r][j] = _mm256_fmadd_ps(
                                _mm256_set1_ps(da * dw),
                                _mm256_cvtepi32_ps(sumi[r][j]),
                                acc[r][j],
                            );
                        }
                    }
                }
            }
            for r in 0..R {
                for j in 0..N {
                    out[r][j] = if wide[j] { facc[r][j] } else { hsum8_reg(acc[r][j]) };
                }
            }
        }
    }
}

/// See `attn::attend_vec`: llama.cpp's one-query flash attention
/// (`ggml_vec_dot_f16` of the AVX-512 build: four 16-lane partial sums per
/// 64 values, here as eight 8-lane registers), the accumulator held as f16.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; `q.len()` is a multiple of 16,
/// at most 256, `out.len() == q.len()`, `from <= upto`, and the caches hold
/// `upto` positions of `lane` (all asserted by the caller).
///
/// With a soft-cap `cap` (gemma2), `scale` is the scale over the cap and
/// each score becomes `cap · tanh(score)` (the C library's `tanhf`, as
/// llama.cpp's).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_vec(
    q: &[f32],
    kc: &[half::f16],
    vc: &[half::f16],
    lane: super::attn::Lane,
    from: usize,
    upto: usize,
    scale: f32,
    cap: Option<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    let chunks = hd / 8;
    assert!(out.len() == hd && chunks <= 32 && hd.is_multiple_of(16) && from <= upto);
    assert!(upto == 0 || (upto - 1) * lane.stride + lane.offset + hd <= kc.len().min(vc.len()));
    // The common head sizes with their registers' count fixed (so the
    // accumulators stay in registers); others up to 256 values through
    // the widest.
    // SAFETY: the bounds are asserted above; the features are the caller's.
    unsafe {
        match chunks {
            8 => attend_vec_c::<8, true>(q, kc, vc, lane, from, upto, scale, cap, out),
            16 => attend_vec_c::<16, true>(q, kc, vc, lane, from, upto, scale, cap, out),
            _ => attend_vec_c::<32, false>(q, kc, vc, lane, from, upto, scale, cap, out),
        }
    }
}

/// See `attn::attend_quant`: llama.cpp's one-query path over a Q8_0/Q4_0
/// cache for one query head on AVX2, key by key: each score the type's
/// `vec_dot` with the query quantized to Q8_0 (the four-product lanes of
/// `mul_sum_us8_pairs_float`: `maddubs` then `madd`, the same integers as
/// the `vpdpbusd` of the AVX-512 path; no pair of products reaches the
/// `i16` bound), each lane a fused multiply-add of the two scales, folded
/// as `hsum_float_8`; values converted to f32 and accumulated with fused
/// multiply-adds. A soft-cap as [`attend_vec`]. Bit-identical to
/// `attend_quant_scalar`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; `ty` is a block type; `q.len()`
/// is a multiple of 32, at most 256; `out.len() == q.len()`, `from <=
/// upto`, and the caches hold `upto` rows of `ty.bytes(q.len())` bytes (all
/// asserted by the caller).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_quant(
    q: &[f32],
    ty: crate::kv::KvType,
    kc: &[u8],
    vc: &[u8],
    from: usize,
    upto: usize,
    scale: f32,
    cap: Option<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    assert!(ty.is_quantized() && hd.is_multiple_of(QK) && hd <= super::attn::MAX_HEAD);
    assert!(out.len() == hd && from <= upto && upto * ty.bytes(hd) <= kc.len().min(vc.len()));
    // SAFETY: the bounds are asserted above; the features are the caller's.
    unsafe {
        match hd / QK {
            2 => attend_quant_c::<2>(q, ty, kc, vc, from, upto, scale, cap, out),
            4 => attend_quant_c::<4>(q, ty, kc, vc, from, upto, scale, cap, out),
            _ => attend_quant_c::<8>(q, ty, kc, vc, from, upto, scale, cap, out),
        }
    }
}

/// [`attend_quant`] for heads of at most `NB` blocks of 32 values.
///
/// # Safety
/// As [`attend_quant`], whose assertions it relies on; `q.len() <= 32·NB`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn attend_quant_c<const NB: usize>(
    q: &[f32],
    ty: crate::kv::KvType,
    kc: &[u8],
    vc: &[u8],
    from: usize,
    upto: usize,
    scale: f32,
    cap: Option<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    let (nb, row, bb) = (hd / QK, ty.bytes(hd), ty.block_bytes());
    assert!(nb <= NB);
    // SAFETY: every pointer below stays within the slices asserted by
    // `attend_quant` (`upto` rows of `row` bytes, `nb` blocks each).
    unsafe {
        let (mut qq, mut qd) = ([0i8; super::attn::MAX_HEAD], [0f32; 8]);
        super::attn::quantize_query(q, &mut qq[..hd], &mut qd[..nb]);
        let mut qb = [_mm256_setzero_si256(); NB];
        for (b, x) in qb.iter_mut().enumerate().take(nb) {
            *x = _mm256_loadu_si256(qq.as_ptr().add(b * QK) as *const __m256i);
        }
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); 4]; NB];
        let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
        for t in from..upto {
            let kp = kc.as_ptr().add(t * row);
            _mm_prefetch::<_MM_HINT_T0>(kp.wrapping_add(8 * row) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(vc.as_ptr().wrapping_add((t + 8) * row) as *const i8);
            let mut lanes = _mm256_setzero_ps();
            for (b, &qv) in qb.iter().enumerate().take(nb) {
                let (kv, dk) = super::x86::kv_block_bytes(ty, kp.add(b * bb));
                let ax = _mm256_sign_epi8(kv, kv);
                let sy = _mm256_sign_epi8(qv, kv);
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
                let d = _mm256_set1_ps(dk * qd[b]);
                lanes = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), lanes);
            }
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), lanes);
            let mut s = hsum8(&l) * scale;
            if let Some(c) = cap {
                s = c * s.tanh();
            }
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > m {
                let old = m;
                m = s;
                ms = super::attn::expf(old - m);
                let msv = _mm256_set1_ps(ms);
                for a in acc.iter_mut().take(nb).flatten() {
                    *a = _mm256_mul_ps(*a, msv);
                }
            } else {
                vs = super::attn::expf(s - m);
            }
            let vsv = _mm256_set1_ps(vs);
            let vp = vc.as_ptr().add(t * row);
            for (b, a) in acc.iter_mut().enumerate().take(nb) {
                let (x, d) = super::x86::kv_block_bytes(ty, vp.add(b * bb));
                let dv = _mm256_set1_ps(d);
                let (lo, hi) = (_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x));
                let parts = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)];
                for (a, p) in a.iter_mut().zip(parts) {
                    let v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(p)), dv);
                    *a = _mm256_fmadd_ps(v, vsv, *a);
                }
            }
            s_sum = s_sum.mul_add(ms, vs);
        }
        let inv = _mm256_set1_ps(if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum });
        for (b, a) in acc.iter().enumerate().take(nb) {
            for (j, a) in a.iter().enumerate() {
                let o = out.as_mut_ptr().add(b * QK + 8 * j);
                _mm256_storeu_ps(o, _mm256_mul_ps(*a, inv));
            }
        }
    }
}

/// [`attend_vec`] for heads of at most `8·C` values (`C` registers), of
/// exactly that many when `EXACT` (the loops' bounds then constants).
///
/// # Safety
/// As [`attend_vec`], whose assertions it relies on; `q.len() <= 8·C`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn attend_vec_c<const C: usize, const EXACT: bool>(
    q: &[f32],
    kc: &[half::f16],
    vc: &[half::f16],
    lane: super::attn::Lane,
    from: usize,
    upto: usize,
    scale: f32,
    cap: Option<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    let chunks = if EXACT { C } else { hd / 8 };
    assert!(chunks <= C && hd == 8 * chunks);
    // SAFETY: every pointer below stays within the slices asserted above.
    unsafe {
        let mut qv = [_mm256_setzero_ps(); C];
        for (c, v) in qv.iter_mut().take(chunks).enumerate() {
            // The query rounded to f16 and back, as llama.cpp converts it.
            let x = _mm256_loadu_ps(q.as_ptr().add(8 * c));
            *v = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
        }
        let mut acc = [_mm_setzero_si128(); C];
        let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
        // The 64-value steps of the scores; the tail past them (a head of
        // 96 values: 64 and 32) is summed in f64 as `ggml_vec_dot_f16`'s.
        let main = chunks / 8 * 8;
        for t in from..upto {
            let at = t * lane.stride + lane.offset;
            let kp = kc.as_ptr().add(at) as *const __m128i;
            // Accumulator j, half h: lanes 8h.. of ggml's 16-lane sum j.
            let mut sum = [[_mm256_setzero_ps(); 2]; 4];
            for i in (0..main).step_by(8) {
                for (j, sj) in sum.iter_mut().enumerate() {
                    for (h, sh) in sj.iter_mut().enumerate() {
                        let c = i + 2 * j + h;
                        let k = _mm256_cvtph_ps(_mm_loadu_si128(kp.add(c)));
                        *sh = _mm256_fmadd_ps(k, qv[c], *sh);
                    }
                }
            }
            let mut l = [0f32; 16];
            for h in 0..2 {
                let x0 = _mm256_add_ps(
                    _mm256_add_ps(sum[0][h], sum[2][h]),
                    _mm256_add_ps(sum[1][h], sum[3][h]),
                );
                _mm256_storeu_ps(l.as_mut_ptr().add(8 * h), x0);
            }
            let mut s = super::attn::reduce16(&l);
            if main < chunks {
                let mut p = [0f32; 48];
                for c in main..chunks {
                    let k = _mm256_cvtph_ps(_mm_loadu_si128(kp.add(c)));
                    _mm256_storeu_ps(p.as_mut_ptr().add(8 * (c - main)), _mm256_mul_ps(k, qv[c]));
                }
                let tail = p[..8 * (chunks - main)].iter().fold(s as f64, |a, &x| a + x as f64);
                s = tail as f32;
            }
            s *= scale;
            if let Some(c) = cap {
                s = c * s.tanh();
            }
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > m {
                let old = m;
                m = s;
                ms = (old - m).exp();
                let msv = _mm256_set1_ps(ms);
                for a in acc.iter_mut().take(chunks) {
                    let x = _mm256_mul_ps(_mm256_cvtph_ps(*a), msv);
                    *a = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                }
            } else {
                vs = (s - m).exp();
            }
            let vsv = _mm256_set1_ps(vs);
            let vp = vc.as_ptr().add(at) as *const __m128i;
            for (c, a) in acc.iter_mut().take(chunks).enumerate() {
                let v = _mm256_cvtph_ps(_mm_loadu_si128(vp.add(c)));
                let x = _mm256_fmadd_ps(v, vsv, _mm256_cvtph_ps(*a));
                *a = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            }
            s_sum = s_sum.mul_add(ms, vs);
        }
        let inv = _mm256_set1_ps(if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum });
        for (c, a) in acc.iter().take(chunks).enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), _mm256_mul_ps(_mm256_cvtph_ps(*a), inv));
        }
    }
}

/// `attn::v_expf` on eight lanes (ggml's AVX-512 `ggml_v_expf`, whose
/// `scalef` is done here in f64: exact, then rounded once).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn v_expf(x: __m256) -> __m256 {
    let r = _mm256_set1_ps(f32::from_bits(0x4B40_0000));
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3FB8_AA3B)), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(f32::from_bits(0x35BF_BE8E)),
        _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3F31_7200)), x),
    );
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_set1_ps(f32::from_bits(0x3C07_2010)),
                b,
                _mm256_set1_ps(f32::from_bits(0x3D2B_9F17)),
            ),
            u,
            _mm256_fmadd_ps(
                _mm256_set1_ps(f32::from_bits(0x3E2A_AF33)),
                b,
                _mm256_set1_ps(f32::from_bits(0x3EFF_FEDB)),
            ),
        ),
        u,
        _mm256_fmadd_ps(_mm256_set1_ps(f32::from_bits(0x3F7F_FFF6)), b, _mm256_set1_ps(1.0)),
    );
    // j · 2^n for |n| ≤ 192: in f64 the product is exact.
    let ni = _mm256_cvtps_epi32(n);
    let scaled = |jh: __m256d, nh: __m128i| {
        let e = _mm256_slli_epi64::<52>(_mm256_add_epi64(
            _mm256_cvtepi32_epi64(nh),
            _mm256_set1_epi64x(1023),
        ));
        _mm256_cvtpd_ps(_mm256_mul_pd(jh, _mm256_castsi256_pd(e)))
    };
    let lo = scaled(_mm256_cvtps_pd(_mm256_castps256_ps128(j)), _mm256_castsi256_si128(ni));
    let hi =
        scaled(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(j)), _mm256_extracti128_si256::<1>(ni));
    let res = _mm256_set_m128(hi, lo);
    let absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let big = _mm256_cmp_ps::<_CMP_GT_OQ>(absn, _mm256_set1_ps(192.0));
    if _mm256_movemask_ps(big) == 0 {
        return res;
    }
    let nonpos = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps());
    let alt = _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), _mm256_setzero_ps(), nonpos);
    _mm256_blendv_ps(res, alt, big)
}

/// `v_expf` of every value (a multiple of 8 of them), for tests.
///
/// # Safety
/// The CPU must support avx2 and fma.
#[cfg(test)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn v_expf_all(x: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (o, i) in out.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
        // SAFETY: 8 floats read and written.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v_expf(_mm256_loadu_ps(i.as_ptr()))) };
    }
    out
}

/// See `attn::swiglu`: `ggml_vec_swiglu_f32`'s vector loop.
///
/// # Safety
/// The CPU must support avx2 and fma; the slices are equally long, a
/// multiple of 16.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
    assert!(g.len() == out.len() && u.len() == out.len() && out.len().is_multiple_of(8));
    for i in (0..out.len()).step_by(8) {
        // SAFETY: i + 8 <= len for all three slices (asserted above).
        unsafe {
            let x = _mm256_loadu_ps(g.as_ptr().add(i));
            let e = v_expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(
                out.as_mut_ptr().add(i),
                _mm256_mul_ps(silu, _mm256_loadu_ps(u.as_ptr().add(i))),
            );
        }
    }
}

/// See `attn::tiled_scores`, for `N` query rows that share the tile: 32
/// keys at a time in four registers per row, each key loaded once for the
/// `N` rows; every score the same fma chain over the head, then the scale.
///
/// # Safety
/// The CPU must support avx2 and fma; every `qs[n]` holds `hd` values and
/// `kt` `hd · 64`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tiled_scores<const N: usize>(
    qs: [&[f32]; N],
    kt: &[f32],
    scale: f32,
    kq: &mut [[f32; 64]; N],
) {
    let hd = qs[0].len();
    assert!(qs.iter().all(|q| q.len() == hd) && kt.len() >= hd * 64);
    // SAFETY: row d of `kt` is 64 floats within it; `qs[n][d]` lies within
    // each query (asserted above).
    unsafe {
        let sv = _mm256_set1_ps(scale);
        for half in 0..2 {
            let mut acc = [[_mm256_setzero_ps(); 4]; N];
            for d in 0..hd {
                let col = kt.as_ptr().add(d * 64 + 32 * half);
                let k = [
                    _mm256_loadu_ps(col),
                    _mm256_loadu_ps(col.add(8)),
                    _mm256_loadu_ps(col.add(16)),
                    _mm256_loadu_ps(col.add(24)),
                ];
                for n in 0..N {
                    let p = _mm256_set1_ps(*qs[n].get_unchecked(d));
                    for j in 0..4 {
                        acc[n][j] = _mm256_fmadd_ps(k[j], p, acc[n][j]);
                    }
                }
            }
            for n in 0..N {
                for j in 0..4 {
                    let at = kq[n].as_mut_ptr().add(32 * half + 8 * j);
                    _mm256_storeu_ps(at, _mm256_mul_ps(acc[n][j], sv));
                }
            }
        }
    }
}

/// See `x86::tiled_load`: the tile's keys transposed (`kt[d · 64 + t]`)
/// and its values (`v32[t · hd + d]`) in f32 (exact), for the `at.len()`
/// keys whose head starts at `kc[at[t]]` / `vc[at[t]]`: eight keys at a
/// time by a register transpose, the rest one value at a time.
///
/// # Safety
/// The CPU must support avx2 and f16c; `hd` is a multiple of 8, `at.len()
/// <= 64`, `kc[at[t]..at[t] + hd]` and `vc[..]` lie within the caches, `kt`
/// holds `hd · 64` values and `v32` `at.len() · hd`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tiled_load(
    kc: &[half::f16],
    vc: &[half::f16],
    at: &[usize],
    hd: usize,
    kt: &mut [f32],
    v32: &mut [f32],
) {
    assert!(hd.is_multiple_of(8) && at.len() <= 64);
    assert!(kt.len() >= hd * 64 && v32.len() >= at.len() * hd);
    assert!(at.iter().all(|&a| a + hd <= kc.len() && a + hd <= vc.len()));
    // Eight halves of a cache from `p`, widened.
    let load = |p: *const half::f16| {
        // SAFETY: the callers read within a key's or value's `hd` values.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    };
    let whole = at.len() / 8 * 8;
    // SAFETY: every read is within a key's or value's `hd` values and every
    // write within `kt`/`v32` (asserted above).
    unsafe {
        for (t, &a) in at.iter().enumerate() {
            let (src, dst) = (vc.as_ptr().add(a), v32.as_mut_ptr().add(t * hd));
            for i in (0..hd).step_by(8) {
                _mm256_storeu_ps(dst.add(i), load(src.add(i)));
            }
        }
        for t0 in (0..whole).step_by(8) {
            for d0 in (0..hd).step_by(8) {
                let r: [__m256; 8] =
                    std::array::from_fn(|i| load(kc.as_ptr().add(at[t0 + i] + d0)));
                for (i, r) in transpose8(r).iter().enumerate() {
                    _mm256_storeu_ps(kt.as_mut_ptr().add((d0 + i) * 64 + t0), *r);
                }
            }
        }
    }
    super::attn::transpose_tail(kc, at, whole, hd, kt);
}

/// The 8 × 8 transpose of eight registers: `out[i]` lane `j` is `r[j]`
/// lane `i`.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // Pairs of rows interleaved, then fours, within each 128-bit half;
    // then the halves exchanged.
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // u[4h + j]: column j (of four, in each half) of rows 4h..4h+4.
    let u: [__m256; 8] = std::array::from_fn(|i| {
        let (h, j) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + j / 2], t[4 * h + 2 + j / 2]);
        if j % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    std::array::from_fn(|i| {
        let (j, hi) = (i % 4, i >= 4);
        if hi {
            _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j])
        } else {
            _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j])
        }
    })
}

/// See `attn::tiled_softmax`.
///
/// # Safety
/// The CPU must support avx2 and fma.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tiled_softmax(kq: &mut [f32; 64], max: f32) -> f64 {
    let mut sum = 0f64;
    // SAFETY: 16-float chunks of a 64-float array.
    unsafe {
        let mv = _mm256_set1_ps(max);
        for j in 0..4 {
            let mut e = [0f32; 16];
            for h in 0..2 {
                let p = kq.as_mut_ptr().add(16 * j + 8 * h);
                let v = v_expf(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
                _mm256_storeu_ps(p, v);
                _mm256_storeu_ps(e.as_mut_ptr().add(8 * h), v);
            }
            sum += super::attn::reduce16(&e) as f64;
        }
    }
    sum
}

/// See `attn::tiled_accumulate`, for `N` rows that share the tile: row
/// `n`'s output is `acc[n · hd ..]`, its weights `ps[n]` (one per key, the
/// same count for all); each value row is loaded once for the `N` rows,
/// and every output value meets the same fused multiply-adds in key order.
///
/// # Safety
/// The CPU must support avx2 and fma; `hd` is a multiple of 8, at most 256,
/// `acc` holds `N · hd` values and `v32` `ps[0].len() · hd`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tiled_accumulate<const N: usize>(
    ps: [&[f32]; N],
    v32: &[f32],
    hd: usize,
    acc: &mut [f32],
) {
    let t = ps[0].len();
    assert!(hd.is_multiple_of(8) && hd <= 256 && v32.len() >= t * hd && acc.len() >= N * hd);
    assert!(ps.iter().all(|p| p.len() == t));
    // Slabs of 32 values (four registers a row, a fixed count so they stay
    // in registers), then the rest eight at a time.
    let mut c = 0;
    while c < hd {
        // SAFETY: `c + 32 <= hd` or `c + 8 <= hd` (hd is a multiple of 8),
        // within every row of `acc` and of `v32` (asserted above).
        unsafe {
            if hd - c >= 32 {
                accumulate_slab::<N, 4>(&ps, v32, hd, c, acc);
                c += 32;
            } else {
                accumulate_slab::<N, 1>(&ps, v32, hd, c, acc);
                c += 8;
            }
        }
    }
}

/// Values `c..c + 8·S` of [`tiled_accumulate`]'s `N` rows.
///
/// # Safety
/// The CPU must support avx2 and fma; `c + 8·S <= hd`, `acc` holds `N · hd`
/// values and `v32` `ps[0].len() · hd`.
#[inline(always)]
unsafe fn accumulate_slab<const N: usize, const S: usize>(
    ps: &[&[f32]; N],
    v32: &[f32],
    hd: usize,
    c: usize,
    acc: &mut [f32],
) {
    // SAFETY: offsets `c..c + 8·S` of each of the `N` rows of `acc` and of
    // each of the `ps[0].len()` rows of `v32` (the caller's contract).
    unsafe {
        let o = acc.as_mut_ptr().add(c);
        let mut a = [[_mm256_setzero_ps(); S]; N];
        for n in 0..N {
            for j in 0..S {
                a[n][j] = _mm256_loadu_ps(o.add(n * hd + 8 * j));
            }
        }
        for t in 0..ps[0].len() {
            let row = v32.as_ptr().add(t * hd + c);
            let mut v = [_mm256_setzero_ps(); S];
            for (j, v) in v.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(row.add(8 * j));
            }
            for n in 0..N {
                let pv = _mm256_set1_ps(*ps[n].get_unchecked(t));
                for j in 0..S {
                    a[n][j] = _mm256_fmadd_ps(v[j], pv, a[n][j]);
                }
            }
        }
        for n in 0..N {
            for j in 0..S {
                _mm256_storeu_ps(o.add(n * hd + 8 * j), a[n][j]);
            }
        }
    }
}

/// `hsum8_x8` of groups of eight rows of eight values, for tests.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[cfg(test)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum8_x8_all(x: &[[f32; 8]; 8]) -> [f32; 8] {
    // SAFETY: eight floats read from each row, eight written.
    unsafe {
        let a: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(x[i].as_ptr()));
        let mut o = [0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), hsum8_x8(&a));
        o
    }
}

/// Rows per tile of [`float_matmul`] on a decode (one column): eight
/// accumulators, four rows streaming.
const FLOAT_DEC_ROWS: usize = 4;
/// How far ahead of each row a decode of f16/bf16 rows asks for memory:
/// the tile's rows lie one after another, so this runs ahead of the four
/// of them together (phi3-bench-f16 decode, 2 threads: 2 KiB 110 tok/s,
/// 8–32 KiB 124–137).
const FLOAT_PF: usize = 16 * 1024;
/// Rows × columns per tile of [`float_matmul`] on wider products: twelve
/// accumulators (each pair's sixteen lanes in two registers). Measured on
/// a 1B f16 file's pp512 (2 threads): 3 × 2 73 tok/s, 2 × 3 64; one row
/// against five or six columns, or the twelve sums kept in memory between
/// slices of k, spill a register and fall to ~41.
const FLOAT_ROWS: usize = 3;
const FLOAT_COLS: usize = 2;
/// Bytes of rows (as stored) a wide [`float_matmul`] keeps in the
/// second-level cache while every pair of columns passes over them (32 KiB
/// to 1 MiB measured within 8% of each other).
const FLOAT_BLOCK_BYTES: usize = 256 * 1024;

/// f16 and bf16 rows against every column with `scalar::dot_f32`'s numbers
/// (sixteen lanes, each a fused multiply-add chain, summed as a tree, the
/// tail chained apart), the rows as stored and widened in registers
/// (exact), so they stream at two bytes a weight and need no f32 copy
/// (widening a block of rows into an f32 buffer once doubled what the
/// tiles read and measured 25% slower). f16 rows meet the activations
/// rounded through f16 (`Acts::xh`, as ggml does), bf16 rows the f32
/// values.
///
/// # Safety
/// The CPU must support avx2, fma and f16c (the caller's features, into
/// which this is inlined); no other thread reads or writes rows `rows` of
/// `out` during the call.
#[inline(always)]
unsafe fn float_matmul(w: &RowMat, acts: &Acts, rows: std::ops::Range<usize>, out: &OutRows<'_>) {
    let (k, n) = (acts.k, acts.n);
    if n == 0 || rows.is_empty() {
        return;
    }
    let f16 = w.fmt == Fmt::F16;
    let xs = if f16 { &acts.xh } else { &acts.x };
    assert!(xs.len() >= n * k);
    let raw = w.stored_rows(rows.clone());
    assert!(raw.iter().all(|r| r.len() >= 2 * k));
    let col = |c: usize| &xs[c * k..(c + 1) * k];
    // `R` rows from `g` (of `g..ge`) against `C` columns from `c` (of
    // `c..ce`); the missing rows and columns of an edge tile repeat the
    // first and are not written.
    macro_rules! tile {
        ($g:expr, $ge:expr, $c:expr, $ce:expr, $R:expr, $C:expr) => {{
            let (g, ge, c, ce) = ($g, $ge, $c, $ce);
            let ws: [&[u8]; $R] =
                std::array::from_fn(|i| &*raw[if g + i < ge { g + i } else { g }]);
            let cs: [&[f32]; $C] = std::array::from_fn(|j| col(if c + j < ce { c + j } else { c }));
            let mut o = [[0f32; $C]; $R];
            // SAFETY: the caller's features; every row holds 2k bytes and
            // every column k values (asserted above).
            unsafe {
                if f16 {
                    float_tile::<$R, $C, true>(&ws, &cs, k, &mut o);
                } else {
                    float_tile::<$R, $C, false>(&ws, &cs, k, &mut o);
                }
            }
            for (i, row) in o.iter().enumerate().take(ge - g) {
                for (j, v) in row.iter().enumerate().take(ce - c) {
                    // SAFETY: row `rows.start + g + i` is in `rows`, this call's.
                    unsafe { out.set(c + j, rows.start + g + i, *v) };
                }
            }
        }};
    }
    let nr = rows.len();
    if n < FLOAT_COLS {
        // A decode: the rows stream from memory.
        for g in (0..nr).step_by(FLOAT_DEC_ROWS) {
            tile!(g, (g + FLOAT_DEC_ROWS).min(nr), 0, 1, FLOAT_DEC_ROWS, 1);
        }
        return;
    }
    let block = (FLOAT_BLOCK_BYTES / (2 * k)).max(FLOAT_ROWS) / FLOAT_ROWS * FLOAT_ROWS;
    for rb in (0..nr).step_by(block) {
        let re = (rb + block).min(nr);
        for c in (0..n).step_by(FLOAT_COLS) {
            let ce = (c + FLOAT_COLS).min(n);
            for g in (rb..re).step_by(FLOAT_ROWS) {
                tile!(g, (g + FLOAT_ROWS).min(re), c, ce, FLOAT_ROWS, FLOAT_COLS);
            }
        }
    }
}

/// Eight f16 (`f16`) or bf16 weights from `p`, widened (exact).
///
/// # Safety
/// The CPU has avx2 and f16c (the caller's); `p` points to 16 readable bytes.
#[inline(always)]
unsafe fn widen8(p: *const u8, f16: bool) -> __m256 {
    // SAFETY: 16 bytes at p (the caller's).
    unsafe {
        let h = _mm_loadu_si128(p as *const __m128i);
        if f16 {
            _mm256_cvtph_ps(h)
        } else {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

/// Weight j of an f16 (`f16`) or bf16 row as f32.
#[inline(always)]
fn widen1(raw: &[u8], j: usize, f16: bool) -> f32 {
    let b = [raw[2 * j], raw[2 * j + 1]];
    if f16 {
        half::f16::from_le_bytes(b).to_f32()
    } else {
        half::bf16::from_le_bytes(b).to_f32()
    }
}

/// `R` rows of f16 (`F16`) or bf16 weights, as stored, against `C`
/// columns: `out[r][c]` is `scalar::dot_f32` of the widened row and the
/// column (the same sixteen lanes, tree and tail), each row chunk widened
/// once for all columns.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; every `ws[r]` holds at least
/// `2k` bytes and every `xs[c]` at least `k` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn float_tile<const R: usize, const C: usize, const F16: bool>(
    ws: &[&[u8]; R],
    xs: &[&[f32]; C],
    k: usize,
    out: &mut [[f32; C]; R],
) {
    assert!(ws.iter().all(|v| v.len() >= 2 * k) && xs.iter().all(|v| v.len() >= k));
    let mut lo = [[_mm256_setzero_ps(); C]; R];
    let mut hi = lo;
    let body = k / 16 * 16;
    let mut i = 0;
    while i < body {
        if C == 1 && i % 32 == 0 {
            // A decode streams its rows: ask ahead for each.
            for w in ws {
                prefetch(w.as_ptr().wrapping_add(2 * i + FLOAT_PF));
            }
        }
        for r in 0..R {
            // SAFETY: row r holds 2k bytes: 32 read from 2i, i + 16 <= k.
            let (w0, w1) = unsafe {
                let p = ws[r].as_ptr().add(2 * i);
                (widen8(p, F16), widen8(p.add(16), F16))
            };
            for c in 0..C {
                // SAFETY: i + 16 <= body <= k, within every column.
                unsafe {
                    let x = xs[c].as_ptr().add(i);
                    lo[r][c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), lo[r][c]);
                    hi[r][c] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x.add(8)), hi[r][c]);
                }
            }
        }
        i += 16;
    }
    for r in 0..R {
        for c in 0..C {
            let mut acc = [0f32; 16];
            // SAFETY: acc holds 16 values.
            unsafe {
                _mm256_storeu_ps(acc.as_mut_ptr(), lo[r][c]);
                _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi[r][c]);
            }
            let mut tail = 0f32;
            for j in body..k {
                tail = widen1(ws[r], j, F16).mul_add(xs[c][j], tail);
            }
            out[r][c] = super::scalar::sum16(acc) + tail;
        }
    }
}
