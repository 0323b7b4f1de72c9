//! Reading a GGUF file: the header, metadata and tensor directory parsed
//! by hand, and tensor bytes read one tensor (or a slice of rows) at a time,
//! so loading never holds the whole file twice.
//!
//! INVARIANT: nothing here trusts a count or size the file claims. Every
//! length is checked against the bytes that remain in the file before
//! anything is allocated for it, every tensor's data must lie inside the
//! file, and every failure is a typed [`ErrorKind::Model`] error naming the
//! key or tensor — never a panic, never an allocation sized by the file.
//! (`fuzz/` holds a cargo-fuzz target over [`Gguf::parse`] and the model
//! configuration.)

use crate::error::{model_err, Error, ErrorKind, Result};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// A GGUF tensor type (ggml's `ggml_type`), with its block geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types, missing_docs)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

impl GgmlType {
    /// The type of a GGUF type id, if this reader knows it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            _ => return None,
        })
    }

    /// `(elements per block, bytes per block)`.
    pub fn block(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 | I32 => (1, 4),
            F16 | BF16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Q2_K => (256, 84),
            Q3_K => (256, 110),
            Q4_K => (256, 144),
            Q5_K => (256, 176),
            Q6_K => (256, 210),
            Q8_K => (256, 292),
            IQ2_XXS => (256, 66),
            IQ2_XS => (256, 74),
            IQ3_XXS => (256, 98),
            IQ1_S => (256, 50),
            IQ4_NL => (32, 18),
            IQ3_S => (256, 110),
            IQ2_S => (256, 82),
            IQ4_XS => (256, 136),
            IQ1_M => (256, 56),
            TQ1_0 => (256, 54),
            TQ2_0 => (256, 66),
            MXFP4 => (32, 17),
        }
    }

    /// Bytes of one row of `cols` elements, or `None` when `cols` is not a
    /// whole number of blocks (or the size overflows).
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        let (be, bb) = self.block();
        if !cols.is_multiple_of(be) {
            return None;
        }
        (cols / be).checked_mul(bb)
    }

    /// ggml's name for the type (`q4_K`, `f16`…).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2_K => "q2_K",
            Q3_K => "q3_K",
            Q4_K => "q4_K",
            Q5_K => "q5_K",
            Q6_K => "q6_K",
            Q8_K => "q8_K",
            IQ2_XXS => "iq2_xxs",
            IQ2_XS => "iq2_xs",
            IQ3_XXS => "iq3_xxs",
            IQ1_S => "iq1_s",
            IQ4_NL => "iq4_nl",
            IQ3_S => "iq3_s",
            IQ2_S => "iq2_s",
            IQ4_XS => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            IQ1_M => "iq1_m",
            BF16 => "bf16",
            TQ1_0 => "tq1_0",
            TQ2_0 => "tq2_0",
            MXFP4 => "mxfp4",
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

/// Where a tensor is and what it holds.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Its type.
    pub ty: GgmlType,
    /// Dimensions, innermost first (as GGUF writes them: `[cols, rows]`).
    pub dims: Vec<usize>,
    /// Offset of its data from the start of the file.
    pub start: u64,
    /// Bytes of data.
    pub bytes: usize,
}

impl TensorInfo {
    /// Elements in all.
    pub fn elems(&self) -> usize {
        self.dims.iter().product()
    }
}

/// The parsed header of a GGUF file: metadata and tensor directory.
#[derive(Debug, Clone, Default)]
pub struct Header {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata, in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensors by name.
    pub tensors: HashMap<String, TensorInfo>,
    /// Tensor names in file order.
    pub order: Vec<String>,
}

/// An open GGUF file.
#[derive(Debug)]
pub(crate) struct Gguf {
    pub(crate) path: PathBuf,
    pub(crate) header: Header,
    index: HashMap<String, usize>,
    file: BufReader<File>,
    /// Tensors whose data has been read (any rows): what the loader used
    /// ([`Gguf::unread`]).
    read: std::collections::HashSet<String>,
}

/// Largest metadata array accepted (the largest vocabularies have ~260k
/// entries).
const MAX_ARRAY: u64 = 1 << 24;
/// Largest string accepted (a chat template is some kilobytes).
const MAX_STRING: u64 = 1 << 24;
/// Array nesting accepted.
const MAX_DEPTH: u32 = 2;

/// A bounded reader over the header bytes: every read checks what is left.
struct Cursor<'a, R: Read> {
    r: &'a mut R,
    /// Bytes of the file not yet read.
    left: u64,
    at: u64,
}

impl<R: Read> Cursor<'_, R> {
    fn bytes(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<Vec<u8>> {
        if n > self.left {
            return Err(model_err(format!(
                "{}: needs {n} bytes at offset {} but the file has {} left; the file is truncated or corrupt",
                what(),
                self.at,
                self.left
            )));
        }
        let mut buf = vec![0u8; n as usize];
        self.r.read_exact(&mut buf).map_err(|e| {
            model_err(format!("{}: cannot read {n} bytes at offset {}: {e}", what(), self.at))
        })?;
        self.left -= n;
        self.at += n;
        Ok(buf)
    }

    fn arr<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let v = self.bytes(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&v);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let n = self.u64(what)?;
        if n > MAX_STRING {
            return Err(model_err(format!("{}: a string of {n} bytes is implausible", what())));
        }
        let b = self.bytes(n, what)?;
        String::from_utf8(b).map_err(|_| model_err(format!("{}: a string is not UTF-8", what())))
    }

    fn value(&mut self, ty: u32, depth: u32, what: &dyn Fn() -> String) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.arr::<1>(what)?[0]),
            1 => Value::I8(self.arr::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.arr(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(what)?)),
            7 => Value::Bool(self.arr::<1>(what)?[0] != 0),
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(model_err(format!("{}: arrays nested too deep", what())));
                }
                let ety = self.u32(what)?;
                let n = self.u64(what)?;
                // The smallest element is one byte (strings take at least 8):
                // a count the remaining bytes cannot hold is refused before
                // anything is allocated.
                let min = match ety {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => {
                        return Err(model_err(format!(
                            "{}: array of unknown value type {other}",
                            what()
                        )))
                    }
                };
                if n > MAX_ARRAY || n.saturating_mul(min) > self.left {
                    return Err(model_err(format!(
                        "{}: an array of {n} values does not fit in the {} bytes left",
                        what(),
                        self.left
                    )));
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(ety, depth + 1, what)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.arr(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(what)?)),
            other => return Err(model_err(format!("{}: unknown value type {other}", what()))),
        })
    }
}

impl Header {
    /// Parses a GGUF header from `r`, a file of `len` bytes. See the module
    /// INVARIANT: malformed input is an error naming what is wrong.
    pub fn parse<R: Read>(r: &mut R, len: u64) -> Result<Header> {
        let mut c = Cursor { r, left: len, at: 0 };
        let file = || "GGUF header".to_owned();
        let magic = c.arr::<4>(&file)?;
        if &magic != b"GGUF" {
            return Err(model_err(format!(
                "not a GGUF file (magic {:?}, want \"GGUF\")",
                String::from_utf8_lossy(&magic)
            )));
        }
        let version = c.u32(&file)?;
        if !(2..=3).contains(&version) {
            return Err(model_err(format!("GGUF version {version} is not supported (2 or 3)")));
        }
        let n_tensors = c.u64(&file)?;
        let n_kv = c.u64(&file)?;
        // A key-value pair takes at least 12 bytes, a tensor entry 24.
        if n_kv.saturating_mul(12) > c.left || n_tensors.saturating_mul(24) > c.left {
            return Err(model_err(format!(
                "GGUF header claims {n_kv} metadata entries and {n_tensors} tensors, more than the {len}-byte file can hold"
            )));
        }
        let mut metadata = Vec::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata entry {i}"))?;
            let what = || format!("metadata `{key}`");
            let ty = c.u32(&what)?;
            let v = c.value(ty, 0, &what)?;
            metadata.push((key, v));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => 32u64,
            Some((_, Value::U32(a))) if *a > 0 && a.is_power_of_two() => *a as u64,
            Some((_, v)) => {
                return Err(model_err(format!(
                    "metadata `general.alignment` is {v:?}, want a power of two"
                )))
            }
        };
        let mut infos = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = c.string(&|| format!("tensor entry {i}"))?;
            let what = || format!("tensor `{name}`");
            let nd = c.u32(&what)?;
            if nd == 0 || nd > 4 {
                return Err(model_err(format!("tensor `{name}` has {nd} dimensions (1 to 4)")));
            }
            let mut dims = Vec::with_capacity(nd as usize);
            for _ in 0..nd {
                let d = c.u64(&what)?;
                dims.push(usize::try_from(d).map_err(|_| {
                    model_err(format!("tensor `{name}`: dimension {d} is too large"))
                })?);
            }
            let tid = c.u32(&what)?;
            let ty = GgmlType::from_id(tid)
                .ok_or_else(|| model_err(format!("tensor `{name}` has unknown type id {tid}")))?;
            let offset = c.u64(&what)?;
            infos.push((name, dims, ty, offset));
        }
        let data = c.at.div_ceil(alignment) * alignment;
        let mut tensors = HashMap::with_capacity(infos.len());
        let mut order = Vec::with_capacity(infos.len());
        for (name, dims, ty, offset) in infos {
            let elems = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let cols = dims[0];
            let bytes = elems.and_then(|e| {
                let rows = e.checked_div(cols.max(1))?;
                ty.row_bytes(cols)?.checked_mul(rows)
            });
            let Some(bytes) = bytes else {
                return Err(model_err(format!(
                    "tensor `{name}` ({ty}, dims {dims:?}): rows of {cols} are not whole {ty} blocks of {}, or the size overflows",
                    ty.block().0
                )));
            };
            let start = data.checked_add(offset);
            match start.and_then(|s| s.checked_add(bytes as u64)) {
                Some(end) if end <= len => {}
                _ => {
                    return Err(model_err(format!(
                        "tensor `{name}` ({ty}, dims {dims:?}, {bytes} bytes at offset {offset}) lies beyond the end of the {len}-byte file; the file is truncated, re-download it with `agentd pull`"
                    )))
                }
            }
            if tensors.contains_key(&name) {
                return Err(model_err(format!("tensor `{name}` appears twice")));
            }
            order.push(name.clone());
            tensors.insert(name, TensorInfo { ty, dims, start: start.unwrap_or_default(), bytes });
        }
        Ok(Header { version, metadata, tensors, order })
    }
}

impl Gguf {
    pub(crate) fn open(path: &Path) -> Result<Gguf> {
        let f = File::open(path).map_err(|e| {
            Error::new(ErrorKind::Io, format!("cannot open model {}: {e}", path.display()))
        })?;
        let len = f
            .metadata()
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot stat {}: {e}", path.display())))?
            .len();
        let mut file = BufReader::new(f);
        let header = Header::parse(&mut file, len)
            .map_err(|e| model_err(format!("{}: {e}", path.display())))?;
        let index = header.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        Ok(Gguf { path: path.to_owned(), header, index, file, read: Default::default() })
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.header.metadata[i].1)
    }

    pub(crate) fn u32(&self, key: &str) -> Option<u32> {
        match self.get(key)? {
            Value::U8(v) => Some(*v as u32),
            Value::I8(v) => u32::try_from(*v).ok(),
            Value::U16(v) => Some(*v as u32),
            Value::I16(v) => u32::try_from(*v).ok(),
            Value::U32(v) => Some(*v),
            Value::I32(v) => u32::try_from(*v).ok(),
            Value::U64(v) => u32::try_from(*v).ok(),
            Value::I64(v) => u32::try_from(*v).ok(),
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

    pub(crate) fn bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
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
                    Value::I16(x) => Some(*x as i64),
                    Value::U16(x) => Some(*x as i64),
                    Value::I64(x) => Some(*x),
                    Value::U64(x) => i64::try_from(*x).ok(),
                    Value::Bool(b) => Some(*b as i64),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    pub(crate) fn floats(&self, key: &str) -> Option<Vec<f32>> {
        match self.get(key)? {
            Value::Array(a) => a
                .iter()
                .map(|v| match v {
                    Value::F32(x) => Some(*x),
                    Value::F64(x) => Some(*x as f32),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    /// Frees the vocabulary arrays (`tokenizer.ggml.tokens`, `merges`, …)
    /// once the tokenizer has been built from them.
    pub(crate) fn drop_vocab(&mut self) {
        self.header
            .metadata
            .retain(|(k, v)| !(k.starts_with("tokenizer.ggml.") && matches!(v, Value::Array(_))));
        self.index =
            self.header.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.header.tensors.contains_key(name)
    }

    pub(crate) fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.header.tensors.get(name).ok_or_else(|| {
            model_err(format!("{}: tensor `{name}` is missing", self.path.display()))
        })
    }

    /// Type and `(rows, cols)` of a tensor (cols = elements per row; higher
    /// dimensions fold into rows).
    pub(crate) fn shape(&self, name: &str) -> Result<(GgmlType, usize, usize)> {
        let info = self.info(name)?;
        let cols = info.dims[0];
        let rows = info.elems() / cols.max(1);
        Ok((info.ty, rows, cols))
    }

    /// The raw bytes of a tensor.
    pub(crate) fn bytes(&mut self, name: &str) -> Result<Vec<u8>> {
        let (ty, rows, _) = self.shape(name)?;
        let mut buf = vec![0u8; self.info(name)?.bytes];
        self.read_rows(name, 0, &mut buf)?;
        debug_assert!(rows == 0 || buf.len() % rows == 0, "{ty}");
        Ok(buf)
    }

    /// A handle on the file and the byte where tensor `name`'s data starts,
    /// for rows read on demand instead of copied into memory (the tensor
    /// counts as read).
    pub(crate) fn data_handle(&mut self, name: &str) -> Result<(File, u64)> {
        let start = self.info(name)?.start;
        let file = self.file.get_ref().try_clone().map_err(|e| {
            Error::new(ErrorKind::Io, format!("cannot reopen {}: {e}", self.path.display()))
        })?;
        self.read.insert(name.to_owned());
        Ok((file, start))
    }

    /// Whole rows `row0..row0 + buf.len() / row_bytes` of a tensor into
    /// `buf`, so that large tensors can be read a slice at a time.
    pub(crate) fn read_rows(&mut self, name: &str, row0: usize, buf: &mut [u8]) -> Result<()> {
        let (ty, rows, cols) = self.shape(name)?;
        let info = self.info(name)?;
        let start = info.start;
        // `Header::parse` checked that whole rows fit the type's blocks.
        let row_bytes = ty.row_bytes(cols).unwrap_or(0).max(1);
        let n = buf.len() / row_bytes;
        if !buf.len().is_multiple_of(row_bytes) || row0 + n > rows {
            return Err(model_err(format!(
                "tensor `{name}`: rows {row0}..{} requested of {rows}",
                row0 + n
            )));
        }
        let at = start + (row0 * row_bytes) as u64;
        let path = self.path.display().to_string();
        let io = |e: std::io::Error| {
            model_err(format!(
                "{path}: cannot read rows {row0}..{} of tensor `{name}` at byte {at}: {e}; the file may be truncated, re-download it with `agentd pull`",
                row0 + n
            ))
        };
        read_at(&mut self.file, at, buf).map_err(io)?;
        if !self.read.contains(name) {
            self.read.insert(name.to_owned());
        }
        Ok(())
    }

    /// The tensors no data has been read of, in file order.
    pub(crate) fn unread(&self) -> Vec<&str> {
        self.header
            .order
            .iter()
            .filter(|n| !self.read.contains(n.as_str()))
            .map(String::as_str)
            .collect()
    }

    /// A tensor as candle's quantized tensor (for types the fast path lacks).
    pub(crate) fn qtensor(&mut self, name: &str) -> Result<candle_core::quantized::QTensor> {
        let (_, rows, _) = self.shape(name)?;
        self.qtensor_rows(name, 0, rows)
    }

    /// Rows `row0 .. row0 + rows` of a tensor (higher dimensions folded into
    /// rows, as [`Gguf::shape`]: one expert of a 3-D tensor) as candle's
    /// 2-D quantized tensor; the range is checked by [`Gguf::read_rows`].
    pub(crate) fn qtensor_rows(
        &mut self,
        name: &str,
        row0: usize,
        rows: usize,
    ) -> Result<candle_core::quantized::QTensor> {
        use candle_core::quantized::GgmlDType as D;
        let info = self.info(name)?.clone();
        let dt = match info.ty {
            GgmlType::F32 => D::F32,
            GgmlType::F16 => D::F16,
            GgmlType::BF16 => D::BF16,
            GgmlType::Q4_0 => D::Q4_0,
            GgmlType::Q4_1 => D::Q4_1,
            GgmlType::Q5_0 => D::Q5_0,
            GgmlType::Q5_1 => D::Q5_1,
            GgmlType::Q8_0 => D::Q8_0,
            GgmlType::Q8_1 => D::Q8_1,
            GgmlType::Q2_K => D::Q2K,
            GgmlType::Q3_K => D::Q3K,
            GgmlType::Q4_K => D::Q4K,
            GgmlType::Q5_K => D::Q5K,
            GgmlType::Q6_K => D::Q6K,
            GgmlType::Q8_K => D::Q8K,
            other => {
                return Err(model_err(format!(
                    "tensor `{name}` has type {other}, which this engine cannot run (supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K … q6_K)"
                )))
            }
        };
        let cols = info.dims[0];
        let row_bytes = info.ty.row_bytes(cols).unwrap_or(0);
        let len = rows.checked_mul(row_bytes).ok_or_else(|| {
            model_err(format!("tensor `{name}`: {rows} rows of {row_bytes} bytes overflow"))
        })?;
        if len > info.bytes {
            return Err(model_err(format!(
                "tensor `{name}`: rows {row0}..{} requested beyond its {} bytes",
                row0.saturating_add(rows),
                info.bytes
            )));
        }
        let mut raw = vec![0u8; len];
        self.read_rows(name, row0, &mut raw)?;
        // candle's dimensions, outermost first: the whole tensor's, or the
        // slice's rows × cols.
        let dims = if row0 == 0 && len == info.bytes {
            info.dims.iter().rev().copied().collect()
        } else {
            vec![rows, cols]
        };
        Ok(candle_core::quantized::ggml_file::qtensor_from_ggml(
            dt,
            &raw,
            dims,
            &candle_core::Device::Cpu,
        )?)
    }
}

/// Reads `buf.len()` bytes of `file` from byte `at`. A large read (a weight
/// matrix) is split across a few threads reading their parts at once
/// (`pread`): copying from the page cache and faulting in the destination's
/// pages is most of a large file's load, and one thread did all of it.
fn read_at(file: &mut BufReader<File>, at: u64, buf: &mut [u8]) -> std::io::Result<()> {
    const PART: usize = 8 << 20;
    #[cfg(unix)]
    if buf.len() >= 2 * PART {
        use std::os::unix::fs::FileExt;
        let f = file.get_ref();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
        let part = buf.len().div_ceil(threads).max(PART);
        return std::thread::scope(|s| {
            let parts: Vec<_> = buf
                .chunks_mut(part)
                .enumerate()
                .map(|(i, b)| s.spawn(move || f.read_exact_at(b, at + (i * part) as u64)))
                .collect();
            parts
                .into_iter()
                .try_for_each(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
        });
    }
    file.seek(SeekFrom::Start(at))?;
    file.read_exact(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal GGUF writer for tests.
    pub(crate) struct W(pub(crate) Vec<u8>);

    impl W {
        pub(crate) fn new(n_tensors: u64, n_kv: u64) -> W {
            let mut b = b"GGUF".to_vec();
            b.extend(3u32.to_le_bytes());
            b.extend(n_tensors.to_le_bytes());
            b.extend(n_kv.to_le_bytes());
            W(b)
        }
        pub(crate) fn str(&mut self, s: &str) {
            self.0.extend((s.len() as u64).to_le_bytes());
            self.0.extend(s.as_bytes());
        }
        pub(crate) fn kv_u32(&mut self, k: &str, v: u32) {
            self.str(k);
            self.0.extend(4u32.to_le_bytes());
            self.0.extend(v.to_le_bytes());
        }
        pub(crate) fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, off: u64) {
            self.str(name);
            self.0.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                self.0.extend(d.to_le_bytes());
            }
            self.0.extend(ty.to_le_bytes());
            self.0.extend(off.to_le_bytes());
        }
        pub(crate) fn align(&mut self) {
            while !self.0.len().is_multiple_of(32) {
                self.0.push(0);
            }
        }
    }

    fn parse(b: &[u8]) -> Result<Header> {
        Header::parse(&mut &b[..], b.len() as u64)
    }

    #[test]
    fn reads_a_small_file() {
        let mut w = W::new(1, 1);
        w.kv_u32("a.b", 7);
        w.tensor("t", &[32, 2], 8, 0);
        w.align();
        w.0.extend(vec![0u8; 68]);
        let h = parse(&w.0).unwrap();
        assert_eq!(h.metadata, vec![("a.b".to_owned(), Value::U32(7))]);
        let t = &h.tensors["t"];
        assert_eq!((t.ty, t.bytes, t.dims.clone()), (GgmlType::Q8_0, 68, vec![32, 2]));
    }

    #[test]
    fn malformed_headers_are_typed_errors_naming_what() {
        let mut huge = W::new(0, 1);
        huge.str("k");
        huge.0.extend(9u32.to_le_bytes());
        huge.0.extend(4u32.to_le_bytes());
        huge.0.extend(u64::MAX.to_le_bytes());
        let mut trunc = W::new(1, 0);
        trunc.tensor("blk.0.w", &[32, 4], 8, 0);
        let mut badty = W::new(1, 0);
        badty.tensor("x", &[32], 99, 0);
        let mut ragged = W::new(1, 0);
        ragged.tensor("r", &[33, 2], 8, 0);
        ragged.align();
        ragged.0.extend(vec![0u8; 200]);
        let cases: [(&[u8], &str); 6] = [
            (b"GGUX\x03\0\0\0", "not a GGUF"),
            (&huge.0, "metadata `k`"),
            (&trunc.0, "tensor `blk.0.w`"),
            (&badty.0, "unknown type id 99"),
            (&ragged.0, "tensor `r`"),
            (b"GGUF\x03\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff\0\0\0\0\0\0\0\0", "more than"),
        ];
        for (bytes, want) in cases {
            let e = parse(bytes).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Model);
            assert!(e.to_string().contains(want), "{e} (want {want})");
        }
    }
}
