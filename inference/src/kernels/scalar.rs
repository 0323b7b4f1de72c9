//! Portable kernels over the packed layouts, in the canonical order (see the
//! module above). They define the numbers; the SIMD kernels reproduce them.

use super::{h2f, hsum8, u16_at, Acts, OutRows, Packed, PackedKind, Q4_REC, Q8_REC, ROW_TILE};
use std::ops::Range;

/// [`matmul_tiles`] compiled for AVX2, FMA and F16C: the same numbers,
/// its `mul_add`s single instructions instead of library calls.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; as [`matmul_tiles`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matmul_tiles_fma(
    w: &Packed,
    acts: &Acts,
    tiles: Range<usize>,
    out: &OutRows<'_>,
) {
    // SAFETY: the caller's contract is `matmul_tiles`'s.
    unsafe { matmul_tiles(w, acts, tiles, out) }
}

/// See `Packed::matmul_tiles`.
///
/// # Safety
/// No other thread reads or writes the rows of `tiles` in `out` during the
/// call (threads sharing `out` own disjoint tiles).
#[inline(always)]
pub(super) unsafe fn matmul_tiles(w: &Packed, acts: &Acts, tiles: Range<usize>, out: &OutRows<'_>) {
    let nb = acts.blocks();
    for r in tiles.start * ROW_TILE..tiles.end * ROW_TILE {
        if r >= w.rows {
            break;
        }
        let (t, wi) = (r / ROW_TILE, r % ROW_TILE);
        for c in 0..acts.n {
            let v = match &w.kind {
                PackedKind::Q4_1 { data } => {
                    let mut lanes = [0f32; 8];
                    let mut summs = 0f32;
                    for b in 0..nb {
                        let rec = &data[(t * nb + b) * Q4_REC..][..Q4_REC];
                        let nib = &rec[wi * 16..wi * 16 + 16];
                        let a = &acts.q[(c * nb + b) * 32..][..32];
                        let dd = h2f(u16_at(rec, 64 + 2 * wi)) * acts.d[c * nb + b];
                        summs = h2f(u16_at(rec, 72 + 2 * wi)).mul_add(acts.s[c * nb + b], summs);
                        for (j, lane) in lanes.iter_mut().enumerate() {
                            let mut s = 0i32;
                            for k in 4 * j..4 * j + 4 {
                                let q = if k < 16 { nib[k] & 15 } else { nib[k - 16] >> 4 };
                                s += q as i32 * a[k] as i32;
                            }
                            *lane = dd.mul_add(s as f32, *lane);
                        }
                    }
                    hsum8(&lanes) + summs
                }
                PackedKind::Q8_0 { data } => {
                    let mut lanes = [0f32; 8];
                    for b in 0..nb {
                        let rec = &data[(t * nb + b) * Q8_REC..][..Q8_REC];
                        let wq = &rec[wi * 32..wi * 32 + 32];
                        let a = &acts.q[(c * nb + b) * 32..][..32];
                        let dd = h2f(u16_at(rec, 128 + 2 * wi)) * acts.d[c * nb + b];
                        for (j, lane) in lanes.iter_mut().enumerate() {
                            let mut s = 0i32;
                            for k in 4 * j..4 * j + 4 {
                                s += (wq[k] as i32 - 128) * a[k] as i32;
                            }
                            *lane = dd.mul_add(s as f32, *lane);
                        }
                    }
                    hsum8(&lanes)
                }
                PackedKind::F32 { w: wf } => {
                    let k = acts.k;
                    dot_f32(&wf[r * k..(r + 1) * k], &acts.x[c * k..(c + 1) * k])
                }
                PackedKind::Rows(_) => unreachable!("row-major matrices run in rows.rs"),
            };
            // SAFETY: `r` is a row of `tiles`, which this call owns.
            unsafe { out.set(c, r, v) };
        }
    }
}

/// f32 dot product in a fixed order (16 partial sums, then pairwise).
#[inline(always)]
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = a.len() / 16;
    for i in 0..chunks {
        for j in 0..16 {
            acc[j] = a[i * 16 + j].mul_add(b[i * 16 + j], acc[j]);
        }
    }
    let mut tail = 0f32;
    for i in chunks * 16..a.len() {
        tail = a[i].mul_add(b[i], tail);
    }
    sum16(acc) + tail
}

/// Sixteen lanes summed as a tree — lane i with i + 8, then i + 4, i + 2,
/// i + 1 — as `_mm512_reduce_add_ps` sums them (`dot_f32`'s lanes, ggml's
/// LayerNorm squares).
pub(crate) fn sum16(mut acc: [f32; 16]) -> f32 {
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    acc[0]
}
