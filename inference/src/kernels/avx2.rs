//! AVX2 kernels over row-major GGUF matrices (`rows.rs`), bit-identical to
//! the portable ones there: the same integer lanes (`vpmaddubsw` pairs
//! summed by `vpmaddwd`, as llama.cpp's AVX2 `ggml_vec_dot_*` form them)
//! and the same float steps in the same order. Each call decodes a row's
//! block once and applies it to up to [`MAX_N`] columns.

// Register arrays are indexed in lock step; index loops read clearest here.
#![allow(clippy::needless_range_loop)]

use super::rows::{Fmt, RowMat, COL_BLOCK, MAX_N};
use super::{hsum8, Acts, OutRows};
use crate::quant::{scale_min_k4, QK, QK_K};
use std::arch::x86_64::*;

/// Whether this CPU runs these kernels.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// See `rows::matmul`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c (`available()`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matmul(
    w: &RowMat,
    acts: &Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    if matches!(w.fmt, Fmt::F16 | Fmt::BF16) || (w.fmt == Fmt::Q4K && !w.chain) {
        // Rare: f16/bf16 matrices and Q4_K with a row count ggml does not
        // repack take the portable path (compiled here with AVX2 and FMA).
        super::rows::matmul(w, acts, rows, out);
        return;
    }
    assert!(w.data.len() >= rows.end * w.row_bytes);
    for c0 in (0..acts.n).step_by(COL_BLOCK) {
        let c1 = (c0 + COL_BLOCK).min(acts.n);
        for r in rows.clone() {
            let row = &w.data[r * w.row_bytes..(r + 1) * w.row_bytes];
            let mut c = c0;
            while c < c1 {
                let n = (c1 - c).min(MAX_N);
                let mut res = [0f32; MAX_N];
                // SAFETY: the CPU has the features (caller); `row` is one
                // whole row of `w.fmt` and `acts` holds columns `c..c + n` of
                // `k` values in the layout the format reads (asserted inside).
                unsafe {
                    match n {
                        4 => dot::<4>(w, row, acts, c, &mut res),
                        3 => dot::<3>(w, row, acts, c, &mut res),
                        2 => dot::<2>(w, row, acts, c, &mut res),
                        _ => dot::<1>(w, row, acts, c, &mut res),
                    }
                }
                for (j, v) in res[..n].iter().enumerate() {
                    out.set(c + j, r, *v);
                }
                c += n;
            }
        }
    }
}

#[inline(always)]
unsafe fn dot<const N: usize>(
    w: &RowMat,
    row: &[u8],
    acts: &Acts,
    c: usize,
    res: &mut [f32; MAX_N],
) {
    // SAFETY: forwarded from `matmul`.
    unsafe {
        match w.fmt {
            Fmt::Q8_0 | Fmt::Q4_0 | Fmt::Q5_0 | Fmt::Q4_1 | Fmt::Q5_1 => {
                b32::<N>(w.fmt, w.chain, row, acts, c, res)
            }
            Fmt::Q4K => q4k_chain::<N>(row, acts, c, res),
            Fmt::Q5K => q5k::<N>(row, acts, c, res),
            Fmt::Q6K => q6k::<N>(row, acts, c, res),
            Fmt::F16 | Fmt::BF16 => unreachable!(),
        }
    }
}

#[inline(always)]
unsafe fn hsum8_reg(v: __m256) -> f32 {
    let mut l = [0f32; 8];
    // SAFETY: eight floats stored into an eight-float array.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
    hsum8(&l)
}

#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let mut l = [0i32; 8];
    // SAFETY: eight ints stored into an eight-int array.
    unsafe { _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, v) };
    l.iter().sum()
}

/// 32 nibbles of 16 bytes as 32 bytes: low nibbles first, then high
/// (ggml's `bytes_from_nibbles_32`).
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
#[inline(always)]
unsafe fn us_lanes(u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: register arithmetic only.
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: caller guarantees 2 readable bytes at p.
    half::f16::from_bits(unsafe { (p as *const u16).read_unaligned() }).to_f32()
}

/// Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 (blocks of 32, Q8_0/Q8_1 activations).
#[inline(always)]
unsafe fn b32<const N: usize>(
    fmt: Fmt,
    chain: bool,
    row: &[u8],
    acts: &Acts,
    c: usize,
    res: &mut [f32; MAX_N],
) {
    let k = acts.k;
    let nb = k / QK;
    let bb = fmt.block().1;
    assert!(row.len() >= nb * bb);
    assert!(
        (c + N) * k <= acts.q.len() && (c + N) * nb <= acts.d.len() && (c + N) * nb <= acts.s.len()
    );
    // SAFETY: every load below is within `row` (nb blocks) or within the
    // activation buffers (columns c..c+N), asserted above.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        let mut facc = [0f32; N];
        let mut summs = [0f32; N];
        let rp = row.as_ptr();
        for b in 0..nb {
            let blk = rp.add(b * bb);
            let dw = f16_at(blk);
            // Signed values (sign trick) or unsigned ones (Q4_1, Q5_1).
            let (x, signed) = match fmt {
                Fmt::Q8_0 => (_mm256_loadu_si256(blk.add(2) as *const __m256i), true),
                Fmt::Q4_0 => (_mm256_sub_epi8(nibbles(blk.add(2)), _mm256_set1_epi8(8)), true),
                Fmt::Q5_0 => {
                    let hi = _mm256_andnot_si256(bits(blk.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
                    (_mm256_or_si256(nibbles(blk.add(6)), hi), true)
                }
                Fmt::Q4_1 => (nibbles(blk.add(4)), false),
                _ => {
                    let hi = _mm256_and_si256(bits(blk.add(4)), _mm256_set1_epi8(0x10));
                    (_mm256_or_si256(nibbles(blk.add(8)), hi), false)
                }
            };
            let ax = if signed { _mm256_sign_epi8(x, x) } else { x };
            for j in 0..N {
                let col = c + j;
                let y = _mm256_loadu_si256(acts.q.as_ptr().add(col * k + b * QK) as *const __m256i);
                let sy = if signed { _mm256_sign_epi8(y, x) } else { y };
                let lanes = us_lanes(ax, sy);
                let da = *acts.d.get_unchecked(col * nb + b);
                if chain {
                    let isum = hsum_i32(lanes);
                    facc[j] = (isum as f32).mul_add(dw * da, facc[j]);
                } else {
                    acc[j] =
                        _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(lanes), acc[j]);
                    if !signed {
                        let m = f16_at(blk.add(2));
                        summs[j] = m.mul_add(*acts.s.get_unchecked(col * nb + b), summs[j]);
                    }
                }
            }
        }
        for j in 0..N {
            res[j] = if chain { facc[j] } else { hsum8_reg(acc[j]) + summs[j] };
        }
    }
}

/// Sub-block `j`'s minimum-times-sum integer of a K-quant (`Σ m_s · bsum32_s`).
#[inline(always)]
fn k_mins(mn: &[i32; 8], bs: &[i16]) -> i32 {
    (0..8).map(|s| mn[s] * (bs[2 * s] as i32 + bs[2 * s + 1] as i32)).sum()
}

/// Scales and minimums of a Q4_K/Q5_K block as i32.
#[inline(always)]
fn k4_scales(sc12: &[u8]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for s in 0..8 {
        let (a, m) = scale_min_k4(s, sc12);
        sc[s] = a as i32;
        mn[s] = m as i32;
    }
    (sc, mn)
}

/// Q4_K on the *chain* numerics (ggml's repacked `q4_K_8x8`).
#[inline(always)]
unsafe fn q4k_chain<const N: usize>(row: &[u8], acts: &Acts, c: usize, res: &mut [f32; MAX_N]) {
    let k = acts.k;
    let nb = k / QK_K;
    assert!(row.len() >= nb * 144);
    assert!(
        (c + N) * k <= acts.kq.len()
            && (c + N) * nb <= acts.kd.len()
            && (c + N) * nb * 16 <= acts.kbs.len()
    );
    // SAFETY: loads within `row` (nb blocks) and columns c..c+N (asserted).
    unsafe {
        let mut acc = [0f32; N];
        let mut accm = [0f32; N];
        let m4 = _mm256_set1_epi8(0x0F);
        for b in 0..nb {
            let blk = row.as_ptr().add(b * 144);
            let (dw, dmin) = (f16_at(blk), f16_at(blk.add(2)));
            let (sc, mn) = k4_scales(&row[b * 144 + 4..b * 144 + 16]);
            let mut isum = [_mm256_setzero_si256(); N];
            let grouped: [bool; N] = std::array::from_fn(|j| acts.grouped(c + j));
            for g in 0..4 {
                let q = _mm256_loadu_si256(blk.add(16 + 32 * g) as *const __m256i);
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                let (sl, sh) =
                    (_mm256_set1_epi16(sc[2 * g] as i16), _mm256_set1_epi16(sc[2 * g + 1] as i16));
                for j in 0..N {
                    let a = acts.kq.as_ptr().add((c + j) * k + b * QK_K + 64 * g);
                    let al = _mm256_loadu_si256(a as *const __m256i);
                    let ah = _mm256_loadu_si256(a.add(32) as *const __m256i);
                    let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, al), sl);
                    let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ah), sh);
                    isum[j] = _mm256_add_epi32(isum[j], _mm256_add_epi32(pl, ph));
                    if grouped[j] {
                        // ggml's gemm: one step per 64 values.
                        let col = c + j;
                        let da = *acts.kd.get_unchecked(col * nb + b);
                        let bs = &acts.kbs[(col * nb + b) * 16..(col * nb + b + 1) * 16];
                        let i = hsum_i32(isum[j]);
                        isum[j] = _mm256_setzero_si256();
                        let im = mn[2 * g] * (bs[4 * g] as i32 + bs[4 * g + 1] as i32)
                            + mn[2 * g + 1] * (bs[4 * g + 2] as i32 + bs[4 * g + 3] as i32);
                        acc[j] = (i as f32).mul_add(dw * da, acc[j]);
                        accm[j] = (im as f32).mul_add(dmin * da, accm[j]);
                    }
                }
            }
            for j in 0..N {
                if grouped[j] {
                    continue;
                }
                let col = c + j;
                let da = *acts.kd.get_unchecked(col * nb + b);
                let bs = &acts.kbs[(col * nb + b) * 16..(col * nb + b + 1) * 16];
                let i = hsum_i32(isum[j]);
                acc[j] = (i as f32).mul_add(dw * da, acc[j]);
                accm[j] = (k_mins(&mn, bs) as f32).mul_add(dmin * da, accm[j]);
            }
        }
        for j in 0..N {
            res[j] = acc[j] - accm[j];
        }
    }
}

/// Q5_K (ggml's AVX2 `ggml_vec_dot_q5_K_q8_K`).
#[inline(always)]
unsafe fn q5k<const N: usize>(row: &[u8], acts: &Acts, c: usize, res: &mut [f32; MAX_N]) {
    let k = acts.k;
    let nb = k / QK_K;
    assert!(row.len() >= nb * 176);
    assert!(
        (c + N) * k <= acts.kq.len()
            && (c + N) * nb <= acts.kd.len()
            && (c + N) * nb * 16 <= acts.kbs.len()
    );
    // SAFETY: loads within `row` (nb blocks) and columns c..c+N (asserted).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        let mut summs = [0f32; N];
        let mut facc = [0f32; N];
        let wide: [bool; N] = std::array::from_fn(|j| acts.wide(c + j));
        let m4 = _mm256_set1_epi8(0x0F);
        for b in 0..nb {
            let blk = row.as_ptr().add(b * 176);
            let (dw, dminw) = (f16_at(blk), f16_at(blk.add(2)));
            let (sc, mn) = k4_scales(&row[b * 176 + 4..b * 176 + 16]);
            let hbits = _mm256_loadu_si256(blk.add(16) as *const __m256i);
            let mut sumi = [_mm256_setzero_si256(); N];
            for g in 0..4 {
                let q = _mm256_loadu_si256(blk.add(48 + 32 * g) as *const __m256i);
                let m0 = _mm256_set1_epi8(1 << (2 * g));
                let m1 = _mm256_set1_epi8(2 << (2 * g));
                let h0 = _mm256_and_si256(hbits, m0);
                let h1 = _mm256_and_si256(hbits, m1);
                // The chosen bit moved to bit 4 of its byte.
                let (h0, h1) = match g {
                    0 => (_mm256_slli_epi16::<4>(h0), _mm256_slli_epi16::<3>(h1)),
                    1 => (_mm256_slli_epi16::<2>(h0), _mm256_slli_epi16::<1>(h1)),
                    2 => (h0, _mm256_srli_epi16::<1>(h1)),
                    _ => (_mm256_srli_epi16::<2>(h0), _mm256_srli_epi16::<3>(h1)),
                };
                let lo = _mm256_add_epi8(_mm256_and_si256(q, m4), h0);
                let hi = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), h1);
                let (sl, sh) =
                    (_mm256_set1_epi16(sc[2 * g] as i16), _mm256_set1_epi16(sc[2 * g + 1] as i16));
                for j in 0..N {
                    let a = acts.kq.as_ptr().add((c + j) * k + b * QK_K + 64 * g);
                    let al = _mm256_loadu_si256(a as *const __m256i);
                    let ah = _mm256_loadu_si256(a.add(32) as *const __m256i);
                    let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, al), sl);
                    let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ah), sh);
                    sumi[j] = _mm256_add_epi32(sumi[j], _mm256_add_epi32(pl, ph));
                }
            }
            for j in 0..N {
                let col = c + j;
                let da = *acts.kd.get_unchecked(col * nb + b);
                let bs = &acts.kbs[(col * nb + b) * 16..(col * nb + b + 1) * 16];
                if wide[j] {
                    // ggml's tiled kernel (see `rows::dot`).
                    let r = (-dminw).mul_add(k_mins(&mn, bs) as f32, dw * hsum_i32(sumi[j]) as f32);
                    facc[j] = r.mul_add(da, facc[j]);
                    continue;
                }
                acc[j] =
                    _mm256_fmadd_ps(_mm256_set1_ps(da * dw), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
                summs[j] = (-da * dminw).mul_add(k_mins(&mn, bs) as f32, summs[j]);
            }
        }
        for j in 0..N {
            res[j] = if wide[j] { facc[j] } else { hsum8_reg(acc[j]) + summs[j] };
        }
    }
}

/// Q6_K (ggml's AVX2 `ggml_vec_dot_q6_K_q8_K`).
#[inline(always)]
unsafe fn q6k<const N: usize>(row: &[u8], acts: &Acts, c: usize, res: &mut [f32; MAX_N]) {
    let k = acts.k;
    let nb = k / QK_K;
    assert!(row.len() >= nb * 210);
    assert!(
        (c + N) * k <= acts.kq.len()
            && (c + N) * nb <= acts.kd.len()
            && (c + N) * nb * 16 <= acts.kbs.len()
    );
    // SAFETY: loads within `row` (nb blocks) and columns c..c+N (asserted).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        let mut facc = [0f32; N];
        let wide: [bool; N] = std::array::from_fn(|j| acts.wide(c + j));
        let m15 = _mm256_set1_epi8(15);
        for b in 0..nb {
            let blk = row.as_ptr().add(b * 210);
            let dw = f16_at(blk.add(208));
            let scales = _mm_loadu_si128(blk.add(192) as *const __m128i);
            let scales16 = _mm256_cvtepi8_epi16(scales);
            let mut sumi = [_mm256_setzero_si256(); N];
            for h in 0..2 {
                let q1 = _mm256_loadu_si256(blk.add(64 * h) as *const __m256i);
                let q2 = _mm256_loadu_si256(blk.add(64 * h + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
                let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(3)));
                let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(12)));
                let h2 = _mm256_and_si256(qh, _mm256_set1_epi8(48));
                let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(-64)));
                let w = [
                    _mm256_or_si256(_mm256_and_si256(q1, m15), h0),
                    _mm256_or_si256(_mm256_and_si256(q2, m15), h1),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q1), m15), h2),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q2), m15), h3),
                ];
                for (kk, wk) in w.iter().enumerate() {
                    // Scales of the chunk's two halves (16 values each).
                    let s = (8 * h + 2 * kk) as i16;
                    let lo = _mm_set1_epi16(*blk.add(192 + s as usize) as i8 as i16);
                    let hi = _mm_set1_epi16(*blk.add(193 + s as usize) as i8 as i16);
                    let sv = _mm256_set_m128i(hi, lo);
                    for j in 0..N {
                        let a = acts.kq.as_ptr().add((c + j) * k + b * QK_K + 128 * h + 32 * kk);
                        let av = _mm256_loadu_si256(a as *const __m256i);
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*wk, av), sv);
                        sumi[j] = _mm256_add_epi32(sumi[j], p);
                    }
                }
            }
            for j in 0..N {
                let col = c + j;
                let da = *acts.kd.get_unchecked(col * nb + b);
                let bs = _mm256_loadu_si256(
                    acts.kbs.as_ptr().add((col * nb + b) * 16) as *const __m256i
                );
                let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, scales16));
                let s = _mm256_sub_epi32(sumi[j], corr);
                if wide[j] {
                    // ggml's tiled kernel (see `rows::dot`).
                    facc[j] = (dw * hsum_i32(s) as f32).mul_add(da, facc[j]);
                    continue;
                }
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(da * dw), _mm256_cvtepi32_ps(s), acc[j]);
            }
        }
        for j in 0..N {
            res[j] = if wide[j] { facc[j] } else { hsum8_reg(acc[j]) };
        }
    }
}

/// See `attn::attend_vec`: llama.cpp's one-query flash attention
/// (`ggml_vec_dot_f16` of the AVX-512 build: four 16-lane partial sums per
/// 64 values, here as eight 8-lane registers), the accumulator held as f16.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; `q.len()` is a multiple of 64,
/// at most 256, `out.len() == q.len()`, `from <= upto`, and the caches hold
/// `upto` positions of `lane` (all asserted by the caller).
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
    out: &mut [f32],
) {
    let hd = q.len();
    let chunks = hd / 8;
    assert!(out.len() == hd && chunks <= 32 && hd.is_multiple_of(64) && from <= upto);
    assert!(upto == 0 || (upto - 1) * lane.stride + lane.offset + hd <= kc.len().min(vc.len()));
    // SAFETY: every pointer below stays within the slices asserted above.
    unsafe {
        let mut qv = [_mm256_setzero_ps(); 32];
        for (c, v) in qv.iter_mut().take(chunks).enumerate() {
            // The query rounded to f16 and back, as llama.cpp converts it.
            let x = _mm256_loadu_ps(q.as_ptr().add(8 * c));
            *v = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
        }
        let mut acc = [_mm_setzero_si128(); 32];
        let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
        for t in from..upto {
            let at = t * lane.stride + lane.offset;
            let kp = kc.as_ptr().add(at) as *const __m128i;
            // Accumulator j, half h: lanes 8h.. of ggml's 16-lane sum j.
            let mut sum = [[_mm256_setzero_ps(); 2]; 4];
            for i in (0..chunks).step_by(8) {
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
            let s = super::attn::reduce16(&l) * scale;
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

/// See `attn::tiled_scores`: 64 keys in eight registers, one fma per head
/// element.
///
/// # Safety
/// The CPU must support avx2 and fma; `kt` holds `q.len() · 64` values.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tiled_scores(q: &[f32], kt: &[f32], scale: f32, kq: &mut [f32; 64]) {
    assert!(kt.len() >= q.len() * 64);
    // SAFETY: row d of `kt` is 64 floats within it (asserted above).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (d, &qd) in q.iter().enumerate() {
            let p = _mm256_set1_ps(qd);
            let col = kt.as_ptr().add(d * 64);
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(col.add(8 * j)), p, *a);
            }
        }
        let sv = _mm256_set1_ps(scale);
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(kq.as_mut_ptr().add(8 * j), _mm256_mul_ps(*a, sv));
        }
    }
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

/// See `attn::tiled_accumulate`.
///
/// # Safety
/// The CPU must support avx2 and fma; `acc.len()` is a multiple of 8, at
/// most 256, and `v32` holds `p.len() · acc.len()` values.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tiled_accumulate(p: &[f32], v32: &[f32], acc: &mut [f32]) {
    let hd = acc.len();
    assert!(hd.is_multiple_of(8) && hd <= 256 && v32.len() >= p.len() * hd);
    // SAFETY: all offsets stay within `acc` and `v32` (asserted above).
    unsafe {
        let mut a = [_mm256_setzero_ps(); 32];
        let chunks = hd / 8;
        for (c, r) in a.iter_mut().take(chunks).enumerate() {
            *r = _mm256_loadu_ps(acc.as_ptr().add(8 * c));
        }
        for (t, &pt) in p.iter().enumerate() {
            let pv = _mm256_set1_ps(pt);
            let row = v32.as_ptr().add(t * hd);
            for (c, r) in a.iter_mut().take(chunks).enumerate() {
                *r = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(8 * c)), pv, *r);
            }
        }
        for (c, r) in a.iter().take(chunks).enumerate() {
            _mm256_storeu_ps(acc.as_mut_ptr().add(8 * c), *r);
        }
    }
}
