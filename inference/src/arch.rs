//! The model families this engine runs and how each reads its
//! hyper-parameters from the GGUF metadata into one [`Config`]: the llama
//! family (llama, mistral, qwen2, qwen3: SwiGLU, RMS norms, RoPE; qwen3moe:
//! qwen3 with a mixture of experts for a feed-forward block, `moe.rs`; phi3:
//! fused q/k/v and gate/up, partial NeoX RoPE with longrope factors, queries
//! scaled before attention) and the gemma family (gemma2, gemma3: scaled
//! embeddings, GeGLU, norms after attention and feed-forward, sliding-window
//! layers, soft-capping where present), with llama.cpp's defaults where a
//! key is absent.
//!
//! RoPE and its scaling (`rope.scaling.*`, `rope_freqs`, longrope factors)
//! are read by `rope.rs` ([`crate::rope::RopeConfig`]); a scaling type the
//! engine does not implement is refused there, an architecture outside the
//! list here. Where llama.cpp ignores a key for an architecture, so does the
//! engine (phi3's `attention.sliding_window`: llama.cpp 0c1e570 disables
//! Phi SWA; the `rope.scaling.yarn_*` keys, read by llama.cpp only for other
//! architectures), so that its numbers stay llama.cpp's; every tensor of a
//! file must be read by the loader or the file is refused (`model.rs`).

use crate::error::{model_err, Result};
use crate::gguf::Gguf;

/// Architectures the forward pass implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// llama, SmolLM2, Llama 3.x, Mistral (normal RoPE).
    Llama,
    /// qwen2 (NeoX RoPE, q/k/v biases).
    Qwen2,
    /// qwen3 (NeoX RoPE, per-head q/k RMS norms).
    Qwen3,
    /// qwen3moe (qwen3's attention; a mixture of experts in place of the
    /// feed-forward block, `moe.rs`).
    Qwen3Moe,
    /// gemma2 (GeGLU, post norms, soft-capped attention and logits,
    /// sliding window on every other layer).
    Gemma2,
    /// gemma3 (GeGLU, post norms, q/k norms, sliding window on five layers
    /// of six with their own RoPE base).
    Gemma3,
    /// phi3 (Phi-3.5-mini, Phi-4-mini: fused `attn_qkv` and gate/up in
    /// `ffn_up`, NeoX RoPE over part of each head, longrope factors,
    /// queries scaled by 1/√head before attention).
    Phi3,
    /// bert (all-MiniLM, bge, mxbai-embed-large; rerankers such as
    /// bge-reranker with a classification head): an encoder — absolute
    /// positions, token types, LayerNorms after attention and feed-forward,
    /// GELU, attention over the whole input (`encoder.rs`).
    Bert,
    /// nomic-bert (nomic-embed-text): bert with a fused `attn_qkv`, NeoX
    /// RoPE in place of position embeddings and a SwiGLU feed-forward
    /// without biases (`encoder.rs`).
    NomicBert,
}

impl Arch {
    /// Whether the model is an encoder (it embeds, it does not generate).
    pub fn is_encoder(self) -> bool {
        matches!(self, Arch::Bert | Arch::NomicBert)
    }
}

/// The gated activation of the feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// `silu(gate) · up`.
    SwiGlu,
    /// `gelu_tanh(gate) · up`, as ggml's f16-table GELU.
    GeGlu,
}

/// Hyper-parameters read from the GGUF metadata.
#[derive(Debug, Clone)]
pub struct Config {
    /// The architecture.
    pub arch: Arch,
    /// The GGUF `general.architecture` string.
    pub arch_name: String,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Feed-forward size.
    pub n_ff: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Context the model was trained for.
    pub n_ctx_train: usize,
    /// How the file says to pool its token states into one embedding
    /// (`{arch}.pooling_type`); `None` when it does not say (a chat model).
    pub pooling: Option<crate::embed::Pooling>,
    pub(crate) rope_base: f32,
    /// RoPE base of sliding-window layers.
    pub(crate) rope_base_swa: f32,
    /// RoPE frequency scale of sliding-window layers (llama.cpp's
    /// `rope_freq_scale_train_swa`: 1 on gemma3, the file's on gemma2).
    pub(crate) rope_scale_swa: f32,
    /// RoPE scaling as the file declares it (`rope.rs`).
    pub(crate) rope: crate::rope::RopeConfig,
    pub(crate) rope_dims: usize,
    pub(crate) rope_neox: bool,
    pub(crate) eps: f32,
    /// The feed-forward activation.
    pub(crate) act: Act,
    /// Embeddings multiplied by this after lookup (gemma: √n_embd).
    pub(crate) embd_scale: Option<f32>,
    /// Queries multiplied by this before attention (gemma); attention's own
    /// scale is then `attn_scale`.
    pub(crate) q_scale: Option<f32>,
    /// Scale of the attention scores.
    pub(crate) attn_scale: f32,
    /// Soft-capping of attention scores (gemma2).
    pub(crate) attn_softcap: Option<f32>,
    /// Soft-capping of the logits (gemma2).
    pub(crate) final_softcap: Option<f32>,
    /// Sliding window (positions a query sees, itself included).
    pub(crate) swa: Option<usize>,
    /// Which layers use the sliding window.
    swa_layers: Vec<bool>,
    /// The experts of a mixture-of-experts model (`moe.rs`).
    pub(crate) moe: Option<crate::moe::MoeConfig>,
}

impl Config {
    pub(crate) fn read(g: &Gguf) -> Result<Config> {
        let arch_name = g
            .string("general.architecture")
            .ok_or_else(|| model_err("GGUF metadata `general.architecture` is missing"))?
            .to_owned();
        let arch = match arch_name.as_str() {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            "gemma2" => Arch::Gemma2,
            "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            "bert" => Arch::Bert,
            "nomic-bert" => Arch::NomicBert,
            other => {
                return Err(model_err(format!(
                "architecture `{other}` is not supported (supported: llama, mistral, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3; embedding models: bert, nomic-bert)"
            )))
            }
        };
        let k = |s: &str| format!("{arch_name}.{s}");
        let need = |s: &str| -> Result<usize> {
            let v = g.need_u32(&k(s))? as usize;
            if v == 0 || v > 1 << 20 {
                return Err(model_err(format!("metadata `{}` is {v}, which no model has", k(s))));
            }
            Ok(v)
        };
        let n_embd = need("embedding_length")?;
        let n_head = need("attention.head_count")?;
        let n_layer = need("block_count")?;
        let n_kv = g.u32(&k("attention.head_count_kv")).map(|v| v as usize).unwrap_or(n_head);
        let head_dim =
            g.u32(&k("attention.key_length")).map(|v| v as usize).unwrap_or(n_embd / n_head.max(1));
        let (_, n_vocab, emb_cols) = g.shape("token_embd.weight")?;
        if emb_cols != n_embd {
            return Err(model_err(format!(
                "tensor `token_embd.weight` has rows of {emb_cols} values, but `{}` is {n_embd}",
                k("embedding_length")
            )));
        }
        let rope_base = g.f32(&k("rope.freq_base")).unwrap_or(10_000.0);
        let n_ctx_train = g.u32(&k("context_length")).unwrap_or(4096) as usize;
        let rope = crate::rope::RopeConfig::read(g, arch, &arch_name, n_ctx_train)?;
        let gemma = matches!(arch, Arch::Gemma2 | Arch::Gemma3);
        let swa = if gemma {
            let default = if arch == Arch::Gemma2 { Some(4096) } else { None };
            g.u32(&k("attention.sliding_window")).map(|v| v as usize).filter(|&v| v > 0).or(default)
        } else {
            None
        };
        // llama.cpp's `set_swa_pattern(n)`: layer il slides when il % n < n - 1.
        let pattern = match arch {
            Arch::Gemma2 => 2,
            Arch::Gemma3 => 6,
            _ => 0,
        };
        let swa_layers: Vec<bool> = (0..n_layer)
            .map(|il| swa.is_some() && pattern > 0 && il % pattern < pattern - 1)
            .collect();
        let rope_base_swa = match arch {
            Arch::Gemma3 => g.f32(&k("rope.freq_base_swa")).unwrap_or(10_000.0),
            _ => g.f32(&k("rope.freq_base_swa")).unwrap_or(rope_base),
        };
        // gemma_pytorch's query scaling (llama.cpp `f_attention_scale`).
        let gemma_scale = || {
            if n_layer == 46 || n_layer == 62 {
                1.0 / ((n_embd / n_head) as f32).sqrt()
            } else {
                1.0 / (head_dim as f32).sqrt()
            }
        };
        let softcap = |s: &str| g.f32(&k(s)).filter(|v| *v != 0.0);
        let moe = crate::moe::MoeConfig::read(g, arch, &arch_name)?;
        // A mixture's dense feed-forward size is only informative.
        let n_ff = match &moe {
            Some(m) => g.u32(&k("feed_forward_length")).map_or(m.n_ff, |v| v as usize),
            None => need("feed_forward_length")?,
        };
        let cfg = Config {
            arch,
            arch_name: arch_name.clone(),
            n_layer,
            n_embd,
            n_head,
            n_kv,
            head_dim,
            n_ff,
            n_vocab,
            n_ctx_train,
            pooling: crate::embed::Pooling::read(g, &arch_name)?,
            rope_base,
            rope_base_swa,
            rope_scale_swa: if arch == Arch::Gemma3 { 1.0 } else { rope.freq_scale },
            rope,
            rope_dims: g.u32(&k("rope.dimension_count")).map(|v| v as usize).unwrap_or(head_dim),
            // bert takes no RoPE; nomic-bert's is NeoX (llama.cpp's
            // `llama_model_rope_type`).
            rope_neox: arch != Arch::Llama,
            // The encoders' LayerNorm reads its own key (llama.cpp's
            // `LLM_KV_ATTENTION_LAYERNORM_EPS`, which it requires).
            eps: if arch.is_encoder() {
                g.f32(&k("attention.layer_norm_epsilon")).ok_or_else(|| {
                    model_err(format!(
                        "GGUF metadata `{}` is missing (an encoder's LayerNorm needs it)",
                        k("attention.layer_norm_epsilon")
                    ))
                })?
            } else {
                g.f32(&k("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5)
            },
            act: if gemma { Act::GeGlu } else { Act::SwiGlu },
            embd_scale: gemma.then(|| (n_embd as f32).sqrt()),
            // phi3 scales the queries by 1/√head (`ggml_scale`) and attends
            // with a scale of 1 (src/models/phi3.cpp).
            q_scale: if arch == Arch::Phi3 {
                Some(1.0 / (head_dim as f32).sqrt())
            } else {
                gemma.then(gemma_scale)
            },
            attn_scale: if gemma || arch == Arch::Phi3 {
                1.0
            } else {
                1.0 / (head_dim as f32).sqrt()
            },
            attn_softcap: if arch == Arch::Gemma2 {
                softcap("attn_logit_softcapping")
            } else {
                None
            },
            final_softcap: if gemma { softcap("final_logit_softcapping") } else { None },
            swa,
            swa_layers,
            moe,
        };
        if cfg.n_kv == 0
            || !cfg.n_head.is_multiple_of(cfg.n_kv)
            || !cfg.head_dim.is_multiple_of(2)
            || cfg.head_dim > crate::kernels::attn::MAX_HEAD
            || cfg.rope_dims > cfg.head_dim
            || !cfg.rope_dims.is_multiple_of(2)
        {
            return Err(model_err(format!(
                "unsupported attention shape: {} heads, {} kv heads, head size {} (at most {}), {} rotated dimensions",
                cfg.n_head,
                cfg.n_kv,
                cfg.head_dim,
                crate::kernels::attn::MAX_HEAD,
                cfg.rope_dims
            )));
        }
        if !cfg.n_embd.is_multiple_of(32) || !cfg.n_ff.is_multiple_of(32) {
            return Err(model_err(format!(
                "hidden size {} and feed-forward size {} must be multiples of 32",
                cfg.n_embd, cfg.n_ff
            )));
        }
        Ok(cfg)
    }

    /// Whether layer `il` attends through the sliding window.
    pub(crate) fn layer_swa(&self, il: usize) -> bool {
        self.swa_layers.get(il).copied().unwrap_or(false)
    }

    /// The RoPE scaling in words, at context `context` (which of phi3's
    /// longrope factors apply depends on it): `none`, `llama3 (rope_freqs)`,
    /// `linear ×8`, `yarn ×4 from 32768`, `longrope (long factors: context
    /// 8192 > 4096), attention ×1.19`.
    pub fn rope_scaling(&self, context: usize) -> String {
        self.rope.describe(context)
    }
}
