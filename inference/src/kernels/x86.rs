//! AVX-512 VNNI kernels over the packed layouts. Two rows share a 512-bit
//! register per block; `vpdpbusd` forms the eight four-product lanes of each
//! row exactly as llama.cpp's `mul_sum_us8_pairs_float` does, and every lane
//! is accumulated with its own fused multiply-add in block order, so results
//! are bit-identical to `scalar.rs`.

// Register arrays are indexed in lock step (acc[i][j] with wz[i]); plain
// index loops read clearest here.
#![allow(clippy::needless_range_loop)]

use super::{hsum8, scalar, Acts, OutRows, Packed, PackedKind, Q4_REC, Q8_REC, ROW_TILE};
use std::arch::x86_64::*;
use std::ops::Range;

/// Whether this CPU runs these kernels.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Columns processed together: each weight block is loaded once per group.
const COLS: usize = 6;

/// Most columns the streaming kernels (`q4_1_rows`, `q8_0_rows` over two
/// tiles) take:
/// a decode step, drafts being verified, a few sequences decoded together.
/// They read each pair of tiles from memory once, with prefetch, for the
/// first chunk of columns, the later chunks from L1; the tile kernels,
/// without prefetch, made two columns cost 2.8 times one (the default
/// model's `agentd bench --parallel 2`, 224 vs 309 tok/s in aggregate).
const STREAM_COLS: usize = 8;

/// Most columns one call of a streaming kernel holds in registers.
const STREAM_CHUNK: usize = 4;

/// See `Packed::matmul_tiles`.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512vnni and fma
/// (`available()`), and no other thread reads or writes the rows of `tiles`
/// in `out` during the call.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(super) unsafe fn matmul_tiles(w: &Packed, acts: &Acts, tiles: Range<usize>, out: &OutRows<'_>) {
    match &w.kind {
        PackedKind::Q4_1 { data } if acts.n <= STREAM_COLS => {
            // Decode and a few columns (verified drafts, a few sequences):
            // eight rows (two tiles, two streams) per step, the weights
            // streamed once for all columns.
            let mut t = tiles.start;
            while t < tiles.end {
                // SAFETY: features checked by the caller; bounds asserted inside.
                unsafe {
                    if t + 1 < tiles.end {
                        let mut c = 0;
                        while c < acts.n {
                            let n = (acts.n - c).min(STREAM_CHUNK);
                            match n {
                                4 => q4_1_rows::<2, 4, true>(data, acts, t, c, out),
                                3 => q4_1_rows::<2, 3, true>(data, acts, t, c, out),
                                2 => q4_1_rows::<2, 2, true>(data, acts, t, c, out),
                                _ => q4_1_rows::<2, 1, true>(data, acts, t, c, out),
                            }
                            c += n;
                        }
                        t += 2;
                    } else {
                        for c in 0..acts.n {
                            q4_1_rows::<1, 1, false>(data, acts, t, c, out);
                        }
                        t += 1;
                    }
                }
            }
        }
        PackedKind::Q8_0 { data } if acts.n <= STREAM_COLS => {
            let mut t = tiles.start;
            while t < tiles.end {
                // SAFETY: as above.
                unsafe {
                    if t + 1 < tiles.end {
                        let mut c = 0;
                        while c < acts.n {
                            let n = (acts.n - c).min(STREAM_CHUNK);
                            match n {
                                4 => q8_0_rows::<2, 4, true>(data, acts, t, c, out),
                                3 => q8_0_rows::<2, 3, true>(data, acts, t, c, out),
                                2 => q8_0_rows::<2, 2, true>(data, acts, t, c, out),
                                _ => q8_0_rows::<2, 1, true>(data, acts, t, c, out),
                            }
                            c += n;
                        }
                        t += 2;
                    } else {
                        for c in 0..acts.n {
                            q8_0_rows::<1, 1, false>(data, acts, t, c, out);
                        }
                        t += 1;
                    }
                }
            }
        }
        PackedKind::Q4_1 { data } => {
            for t in tiles {
                let mut c = 0;
                while c < acts.n {
                    let n = (acts.n - c).min(COLS);
                    // SAFETY: features checked by the caller; indices derive
                    // from the packed sizes (asserted inside).
                    unsafe {
                        match n {
                            6 => q4_1_rows::<1, 6, false>(data, acts, t, c, out),
                            5 => q4_1_rows::<1, 5, false>(data, acts, t, c, out),
                            4 => q4_1_rows::<1, 4, false>(data, acts, t, c, out),
                            3 => q4_1_rows::<1, 3, false>(data, acts, t, c, out),
                            2 => q4_1_rows::<1, 2, false>(data, acts, t, c, out),
                            _ => q4_1_rows::<1, 1, false>(data, acts, t, c, out),
                        }
                    }
                    c += n;
                }
            }
        }
        PackedKind::Q8_0 { data } if acts.n >= super::WIDE_MIN => {
            // SAFETY: features checked by the caller; bounds asserted inside.
            unsafe { q8_0_wide(data, acts, tiles, out) }
        }
        PackedKind::Q8_0 { data } => {
            for t in tiles {
                let mut c = 0;
                while c < acts.n {
                    let n = (acts.n - c).min(COLS);
                    // SAFETY: as above.
                    unsafe {
                        match n {
                            6 => q8_0_rows::<1, 6, false>(data, acts, t, c, out),
                            5 => q8_0_rows::<1, 5, false>(data, acts, t, c, out),
                            4 => q8_0_rows::<1, 4, false>(data, acts, t, c, out),
                            3 => q8_0_rows::<1, 3, false>(data, acts, t, c, out),
                            2 => q8_0_rows::<1, 2, false>(data, acts, t, c, out),
                            _ => q8_0_rows::<1, 1, false>(data, acts, t, c, out),
                        }
                    }
                    c += n;
                }
            }
        }
        PackedKind::Rows(_) => unreachable!("row-major matrices run in rows.rs / avx2.rs"),
        PackedKind::F32 { w: wf } => {
            let k = acts.k;
            for r in tiles.start * ROW_TILE..(tiles.end * ROW_TILE).min(w.rows) {
                for c in 0..acts.n {
                    let v = dot_f32(&wf[r * k..(r + 1) * k], &acts.x[c * k..(c + 1) * k]);
                    // SAFETY: `r` is a row of `tiles`, which this call owns.
                    unsafe { out.set(c, r, v) };
                }
            }
        }
    }
}

#[target_feature(enable = "avx512f,fma")]
pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    scalar::dot_f32(a, b)
}

/// Lane pattern of a Q4_1 pair register: lanes 0-3 and 8-11 belong to the
/// first row, 4-7 and 12-15 to the second.
pub(super) const Q4_PATTERN: [i32; 16] = [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1];
/// Lane pattern of a Q8_0 pair register: lanes 0-7 first row, 8-15 second.
const Q8_PATTERN: [i32; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];

/// How far ahead of the record being read the decode kernels ask for
/// memory. A single core's bandwidth is bounded by how many misses it has
/// in flight; the hardware streamer stops at page boundaries.
/// Measured on the default model at one thread (tg128): none 66 tok/s,
/// 1 KiB 78, 4 KiB 96; farther gains nothing.
const PF_DIST: usize = 4096;

/// Hints the cache to fetch the line at `p` (never faults, any address).
#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: prefetch is a hint and never faults.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
}

/// Loads two f16 scales (a row pair's, for one block) as f32 into lanes 0, 1.
///
/// # Safety
/// The CPU has the AVX-512 features `matmul_tiles` enables (it is called from there);
/// `p` points to two readable `u16`s.
#[inline(always)]
unsafe fn load2(p: *const u16) -> __m512 {
    // SAFETY: caller guarantees two readable u16 at p.
    unsafe {
        let bits = _mm_cvtsi32_si128((p as *const i32).read_unaligned());
        _mm512_castps128_ps512(_mm_cvtph_ps(bits))
    }
}

/// Writes the rows of one accumulator pair register (two rows) in
/// llama.cpp's lane order plus their `Σ m·s`; rows at or past `end` are
/// not written.
///
/// # Safety
/// The CPU has the AVX-512 features `matmul_tiles` enables (it is called from there);
/// rows `row` and `row + 1` of `out` below `end` are the caller's (`OutRows::set`).
#[inline(always)]
pub(super) unsafe fn store_q4_pair(
    acc: __m512,
    sm0: f32,
    sm1: f32,
    c: usize,
    row: usize,
    end: usize,
    out: &OutRows<'_>,
) {
    let mut z = [0f32; 16];
    // SAFETY: `z` holds 16 floats.
    unsafe { _mm512_storeu_ps(z.as_mut_ptr(), acc) };
    let r0 = [z[0], z[1], z[2], z[3], z[8], z[9], z[10], z[11]];
    let r1 = [z[4], z[5], z[6], z[7], z[12], z[13], z[14], z[15]];
    // SAFETY: the rows below `end` belong to the caller (its contract).
    unsafe {
        if row < end {
            out.set(c, row, hsum8(&r0) + sm0);
        }
        if row + 1 < end {
            out.set(c, row + 1, hsum8(&r1) + sm1);
        }
    }
}

/// Writes the rows of one Q8_0 pair register (lanes 0-7 the first row,
/// 8-15 the second), each the sum of its eight lanes in llama.cpp's order.
///
/// # Safety
/// The CPU has the AVX-512 features `matmul_tiles` enables (it is called from there);
/// rows `row` and `row + 1` of `out` are the caller's (`OutRows::set`).
#[inline(always)]
unsafe fn store_q8_pair(acc: __m512, c: usize, row: usize, out: &OutRows<'_>) {
    let mut z = [0f32; 16];
    // SAFETY: `z` holds 16 floats.
    unsafe { _mm512_storeu_ps(z.as_mut_ptr(), acc) };
    let r0: [f32; 8] = std::array::from_fn(|k| z[k]);
    let r1: [f32; 8] = std::array::from_fn(|k| z[8 + k]);
    // SAFETY: the two rows belong to the caller's tiles (its contract).
    unsafe {
        out.set(c, row, hsum8(&r0));
        out.set(c, row + 1, hsum8(&r1));
    }
}

/// Pair register `i` (0 or 1: rows 0-1 or 2-3) of a Q4_1 tile record at
/// `rec`: its 64 values as bytes (lanes as [`Q4_PATTERN`]) and each lane's
/// row scale.
///
/// # Safety
/// The CPU has the AVX-512 features `matmul_tiles` enables; `rec` is a
/// whole record (`Q4_REC` readable bytes).
#[inline(always)]
unsafe fn q4_1_pair(rec: *const u8, i: usize, pat: __m512i) -> (__m512i, __m512) {
    // SAFETY: loads within the record (the caller's); register work.
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let raw = _mm256_loadu_si256(rec.add(i * 32) as *const __m256i);
        let lo = _mm256_and_si256(raw, low);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low);
        (
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi),
            _mm512_permutexvar_ps(pat, load2(rec.add(64 + i * 4) as *const u16)),
        )
    }
}

/// Pair register `i` of a Q8_0 tile record at `rec`: its values and each
/// lane's row scale (lanes as [`Q8_PATTERN`]).
///
/// # Safety
/// As [`q4_1_pair`], with a `Q8_REC`-byte record.
#[inline(always)]
unsafe fn q8_0_pair(rec: *const u8, i: usize, pat: __m512i) -> (__m512i, __m512) {
    // SAFETY: loads within the record (the caller's).
    unsafe {
        (
            _mm512_loadu_si512(rec.add(i * 64) as *const _),
            _mm512_permutexvar_ps(pat, load2(rec.add(128 + i * 4) as *const u16)),
        )
    }
}

/// Columns `c0..c0 + N` against the `4·T` rows of tiles `t..t + T` (`T` is
/// 1 or 2: one or two record streams, prefetched ahead when `PF`), `Σ fma(m,
/// s)` folded into the same pass. Per lane the arithmetic is the same
/// whatever `T` and `N`, so a column has the numbers it has alone (a
/// verified draft's row is its decode step's).
///
/// # Safety
/// The CPU has the AVX-512 features `matmul_tiles` enables (it is called from there);
/// the rows of tiles `t..t + T` of `out` are the caller's (`OutRows::set`);
/// `data` and `acts` hold them (bounds are asserted).
#[inline(always)]
unsafe fn q4_1_rows<const T: usize, const N: usize, const PF: bool>(
    data: &[u8],
    acts: &Acts,
    t: usize,
    c0: usize,
    out: &OutRows<'_>,
) {
    let nb = acts.blocks();
    assert!((1..=2).contains(&T) && ((t + T - 1) * nb + nb) * Q4_REC <= data.len());
    assert!(
        (c0 + N) * nb * 64 <= acts.nib.len()
            && (c0 + N) * nb <= acts.d.len()
            && (c0 + N) * nb <= acts.s.len()
    );
    // SAFETY: all loads below are within the slices (asserted above).
    unsafe {
        let pat = _mm512_loadu_si512(Q4_PATTERN.as_ptr() as *const _);
        let zero = _mm512_setzero_si512();
        let mut acc = [[_mm512_setzero_ps(); N]; 4];
        let mut summs = [_mm256_setzero_ps(); N];
        for b in 0..nb {
            // With one tile both streams are the same record.
            let recs = [
                data.as_ptr().add((t * nb + b) * Q4_REC),
                data.as_ptr().add(((t + T - 1) * nb + b) * Q4_REC),
            ];
            if PF {
                // A record is 80 bytes: two hints so that no line is skipped.
                for r in &recs[..T] {
                    prefetch(r.wrapping_add(PF_DIST));
                    prefetch(r.wrapping_add(PF_DIST + 64));
                }
            }
            let mut wz = [zero; 4];
            let mut dw = [_mm512_setzero_ps(); 4];
            for i in 0..2 * T {
                (wz[i], dw[i]) = q4_1_pair(recs[i / 2], i % 2, pat);
            }
            // The tiles' four row minimums each (lanes 4-7 zero for one).
            let m = _mm256_cvtph_ps(_mm_unpacklo_epi64(
                _mm_loadl_epi64(recs[0].add(72) as *const __m128i),
                if T == 2 {
                    _mm_loadl_epi64(recs[1].add(72) as *const __m128i)
                } else {
                    _mm_setzero_si128()
                },
            ));
            for j in 0..N {
                let c = c0 + j;
                let az = _mm512_loadu_si512(acts.nib.as_ptr().add((c * nb + b) * 64) as *const _);
                let da = _mm512_set1_ps(*acts.d.get_unchecked(c * nb + b));
                for i in 0..2 * T {
                    let lanes = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, wz[i], az));
                    acc[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw[i], da), lanes, acc[i][j]);
                }
                summs[j] =
                    _mm256_fmadd_ps(m, _mm256_set1_ps(*acts.s.get_unchecked(c * nb + b)), summs[j]);
            }
        }
        for j in 0..N {
            let mut sm = [0f32; 8];
            _mm256_storeu_ps(sm.as_mut_ptr(), summs[j]);
            for i in 0..2 * T {
                let row = t * ROW_TILE + 2 * i;
                store_q4_pair(acc[i][j], sm[2 * i], sm[2 * i + 1], c0 + j, row, usize::MAX, out);
            }
        }
    }
}

/// Columns `c0..c0 + N` against the `4·T` rows of tiles `t..t + T`; as
/// [`q4_1_rows`] for Q8_0 records.
///
/// # Safety
/// As [`q4_1_rows`].
#[inline(always)]
unsafe fn q8_0_rows<const T: usize, const N: usize, const PF: bool>(
    data: &[u8],
    acts: &Acts,
    t: usize,
    c0: usize,
    out: &OutRows<'_>,
) {
    let nb = acts.blocks();
    assert!((1..=2).contains(&T) && ((t + T - 1) * nb + nb) * Q8_REC <= data.len());
    assert!(
        (c0 + N) * nb * 64 <= acts.dup.len()
            && (c0 + N) * nb * 16 <= acts.corr.len()
            && (c0 + N) * nb <= acts.d.len()
    );
    // SAFETY: all loads below are within the slices (asserted above).
    unsafe {
        let pat = _mm512_loadu_si512(Q8_PATTERN.as_ptr() as *const _);
        let zero = _mm512_setzero_si512();
        let mut acc = [[_mm512_setzero_ps(); N]; 4];
        for b in 0..nb {
            let recs = [
                data.as_ptr().add((t * nb + b) * Q8_REC),
                data.as_ptr().add(((t + T - 1) * nb + b) * Q8_REC),
            ];
            if PF {
                for r in &recs[..T] {
                    prefetch(r.wrapping_add(PF_DIST));
                    prefetch(r.wrapping_add(PF_DIST + 64));
                }
            }
            let mut wz = [zero; 4];
            let mut dw = [_mm512_setzero_ps(); 4];
            for i in 0..2 * T {
                (wz[i], dw[i]) = q8_0_pair(recs[i / 2], i % 2, pat);
            }
            for j in 0..N {
                let c = c0 + j;
                let az = _mm512_loadu_si512(acts.dup.as_ptr().add((c * nb + b) * 64) as *const _);
                let corr =
                    _mm512_loadu_si512(acts.corr.as_ptr().add((c * nb + b) * 16) as *const _);
                let da = _mm512_set1_ps(*acts.d.get_unchecked(c * nb + b));
                for i in 0..2 * T {
                    let isum = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, wz[i], az), corr);
                    acc[i][j] = _mm512_fmadd_ps(
                        _mm512_mul_ps(dw[i], da),
                        _mm512_cvtepi32_ps(isum),
                        acc[i][j],
                    );
                }
            }
        }
        for j in 0..N {
            for i in 0..2 * T {
                store_q8_pair(acc[i][j], c0 + j, t * ROW_TILE + 2 * i, out);
            }
        }
    }
}

thread_local! {
    /// Each thread's scales of a block of Q8_0 tiles, in the lane pattern.
    static Q8_DW: std::cell::RefCell<Vec<__m512>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Tiles of Q8_0 rows met together by a group of columns on a prompt.
const WIDE_TILES: usize = 4;
/// Columns met together by the tiles of a wide Q8_0 product.
const WIDE_COLS: usize = 3;

/// A Q8_0 product of many columns: four tiles (sixteen rows, eight
/// registers) at a time against three columns, so each column's
/// activations are loaded once for sixteen rows, not four; the tiles'
/// scales are put in the lane pattern once for every column. Per register
/// the arithmetic is `q8_0_rows`'s, so the results are identical.
///
/// # Safety
/// As [`matmul_tiles`] (the CPU has its features; the tiles' rows of `out`
/// are the caller's).
#[inline(always)]
unsafe fn q8_0_wide(data: &[u8], acts: &Acts, tiles: Range<usize>, out: &OutRows<'_>) {
    // SAFETY: the caller's contract; the scratch is this thread's.
    Q8_DW.with_borrow_mut(|dw| unsafe { q8_0_wide_in(dw, data, acts, tiles, out) });
}

/// The body of [`q8_0_wide`], out of the thread-local's closure (which
/// would not inherit the target features).
///
/// # Safety
/// As [`q8_0_wide`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn q8_0_wide_in(
    dws: &mut Vec<__m512>,
    data: &[u8],
    acts: &Acts,
    tiles: Range<usize>,
    out: &OutRows<'_>,
) {
    let (nb, n) = (acts.blocks(), acts.n);
    assert!(tiles.end * nb * Q8_REC <= data.len());
    assert!(
        n * nb * 64 <= acts.dup.len() && n * nb * 16 <= acts.corr.len() && n * nb <= acts.d.len()
    );
    dws.resize(nb * 2 * WIDE_TILES, _mm512_setzero_ps());
    // SAFETY: records of the tiles (asserted), the columns' activations
    // (asserted), `dws` sized above.
    unsafe {
        let pat = _mm512_loadu_si512(Q8_PATTERN.as_ptr() as *const _);
        for t0 in tiles.clone().step_by(WIDE_TILES) {
            let nt = (tiles.end - t0).min(WIDE_TILES);
            for b in 0..nb {
                for t in 0..nt {
                    let rec = data.as_ptr().add(((t0 + t) * nb + b) * Q8_REC);
                    for i in 0..2 {
                        dws[(b * WIDE_TILES + t) * 2 + i] =
                            _mm512_permutexvar_ps(pat, load2(rec.add(128 + i * 4) as *const u16));
                    }
                }
            }
            let mut c = 0;
            while c < n {
                let m = (n - c).min(WIDE_COLS);
                match m {
                    3 => q8_0_wide_cols::<3>(data, acts, dws, t0, nt, c, out),
                    2 => q8_0_wide_cols::<2>(data, acts, dws, t0, nt, c, out),
                    _ => q8_0_wide_cols::<1>(data, acts, dws, t0, nt, c, out),
                }
                c += m;
            }
        }
    }
}

/// Tiles `t0 .. t0 + nt` (nt ≤ WIDE_TILES) against columns `c .. c + N`.
///
/// # Safety
/// The CPU has the features of [`q8_0_wide_in`]; the tiles, the columns
/// and `dws` (the tiles' scales) exist (asserted by the caller).
#[inline(always)]
unsafe fn q8_0_wide_cols<const N: usize>(
    data: &[u8],
    acts: &Acts,
    dws: &[__m512],
    t0: usize,
    nt: usize,
    c: usize,
    out: &OutRows<'_>,
) {
    let nb = acts.blocks();
    // SAFETY: within the records, the columns and `dws` (the caller's
    // contract); rows of the caller's tiles.
    unsafe {
        let zero = _mm512_setzero_si512();
        let mut acc = [[_mm512_setzero_ps(); N]; 2 * WIDE_TILES];
        for b in 0..nb {
            let az: [__m512i; N] = std::array::from_fn(|j| {
                _mm512_loadu_si512(acts.dup.as_ptr().add(((c + j) * nb + b) * 64) as *const _)
            });
            let corr: [__m512i; N] = std::array::from_fn(|j| {
                _mm512_loadu_si512(acts.corr.as_ptr().add(((c + j) * nb + b) * 16) as *const _)
            });
            let da: [__m512; N] =
                std::array::from_fn(|j| _mm512_set1_ps(*acts.d.get_unchecked((c + j) * nb + b)));
            for t in 0..WIDE_TILES {
                if t >= nt {
                    break;
                }
                let rec = data.as_ptr().add(((t0 + t) * nb + b) * Q8_REC);
                for i in 0..2 {
                    let wz = _mm512_loadu_si512(rec.add(i * 64) as *const _);
                    let dw = *dws.get_unchecked((b * WIDE_TILES + t) * 2 + i);
                    for j in 0..N {
                        let isum = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, wz, az[j]), corr[j]);
                        let r = 2 * t + i;
                        acc[r][j] = _mm512_fmadd_ps(
                            _mm512_mul_ps(dw, da[j]),
                            _mm512_cvtepi32_ps(isum),
                            acc[r][j],
                        );
                    }
                }
            }
        }
        for j in 0..N {
            for r in 0..2 * nt {
                store_q8_pair(acc[r][j], c + j, t0 * ROW_TILE + 2 * r, out);
            }
        }
    }
}

/// See `attn::attend_heads`: llama.cpp's one-query flash attention
/// (`ggml_vec_dot_f16`, `ggml_vec_scale_f16`, `ggml_vec_mad_f16`) on 512-bit
/// registers for the `q.len() / hd` query heads of one KV head together:
/// each key and value row is loaded and converted once for all of them, and
/// their independent chains (score, running max, f16 accumulator held in
/// registers) interleave, each computing exactly what it computes alone.
///
/// # Safety
/// The CPU must support avx512f, fma and f16c; `hd` is a multiple of 16, at
/// most 256; `q.len()` is 1 to [`attn::GROUP`](super::attn::GROUP) times
/// `hd`; `out.len() == q.len()`, and the caches hold `upto` positions of
/// `lane` (all asserted by the caller).
///
/// With a soft-cap `cap` (gemma2), `scale` is the scale over the cap and
/// each score becomes `cap · tanh(score)`, the C library's `tanhf` as
/// llama.cpp calls it, before the block's maxima ([`soft_cap`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_heads(
    q: &[f32],
    hd: usize,
    kc: &[half::f16],
    vc: &[half::f16],
    lane: super::attn::Lane,
    from: usize,
    upto: usize,
    scale: f32,
    cap: Option<f32>,
    out: &mut [f32],
) {
    let heads = q.len() / hd;
    assert!(hd.is_multiple_of(16) && hd <= super::attn::MAX_HEAD);
    assert!(q.len() == heads * hd && out.len() == q.len());
    assert!((1..=super::attn::GROUP).contains(&heads));
    assert!(upto == 0 || (upto - 1) * lane.stride + lane.offset + hd <= kc.len().min(vc.len()));
    // The common head sizes and group sizes with their registers' count
    // fixed (so the loops unroll); others one head at a time through the
    // widest.
    // SAFETY: the bounds are asserted above; the features are the caller's.
    unsafe {
        macro_rules! run {
            ($c:literal, $h:literal) => {
                attend_heads_c::<$c, $h, true>(q, kc, vc, lane, from, upto, scale, cap, out)
            };
        }
        match (hd / 16, heads) {
            (4, 1) => run!(4, 1),
            (4, 2) => run!(4, 2),
            (4, 3) => run!(4, 3),
            (4, 4) => run!(4, 4),
            (6, 1) => run!(6, 1),
            (6, 2) => run!(6, 2),
            (6, 3) => run!(6, 3),
            (6, 4) => run!(6, 4),
            (8, 1) => run!(8, 1),
            (8, 2) => run!(8, 2),
            (8, 3) => run!(8, 3),
            (8, 4) => run!(8, 4),
            _ => {
                for (q, out) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
                    attend_heads_c::<16, 1, false>(q, kc, vc, lane, from, upto, scale, cap, out)
                }
            }
        }
    }
}

/// [`attn::soft_cap`](super::attn::soft_cap) on the first `n` scores of
/// every head of a block, when there is a cap: a loop of its own, after
/// the block's scores, so no vector register is live across the calls.
#[inline(always)]
fn soft_cap<const H: usize>(sc: &mut [[f32; BLOCK]; H], n: usize, cap: Option<f32>) {
    if let Some(cap) = cap {
        sc.iter_mut().for_each(|h| super::attn::soft_cap(&mut h[..n], cap));
    }
}

/// Keys per block of [`attend_heads_c`]: their scores and exponentials are
/// computed before their values are accumulated.
const BLOCK: usize = 32;

/// Keys ahead whose rows [`attend_heads_c`] asks the cache for.
const PREFETCH: usize = 32;

/// [`attend_heads`] for `H` heads of at most `16·C` values (`C` registers
/// each), of exactly that many when `EXACT` (the loops' bounds then
/// constants).
///
/// # Safety
/// As [`attend_heads`], whose assertions it relies on; `q.len() == H · hd`
/// with `hd <= 16·C` a multiple of 16.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn attend_heads_c<const C: usize, const H: usize, const EXACT: bool>(
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
    let hd = q.len() / H;
    let chunks = if EXACT { C } else { hd / 16 };
    assert!(chunks <= C && hd == 16 * chunks && q.len() == H * hd);
    // SAFETY: every pointer below stays within the slices asserted by
    // `attend_heads`.
    unsafe {
        let mut qv = [[_mm512_setzero_ps(); C]; H];
        for (h, qh) in qv.iter_mut().enumerate() {
            for (c, v) in qh.iter_mut().take(chunks).enumerate() {
                // The query rounded to f16 and back, as llama.cpp converts it.
                let x = _mm512_loadu_ps(q.as_ptr().add(h * hd + 16 * c));
                *v = _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
            }
        }
        let mut acc = [[_mm256_setzero_si256(); C]; H];
        let mut s_sum = [0f32; H];
        let mut m = [f32::NEG_INFINITY; H];
        // The 64-value steps of the scores, and the tail's products (a head
        // of 96 values: 64 and 32).
        let main = chunks / 4 * 4;
        let mut tp = [[[0f32; 48]; BLOCK]; H];
        // Keys in blocks: first every score of the block, then each head's
        // running max and its exponentials (ms when a key raises the max,
        // else vs), all of them in one loop of `expf` calls (a call keeps
        // no vector register, so none is saved around it), then the
        // accumulators key by key. Each head's operations and their order
        // are those of the one-key-at-a-time loop.
        let mut t0 = from;
        while t0 < upto {
            let n = BLOCK.min(upto - t0);
            let mut sc = [[0f32; BLOCK]; H];
            for k in 0..n {
                let at = (t0 + k) * lane.stride + lane.offset;
                // The rows are a stride apart: fetch keys ahead, and this
                // block's values for the pass below.
                let ahead = kc.as_ptr().wrapping_add(at + PREFETCH * lane.stride) as *const i8;
                let vrow = vc.as_ptr().wrapping_add(at) as *const i8;
                for line in (0..2 * hd).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line));
                    _mm_prefetch::<_MM_HINT_T0>(vrow.wrapping_add(line));
                }
                let kp = kc.as_ptr().add(at) as *const __m256i;
                let mut kv = [_mm512_setzero_ps(); C];
                for (c, x) in kv.iter_mut().take(chunks).enumerate() {
                    *x = _mm512_cvtph_ps(_mm256_loadu_si256(kp.add(c)));
                }
                for h in 0..H {
                    // Four 16-lane partial sums per 64 elements.
                    let mut sum = [_mm512_setzero_ps(); 4];
                    for i in (0..main).step_by(4) {
                        for (j, sj) in sum.iter_mut().enumerate() {
                            *sj = _mm512_fmadd_ps(kv[i + j], qv[h][i + j], *sj);
                        }
                    }
                    let x0 =
                        _mm512_add_ps(_mm512_add_ps(sum[0], sum[2]), _mm512_add_ps(sum[1], sum[3]));
                    if main == chunks {
                        sc[h][k] = reduce16(x0) * scale;
                        continue;
                    }
                    sc[h][k] = reduce16(x0);
                    // The tail's products (exact in f32), summed below.
                    for c in main..chunks {
                        let p = _mm512_mul_ps(kv[c], qv[h][c]);
                        _mm512_storeu_ps(tp[h][k].as_mut_ptr().add(16 * (c - main)), p);
                    }
                }
            }
            if main < chunks {
                // `ggml_vec_dot_f16`'s tail past the 64-value steps: each
                // product added in f64 in order; the keys' sums interleave.
                let tl = 16 * (chunks - main);
                for (sc, tp) in sc.iter_mut().zip(&tp) {
                    let mut s: [f64; BLOCK] = std::array::from_fn(|k| sc[k] as f64);
                    for i in 0..tl {
                        for k in 0..n {
                            s[k] += tp[k][i] as f64;
                        }
                    }
                    for k in 0..n {
                        sc[k] = s[k] as f32 * scale;
                    }
                }
            }
            soft_cap(&mut sc, n, cap);
            // `e[h][k]`: the exponential's argument, then its value; `up`:
            // whether key k raised head h's max (e is then ms, else vs).
            let (e, up) = softmax_block(&sc, n, &mut m);
            for k in 0..n {
                let vp = vc.as_ptr().add((t0 + k) * lane.stride + lane.offset) as *const __m256i;
                let mut vv = [_mm512_setzero_ps(); C];
                for (c, x) in vv.iter_mut().take(chunks).enumerate() {
                    *x = _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(c)));
                }
                for h in 0..H {
                    let (ms, vs) = if up[h][k] { (e[h][k], 1f32) } else { (1f32, e[h][k]) };
                    if up[h][k] {
                        let msv = _mm512_set1_ps(ms);
                        for a in acc[h].iter_mut().take(chunks) {
                            let x = _mm512_mul_ps(_mm512_cvtph_ps(*a), msv);
                            *a = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                        }
                    }
                    let vsv = _mm512_set1_ps(vs);
                    for (a, v) in acc[h].iter_mut().zip(&vv).take(chunks) {
                        let x = _mm512_fmadd_ps(*v, vsv, _mm512_cvtph_ps(*a));
                        *a = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                    }
                    s_sum[h] = s_sum[h].mul_add(ms, vs);
                }
            }
            t0 += n;
        }
        for h in 0..H {
            let inv = _mm512_set1_ps(if s_sum[h] == 0.0 { 0.0 } else { 1.0 / s_sum[h] });
            for (c, a) in acc[h].iter().take(chunks).enumerate() {
                let o = out.as_mut_ptr().add(h * hd + 16 * c);
                _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_cvtph_ps(*a), inv));
            }
        }
    }
}

/// [`attn::attend_quant`](super::attn::attend_quant) on AVX-512: the
/// query heads of one KV head over a Q8_0/Q4_0 cache, each key's and
/// value's blocks read and converted once for all of them. Scores are
/// `vpdpbusd` lanes of four exact products (llama.cpp's
/// `mul_sum_us8_pairs_float`), each lane a fused multiply-add of the two
/// scales' product, folded as `hsum_float_8`; values are converted to f32
/// (exact) and accumulated with fused multiply-adds in f32. Bit-identical
/// to `attend_quant_scalar`.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512vnni, fma and
/// f16c; `ty` is a block type; `hd` is a multiple of 32, at most
/// [`MAX_HEAD`](super::attn::MAX_HEAD); `q.len()` is 1 to
/// [`GROUP`](super::attn::GROUP) times `hd`; `out.len() == q.len()`; the
/// caches hold `upto` positions of `ty.bytes(hd)` bytes (all asserted by
/// the caller). A soft-cap as [`attend_heads`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_quant(
    q: &[f32],
    hd: usize,
    ty: crate::kv::KvType,
    kc: &[u8],
    vc: &[u8],
    from: usize,
    upto: usize,
    scale: f32,
    cap: Option<f32>,
    out: &mut [f32],
) {
    let heads = q.len() / hd;
    assert!(ty.is_quantized() && hd.is_multiple_of(32) && hd <= super::attn::MAX_HEAD);
    assert!(q.len() == heads * hd && out.len() == q.len());
    assert!((1..=super::attn::GROUP).contains(&heads));
    assert!(upto * ty.bytes(hd) <= kc.len().min(vc.len()));
    // SAFETY: the bounds are asserted above; the features are the caller's.
    unsafe {
        macro_rules! run {
            ($c:literal, $h:literal) => {
                attend_quant_c::<$c, $h>(q, hd, ty, kc, vc, from, upto, scale, cap, out)
            };
        }
        match (hd.div_ceil(64), heads) {
            (1, 1) => run!(4, 1),
            (1, 2) => run!(4, 2),
            (1, 3) => run!(4, 3),
            (1, 4) => run!(4, 4),
            (2, 1) => run!(8, 1),
            (2, 2) => run!(8, 2),
            (2, 3) => run!(8, 3),
            (2, 4) => run!(8, 4),
            _ => {
                for (q, out) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
                    attend_quant_c::<16, 1>(q, hd, ty, kc, vc, from, upto, scale, cap, out)
                }
            }
        }
    }
}

/// A block's 32 values of a Q8_0/Q4_0 row as signed bytes, and its scale.
///
/// # Safety
/// `p` points at a whole block of `ty`; the CPU has avx2 and f16c.
#[inline(always)]
pub(super) unsafe fn kv_block_bytes(ty: crate::kv::KvType, p: *const u8) -> (__m256i, f32) {
    // SAFETY: the block's bytes are readable (the caller's).
    unsafe {
        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            u16::from_le_bytes([*p, *p.add(1)]) as i32
        )));
        let v = match ty {
            crate::kv::KvType::Q4_0 => {
                let raw = _mm_loadu_si128(p.add(2) as *const __m128i);
                let mask = _mm_set1_epi8(0x0f);
                let lo = _mm_and_si128(raw, mask);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), mask);
                _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8))
            }
            _ => _mm256_loadu_si256(p.add(2) as *const __m256i),
        };
        (v, d)
    }
}

/// [`attend_quant`] for `H` heads of at most `16·C` values.
///
/// # Safety
/// As [`attend_quant`], whose assertions it relies on; `hd <= 16·C`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn attend_quant_c<const C: usize, const H: usize>(
    q: &[f32],
    hd: usize,
    ty: crate::kv::KvType,
    kc: &[u8],
    vc: &[u8],
    from: usize,
    upto: usize,
    scale: f32,
    cap: Option<f32>,
    out: &mut [f32],
) {
    const QK: usize = crate::kv::QK;
    let (nb, row, bb) = (hd / QK, ty.bytes(hd), ty.block_bytes());
    assert!(hd <= 16 * C && q.len() == H * hd);
    // SAFETY: every pointer below stays within the slices asserted by
    // `attend_quant` (`upto` rows of `row` bytes, `nb` blocks each).
    unsafe {
        // Each head's query as Q8_0 blocks: values and scale.
        let mut qb = [[_mm256_setzero_si256(); 8]; H];
        let mut qd = [[0f32; 8]; H];
        for h in 0..H {
            let (mut qq, mut d) = ([0i8; super::attn::MAX_HEAD], [0f32; 8]);
            super::attn::quantize_query(&q[h * hd..(h + 1) * hd], &mut qq[..hd], &mut d[..nb]);
            for b in 0..nb {
                qb[h][b] = _mm256_loadu_si256(qq.as_ptr().add(b * QK) as *const __m256i);
            }
            qd[h] = d;
        }
        let mut acc = [[_mm512_setzero_ps(); C]; H];
        let mut s_sum = [0f32; H];
        let mut m = [f32::NEG_INFINITY; H];
        // As `attend_heads_c`: a block of keys' scores, then the heads'
        // running maxima and exponentials in one pass, then the values.
        let mut t0 = from;
        while t0 < upto {
            let n = BLOCK.min(upto - t0);
            let mut sc = [[0f32; BLOCK]; H];
            for k in 0..n {
                let kp = kc.as_ptr().add((t0 + k) * row);
                _mm_prefetch::<_MM_HINT_T0>(kp.wrapping_add(PREFETCH * row) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(vc.as_ptr().add((t0 + k) * row) as *const i8);
                let mut lanes = [_mm256_setzero_ps(); H];
                for b in 0..nb {
                    let (kv, dk) = kv_block_bytes(ty, kp.add(b * bb));
                    let ax = _mm256_sign_epi8(kv, kv);
                    for h in 0..H {
                        let sy = _mm256_sign_epi8(qb[h][b], kv);
                        let dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
                        let d = _mm256_set1_ps(dk * qd[h][b]);
                        lanes[h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), lanes[h]);
                    }
                }
                for h in 0..H {
                    sc[h][k] = hsum256(lanes[h]) * scale;
                }
            }
            soft_cap(&mut sc, n, cap);
            let (e, up) = softmax_block(&sc, n, &mut m);
            for k in 0..n {
                let vp = vc.as_ptr().add((t0 + k) * row);
                let mut vv = [_mm512_setzero_ps(); C];
                for b in 0..nb {
                    let (x, d) = kv_block_bytes(ty, vp.add(b * bb));
                    let dv = _mm512_set1_ps(d);
                    let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(x)));
                    let hi =
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256::<1>(x)));
                    vv[2 * b] = _mm512_mul_ps(lo, dv);
                    vv[2 * b + 1] = _mm512_mul_ps(hi, dv);
                }
                for h in 0..H {
                    let (ms, vs) = if up[h][k] { (e[h][k], 1f32) } else { (1f32, e[h][k]) };
                    if up[h][k] {
                        let msv = _mm512_set1_ps(ms);
                        for a in acc[h].iter_mut().take(2 * nb) {
                            *a = _mm512_mul_ps(*a, msv);
                        }
                    }
                    let vsv = _mm512_set1_ps(vs);
                    for (a, v) in acc[h].iter_mut().zip(&vv).take(2 * nb) {
                        *a = _mm512_fmadd_ps(*v, vsv, *a);
                    }
                    s_sum[h] = s_sum[h].mul_add(ms, vs);
                }
            }
            t0 += n;
        }
        for h in 0..H {
            let inv = _mm512_set1_ps(if s_sum[h] == 0.0 { 0.0 } else { 1.0 / s_sum[h] });
            for (c, a) in acc[h].iter().take(2 * nb).enumerate() {
                let o = out.as_mut_ptr().add(h * hd + 16 * c);
                _mm512_storeu_ps(o, _mm512_mul_ps(*a, inv));
            }
        }
    }
}

/// ggml's `hsum_float_8`: the high half added to the low, then
/// `(0+2)+(1+3)`.
#[inline(always)]
unsafe fn hsum256(x: __m256) -> f32 {
    // SAFETY: register operations only; the features are the caller's.
    unsafe {
        let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
    }
}

/// The online softmax's steps over a block of `n` keys' scores `sc`, head
/// by head in key order: `up[h][k]` whether key k raised head h's running
/// max `m[h]` (then `e[h][k]` is `ms = expf(old − new)`, else `vs = expf(s
/// − max)`), the maxima updated, every exponential taken in one pass
/// ([`expf_lanes`]: a call keeps no vector register, so none is saved).
///
/// # Safety
/// The CPU has avx512f and fma.
#[inline(always)]
unsafe fn softmax_block<const H: usize>(
    sc: &[[f32; BLOCK]; H],
    n: usize,
    m: &mut [f32; H],
) -> ([[f32; BLOCK]; H], [[bool; BLOCK]; H]) {
    let mut e = [[0f32; BLOCK]; H];
    let mut up = [[false; BLOCK]; H];
    for h in 0..H {
        for k in 0..n {
            let s = sc[h][k];
            if s > m[h] {
                e[h][k] = m[h] - s;
                up[h][k] = true;
                m[h] = s;
            } else {
                e[h][k] = s - m[h];
            }
        }
    }
    // SAFETY: the features are the caller's.
    unsafe { expf_lanes(e.as_flattened_mut()) };
    (e, up)
}

/// [`attn::expf`](super::attn::expf) of every value of `x` in place, 8
/// lanes at a time in double precision (a length not a multiple of 8 ends
/// with the scalar one); lanes that function sends to the C library go
/// there one by one.
///
/// # Safety
/// The CPU has avx512f and fma.
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn expf_lanes(x: &mut [f32]) {
    use super::attn::{expf, EXPF_INV_LN2_N, EXPF_POLY, EXPF_SHIFT, EXPF_TAB};
    if cfg!(not(target_env = "gnu")) {
        // Another C library's `expf` is its own: call it.
        x.iter_mut().for_each(|v| *v = v.exp());
        return;
    }
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds 8 floats; the table index is masked to 0..32.
        unsafe {
            let xs = _mm256_loadu_ps(c.as_ptr());
            let bits = _mm256_castps_si256(xs);
            let top = _mm256_and_si256(_mm256_srli_epi32::<20>(bits), _mm256_set1_epi32(0x7ff));
            let special = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(
                top,
                _mm256_set1_epi32(0x42a),
            )));
            let xd = _mm512_cvtps_pd(xs);
            let inv = _mm512_set1_pd(EXPF_INV_LN2_N);
            let shift = _mm512_set1_pd(EXPF_SHIFT);
            let kd = _mm512_fmadd_pd(inv, xd, shift);
            let ki = _mm512_castpd_si512(kd);
            let kd = _mm512_sub_pd(kd, shift);
            let r = _mm512_fmsub_pd(inv, xd, kd);
            let idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
            let t = _mm512_i64gather_epi64::<8>(idx, EXPF_TAB.as_ptr() as *const i64);
            let sc = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
            let z = _mm512_fmadd_pd(_mm512_set1_pd(EXPF_POLY[0]), r, _mm512_set1_pd(EXPF_POLY[1]));
            let y = _mm512_fmadd_pd(_mm512_set1_pd(EXPF_POLY[2]), r, _mm512_set1_pd(1.0));
            let y = _mm512_mul_pd(_mm512_fmadd_pd(z, _mm512_mul_pd(r, r), y), sc);
            let out = _mm512_cvtpd_ps(y);
            if special == 0 {
                _mm256_storeu_ps(c.as_mut_ptr(), out);
            } else {
                let keep: [f32; 8] = std::array::from_fn(|i| c[i]);
                _mm256_storeu_ps(c.as_mut_ptr(), out);
                for (i, v) in c.iter_mut().enumerate() {
                    if special & (1 << i) != 0 {
                        *v = keep[i].exp();
                    }
                }
            }
        }
    }
    for v in chunks.into_remainder() {
        *v = expf(*v);
    }
}

/// `attn::reduce16` on a register: `_mm512_reduce_add_ps`'s tree (halves
/// folded, 16 → 8 → 4, then `(0+2)+(1+3)`), in registers.
///
/// # Safety
/// The CPU has avx512f.
#[inline(always)]
unsafe fn reduce16(x: __m512) -> f32 {
    // SAFETY: register operations only; the features are the caller's.
    unsafe {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
        let a = _mm256_add_ps(_mm512_castps512_ps256(x), hi);
        let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        // (b0 + b2, b1 + b3), then their sum.
        let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
        _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)))
    }
}

/// ggml's `ggml_v_expf` (AVX-512), as written there.
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn v_expf(x: __m512) -> __m512 {
    let r = _mm512_set1_ps(f32::from_bits(0x4B40_0000));
    let z = _mm512_fmadd_ps(x, _mm512_set1_ps(f32::from_bits(0x3FB8_AA3B)), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(
        n,
        _mm512_set1_ps(f32::from_bits(0x35BF_BE8E)),
        _mm512_fnmadd_ps(n, _mm512_set1_ps(f32::from_bits(0x3F31_7200)), x),
    );
    let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_set1_ps(f32::from_bits(0x3C07_2010)),
                b,
                _mm512_set1_ps(f32::from_bits(0x3D2B_9F17)),
            ),
            u,
            _mm512_fmadd_ps(
                _mm512_set1_ps(f32::from_bits(0x3E2A_AF33)),
                b,
                _mm512_set1_ps(f32::from_bits(0x3EFF_FEDB)),
            ),
        ),
        u,
        _mm512_fmadd_ps(_mm512_set1_ps(f32::from_bits(0x3F7F_FFF6)), b, _mm512_set1_ps(1.0)),
    );
    let res = _mm512_scalef_ps(j, n);
    if d == 0 {
        return res;
    }
    let zero = _mm512_setzero_ps();
    let alt = _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero),
        _mm512_set1_ps(f32::INFINITY),
        zero,
    );
    _mm512_mask_blend_ps(d, res, alt)
}

/// `v_expf` of every value (a multiple of 16 of them), for tests.
///
/// # Safety
/// The CPU must support avx512f and fma.
#[cfg(test)]
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn v_expf_all(x: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (o, i) in out.chunks_exact_mut(16).zip(x.chunks_exact(16)) {
        // SAFETY: 16 floats read and written.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v_expf(_mm512_loadu_ps(i.as_ptr()))) };
    }
    out
}

/// See `attn::swiglu`: `ggml_vec_swiglu_f32`'s AVX-512 loop.
///
/// # Safety
/// The CPU must support avx512f and fma; the slices are equally long, a
/// multiple of 16.
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
    assert!(g.len() == out.len() && u.len() == out.len() && out.len().is_multiple_of(16));
    for i in (0..out.len()).step_by(16) {
        // SAFETY: i + 16 <= len for all three slices (asserted above).
        unsafe {
            let x = _mm512_loadu_ps(g.as_ptr().add(i));
            let e = v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
            _mm512_storeu_ps(
                out.as_mut_ptr().add(i),
                _mm512_mul_ps(silu, _mm512_loadu_ps(u.as_ptr().add(i))),
            );
        }
    }
}

/// See `attn::gelu_biased`: 16 values at a time rounded to f16 in a
/// register, their table entries gathered, the ±10 ends selected by mask.
///
/// # Safety
/// The CPU must support avx512f and f16c; `x`, `out` (and `bias`) are
/// equally long, a multiple of 16 (the caller does the rest); `table` holds
/// 65,536 entries and one more, so the 4-byte gather at the last index stays
/// inside it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn gelu_biased(x: &[f32], bias: Option<&[f32]>, table: &[u16], out: &mut [f32]) {
    assert!(x.len() == out.len() && bias.is_none_or(|b| b.len() == out.len()));
    assert!(table.len() > 65536 && out.len().is_multiple_of(16));
    for i in (0..out.len()).step_by(16) {
        // SAFETY: i + 16 <= len of every slice (asserted above); gather
        // indices are below 65,536 and read 4 bytes of a table of 65,537
        // entries.
        unsafe {
            let mut v = _mm512_loadu_ps(x.as_ptr().add(i));
            if let Some(b) = bias {
                v = _mm512_add_ps(v, _mm512_loadu_ps(b.as_ptr().add(i)));
            }
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            let idx = _mm512_cvtepu16_epi32(h);
            let g = _mm512_i32gather_epi32::<2>(idx, table.as_ptr() as *const i32);
            let g = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
            let low = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, _mm512_set1_ps(-10.0));
            let high = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, _mm512_set1_ps(10.0));
            let r = _mm512_mask_mov_ps(g, high, v);
            let r = _mm512_mask_mov_ps(r, low, _mm512_setzero_ps());
            _mm512_storeu_ps(out.as_mut_ptr().add(i), r);
        }
    }
}

/// One key tile of [`attn::attend_tiled`] for `N` query rows that see the
/// same keys of it (positions `lo..valid` of the tile unmasked): their
/// scores, running maxima and sums, and outputs, each row's values the
/// same operations in the same order as one row alone
/// (`attn::tiled_scores`, the masks, the tile maximum, the rescale,
/// `tiled_softmax`, `tiled_accumulate`) — four rows share each load of
/// the tile and keep four times the fused multiply-add chains in flight.
/// With a soft-cap (gemma2; `scale` then over the cap) each seen score
/// becomes `cap · tanh(score)` before the masks, as the row alone.
///
/// # Safety
/// The CPU must support avx512f and fma; every `qs[n]` holds `hd` values,
/// a multiple of 16; `kt` holds `hd · 64` values, `v32` `valid · hd`;
/// `m` and `s` hold `N` values, `acc` `N · hd`; `lo < valid <= 64`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn tiled_group<const N: usize>(
    qs: [&[f32]; N],
    kt: &[f32],
    v32: &[f32],
    (scale, cap): (f32, Option<f32>),
    (lo, valid): (usize, usize),
    m: &mut [f32],
    s: &mut [f32],
    acc: &mut [f32],
) {
    let hd = qs[0].len();
    assert!(hd.is_multiple_of(16) && qs.iter().all(|q| q.len() == hd));
    assert!(kt.len() >= hd * 64 && v32.len() >= valid * hd && lo < valid && valid <= 64);
    assert!(m.len() >= N && s.len() >= N && acc.len() >= N * hd);
    let mut p = [[0f32; 64]; N];
    // SAFETY: row d of `kt` is 64 floats within it; `qs[n][d]` is within
    // each row (asserted above).
    unsafe {
        let mut kq = [[_mm512_setzero_ps(); 4]; N];
        for d in 0..hd {
            let col = kt.as_ptr().add(d * 64);
            let k = [
                _mm512_loadu_ps(col),
                _mm512_loadu_ps(col.add(16)),
                _mm512_loadu_ps(col.add(32)),
                _mm512_loadu_ps(col.add(48)),
            ];
            for n in 0..N {
                let qv = _mm512_set1_ps(*qs[n].get_unchecked(d));
                for j in 0..4 {
                    kq[n][j] = _mm512_fmadd_ps(k[j], qv, kq[n][j]);
                }
            }
        }
        // The keys before `lo` and from `valid` on are masked out.
        let keep = (u64::MAX >> (64 - valid)) & (u64::MAX << lo);
        let (sv, ninf) = (_mm512_set1_ps(scale), _mm512_set1_ps(f32::NEG_INFINITY));
        for kq in kq.iter_mut() {
            for x in kq.iter_mut() {
                *x = _mm512_mul_ps(*x, sv);
            }
        }
        if let Some(cap) = cap {
            // Through memory: `tanhf` is a scalar library call.
            for (p, kq) in p.iter_mut().zip(&mut kq) {
                for (j, x) in kq.iter().enumerate() {
                    _mm512_storeu_ps(p.as_mut_ptr().add(16 * j), *x);
                }
                super::attn::soft_cap(&mut p[lo..valid], cap);
                for (j, x) in kq.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(p.as_ptr().add(16 * j));
                }
            }
        }
        for n in 0..N {
            let mut x = kq[n];
            for (j, x) in x.iter_mut().enumerate() {
                let k = (keep >> (16 * j)) as u16;
                *x = _mm512_mask_blend_ps(k, ninf, *x);
            }
            // The maximum is exact in any order.
            let tile_max = _mm512_reduce_max_ps(_mm512_max_ps(
                _mm512_max_ps(x[0], x[1]),
                _mm512_max_ps(x[2], x[3]),
            ));
            let mnew = m[n].max(tile_max);
            if mnew > m[n] {
                let ms = (m[n] - mnew).exp();
                acc[n * hd..(n + 1) * hd].iter_mut().for_each(|v| *v *= ms);
                s[n] *= ms;
            }
            m[n] = mnew;
            let mv = _mm512_set1_ps(mnew);
            let mut sum = 0f64;
            for (j, x) in x.iter().enumerate() {
                let e = v_expf(_mm512_sub_ps(*x, mv));
                _mm512_storeu_ps(p[n].as_mut_ptr().add(16 * j), e);
                sum += reduce16(e) as f64;
            }
            s[n] = (s[n] as f64 + sum) as f32;
        }
        // Values in slabs of 64 (four registers a row), then 16.
        let mut c = 0;
        while c < hd {
            if hd - c >= 64 {
                accumulate_group::<N, 4>(&p, valid, v32, hd, c, acc);
                c += 64;
            } else {
                accumulate_group::<N, 1>(&p, valid, v32, hd, c, acc);
                c += 16;
            }
        }
    }
}

/// Values `c..c + 16·S` of [`tiled_group`]'s `N` outputs: `acc[n][d] +=
/// p[n][t] · v[t][d]` for `t < valid`, in key order.
///
/// # Safety
/// The CPU must support avx512f and fma; `c + 16·S <= hd`, `acc` holds
/// `N · hd` values and `v32` `valid · hd`.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn accumulate_group<const N: usize, const S: usize>(
    p: &[[f32; 64]; N],
    valid: usize,
    v32: &[f32],
    hd: usize,
    c: usize,
    acc: &mut [f32],
) {
    // SAFETY: offsets `c..c + 16·S` of each of the `N` rows of `acc` and
    // of each of the `valid` rows of `v32` (the caller's contract).
    unsafe {
        let mut a = [[_mm512_setzero_ps(); S]; N];
        for n in 0..N {
            for j in 0..S {
                a[n][j] = _mm512_loadu_ps(acc.as_ptr().add(n * hd + c + 16 * j));
            }
        }
        for t in 0..valid {
            let row = v32.as_ptr().add(t * hd + c);
            let mut v = [_mm512_setzero_ps(); S];
            for (j, v) in v.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(row.add(16 * j));
            }
            for n in 0..N {
                let pv = _mm512_set1_ps(p[n][t]);
                for j in 0..S {
                    a[n][j] = _mm512_fmadd_ps(v[j], pv, a[n][j]);
                }
            }
        }
        for n in 0..N {
            for j in 0..S {
                _mm512_storeu_ps(acc.as_mut_ptr().add(n * hd + c + 16 * j), a[n][j]);
            }
        }
    }
}

/// A key tile's keys transposed (`kt[d · 64 + t]`) and its values
/// (`v32[t · hd + d]`) in f32 (exact), for the `at.len()` keys whose
/// head starts at `kc[at[t]]` / `vc[at[t]]`: sixteen keys at a time by a
/// register transpose, the rest one value at a time.
///
/// # Safety
/// The CPU must support avx512f; `hd` is a multiple of 16, `at.len() <=
/// 64`, `kc[at[t]..at[t] + hd]` and `vc[..]` lie within the caches, `kt`
/// holds `hd · 64` values and `v32` `at.len() · hd`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tiled_load(
    kc: &[half::f16],
    vc: &[half::f16],
    at: &[usize],
    hd: usize,
    kt: &mut [f32],
    v32: &mut [f32],
) {
    assert!(hd.is_multiple_of(16) && at.len() <= 64);
    assert!(kt.len() >= hd * 64 && v32.len() >= at.len() * hd);
    assert!(at.iter().all(|&a| a + hd <= kc.len() && a + hd <= vc.len()));
    let whole = at.len() / 16 * 16;
    // SAFETY: every read is within a key's or value's `hd` values and every
    // write within `kt`/`v32` (asserted above).
    unsafe {
        for (t, &a) in at.iter().enumerate() {
            let (src, dst) = (vc.as_ptr().add(a) as *const __m256i, v32.as_mut_ptr().add(t * hd));
            for i in 0..hd / 16 {
                _mm512_storeu_ps(dst.add(16 * i), _mm512_cvtph_ps(_mm256_loadu_si256(src.add(i))));
            }
        }
        for t0 in (0..whole).step_by(16) {
            for d0 in (0..hd).step_by(16) {
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, r) in r.iter_mut().enumerate() {
                    let src = kc.as_ptr().add(at[t0 + i] + d0) as *const __m256i;
                    *r = _mm512_cvtph_ps(_mm256_loadu_si256(src));
                }
                let r = transpose16(r);
                for (i, r) in r.iter().enumerate() {
                    _mm512_storeu_ps(kt.as_mut_ptr().add((d0 + i) * 64 + t0), *r);
                }
            }
        }
    }
    super::attn::transpose_tail(kc, at, whole, hd, kt);
}

/// The 16 × 16 transpose of sixteen registers: `out[i]` lane `j` is
/// `r[j]` lane `i`.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    // Pairs of rows interleaved, then fours, within each 128-bit lane:
    // `b[4g + e]` lane-block `L` holds element `4L + e` of rows 4g..4g+3.
    let mut a = [_mm512_setzero_ps(); 16];
    for g in 0..8 {
        a[2 * g] = _mm512_unpacklo_ps(r[2 * g], r[2 * g + 1]);
        a[2 * g + 1] = _mm512_unpackhi_ps(r[2 * g], r[2 * g + 1]);
    }
    let mut b = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (x, y) = (4 * g, 4 * g + 2);
        b[4 * g] = _mm512_shuffle_ps::<0x44>(a[x], a[y]);
        b[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(a[x], a[y]);
        b[4 * g + 2] = _mm512_shuffle_ps::<0x44>(a[x + 1], a[y + 1]);
        b[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(a[x + 1], a[y + 1]);
    }
    // Then the 128-bit blocks: element 4L + e gathers block L of
    // b[e], b[4 + e], b[8 + e], b[12 + e].
    let mut out = [_mm512_setzero_ps(); 16];
    for e in 0..4 {
        let c = _mm512_shuffle_f32x4::<0x88>(b[e], b[4 + e]);
        let d = _mm512_shuffle_f32x4::<0xDD>(b[e], b[4 + e]);
        let c2 = _mm512_shuffle_f32x4::<0x88>(b[8 + e], b[12 + e]);
        let d2 = _mm512_shuffle_f32x4::<0xDD>(b[8 + e], b[12 + e]);
        out[e] = _mm512_shuffle_f32x4::<0x88>(c, c2);
        out[8 + e] = _mm512_shuffle_f32x4::<0xDD>(c, c2);
        out[4 + e] = _mm512_shuffle_f32x4::<0x88>(d, d2);
        out[12 + e] = _mm512_shuffle_f32x4::<0xDD>(d, d2);
    }
    out
}

/// Quantizes one column as `quant::quantize_q8` does (bit for bit) and
/// writes the kernels' layouts (`Acts`): 4-bit layout, or 8-bit layout and
/// lane corrections.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512vnni; `x` holds
/// `d.len() · 32` values and the outputs are sized for that many blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(super) unsafe fn quantize_column(
    x: &[f32],
    d: &mut [f32],
    s: &mut [f32],
    q: &mut [i8],
    lay: &mut [u8],
    corr: &mut [i32],
    four: bool,
) {
    let nb = d.len();
    assert!(x.len() >= nb * 32 && s.len() >= nb && q.len() >= nb * 32 && lay.len() >= nb * 64);
    assert!(four || corr.len() >= nb * 16);
    // SAFETY: in bounds (asserted above).
    unsafe {
        let sign = _mm512_set1_epi32(0x7FFF_FFFF);
        let nib_idx = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
        let dup_idx = _mm512_setr_epi64(0, 1, 2, 3, 0, 1, 2, 3);
        let ones = _mm512_set1_epi8(1);
        for b in 0..nb {
            let p = x.as_ptr().add(b * 32);
            let v0 = _mm512_loadu_ps(p);
            let v1 = _mm512_loadu_ps(p.add(16));
            let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v0), sign));
            let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v1), sign));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
            let dd = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let m = _mm512_set1_ps(id);
            let r0 = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(v0, m),
            );
            let r1 = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(v1, m),
            );
            let i0 = _mm512_cvtps_epi32(r0);
            let i1 = _mm512_cvtps_epi32(r1);
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
            d[b] = half::f16::from_f32(dd).to_f32();
            s[b] = half::f16::from_f32(dd * sum as f32).to_f32();
            let q0 = _mm512_cvtsepi32_epi8(i0);
            let q1 = _mm512_cvtsepi32_epi8(i1);
            let q256 = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q0), q1);
            _mm256_storeu_si256(q.as_mut_ptr().add(b * 32) as *mut __m256i, q256);
            let wide = _mm512_castsi256_si512(q256);
            let out = lay.as_mut_ptr().add(b * 64) as *mut __m512i;
            if four {
                _mm512_storeu_si512(out as *mut _, _mm512_permutexvar_epi64(nib_idx, wide));
            } else {
                let dupv = _mm512_permutexvar_epi64(dup_idx, wide);
                _mm512_storeu_si512(out as *mut _, dupv);
                // Lane sums of four signed bytes (unsigned 1 × signed a), × 128.
                let lanes =
                    _mm512_slli_epi32::<7>(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, dupv));
                _mm512_storeu_si512(corr.as_mut_ptr().add(b * 16) as *mut _, lanes);
            }
        }
    }
}

/// Weight rows and columns per tile of [`dot16_panel`].
pub(super) const TILE16_ROWS: usize = 4;
pub(super) const TILE16_COLS: usize = 6;

/// Groups of four weight rows for [`dot16_panel`]: f16 as stored in a GGUF
/// row (little-endian halves, converted in registers: exact), or f32.
pub(super) enum Rows16<'a> {
    F16(Vec<[&'a [u8]; TILE16_ROWS]>),
    F32(Vec<[&'a [f32]; TILE16_ROWS]>),
}

/// Values per slice of [`dot16_panel`]: six columns' slices (12 KiB) stay
/// in the first-level cache while every group of rows passes them.
const PANEL_SLICE: usize = 512;

/// `scalar::dot_f32(row, xs[c])` for every row of every group against six
/// columns, `out(g, tile)` called with group g's four-by-six tile (the f16
/// and bf16 rows of `rows.rs`): each pair's sixteen lanes in one register,
/// a fused multiply-add chain per lane, the tree sum (8, 4, 2, 1) and the
/// tail chained apart — `dot_f32`'s numbers, with twenty-four accumulators
/// in registers so each load feeds four or six products.
///
/// The values are taken in slices of [`PANEL_SLICE`] across all the
/// groups, so the columns are read from the first-level cache rather than
/// the second for every group; the chains wait between slices in memory
/// (a chain run in slices is the same chain). Run whole per tile, the
/// compiler left two of the chains on the stack across every step.
///
/// # Safety
/// The CPU must support avx512f, f16c and fma; every row of every group
/// holds at least `k` values and every `xs[c]` at least `k`.
#[target_feature(enable = "avx512f,f16c,fma")]
pub(super) unsafe fn dot16_panel(
    groups: &Rows16<'_>,
    xs: &[&[f32]; TILE16_COLS],
    k: usize,
    out: impl FnMut(usize, &[[f32; TILE16_COLS]; TILE16_ROWS]),
) {
    assert!(xs.iter().all(|v| v.len() >= k));
    match groups {
        Rows16::F16(g) => {
            assert!(g.iter().flatten().all(|v| v.len() >= 2 * k));
            let load = |ws: &[&[u8]; TILE16_ROWS], r: usize, i: usize| {
                // SAFETY: every row holds 2k bytes: 32 from 2i, i + 16 <= k.
                unsafe {
                    _mm512_cvtph_ps(_mm256_loadu_si256(ws[r].as_ptr().add(2 * i) as *const __m256i))
                }
            };
            let at = |ws: &[&[u8]; TILE16_ROWS], r: usize, j: usize| {
                half::f16::from_le_bytes([ws[r][2 * j], ws[r][2 * j + 1]]).to_f32()
            };
            // SAFETY: the caller's (features, lengths checked above).
            unsafe { panel(g, load, at, xs, k, out) }
        }
        Rows16::F32(g) => {
            assert!(g.iter().flatten().all(|v| v.len() >= k));
            // SAFETY: every row holds k values: 16 from i, i + 16 <= k.
            let load = |ws: &[&[f32]; TILE16_ROWS], r: usize, i: usize| unsafe {
                _mm512_loadu_ps(ws[r].as_ptr().add(i))
            };
            let at = |ws: &[&[f32]; TILE16_ROWS], r: usize, j: usize| ws[r][j];
            // SAFETY: the caller's (features, lengths checked above).
            unsafe { panel(g, load, at, xs, k, out) }
        }
    }
}

/// [`dot16_panel`] over groups of rows of type `G`: `load(g, r, i)` gives
/// row r's sixteen weights from i (i + 16 <= k), `at(g, r, j)` its weight j
/// (the tail).
///
/// # Safety
/// The CPU must support avx512f and fma (the caller's features, into which
/// this is inlined); every `xs[c]` holds at least `k` values and `load`
/// reads within every row for i + 16 <= k.
#[inline(always)]
unsafe fn panel<G>(
    groups: &[G],
    load: impl Fn(&G, usize, usize) -> __m512,
    at: impl Fn(&G, usize, usize) -> f32,
    xs: &[&[f32]; TILE16_COLS],
    k: usize,
    mut out: impl FnMut(usize, &[[f32; TILE16_COLS]; TILE16_ROWS]),
) {
    // SAFETY: avx512f (the caller's).
    let zero = unsafe { _mm512_setzero_ps() };
    // Each group's chains start in registers in the first slice (no
    // zeroed buffer to write and read back: a panel is short work).
    let mut accs: Vec<Acc16> = Vec::with_capacity(groups.len());
    let body = k / 16 * 16;
    for s0 in (0..body).step_by(PANEL_SLICE) {
        let span = s0..(s0 + PANEL_SLICE).min(body);
        for (g, ws) in groups.iter().enumerate() {
            let load = |r, i| load(ws, r, i);
            // SAFETY: the caller's; the span lies within 0..body.
            unsafe {
                if s0 == 0 {
                    let mut acc = [[zero; TILE16_COLS]; TILE16_ROWS];
                    tile16_steps(&load, xs, span.clone(), &mut acc);
                    accs.push(acc);
                } else {
                    tile16_steps(&load, xs, span.clone(), &mut accs[g]);
                }
            }
        }
    }
    // No values of 16 (k < 16): every chain is empty.
    accs.resize(groups.len(), [[zero; TILE16_COLS]; TILE16_ROWS]);
    let mut tile = [[0f32; TILE16_COLS]; TILE16_ROWS];
    for (g, (ws, acc)) in groups.iter().zip(&accs).enumerate() {
        // SAFETY: the caller's.
        unsafe { tile16_sums(acc, |r, j| at(ws, r, j), xs, k, &mut tile) };
        out(g, &tile);
    }
}

/// Twenty-four sixteen-lane chains of [`dot16_panel`].
type Acc16 = [[__m512; TILE16_COLS]; TILE16_ROWS];

/// [`dot16_panel`]'s multiply-adds for values `span` (multiples of 16,
/// within every column), continuing the chains in `acc`.
///
/// # Safety
/// As [`panel`]; `span.end <= k`.
#[inline(always)]
unsafe fn tile16_steps(
    load: &impl Fn(usize, usize) -> __m512,
    xs: &[&[f32]; TILE16_COLS],
    span: std::ops::Range<usize>,
    acc: &mut Acc16,
) {
    // In registers for the loop.
    let mut a = *acc;
    let mut i = span.start;
    while i < span.end {
        let w: [__m512; TILE16_ROWS] = std::array::from_fn(|r| load(r, i));
        for c in 0..TILE16_COLS {
            // SAFETY: i + 16 <= span.end <= k, within every column.
            let x = unsafe { _mm512_loadu_ps(xs[c].as_ptr().add(i)) };
            for r in 0..TILE16_ROWS {
                // SAFETY: avx512f and fma (the caller's).
                a[r][c] = unsafe { _mm512_fmadd_ps(w[r], x, a[r][c]) };
            }
        }
        i += 16;
    }
    *acc = a;
}

/// [`dot16_panel`]'s sums of the finished chains `acc`, with the tail past
/// `k / 16 * 16` chained apart.
///
/// # Safety
/// As [`panel`].
#[inline(always)]
unsafe fn tile16_sums(
    acc: &Acc16,
    at: impl Fn(usize, usize) -> f32,
    xs: &[&[f32]; TILE16_COLS],
    k: usize,
    out: &mut [[f32; TILE16_COLS]; TILE16_ROWS],
) {
    let body = k / 16 * 16;
    // The 24 sums, sixteen registers at a time (`sum16_tree_x16`).
    let flat: [__m512; 32] = std::array::from_fn(|a| {
        // SAFETY: avx512f (the caller's).
        acc.get(a / TILE16_COLS).map_or(unsafe { _mm512_setzero_ps() }, |r| r[a % TILE16_COLS])
    });
    let mut sums = [0f32; 32];
    for (half, v) in flat.chunks_exact(16).enumerate() {
        let v: &[__m512; 16] = v.try_into().expect("16 registers");
        // SAFETY: avx512f (the caller's); 16 floats stored into 16.
        unsafe { _mm512_storeu_ps(sums.as_mut_ptr().add(16 * half), sum16_tree_x16(v)) };
    }
    for r in 0..TILE16_ROWS {
        for c in 0..TILE16_COLS {
            let mut tail = 0f32;
            for j in body..k {
                tail = at(r, j).mul_add(xs[c][j], tail);
            }
            out[r][c] = sums[r * TILE16_COLS + c] + tail;
        }
    }
}

/// The sums of sixteen registers at once, each as `scalar::dot_f32` sums
/// its sixteen lanes, lane j of the result the sum of `v[j]`: the four folds (lane i with i + 8, i + 4, i + 2,
/// i + 1), each on pairs of registers whose halves a shuffle brings
/// together, so 15 additions and 30 shuffles serve all sixteen instead of
/// 64 of each. The folds leave lane 4L + j with input 4j + L, so the inputs
/// go in transposed.
///
/// # Safety
/// The CPU has avx512f.
#[inline(always)]
unsafe fn sum16_tree_x16(v: &[__m512; 16]) -> __m512 {
    // SAFETY: register operations only (avx512f, the caller's).
    unsafe {
        let x: [__m512; 16] = std::array::from_fn(|s| v[4 * (s % 4) + s / 4]);
        // Lane i with i + 8: each register's halves side by side.
        let p: [__m512; 8] = std::array::from_fn(|k| {
            let (a, b) = (x[2 * k], x[2 * k + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            )
        });
        // Lane i with i + 4: 128-bit quarters.
        let q: [__m512; 4] = std::array::from_fn(|m| {
            let (a, b) = (p[2 * m], p[2 * m + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
            )
        });
        // Lane i with i + 2, then i with i + 1, within each quarter.
        let r: [__m512; 2] = std::array::from_fn(|n| {
            let (a, b) = (q[2 * n], q[2 * n + 1]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
            )
        });
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(r[0], r[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(r[0], r[1]),
        )
    }
}
