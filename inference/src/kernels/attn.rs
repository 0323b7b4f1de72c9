//! Attention for one query over a run of cached positions, as llama.cpp's
//! CPU flash attention computes it: the query rounded to f16; each score a
//! f16 dot product (four 16-lane partial sums, then a fixed reduction);
//! an online softmax with `expf`; the weighted values accumulated in f16.
//! Prompt and decode use this one function, so cached keys and values are
//! the same whichever path produced them.
//!
//! Also here: SiLU with ggml's vectorised `expf` (`ggml_v_expf`), whose bits
//! differ from libm's.

use half::f16;

/// ggml's AVX-512 `expf` approximation (max error 1.45 ulp + 0.5), scalar.
#[inline]
pub(crate) fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3FB8_AA3B), r); // 0x1.715476p+0
    let n = z - r;
    let b = (-n).mul_add(f32::from_bits(0x35BF_BE8E), (-n).mul_add(f32::from_bits(0x3F31_7200), x));
    if n.abs() > 192.0 {
        // Outside the range the model ever reaches; saturate as ggml does.
        return if n > 0.0 { f32::INFINITY } else { 0.0 };
    }
    let u = b * b;
    let j = f32::from_bits(0x3C07_2010)
        .mul_add(b, f32::from_bits(0x3D2B_9F17))
        .mul_add(u, f32::from_bits(0x3E2A_AF33).mul_add(b, f32::from_bits(0x3EFF_FEDB)))
        .mul_add(u, f32::from_bits(0x3F7F_FFF6).mul_add(b, 1.0));
    // scalef: j · 2^n, exact.
    j * (n as f64).exp2() as f32
}

/// `silu(g) · u` as ggml's vectorised swiglu computes it.
pub(crate) fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
    if std::env::var("X_SILU").is_ok() {
        for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
        return;
    }
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + v_expf(0.0 - g)) * u;
    }
}

/// A cache layout: position `t`'s vector for this head starts at
/// `t · stride + offset`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lane {
    pub(crate) stride: usize,
    pub(crate) offset: usize,
}

/// The f16 dot product of ggml (`ggml_vec_dot_f16`, 16-lane build).
#[inline]
fn dot_f16(q: &[f32], k: &[f16]) -> f32 {
    let n = q.len();
    let np = n & !63;
    let mut sum = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, s) in sum.iter_mut().enumerate() {
            for (l, lane) in s.iter_mut().enumerate() {
                let at = i + 16 * j + l;
                *lane = q[at].mul_add(k[at].to_f32(), *lane);
            }
        }
    }
    let mut x0 = [0f32; 16];
    for l in 0..16 {
        let a = sum[0][l] + sum[2][l];
        let b = sum[1][l] + sum[3][l];
        x0[l] = a + b;
    }
    let a: [f32; 8] = std::array::from_fn(|i| x0[i + 8] + x0[i]);
    let b: [f32; 4] = std::array::from_fn(|i| a[i + 4] + a[i]);
    let mut s = ((b[0] + b[2]) + (b[1] + b[3])) as f64;
    for i in np..n {
        s += (q[i] * k[i].to_f32()) as f64;
    }
    s as f32
}

/// Attention of one query (`q`, f32, already RoPE'd) over positions
/// `0..upto` of the caches; writes the head's output to `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(q: &[f32], kc: &[f16], vc: &[f16], lane: Lane, upto: usize, scale: f32, vkq: &mut [f16], out: &mut [f32]) {
    if std::env::var("X_F32ATT").is_ok() {
        return attend_f32(q, kc, vc, lane, upto, scale, out);
    }
    #[cfg(target_arch = "x86_64")]
    if super::isa() == super::Isa::Avx512Vnni && q.len() % 64 == 0 {
        // SAFETY: the CPU has the features (`isa`).
        unsafe { super::x86::attend(q, kc, vc, lane, upto, scale, vkq, out) };
        return;
    }
    attend_scalar(q, kc, vc, lane, upto, scale, vkq, out)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_scalar(q: &[f32], kc: &[f16], vc: &[f16], lane: Lane, upto: usize, scale: f32, vkq: &mut [f16], out: &mut [f32]) {
    let hd = q.len();
    let q16: Vec<f32> = q.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    vkq.iter_mut().for_each(|v| *v = f16::ZERO);
    let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
    for t in 0..upto {
        let at = t * lane.stride + lane.offset;
        let s = dot_f16(&q16, &kc[at..at + hd]) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let old = m;
            m = s;
            ms = (old - m).exp();
            for v in vkq.iter_mut() {
                *v = f16::from_f32(v.to_f32() * ms);
            }
        } else {
            vs = (s - m).exp();
        }
        for (acc, v) in vkq.iter_mut().zip(&vc[at..at + hd]) {
            *acc = f16::from_f32(v.to_f32().mul_add(vs, acc.to_f32()));
        }
        s_sum = s_sum.mul_add(ms, vs);
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, v) in out.iter_mut().zip(vkq.iter()) {
        *o = v.to_f32() * inv;
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_f32(q: &[f32], kc: &[f16], vc: &[f16], lane: Lane, upto: usize, scale: f32, out: &mut [f32]) {
    let hd = q.len();
    let mut scores = Vec::with_capacity(upto);
    let mut max = f32::NEG_INFINITY;
    let q16: Vec<f32> = if std::env::var("X_Q16").is_ok() { q.iter().map(|&v| f16::from_f32(v).to_f32()).collect() } else { q.to_vec() };
    for t in 0..upto {
        let at = t * lane.stride + lane.offset;
        let kf: Vec<f32> = kc[at..at + hd].iter().map(|v| v.to_f32()).collect();
        let sc = if std::env::var("X_DOT16").is_ok() { dot_f16(&q16, &kc[at..at+hd]) } else { super::dot(&q16, &kf) } * scale;
        max = max.max(sc);
        scores.push(sc);
    }
    let mut sum = 0f64;
    for sc in scores.iter_mut() {
        *sc = (*sc - max).exp();
        sum += *sc as f64;
    }
    let inv = (1.0 / sum) as f32;
    let mut acc = vec![0f32; hd];
    for (t, p) in scores.iter().enumerate() {
        let at = t * lane.stride + lane.offset;
        let p = p * inv;
        for (a, v) in acc.iter_mut().zip(&vc[at..at + hd]) {
            *a += p * v.to_f32();
        }
    }
    out.copy_from_slice(&acc);
}
