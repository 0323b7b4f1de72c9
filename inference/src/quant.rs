//! Quantized block formats as GGUF stores them, and the quantization of
//! activations that the integer dot products consume.
//!
//! INVARIANT: activation quantization reproduces llama.cpp's x86 path bit for
//! bit (block max, `d = max / 127` rounded to f16, `round-half-even(x · 127 /
//! max)`, `s = d · Σq` rounded to f16), so the dot products built on it give
//! the numbers llama.cpp gives.

use half::f16;

/// Elements per block of Q4_0, Q4_1, Q8_0 and Q8_1.
pub(crate) const QK: usize = 32;

/// GGUF Q4_1 block: `w = d · q + m`, q in 0..16, 20 bytes.
pub(crate) const Q4_1_BYTES: usize = 20;
/// GGUF Q4_0 block: `w = d · (q − 8)`, 18 bytes.
pub(crate) const Q4_0_BYTES: usize = 18;
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
        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for v in blk {
            let q = (v * id).round_ties_even() as i32;
            sum += q;
            out.q.push(q.clamp(-128, 127) as i8);
        }
        out.d.push(f16::from_f32(d).to_f32());
        out.s.push(f16::from_f32(d * sum as f32).to_f32());
    }
}

/// Dequantizes one row of a GGUF tensor of type `ty` into `out`.
pub(crate) fn dequantize_row(ty: QType, raw: &[u8], out: &mut [f32]) {
    match ty {
        QType::F32 => {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        QType::F16 => {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        QType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(raw.chunks_exact(Q8_0_BYTES)) {
                let d = f16_at(b, 0);
                for (j, v) in o.iter_mut().enumerate() {
                    *v = d * (b[2 + j] as i8) as f32;
                }
            }
        }
        QType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(raw.chunks_exact(Q4_0_BYTES)) {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    o[j] = d * ((b[2 + j] & 15) as i32 - 8) as f32;
                    o[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
                }
            }
        }
        QType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(raw.chunks_exact(Q4_1_BYTES)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                for j in 0..16 {
                    o[j] = d * (b[4 + j] & 15) as f32 + m;
                    o[j + 16] = d * (b[4 + j] >> 4) as f32 + m;
                }
            }
        }
    }
}

/// The tensor types the fast CPU path reads directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
}

impl QType {
    /// Bytes of one row of `cols` elements.
    pub(crate) fn row_bytes(self, cols: usize) -> usize {
        match self {
            QType::F32 => cols * 4,
            QType::F16 => cols * 2,
            QType::Q4_0 => cols / QK * Q4_0_BYTES,
            QType::Q4_1 => cols / QK * Q4_1_BYTES,
            QType::Q8_0 => cols / QK * Q8_0_BYTES,
        }
    }
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
}
