//! The key/value cache: its element types (llama.cpp's `-ctk`/`-ctv`), its
//! layout, and the conversion of a computed key or value row into it.
//!
//! f16 is llama.cpp's default and ours. Q8_0 and Q4_0 halve and quarter
//! (nearly) the bytes per position; llama.cpp then computes attention on
//! its one-query path for every batch (`ggml_compute_forward_flash_attn_ext_f16`:
//! the tiled and split paths take f16 caches only), the query quantized to
//! Q8_0 and each score a `vec_dot` of the key's blocks with it, the values
//! converted to f32 and accumulated in f32 (`kernels::attn::attend_quant`).
//! Rows enter the cache as `ggml_set_rows` writes them: the CPU backend's
//! `from_float` of the type (`quantize_row_q8_0`, `quantize_row_q4_0_ref`).

use half::f16;

use crate::error::{Error, ErrorKind, Result};

/// Values per block of the quantized cache types.
pub(crate) const QK: usize = 32;

/// Element type of the K/V cache (both K and V).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// 2 bytes per value (llama.cpp's default).
    #[default]
    F16,
    /// Blocks of 32 bytes and an f16 scale: 34 bytes per 32 values.
    Q8_0,
    /// Blocks of 32 nibbles and an f16 scale: 18 bytes per 32 values.
    Q4_0,
}

impl KvType {
    /// Every type, in the order docs list them.
    pub const ALL: [KvType; 3] = [KvType::F16, KvType::Q8_0, KvType::Q4_0];

    /// llama.cpp's name of the type (`-ctk`/`-ctv`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// Whether values are stored in blocks of [`QK`] with a scale.
    pub fn is_quantized(self) -> bool {
        self != KvType::F16
    }

    /// Bytes of one block of [`QK`] values (f16: 64).
    pub(crate) fn block_bytes(self) -> usize {
        match self {
            KvType::F16 => 2 * QK,
            KvType::Q8_0 => 2 + QK,
            KvType::Q4_0 => 2 + QK / 2,
        }
    }

    /// Bytes of `n` values (`n` a multiple of [`QK`] for the block types).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            KvType::F16 => 2 * n,
            t => n / QK * t.block_bytes(),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = Error;
    fn from_str(s: &str) -> Result<KvType> {
        KvType::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            Error::new(
                ErrorKind::Input,
                format!("unknown KV cache type {s:?}: use f16, q8_0 or q4_0"),
            )
        })
    }
}

/// A session's key/value cache: per layer and KV head (`layer · n_kv +
/// head`), `[position][head size]` of its type, grown as positions are
/// added. One head's keys are one contiguous stream, which attention reads
/// front to back (the hardware prefetchers follow it; rows of all heads
/// interleaved were a stride apart, and the decode at depth waited on
/// them). f16 caches live in `k`/`v`, block types in `kq`/`vq` (blocks of
/// [`QK`] values, GGUF's layout).
#[derive(Debug, Default)]
pub(crate) struct KvCache {
    pub(crate) ty: KvType,
    pub(crate) k: Vec<Vec<f16>>,
    pub(crate) v: Vec<Vec<f16>>,
    pub(crate) kq: Vec<Vec<u8>>,
    pub(crate) vq: Vec<Vec<u8>>,
    pub(crate) len: usize,
}

impl KvCache {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Elements (f16 values or bytes) one position of one head takes.
    fn unit(&self, head_dim: usize) -> usize {
        match self.ty {
            KvType::F16 => head_dim,
            t => t.bytes(head_dim),
        }
    }

    /// Makes the cache hold `streams` empty streams of type `ty` unless it
    /// holds them already.
    pub(crate) fn prepare(&mut self, ty: KvType, streams: usize) {
        let ready = self.ty == ty
            && match ty {
                KvType::F16 => self.k.len() == streams,
                _ => self.kq.len() == streams,
            };
        if ready {
            return;
        }
        *self = KvCache { ty, ..KvCache::default() };
        match ty {
            KvType::F16 => {
                self.k = vec![Vec::new(); streams];
                self.v = vec![Vec::new(); streams];
            }
            _ => {
                self.kq = vec![Vec::new(); streams];
                self.vq = vec![Vec::new(); streams];
            }
        }
    }

    /// Makes room for `positions` positions in every stream, exactly (Vec's
    /// doubling would hold up to twice the cache; peak RSS is a target).
    pub(crate) fn reserve(&mut self, positions: usize, head_dim: usize) {
        let want = positions * self.unit(head_dim);
        fn grow<T>(c: &mut Vec<T>, want: usize) {
            if c.capacity() < want {
                c.reserve_exact(want - c.len());
            }
        }
        self.k.iter_mut().chain(self.v.iter_mut()).for_each(|c| grow(c, want));
        self.kq.iter_mut().chain(self.vq.iter_mut()).for_each(|c| grow(c, want));
    }

    /// Appends one position's key and value of stream `at`.
    pub(crate) fn push(&mut self, at: usize, k: &[f32], v: &[f32]) {
        match self.ty {
            KvType::F16 => {
                self.k[at].extend(k.iter().map(|&x| f16::from_f32(x)));
                self.v[at].extend(v.iter().map(|&x| f16::from_f32(x)));
            }
            t => {
                quantize_row(t, k, &mut self.kq[at]);
                quantize_row(t, v, &mut self.vq[at]);
            }
        }
    }

    /// Forgets positions from `len` on.
    pub(crate) fn truncate(&mut self, len: usize, head_dim: usize) {
        let unit = self.unit(head_dim);
        self.len = self.len.min(len);
        let keep = self.len * unit;
        self.k.iter_mut().chain(self.v.iter_mut()).for_each(|c| c.truncate(keep));
        self.kq.iter_mut().chain(self.vq.iter_mut()).for_each(|c| c.truncate(keep));
    }

    /// Bytes held (capacity).
    pub(crate) fn bytes(&self) -> usize {
        let f: usize = self.k.iter().chain(&self.v).map(|c| c.capacity() * 2).sum();
        f + self.kq.iter().chain(&self.vq).map(Vec::capacity).sum::<usize>()
    }
}

/// Appends `x` (a multiple of [`QK`] values) as blocks of `ty` (a block
/// type) to `out`, as llama.cpp's CPU backend converts a row it writes into
/// the cache: `quantize_row_q8_0` (AVX2: round half to even) and
/// `quantize_row_q4_0_ref`.
pub(crate) fn quantize_row(ty: KvType, x: &[f32], out: &mut Vec<u8>) {
    debug_assert!(x.len().is_multiple_of(QK));
    for blk in x.chunks_exact(QK) {
        match ty {
            KvType::F16 => out.extend(blk.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes())),
            KvType::Q8_0 => {
                let (q, d, _) = crate::quant::quantize_block_q8(blk);
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend(q.iter().map(|&v| v as u8));
            }
            KvType::Q4_0 => {
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in blk {
                    if amax < v.abs() {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                // C's `(int8_t)(x + 8.5f)`: truncation toward zero.
                let nib = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
                out.extend((0..QK / 2).map(|j| nib(blk[j]) | (nib(blk[j + QK / 2]) << 4)));
            }
        }
    }
}

/// The policy `auto` chooses by: f16 while every position of the context
/// in f16 fits in `budget` bytes, else Q8_0 while that fits, else Q4_0.
pub(crate) fn choose(context: usize, values_per_position: usize, budget: u64) -> KvType {
    [KvType::F16, KvType::Q8_0]
        .into_iter()
        .find(|t| (context * t.bytes(values_per_position)) as u64 <= budget)
        .unwrap_or(KvType::Q4_0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for t in KvType::ALL {
            assert_eq!(t.name().parse::<KvType>().unwrap(), t);
        }
        let e = "q5_1".parse::<KvType>().unwrap_err();
        assert!(e.to_string().contains("f16, q8_0 or q4_0"), "{e}");
    }

    #[test]
    fn block_rows_take_their_bytes() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 0.37).collect();
        for t in KvType::ALL {
            let mut out = Vec::new();
            quantize_row(t, &x, &mut out);
            assert_eq!(out.len(), t.bytes(64), "{t}");
        }
        assert_eq!(KvType::Q8_0.bytes(64) * 2, 136);
    }

    #[test]
    fn q4_0_rows_are_llama_cpps() {
        // The block's largest magnitude (-9.3) maps to nibble 0: d = -9.3 / -8.
        let mut x = [0f32; QK];
        x[0] = -9.3;
        x[1] = 4.65;
        x[17] = 1.0;
        let mut out = Vec::new();
        quantize_row(KvType::Q4_0, &x, &mut out);
        let d = f16::from_le_bytes([out[0], out[1]]).to_f32();
        assert!((d - 9.3 / 8.0).abs() < 1e-3);
        assert_eq!(out[2] & 15, 0);
        assert_eq!(out[3] & 15, 12); // 4.65 / 1.1625 + 8.5 = 12.5 → 12
        assert_eq!(out[3] >> 4, 9); // 1.0 / 1.1625 + 8.5 = 9.36 → 9
        assert_eq!(out[4] & 15, 8);
    }

    #[test]
    fn auto_picks_the_widest_type_that_fits() {
        assert_eq!(choose(8192, 1000, 8192 * 2000), KvType::F16);
        assert_eq!(choose(8192, 1024, 8192 * 2000), KvType::Q8_0);
        assert_eq!(choose(8192, 1024, 1000), KvType::Q4_0);
    }
}
