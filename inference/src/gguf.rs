//! Reading a GGUF file: metadata through candle's reader, tensor bytes read
//! one tensor at a time (so loading never holds the whole file twice).

use crate::error::{model_err, Error, ErrorKind, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// An open GGUF file.
#[derive(Debug)]
pub(crate) struct Gguf {
    pub(crate) path: PathBuf,
    pub(crate) content: Content,
    file: BufReader<File>,
}

impl Gguf {
    pub(crate) fn open(path: &Path) -> Result<Gguf> {
        let f = File::open(path).map_err(|e| {
            Error::new(ErrorKind::Io, format!("cannot open model {}: {e}", path.display()))
        })?;
        let mut file = BufReader::new(f);
        let content = Content::read(&mut file).map_err(|e| {
            model_err(format!(
                "{} is not a readable GGUF file ({e}); re-download it with `agentd pull`",
                path.display()
            ))
        })?;
        Ok(Gguf { path: path.to_owned(), content, file })
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    pub(crate) fn u32(&self, key: &str) -> Option<u32> {
        match self.get(key)? {
            Value::U8(v) => Some(*v as u32),
            Value::I8(v) => Some(*v as u32),
            Value::U16(v) => Some(*v as u32),
            Value::I16(v) => Some(*v as u32),
            Value::U32(v) => Some(*v),
            Value::I32(v) => Some(*v as u32),
            Value::U64(v) => Some(*v as u32),
            Value::I64(v) => Some(*v as u32),
            _ => None,
        }
    }

    pub(crate) fn need_u32(&self, key: &str) -> Result<u32> {
        self.u32(key).ok_or_else(|| {
            model_err(format!(
                "{}: metadata `{key}` is missing or not a number",
                self.path.display()
            ))
        })
    }

    pub(crate) fn f32(&self, key: &str) -> Option<f32> {
        match self.get(key)? {
            Value::F32(v) => Some(*v),
            Value::F64(v) => Some(*v as f32),
            _ => None,
        }
    }

    pub(crate) fn string(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn strings(&self, key: &str) -> Option<Vec<String>> {
        match self.get(key)? {
            Value::Array(a) => a
                .iter()
                .map(|v| match v {
                    Value::String(s) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    pub(crate) fn ints(&self, key: &str) -> Option<Vec<i64>> {
        match self.get(key)? {
            Value::Array(a) => a
                .iter()
                .map(|v| match v {
                    Value::I32(x) => Some(*x as i64),
                    Value::U32(x) => Some(*x as i64),
                    Value::I8(x) => Some(*x as i64),
                    Value::U8(x) => Some(*x as i64),
                    Value::I64(x) => Some(*x),
                    Value::U64(x) => Some(*x as i64),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    /// Frees the vocabulary arrays (`tokenizer.ggml.tokens`, `merges`, …)
    /// once the tokenizer has been built from them.
    pub(crate) fn drop_vocab(&mut self) {
        self.content
            .metadata
            .retain(|k, v| !(k.starts_with("tokenizer.ggml.") && matches!(v, Value::Array(_))));
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Type and `(rows, cols)` of a 1-D or 2-D tensor (cols = elements per row).
    pub(crate) fn shape(&self, name: &str) -> Result<(GgmlDType, usize, usize)> {
        let info = self.content.tensor_infos.get(name).ok_or_else(|| {
            model_err(format!("{}: tensor `{name}` is missing", self.path.display()))
        })?;
        let dims = info.shape.dims();
        let (rows, cols) = match dims {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            _ => {
                return Err(model_err(format!(
                    "tensor `{name}` has shape {dims:?}, want 1-D or 2-D"
                )))
            }
        };
        Ok((info.ggml_dtype, rows, cols))
    }

    /// The raw bytes of a tensor.
    pub(crate) fn bytes(&mut self, name: &str) -> Result<Vec<u8>> {
        let info = self.content.tensor_infos.get(name).ok_or_else(|| {
            model_err(format!("{}: tensor `{name}` is missing", self.path.display()))
        })?;
        let elems = info.shape.elem_count();
        let bs = info.ggml_dtype.block_size();
        if elems % bs != 0 {
            return Err(model_err(format!(
                "tensor `{name}`: {elems} elements, not a multiple of {bs}"
            )));
        }
        let size = elems / bs * info.ggml_dtype.type_size();
        let start = self.content.tensor_data_offset + info.offset;
        let mut buf = vec![0u8; size];
        let io = |e: std::io::Error| {
            model_err(format!(
                "{}: cannot read tensor `{name}` ({size} bytes at {start}): {e}; the file may be truncated, re-download it with `agentd pull`",
                self.path.display()
            ))
        };
        self.file.seek(SeekFrom::Start(start)).map_err(io)?;
        self.file.read_exact(&mut buf).map_err(io)?;
        Ok(buf)
    }

    /// Whole rows `row0..row0 + buf.len() / row_bytes` of a 2-D tensor into
    /// `buf`, so that large tensors can be repacked a slice at a time.
    pub(crate) fn read_rows(&mut self, name: &str, row0: usize, buf: &mut [u8]) -> Result<()> {
        let info = self.content.tensor_infos.get(name).ok_or_else(|| {
            model_err(format!("{}: tensor `{name}` is missing", self.path.display()))
        })?;
        let dims = info.shape.dims();
        let cols = *dims.last().unwrap_or(&0);
        let rows = info.shape.elem_count() / cols.max(1);
        let bs = info.ggml_dtype.block_size();
        if cols % bs != 0 {
            return Err(model_err(format!(
                "tensor `{name}`: rows of {cols} elements, not a multiple of {bs}"
            )));
        }
        let row_bytes = cols / bs * info.ggml_dtype.type_size();
        let n = buf.len() / row_bytes.max(1);
        if !buf.len().is_multiple_of(row_bytes.max(1)) || row0 + n > rows {
            return Err(model_err(format!(
                "tensor `{name}`: rows {row0}..{} requested of {rows}",
                row0 + n
            )));
        }
        let start = self.content.tensor_data_offset + info.offset + (row0 * row_bytes) as u64;
        let io = |e: std::io::Error| {
            model_err(format!(
                "{}: cannot read rows {row0}..{} of tensor `{name}` at byte {start}: {e}; the file may be truncated, re-download it with `agentd pull`",
                self.path.display(),
                row0 + n
            ))
        };
        self.file.seek(SeekFrom::Start(start)).map_err(io)?;
        self.file.read_exact(buf).map_err(io)?;
        Ok(())
    }

    /// A tensor as candle's quantized tensor (for types the fast path lacks).
    pub(crate) fn qtensor(&mut self, name: &str) -> Result<candle_core::quantized::QTensor> {
        let info = self.content.tensor_infos.get(name).ok_or_else(|| {
            model_err(format!("{}: tensor `{name}` is missing", self.path.display()))
        })?;
        Ok(info.read(&mut self.file, self.content.tensor_data_offset, &candle_core::Device::Cpu)?)
    }
}
