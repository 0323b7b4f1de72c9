//! Rotary position embeddings as llama.cpp computes them: what a GGUF
//! declares about its RoPE ([`RopeConfig`], read with the other
//! hyper-parameters in `arch.rs`) and the per-position cos/sin cache and
//! rotation of ggml's CPU `rope` op ([`Rope`], [`rotate`]).
//!
//! The scalings, as llama.cpp 0c1e570 derives them (`load_hparams` in
//! src/llama-model.cpp, the context parameters in src/llama-context.cpp,
//! `rope_yarn` and `ggml_rope_cache_init` in ggml/src/ggml-cpu/ops.cpp,
//! `ggml_rope_yarn_corr_dims` in ggml/src/ggml.c, of the llama.cpp that
//! `scripts/build-llamacpp.sh` builds):
//!
//! - `rope.scaling.type` absent means `linear`; `rope.scaling.factor` (or the
//!   old `rope.scale_linear`) gives `freq_scale = 1 / factor`, 1 when absent
//!   or 0, and 1 for `none`. Any other type is refused, naming it.
//! - `yarn`: `ext_factor` 1, corrections over `rope.scaling.original_context_length`
//!   (else the training context) with β fast 32 and β slow 1, and the
//!   attention factor `get_mscale(factor) / (1 + 0.1 ln factor)` that
//!   llama-context derives (times `rope.scaling.attn_factor`) — which
//!   `rope_yarn` multiplies by `1 + 0.1 ln(1 / freq_scale)` again.
//!   llama.cpp reads the `rope.scaling.yarn_*` keys (β, ext/attn factor, log
//!   multiplier) only for other architectures (grok, mistral3, deepseek2…),
//!   so for the ones here it does not, and neither does this engine: its
//!   numbers are llama.cpp's. [`yarn_attn_factor`] has the log-multiplier
//!   form for when one is added.
//! - Per-dimension frequency factors divide θ (`theta / ff`): the Llama 3.x
//!   `rope_freqs.weight` ("llama3" scaling) on llama files, and the
//!   longrope `rope_factors_long`/`rope_factors_short` on phi3 (and llama
//!   files of type `longrope`), the long ones when the context (padded to
//!   256, as llama-context pads it) exceeds the original context
//!   ([`long_factors`]). `rope.scaling.attn_factor` scales cos and sin.
//! - Per-layer bases and scales: gemma's sliding-window layers (`arch.rs`).
//!
//! INVARIANT: without scaling (factor 1, no factors, attention factor 1)
//! the cache is bit-identical to plain RoPE: every extra operation is a
//! multiplication or division by exactly 1.

use crate::arch::Arch;
use crate::error::{model_err, Result};
use crate::gguf::Gguf;

/// ggml's YaRN defaults (`yarn_beta_fast`, `yarn_beta_slow` in
/// src/llama-hparams.h).
pub(crate) const BETA_FAST: f32 = 32.0;
pub(crate) const BETA_SLOW: f32 = 1.0;

/// The RoPE scaling type a file declares (`rope.scaling.type`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Scaling {
    /// `none`, or `linear` with no factor: plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// `rope.scaling.factor`.
        factor: f32,
    },
    /// YaRN over the original context.
    Yarn {
        /// `rope.scaling.factor`.
        factor: f32,
    },
    /// Phi-3's longrope: the short or long factor tensors.
    LongRope,
}

/// Which per-dimension frequency factors the forward pass reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Factors {
    None,
    /// `rope_freqs.weight` (Llama 3.x).
    Freqs,
    /// `rope_factors_long.weight` / `rope_factors_short.weight` (longrope).
    LongShort,
}

/// What a file says about its RoPE, as llama.cpp's context parameters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RopeConfig {
    pub(crate) scaling: Scaling,
    /// `cparams.rope_freq_scale`: 1 / factor.
    pub(crate) freq_scale: f32,
    /// `cparams.yarn_ext_factor`: 1 for YaRN, else 0.
    pub(crate) ext_factor: f32,
    /// `cparams.yarn_attn_factor`: what cos and sin are multiplied by.
    pub(crate) attn_factor: f32,
    pub(crate) beta_fast: f32,
    pub(crate) beta_slow: f32,
    /// `cparams.n_ctx_orig_yarn`.
    pub(crate) n_ctx_orig: usize,
    pub(crate) factors: Factors,
}

impl RopeConfig {
    /// Reads the RoPE keys of `arch_name` (and which factor tensors the
    /// architecture's graph takes); refuses a scaling type the engine does
    /// not implement, naming it.
    pub(crate) fn read(
        g: &Gguf,
        arch: Arch,
        arch_name: &str,
        n_ctx_train: usize,
    ) -> Result<RopeConfig> {
        let k = |s: &str| format!("{arch_name}.{s}");
        let ty = g.string(&k("rope.scaling.type")).unwrap_or("linear");
        let factor = g
            .f32(&k("rope.scaling.factor"))
            .or_else(|| g.f32(&k("rope.scale_linear")))
            .filter(|f| *f != 0.0);
        if factor.is_some_and(|f| !(f.is_finite() && f > 0.0)) {
            return Err(model_err(format!(
                "metadata `{}` is {}, which is no RoPE scaling factor",
                k("rope.scaling.factor"),
                factor.unwrap_or(0.0)
            )));
        }
        let takes_factors = matches!(arch, Arch::Llama | Arch::Phi3);
        let scaling = match ty {
            "none" => Scaling::None,
            "linear" => factor.map_or(Scaling::None, |factor| Scaling::Linear { factor }),
            "yarn" => Scaling::Yarn { factor: factor.unwrap_or(1.0) },
            "longrope" if takes_factors => Scaling::LongRope,
            "longrope" => {
                return Err(model_err(format!(
                    "RoPE scaling type `longrope` (`{}`) is not implemented for the {arch_name} architecture: llama.cpp's {arch_name} graph reads no long/short factors (the engine runs longrope on llama and phi3)",
                    k("rope.scaling.type")
                )))
            }
            other => {
                return Err(model_err(format!(
                    "RoPE scaling type `{other}` (`{}`) is not implemented by this engine (it runs none, linear, yarn and longrope): refusing the file rather than computing different numbers",
                    k("rope.scaling.type")
                )))
            }
        };
        // llama.cpp: `rope_freq_scale_train = 1 / factor`, and 1 for `none`.
        let freq_scale = match (ty, factor) {
            ("none", _) | (_, None) => 1.0,
            (_, Some(f)) => 1.0 / f,
        };
        let ext_factor = if ty == "yarn" { 1.0 } else { 0.0 };
        let rope_attn_factor = g.f32(&k("rope.scaling.attn_factor")).unwrap_or(1.0);
        let attn_factor = yarn_attn_factor(freq_scale, ext_factor, 1.0, 0.0, rope_attn_factor);
        let n_ctx_orig = g
            .u32(&k("rope.scaling.original_context_length"))
            .map(|v| v as usize)
            .filter(|&v| v > 0)
            .unwrap_or(n_ctx_train);
        let factors = match arch {
            Arch::Llama if ty == "longrope" => Factors::LongShort,
            Arch::Llama if g.has("rope_freqs.weight") => Factors::Freqs,
            Arch::Phi3 => Factors::LongShort,
            _ => Factors::None,
        };
        let has_long_short =
            g.has("rope_factors_long.weight") || g.has("rope_factors_short.weight");
        let factors = match factors {
            Factors::LongShort if !has_long_short => Factors::None,
            f => f,
        };
        let scaling = match (scaling, factors) {
            (Scaling::None, Factors::LongShort) => Scaling::LongRope,
            (s, _) => s,
        };
        Ok(RopeConfig {
            scaling,
            freq_scale,
            ext_factor,
            attn_factor,
            beta_fast: BETA_FAST,
            beta_slow: BETA_SLOW,
            n_ctx_orig,
            factors,
        })
    }

    /// Whether RoPE is plain: no scaling, factors or attention factor.
    pub(crate) fn is_plain(&self) -> bool {
        self.scaling == Scaling::None
            && self.factors == Factors::None
            && self.freq_scale == 1.0
            && self.ext_factor == 0.0
            && self.attn_factor == 1.0
    }

    /// The scaling in words, for reports: `none`, `llama3 (rope_freqs)`,
    /// `linear ×8`, `yarn ×4 from 512`, `longrope (long factors: context
    /// 2048 > 512)`, with `, attention ×F` when cos and sin are scaled by
    /// other than YaRN's own factor.
    pub(crate) fn describe(&self, context: usize) -> String {
        let mut parts = Vec::new();
        match self.factors {
            Factors::Freqs => parts.push("llama3 (rope_freqs)".to_owned()),
            Factors::LongShort => {
                let long = long_factors(context, self.n_ctx_orig);
                parts.push(format!(
                    "longrope ({} factors: context {context} {} {})",
                    if long { "long" } else { "short" },
                    if long { ">" } else { "≤" },
                    self.n_ctx_orig
                ));
            }
            Factors::None if self.scaling == Scaling::LongRope => parts.push("longrope".to_owned()),
            Factors::None => {}
        }
        match self.scaling {
            Scaling::Linear { factor } => parts.push(format!("linear ×{factor}")),
            Scaling::Yarn { factor } => {
                parts.push(format!("yarn ×{factor} from {}", self.n_ctx_orig))
            }
            Scaling::None | Scaling::LongRope => {}
        }
        let mut s = if parts.is_empty() { "none".to_owned() } else { parts.join(" + ") };
        if self.ext_factor == 0.0 && self.attn_factor != 1.0 {
            s.push_str(&format!(", attention ×{}", self.attn_factor));
        }
        s
    }
}

/// Whether llama.cpp takes the long longrope factors at this context:
/// `n_ctx_seq > n_ctx_orig_yarn`, where the context is padded to 256
/// (`GGML_PAD(n_ctx, 256)` in llama-context; one sequence).
pub(crate) fn long_factors(context: usize, n_ctx_orig: usize) -> bool {
    context.next_multiple_of(256) > n_ctx_orig
}

/// llama-context's `yarn_attn_factor`: `base` (`hparams.yarn_attn_factor`)
/// replaced, when YaRN extrapolates, by `get_mscale(factor, mscale) /
/// get_mscale(factor, log_mul)` with a log multiplier, else
/// `get_mscale(factor, 1)`, then divided by `1 + 0.1 ln factor` (which
/// `rope_yarn` multiplies back), and times `rope.scaling.attn_factor`. In
/// f32 without contraction, as libllama is built.
pub(crate) fn yarn_attn_factor(
    freq_scale: f32,
    ext_factor: f32,
    base: f32,
    log_mul: f32,
    rope_attn_factor: f32,
) -> f32 {
    let get_mscale =
        |scale: f32, mscale: f32| if scale <= 1.0 { 1.0 } else { 0.1 * mscale * scale.ln() + 1.0 };
    let mut attn = base;
    if ext_factor != 0.0 {
        let factor = 1.0 / freq_scale;
        attn = if log_mul != 0.0 {
            get_mscale(factor, 1.0) / get_mscale(factor, log_mul)
        } else {
            get_mscale(factor, 1.0)
        };
        attn *= 1.0 / (1.0 + 0.1 * factor.ln());
    }
    attn * rope_attn_factor
}

/// ggml's `ggml_rope_yarn_corr_dims`: the first and last rotated pair
/// YaRN blends (`floor` of β fast's, `ceil` of β slow's), clamped to the
/// dimensions.
pub(crate) fn corr_dims(
    n_dims: usize,
    n_ctx_orig: usize,
    base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let corr_dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let start = corr_dim(beta_fast).floor();
    let end = corr_dim(beta_slow).ceil();
    [
        if 0.0 > start { 0.0 } else { start },
        if ((n_dims - 1) as f32) < end { (n_dims - 1) as f32 } else { end },
    ]
}

/// ggml's `rope_yarn_ramp`: 1 below the first corrected pair, 0 past the
/// last, linear between.
#[inline(always)]
fn ramp(low: f32, high: f32, i0: usize) -> f32 {
    let d = high - low;
    let y = ((i0 / 2) as f32 - low) / if 0.001 > d { 0.001 } else { d };
    let y = if 0.0 > y { 0.0 } else { y };
    1.0 - if 1.0 < y { 1.0 } else { y }
}

/// The RoPE of one kind of layer: ggml's `rope` op with its parameters.
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    /// Rotated dimensions (`n_rot`).
    dims: usize,
    /// `powf(freq_base, -2 / n_dims)`.
    theta_scale: f32,
    freq_scale: f32,
    ext_factor: f32,
    /// cos and sin are multiplied by this: the attention factor, with
    /// `rope_yarn`'s `1 + 0.1 ln(1 / freq_scale)` when YaRN extrapolates.
    mscale: f32,
    corr: [f32; 2],
    /// Per rotated pair, θ is divided by this.
    factors: Option<Vec<f32>>,
}

impl Rope {
    /// The rope of layers with base `base` and scale `freq_scale` (`cfg`'s
    /// but for gemma's sliding-window layers), over `dims` dimensions.
    pub(crate) fn new(
        cfg: &RopeConfig,
        dims: usize,
        base: f32,
        freq_scale: f32,
        factors: Option<Vec<f32>>,
    ) -> Rope {
        let mscale = if cfg.ext_factor != 0.0 {
            // `mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale)`, contracted
            // into one fma as GCC builds ggml-cpu (ops.cpp).
            cfg.attn_factor * 0.1f32.mul_add((1.0 / freq_scale).ln(), 1.0)
        } else {
            cfg.attn_factor
        };
        Rope {
            dims,
            theta_scale: base.powf(-2.0 / dims as f32),
            freq_scale,
            ext_factor: cfg.ext_factor,
            mscale,
            corr: corr_dims(dims, cfg.n_ctx_orig, base, cfg.beta_fast, cfg.beta_slow),
            factors,
        }
    }

    /// The cos/sin pairs of position `pos` (`dims` values):
    /// `ggml_rope_cache_init` with `rope_yarn`. θ starts at the position
    /// and is multiplied by `theta_scale` pair after pair; a factor divides
    /// it; YaRN blends the interpolated and extrapolated angles with one fma
    /// (as GCC contracts `theta_interp * (1 - ramp_mix) + theta_extrap *
    /// ramp_mix`).
    #[inline(always)]
    pub(crate) fn cache(&self, pos: usize, out: &mut [f32]) {
        let mut theta = pos as f32;
        for (i, pair) in out[..self.dims].chunks_exact_mut(2).enumerate() {
            let extrap = match &self.factors {
                Some(f) => theta / f[i],
                None => theta,
            };
            let interp = self.freq_scale * extrap;
            let t = if self.ext_factor != 0.0 {
                let mix = ramp(self.corr[0], self.corr[1], 2 * i) * self.ext_factor;
                interp.mul_add(1.0 - mix, extrap * mix)
            } else {
                interp
            };
            pair[0] = t.cos() * self.mscale;
            pair[1] = t.sin() * self.mscale;
            theta *= self.theta_scale;
        }
    }
}

/// Rotates every head (`head_dim` values each) of `x` by a position's
/// [`Rope::cache`]: llama.cpp's `rotate_pairs`, whose `x0·cos − x1·sin` and
/// `x0·sin + x1·cos` GCC contracts (`-ffp-contract=fast`) into one fma on
/// the first product. NeoX pairs dimension `i` with `i + dims/2`, normal
/// RoPE `2i` with `2i + 1`; dimensions past `dims` are left as they are.
#[inline(always)]
pub(crate) fn rotate(x: &mut [f32], cache: &[f32], head_dim: usize, dims: usize, neox: bool) {
    for head in x.chunks_exact_mut(head_dim) {
        for (i, cs) in cache[..dims].chunks_exact(2).enumerate() {
            let (c, s) = (cs[0], cs[1]);
            let (a, b) = if neox { (i, i + dims / 2) } else { (2 * i, 2 * i + 1) };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0.mul_add(c, -(x1 * s));
            head[b] = x0.mul_add(s, x1 * c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(freq_scale: f32, ext_factor: f32, attn_factor: f32, n_ctx_orig: usize) -> RopeConfig {
        RopeConfig {
            scaling: Scaling::None,
            freq_scale,
            ext_factor,
            attn_factor,
            beta_fast: BETA_FAST,
            beta_slow: BETA_SLOW,
            n_ctx_orig,
            factors: Factors::None,
        }
    }

    /// θ of pair `i` at `pos` as ggml's cache builds it: the position times
    /// `base^(-2/dims)` once per pair, in f32.
    fn theta(pos: usize, base: f32, dims: usize, i: usize) -> f32 {
        let scale = base.powf(-2.0 / dims as f32);
        (0..i).fold(pos as f32, |t, _| t * scale)
    }

    #[test]
    fn corr_dims_are_ggmls() {
        // 32 · ln(512 / (β · 2π)) / (2 ln 1e6): 1.0825 (β 32) → floor 1,
        // 5.0962 (β 1) → ceil 6.
        assert_eq!(corr_dims(32, 512, 1e6, BETA_FAST, BETA_SLOW), [1.0, 6.0]);
        // Qwen2.5's: head 128 over 32768 positions: 23.596 → 23, 39.651 → 40.
        assert_eq!(corr_dims(128, 32768, 1e6, BETA_FAST, BETA_SLOW), [23.0, 40.0]);
        // Clamped to [0, n_dims - 1]: 64 · ln(16 / 2π·32) / 2 ln 1e4 < 0, and
        // a vast context's end past the last dimension.
        assert_eq!(corr_dims(64, 16, 1e4, BETA_FAST, BETA_SLOW)[0], 0.0);
        assert_eq!(corr_dims(8, 1 << 30, 10.0, BETA_FAST, BETA_SLOW)[1], 7.0);
    }

    #[test]
    fn the_ramp_is_ggmls() {
        // (i0/2 − low) / max(0.001, high − low), clamped to [0, 1], from 1.
        assert_eq!(ramp(1.0, 6.0, 0), 1.0);
        assert_eq!(ramp(1.0, 6.0, 2), 1.0);
        assert!((ramp(1.0, 6.0, 6) - 0.6).abs() < 1e-7);
        assert_eq!(ramp(1.0, 6.0, 12), 0.0);
        assert_eq!(ramp(1.0, 6.0, 30), 0.0);
        // low == high: the step of 0.001.
        assert_eq!(ramp(3.0, 3.0, 6), 1.0);
        assert_eq!(ramp(3.0, 3.0, 8), 0.0);
    }

    #[test]
    fn yarn_attention_factor_is_llama_contexts() {
        // Factor 4: get_mscale(4) = 1 + 0.1 ln 4 = 1.1386294, divided by the
        // same: 1 (to an ulp), which rope_yarn multiplies back.
        let a = yarn_attn_factor(0.25, 1.0, 1.0, 0.0, 1.0);
        assert!((a - 1.0).abs() < 1e-6, "{a}");
        let r = Rope::new(&config(0.25, 1.0, a, 512), 32, 1e6, 0.25, None);
        assert!((r.mscale - 1.138_629_4).abs() < 1e-6, "{}", r.mscale);
        // A log multiplier of 1 cancels get_mscale: 1 / (1 + 0.1 ln 4).
        let l = yarn_attn_factor(0.25, 1.0, 1.0, 1.0, 1.0);
        assert!((l - 0.878_248_9).abs() < 1e-6, "{l}");
        // No YaRN: the file's attention factor alone (phi3's longrope).
        assert_eq!(yarn_attn_factor(1.0, 0.0, 1.0, 0.0, 1.19), 1.19);
        // YaRN without a factor: get_mscale(1) = 1 and 1 / (1 + 0) = 1.
        assert_eq!(yarn_attn_factor(1.0, 1.0, 1.0, 0.0, 1.0), 1.0);
    }

    #[test]
    fn plain_rope_is_bit_identical_to_unscaled_rope() {
        let r = Rope::new(&config(1.0, 0.0, 1.0, 4096), 64, 10_000.0, 1.0, None);
        let mut got = vec![0f32; 64];
        for pos in [0, 1, 17, 1000, 32_767] {
            r.cache(pos, &mut got);
            for i in 0..32 {
                let t = theta(pos, 10_000.0, 64, i);
                assert_eq!(got[2 * i].to_bits(), t.cos().to_bits(), "pos {pos} pair {i}");
                assert_eq!(got[2 * i + 1].to_bits(), t.sin().to_bits(), "pos {pos} pair {i}");
            }
        }
    }

    #[test]
    fn factors_divide_theta_and_linear_scales_it() {
        // rope_freqs (llama3): θ / ff per pair.
        let ff: Vec<f32> = (0..16).map(|i| 1.0 + i as f32 * 0.5).collect();
        let r = Rope::new(&config(1.0, 0.0, 1.0, 8192), 32, 500_000.0, 1.0, Some(ff.clone()));
        let mut got = vec![0f32; 32];
        r.cache(1500, &mut got);
        for (i, f) in ff.iter().enumerate() {
            let t = theta(1500, 500_000.0, 32, i) / f;
            assert_eq!(got[2 * i].to_bits(), t.cos().to_bits(), "pair {i}");
        }
        // linear ×8: freq_scale · θ; longrope's attention factor scales both.
        let r = Rope::new(&config(0.125, 0.0, 1.19, 4096), 32, 10_000.0, 0.125, None);
        r.cache(1500, &mut got);
        for i in 0..16 {
            let t = 0.125 * theta(1500, 10_000.0, 32, i);
            assert_eq!(got[2 * i].to_bits(), (t.cos() * 1.19).to_bits(), "pair {i}");
            assert_eq!(got[2 * i + 1].to_bits(), (t.sin() * 1.19).to_bits(), "pair {i}");
        }
    }

    #[test]
    fn yarn_blends_extrapolated_and_interpolated_angles() {
        // qwen2-yarn's: 32 dims, base 1e6, factor 4 over 512 positions:
        // corrections [1, 6]. Pairs up to 1 keep θ (extrapolate), pairs
        // from 6 on take θ/4 (interpolate), pair 3 mixes 0.6 of θ.
        let a = yarn_attn_factor(0.25, 1.0, 1.0, 0.0, 1.0);
        let r = Rope::new(&config(0.25, 1.0, a, 512), 32, 1e6, 0.25, None);
        let ms = r.mscale;
        let mut got = vec![0f32; 32];
        r.cache(1000, &mut got);
        // cos(1000) · 1.1386294 = 0.6403…, by hand.
        assert!((got[0] - 0.562_379_08 * 1.138_629_4).abs() < 1e-5, "{}", got[0]);
        for i in [0, 1] {
            let t = theta(1000, 1e6, 32, i);
            assert_eq!(got[2 * i].to_bits(), (t.cos() * ms).to_bits(), "pair {i}");
        }
        for i in 6..16 {
            let t = 0.25 * theta(1000, 1e6, 32, i);
            assert_eq!(got[2 * i + 1].to_bits(), (t.sin() * ms).to_bits(), "pair {i}");
        }
        let t = theta(1000, 1e6, 32, 3);
        let mixed = 0.25 * t * 0.4 + t * 0.6;
        assert!((got[6] - mixed.cos() * ms).abs() < 1e-4, "{} {}", got[6], mixed.cos() * ms);
    }

    #[test]
    fn longrope_takes_the_long_factors_past_the_original_context() {
        // llama-context pads the context to 256 before comparing.
        assert!(!long_factors(512, 512));
        assert!(!long_factors(300, 512));
        assert!(long_factors(513, 512));
        assert!(long_factors(2048, 512));
        assert!(!long_factors(4096, 4096));
        assert!(long_factors(8192, 4096));
    }

    #[test]
    fn scalings_are_described() {
        let mut c = config(1.0, 0.0, 1.0, 512);
        assert_eq!(c.describe(2048), "none");
        assert!(c.is_plain());
        c.factors = Factors::Freqs;
        assert_eq!(c.describe(2048), "llama3 (rope_freqs)");
        assert!(!c.is_plain());
        c.factors = Factors::None;
        c.scaling = Scaling::Yarn { factor: 4.0 };
        assert_eq!(c.describe(2048), "yarn ×4 from 512");
        c.scaling = Scaling::Linear { factor: 8.0 };
        assert_eq!(c.describe(2048), "linear ×8");
        c.scaling = Scaling::LongRope;
        c.factors = Factors::LongShort;
        c.attn_factor = 1.25;
        assert_eq!(
            c.describe(2048),
            "longrope (long factors: context 2048 > 512), attention ×1.25"
        );
        assert_eq!(c.describe(512), "longrope (short factors: context 512 ≤ 512), attention ×1.25");
    }

    #[test]
    fn rotation_pairs_neox_and_normal_dimensions_and_leaves_the_rest() {
        // A quarter turn (cos 0, sin 1): x0 → −x1, x1 → x0.
        let cache = [0.0, 1.0, 0.0, 1.0];
        let mut x: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        rotate(&mut x, &cache, 8, 4, true);
        assert_eq!(x, [-3.0, -4.0, 1.0, 2.0, 5.0, 6.0, 7.0, 8.0]);
        let mut x: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        rotate(&mut x, &cache, 8, 4, false);
        assert_eq!(x, [-2.0, 1.0, -4.0, 3.0, 5.0, 6.0, 7.0, 8.0]);
    }
}
