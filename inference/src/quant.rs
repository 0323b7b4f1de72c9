//! Quantized block formats as GGUF stores them: rows dequantized to f32 (the
//! token-embedding lookup), and the quantization of activations that the
//! integer dot products consume.
//!
//! INVARIANT: activation quantization reproduces llama.cpp bit for bit —
//! Q8_0/Q8_1 as its x86 `quantize_row_q8_0/1` (block max, `d = max / 127`
//! rounded to f16, `round-half-even(x · 127 / max)`, `s = d · Σq` rounded to
//! f16), Q8_K as `quantize_row_q8_K_ref` (`iscale = −127 / max` of the
//! signed largest value, `d = 1 / iscale` in f32, sums per 16) — and
//! dequantization reproduces ggml's `dequantize_row_*` (plain f32
//! arithmetic, no fused multiply-add), so the numbers built on them are the
//! ones llama.cpp computes.

use crate::gguf::GgmlType;
use half::f16;

/// Elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1.
pub(crate) const QK: usize = 32;
/// Elements per K-quant super-block.
pub(crate) const QK_K: usize = 256;

/// GGUF Q4_1 block: `w = d · q + m`, q in 0..16, 20 bytes.
pub(crate) const Q4_1_BYTES: usize = 20;
/// GGUF Q8_0 block: `w = d · q`, q in −127..=127, 34 bytes.
pub(crate) const Q8_0_BYTES: usize = 34;

#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One row of activations quantized to 8 bits per block of 32: the `q8_1`
/// of llama.cpp (scale `d` and `s = d · Σq`, both rounded through f16).
#[derive(Debug, Clone, Default)]
pub(crate) struct Q8Row {
    /// `blocks × 32` quantized values.
    pub(crate) q: Vec<i8>,
    /// Per block scale (an f16 value, widened).
    pub(crate) d: Vec<f32>,
    /// Per block `d · Σq` (an f16 value, widened).
    pub(crate) s: Vec<f32>,
}

/// Quantizes `x` (a multiple of 32 long) into `out`.
pub(crate) fn quantize_q8(x: &[f32], out: &mut Q8Row) {
    let nb = x.len() / QK;
    out.q.clear();
    out.d.clear();
    out.s.clear();
    out.q.reserve(nb * QK);
    for blk in x.chunks_exact(QK) {
        let (q, d, s) = quantize_block_q8(blk);
        out.q.extend_from_slice(&q);
        out.d.push(d);
        out.s.push(s);
    }
}

/// One block of [`quantize_q8`]: values, `d`, `s`.
#[inline(always)]
pub(crate) fn quantize_block_q8(blk: &[f32]) -> ([i8; QK], f32, f32) {
    let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    let mut q = [0i8; QK];
    for (o, v) in q.iter_mut().zip(blk) {
        let r = (v * id).round_ties_even() as i32;
        sum += r;
        *o = r.clamp(-128, 127) as i8;
    }
    (q, f16::from_f32(d).to_f32(), f16::from_f32(d * sum as f32).to_f32())
}

/// Quantizes one K-quant super-block of activations (`x`: 256 values) as
/// llama.cpp's `quantize_row_q8_K_ref`: returns `d` and writes the values
/// and the sums of each 16.
#[inline(always)]
pub(crate) fn quantize_block_q8k(x: &[f32], q: &mut [i8], bsums: &mut [i16]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in &x[..QK_K] {
        let a = v.abs();
        if a > amax {
            amax = a;
            max = v;
        }
    }
    if amax == 0.0 {
        q[..QK_K].fill(0);
        bsums[..QK_K / 16].fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (o, &v) in q[..QK_K].iter_mut().zip(&x[..QK_K]) {
        *o = nearest_int(iscale * v).min(127) as i8;
    }
    for (j, b) in bsums[..QK_K / 16].iter_mut().enumerate() {
        *b = q[16 * j..16 * j + 16].iter().map(|&v| v as i16).sum();
    }
    1.0 / iscale
}

/// ggml's `nearest_int`: round half to even (|v| < 2²²).
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let val = v + 12_582_912.0;
    (val.to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K/Q5_K block
/// (ggml's `get_scale_min_k4`).
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Whether [`dequantize_row`] reads this type.
pub(crate) fn dequantizes(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
    )
}

/// Dequantizes one row of a GGUF tensor of type `ty` into `out` (which sets
/// the row length) as ggml's `dequantize_row_*` does. Types that
/// [`dequantizes`] refuses leave `out` untouched.
pub(crate) fn dequantize_row(ty: GgmlType, raw: &[u8], out: &mut [f32]) {
    use GgmlType::*;
    match ty {
        F32 => {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        F16 => {
            // Sixty-four at a time through `half`'s slice conversion (F16C
            // where the CPU has it): exact either way.
            use half::slice::HalfFloatSliceExt;
            let mut buf = [f16::ZERO; 64];
            for (o, c) in out.chunks_mut(64).zip(raw.chunks(128)) {
                let n = o.len().min(c.len() / 2);
                for (b, h) in buf.iter_mut().zip(c.chunks_exact(2)) {
                    *b = f16::from_le_bytes([h[0], h[1]]);
                }
                buf[..n].convert_to_f32_slice(&mut o[..n]);
            }
        }
        BF16 => {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(raw.chunks_exact(Q8_0_BYTES)) {
                let d = f16_at(b, 0);
                for (j, v) in o.iter_mut().enumerate() {
                    *v = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
        Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(raw.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    o[j] = ((b[2 + j] & 15) as i32 - 8) as f32 * d;
                    o[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(raw.chunks_exact(Q4_1_BYTES)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                for j in 0..16 {
                    o[j] = (b[4 + j] & 15) as f32 * d + m;
                    o[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
                }
            }
        }
        Q5_0 | Q5_1 => {
            let one = ty == Q5_1;
            let bb = if one { 24 } else { 22 };
            for (o, b) in out.chunks_exact_mut(QK).zip(raw.chunks_exact(bb)) {
                let d = f16_at(b, 0);
                let m = if one { f16_at(b, 2) } else { 0.0 };
                let h = if one { 4 } else { 2 };
                let qh = u32::from_le_bytes([b[h], b[h + 1], b[h + 2], b[h + 3]]);
                let qs = &b[h + 4..h + 20];
                let off = if one { 0 } else { 16 };
                for j in 0..16 {
                    let h0 = ((qh >> j) << 4) & 0x10;
                    let h1 = (qh >> (j + 12)) & 0x10;
                    let x0 = ((qs[j] as u32 & 0x0F) | h0) as i32 - off;
                    let x1 = ((qs[j] as u32 >> 4) | h1) as i32 - off;
                    if one {
                        o[j] = x0 as f32 * d + m;
                        o[j + 16] = x1 as f32 * d + m;
                    } else {
                        o[j] = x0 as f32 * d;
                        o[j + 16] = x1 as f32 * d;
                    }
                }
            }
        }
        Q4_K | Q5_K => {
            let five = ty == Q5_K;
            let bb = if five { 176 } else { 144 };
            for (o, b) in out.chunks_exact_mut(QK_K).zip(raw.chunks_exact(bb)) {
                let (d, min) = (f16_at(b, 0), f16_at(b, 2));
                let sc = &b[4..16];
                let (qh, qs) =
                    if five { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
                for j in 0..4 {
                    let (s1, m1) = scale_min_k4(2 * j, sc);
                    let (s2, m2) = scale_min_k4(2 * j + 1, sc);
                    let (d1, m1) = (d * s1 as f32, min * m1 as f32);
                    let (d2, m2) = (d * s2 as f32, min * m2 as f32);
                    let q = &qs[32 * j..32 * j + 32];
                    for l in 0..32 {
                        let (mut lo, mut hi) = ((q[l] & 0xF) as u32, (q[l] >> 4) as u32);
                        if five {
                            lo += if qh[l] & (1 << (2 * j)) != 0 { 16 } else { 0 };
                            hi += if qh[l] & (2 << (2 * j)) != 0 { 16 } else { 0 };
                        }
                        o[64 * j + l] = d1 * lo as f32 - m1;
                        o[64 * j + 32 + l] = d2 * hi as f32 - m2;
                    }
                }
            }
        }
        Q2_K => {
            // ggml's `dequantize_row_q2_K`: `d · scale · value − dmin · min`
            // per 16 values.
            for (o, b) in out.chunks_exact_mut(QK_K).zip(raw.chunks_exact(84)) {
                let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
                let (w, sc, mn) = crate::kernels::rows::q2k_values(b);
                for (e, y) in o.iter_mut().enumerate() {
                    let (dl, ml) = (d * sc[e / 16] as f32, dmin * mn[e / 16] as f32);
                    *y = dl * w[e] as f32 - ml;
                }
            }
        }
        Q3_K => {
            // ggml's `dequantize_row_q3_K`: `d · (scale − 32)` per 16
            // values, times the value (2 low bits, less 4 without the
            // high bit).
            for (o, b) in out.chunks_exact_mut(QK_K).zip(raw.chunks_exact(110)) {
                let d = f16_at(b, 108);
                let sc = crate::kernels::rows::q3k_scales(b);
                let (hm, qs) = (&b[0..32], &b[32..96]);
                for h in 0..2 {
                    for g in 0..4 {
                        for l in 0..32 {
                            let e = 128 * h + 32 * g + l;
                            let low = ((qs[32 * h + l] >> (2 * g)) & 3) as i8;
                            let v = low - if (hm[l] >> (4 * h + g)) & 1 == 0 { 4 } else { 0 };
                            o[e] = d * sc[e / 16] as f32 * v as f32;
                        }
                    }
                }
            }
        }
        Q6_K => {
            for (o, b) in out.chunks_exact_mut(QK_K).zip(raw.chunks_exact(210)) {
                let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = f16_at(b, 208);
                for h in 0..2 {
                    let (ql, qh, sc) = (&ql[64 * h..], &qh[32 * h..], &sc[8 * h..]);
                    let y = &mut o[128 * h..];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
        _ => {}
    }
}

/// [`quantize_block_q8`] and [`quantize_block_q8k`] over whole columns,
/// compiled for AVX2 where the CPU has it (the rounding and the loops
/// vectorise; the numbers are the same).
pub(crate) fn quantize_column_q8(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::isa().avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (`isa`).
        unsafe { column_q8_avx2(x, q, d, s) };
        return;
    }
    column_q8(x, q, d, s);
}

#[inline(always)]
fn column_q8(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (b, blk) in x.chunks_exact(QK).enumerate() {
        let (qb, db, sb) = quantize_block_q8(blk);
        q[b * QK..(b + 1) * QK].copy_from_slice(&qb);
        d[b] = db;
        s[b] = sb;
    }
}

/// [`column_q8`] in AVX2 registers, as ggml's AVX2 `quantize_row_q8_1`
/// forms it: the block's largest magnitude, `round(v · 127/amax)` to
/// nearest even, packed to bytes with saturation, the exact integer sum.
/// The same numbers as [`quantize_block_q8`] for every finite input.
///
/// # Safety
/// The CPU must support avx2, fma and f16c.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn column_q8_avx2(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    use std::arch::x86_64::*;
    let nb = x.len() / QK;
    assert!(q.len() >= nb * QK && d.len() >= nb && s.len() >= nb);
    // SAFETY: block b reads x[32b..32b + 32] and writes q[32b..32b + 32],
    // d[b], s[b], all within the slices (asserted above).
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for b in 0..nb {
            let p = x.as_ptr().add(b * QK);
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            let m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
            let m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
            let m = _mm256_max_ps(m01, m23);
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            let dd = amax / 127.0;
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let r: [__m256i; 4] = std::array::from_fn(|i| {
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(v[i], id)))
            });
            let sum = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256::<1>(sum));
            let s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let isum = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32::<1>(s4)));
            let packed =
                _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
            let bytes = _mm256_permutevar8x32_epi32(packed, order);
            _mm256_storeu_si256(q.as_mut_ptr().add(b * QK) as *mut __m256i, bytes);
            d[b] = f16::from_f32(dd).to_f32();
            s[b] = f16::from_f32(dd * isum as f32).to_f32();
        }
    }
}

/// See [`quantize_column_q8`], for Q8_K super-blocks.
pub(crate) fn quantize_column_q8k(x: &[f32], q: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::isa().avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (`isa`).
        unsafe { column_q8k_avx2(x, q, d, bs) };
        return;
    }
    column_q8k(x, q, d, bs);
}

#[inline(always)]
fn column_q8k(x: &[f32], q: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    for (b, db) in d.iter_mut().enumerate() {
        *db = quantize_block_q8k(
            &x[b * QK_K..(b + 1) * QK_K],
            &mut q[b * QK_K..(b + 1) * QK_K],
            &mut bs[b * 16..(b + 1) * 16],
        );
    }
}

/// # Safety
/// The CPU must support avx2, fma and f16c.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn column_q8k_avx2(x: &[f32], q: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    column_q8k(x, q, d, bs);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_quantization_rounds_half_to_even_and_keeps_sums() {
        let mut x = vec![0f32; 32];
        x[0] = 127.0;
        x[1] = 0.5; // exactly half: rounds to 0
        x[2] = 1.5; // rounds to 2
        x[3] = -2.5; // rounds to -2
        let mut r = Q8Row::default();
        quantize_q8(&x, &mut r);
        assert_eq!(&r.q[..4], &[127, 0, 2, -2]);
        assert_eq!(r.d[0], 1.0);
        assert_eq!(r.s[0], 127.0);
    }

    /// The AVX2 column quantizer and the portable one, bit for bit, on
    /// random columns with exact ties, zero blocks, one-value blocks and
    /// extreme magnitudes.
    #[test]
    fn q8_column_paths_agree() {
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::isa().avx2() {
            let mut r = 0x2545_f491_4f6c_dd1du64;
            let mut next = move || {
                r ^= r << 13;
                r ^= r >> 7;
                r ^= r << 17;
                r
            };
            for case in 0..200 {
                let nb = 1 + case % 7;
                let spread = [1e-30f32, 1e-3, 1.0, 300.0, 1e30][case % 5];
                let mut x: Vec<f32> = (0..nb * QK)
                    .map(|_| ((next() % 20001) as f32 - 10000.0) / 10000.0 * spread)
                    .collect();
                match case % 4 {
                    // Exact halves after scaling: the block's max is 127.
                    0 => {
                        x[0] = 127.0;
                        for (i, v) in x[1..QK].iter_mut().enumerate() {
                            *v = i as f32 - 15.5;
                        }
                    }
                    1 => x[..QK].fill(0.0),
                    2 => {
                        x[..QK].fill(0.0);
                        x[7] = -spread;
                    }
                    _ => {}
                }
                let mut a = (vec![0i8; nb * QK], vec![0f32; nb], vec![0f32; nb]);
                let mut b = a.clone();
                column_q8(&x, &mut a.0, &mut a.1, &mut a.2);
                // SAFETY: the CPU has AVX2, FMA and F16C (`isa`).
                unsafe { column_q8_avx2(&x, &mut b.0, &mut b.1, &mut b.2) };
                assert_eq!(a.0, b.0, "case {case}");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a.1), bits(&b.1), "case {case}");
                assert_eq!(bits(&a.2), bits(&b.2), "case {case}");
            }
        }
    }

    #[test]
    fn q8k_takes_the_sign_of_the_largest_value() {
        let mut x = vec![0.25f32; 256];
        x[3] = -2.0;
        x[9] = 2.0; // same magnitude, later: the first one sets the sign
        let (mut q, mut bs) = (vec![0i8; 256], vec![0i16; 16]);
        let d = quantize_block_q8k(&x, &mut q, &mut bs);
        // max = -2 (the first), iscale = -127 / -2 = 63.5, d = 1 / 63.5.
        assert_eq!(d, 2.0 / 127.0);
        assert_eq!((q[3], q[9], q[0]), (-127, 127, 16));
        assert_eq!(bs[0], 16 * 14);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-3.5), -4);
    }
}
