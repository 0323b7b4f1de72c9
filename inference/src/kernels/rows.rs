//! Weight matrices kept as GGUF stores them (its blocks, rows interleaved
//! block by block in groups where a kernel reads rows together), and the
//! portable kernels over them that define the numbers; `avx2.rs` has their
//! SIMD twins, bit-identical.
//!
//! INVARIANT: each format's product is computed the way llama.cpp's x86 CPU
//! backend computes it at inference, so greedy output follows llama.cpp's:
//!
//! - *lanes* (`ggml_vec_dot_*` and tinyBLAS: Q8_0, Q5_0, Q4_1, Q5_1, Q5_K,
//!   Q6_K, and Q4_0/Q4_K whose row count is not a multiple of 8): eight
//!   integer lanes of four consecutive products per 32 values (scaled per
//!   sub-block for K-quants), each lane accumulated in f32 with its own
//!   fused multiply-add block after block, the lanes summed
//!   `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, plus the block-offset terms
//!   (`Σ fma(m, s)` for Q4_1/Q5_1, `Σ fma(−d·dmin, Σ m·bsum)` for Q5_K, a
//!   4-lane `−d·dmin` accumulator for Q4_K);
//! - *chain* (the repacked `q4_0_8x8` and `q4_K_8x8` kernels, which ggml
//!   uses for Q4_0 and Q4_K tensors whose row count is a multiple of 8): one
//!   exact integer dot product per block, one fused multiply-add per block
//!   into one accumulator (and one more for the Q4_K minimums,
//!   subtracted at the end).
//!
//! Every integer sum is exact (no saturation is possible at these
//! magnitudes), so only the float steps above fix the result, and a row's
//! result never depends on which other rows or columns run with it.

use super::{hsum8, OutRows};
use crate::quant::{f16_at, scale_min_k4, QK, QK_K};

/// A weight format the row kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fmt {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    F16,
    BF16,
}

/// The activations a format's kernels consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActKind {
    /// Q8_0/Q8_1 blocks of 32 (`Acts::{q, d, s}`).
    B32,
    /// Q8_K super-blocks of 256 (`Acts::{kq, kd, kbs}`).
    K256,
    /// Plain f32 (`Acts::x`).
    F32,
}

impl Fmt {
    pub(crate) fn from_ggml(ty: crate::gguf::GgmlType) -> Option<Fmt> {
        use crate::gguf::GgmlType as G;
        Some(match ty {
            G::Q4_0 => Fmt::Q4_0,
            G::Q4_1 => Fmt::Q4_1,
            G::Q5_0 => Fmt::Q5_0,
            G::Q5_1 => Fmt::Q5_1,
            G::Q8_0 => Fmt::Q8_0,
            G::Q2_K => Fmt::Q2K,
            G::Q3_K => Fmt::Q3K,
            G::Q4_K => Fmt::Q4K,
            G::Q5_K => Fmt::Q5K,
            G::Q6_K => Fmt::Q6K,
            G::F16 => Fmt::F16,
            G::BF16 => Fmt::BF16,
            _ => return None,
        })
    }

    /// The GGUF type of this format (`from_ggml`'s inverse).
    pub(crate) fn ggml(self) -> crate::gguf::GgmlType {
        use crate::gguf::GgmlType as G;
        match self {
            Fmt::Q4_0 => G::Q4_0,
            Fmt::Q4_1 => G::Q4_1,
            Fmt::Q5_0 => G::Q5_0,
            Fmt::Q5_1 => G::Q5_1,
            Fmt::Q8_0 => G::Q8_0,
            Fmt::Q2K => G::Q2_K,
            Fmt::Q3K => G::Q3_K,
            Fmt::Q4K => G::Q4_K,
            Fmt::Q5K => G::Q5_K,
            Fmt::Q6K => G::Q6_K,
            Fmt::F16 => G::F16,
            Fmt::BF16 => G::BF16,
        }
    }

    /// `(elements, bytes)` per block.
    pub(crate) fn block(self) -> (usize, usize) {
        match self {
            Fmt::Q4_0 => (QK, 18),
            Fmt::Q4_1 => (QK, 20),
            Fmt::Q5_0 => (QK, 22),
            Fmt::Q5_1 => (QK, 24),
            Fmt::Q8_0 => (QK, 34),
            Fmt::Q2K => (QK_K, 84),
            Fmt::Q3K => (QK_K, 110),
            Fmt::Q4K => (QK_K, 144),
            Fmt::Q5K => (QK_K, 176),
            Fmt::Q6K => (QK_K, 210),
            Fmt::F16 | Fmt::BF16 => (1, 2),
        }
    }

    pub(crate) fn acts(self) -> ActKind {
        match self {
            Fmt::Q4_0 | Fmt::Q4_1 | Fmt::Q5_0 | Fmt::Q5_1 | Fmt::Q8_0 => ActKind::B32,
            Fmt::Q2K | Fmt::Q3K | Fmt::Q4K | Fmt::Q5K | Fmt::Q6K => ActKind::K256,
            Fmt::F16 | Fmt::BF16 => ActKind::F32,
        }
    }

    pub(crate) fn row_bytes(self, cols: usize) -> usize {
        let (e, b) = self.block();
        cols / e * b
    }

    /// Whether a tensor of `rows` rows takes the *chain* numerics (see the
    /// module INVARIANT): the types ggml repacks, when it can.
    pub(crate) fn chain(self, rows: usize) -> bool {
        matches!(self, Fmt::Q4_0 | Fmt::Q4K | Fmt::Q2K) && rows.is_multiple_of(8)
    }
}

/// A GGUF matrix: the file's blocks, rows interleaved block by block in
/// groups of [`RowMat::group`] rows (the bytes and their count unchanged,
/// only their order), so that a kernel reading a group's rows together
/// reads one stream, as ggml's repacked `q4_K_8x8` layout does; Q4_1, Q5_0,
/// Q5_1 and Q8_0 rows of an even block count hold their blocks in pairs
/// ([`RowMat::pairs`]).
#[derive(Debug)]
pub(crate) struct RowMat {
    pub(crate) fmt: Fmt,
    pub(crate) chain: bool,
    /// Q4_1, Q5_0, Q5_1 and Q8_0 blocks stored two by two within each row,
    /// both scales first ([`pair_blocks`]): the AVX2 decode converts and
    /// scales both with one instruction each, and decodes a Q5_0/Q5_1 pair with whole
    /// registers (one 32-byte load of nibbles, the high bits from one
    /// broadcast with no shuffle). The values are the file's.
    pairs: bool,
    /// Group `g` (rows `G·g ..`, `gs = min(G, rows − G·g)` of them) holds
    /// block 0 of each of its rows, then block 1 of each, …
    data: Vec<u8>,
    pub(crate) row_bytes: usize,
    rows: usize,
    /// Rows per group: 8 for chain Q4_K and Q4_0 and, on AVX-512, for Q6_K
    /// whose rows come in eights (`q4k_dec8`, `q4_0_decode` and
    /// `q6k_dec8_512` read eight rows at once: one stream, not eight),
    /// else 1 (plain rows).
    group: usize,
    /// Bytes per block.
    bb: usize,
}

/// Bytes of a pair of Q5_0 blocks.
pub(crate) const Q5_PAIR: usize = 44;
/// Bytes of a pair of Q8_0 blocks.
pub(crate) const Q8_PAIR: usize = 68;
/// Bytes of a pair of Q4_1 blocks.
pub(crate) const Q4_1_PAIR: usize = 40;
/// Bytes of a pair of Q5_1 blocks.
pub(crate) const Q5_1_PAIR: usize = 48;

/// Whether rows of `fmt` with `nb` blocks are stored in pairs.
fn paired(fmt: Fmt, nb: usize) -> bool {
    matches!(fmt, Fmt::Q4_1 | Fmt::Q5_0 | Fmt::Q5_1 | Fmt::Q8_0) && nb.is_multiple_of(2)
}

/// Two blocks `a ‖ b` as the file stores them into their pair form
/// (`file` and `pair` of two blocks' bytes).
///
/// Q8_0 (34 bytes a block: `d`, 32 `qs`): `d_a d_b qs_a qs_b`.
///
/// Q4_1 (20 bytes: `d`, `m`, 16 `qs`): `d_a d_b m_a m_b qs_a qs_b`.
///
/// Q5_0 (22 bytes: `d`, `qh`, `qs`): `d_a d_b`, eight bytes of high bits,
/// `qs_a qs_b`. Bit `j` of block a's `qh` (the high bit of value `j`) goes
/// to bit `4 + j / 8` of byte `j % 8`, block b's to bit `j / 8` of the same
/// byte: byte `j` of a register holding the eight bytes four times then
/// needs only a mask to isolate the bit of value `j` (`avx2::q5_high_of`).
///
/// Q5_1 (24 bytes: `d`, `m`, `qh`, `qs`): `d_a d_b m_a m_b`, the high bits
/// as Q5_0's, `qs_a qs_b`.
pub(crate) fn pair_blocks(fmt: Fmt, file: &[u8], pair: &mut [u8]) {
    let bb = fmt.block().1;
    assert!(file.len() == 2 * bb && pair.len() == 2 * bb, "a pair of {fmt:?} blocks");
    let (a, b) = file.split_at(bb);
    pair[..2].copy_from_slice(&a[..2]);
    pair[2..4].copy_from_slice(&b[..2]);
    if fmt == Fmt::Q4_1 {
        pair[4..6].copy_from_slice(&a[2..4]);
        pair[6..8].copy_from_slice(&b[2..4]);
        pair[8..24].copy_from_slice(&a[4..20]);
        pair[24..40].copy_from_slice(&b[4..20]);
        return;
    }
    if fmt == Fmt::Q8_0 {
        pair[4..36].copy_from_slice(&a[2..34]);
        pair[36..68].copy_from_slice(&b[2..34]);
        return;
    }
    // Q5_0 and Q5_1: the high bits from `h`, the nibbles from `h + 4`.
    let (h, at) = if fmt == Fmt::Q5_1 {
        pair[4..6].copy_from_slice(&a[2..4]);
        pair[6..8].copy_from_slice(&b[2..4]);
        (4, 8)
    } else {
        (2, 4)
    };
    let qh = |blk: &[u8]| u32::from_le_bytes([blk[h], blk[h + 1], blk[h + 2], blk[h + 3]]);
    let (ha, hb) = (qh(a), qh(b));
    for (k, o) in pair[at..at + 8].iter_mut().enumerate() {
        *o = (0..4)
            .map(|q| (((ha >> (8 * q + k)) & 1) << (4 + q)) | (((hb >> (8 * q + k)) & 1) << q))
            .fold(0u32, |x, y| x | y) as u8;
    }
    pair[at + 8..at + 24].copy_from_slice(&a[h + 4..h + 20]);
    pair[at + 24..at + 40].copy_from_slice(&b[h + 4..h + 20]);
}

/// The inverse of [`pair_blocks`].
pub(crate) fn unpair_blocks(fmt: Fmt, pair: &[u8], file: &mut [u8]) {
    let bb = fmt.block().1;
    assert!(file.len() == 2 * bb && pair.len() == 2 * bb, "a pair of {fmt:?} blocks");
    file[..2].copy_from_slice(&pair[..2]);
    file[bb..bb + 2].copy_from_slice(&pair[2..4]);
    if fmt == Fmt::Q4_1 {
        file[2..4].copy_from_slice(&pair[4..6]);
        file[22..24].copy_from_slice(&pair[6..8]);
        file[4..20].copy_from_slice(&pair[8..24]);
        file[24..40].copy_from_slice(&pair[24..40]);
        return;
    }
    if fmt == Fmt::Q8_0 {
        file[2..34].copy_from_slice(&pair[4..36]);
        file[36..68].copy_from_slice(&pair[36..68]);
        return;
    }
    let (h, at) = if fmt == Fmt::Q5_1 {
        file[2..4].copy_from_slice(&pair[4..6]);
        file[bb + 2..bb + 4].copy_from_slice(&pair[6..8]);
        (4, 8)
    } else {
        (2, 4)
    };
    let (mut ha, mut hb) = (0u32, 0u32);
    for (k, &v) in pair[at..at + 8].iter().enumerate() {
        for q in 0..4 {
            ha |= ((v as u32 >> (4 + q)) & 1) << (8 * q + k);
            hb |= ((v as u32 >> q) & 1) << (8 * q + k);
        }
    }
    file[h..h + 4].copy_from_slice(&ha.to_le_bytes());
    file[h + 4..h + 20].copy_from_slice(&pair[at + 8..at + 24]);
    file[bb + h..bb + h + 4].copy_from_slice(&hb.to_le_bytes());
    file[bb + h + 4..bb + h + 20].copy_from_slice(&pair[at + 24..at + 40]);
}

/// Where a run of rows lies in a [`RowMat`]: block `b` of row `r0 + r` is
/// at `base + r·row + b·block`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At {
    pub(crate) base: usize,
    pub(crate) row: usize,
    pub(crate) block: usize,
}

impl RowMat {
    /// The file's row-major bytes of a `rows` × `cols` matrix, regrouped.
    pub(crate) fn new(fmt: Fmt, mut data: Vec<u8>, rows: usize, cols: usize) -> RowMat {
        let row_bytes = fmt.row_bytes(cols);
        let chain = fmt.chain(rows);
        // Q6_K rows are read eight at a time by the AVX-512 decode alone;
        // the AVX2 kernels read them one by one, which a grouped layout
        // turns into strided reads (half the speed on a 1B file).
        let q6k8 =
            fmt == Fmt::Q6K && rows.is_multiple_of(8) && super::isa() == super::Isa::Avx512Vnni;
        let group = if chain || q6k8 { 8 } else { 1 };
        let bb = fmt.block().1;
        assert!(data.len() >= rows * row_bytes, "{} bytes for {rows} rows", data.len());
        let pairs = paired(fmt, row_bytes / bb);
        if pairs {
            let mut file = [0u8; Q8_PAIR];
            for pair in data[..rows * row_bytes].chunks_exact_mut(2 * bb) {
                file[..2 * bb].copy_from_slice(pair);
                pair_blocks(fmt, &file[..2 * bb], pair);
            }
        }
        if group > 1 {
            // One group at a time through a group-sized buffer: no second
            // copy of the matrix.
            let mut tmp = vec![0u8; group * row_bytes];
            for g0 in (0..rows).step_by(group) {
                let gs = group.min(rows - g0);
                let chunk = &mut data[g0 * row_bytes..(g0 + gs) * row_bytes];
                tmp[..chunk.len()].copy_from_slice(chunk);
                for r in 0..gs {
                    for b in 0..row_bytes / bb {
                        let from = r * row_bytes + b * bb;
                        let to = (b * gs + r) * bb;
                        chunk[to..to + bb].copy_from_slice(&tmp[from..from + bb]);
                    }
                }
            }
        }
        RowMat { fmt, chain, pairs, data, row_bytes, rows, group, bb }
    }

    /// Whether blocks are stored in pairs (see [`RowMat`]).
    pub(crate) fn pairs(&self) -> bool {
        self.pairs
    }

    /// Rows per group (see [`RowMat`]).
    pub(crate) fn group(&self) -> usize {
        self.group
    }

    /// The bytes, in the grouped order.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Where rows `r0 .. r0 + n` lie: every block of them is within
    /// [`RowMat::bytes`]. Asserts that the rows exist and, when grouped,
    /// lie in one group.
    #[inline(always)]
    pub(crate) fn at(&self, r0: usize, n: usize) -> At {
        assert!(n >= 1 && r0 + n <= self.rows, "rows {r0}..{} of {}", r0 + n, self.rows);
        if self.group == 1 {
            return At { base: r0 * self.row_bytes, row: self.row_bytes, block: self.bb };
        }
        let g0 = r0 / self.group * self.group;
        let gs = self.group.min(self.rows - g0);
        assert!(r0 + n <= g0 + gs, "rows {r0}..{} across a group of {}", r0 + n, self.group);
        At { base: g0 * self.row_bytes + (r0 - g0) * self.bb, row: self.bb, block: gs * self.bb }
    }

    /// Rows `rows` as the file stores them: borrowed where the matrix keeps
    /// them so, else copied out of its layout (the f16/bf16 kernels, which
    /// widen them in registers).
    pub(crate) fn stored_rows(
        &self,
        rows: std::ops::Range<usize>,
    ) -> Vec<std::borrow::Cow<'_, [u8]>> {
        let mut buf = Vec::new();
        rows.map(|r| match self.direct_row(r) {
            Some(row) => std::borrow::Cow::Borrowed(row),
            None => std::borrow::Cow::Owned(self.row(r, &mut buf).to_vec()),
        })
        .collect()
    }

    /// Row `r` in the file's order (for the portable kernels and lookups).
    /// Row `r` as the file stores it, when the matrix keeps it so (no
    /// pairing or grouping of blocks).
    pub(crate) fn direct_row(&self, r: usize) -> Option<&[u8]> {
        (!self.pairs && self.group == 1)
            .then(|| &self.data[r * self.row_bytes..(r + 1) * self.row_bytes])
    }

    pub(crate) fn row<'a>(&'a self, r: usize, buf: &'a mut Vec<u8>) -> &'a [u8] {
        if self.pairs {
            buf.clear();
            let mut file = [0u8; Q8_PAIR];
            let pb = 2 * self.bb;
            for pair in self.data[r * self.row_bytes..(r + 1) * self.row_bytes].chunks_exact(pb) {
                unpair_blocks(self.fmt, pair, &mut file[..pb]);
                buf.extend_from_slice(&file[..pb]);
            }
            return buf;
        }
        if self.group == 1 {
            return &self.data[r * self.row_bytes..(r + 1) * self.row_bytes];
        }
        let at = self.at(r, 1);
        buf.clear();
        for b in 0..self.row_bytes / self.bb {
            let o = at.base + b * at.block;
            buf.extend_from_slice(&self.data[o..o + self.bb]);
        }
        buf
    }
}

/// Columns per cache block: their activations stay in L2 while every row of
/// a task passes over them.
pub(crate) const COL_BLOCK: usize = 64;

/// Bytes of weight rows (as met: f16 or f32) [`float_tiles`] keeps in the
/// second-level cache while every group of columns passes over them.
#[cfg(target_arch = "x86_64")]
const BLOCK_BYTES: usize = 512 * 1024;

/// [`matmul`] of f16 and bf16 rows on AVX-512: blocks of rows of about
/// [`BLOCK_BYTES`] (f16 as stored, converted in registers; bf16 converted
/// to f32 once per block), each met by every group of six columns in turn
/// (`x86::dot16_panel`), with `scalar::dot_f32`'s numbers. (f16 blocks
/// converted to f32 once were slower: twice the bytes from the
/// second-level cache outweigh the conversions.)
///
/// A task's rows are megabytes on a 1B file: met whole by each group of
/// six columns they came from memory every time (prompts ran at 0.9× of
/// llama.cpp's); a block stays in the second-level cache for all of them.
///
/// # Safety
/// The CPU must support AVX-512F; as [`matmul`].
#[cfg(target_arch = "x86_64")]
unsafe fn float_tiles(
    w: &RowMat,
    acts: &super::Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    use super::x86::{Rows16, TILE16_COLS, TILE16_ROWS};
    let k = acts.k;
    let xs = if w.fmt == Fmt::F16 { &acts.xh } else { &acts.x };
    let nr = rows.len();
    // The same values either way: f16 and bf16 are exact in f32.
    let in_registers = w.fmt == Fmt::F16;
    let raw = if in_registers { w.stored_rows(rows.clone()) } else { Vec::new() };
    let row_bytes = if in_registers { 2 * k } else { 4 * k };
    let block = (BLOCK_BYTES / row_bytes.max(1)).max(1).next_multiple_of(TILE16_ROWS);
    let (mut rowbuf, mut wf) = (Vec::new(), Vec::new());
    for b0 in (0..nr).step_by(block) {
        let b1 = (b0 + block).min(nr);
        // Missing rows of an edge group repeat the group's first.
        let pick = |g0: usize, i: usize| if g0 + i < b1 { g0 + i } else { g0 };
        let groups = if in_registers {
            Rows16::F16(
                (b0..b1)
                    .step_by(TILE16_ROWS)
                    .map(|g0| std::array::from_fn(|i| &*raw[pick(g0, i)]))
                    .collect(),
            )
        } else {
            wf.resize((b1 - b0) * k, 0.0);
            for (i, r) in (b0..b1).enumerate() {
                let row = w.row(rows.start + r, &mut rowbuf);
                crate::quant::dequantize_row(w.fmt.ggml(), row, &mut wf[i * k..(i + 1) * k]);
            }
            let wf = &wf;
            Rows16::F32(
                (b0..b1)
                    .step_by(TILE16_ROWS)
                    .map(|g0| {
                        std::array::from_fn(|i| {
                            let r = pick(g0, i) - b0;
                            &wf[r * k..(r + 1) * k]
                        })
                    })
                    .collect(),
            )
        };
        for c0 in (0..acts.n).step_by(TILE16_COLS) {
            let c1 = (c0 + TILE16_COLS).min(acts.n);
            // Missing columns of an edge tile repeat the first.
            let cols: [&[f32]; TILE16_COLS] = std::array::from_fn(|j| {
                let c = if c0 + j < c1 { c0 + j } else { c0 };
                &xs[c * k..(c + 1) * k]
            });
            // SAFETY: AVX-512 and F16C (the caller's); every row holds k
            // values (halves as stored, or f32) and every column k values.
            unsafe {
                super::x86::dot16_panel(&groups, &cols, k, |g, tile| {
                    let g0 = b0 + g * TILE16_ROWS;
                    let n = (b1 - g0).min(TILE16_ROWS);
                    for (j, c) in (c0..c1).enumerate() {
                        let run: [f32; TILE16_ROWS] = std::array::from_fn(|i| tile[i][j]);
                        // SAFETY: rows `rows.start + g0 ..` (n of them) are
                        // in `rows`, which this call owns.
                        out.set_run(c, rows.start + g0, &run[..n]);
                    }
                })
            };
        }
    }
}

/// `out[c · rows + r]` for rows `rows` and all columns, on the portable path.
///
/// # Safety
/// No other thread reads or writes rows `rows` of `out` during the call
/// (threads sharing `out` own disjoint rows).
pub(crate) unsafe fn matmul(
    w: &RowMat,
    acts: &super::Acts,
    rows: std::ops::Range<usize>,
    out: &OutRows<'_>,
) {
    #[cfg(target_arch = "x86_64")]
    if matches!(w.fmt, Fmt::F16 | Fmt::BF16) && super::isa() == super::Isa::Avx512Vnni {
        // SAFETY: the CPU has AVX-512 (`isa`); the caller's contract.
        unsafe { float_tiles(w, acts, rows, out) };
        return;
    }
    let mut wf = Vec::new();
    let mut rowbuf = Vec::new();
    for c0 in (0..acts.n).step_by(COL_BLOCK) {
        let c1 = (c0 + COL_BLOCK).min(acts.n);
        for r in rows.clone() {
            let row = w.row(r, &mut rowbuf);
            if matches!(w.fmt, Fmt::F16 | Fmt::BF16) {
                wf.resize(acts.k, 0.0);
                crate::quant::dequantize_row(w.fmt.ggml(), row, &mut wf);
            }
            for c in c0..c1 {
                let v = match w.fmt {
                    // ggml meets f16 weights with activations rounded to
                    // f16 (`Acts::xh`), then tinyBLAS's 16-lane sums.
                    Fmt::F16 => super::scalar::dot_f32(&wf, &acts.xh[c * acts.k..(c + 1) * acts.k]),
                    Fmt::BF16 => super::scalar::dot_f32(&wf, &acts.x[c * acts.k..(c + 1) * acts.k]),
                    _ => dot(w.fmt, w.chain, row, acts, c),
                };
                // SAFETY: `r` is in `rows`, which this call owns.
                unsafe { out.set(c, r, v) };
            }
        }
    }
}

/// One row against column `c`: the canonical numbers.
pub(crate) fn dot(fmt: Fmt, chain: bool, row: &[u8], acts: &super::Acts, c: usize) -> f32 {
    let k = acts.k;
    match fmt {
        Fmt::Q4_0 | Fmt::Q5_0 | Fmt::Q8_0 | Fmt::Q4_1 | Fmt::Q5_1 => {
            let nb = k / QK;
            let (aq, ad, asum) = (&acts.q[c * k..], &acts.d[c * nb..], &acts.s[c * nb..]);
            let bb = fmt.block().1;
            let mut lanes = [0f32; 8];
            let (mut acc, mut summs) = (0f32, 0f32);
            for b in 0..nb {
                let blk = &row[b * bb..(b + 1) * bb];
                let mut w = [0i32; QK];
                b32_values(fmt, blk, &mut w);
                let a = &aq[b * QK..(b + 1) * QK];
                let dw = f16_at(blk, 0);
                if chain {
                    let isum: i32 = (0..QK).map(|e| w[e] * a[e] as i32).sum();
                    acc = (isum as f32).mul_add(dw * ad[b], acc);
                    continue;
                }
                let dd = dw * ad[b];
                for (l, lane) in lanes.iter_mut().enumerate() {
                    let s: i32 = (4 * l..4 * l + 4).map(|e| w[e] * a[e] as i32).sum();
                    *lane = dd.mul_add(s as f32, *lane);
                }
                if matches!(fmt, Fmt::Q4_1 | Fmt::Q5_1) {
                    summs = f16_at(blk, 2).mul_add(asum[b], summs);
                }
            }
            if chain {
                acc
            } else {
                hsum8(&lanes) + summs
            }
        }
        Fmt::Q2K => {
            // Always the chain numbers of ggml's repacked `q2_K_8x8` (the
            // loader keeps only Q2_K tensors whose rows come in eights):
            // one exact integer per super-block (its gemv) or per 128
            // values (its gemm, for a column it grouped), `fma(isum, d ·
            // d_a)`, and the minimums' `fma(Σ m · bsum, dmin · d_a)` into a
            // second accumulator, subtracted at the end.
            let nb = k / QK_K;
            let (aq, ad, abs) = (&acts.kq[c * k..], &acts.kd[c * nb..], &acts.kbs[c * nb * 16..]);
            let (mut acc, mut accm) = (0f32, 0f32);
            let steps = if acts.grouped(c) { 2 } else { 1 };
            for b in 0..nb {
                let blk = &row[b * 84..(b + 1) * 84];
                let a = &aq[b * QK_K..(b + 1) * QK_K];
                let bs = &abs[b * 16..(b + 1) * 16];
                let (w, sc, mn) = q2k_values(blk);
                let (dw, dmin, da) = (f16_at(blk, 80), f16_at(blk, 82), ad[b]);
                for st in 0..steps {
                    let subs = st * 16 / steps..(st + 1) * 16 / steps;
                    let isum: i32 = subs
                        .clone()
                        .map(|s| {
                            sc[s] * (16 * s..16 * s + 16).map(|e| w[e] * a[e] as i32).sum::<i32>()
                        })
                        .sum();
                    let imin: i32 = subs.map(|s| mn[s] * bs[s] as i32).sum();
                    acc = (isum as f32).mul_add(dw * da, acc);
                    accm = (imin as f32).mul_add(dmin * da, accm);
                }
            }
            acc - accm
        }
        Fmt::Q3K | Fmt::Q4K | Fmt::Q5K | Fmt::Q6K => {
            let nb = k / QK_K;
            let (aq, ad, abs) = (&acts.kq[c * k..], &acts.kd[c * nb..], &acts.kbs[c * nb * 16..]);
            let bb = fmt.block().1;
            let mut lanes = [0f32; 8];
            let mut mins4 = [0f32; 4];
            let (mut acc, mut accm, mut summs) = (0f32, 0f32, 0f32);
            for b in 0..nb {
                let blk = &row[b * bb..(b + 1) * bb];
                let a = &aq[b * QK_K..(b + 1) * QK_K];
                let bs = &abs[b * 16..(b + 1) * 16];
                let da = ad[b];
                let mut w = [0i32; QK_K];
                let mut sc = [0i32; 16];
                let mut mn = [0i32; 8];
                k_values(fmt, blk, &mut w, &mut sc, &mut mn);
                let dw = f16_at(
                    blk,
                    match fmt {
                        Fmt::Q6K => 208,
                        Fmt::Q3K => 108,
                        _ => 0,
                    },
                );
                // Integer lanes: lane l of chunk ch (32 values) is values
                // 32·ch + 4l .. + 4, scaled by their sub-block's scale.
                let per = if matches!(fmt, Fmt::Q6K | Fmt::Q3K) { 16 } else { 32 };
                let mut il = [0i32; 8];
                for ch in 0..8 {
                    for (l, v) in il.iter_mut().enumerate() {
                        let e0 = 32 * ch + 4 * l;
                        let s: i32 = (e0..e0 + 4).map(|e| w[e] * a[e] as i32).sum();
                        *v += sc[e0 / per] * s;
                    }
                }
                match fmt {
                    Fmt::Q4K if chain => {
                        // One step per super-block (ggml's gemv), or per 64
                        // values for a column ggml grouped (its gemm).
                        let steps = if acts.grouped(c) { 4 } else { 1 };
                        let per_step = 8 / steps;
                        for st in 0..steps {
                            let subs = st * per_step..(st + 1) * per_step;
                            let isum: i32 = subs
                                .clone()
                                .map(|sb| {
                                    (0..32)
                                        .map(|e| w[32 * sb + e] * a[32 * sb + e] as i32)
                                        .sum::<i32>()
                                        * sc[sb]
                                })
                                .sum();
                            let imin: i32 =
                                subs.map(|sb| mn[sb] * (bs[2 * sb] + bs[2 * sb + 1]) as i32).sum();
                            acc = (isum as f32).mul_add(dw * da, acc);
                            accm = (imin as f32).mul_add(f16_at(blk, 2) * da, accm);
                        }
                    }
                    _ if acts.wide(c) => {
                        // ggml's tiled K-quant kernel: one exact integer per
                        // super-block, `d·s1 − dmin·s2` fused, then one
                        // fused multiply-add by the activation scale.
                        let mut s1: i32 = il.iter().sum();
                        let mut res;
                        if fmt == Fmt::Q3K {
                            // Signed values already (ggml's act-bias of 4
                            // on the unsigned codes is the same integer).
                            res = dw * s1 as f32;
                        } else if fmt == Fmt::Q6K {
                            s1 -= 32 * (0..16).map(|s| sc[s] * bs[s] as i32).sum::<i32>();
                            res = dw * s1 as f32;
                        } else {
                            let s2: i32 =
                                (0..8).map(|s| mn[s] * (bs[2 * s] + bs[2 * s + 1]) as i32).sum();
                            res = dw * s1 as f32;
                            res = (-f16_at(blk, 2)).mul_add(s2 as f32, res);
                        }
                        acc = res.mul_add(da, acc);
                    }
                    Fmt::Q4K | Fmt::Q5K => {
                        let d = da * dw;
                        for (lane, &v) in lanes.iter_mut().zip(&il) {
                            *lane = d.mul_add(v as f32, *lane);
                        }
                        let dmin = -da * f16_at(blk, 2);
                        let q8s: [i32; 8] =
                            std::array::from_fn(|s| (bs[2 * s] + bs[2 * s + 1]) as i32);
                        if fmt == Fmt::Q4K {
                            for (m, acc_m) in mins4.iter_mut().enumerate() {
                                let p = mn[2 * m] * q8s[2 * m] + mn[2 * m + 1] * q8s[2 * m + 1];
                                *acc_m = dmin.mul_add(p as f32, *acc_m);
                            }
                        } else {
                            let imin: i32 = (0..8).map(|s| mn[s] * q8s[s]).sum();
                            summs = dmin.mul_add(imin as f32, summs);
                        }
                    }
                    Fmt::Q3K => {
                        // ggml's AVX2 `vec_dot_q3_K`: each lane's exact
                        // integer (signed values), `fma(d_a·d, lane, acc)`.
                        let d = da * dw;
                        for (lane, &v) in lanes.iter_mut().zip(&il) {
                            *lane = d.mul_add(v as f32, *lane);
                        }
                    }
                    _ => {
                        // Q6K: the −32 offset of every value, per lane.
                        let d = da * dw;
                        for (l, lane) in lanes.iter_mut().enumerate() {
                            let corr = 32
                                * (bs[2 * l] as i32 * sc[2 * l]
                                    + bs[2 * l + 1] as i32 * sc[2 * l + 1]);
                            *lane = d.mul_add((il[l] - corr) as f32, *lane);
                        }
                    }
                }
            }
            match fmt {
                _ if acts.wide(c) && !(fmt == Fmt::Q4K && chain) => acc,
                Fmt::Q4K if chain => acc - accm,
                Fmt::Q4K => hsum8(&lanes) + ((mins4[0] + mins4[2]) + (mins4[1] + mins4[3])),
                Fmt::Q5K => hsum8(&lanes) + summs,
                _ => hsum8(&lanes),
            }
        }
        Fmt::F16 | Fmt::BF16 => unreachable!("f16/bf16 rows are dequantized by `matmul`"),
    }
}

/// The 32 integer values of a block of 32 (Q4_0/Q5_0 signed, Q4_1/Q5_1
/// unsigned, as the kernels multiply them).
#[inline]
pub(crate) fn b32_values(fmt: Fmt, blk: &[u8], w: &mut [i32; QK]) {
    match fmt {
        Fmt::Q8_0 => {
            for (o, &b) in w.iter_mut().zip(&blk[2..34]) {
                *o = b as i8 as i32;
            }
        }
        Fmt::Q4_0 | Fmt::Q4_1 => {
            let (qs, off) = if fmt == Fmt::Q4_0 { (&blk[2..18], 8) } else { (&blk[4..20], 0) };
            for j in 0..16 {
                w[j] = (qs[j] & 15) as i32 - off;
                w[j + 16] = (qs[j] >> 4) as i32 - off;
            }
        }
        _ => {
            let (h, off) = if fmt == Fmt::Q5_0 { (2, 16) } else { (4, 0) };
            let qh = u32::from_le_bytes([blk[h], blk[h + 1], blk[h + 2], blk[h + 3]]);
            let qs = &blk[h + 4..h + 20];
            for j in 0..16 {
                w[j] = ((qs[j] & 15) as i32 | (((qh >> j) & 1) << 4) as i32) - off;
                w[j + 16] = ((qs[j] >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32) - off;
            }
        }
    }
}

/// A K-quant super-block's 256 unsigned values, its scales (Q4_K/Q5_K: 8
/// per 32 values; Q6_K: 16 signed, per 16) and its minimums (Q4_K/Q5_K).
#[inline]
/// A Q2_K block's 256 values (0 ..= 3: value e = 128h + 32g + l is bits
/// 2g, 2g + 1 of byte 32h + l of `qs`, at 16), and its sixteen sub-block
/// scales and minimums (the low and high nibbles of its first 16 bytes).
pub(crate) fn q2k_values(blk: &[u8]) -> ([i32; QK_K], [i32; 16], [i32; 16]) {
    let qs = &blk[16..80];
    let w = std::array::from_fn(|e| {
        let (h, g, l) = (e / 128, e % 128 / 32, e % 32);
        ((qs[32 * h + l] >> (2 * g)) & 3) as i32
    });
    (
        w,
        std::array::from_fn(|s| (blk[s] & 15) as i32),
        std::array::from_fn(|s| (blk[s] >> 4) as i32),
    )
}

/// A Q3_K block's sixteen sub-block scales (6 bits each, packed in its 12
/// bytes at 96), less 32, as ggml unpacks them.
pub(crate) fn q3k_scales(blk: &[u8]) -> [i32; 16] {
    const KM1: u32 = 0x0303_0303;
    const KM2: u32 = 0x0f0f_0f0f;
    let w = |i: usize| u32::from_le_bytes(blk[96 + 4 * i..100 + 4 * i].try_into().unwrap());
    let (a0, a1, t) = (w(0), w(1), w(2));
    let aux = [
        (a0 & KM2) | ((t & KM1) << 4),
        (a1 & KM2) | (((t >> 2) & KM1) << 4),
        ((a0 >> 4) & KM2) | (((t >> 4) & KM1) << 4),
        ((a1 >> 4) & KM2) | (((t >> 6) & KM1) << 4),
    ];
    std::array::from_fn(|s| (aux[s / 4] >> (8 * (s % 4))) as u8 as i32 - 32)
}

pub(crate) fn k_values(
    fmt: Fmt,
    blk: &[u8],
    w: &mut [i32; QK_K],
    sc: &mut [i32; 16],
    mn: &mut [i32; 8],
) {
    match fmt {
        Fmt::Q3K => {
            *sc = q3k_scales(blk);
            let (hm, qs) = (&blk[0..32], &blk[32..96]);
            for h in 0..2 {
                for g in 0..4 {
                    for l in 0..32 {
                        let low = ((qs[32 * h + l] >> (2 * g)) & 3) as i32;
                        let high = (hm[l] >> (4 * h + g)) & 1;
                        w[128 * h + 32 * g + l] = low - if high == 0 { 4 } else { 0 };
                    }
                }
            }
        }
        Fmt::Q6K => {
            let (ql, qh) = (&blk[0..128], &blk[128..192]);
            for (s, &v) in sc.iter_mut().zip(&blk[192..208]) {
                *s = v as i8 as i32;
            }
            for h in 0..2 {
                for l in 0..32 {
                    let (a, b, hb) = (ql[64 * h + l], ql[64 * h + 32 + l], qh[32 * h + l]);
                    w[128 * h + l] = ((a & 15) | ((hb & 3) << 4)) as i32;
                    w[128 * h + 32 + l] = ((b & 15) | (((hb >> 2) & 3) << 4)) as i32;
                    w[128 * h + 64 + l] = ((a >> 4) | (((hb >> 4) & 3) << 4)) as i32;
                    w[128 * h + 96 + l] = ((b >> 4) | (((hb >> 6) & 3) << 4)) as i32;
                }
            }
        }
        _ => {
            let five = fmt == Fmt::Q5K;
            for s in 0..8 {
                let (a, m) = scale_min_k4(s, &blk[4..16]);
                sc[s] = a as i32;
                mn[s] = m as i32;
            }
            let (qh, qs) =
                if five { (&blk[16..48], &blk[48..176]) } else { (&blk[0..0], &blk[16..144]) };
            for j in 0..4 {
                for l in 0..32 {
                    let q = qs[32 * j + l];
                    let (mut lo, mut hi) = ((q & 15) as i32, (q >> 4) as i32);
                    if five {
                        lo |= (((qh[l] >> (2 * j)) & 1) << 4) as i32;
                        hi |= (((qh[l] >> (2 * j + 1)) & 1) << 4) as i32;
                    }
                    w[64 * j + l] = lo;
                    w[64 * j + 32 + l] = hi;
                }
            }
        }
    }
}
