//! Matrix kernels of the fast CPU path: quantized weights (as GGUF stores
//! them, or packed for AVX-512), activations quantized per column, and the
//! products of the two.
//!
//! INVARIANT: every (row, column) result is computed in one canonical order —
//! llama.cpp's for that tensor type (`rows.rs` says which, per format). The
//! portable, AVX2 and AVX-512 paths, decode (one column) and prompt (many
//! columns) all give bit-identical numbers, so reusing a cached prefix, or
//! batching sequences together, cannot change greedy output.
//!
//! Formats and paths: every format runs row-major on the portable path and
//! on AVX2 (`rows.rs`, `avx2.rs`); on CPUs with AVX-512 VNNI, Q4_1 and Q8_0
//! are packed in row tiles for the AVX-512 kernels (`x86.rs`, `scalar.rs`),
//! and prompts of row-major Q4_K, Q5_K, Q6_K, Q5_0 and chain Q4_0 run
//! `wide512.rs`.
//! AMX is never used: some of these machines report it in cpuid, but its
//! first instruction dies with SIGILL.

pub(crate) mod attn;
#[cfg(target_arch = "x86_64")]
mod avx2;
pub(crate) mod rows;
pub(crate) mod scalar;
#[cfg(target_arch = "x86_64")]
mod wide512;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::quant::{quantize_q8, Q8Row, Q4_1_BYTES, Q8_0_BYTES, QK, QK_K};
use rows::{ActKind, RowMat};

/// Columns from which a format's wide product (`avx2`'s `Kern::wide`) pays
/// for decoding its rows once into scratch; `Acts::qi` is laid out only
/// from here.
pub(crate) const WIDE_MIN: usize = 16;

/// Columns up to which `Acts::g16` is kept (decode steps, verified drafts,
/// a few sequences decoded together: the multi-column decode kernels).
pub(crate) const G16_COLS: usize = WIDE_MIN - 1;

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
    /// AVX2 with FMA and F16C.
    Avx2,
    /// Portable Rust; the compiler vectorises what it can.
    Scalar,
}

impl Isa {
    /// `avx512-vnni`, `avx2` or `scalar`.
    pub fn as_str(self) -> &'static str {
        match self {
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    /// Whether the AVX2 kernels run (AVX-512 machines have AVX2 too).
    pub(crate) fn avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512Vnni)
    }
}

/// The kernels in use: the best this CPU has, unless `AGENTD_KERNELS` says
/// `scalar` or `avx2` (for tests and comparisons).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let want = std::env::var("AGENTD_KERNELS").unwrap_or_default();
        if want == "scalar" {
            return Isa::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if want != "avx2" && x86::available() {
                return Isa::Avx512Vnni;
            }
            if avx2::available() {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    })
}

/// A zeroed buffer of `n` bytes for a weight matrix, asked to be backed by
/// huge pages (Linux `MADV_HUGEPAGE`, before its pages are first touched).
///
/// Every decode step streams every weight once: gigabytes a token on an 8B
/// file, and on 4 KiB pages a TLB miss and a page walk every 4 KiB. With
/// 2 MiB pages the 8B decode ran 12–15% faster on a 2-core Sapphire Rapids
/// (`BENCHMARKS.md`). Debian's default (`transparent_hugepage=madvise`)
/// gives huge pages only to memory that asks. The advice is a hint: without
/// THP, or if the call fails, the pages are ordinary and nothing else
/// changes. The reads that fill the buffer fault its pages in
/// (`gguf::read_at` splits a large one across threads).
pub(crate) fn weight_buffer(n: usize) -> Vec<u8> {
    let buf = vec![0u8; n];
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let p = buf.as_ptr() as usize;
        // The whole 2 MiB pages inside the buffer (madvise wants a page-aligned start).
        let (start, end) = (p.next_multiple_of(HUGE), (p + n) / HUGE * HUGE);
        if end > start {
            // SAFETY: the range lies inside `buf`, an allocation this function
            // owns and nothing else references yet; MADV_HUGEPAGE changes how
            // its pages are backed, never their contents or whether they are
            // mapped.
            let _ = unsafe {
                rustix::mm::madvise(
                    start as *mut std::ffi::c_void,
                    end - start,
                    rustix::mm::Advice::LinuxHugepage,
                )
            };
        }
    }
    buf
}

/// A weight matrix `[rows × cols]` for the kernels. Tile-packed kinds pad
/// rows to a multiple of [`ROW_TILE`] with zeros.
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
    /// GGUF rows as the file stores them (`rows.rs`).
    Rows(RowMat),
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
            let mut data = weight_buffer(tiles * nb * Q8_REC);
            for rec in data.chunks_exact_mut(Q8_REC) {
                rec[..128].fill(128);
            }
            PackedKind::Q8_0 { data }
        } else {
            PackedKind::Q4_1 { data: weight_buffer(tiles * nb * Q4_REC) }
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
            PackedKind::F32 { .. } | PackedKind::Rows(_) => {}
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

    /// GGUF rows of `fmt`, as the file stores them.
    pub(crate) fn rows(fmt: rows::Fmt, data: Vec<u8>, rows: usize, cols: usize) -> Packed {
        Packed { rows, cols, kind: PackedKind::Rows(RowMat::new(fmt, data, rows, cols)) }
    }

    /// Whether a GGUF Q4_1/Q8_0 tensor is tile-packed for the AVX-512
    /// kernels (rather than kept as rows).
    pub(crate) fn tiles_for(ty: crate::gguf::GgmlType) -> bool {
        isa() == Isa::Avx512Vnni
            && matches!(ty, crate::gguf::GgmlType::Q4_1 | crate::gguf::GgmlType::Q8_0)
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        match &self.kind {
            PackedKind::Q4_1 { data } | PackedKind::Q8_0 { data } => data.len(),
            PackedKind::F32 { w } => 4 * w.len(),
            PackedKind::Rows(m) => m.bytes().len(),
        }
    }

    /// Whether its numbers depend on llama.cpp's grouping of columns
    /// (`attn::Route::grouped`: repacked Q4_K), and on the width of the
    /// product (`attn::Route::wide`: Q6_K, Q5_K, Q4_K not repacked).
    pub(crate) fn route_matters(&self) -> (bool, bool) {
        match &self.kind {
            PackedKind::Rows(m) => (
                (m.fmt == rows::Fmt::Q4K && m.chain) || m.fmt == rows::Fmt::Q2K,
                matches!(m.fmt, rows::Fmt::Q6K | rows::Fmt::Q5K | rows::Fmt::Q3K)
                    || (m.fmt == rows::Fmt::Q4K && !m.chain),
            ),
            _ => (false, false),
        }
    }

    /// Which kernel runs this matrix (for `agentd bench --json`).
    pub(crate) fn kernel(&self) -> String {
        match &self.kind {
            PackedKind::Q4_1 { .. } | PackedKind::Q8_0 { .. } => {
                format!("{}-tiles", isa().as_str())
            }
            PackedKind::F32 { .. } => "f32".to_owned(),
            PackedKind::Rows(m) => {
                let float = matches!(m.fmt, rows::Fmt::F16 | rows::Fmt::BF16);
                let portable = m.fmt == rows::Fmt::Q4K && !m.chain;
                if float && isa() == Isa::Avx512Vnni {
                    // Decode on `avx2::float_matmul`, prompts on sixteen-lane
                    // registers (`rows::float_tiles`).
                    return "avx2-rows+avx512-prompt".to_owned();
                }
                let path = match isa() {
                    _ if isa().avx2() && !portable => "avx2",
                    _ => "scalar",
                };
                let wide = isa() == Isa::Avx512Vnni
                    && (matches!(
                        m.fmt,
                        rows::Fmt::Q3K
                            | rows::Fmt::Q4K
                            | rows::Fmt::Q5K
                            | rows::Fmt::Q6K
                            | rows::Fmt::Q5_0
                    ) || (m.fmt == rows::Fmt::Q4_0 && m.chain))
                    && !portable;
                if wide {
                    // Prompts on the AVX-512 VNNI kernels (`wide512.rs`).
                    format!("{path}-rows+avx512-vnni-wide")
                } else {
                    format!("{path}-rows")
                }
            }
        }
    }

    /// The activations the kernels of this matrix read.
    pub(crate) fn needs(&self) -> Needs {
        match &self.kind {
            PackedKind::Q4_1 { .. } => Needs { tile4: true, ..Needs::default() },
            PackedKind::Q8_0 { .. } => Needs { tile8: true, ..Needs::default() },
            PackedKind::F32 { .. } => Needs { f32: true, ..Needs::default() },
            PackedKind::Rows(m) => match m.fmt.acts() {
                ActKind::B32 => Needs {
                    b32: true,
                    g16: m.fmt == rows::Fmt::Q5_0,
                    // Chain Q4_0 prompts (`wide512::q4_0_in`, `avx2::q4_0_wide`)
                    // meet the nibbles unsigned, less `Acts::off8`.
                    off8: m.fmt == rows::Fmt::Q4_0 && m.chain && isa().avx2(),
                    // Q5_0 prompts on AVX-512 meet `Acts::nib` (`wide512.rs`).
                    tile4: m.fmt == rows::Fmt::Q5_0 && isa() == Isa::Avx512Vnni,
                    ..Needs::default()
                },
                ActKind::K256 => {
                    // The AVX-512 wide products (`wide512.rs`) read Q4_K/Q5_K
                    // minimums against `Acts::kb32` and Q6_K rows against the
                    // biased activations `Acts::kqu`.
                    let wide512 = isa() == Isa::Avx512Vnni;
                    let k32 = wide512
                        && (m.fmt == rows::Fmt::Q5K || (m.fmt == rows::Fmt::Q4K && m.chain));
                    Needs {
                        k256: true,
                        kbp: m.fmt == rows::Fmt::Q5K && !wide512,
                        k32,
                        ku: wide512 && matches!(m.fmt, rows::Fmt::Q6K | rows::Fmt::Q3K),
                        ..Needs::default()
                    }
                }
                ActKind::F32 if m.fmt == rows::Fmt::F16 => Needs { f16: true, ..Needs::default() },
                ActKind::F32 => Needs { f32: true, ..Needs::default() },
            },
        }
    }

    /// `out[c · rows + r] = row r · column c` for the rows in
    /// `tiles.start * ROW_TILE ..` (tiles of [`ROW_TILE`] rows), all columns.
    ///
    /// `out` holds `acts.n · self.rows` values; rows past `self.rows` are not
    /// written. Threads may share `out` when their tile ranges are disjoint.
    ///
    /// # Safety
    /// No other thread reads or writes the rows of `tiles` in `out` during
    /// the call.
    pub(crate) unsafe fn matmul_tiles(
        &self,
        acts: &Acts,
        tiles: std::ops::Range<usize>,
        out: &OutRows<'_>,
    ) {
        if let PackedKind::Rows(m) = &self.kind {
            let rows = tiles.start * ROW_TILE..(tiles.end * ROW_TILE).min(self.rows);
            #[cfg(target_arch = "x86_64")]
            if isa() == Isa::Avx512Vnni && acts.n >= WIDE_MIN {
                // SAFETY: `isa()` reports AVX-512 VNNI only after checking
                // every feature these kernels enable; the rows are this
                // call's (its contract).
                if unsafe { wide512::matmul(m, acts, rows.clone(), out) } {
                    return;
                }
            }
            #[cfg(target_arch = "x86_64")]
            if isa().avx2() {
                // SAFETY: `isa()` reports AVX2 only after checking that the
                // CPU has every feature the AVX2 kernels enable; the rows
                // are this call's (its contract).
                unsafe { avx2::matmul(m, acts, rows, out) };
                return;
            }
            // SAFETY: the rows of `tiles` are this call's (its contract).
            unsafe { rows::matmul(m, acts, rows, out) };
            return;
        }
        match isa() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                // SAFETY: `isa()` returned Avx512Vnni only after checking the
                // CPU supports every feature the kernels enable; the tiles
                // are this call's (its contract).
                unsafe { x86::matmul_tiles(self, acts, tiles, out) }
            }
            // Compiled for FMA where the CPU has it (an f32 router's
            // `mul_add`s are then instructions, not library calls).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                // SAFETY: `isa()` reports AVX2 only after checking for FMA
                // and F16C; the tiles are this call's (its contract).
                unsafe { scalar::matmul_tiles_fma(self, acts, tiles, out) }
            }
            // SAFETY: the tiles are this call's (its contract).
            _ => unsafe { scalar::matmul_tiles(self, acts, tiles, out) },
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
            PackedKind::Rows(m) => {
                let ty = match m.fmt {
                    rows::Fmt::Q4_0 => crate::gguf::GgmlType::Q4_0,
                    rows::Fmt::Q4_1 => crate::gguf::GgmlType::Q4_1,
                    rows::Fmt::Q5_0 => crate::gguf::GgmlType::Q5_0,
                    rows::Fmt::Q5_1 => crate::gguf::GgmlType::Q5_1,
                    rows::Fmt::Q8_0 => crate::gguf::GgmlType::Q8_0,
                    rows::Fmt::Q2K => crate::gguf::GgmlType::Q2_K,
                    rows::Fmt::Q3K => crate::gguf::GgmlType::Q3_K,
                    rows::Fmt::Q4K => crate::gguf::GgmlType::Q4_K,
                    rows::Fmt::Q5K => crate::gguf::GgmlType::Q5_K,
                    rows::Fmt::Q6K => crate::gguf::GgmlType::Q6_K,
                    rows::Fmt::F16 => crate::gguf::GgmlType::F16,
                    rows::Fmt::BF16 => crate::gguf::GgmlType::BF16,
                };
                let mut buf = Vec::new();
                crate::quant::dequantize_row(ty, m.row(r, &mut buf), out);
            }
        }
    }

    /// Number of row tiles.
    pub(crate) fn tiles(&self) -> usize {
        padded(self.rows) / ROW_TILE
    }

    /// Tiles that must stay in one task: a [`RowMat`]'s group of rows
    /// (`matmul_tiles` ranges start and end at multiples of this).
    pub(crate) fn tile_align(&self) -> usize {
        match &self.kind {
            PackedKind::Rows(m) => m.group().div_ceil(ROW_TILE),
            _ => 1,
        }
    }
}

/// Where a matmul writes: `[cols × stride]`, possibly shared between
/// threads that each own disjoint rows; a view may start at a row offset
/// (one part of a stacked layer).
#[derive(Debug)]
pub(crate) struct OutRows<'a> {
    ptr: *mut f32,
    len: usize,
    /// Rows per column in the buffer.
    stride: usize,
    /// First buffer row of this view.
    off: usize,
    /// Rows of this view.
    rows: usize,
    _life: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: an `OutRows` is a `&mut [f32]` borrowed for `'a`; moving it to
// another thread moves that borrow.
unsafe impl Send for OutRows<'_> {}
// SAFETY: shared use writes only through `set`, an `unsafe fn` whose callers
// keep threads to disjoint indices (its `# Safety`).
unsafe impl Sync for OutRows<'_> {}

impl<'a> OutRows<'a> {
    pub(crate) fn new(out: &'a mut [f32], rows: usize) -> OutRows<'a> {
        OutRows {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            stride: rows,
            off: 0,
            rows,
            _life: std::marker::PhantomData,
        }
    }

    /// The view of rows `off..off + rows` of this one.
    pub(crate) fn part(&self, off: usize, rows: usize) -> OutRows<'a> {
        assert!(off + rows <= self.rows, "rows {off}..{} of {}", off + rows, self.rows);
        OutRows { off: self.off + off, rows, ..*self }
    }

    /// Writes rows `r0 .. r0 + v.len()` of column `c` (rows at or past
    /// `rows` are ignored). The range is bounds-checked (a panic, never a
    /// write out of bounds).
    ///
    /// # Safety
    /// As [`OutRows::set`], for every row written.
    #[inline]
    pub(crate) unsafe fn set_run(&self, c: usize, r0: usize, v: &[f32]) {
        let len = v.len().min(self.rows.saturating_sub(r0));
        if len == 0 {
            return;
        }
        let i = c * self.stride + self.off + r0;
        assert!(i + len <= self.len && self.off + r0 + len <= self.stride);
        // SAFETY: in bounds (checked against the buffer's length), and no
        // other thread touches these indices (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(i), len) }
    }

    /// Writes row `r` of column `c`; rows at or past `rows` are ignored.
    /// The index is bounds-checked (a panic, never a write out of bounds).
    ///
    /// # Safety
    /// No other thread reads or writes `(c, r)` of the buffer (through this
    /// view or another view of it) while this call runs: threads sharing a
    /// buffer own disjoint rows (or columns) of it.
    #[inline]
    pub(crate) unsafe fn set(&self, c: usize, r: usize, v: f32) {
        if r < self.rows {
            let i = c * self.stride + self.off + r;
            assert!(i < self.len);
            // SAFETY: in bounds (checked against the buffer's length), and
            // no other thread touches index i (the caller's contract).
            unsafe { *self.ptr.add(i) = v }
        }
    }
}

/// Which activation layouts a matmul needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Needs {
    /// Plain f32 (f32/bf16 weights).
    pub(crate) f32: bool,
    /// f32 rounded through f16 (f16 weights: ggml converts the activations
    /// to the weights' type, `Acts::xh`).
    pub(crate) f16: bool,
    /// Q8_0/Q8_1 blocks (`q`, `d`, `s`).
    pub(crate) b32: bool,
    /// Q8_0/Q8_1 blocks plus the AVX-512 4-bit tile layout (`nib`).
    pub(crate) tile4: bool,
    /// Q8_0 blocks plus the AVX-512 8-bit tile layout (`dup`, `corr`).
    pub(crate) tile8: bool,
    /// Q8_K super-blocks (`kq`, `kd`, `kbs`).
    pub(crate) k256: bool,
    /// Q5_0 rows: `g16` on a decode.
    pub(crate) g16: bool,
    /// Q5_K rows: `kbp` on a wide product.
    pub(crate) kbp: bool,
    /// Q4_K/Q5_K rows on AVX-512: `kb32` on a wide product.
    pub(crate) k32: bool,
    /// Q6_K rows on AVX-512: `kqu` on a wide product.
    pub(crate) ku: bool,
    /// Chain Q4_0 rows: `off8` on a wide product.
    pub(crate) off8: bool,
}

impl Needs {
    pub(crate) fn or(self, o: Needs) -> Needs {
        Needs {
            f32: self.f32 || o.f32,
            f16: self.f16 || o.f16,
            b32: self.b32 || o.b32,
            tile4: self.tile4 || o.tile4,
            tile8: self.tile8 || o.tile8,
            k256: self.k256 || o.k256,
            g16: self.g16 || o.g16,
            kbp: self.kbp || o.kbp,
            k32: self.k32 || o.k32,
            ku: self.ku || o.ku,
            off8: self.off8 || o.off8,
        }
    }
}

/// Activations for one matmul: each column quantized (when the weights are
/// quantized) and laid out for the kernels.
#[derive(Debug, Default)]
pub(crate) struct Acts {
    pub(crate) n: usize,
    pub(crate) k: usize,
    /// The f32 values `[n × k]` (for f32/bf16 weights).
    pub(crate) x: Vec<f32>,
    /// The same rounded through f16 (for f16 weights).
    pub(crate) xh: Vec<f32>,
    /// `xh` as f16 (the conversion's buffer).
    h16: Vec<half::f16>,
    /// Per column and block of 32: scale and `d · Σq` (Q8_0/Q8_1).
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    /// Per column and block: the 32 quantized values.
    pub(crate) q: Vec<i8>,
    /// Per column and block, 64 bytes `[a0..16, a0..16, a16..32, a16..32]`:
    /// the layout the tile-packed 4-bit weights meet (AVX-512).
    pub(crate) nib: Vec<u8>,
    /// Per column and block, 64 bytes `[a0..32, a0..32]` for tile-packed
    /// 8-bit weights (AVX-512).
    pub(crate) dup: Vec<u8>,
    /// Per column and block, 16 lanes: `128 · (a[4j]+…+a[4j+3])` (twice),
    /// the offset the unsigned 8-bit tile weights add.
    pub(crate) corr: Vec<i32>,
    /// Per column and block of a decode (at most [`G16_COLS`] columns), 8
    /// lanes: `16 · (a[4j]+…+a[4j+3])`, the offset unsigned Q5_0 values
    /// (`x + 16`) add to each lane of ggml's per-block sums.
    pub(crate) g16: Vec<i32>,
    /// Per column and block of a wide product ([`WIDE_MIN`] columns) or a
    /// decode step (one column), `8 · Σ a`: the offset Q4_0's nibbles add when they meet the activations
    /// unsigned (`q · a` summed, less this, is `(q − 8) · a` summed).
    pub(crate) off8: Vec<i32>,
    /// Per column and super-block of 256 (Q8_K): scale (f32), values, and
    /// the sums of each 16 values.
    pub(crate) kd: Vec<f32>,
    pub(crate) kq: Vec<i8>,
    pub(crate) kbs: Vec<i16>,
    /// The Q8_K sums of each 32 values (pairs of `kbs`) in panels of eight
    /// columns for wide products, `[panel][super-block][t][column]`: lane
    /// j of row t holds column j's sums of sub-blocks 2t and 2t + 1 as an
    /// i16 pair (one `vpmaddwd` with a row's two mins gives Σ min·bsum of
    /// eight columns). Columns past `n` are zeros.
    pub(crate) kbp: Vec<i32>,
    /// The Q8_K sums of each 32 values as i16 pairs, `[column][super-block]
    /// [u]`: sub-blocks 2u and 2u + 1 (AVX-512 wide products of Q4_K/Q5_K,
    /// one `vpdpwssd` with a row's two minimums). Built from
    /// [`WIDE_MIN`] columns.
    pub(crate) kb32: Vec<i32>,
    /// The Q8_K values plus 128, as unsigned bytes `[column][value]`
    /// (AVX-512 wide products of Q6_K). Built from [`WIDE_MIN`] columns.
    pub(crate) kqu: Vec<u8>,
    /// `d` and `s` of the 32-blocks transposed, `[block][column]`, for
    /// kernels that take several columns of one block at once (padded by
    /// 8 columns so a vector load past the last is in bounds).
    pub(crate) dt: Vec<f32>,
    pub(crate) st: Vec<f32>,
    /// The quantized values of the 32-blocks as panels of eight columns,
    /// `[panel][block][group of 4 values][column]`, 4 bytes each (256 bytes
    /// per panel and block; columns past `n` are zeros): one 32-byte load
    /// holds the same four values of eight columns, so a kernel meets them
    /// with one broadcast group of a weight block (`avx2::b32_wide`).
    pub(crate) qi: Vec<i8>,
    /// Columns that llama.cpp computes as part of a group of four
    /// (`attn::Route::grouped`); empty means none.
    pub(crate) grouped: Vec<bool>,
    /// Columns of a product ggml computes with its tiled K-quant kernel
    /// (`attn::Route::wide`); empty means none.
    pub(crate) wide: Vec<bool>,
}

impl Acts {
    /// Prepares `x` (`n` columns of `k` values) in the layouts `need` says,
    /// quantizing columns in parallel on `pool` when there are many.
    pub(crate) fn prepare(
        &mut self,
        x: &[f32],
        n: usize,
        k: usize,
        need: Needs,
        pool: &crate::pool::Pool,
    ) {
        self.n = n;
        self.k = k;
        self.x.clear();
        if need.f32 {
            self.x.extend_from_slice(&x[..n * k]);
        }
        self.xh.clear();
        if need.f16 {
            // Rounded through f16 a slice at a time (F16C where the CPU has
            // it): the same values as one by one.
            use half::slice::HalfFloatSliceExt;
            self.h16.resize(n * k, half::f16::ZERO);
            self.h16.convert_from_f32_slice(&x[..n * k]);
            self.xh.resize(n * k, 0.0);
            self.h16.convert_to_f32_slice(&mut self.xh);
        }
        let per = 8;
        let chunks = n.div_ceil(per);
        let run = |job: &(dyn Fn(usize) + Sync)| {
            if chunks > 1 {
                pool.run(chunks, job);
            } else {
                (0..chunks).for_each(job);
            }
        };
        // Layouts of another product never survive into this one.
        self.kb32.clear();
        self.kqu.clear();
        if need.k256 && k.is_multiple_of(QK_K) {
            let nb = k / QK_K;
            self.kd.resize(n * nb, 0.0);
            self.kq.resize(n * k, 0);
            self.kbs.resize(n * nb * 16, 0);
            // The AVX-512 wide products' layouts, written with each column.
            let wide = n >= WIDE_MIN;
            self.kb32.resize(if wide && need.k32 { n * nb * 4 } else { 0 }, 0);
            self.kqu.resize(if wide && need.ku { n * k } else { 0 }, 0);
            let ptr_or_null =
                |len: usize, p: *mut u8| if len > 0 { p } else { std::ptr::null_mut() };
            let cols = KWriter {
                d: self.kd.as_mut_ptr(),
                q: self.kq.as_mut_ptr(),
                bs: self.kbs.as_mut_ptr(),
                b32: ptr_or_null(self.kb32.len(), self.kb32.as_mut_ptr() as *mut u8) as *mut i32,
                u: ptr_or_null(self.kqu.len(), self.kqu.as_mut_ptr()),
                nb,
            };
            run(&|i: usize| {
                for c in i * per..((i + 1) * per).min(n) {
                    // SAFETY: every column writes only its own disjoint
                    // ranges of the buffers sized above; `c < n`.
                    unsafe { cols.column(&x[c * k..(c + 1) * k], c) };
                }
            });
        }
        self.kbp.clear();
        if need.k256 && need.kbp && k.is_multiple_of(QK_K) && n >= WIDE_MIN {
            let nb = k / QK_K;
            self.kbp.resize(n.div_ceil(8) * nb * 32, 0);
            for c in 0..n {
                for b in 0..nb {
                    let bs = &self.kbs[(c * nb + b) * 16..(c * nb + b + 1) * 16];
                    for t in 0..4 {
                        self.kbp[(((c / 8) * nb + b) * 4 + t) * 8 + c % 8] =
                            bsum32_pair(&bs[4 * t..4 * t + 4]);
                    }
                }
            }
        }
        let b32 = need.b32 || need.tile4 || need.tile8;
        if !b32 {
            return;
        }
        let four = need.tile4;
        let eight = need.tile8;
        let nb = k / QK;
        self.d.resize(n * nb, 0.0);
        self.s.resize(n * nb, 0.0);
        self.q.resize(n * nb * QK, 0);
        self.nib.resize(if four { n * nb * 64 } else { 0 }, 0);
        self.dup.resize(if eight { n * nb * 64 } else { 0 }, 0);
        self.corr.resize(if eight { n * nb * 16 } else { 0 }, 0);
        let cols = ColWriter {
            d: self.d.as_mut_ptr(),
            s: self.s.as_mut_ptr(),
            q: self.q.as_mut_ptr(),
            nib: if four { self.nib.as_mut_ptr() } else { std::ptr::null_mut() },
            dup: if eight { self.dup.as_mut_ptr() } else { std::ptr::null_mut() },
            corr: if eight { self.corr.as_mut_ptr() } else { std::ptr::null_mut() },
            nb,
        };
        run(&|i: usize| {
            for c in i * per..((i + 1) * per).min(n) {
                // SAFETY: every column writes only its own disjoint ranges of
                // the buffers sized above; `c < n`.
                unsafe { cols.column(&x[c * k..(c + 1) * k], c) };
            }
        });
        self.off8.clear();
        if need.off8 && (n >= WIDE_MIN || n == 1) {
            self.off8.extend(
                self.q[..n * nb * QK]
                    .chunks_exact(QK)
                    .map(|blk| 8 * blk.iter().map(|&v| v as i32).sum::<i32>()),
            );
        }
        self.g16.clear();
        if need.g16 && n <= G16_COLS {
            self.g16.extend(
                self.q[..n * nb * QK]
                    .chunks_exact(4)
                    .map(|g| 16 * g.iter().map(|&v| v as i32).sum::<i32>()),
            );
        }
        if n > 1 {
            let w = n + 8;
            self.dt.clear();
            self.dt.resize(nb * w, 0.0);
            self.st.clear();
            self.st.resize(nb * w, 0.0);
            for c in 0..n {
                for b in 0..nb {
                    self.dt[b * w + c] = self.d[c * nb + b];
                    self.st[b * w + c] = self.s[c * nb + b];
                }
            }
        }
        // Only the AVX2 wide product of row-major 32-block weights reads it.
        if need.b32 && n >= WIDE_MIN {
            self.qi.clear();
            self.qi.resize(n.div_ceil(8) * nb * 256, 0);
            for c in 0..n {
                let (panel, j) = (c / 8, c % 8);
                let col = &self.q[c * nb * QK..(c + 1) * nb * QK];
                for (b, blk) in col.chunks_exact(QK).enumerate() {
                    let at = (panel * nb + b) * 256 + j * 4;
                    for (g, four) in blk.chunks_exact(4).enumerate() {
                        self.qi[at + g * 32..at + g * 32 + 4].copy_from_slice(four);
                    }
                }
            }
        }
    }

    pub(crate) fn blocks(&self) -> usize {
        self.k / QK
    }

    /// Sets which columns are grouped and wide (`attn::Route`).
    pub(crate) fn set_route(&mut self, grouped: &[bool], wide: &[bool]) {
        self.grouped.clear();
        self.grouped.extend_from_slice(grouped);
        self.wide.clear();
        self.wide.extend_from_slice(wide);
    }

    /// Whether column `c` belongs to a product ggml runs tiled.
    #[inline]
    pub(crate) fn wide(&self, c: usize) -> bool {
        self.wide.get(c).copied().unwrap_or(false)
    }

    /// Whether column `c` is computed as part of a group of four.
    #[inline]
    pub(crate) fn grouped(&self, c: usize) -> bool {
        self.grouped.get(c).copied().unwrap_or(false)
    }
}

/// Four Q8_K sums of 16 (two sub-blocks of 32) as the i16 pair of their
/// sums of 32, low half first: what one `vpmaddwd`/`vpdpwssd` lane meets
/// with a row's two minimums (`Acts::kbp`, `Acts::kb32`). Exact: a sum of
/// 32 fits i16.
fn bsum32_pair(bs: &[i16]) -> i32 {
    let lo = bs[0].wrapping_add(bs[1]) as u16 as u32;
    let hi = bs[2].wrapping_add(bs[3]) as u16 as u32;
    (lo | hi << 16) as i32
}

/// Raw views of an [`Acts`]'s Q8_K buffers, written one column at a time.
#[derive(Clone, Copy)]
struct KWriter {
    d: *mut f32,
    q: *mut i8,
    bs: *mut i16,
    /// `Acts::kb32` (null: not built).
    b32: *mut i32,
    /// `Acts::kqu` (null: not built).
    u: *mut u8,
    nb: usize,
}

// SAFETY: raw views of buffers borrowed mutably by the caller for the
// writer's use; moving them to another thread moves that use.
unsafe impl Send for KWriter {}
// SAFETY: shared use writes only through `column`, an `unsafe fn` whose
// callers keep threads to disjoint columns (its `# Safety`).
unsafe impl Sync for KWriter {}

impl KWriter {
    /// Quantizes column `c` (`x`, `nb · 256` values) into its ranges.
    ///
    /// # Safety
    /// The buffers hold at least `c + 1` columns (`kb32` and `kqu` too when
    /// their pointers are not null), and no other thread writes column `c`.
    unsafe fn column(&self, x: &[f32], c: usize) {
        let nb = self.nb;
        // SAFETY: ranges of column c, in bounds by the caller's contract.
        let (d, q, bs) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.d.add(c * nb), nb),
                std::slice::from_raw_parts_mut(self.q.add(c * nb * QK_K), nb * QK_K),
                std::slice::from_raw_parts_mut(self.bs.add(c * nb * 16), nb * 16),
            )
        };
        crate::quant::quantize_column_q8k(&x[..nb * QK_K], q, d, bs);
        if !self.b32.is_null() {
            // SAFETY: column c's range of `kb32`, in bounds by the caller's
            // contract (the buffer holds 4 per column and super-block).
            let b32 = unsafe { std::slice::from_raw_parts_mut(self.b32.add(c * nb * 4), nb * 4) };
            for (o, bs) in b32.iter_mut().zip(bs.chunks_exact(4)) {
                *o = bsum32_pair(bs);
            }
        }
        if !self.u.is_null() {
            // SAFETY: column c's range of `kqu`, in bounds by the caller's
            // contract (the buffer holds every column's values).
            let u = unsafe { std::slice::from_raw_parts_mut(self.u.add(c * nb * QK_K), nb * QK_K) };
            for (o, &v) in u.iter_mut().zip(q.iter()) {
                *o = (v as u8) ^ 0x80;
            }
        }
    }
}

/// Raw views of an [`Acts`]'s Q8_0/Q8_1 buffers, written one column at a
/// time; the tile layouts are written only when their pointers are set.
#[derive(Clone, Copy)]
struct ColWriter {
    d: *mut f32,
    s: *mut f32,
    q: *mut i8,
    nib: *mut u8,
    dup: *mut u8,
    corr: *mut i32,
    nb: usize,
}

// SAFETY: raw views of buffers borrowed mutably by the caller for the
// writer's use; moving them to another thread moves that use.
unsafe impl Send for ColWriter {}
// SAFETY: shared use writes only through `column`, an `unsafe fn` whose
// callers keep threads to disjoint columns (its `# Safety`).
unsafe impl Sync for ColWriter {}

impl ColWriter {
    /// Quantizes column `c` (`x`, `nb · 32` values) into its ranges.
    ///
    /// # Safety
    /// The buffers hold at least `c + 1` columns (the tile buffers too when
    /// their pointers are not null), and no other thread writes column `c`.
    unsafe fn column(&self, x: &[f32], c: usize) {
        let nb = self.nb;
        // SAFETY: ranges of column c, in bounds by the caller's contract.
        let (d, s, q) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.d.add(c * nb), nb),
                std::slice::from_raw_parts_mut(self.s.add(c * nb), nb),
                std::slice::from_raw_parts_mut(self.q.add(c * nb * QK), nb * QK),
            )
        };
        let four = !self.nib.is_null();
        let eight = !self.dup.is_null();
        if !four && !eight {
            crate::quant::quantize_column_q8(&x[..nb * QK], q, d, s);
            return;
        }
        for (lay, on, is_four) in [(self.nib, four, true), (self.dup, eight, false)] {
            if !on {
                continue;
            }
            // SAFETY: as above.
            let lay = unsafe { std::slice::from_raw_parts_mut(lay.add(c * nb * 64), nb * 64) };
            let corr = if is_four {
                &mut [][..]
            } else {
                // SAFETY: as above.
                unsafe { std::slice::from_raw_parts_mut(self.corr.add(c * nb * 16), nb * 16) }
            };
            match isa() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has the features (`isa`).
                Isa::Avx512Vnni => unsafe { x86::quantize_column(x, d, s, q, lay, corr, is_four) },
                _ => quantize_column_scalar(x, d, s, q, lay, corr, is_four),
            }
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

/// Runs `f(i, chunk)` for every chunk of `len` elements of `buf` on
/// `pool` (`Pool::chunks_mut`), with `f` compiled for AVX2, FMA and F16C
/// where the CPU has them: a closure handed to the pool is a function of its
/// own and would not inherit the features of the pass that made it (its
/// `mul_add`s would be library calls). The numbers are the same either way.
pub(crate) fn rows_mut<T: Send>(
    pool: &crate::pool::Pool,
    buf: &mut [T],
    len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    pool.chunks_mut(buf, len, &|i, c| with_avx2(|| f(i, c)));
}

/// `f()`, inlined into a function compiled for AVX2, FMA and F16C when the
/// CPU has them (else plainly).
#[inline(always)]
fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if isa().avx2() {
        /// # Safety
        /// The CPU must support avx2, fma and f16c.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn call<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: the CPU has AVX2, FMA and F16C (`isa`).
        return unsafe { call(f) };
    }
    f()
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
        // As ggml batches a matmul of n columns: groups of four, then one by one.
        let grouped: Vec<bool> = (0..n).map(|c| c < n - n % 4).collect();
        run_routed(w, x, &grouped, &vec![n >= attn::WIDE; n], forced)
    }

    /// `run` with each column's route given: columns neither grouped nor
    /// wide have the numbers of a decode step (verified drafts, sequences
    /// decoded together).
    fn run_routed(
        w: &Packed,
        x: &[f32],
        grouped: &[bool],
        wide: &[bool],
        forced: Option<Isa>,
    ) -> Vec<f32> {
        let n = grouped.len();
        let mut acts = Acts::default();
        acts.prepare(x, n, w.cols, w.needs(), &crate::pool::Pool::new(2));
        acts.set_route(grouped, wide);
        let mut out = vec![f32::NAN; n * w.rows];
        {
            let o = OutRows::new(&mut out, w.rows);
            // SAFETY: one thread writes every row of `out`.
            unsafe {
                match (forced, &w.kind) {
                    (Some(Isa::Scalar), PackedKind::Rows(m)) => {
                        rows::matmul(m, &acts, 0..w.rows, &o)
                    }
                    (Some(Isa::Scalar), _) => scalar::matmul_tiles(w, &acts, 0..w.tiles(), &o),
                    _ => w.matmul_tiles(&acts, 0..w.tiles(), &o),
                }
            }
        }
        out
    }

    /// One fixture of `tests/data/kernels` (see `gen/mulmat.c`): weights of
    /// a GGUF type, activations, and the product llama.cpp's CPU backend
    /// computed for them.
    struct Fixture {
        name: String,
        ty: crate::gguf::GgmlType,
        rows: usize,
        cols: usize,
        n: usize,
        w: Vec<u8>,
        x: Vec<f32>,
        y: Vec<f32>,
    }

    fn fixtures() -> Vec<Fixture> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kernels");
        let mut out = Vec::new();
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .expect("tests/data/kernels")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "agkf"))
            .collect();
        paths.sort();
        for p in paths {
            let b = std::fs::read(&p).unwrap();
            assert_eq!(&b[..4], b"AGKF");
            let u =
                |i: usize| u32::from_le_bytes(b[4 + 4 * i..8 + 4 * i].try_into().unwrap()) as usize;
            let (ty, rows, cols, n) = (u(1), u(2), u(3), u(4));
            let wb = u64::from_le_bytes(b[24..32].try_into().unwrap()) as usize;
            let mut at = 32;
            let w = b[at..at + wb].to_vec();
            at += wb;
            let f = |at: usize, len: usize| -> Vec<f32> {
                b[at..at + 4 * len]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            };
            let x = f(at, n * cols);
            at += 4 * n * cols;
            let y = f(at, n * rows);
            assert_eq!(at + 4 * n * rows, b.len(), "{}", p.display());
            out.push(Fixture {
                name: p.file_name().unwrap().to_string_lossy().into_owned(),
                ty: crate::gguf::GgmlType::from_id(ty as u32).unwrap(),
                rows,
                cols,
                n,
                w,
                x,
                y,
            });
        }
        out
    }

    fn pack(f: &Fixture) -> Packed {
        use crate::gguf::GgmlType as G;
        if Packed::tiles_for(f.ty) {
            let mut p = Packed::empty(f.ty == G::Q8_0, f.rows, f.cols);
            p.fill(0, &f.w);
            return p;
        }
        if f.ty == G::F32 {
            let mut w = vec![0f32; f.rows * f.cols];
            crate::quant::dequantize_row(f.ty, &f.w, &mut w);
            return Packed::f32(w, f.rows, f.cols);
        }
        Packed::rows(rows::Fmt::from_ggml(f.ty).unwrap(), f.w.clone(), f.rows, f.cols)
    }

    /// `vals` as an f16 (or bf16) GGUF row stores them.
    fn half_bytes(vals: &[f32], bf16: bool) -> Vec<u8> {
        vals.iter()
            .flat_map(|v| match bf16 {
                true => half::bf16::from_f32(*v).to_le_bytes(),
                false => half::f16::from_f32(*v).to_le_bytes(),
            })
            .collect()
    }

    /// f16 and bf16 matrices give the portable path's numbers bit for bit
    /// on this CPU's path, for decode and prompt widths, row counts that
    /// leave a partial tile and lengths with a tail.
    #[test]
    fn float_rows_agree_with_the_portable_path_at_every_width() {
        for (fmt, rows, cols) in
            [(rows::Fmt::F16, 13, 200), (rows::Fmt::BF16, 11, 576), (rows::Fmt::F16, 8, 1000)]
        {
            let vals: Vec<f32> =
                random_x(rows * cols, 7 + rows as u64).iter().map(|v| v / 4.0).collect();
            let w = Packed::rows(fmt, half_bytes(&vals, fmt == rows::Fmt::BF16), rows, cols);
            for n in [1, 2, 3, 4, 5, 7, 16] {
                let x = random_x(n * cols, 100 + n as u64);
                let want = run(&w, &x, n, Some(Isa::Scalar));
                let got = run(&w, &x, n, None);
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{fmt:?} {rows}x{cols} n {n} ({}): row {} column {}: {g} vs {e}",
                        w.kernel(),
                        i % rows,
                        i / rows
                    );
                }
            }
        }
    }

    /// Every quantized format gives llama.cpp's numbers bit for bit, on every
    /// path this CPU has, for one column (decode) and for several (prompt);
    /// f16/bf16/f32 weights, which ggml rounds through f16 activations, agree
    /// within rounding.
    #[test]
    fn kernels_reproduce_llama_cpp() {
        let all = fixtures();
        assert!(all.len() >= 20, "{} fixtures", all.len());
        for f in &all {
            let w = pack(f);
            for forced in [Some(Isa::Scalar), None] {
                let got = run(&w, &f.x, f.n, forced);
                if std::env::var("KDEBUG").is_ok() {
                    let bad: Vec<usize> = (0..f.n)
                        .map(|c| {
                            (0..f.rows)
                                .filter(|&r| {
                                    got[c * f.rows + r].to_bits() != f.y[c * f.rows + r].to_bits()
                                })
                                .count()
                        })
                        .collect();
                    eprintln!("{} {forced:?}: mismatches per column {bad:?}", f.name);
                }
                for c in 0..f.n {
                    for r in 0..f.rows {
                        let (g, e) = (got[c * f.rows + r], f.y[c * f.rows + r]);
                        let tol = match f.ty {
                            crate::gguf::GgmlType::BF16 => 2e-2,
                            crate::gguf::GgmlType::F16 | crate::gguf::GgmlType::F32 => 2e-3,
                            _ => 0.0,
                        };
                        if tol > 0.0 {
                            assert!(
                                (g - e).abs() <= tol * e.abs().max(1.0),
                                "{} {forced:?} r{r} c{c}: {g} vs {e}",
                                f.name
                            );
                        } else {
                            assert_eq!(
                                g.to_bits(),
                                e.to_bits(),
                                "{} {forced:?} ({}) r{r} c{c}: {g} vs {e}",
                                f.name,
                                w.kernel()
                            );
                        }
                    }
                }
            }
        }
    }

    /// The embedding lookup dequantizes a row as ggml does: dot products of
    /// dequantized rows with the activations approximate ggml's products.
    #[test]
    fn dequantized_rows_match_the_products() {
        for f in fixtures() {
            let w = pack(&f);
            let mut row = vec![0f32; f.cols];
            for r in 0..f.rows {
                w.dequantize_row(r, &mut row);
                let want = f.y[r];
                let got: f32 = row.iter().zip(&f.x[..f.cols]).map(|(a, b)| a * b).sum();
                let scale: f32 = row.iter().zip(&f.x[..f.cols]).map(|(a, b)| (a * b).abs()).sum();
                assert!(
                    (got - want).abs() <= 0.02 * scale + 1e-4,
                    "{} r{r}: {got} vs {want}",
                    f.name
                );
            }
        }
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

    /// Grouped matrices (rows interleaved block by block) keep every row's
    /// bytes, and a product split into tasks at `tile_align` boundaries, as
    /// the model splits it across threads, equals the whole product bit for
    /// bit on every fixture.
    #[test]
    fn grouped_rows_and_split_products_keep_the_numbers() {
        for f in fixtures() {
            let w = pack(&f);
            if let PackedKind::Rows(m) = &w.kind {
                let rb = m.row_bytes;
                let mut buf = Vec::new();
                for r in 0..f.rows {
                    assert_eq!(
                        m.row(r, &mut buf),
                        &f.w[r * rb..(r + 1) * rb],
                        "{} row {r}",
                        f.name
                    );
                }
                let q6k8 = f.ty == crate::gguf::GgmlType::Q6_K && isa() == Isa::Avx512Vnni;
                if (f.ty == crate::gguf::GgmlType::Q4_K || q6k8) && f.rows % 8 == 0 {
                    assert_eq!(m.group(), 8, "{}", f.name);
                }
            }
            let whole = run(&w, &f.x, f.n, None);
            let mut acts = Acts::default();
            acts.prepare(&f.x, f.n, w.cols, w.needs(), &crate::pool::Pool::new(1));
            let grouped: Vec<bool> = (0..f.n).map(|c| c < f.n - f.n % 4).collect();
            acts.set_route(&grouped, &vec![f.n >= attn::WIDE; f.n]);
            let mut out = vec![f32::NAN; f.n * w.rows];
            {
                let o = OutRows::new(&mut out, w.rows);
                let step = w.tile_align();
                for t in (0..w.tiles()).step_by(step) {
                    // SAFETY: one thread, disjoint tile ranges in turn.
                    unsafe { w.matmul_tiles(&acts, t..(t + step).min(w.tiles()), &o) };
                }
            }
            for (i, (a, b)) in out.iter().zip(&whole).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{} value {i}: {a} vs {b}", f.name);
            }
        }
    }

    /// The packed kernels agree with a plain dequantized product, and the
    /// SIMD path is bit-identical to the scalar one for every column count.
    /// Every row format's SIMD kernels against the portable ones, on
    /// random blocks, for decode widths, grouped and wide prompt widths and
    /// ragged ones (the wide paths' panels of eight columns, their tails):
    /// bit for bit, as the design requires.
    /// The eight-row horizontal sum of the decode loops is `hsum8` of each
    /// row, bit for bit, on values of every magnitude and sign.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn eight_row_sums_are_hsum8() {
        if !avx2::available() {
            return;
        }
        let mut r = rng(88);
        for _ in 0..20_000 {
            let x: [[f32; 8]; 8] = std::array::from_fn(|_| {
                std::array::from_fn(|_| {
                    let m = (r() % 2000) as f32 / 7.0 - 140.0;
                    let e = (r() % 40) as i32 - 20;
                    m * 2f32.powi(e)
                })
            });
            // SAFETY: AVX2, FMA and F16C checked above.
            let got = unsafe { avx2::hsum8_x8_all(&x) };
            for i in 0..8 {
                assert_eq!(got[i].to_bits(), hsum8(&x[i]).to_bits(), "row {i}: {:?}", x[i]);
            }
        }
    }

    /// The f16/bf16 rows' AVX2 tiles give `scalar::dot_f32`'s sums of the
    /// widened rows bit for bit, for every length (tails included) and
    /// every tile shape the driver uses; the AVX-512 tiles likewise.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sixteen_lane_float_tiles_are_dot_f32() {
        if !avx2::available() {
            return;
        }
        let mut r = rng(16);
        let mut val = || (r() % 2000) as f32 / 97.0 - 10.0;
        fn check<const R: usize, const C: usize>(ws: &[Vec<f32>], xs: &[Vec<f32>], k: usize) {
            for bf16 in [false, true] {
                // The rows as a GGUF stores them, and their exact values.
                let raw: Vec<Vec<u8>> = ws[..R].iter().map(|w| half_bytes(w, bf16)).collect();
                let ty =
                    if bf16 { crate::gguf::GgmlType::BF16 } else { crate::gguf::GgmlType::F16 };
                let exact: Vec<Vec<f32>> = raw
                    .iter()
                    .map(|b| {
                        let mut e = vec![0f32; k];
                        crate::quant::dequantize_row(ty, b, &mut e);
                        e
                    })
                    .collect();
                let wr: [&[u8]; R] = std::array::from_fn(|i| raw[i].as_slice());
                let xr: [&[f32]; C] = std::array::from_fn(|j| xs[j].as_slice());
                let mut tile = [[0f32; C]; R];
                // SAFETY: AVX2, FMA and F16C checked by the caller; every row
                // holds k halves and every column k values.
                unsafe {
                    if bf16 {
                        avx2::float_tile::<R, C, false>(&wr, &xr, k, &mut tile);
                    } else {
                        avx2::float_tile::<R, C, true>(&wr, &xr, k, &mut tile);
                    }
                }
                for r in 0..R {
                    for c in 0..C {
                        let want = scalar::dot_f32(&exact[r], &xs[c]);
                        assert_eq!(
                            tile[r][c].to_bits(),
                            want.to_bits(),
                            "bf16 {bf16}, k {k}, {R}x{C} tile {r},{c}"
                        );
                    }
                }
            }
        }
        for k in [1, 15, 16, 17, 64, 100, 384, 1000, 1040] {
            let ws: Vec<Vec<f32>> = (0..4).map(|_| (0..k).map(|_| val()).collect()).collect();
            let xs: Vec<Vec<f32>> = (0..6).map(|_| (0..k).map(|_| val()).collect()).collect();
            check::<4, 1>(&ws, &xs, k);
            check::<3, 2>(&ws, &xs, k);
            check::<1, 3>(&ws, &xs, k);
            if isa() == Isa::Avx512Vnni {
                // Three groups of four rows, so the slices pass several.
                let ws: Vec<Vec<f32>> = (0..12).map(|_| (0..k).map(|_| val()).collect()).collect();
                let xr: [&[f32]; 6] = std::array::from_fn(|i| xs[i % 4].as_slice());
                let groups: Vec<[&[f32]; 4]> =
                    (0..3).map(|g| std::array::from_fn(|i| ws[4 * g + i].as_slice())).collect();
                let mut seen = 0;
                // SAFETY: AVX-512 checked above; every row and column has k values.
                unsafe {
                    x86::dot16_panel(&x86::Rows16::F32(groups), &xr, k, |g, tile| {
                        seen += 1;
                        for r in 0..4 {
                            for c in 0..6 {
                                let want = scalar::dot_f32(&ws[4 * g + r], &xs[c % 4]);
                                let got = tile[r][c].to_bits();
                                assert_eq!(got, want.to_bits(), "k {k}, group {g}, tile {r},{c}");
                            }
                        }
                    })
                };
                assert_eq!(seen, 3);
                // The same rows stored as f16 and converted in registers.
                let hs: Vec<Vec<u8>> = ws
                    .iter()
                    .map(|w| w.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect())
                    .collect();
                let groups: Vec<[&[u8]; 4]> =
                    (0..3).map(|g| std::array::from_fn(|i| hs[4 * g + i].as_slice())).collect();
                // SAFETY: AVX-512 and F16C checked above; every row has k halves.
                unsafe {
                    x86::dot16_panel(&x86::Rows16::F16(groups), &xr, k, |g, tile| {
                        for r in 0..4 {
                            let wr: Vec<f32> = ws[4 * g + r]
                                .iter()
                                .map(|v| half::f16::from_f32(*v).to_f32())
                                .collect();
                            for c in 0..6 {
                                let want = scalar::dot_f32(&wr, &xs[c % 4]);
                                let got = tile[r][c].to_bits();
                                assert_eq!(
                                    got,
                                    want.to_bits(),
                                    "f16 k {k}, group {g}, tile {r},{c}"
                                );
                            }
                        }
                    })
                };
            }
        }
    }

    /// Block pairs keep every bit of both blocks: random Q4_1, Q5_0, Q5_1
    /// and Q8_0 pairs through `pair_blocks` and back, and each Q5_0 and Q5_1
    /// value's high bit where `pair_blocks` says.
    #[test]
    fn block_pairs_round_trip() {
        let mut r = rng(55);
        for (fmt, pb) in [
            (rows::Fmt::Q4_1, rows::Q4_1_PAIR),
            (rows::Fmt::Q5_0, rows::Q5_PAIR),
            (rows::Fmt::Q5_1, rows::Q5_1_PAIR),
            (rows::Fmt::Q8_0, rows::Q8_PAIR),
        ] {
            for _ in 0..2000 {
                let file: Vec<u8> = (0..pb).map(|_| r() as u8).collect();
                let mut pair = vec![0u8; pb];
                rows::pair_blocks(fmt, &file, &mut pair);
                let mut back = vec![0u8; pb];
                rows::unpair_blocks(fmt, &pair, &mut back);
                assert_eq!(file, back, "{fmt:?}");
                assert_eq!((&pair[..2], &pair[2..4]), (&file[..2], &file[pb / 2..pb / 2 + 2]));
                // Where each format keeps its high bits in a block, and in
                // a pair.
                let (h, at) = match fmt {
                    rows::Fmt::Q5_0 => (2, 4),
                    rows::Fmt::Q5_1 => (4, 8),
                    _ => continue,
                };
                for (blk, shift) in [(0usize, 4u32), (1, 0)] {
                    let o = pb / 2 * blk + h;
                    let qh = u32::from_le_bytes(file[o..o + 4].try_into().unwrap());
                    for j in 0..32 {
                        let got = (pair[at + j % 8] >> (shift + j as u32 / 8)) & 1;
                        assert_eq!(got as u32, (qh >> j) & 1, "block {blk} value {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn row_kernels_agree_with_the_portable_path_at_every_width() {
        use rows::Fmt;
        // Block bytes and the offsets of the block's f16 scales.
        let formats: [(Fmt, usize, usize, &[usize]); 10] = [
            (Fmt::Q4_0, 32, 18, &[0]),
            (Fmt::Q4_1, 32, 20, &[0, 2]),
            (Fmt::Q5_0, 32, 22, &[0]),
            (Fmt::Q5_1, 32, 24, &[0, 2]),
            (Fmt::Q8_0, 32, 34, &[0]),
            (Fmt::Q2K, 256, 84, &[80, 82]),
            (Fmt::Q3K, 256, 110, &[108]),
            (Fmt::Q4K, 256, 144, &[0, 2]),
            (Fmt::Q5K, 256, 176, &[0, 2]),
            (Fmt::Q6K, 256, 210, &[208]),
        ];
        // 512 columns: Q4_1/Q5_0/Q8_0 rows of an even block count (stored
        // in pairs); 544: an odd one (the file's layout) for the formats of 32.
        for (fmt, qk, bb, scales) in formats {
            for (rows, cols) in [(16usize, 512usize), (12, 512), (12, 544), (40, 512), (72, 256)] {
                if cols % qk != 0 {
                    continue;
                }
                if matches!(fmt, Fmt::Q4_1 | Fmt::Q5_0 | Fmt::Q5_1 | Fmt::Q8_0) {
                    let w = Packed::rows(fmt, vec![0; rows * cols / qk * bb], rows, cols);
                    let PackedKind::Rows(m) = &w.kind else { unreachable!() };
                    assert_eq!(m.pairs(), (cols / qk) % 2 == 0, "{cols} columns");
                }
                let mut r = rng(fmt as u64 * 31 + rows as u64);
                let blocks = rows * cols / qk;
                let mut raw: Vec<u8> = (0..blocks * bb).map(|_| r() as u8).collect();
                for b in 0..blocks {
                    for &o in scales {
                        let d = half::f16::from_f32((r() % 1000) as f32 / 20_000.0 + 1e-4);
                        raw[b * bb + o..b * bb + o + 2].copy_from_slice(&d.to_le_bytes());
                    }
                }
                let w = Packed::rows(fmt, raw, rows, cols);
                for n in [1usize, 2, 4, 5, 8, 9, 16, 17, 24, 31, 40] {
                    let x = random_x(n * cols, n as u64);
                    let simd = run(&w, &x, n, None);
                    let sc = run(&w, &x, n, Some(Isa::Scalar));
                    assert!(simd.iter().all(|v| v.is_finite()), "{fmt:?} {rows} rows n={n}");
                    if n < WIDE_MIN {
                        // Several decode columns at once (the multi-column
                        // decode kernels): each column's numbers alone.
                        let one = vec![false; n];
                        let many = run_routed(&w, &x, &one, &one, None);
                        let alone: Vec<f32> = (0..n)
                            .flat_map(|c| run(&w, &x[c * cols..(c + 1) * cols], 1, None))
                            .collect();
                        assert_eq!(
                            many.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{fmt:?} {rows} rows, {n} decode columns"
                        );
                    }
                    for (i, (a, b)) in simd.iter().zip(&sc).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{fmt:?} {rows} rows n={n}: column {} row {}: {a} vs {b}",
                            i / rows,
                            i % rows
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn kernels_match_reference_and_each_other() {
        for (rows, cols) in [(6usize, 64usize), (13, 96), (20, 64), (32, 576)] {
            for (name, raw, w) in [
                ("q4_1", random_q4_1(rows, cols, 1), None),
                ("q8_0", random_q8_0(rows, cols, 2), Some(())),
            ] {
                let packed = if w.is_none() {
                    Packed::q4_1(&raw, rows, cols)
                } else {
                    Packed::q8_0(&raw, rows, cols)
                };
                let ty = if w.is_none() {
                    crate::gguf::GgmlType::Q4_1
                } else {
                    crate::gguf::GgmlType::Q8_0
                };
                // Decode, short prompts, and wide ones (`x86::q8_0_wide`).
                for n in [1usize, 2, 3, 5, 7, 8, 16, 17, 40] {
                    let x = random_x(n * cols, 3);
                    if n <= 8 {
                        // Decode columns together (`q4_1_rows`,
                        // `q8_0_rows`): each column's numbers alone.
                        let many = run_routed(&packed, &x, &vec![false; n], &vec![false; n], None);
                        let alone: Vec<f32> = (0..n)
                            .flat_map(|c| run(&packed, &x[c * cols..(c + 1) * cols], 1, None))
                            .collect();
                        assert_eq!(many, alone, "{name} {rows}x{cols}: {n} decode columns");
                    }
                    let simd = run(&packed, &x, n, None);
                    let sc = run(&packed, &x, n, Some(Isa::Scalar));
                    assert_eq!(simd, sc, "{name} {rows}x{cols} n={n}");
                    // Against f32 math on dequantized weights: close, not equal.
                    let mut row = vec![0f32; cols];
                    for c in 0..n {
                        for r in 0..rows {
                            crate::quant::dequantize_row(
                                ty,
                                &raw[r * ty.row_bytes(cols).unwrap()
                                    ..(r + 1) * ty.row_bytes(cols).unwrap()],
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
