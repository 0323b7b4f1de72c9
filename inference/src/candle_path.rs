//! candle's own model code on a candle device: the path `--device cuda[:N]`
//! and `--device metal` take, and `--device candle-cpu`, the same code on
//! candle's CPU backend, which is how this path is tested on machines
//! without a GPU.
//!
//! candle keeps one KV cache inside the model weights and cannot truncate
//! it, so the cache belongs to one session at a time. A session whose next
//! tokens extend exactly what the cache holds for it continues from there;
//! anything else (another session ran in between, or the prompt diverges)
//! clears the cache and runs the session's tokens again from position 0:
//! slower, never wrong.

use crate::arch::Arch;
use crate::error::{model_err, Error, ErrorKind, Result};
use candle_core::quantized::gguf_file;
use candle_core::{DType, Tensor};
use candle_transformers::models::{quantized_llama, quantized_qwen2, quantized_qwen3};
use std::path::Path;
use std::sync::Mutex;

/// candle's model for each architecture the engine loads.
enum Weights {
    Llama(quantized_llama::ModelWeights),
    Qwen2(quantized_qwen2::ModelWeights),
    Qwen3(quantized_qwen3::ModelWeights),
}

impl Weights {
    fn forward(&mut self, x: &Tensor, pos: usize) -> candle_core::Result<Tensor> {
        match self {
            Weights::Llama(m) => m.forward(x, pos),
            Weights::Qwen2(m) => m.forward(x, pos),
            Weights::Qwen3(m) => m.forward(x, pos),
        }
    }

    fn clear(&mut self) {
        match self {
            Weights::Llama(m) => m.clear_kv_cache(),
            Weights::Qwen2(m) => m.clear_kv_cache(),
            Weights::Qwen3(m) => m.clear_kv_cache(),
        }
    }
}

/// Whose tokens the cache inside the weights holds.
struct State {
    weights: Weights,
    /// The session (`Session::id`), 0 for none.
    owner: u64,
    /// Positions cached.
    len: usize,
}

/// A model on a candle device.
pub(crate) struct CandleModel {
    device: candle_core::Device,
    state: Mutex<State>,
    bytes: usize,
}

impl std::fmt::Debug for CandleModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleModel").field("device", &self.device).finish_non_exhaustive()
    }
}

/// The candle device for a `--device` choice, or an error that says which
/// build or machine would have it.
pub(crate) fn device(which: crate::Device) -> Result<candle_core::Device> {
    use crate::Device as D;
    let (made, feature, built) = match which {
        D::Cuda(n) => (candle_core::Device::new_cuda(n), "cuda", cfg!(feature = "cuda")),
        D::Metal => (candle_core::Device::new_metal(0), "metal", cfg!(feature = "metal")),
        D::CandleCpu | D::Cpu | D::Auto => return Ok(candle_core::Device::Cpu),
    };
    made.map_err(|e| {
        Error::new(
            ErrorKind::Device,
            if built {
                format!("device {which}: candle could not open it ({e}); check the driver, or use --device cpu")
            } else {
                format!("device {which} is not in this build: rebuild with `--features {feature}` on a machine that has it, or use --device cpu")
            },
        )
    })
}

impl CandleModel {
    /// Loads the GGUF at `path` with candle's model code onto `device`.
    pub(crate) fn load(path: &Path, arch: Arch, device: candle_core::Device) -> Result<Self> {
        let io = |e: std::io::Error| {
            Error::new(ErrorKind::Io, format!("cannot read {}: {e}", path.display()))
        };
        let mut f = std::fs::File::open(path).map_err(io)?;
        let content = gguf_file::Content::read(&mut f)
            .map_err(|e| model_err(format!("{} is not a readable GGUF: {e}", path.display())))?;
        let bytes = content
            .tensor_infos
            .values()
            .map(|t| t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size())
            .sum();
        let weights = match arch {
            Arch::Llama => {
                Weights::Llama(quantized_llama::ModelWeights::from_gguf(content, &mut f, &device)?)
            }
            Arch::Qwen2 => {
                Weights::Qwen2(quantized_qwen2::ModelWeights::from_gguf(content, &mut f, &device)?)
            }
            Arch::Qwen3 => {
                Weights::Qwen3(quantized_qwen3::ModelWeights::from_gguf(content, &mut f, &device)?)
            }
            Arch::Phi3 => {
                return Err(Error::new(
                    ErrorKind::Device,
                    "phi3 runs on the CPU path only (--device cpu); the GPU path has llama, qwen2 and qwen3",
                ))
            }
            Arch::Gemma2 | Arch::Gemma3 | Arch::Qwen3Moe | Arch::Bert | Arch::NomicBert => {
                return Err(Error::new(
                    ErrorKind::Device,
                    format!(
                        "{arch:?} runs on the CPU path only (--device cpu); the GPU path has llama, qwen2 and qwen3"
                    ),
                ))
            }
        };
        Ok(CandleModel { device, state: Mutex::new(State { weights, owner: 0, len: 0 }), bytes })
    }

    /// Bytes of weights.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Runs `new` after `history` (the tokens `session` has run so far) and
    /// writes the last position's logits.
    pub(crate) fn forward(
        &self,
        session: u64,
        history: &[u32],
        new: &[u32],
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        // A panic in another request cannot leave the weights half-updated
        // in a way that matters: the cache is cleared below unless it is
        // provably this session's.
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (pos, run): (usize, Vec<u32>) = if st.owner == session && st.len == history.len() {
            (st.len, new.to_vec())
        } else {
            st.weights.clear();
            st.owner = 0;
            (0, history.iter().chain(new).copied().collect())
        };
        if run.is_empty() {
            return Err(Error::new(ErrorKind::Input, "no tokens to run"));
        }
        let input = Tensor::new(run.as_slice(), &self.device)?.unsqueeze(0)?;
        // While the pass runs (and after it fails or panics) the cache's
        // state is unknown: nobody owns it.
        st.owner = 0;
        let out = st.weights.forward(&input, pos)?;
        st.owner = session;
        st.len = pos + run.len();
        *logits = out.squeeze(0)?.to_dtype(DType::F32)?.to_vec1()?;
        Ok(())
    }
}
