//! AVX-512 VNNI products of row-major weights against many columns (a
//! prompt):
//! Q4_K on the *chain* numerics, Q5_K and Q6_K on ggml's tiled numerics
//! (`rows.rs` says which is which). Thirty-two rows share the lanes of two
//! 512-bit registers: each super-block of a block of rows is decoded once
//! into scratch — its values as bytes, four consecutive values of sixteen
//! rows per 64 bytes, so one `vpdpbusd` against four activation bytes of
//! one column (broadcast) adds four products to each row's lane — and
//! every column then meets the decoded super-block, its accumulators
//! carried from super-block to super-block in memory. A sub-block's exact
//! integer dot product is scaled with one `vpmulld`; Q4_K/Q5_K minimums
//! come from one `vpdpwssd` per two sub-blocks (the rows' i16 pairs of
//! minimums against the column's pair of sums of 32, `Acts::kb32`). Q6_K
//! meets the activations plus 128 (`Acts::kqu`, unsigned) with its values
//! less 32 (signed), so its offset is a per-row constant of the decoded
//! block (`128 · Σ scale · Σ (value − 32)`), not a per-column sum. The
//! integers are the exact sums the portable kernels form, and the float
//! steps per super-block are theirs lane by lane, so the numbers are
//! bit-identical.
//!
//! Q4_0 rows of the *chain* numerics (row counts a multiple of 8, which
//! ggml repacks) take the same lanes, sixteen rows a register: see
//! `q4_0_in`.
//!
//! Q5_0 rows (the K-quant files' fallback for rows whose length is not a
//! multiple of 256) take the *lanes* numerics: sixteen rows at a time,
//! two to a register in the Q4_1 tile layout of `x86.rs` (see `q5_0_in`).
//!
//! Columns whose route the kernel does not cover (a Q5_K/Q6_K column that
//! ggml would not run tiled) leave the product to the AVX2 kernels.

// Register arrays are indexed in lock step; index loops read clearest here.
#![allow(clippy::needless_range_loop)]

use super::avx2::{pair_block, q4_0_group8};
use super::rows::{Fmt, RowMat};
use super::x86::{store_q4_pair, Q4_PATTERN};
use super::{Acts, OutRows};
use crate::quant::{QK, QK_K};
use std::arch::x86_64::*;

/// Registers of sixteen rows in a block of rows.
const H: usize = 2;
/// Rows decoded together (the lanes of `H` registers).
const RB: usize = 16 * H;
/// Runs of columns ahead whose activations are prefetched.
const PF_RUNS: usize = 2;
/// Columns met together by one pass over a decoded super-block.
const CB: usize = 6;

/// Registers of scratch per decoded super-block, each `H` registers (16
/// rows a register): 64 of values (`[kg][h]`, kg = value / 4: four values
/// of each row; Q4_K/Q5_K unsigned, Q6_K less 32, signed), 16 of sub-block
/// scales (as i32; Q4_K/Q5_K use 8), 4 of i16 pairs of minimums (Q4_K/Q5_K,
/// sub-blocks 2u and 2u + 1), one of `d`, one of `dmin` (Q4_K/Q5_K) or of
/// the offset constant (Q6_K).
const SLOTS: usize = (64 + 16 + 4 + 2) * H;
const SCALES: usize = 64 * H;
const MINS: usize = 80 * H;
const DW: usize = 84 * H;
/// `dmin` (f32) for Q4_K/Q5_K; the offset constant (i32) for Q6_K.
const DMIN: usize = 85 * H;

thread_local! {
    /// Each thread's decoded super-block and its per-column accumulators.
    static SCRATCH: std::cell::RefCell<(Vec<__m512i>, Vec<__m512>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `out[c · rows + r]` for rows `rows` and every column, when this kernel
/// covers the product; `false` (nothing written) when it does not.
///
/// # Safety
/// The CPU supports avx512f, avx512bw, avx512vl, avx512vnni, avx2, fma and
/// f16c (`x86::available()`); no other thread reads or writes rows `rows` of
/// `out` during the call.
pub(super) unsafe fn matmul(
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) -> bool {
    let (n, k) = (acts.n, acts.k);
    if w.fmt == Fmt::Q5_0 {
        let nb = k / QK;
        if acts.nib.len() < n * nb * 64 || acts.d.len() < n * nb || rows.is_empty() {
            return false;
        }
        // SAFETY: as below.
        SCRATCH.with_borrow_mut(|s| unsafe { q5_0_in(&mut s.0, w, acts, rows, out) });
        return true;
    }
    if w.fmt == Fmt::Q4_0 {
        let nb = k / QK;
        if !w.chain || acts.off8.len() < n * nb || acts.d.len() < n * nb || rows.is_empty() {
            return false;
        }
        // SAFETY: as below.
        SCRATCH.with_borrow_mut(|s| unsafe { q4_0_in(&mut s.0, w, acts, rows, out) });
        return true;
    }
    let nb = k / QK_K;
    let covered = match w.fmt {
        Fmt::Q4K => w.chain && acts.kb32.len() >= n * nb * 4,
        Fmt::Q5K => (0..n).all(|c| acts.wide(c)) && acts.kb32.len() >= n * nb * 4,
        Fmt::Q6K | Fmt::Q3K => (0..n).all(|c| acts.wide(c)) && acts.kqu.len() >= n * k,
        _ => false,
    };
    if !covered || !k.is_multiple_of(QK_K) || rows.is_empty() {
        return false;
    }
    // SAFETY: the features are the caller's contract; the scratch is this
    // thread's own.
    SCRATCH.with_borrow_mut(|s| unsafe { matmul_in(s, w, acts, rows, out) });
    true
}

/// The body of [`matmul`], out of the thread-local's closure (which would
/// not inherit the target features).
///
/// # Safety
/// As [`matmul`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn matmul_in(
    scratch: &mut (Vec<__m512i>, Vec<__m512>),
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    let (k, n) = (acts.k, acts.n);
    let nb = k / QK_K;
    let bb = w.fmt.block().1;
    assert!(w.row_bytes >= nb * bb);
    assert!(n * k <= acts.kq.len() && n * nb <= acts.kd.len() && n * nb * 16 <= acts.kbs.len());
    if matches!(w.fmt, Fmt::Q6K | Fmt::Q3K) {
        assert!(n * k <= acts.kqu.len());
    } else {
        assert!(n * nb * 4 <= acts.kb32.len());
    }
    let (dec, accs) = scratch;
    dec.resize(SLOTS, _mm512_setzero_si512());
    accs.resize(n * 2 * H, _mm512_setzero_ps());
    // Runs of columns on the same numbers, at most CB of them.
    let mut runs = Vec::with_capacity(n.div_ceil(CB) + 4);
    let mut c = 0;
    while c < n {
        let grouped = w.fmt == Fmt::Q4K && acts.grouped(c);
        let mut len = 1;
        while len < CB && c + len < n && (w.fmt != Fmt::Q4K || acts.grouped(c + len) == grouped) {
            len += 1;
        }
        runs.push((c, len, grouped));
        c += len;
    }
    for rb in rows.clone().step_by(RB) {
        let m = (rows.end - rb).min(RB);
        accs.fill(_mm512_setzero_ps());
        for b in 0..nb {
            // SAFETY: rows rb..rb + m exist (`w.at` asserts each) with nb
            // super-blocks; the scratch holds one decoded super-block.
            unsafe { decode(w, rb, m, b, dec.as_mut_ptr()) };
            if b + 1 < nb {
                // The next super-block's bytes, asked into L2 while every
                // column meets this one.
                for r in 0..m {
                    let at = w.at(rb + r, 1);
                    let p = w.bytes()[at.base + (b + 1) * at.block..].as_ptr();
                    for l in (0..bb).step_by(64) {
                        // A hint: never faults.
                        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(l) as *const i8);
                    }
                }
            }
            let d = dec.as_ptr();
            let a = accs.as_mut_ptr();
            for (i, &(c, len, grouped)) in runs.iter().enumerate() {
                if let Some(&(c2, len2, _)) = runs.get(i + PF_RUNS) {
                    // The activations a later run reads at this super-block:
                    // columns lie `k` bytes apart, a stride the hardware does
                    // not follow.
                    for j in c2..c2 + len2 {
                        let q = if matches!(w.fmt, Fmt::Q6K | Fmt::Q3K) {
                            acts.kqu.as_ptr().wrapping_add(j * k + b * QK_K)
                        } else {
                            acts.kq.as_ptr().wrapping_add(j * k + b * QK_K) as *const u8
                        };
                        for l in 0..4 {
                            // A hint: never faults.
                            _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(64 * l) as *const i8);
                        }
                        let kd = acts.kd.as_ptr().wrapping_add(j * nb + b);
                        _mm_prefetch::<_MM_HINT_T0>(kd as *const i8);
                        let kb = acts.kb32.as_ptr().wrapping_add((j * nb + b) * 4);
                        _mm_prefetch::<_MM_HINT_T0>(kb as *const i8);
                    }
                }
                // SAFETY: the scratch holds the decoded super-block; columns
                // c..c+len exist (asserted above) and have their
                // accumulators in `accs`.
                unsafe {
                    match (w.fmt, grouped) {
                        (Fmt::Q4K, true) => cols_dyn::<0>(d, acts, c, len, b, a),
                        (Fmt::Q4K, false) => cols_dyn::<1>(d, acts, c, len, b, a),
                        (Fmt::Q5K, _) => cols_dyn::<2>(d, acts, c, len, b, a),
                        _ => cols_dyn::<3>(d, acts, c, len, b, a),
                    }
                }
            }
        }
        for c in 0..n {
            let mut col = [0f32; RB];
            for h in 0..H {
                let v = if w.fmt == Fmt::Q4K {
                    _mm512_sub_ps(accs[c * 2 * H + h], accs[c * 2 * H + H + h])
                } else {
                    accs[c * 2 * H + h]
                };
                // SAFETY: 16 floats into a 16·H array.
                unsafe { _mm512_storeu_ps(col.as_mut_ptr().add(16 * h), v) };
            }
            // SAFETY: rows rb..rb + m are among `rows`, the caller's.
            unsafe { out.set_run(c, rb, &col[..m]) };
        }
    }
}

/// Decodes super-block `b` of rows `r0 .. r0 + m` (m ≤ RB; the other
/// lanes zero) into `dst` (`SLOTS` registers): each field of sixteen rows
/// is gathered into one register (lane i: row i's bytes) and unpacked
/// there, lane by lane as `rows::k_values` and `scale_min_k4` read it.
///
/// # Safety
/// The CPU has the features of [`matmul_in`]; `dst` holds `SLOTS`
/// registers; the rows exist in `w` with more than `b` super-blocks each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn decode(w: &RowMat, r0: usize, m: usize, b: usize, dst: *mut __m512i) {
    let data = w.bytes();
    let bb = w.fmt.block().1;
    for h in 0..H {
        let n = m.saturating_sub(16 * h).min(16);
        // Block b of each row of this half, as byte offsets from the first
        // row's (a half without rows reads nothing: every lane masked).
        let first = w.at(r0 + (16 * h).min(m - 1), 1);
        let start = first.base + b * first.block;
        let mut off = [0i32; 16];
        for (i, o) in off.iter_mut().enumerate().take(n) {
            let at = w.at(r0 + 16 * h + i, 1);
            let at = at.base + b * at.block;
            assert!(at >= start && at + bb <= data.len() && at - start <= i32::MAX as usize / 2);
            *o = (at - start) as i32;
        }
        let base = data[start..].as_ptr();
        // SAFETY: the lanes of `mask` read within their row's block (the
        // offsets are asserted above; every field read lies inside the
        // block); the stores stay within `dst`'s SLOTS registers.
        unsafe {
            let idx = _mm512_loadu_si512(off.as_ptr() as *const __m512i);
            let mask: __mmask16 = if n == 16 { 0xFFFF } else { (1u16 << n) - 1 };
            let gather = |at: usize| {
                _mm512_mask_i32gather_epi32::<1>(
                    _mm512_setzero_si512(),
                    mask,
                    idx,
                    base.add(at) as *const i32,
                )
            };
            let slot = |s: usize| dst.add(s + h);
            let m4 = _mm512_set1_epi8(0x0F);
            let low16 = |x: __m512i| _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x));
            if w.fmt == Fmt::Q3K {
                // Q3_K as Q6_K: values (−4 ..= 3, signed), the scales less
                // 32, the offset constant 128 · Σ_s scale_s · Σ_{e in s}
                // value_e. Value e = 128h + 32g + l: bits 2g, 2g + 1 of
                // byte 32h + l of `qs` (at 32), less 4 unless bit 4h + g of
                // byte l of `hmask` (at 0) is set.
                let ones = _mm512_set1_epi8(1);
                let m3 = _mm512_set1_epi8(3);
                let mut sums = [_mm512_setzero_si512(); 16];
                for half in 0..2 {
                    for l4 in 0..8 {
                        let q = gather(32 + 32 * half + 4 * l4);
                        let hm = gather(4 * l4);
                        for g in 0..4 {
                            let low =
                                _mm512_and_si512(_mm512_srl_epi32(q, _mm_cvtsi32_si128(2 * g)), m3);
                            let bit = _mm_cvtsi32_si128((4 * half + g as usize) as i32);
                            let high = _mm512_slli_epi32::<2>(_mm512_and_si512(
                                _mm512_srl_epi32(hm, bit),
                                ones,
                            ));
                            let v =
                                _mm512_sub_epi8(_mm512_or_si512(low, high), _mm512_set1_epi8(4));
                            let kg = 32 * half + 8 * g as usize + l4;
                            slot(kg * H).write(v);
                            sums[kg / 4] = _mm512_dpbusd_epi32(sums[kg / 4], ones, v);
                        }
                    }
                }
                let (a0, a1, t) = (gather(96), gather(100), gather(104));
                let k1 = _mm512_set1_epi32(0x0303_0303);
                let k2 = _mm512_set1_epi32(0x0f0f_0f0f);
                let aux = [
                    _mm512_or_si512(
                        _mm512_and_si512(a0, k2),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(t, k1)),
                    ),
                    _mm512_or_si512(
                        _mm512_and_si512(a1, k2),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<2>(t), k1)),
                    ),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi32::<4>(a0), k2),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<4>(t), k1)),
                    ),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi32::<4>(a1), k2),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(t), k1)),
                    ),
                ];
                let byte = _mm512_set1_epi32(0xFF);
                let c32 = _mm512_set1_epi32(32);
                let mut corr = _mm512_setzero_si512();
                for (q, x) in aux.into_iter().enumerate() {
                    let sc = [
                        _mm512_and_si512(x, byte),
                        _mm512_and_si512(_mm512_srli_epi32::<8>(x), byte),
                        _mm512_and_si512(_mm512_srli_epi32::<16>(x), byte),
                        _mm512_srli_epi32::<24>(x),
                    ];
                    for (i, sc) in sc.into_iter().enumerate() {
                        let s = 4 * q + i;
                        let sc = _mm512_sub_epi32(sc, c32);
                        slot(SCALES + s * H).write(sc);
                        corr = _mm512_add_epi32(corr, _mm512_mullo_epi32(sc, sums[s]));
                    }
                }
                slot(DMIN).write(_mm512_slli_epi32::<7>(corr));
                slot(DW).write(_mm512_castps_si512(low16(_mm512_srli_epi32::<16>(gather(106)))));
                continue;
            }
            if w.fmt == Fmt::Q6K {
                // Values less 32 (signed), the scales, and the offset
                // constant 128 · Σ_s scale_s · Σ_{e in s} (value_e − 32).
                let ones = _mm512_set1_epi8(1);
                let mut sums = [_mm512_setzero_si512(); 16];
                for half in 0..2 {
                    for l4 in 0..8 {
                        let a = gather(64 * half + 4 * l4);
                        let bq = gather(64 * half + 32 + 4 * l4);
                        let hb = gather(128 + 32 * half + 4 * l4);
                        let bits = |mask: i8| _mm512_and_si512(hb, _mm512_set1_epi8(mask));
                        let v = [
                            _mm512_or_si512(
                                _mm512_and_si512(a, m4),
                                _mm512_slli_epi32::<4>(bits(3)),
                            ),
                            _mm512_or_si512(
                                _mm512_and_si512(bq, m4),
                                _mm512_slli_epi32::<2>(bits(0x0C)),
                            ),
                            _mm512_or_si512(
                                _mm512_and_si512(_mm512_srli_epi32::<4>(a), m4),
                                bits(0x30),
                            ),
                            _mm512_or_si512(
                                _mm512_and_si512(_mm512_srli_epi32::<4>(bq), m4),
                                _mm512_srli_epi32::<2>(bits(0xC0_u8 as i8)),
                            ),
                        ];
                        for (q, v) in v.into_iter().enumerate() {
                            let kg = 32 * half + 8 * q + l4;
                            let v = _mm512_sub_epi8(v, _mm512_set1_epi8(32));
                            slot(kg * H).write(v);
                            sums[kg / 4] = _mm512_dpbusd_epi32(sums[kg / 4], ones, v);
                        }
                    }
                }
                let mut corr = _mm512_setzero_si512();
                for q in 0..4 {
                    let x = gather(192 + 4 * q);
                    let sc = [
                        _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(x)),
                        _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(x)),
                        _mm512_srai_epi32::<24>(_mm512_slli_epi32::<8>(x)),
                        _mm512_srai_epi32::<24>(x),
                    ];
                    for (i, sc) in sc.into_iter().enumerate() {
                        let s = 4 * q + i;
                        slot(SCALES + s * H).write(sc);
                        corr = _mm512_add_epi32(corr, _mm512_mullo_epi32(sc, sums[s]));
                    }
                }
                slot(DMIN).write(_mm512_slli_epi32::<7>(corr));
                slot(DW).write(_mm512_castps_si512(low16(_mm512_srli_epi32::<16>(gather(206)))));
                continue;
            }
            let dd = gather(0);
            slot(DW).write(_mm512_castps_si512(low16(dd)));
            slot(DMIN).write(_mm512_castps_si512(low16(_mm512_srli_epi32::<16>(dd))));
            // The 12 scale bytes as ggml's `get_scale_min_k4` reads them:
            // u0, u1 the scales of sub-blocks 0-3 and 4-7, u2, u3 the
            // minimums, a byte each.
            let (s0, s1, s2) = (gather(4), gather(8), gather(12));
            let k1 = _mm512_set1_epi32(0x3f3f_3f3f);
            let k2 = _mm512_set1_epi32(0x0f0f_0f0f);
            let k3 = _mm512_set1_epi32(0x0303_0303);
            let u0 = _mm512_and_si512(s0, k1);
            let u2 = _mm512_and_si512(s1, k1);
            let u1 = _mm512_or_si512(
                _mm512_and_si512(s2, k2),
                _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(s0), k3)),
            );
            let u3 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32::<4>(s2), k2),
                _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(s1), k3)),
            );
            let byte = _mm512_set1_epi32(0xFF);
            for (i, u) in [u0, u1].into_iter().enumerate() {
                slot(SCALES + (4 * i) * H).write(_mm512_and_si512(u, byte));
                slot(SCALES + (4 * i + 1) * H)
                    .write(_mm512_and_si512(_mm512_srli_epi32::<8>(u), byte));
                slot(SCALES + (4 * i + 2) * H)
                    .write(_mm512_and_si512(_mm512_srli_epi32::<16>(u), byte));
                slot(SCALES + (4 * i + 3) * H).write(_mm512_srli_epi32::<24>(u));
            }
            // Pairs of minimums as i16 pairs: bytes 0, 1 and 2, 3 of u2, u3.
            let pair_lo = _mm512_set1_epi32(0x0000_00FF);
            let pair_hi = _mm512_set1_epi32(0x00FF_0000);
            for (i, u) in [u2, u3].into_iter().enumerate() {
                let lo = _mm512_or_si512(
                    _mm512_and_si512(u, pair_lo),
                    _mm512_and_si512(_mm512_slli_epi32::<8>(u), pair_hi),
                );
                let hu = _mm512_srli_epi32::<16>(u);
                let hi = _mm512_or_si512(
                    _mm512_and_si512(hu, pair_lo),
                    _mm512_and_si512(_mm512_slli_epi32::<8>(hu), pair_hi),
                );
                slot(MINS + (2 * i) * H).write(lo);
                slot(MINS + (2 * i + 1) * H).write(hi);
            }
            let five = w.fmt == Fmt::Q5K;
            let qs = if five { 48 } else { 16 };
            let one = _mm512_set1_epi8(1);
            for l4 in 0..8 {
                let qh = if five { gather(16 + 4 * l4) } else { _mm512_setzero_si512() };
                for j in 0..4 {
                    let g = gather(qs + 32 * j + 4 * l4);
                    let mut lo = _mm512_and_si512(g, m4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi32::<4>(g), m4);
                    if five {
                        // Bit 2j (low nibbles) and 2j + 1 (high) of each qh
                        // byte, at bit 4 (bits shifted in from the next byte
                        // are masked off).
                        let sh = _mm_cvtsi32_si128(2 * j as i32);
                        let hl = _mm512_and_si512(_mm512_srl_epi32(qh, sh), one);
                        let hh =
                            _mm512_and_si512(_mm512_srl_epi32(_mm512_srli_epi32::<1>(qh), sh), one);
                        lo = _mm512_or_si512(lo, _mm512_slli_epi32::<4>(hl));
                        hi = _mm512_or_si512(hi, _mm512_slli_epi32::<4>(hh));
                    }
                    slot((16 * j + l4) * H).write(lo);
                    slot((16 * j + 8 + l4) * H).write(hi);
                }
            }
        }
    }
}

/// [`cols`] for `len` (1..=CB) columns.
///
/// # Safety
/// As [`cols`].
#[inline(always)]
unsafe fn cols_dyn<const F: u8>(
    dec: *const __m512i,
    acts: &Acts,
    c: usize,
    len: usize,
    b: usize,
    accs: *mut __m512,
) {
    // SAFETY: forwarded.
    unsafe {
        match len {
            6 => cols::<F, 6>(dec, acts, c, b, accs),
            5 => cols::<F, 5>(dec, acts, c, b, accs),
            4 => cols::<F, 4>(dec, acts, c, b, accs),
            3 => cols::<F, 3>(dec, acts, c, b, accs),
            2 => cols::<F, 2>(dec, acts, c, b, accs),
            _ => cols::<F, 1>(dec, acts, c, b, accs),
        }
    }
}

/// A decoded super-block `b` of a block of rows (`dec`) against columns
/// `c .. c + N`, their accumulators (`accs`: per column `H` of the result,
/// then `H` of the Q4_K minimums) carried on. `F`: 0 Q4_K chain of a
/// grouped column (one step per 64 values), 1 Q4_K chain (one step per
/// super-block), 2 Q5_K tiled, 3 Q6_K tiled.
///
/// # Safety
/// The CPU has the features of [`matmul_in`]; `dec` holds the decoded
/// super-block; columns `c .. c + N` exist in `acts` with the layouts
/// their format reads (asserted by the caller) and in `accs`.
#[inline(always)]
unsafe fn cols<const F: u8, const N: usize>(
    dec: *const __m512i,
    acts: &Acts,
    c: usize,
    b: usize,
    accs: *mut __m512,
) {
    let k = acts.k;
    let nb = k / QK_K;
    // Sub-blocks per super-block and groups of four values per sub-block.
    let (subs, per) = if F == 3 { (16, 4) } else { (8, 8) };
    // SAFETY: reads within the decoded super-block and the N columns'
    // activations; accumulators of the N columns (the caller's contract).
    unsafe {
        let o = dec;
        let at = |j: usize, h: usize| accs.add((c + j) * 2 * H + h);
        let mut acc: [[__m512; H]; N] = std::array::from_fn(|j| std::array::from_fn(|h| *at(j, h)));
        let mut accm: [[__m512; H]; N] = if F <= 1 {
            std::array::from_fn(|j| std::array::from_fn(|h| *at(j, H + h)))
        } else {
            [[_mm512_setzero_ps(); H]; N]
        };
        let a: [*const u8; N] = std::array::from_fn(|j| {
            if F == 3 {
                acts.kqu.as_ptr().add((c + j) * k + b * QK_K)
            } else {
                acts.kq.as_ptr().add((c + j) * k + b * QK_K) as *const u8
            }
        });
        let kb: [*const i32; N] =
            std::array::from_fn(|j| acts.kb32.as_ptr().wrapping_add(((c + j) * nb + b) * 4));
        let da: [__m512; N] =
            std::array::from_fn(|j| _mm512_set1_ps(*acts.kd.get_unchecked((c + j) * nb + b)));
        let dw: [__m512; H] = std::array::from_fn(|h| _mm512_castsi512_ps(*o.add(DW + h)));
        let mut s1 = [[_mm512_setzero_si512(); H]; N];
        for s in 0..subs {
            let mut t = [[_mm512_setzero_si512(); H]; N];
            for g in 0..per {
                let kg = s * per + g;
                let wv: [__m512i; H] = std::array::from_fn(|h| *o.add(kg * H + h));
                for j in 0..N {
                    let av = _mm512_set1_epi32((a[j].add(4 * kg) as *const i32).read_unaligned());
                    for h in 0..H {
                        // Q6_K: activations + 128 (unsigned) against values
                        // less 32 (signed); else values against activations.
                        t[j][h] = if F == 3 {
                            _mm512_dpbusd_epi32(t[j][h], av, wv[h])
                        } else {
                            _mm512_dpbusd_epi32(t[j][h], wv[h], av)
                        };
                    }
                }
            }
            for h in 0..H {
                let scv = *o.add(SCALES + s * H + h);
                for j in 0..N {
                    s1[j][h] = _mm512_add_epi32(s1[j][h], _mm512_mullo_epi32(t[j][h], scv));
                }
            }
            if F == 0 && s % 2 == 1 {
                // A grouped Q4_K column: one step per 64 values.
                let u = s / 2;
                for j in 0..N {
                    let pair = _mm512_set1_epi32(*kb[j].add(u));
                    for h in 0..H {
                        let dd = _mm512_mul_ps(dw[h], da[j]);
                        acc[j][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[j][h]), dd, acc[j][h]);
                        s1[j][h] = _mm512_setzero_si512();
                        let im = _mm512_dpwssd_epi32(
                            _mm512_setzero_si512(),
                            *o.add(MINS + u * H + h),
                            pair,
                        );
                        let ddm = _mm512_mul_ps(_mm512_castsi512_ps(*o.add(DMIN + h)), da[j]);
                        accm[j][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), ddm, accm[j][h]);
                    }
                }
            }
        }
        if F != 0 {
            for j in 0..N {
                for h in 0..H {
                    if F == 3 {
                        let s = _mm512_sub_epi32(s1[j][h], *o.add(DMIN + h));
                        let v = _mm512_mul_ps(dw[h], _mm512_cvtepi32_ps(s));
                        acc[j][h] = _mm512_fmadd_ps(v, da[j], acc[j][h]);
                        continue;
                    }
                    // Σ min·bsum over the four pairs of sub-blocks.
                    let mut p = _mm512_setzero_si512();
                    for u in 0..4 {
                        let pair = _mm512_set1_epi32(*kb[j].add(u));
                        p = _mm512_dpwssd_epi32(p, *o.add(MINS + u * H + h), pair);
                    }
                    let dmin = _mm512_castsi512_ps(*o.add(DMIN + h));
                    if F == 1 {
                        let dd = _mm512_mul_ps(dw[h], da[j]);
                        acc[j][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[j][h]), dd, acc[j][h]);
                        let ddm = _mm512_mul_ps(dmin, da[j]);
                        accm[j][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), ddm, accm[j][h]);
                    } else {
                        let v = _mm512_mul_ps(dw[h], _mm512_cvtepi32_ps(s1[j][h]));
                        let v = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(p), v);
                        acc[j][h] = _mm512_fmadd_ps(v, da[j], acc[j][h]);
                    }
                }
            }
        }
        for j in 0..N {
            for h in 0..H {
                *at(j, h) = acc[j][h];
                if F <= 1 {
                    *at(j, H + h) = accm[j][h];
                }
            }
        }
    }
}

/// Registers (two rows each) of a decoded Q5_0 block of rows.
const B32_REGS: usize = 8;
/// Columns met together by one pass over a decoded Q5_0 block of rows.
const B32_COLS: usize = 3;

/// Q5_0 rows on the *lanes* numerics (`rows.rs`), sixteen rows at a time,
/// two rows per register in the layout of `x86.rs`'s Q4_1 tiles: a row's
/// eight lanes of four products in lanes 0-3 and 8-11 (or 4-7 and 12-15)
/// against the activations' `Acts::nib` layout. A block of rows is
/// unpacked once (values plus 16, unsigned, and scales in the lane
/// pattern), then every group of columns meets it: per register and block
/// one `vpdpbusd`, less the column's `16 · Σ` of each lane's four
/// activations (one more `vpdpbusd`, shared by the rows), then
/// `fma(d·d_a, lanes, acc)` lane by lane and ggml's lane sum at the end
/// (`store_q4_pair`), as `rows::dot`.
///
/// # Safety
/// As [`matmul`]; `acts` holds the `nib` and `d` layouts of its columns.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_0_in(
    dec: &mut Vec<__m512i>,
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    let (k, n) = (acts.k, acts.n);
    let nb = k / QK;
    assert!(w.row_bytes >= nb * 22 && w.bytes().len() >= rows.end * w.row_bytes);
    assert!(n * nb * 64 <= acts.nib.len() && n * nb <= acts.d.len());
    dec.resize(nb * 2 * B32_REGS, _mm512_setzero_si512());
    // SAFETY: reads within the rows (asserted) and the columns'
    // activations (asserted); writes within `dec` (2·B32_REGS registers a
    // block).
    unsafe {
        let pat = _mm512_loadu_si512(Q4_PATTERN.as_ptr() as *const _);
        for r0 in rows.clone().step_by(2 * B32_REGS) {
            // Per block and pair of rows: its register of values and its
            // scales in the pattern of the lanes (rows past the end zero).
            let row = |i: usize| w.bytes().as_ptr().add((r0 + i) * w.row_bytes);
            let have = |i: usize| r0 + i < rows.end;
            for b in 0..nb {
                let o = dec.as_mut_ptr().add(2 * B32_REGS * b);
                for i in 0..B32_REGS {
                    let (da, va) = if have(2 * i) {
                        q5_0_block(w, row(2 * i), b)
                    } else {
                        (0.0, _mm256_setzero_si256())
                    };
                    let (db, vb) = if have(2 * i + 1) {
                        q5_0_block(w, row(2 * i + 1), b)
                    } else {
                        (0.0, _mm256_setzero_si256())
                    };
                    let lo = _mm256_permute2x128_si256::<0x20>(va, vb);
                    let hi = _mm256_permute2x128_si256::<0x31>(va, vb);
                    o.add(i).write(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi));
                    let d2 = _mm512_castps128_ps512(_mm_setr_ps(da, db, 0.0, 0.0));
                    o.add(B32_REGS + i).write(_mm512_castps_si512(_mm512_permutexvar_ps(pat, d2)));
                }
            }
            let mut c = 0;
            while c < n {
                let m = (n - c).min(B32_COLS);
                let d = dec.as_ptr();
                match m {
                    3 => q5_0_cols::<3>(d, acts, nb, r0, rows.end, c, out),
                    2 => q5_0_cols::<2>(d, acts, nb, r0, rows.end, c, out),
                    _ => q5_0_cols::<1>(d, acts, nb, r0, rows.end, c, out),
                }
                c += m;
            }
        }
    }
}

/// Block `b` of the Q5_0 row at `row`: its scale and its 32 values plus 16.
///
/// # Safety
/// The CPU has avx2, fma and f16c; `row` is a whole row of `w`.
#[inline(always)]
unsafe fn q5_0_block(w: &RowMat, row: *const u8, b: usize) -> (f32, __m256i) {
    // SAFETY: block b lies within the row (the caller's contract).
    unsafe {
        if w.pairs() {
            let (d, _, v) = pair_block::<2>(row, b);
            return (d, v);
        }
        let blk = std::slice::from_raw_parts(row.add(b * 22), 22);
        let mut vals = [0i32; QK];
        super::rows::b32_values(Fmt::Q5_0, blk, &mut vals);
        let bytes: [u8; QK] = std::array::from_fn(|i| (vals[i] + 16) as u8);
        (crate::quant::f16_at(blk, 0), _mm256_loadu_si256(bytes.as_ptr() as *const __m256i))
    }
}

/// A decoded Q5_0 block of rows (`dec`: per block `B32_REGS` registers of
/// values, as many of scales) against columns `c .. c + N`: rows
/// `r0 .. end` (at most `2·B32_REGS` of them).
///
/// # Safety
/// The CPU has the features of [`q5_0_in`]; `dec` holds `nb` blocks;
/// columns `c .. c + N` exist in `acts` (asserted by the caller); the rows
/// are the caller's.
#[inline(always)]
unsafe fn q5_0_cols<const N: usize>(
    dec: *const __m512i,
    acts: &Acts,
    nb: usize,
    r0: usize,
    end: usize,
    c: usize,
    out: &OutRows<'_>,
) {
    let regs = (end - r0).div_ceil(2).min(B32_REGS);
    // SAFETY: within the decoded blocks and the N columns (the caller's
    // contract); rows of the caller's block.
    unsafe {
        let zero = _mm512_setzero_si512();
        let sixteen = _mm512_set1_epi8(16);
        let mut acc = [[_mm512_setzero_ps(); N]; B32_REGS];
        for b in 0..nb {
            let o = dec.add(2 * B32_REGS * b);
            let az: [__m512i; N] = std::array::from_fn(|j| {
                _mm512_loadu_si512(acts.nib.as_ptr().add(((c + j) * nb + b) * 64) as *const _)
            });
            let da: [__m512; N] =
                std::array::from_fn(|j| _mm512_set1_ps(*acts.d.get_unchecked((c + j) * nb + b)));
            let c16: [__m512i; N] =
                std::array::from_fn(|j| _mm512_dpbusd_epi32(zero, sixteen, az[j]));
            for i in 0..B32_REGS {
                let wz = *o.add(i);
                let dw = _mm512_castsi512_ps(*o.add(B32_REGS + i));
                for j in 0..N {
                    let lanes = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, wz, az[j]), c16[j]);
                    acc[i][j] = _mm512_fmadd_ps(
                        _mm512_mul_ps(dw, da[j]),
                        _mm512_cvtepi32_ps(lanes),
                        acc[i][j],
                    );
                }
            }
        }
        for j in 0..N {
            for i in 0..regs {
                store_q4_pair(acc[i][j], 0.0, 0.0, c + j, r0 + 2 * i, end, out);
            }
        }
    }
}

/// Registers per block and sixteen rows of a decoded Q4_0 block of rows:
/// eight of values (register g: values 4g .. 4g + 3 of each row, unsigned
/// nibbles), one of scales (f32).
const Q4_SLOTS: usize = 9;
/// Registers of sixteen rows in a decoded Q4_0 block of rows.
const Q4_H: usize = 2;
/// Columns met together by one pass over a decoded Q4_0 block of rows.
const Q4_COLS: usize = 4;

/// Q4_0 rows on the *chain* numerics (`rows.rs`): thirty-two rows at a
/// time, a row per lane of two registers. A block of rows is decoded once
/// into scratch (every block of its groups of eight rows, transposed by
/// `avx2::q4_0_group8`: a row's values four to a lane, and its scales),
/// then every group of columns meets it: per block, register and column
/// eight `vpdpbusd` against the column's four activation bytes broadcast
/// give each row's exact `Σ q · a`, less the column's `8 · Σ a`
/// (`Acts::off8`), which is `Σ (q − 8) · a`; then `fma(isum, d · d_a, acc)`
/// as `rows::dot` does, lane by lane: bit-identical.
///
/// # Safety
/// As [`matmul`]; `acts` holds the `off8` and `d` layouts of its columns.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_0_in(
    dec: &mut Vec<__m512i>,
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    let (k, n) = (acts.k, acts.n);
    let nb = k / QK;
    let rb = w.row_bytes;
    assert!(rb >= nb * 18 && w.group() == 8);
    assert!(n * k <= acts.q.len() && n * nb <= acts.d.len() && n * nb <= acts.off8.len());
    dec.resize(nb * Q4_H * Q4_SLOTS, _mm512_setzero_si512());
    // SAFETY: reads within whole groups of the caller's rows (`w.at`
    // asserts each); writes stay within `dec` (sized above); the column
    // kernels' bounds are asserted above.
    unsafe {
        let data = w.bytes().as_ptr();
        for r0 in rows.clone().step_by(16 * Q4_H) {
            let m = (rows.end - r0).min(16 * Q4_H);
            // Groups of eight rows (`RowMat` keeps chain Q4_0 in eights),
            // two to a register (`avx2::q4_0_group8`); a register past the
            // rows is zeros.
            assert!(m.is_multiple_of(8));
            for h in 0..Q4_H {
                let groups: [Option<super::rows::At>; 2] = std::array::from_fn(|i| {
                    let g0 = r0 + 16 * h + 8 * i;
                    (g0 < r0 + m).then(|| w.at(g0, 8))
                });
                for b in 0..nb {
                    let o = dec.as_mut_ptr().add((b * Q4_H + h) * Q4_SLOTS);
                    let half = |i: usize| match groups[i] {
                        Some(at) => q4_0_group8(data.add(at.base + b * at.block), at.row),
                        None => ([_mm256_setzero_si256(); 8], _mm256_setzero_ps()),
                    };
                    let (lo, hi) = (half(0), half(1));
                    for j in 0..8 {
                        o.add(j).write(_mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(lo.0[j]),
                            hi.0[j],
                        ));
                    }
                    let d = _mm512_insertf64x4::<1>(
                        _mm512_castpd256_pd512(_mm256_castps_pd(lo.1)),
                        _mm256_castps_pd(hi.1),
                    );
                    o.add(8).write(_mm512_castpd_si512(d));
                }
            }
            let mut c = 0;
            while c < n {
                let len = (n - c).min(Q4_COLS);
                let d = dec.as_ptr();
                match len {
                    4 => q4_0_cols::<4>(d, acts, nb, r0, m, c, out),
                    3 => q4_0_cols::<3>(d, acts, nb, r0, m, c, out),
                    2 => q4_0_cols::<2>(d, acts, nb, r0, m, c, out),
                    _ => q4_0_cols::<1>(d, acts, nb, r0, m, c, out),
                }
                c += len;
            }
        }
    }
}

/// A decoded Q4_0 block of rows (`dec`, see [`q4_0_in`]) against columns
/// `c .. c + N`: rows `r0 .. r0 + m`.
///
/// # Safety
/// The CPU has the features of [`q4_0_in`]; `dec` holds `nb` decoded
/// blocks; columns `c .. c + N` exist in `acts` with their `q`, `d` and
/// `off8` (asserted by the caller); the rows are the caller's.
#[inline(always)]
unsafe fn q4_0_cols<const N: usize>(
    dec: *const __m512i,
    acts: &Acts,
    nb: usize,
    r0: usize,
    m: usize,
    c: usize,
    out: &OutRows<'_>,
) {
    let k = acts.k;
    // SAFETY: within the decoded blocks and the N columns (the caller's
    // contract); rows of the caller's block.
    unsafe {
        let q = acts.q.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); N]; Q4_H];
        for b in 0..nb {
            let o = dec.add(b * Q4_H * Q4_SLOTS);
            let mut isum = [[_mm512_setzero_si512(); N]; Q4_H];
            for g in 0..8 {
                let a: [__m512i; N] = std::array::from_fn(|j| {
                    _mm512_set1_epi32(
                        (q.add((c + j) * k + b * QK + 4 * g) as *const i32).read_unaligned(),
                    )
                });
                for h in 0..Q4_H {
                    let wv = *o.add(h * Q4_SLOTS + g);
                    for j in 0..N {
                        isum[h][j] = _mm512_dpbusd_epi32(isum[h][j], wv, a[j]);
                    }
                }
            }
            for j in 0..N {
                let da = _mm512_set1_ps(*acts.d.get_unchecked((c + j) * nb + b));
                let off = _mm512_set1_epi32(*acts.off8.get_unchecked((c + j) * nb + b));
                for h in 0..Q4_H {
                    let dw = _mm512_castsi512_ps(*o.add(h * Q4_SLOTS + 8));
                    acc[h][j] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[h][j], off)),
                        _mm512_mul_ps(dw, da),
                        acc[h][j],
                    );
                }
            }
        }
        for j in 0..N {
            let mut col = [0f32; 16 * Q4_H];
            for h in 0..Q4_H {
                _mm512_storeu_ps(col.as_mut_ptr().add(16 * h), acc[h][j]);
            }
            out.set_run(c + j, r0, &col[..m]);
        }
    }
}
