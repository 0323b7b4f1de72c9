//! Matrix kernels of the fast CPU path: quantized weights packed for SIMD,
//! activations quantized per column, and the products of the two.
//!
//! INVARIANT: every (row, column) result is computed in one canonical order —
//! llama.cpp's: eight lanes of four-product integer sums, each lane
//! accumulated `acc = fma(d_w · d_a, lane, acc)` over the blocks in order, the
//! lanes summed as `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, plus (Q4_1)
//! `Σ fma(m, s)` in block order. The scalar and SIMD paths, decode (one
//! column) and prompt (many columns) all give bit-identical numbers, so
//! reusing a cached prefix cannot change greedy output.

pub(crate) mod attn;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::quant::{quantize_q8, Q8Row, Q4_1_BYTES, Q8_0_BYTES, QK};

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// An f16 (as bits) widened to f32.
#[inline]
pub(crate) fn h2f(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}
use std::sync::OnceLock;

/// The instruction set the kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 (F, BW, VL) with VNNI, FMA and F16C.
    Avx512Vnni,
    /// Portable Rust; the compiler vectorises what it can.
    Scalar,
}

/// The kernels in use: the best this CPU has, unless `AGENTD_KERNELS=scalar`.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("AGENTD_KERNELS").is_ok_and(|v| v == "scalar") {
            return Isa::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            return Isa::Avx512Vnni;
        }
        Isa::Scalar
    })
}

/// A weight matrix `[rows × cols]` packed for the kernels. Rows are padded
/// to a multiple of [`ROW_TILE`] with zeros.
#[derive(Debug)]
pub(crate) struct Packed {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) kind: PackedKind,
}

/// Rows are packed in pairs (one 512-bit register holds a block of two rows)
/// and processed four at a time.
pub(crate) const ROW_TILE: usize = 4;

#[derive(Debug)]
pub(crate) enum PackedKind {
    /// One record of [`Q4_REC`] bytes per row tile and block, in row-tile
    /// order so a tile streams from one place: 64 bytes of nibbles (rows
    /// 0–3, 16 each: the 512-bit register of a row pair is two adjacent
    /// rows), then the four rows' scales `d`, then their minimums `m` (f16
    /// bits, as in the file: the packed matrix is the size of the tensor).
    Q4_1 { data: Vec<u8> },
    /// One record of [`Q8_REC`] bytes per row tile and block: 128 bytes of
    /// `q + 128` (rows 0–3, 32 each), then the four rows' scales `d`.
    Q8_0 { data: Vec<u8> },
    /// Plain f32 rows (norm-sized tensors and small models).
    F32 { w: Vec<f32> },
}

/// Bytes of a Q4_1 record (row tile × block).
pub(crate) const Q4_REC: usize = 80;
/// Bytes of a Q8_0 record (row tile × block).
pub(crate) const Q8_REC: usize = 136;

fn padded(rows: usize) -> usize {
    rows.div_ceil(ROW_TILE) * ROW_TILE
}

impl Packed {
    /// An empty (all-zero weights) matrix of GGUF type Q4_1 or Q8_0, to be
    /// filled with [`Packed::fill`]; `None` for other types.
    pub(crate) fn empty(q8: bool, rows: usize, cols: usize) -> Packed {
        let nb = cols / QK;
        let tiles = padded(rows) / ROW_TILE;
        let kind = if q8 {
            let mut data = vec![0u8; tiles * nb * Q8_REC];
            for rec in data.chunks_exact_mut(Q8_REC) {
                rec[..128].fill(128);
            }
            PackedKind::Q8_0 { data }
        } else {
            PackedKind::Q4_1 { data: vec![0u8; tiles * nb * Q4_REC] }
        };
        Packed { rows, cols, kind }
    }

    /// Copies GGUF rows `row0..` (whole rows of this matrix's type) in.
    pub(crate) fn fill(&mut self, row0: usize, raw: &[u8]) {
        let nb = self.cols / QK;
        match &mut self.kind {
            PackedKind::Q4_1 { data } => {
                for (i, row) in raw.chunks_exact(nb * Q4_1_BYTES).enumerate() {
                    let r = row0 + i;
                    let (t, w) = (r / ROW_TILE, r % ROW_TILE);
                    for (b, blk) in row.chunks_exact(Q4_1_BYTES).enumerate() {
                        let rec = &mut data[(t * nb + b) * Q4_REC..][..Q4_REC];
                        rec[w * 16..w * 16 + 16].copy_from_slice(&blk[4..20]);
                        rec[64 + 2 * w..66 + 2 * w].copy_from_slice(&blk[0..2]);
                        rec[72 + 2 * w..74 + 2 * w].copy_from_slice(&blk[2..4]);
                    }
                }
            }
            PackedKind::Q8_0 { data } => {
                for (i, row) in raw.chunks_exact(nb * Q8_0_BYTES).enumerate() {
                    let r = row0 + i;
                    let (t, w) = (r / ROW_TILE, r % ROW_TILE);
                    for (b, blk) in row.chunks_exact(Q8_0_BYTES).enumerate() {
                        let rec = &mut data[(t * nb + b) * Q8_REC..][..Q8_REC];
                        for j in 0..32 {
                            rec[w * 32 + j] = (blk[2 + j] as i8 as i16 + 128) as u8;
                        }
                        rec[128 + 2 * w..130 + 2 * w].copy_from_slice(&blk[0..2]);
                    }
                }
            }
            PackedKind::F32 { .. } => {}
        }
    }

    /// Packs GGUF Q4_1 rows.
    #[cfg(test)]
    pub(crate) fn q4_1(raw: &[u8], rows: usize, cols: usize) -> Packed {
        let mut p = Packed::empty(false, rows, cols);
        p.fill(0, raw);
        p
    }

    /// Packs GGUF Q8_0 rows.
    #[cfg(test)]
    pub(crate) fn q8_0(raw: &[u8], rows: usize, cols: usize) -> Packed {
        let mut p = Packed::empty(true, rows, cols);
        p.fill(0, raw);
        p
    }

    /// Plain f32 rows.
    pub(crate) fn f32(w: Vec<f32>, rows: usize, cols: usize) -> Packed {
        Packed { rows, cols, kind: PackedKind::F32 { w } }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        match &self.kind {
            PackedKind::Q4_1 { data } | PackedKind::Q8_0 { data } => data.len(),
            PackedKind::F32 { w } => 4 * w.len(),
        }
    }

    /// `out[c · rows + r] = row r · column c` for the rows in
    /// `tiles.start * ROW_TILE ..` (tiles of [`ROW_TILE`] rows), all columns.
    ///
    /// `out` holds `acts.n · self.rows` values; rows past `self.rows` are not
    /// written. Threads may share `out` when their tile ranges are disjoint.
    pub(crate) fn matmul_tiles(
        &self,
        acts: &Acts,
        tiles: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) {
        match isa() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                // SAFETY: `isa()` returned Avx512Vnni only after checking the
                // CPU supports every feature the kernels enable.
                unsafe { x86::matmul_tiles(self, acts, tiles, out) }
            }
            _ => scalar::matmul_tiles(self, acts, tiles, out),
        }
    }

    /// Row `r` as f32 (an embedding lookup from a tied output matrix).
    pub(crate) fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let nb = self.cols / QK;
        let (t, w) = (r / ROW_TILE, r % ROW_TILE);
        match &self.kind {
            PackedKind::Q4_1 { data } => {
                for b in 0..nb {
                    let rec = &data[(t * nb + b) * Q4_REC..][..Q4_REC];
                    let (dd, mm) = (h2f(u16_at(rec, 64 + 2 * w)), h2f(u16_at(rec, 72 + 2 * w)));
                    for j in 0..16 {
                        let q = rec[w * 16 + j];
                        out[b * QK + j] = dd * (q & 15) as f32 + mm;
                        out[b * QK + j + 16] = dd * (q >> 4) as f32 + mm;
                    }
                }
            }
            PackedKind::Q8_0 { data } => {
                for b in 0..nb {
                    let rec = &data[(t * nb + b) * Q8_REC..][..Q8_REC];
                    let dd = h2f(u16_at(rec, 128 + 2 * w));
                    for j in 0..32 {
                        out[b * QK + j] = dd * (rec[w * 32 + j] as i32 - 128) as f32;
                    }
                }
            }
            PackedKind::F32 { w } => out.copy_from_slice(&w[r * self.cols..(r + 1) * self.cols]),
        }
    }

    /// Number of row tiles.
    pub(crate) fn tiles(&self) -> usize {
        padded(self.rows) / ROW_TILE
    }
}

/// Where a matmul writes: `[cols × rows]`, possibly shared between threads
/// that each own disjoint row tiles.
#[derive(Debug)]
pub(crate) struct OutRows<'a> {
    ptr: *mut f32,
    len: usize,
    rows: usize,
    _life: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: threads write disjoint rows (INVARIANT of the callers of `set`).
unsafe impl Send for OutRows<'_> {}
unsafe impl Sync for OutRows<'_> {}

impl<'a> OutRows<'a> {
    pub(crate) fn new(out: &'a mut [f32], rows: usize) -> OutRows<'a> {
        OutRows { ptr: out.as_mut_ptr(), len: out.len(), rows, _life: std::marker::PhantomData }
    }

    /// Writes row `r` of column `c`; rows at or past `rows` are ignored.
    ///
    /// INVARIANT: two threads never write the same `(c, r)`.
    #[inline]
    pub(crate) fn set(&self, c: usize, r: usize, v: f32) {
        if r < self.rows {
            let i = c * self.rows + r;
            assert!(i < self.len);
            // SAFETY: in bounds (checked), and no other thread writes index i.
            unsafe { *self.ptr.add(i) = v }
        }
    }
}

/// Activations for one matmul: each column quantized (when the weights are
/// quantized) and laid out for the kernels.
#[derive(Debug, Default)]
pub(crate) struct Acts {
    pub(crate) n: usize,
    pub(crate) k: usize,
    /// The f32 values `[n × k]` (for f32 weights).
    pub(crate) x: Vec<f32>,
    /// Per column and block: scale and `d · Σq`.
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    /// Per column and block: the 32 quantized values.
    pub(crate) q: Vec<i8>,
    /// Per column and block, 64 bytes `[a0..16, a0..16, a16..32, a16..32]`:
    /// the layout the packed 4-bit weights meet.
    pub(crate) nib: Vec<u8>,
    /// Per column and block, 64 bytes `[a0..32, a0..32]` for 8-bit weights.
    pub(crate) dup: Vec<u8>,
    /// Per column and block, 16 lanes: `128 · (a[4j]+…+a[4j+3])` (twice),
    /// the offset the unsigned 8-bit weights add.
    pub(crate) corr: Vec<i32>,
}

impl Acts {
    /// Prepares `x` (`n` columns of `k` values) for weights like `w`,
    /// quantizing columns in parallel on `pool` when there are many.
    pub(crate) fn prepare(
        &mut self,
        x: &[f32],
        n: usize,
        k: usize,
        w: &Packed,
        pool: &crate::pool::Pool,
    ) {
        self.n = n;
        self.k = k;
        self.x.clear();
        let four = matches!(w.kind, PackedKind::Q4_1 { .. });
        if matches!(w.kind, PackedKind::F32 { .. }) {
            self.x.extend_from_slice(&x[..n * k]);
            return;
        }
        let nb = k / QK;
        self.d.resize(n * nb, 0.0);
        self.s.resize(n * nb, 0.0);
        self.q.resize(n * nb * QK, 0);
        if four {
            self.nib.resize(n * nb * 64, 0);
            self.dup.clear();
            self.corr.clear();
        } else {
            self.nib.clear();
            self.dup.resize(n * nb * 64, 0);
            self.corr.resize(n * nb * 16, 0);
        }
        let cols = ColWriter {
            d: self.d.as_mut_ptr(),
            s: self.s.as_mut_ptr(),
            q: self.q.as_mut_ptr(),
            lay: if four { self.nib.as_mut_ptr() } else { self.dup.as_mut_ptr() },
            corr: self.corr.as_mut_ptr(),
            nb,
            four,
        };
        let per = 8;
        let chunks = n.div_ceil(per);
        let job = |i: usize| {
            for c in i * per..((i + 1) * per).min(n) {
                // SAFETY: every column writes only its own disjoint ranges of
                // the buffers sized above; `c < n`.
                unsafe { cols.column(&x[c * k..(c + 1) * k], c) };
            }
        };
        if chunks > 1 {
            pool.run(chunks, &job);
        } else {
            (0..chunks).for_each(job);
        }
    }

    pub(crate) fn blocks(&self) -> usize {
        self.k / QK
    }
}

/// Raw views of an [`Acts`]'s buffers, written one column at a time.
#[derive(Clone, Copy)]
struct ColWriter {
    d: *mut f32,
    s: *mut f32,
    q: *mut i8,
    lay: *mut u8,
    corr: *mut i32,
    nb: usize,
    four: bool,
}

// SAFETY: columns write disjoint ranges (see `column`).
unsafe impl Send for ColWriter {}
unsafe impl Sync for ColWriter {}

impl ColWriter {
    /// Quantizes column `c` (`x`, `nb · 32` values) into its ranges.
    ///
    /// # Safety
    /// The buffers hold at least `c + 1` columns, and no other thread writes
    /// column `c`.
    unsafe fn column(&self, x: &[f32], c: usize) {
        let nb = self.nb;
        // SAFETY: ranges of column c, in bounds by the caller's contract.
        let (d, s, q, lay) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.d.add(c * nb), nb),
                std::slice::from_raw_parts_mut(self.s.add(c * nb), nb),
                std::slice::from_raw_parts_mut(self.q.add(c * nb * QK), nb * QK),
                std::slice::from_raw_parts_mut(self.lay.add(c * nb * 64), nb * 64),
            )
        };
        let corr = if self.four {
            &mut [][..]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts_mut(self.corr.add(c * nb * 16), nb * 16) }
        };
        match isa() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has the features (`isa`).
            Isa::Avx512Vnni => unsafe { x86::quantize_column(x, d, s, q, lay, corr, self.four) },
            _ => quantize_column_scalar(x, d, s, q, lay, corr, self.four),
        }
    }
}

/// Portable twin of `x86::quantize_column`.
fn quantize_column_scalar(
    x: &[f32],
    d: &mut [f32],
    s: &mut [f32],
    q: &mut [i8],
    lay: &mut [u8],
    corr: &mut [i32],
    four: bool,
) {
    let mut row = Q8Row::default();
    quantize_q8(x, &mut row);
    d.copy_from_slice(&row.d);
    s.copy_from_slice(&row.s);
    q.copy_from_slice(&row.q);
    for (b, blk) in row.q.chunks_exact(QK).enumerate() {
        let u: [u8; 32] = std::array::from_fn(|i| blk[i] as u8);
        let out = &mut lay[b * 64..(b + 1) * 64];
        if four {
            out[..16].copy_from_slice(&u[..16]);
            out[16..32].copy_from_slice(&u[..16]);
            out[32..48].copy_from_slice(&u[16..]);
            out[48..].copy_from_slice(&u[16..]);
        } else {
            out[..32].copy_from_slice(&u);
            out[32..].copy_from_slice(&u);
            for j in 0..8 {
                let v = 128 * blk[4 * j..4 * j + 4].iter().map(|&v| v as i32).sum::<i32>();
                corr[b * 16 + j] = v;
                corr[b * 16 + 8 + j] = v;
            }
        }
    }
}

/// llama.cpp's horizontal sum of eight lanes.
#[inline]
pub(crate) fn hsum8(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random generator for test data.
    pub(crate) fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    fn random_q4_1(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut r = rng(seed);
        let mut raw = Vec::new();
        for _ in 0..rows * cols / QK {
            let d = half::f16::from_f32((r() % 1000) as f32 / 50_000.0);
            let m = half::f16::from_f32(-((r() % 1000) as f32) / 10_000.0);
            raw.extend_from_slice(&d.to_le_bytes());
            raw.extend_from_slice(&m.to_le_bytes());
            for _ in 0..16 {
                raw.push(r() as u8);
            }
        }
        raw
    }

    fn random_q8_0(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut r = rng(seed);
        let mut raw = Vec::new();
        for _ in 0..rows * cols / QK {
            let d = half::f16::from_f32((r() % 1000) as f32 / 50_000.0);
            raw.extend_from_slice(&d.to_le_bytes());
            for _ in 0..32 {
                raw.push(((r() % 255) as i32 - 127) as i8 as u8);
            }
        }
        raw
    }

    fn random_x(n: usize, seed: u64) -> Vec<f32> {
        let mut r = rng(seed);
        (0..n).map(|_| ((r() % 20001) as f32 - 10000.0) / 3000.0).collect()
    }

    fn run(w: &Packed, x: &[f32], n: usize, forced: Option<Isa>) -> Vec<f32> {
        let mut acts = Acts::default();
        acts.prepare(x, n, w.cols, w, &crate::pool::Pool::new(2));
        let mut out = vec![f32::NAN; n * w.rows];
        {
            let o = OutRows::new(&mut out, w.rows);
            match forced {
                Some(Isa::Scalar) => scalar::matmul_tiles(w, &acts, 0..w.tiles(), &o),
                _ => w.matmul_tiles(&acts, 0..w.tiles(), &o),
            }
        }
        out
    }

    /// Column quantization: the SIMD path equals the scalar one bit for bit,
    /// ties included.
    #[test]
    fn quantization_paths_agree() {
        let mut x = random_x(32 * 9, 5);
        // Exact ties: a block whose max is 127 scales by 1.
        x[0] = 127.0;
        for (i, v) in x[1..32].iter_mut().enumerate() {
            *v = i as f32 - 15.5;
        }
        x[32..64].fill(0.0);
        for four in [true, false] {
            let nb = x.len() / 32;
            let mut a = (
                vec![0f32; nb],
                vec![0f32; nb],
                vec![0i8; nb * 32],
                vec![0u8; nb * 64],
                vec![0i32; nb * 16],
            );
            let mut b = a.clone();
            quantize_column_scalar(&x, &mut a.0, &mut a.1, &mut a.2, &mut a.3, &mut a.4, four);
            #[cfg(target_arch = "x86_64")]
            if isa() == Isa::Avx512Vnni {
                // SAFETY: checked by isa().
                unsafe {
                    x86::quantize_column(&x, &mut b.0, &mut b.1, &mut b.2, &mut b.3, &mut b.4, four)
                };
                assert_eq!(a, b, "four={four}");
            }
        }
    }

    /// The packed kernels agree with a plain dequantized product, and the
    /// SIMD path is bit-identical to the scalar one for every column count.
    #[test]
    fn kernels_match_reference_and_each_other() {
        for (rows, cols) in [(6usize, 64usize), (13, 96), (32, 576)] {
            for (name, raw, w) in [
                ("q4_1", random_q4_1(rows, cols, 1), None),
                ("q8_0", random_q8_0(rows, cols, 2), Some(())),
            ] {
                let packed = if w.is_none() {
                    Packed::q4_1(&raw, rows, cols)
                } else {
                    Packed::q8_0(&raw, rows, cols)
                };
                let ty =
                    if w.is_none() { crate::quant::QType::Q4_1 } else { crate::quant::QType::Q8_0 };
                for n in [1usize, 3, 7] {
                    let x = random_x(n * cols, 3);
                    let simd = run(&packed, &x, n, None);
                    let sc = run(&packed, &x, n, Some(Isa::Scalar));
                    assert_eq!(simd, sc, "{name} {rows}x{cols} n={n}");
                    // Against f32 math on dequantized weights: close, not equal.
                    let mut row = vec![0f32; cols];
                    for c in 0..n {
                        for r in 0..rows {
                            crate::quant::dequantize_row(
                                ty,
                                &raw[r * ty.row_bytes(cols)..(r + 1) * ty.row_bytes(cols)],
                                &mut row,
                            );
                            let want: f32 =
                                row.iter().zip(&x[c * cols..]).map(|(a, b)| a * b).sum();
                            let scale: f32 =
                                row.iter().zip(&x[c * cols..]).map(|(a, b)| (a * b).abs()).sum();
                            let got = sc[c * rows + r];
                            let tol = 0.01 * scale + 1e-6;
                            assert!((got - want).abs() < tol, "{name} r{r} c{c}: {got} vs {want}");
                        }
                    }
                }
            }
        }
    }
}
