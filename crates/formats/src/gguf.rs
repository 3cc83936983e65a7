//! GGUF files (versions 2 and 3, little-endian), as llama.cpp and its converters write them: a
//! header of typed key-values (the model's hyperparameters, its tokenizer and chat template),
//! then tensor infos (name, dimensions, ggml type, offset into the data section), then the data,
//! each tensor aligned to `general.alignment` (32 by default).
//!
//! Parsing reads the header only, with every count and length checked against the bytes the
//! file has (a corrupt or hostile header is an error naming the file and field, never a huge
//! allocation); tensor offsets are checked to be aligned, in the file and not overlapping. A
//! model split over several files (`NAME-00001-of-00003.gguf`) opens from its first file.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::{FormatError, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// A ggml tensor type: its id as GGUF stores it, with the block size (elements) and block bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const BF16: GgmlType = GgmlType(30);

    /// The block types besides Q8_0 that strata's kernels compute on (`strata_kernels::ggml`; a
    /// test in `strata-weights` keeps the two lists equal): Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
    /// Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4.
    pub const KERNEL_BLOCKS: [GgmlType; 12] = [
        GgmlType(2),
        GgmlType(3),
        GgmlType(6),
        GgmlType(7),
        GgmlType(10),
        GgmlType(11),
        GgmlType(12),
        GgmlType(13),
        GgmlType(14),
        GgmlType(20),
        GgmlType(23),
        GgmlType(39),
    ];

    /// (name, elements per block, bytes per block) of the types ggml defines.
    fn layout(self) -> Option<(&'static str, u64, u64)> {
        Some(match self.0 {
            0 => ("F32", 1, 4),
            1 => ("F16", 1, 2),
            2 => ("Q4_0", 32, 18),
            3 => ("Q4_1", 32, 20),
            6 => ("Q5_0", 32, 22),
            7 => ("Q5_1", 32, 24),
            8 => ("Q8_0", 32, 34),
            9 => ("Q8_1", 32, 40),
            10 => ("Q2_K", 256, 84),
            11 => ("Q3_K", 256, 110),
            12 => ("Q4_K", 256, 144),
            13 => ("Q5_K", 256, 176),
            14 => ("Q6_K", 256, 210),
            15 => ("Q8_K", 256, 292),
            16 => ("IQ2_XXS", 256, 66),
            17 => ("IQ2_XS", 256, 74),
            18 => ("IQ3_XXS", 256, 98),
            19 => ("IQ1_S", 256, 50),
            20 => ("IQ4_NL", 32, 18),
            21 => ("IQ3_S", 256, 110),
            22 => ("IQ2_S", 256, 82),
            23 => ("IQ4_XS", 256, 136),
            24 => ("I8", 1, 1),
            25 => ("I16", 1, 2),
            26 => ("I32", 1, 4),
            27 => ("I64", 1, 8),
            28 => ("F64", 1, 8),
            29 => ("IQ1_M", 256, 56),
            30 => ("BF16", 1, 2),
            34 => ("TQ1_0", 256, 54),
            35 => ("TQ2_0", 256, 66),
            39 => ("MXFP4", 32, 17),
            _ => return None,
        })
    }

    pub fn name(self) -> String {
        match self.layout() {
            Some((n, _, _)) => n.to_string(),
            None => format!("unknown type {}", self.0),
        }
    }

    /// The name of a type ggml defines.
    pub fn static_name(self) -> Option<&'static str> {
        self.layout().map(|(n, _, _)| n)
    }

    /// Elements per block and bytes per block, for the types ggml defines.
    pub fn block(self) -> Option<(u64, u64)> {
        self.layout().map(|(_, n, b)| (n, b))
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
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

impl Value {
    /// An integer value of any width, as u64 (negative ones are `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer, as i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v as i64),
            Value::I16(v) => Some(v as i64),
            Value::I32(v) => Some(v as i64),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Any number, as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "uint8",
            Value::I8(_) => "int8",
            Value::U16(_) => "uint16",
            Value::I16(_) => "int16",
            Value::U32(_) => "uint32",
            Value::I32(_) => "int32",
            Value::U64(_) => "uint64",
            Value::I64(_) => "int64",
            Value::F32(_) => "float32",
            Value::F64(_) => "float64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// One tensor of a GGUF file.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    pub name: String,
    /// Dimensions as ggml orders them: `dims[0]` is the innermost (contiguous) one, so a
    /// `[rows, cols]` matrix of PyTorch is `[cols, rows]` here.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Which file of a split model holds it (0 for a single file).
    pub file: usize,
    /// Absolute offset of its first byte in that file.
    pub offset: u64,
    /// Its bytes (0 for a type ggml does not define: such a tensor is an error where it is used).
    pub len: u64,
}

impl GgufTensor {
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Dimensions outermost first, as PyTorch and safetensors order them.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF model: the metadata of its first file and the tensors of all its files.
#[derive(Clone, Debug)]
pub struct Gguf {
    /// The files, the first one first.
    pub paths: Vec<PathBuf>,
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    pub tensors: Vec<GgufTensor>,
}

fn bad(path: &Path, reason: impl Into<String>) -> FormatError {
    FormatError::BadGguf {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Whether `path` names a GGUF file (by its first four bytes).
pub fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    path.is_file()
        && File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
        && &magic == MAGIC
}

/// The file names of a split model whose first file is `path` (`NAME-00001-of-0000N.gguf`), or
/// just `path`.
/// (the name before the part number, part number, part count) of a split model's file named
/// `NAME-0000K-of-0000N.gguf` (five digits each, as llama.cpp's `gguf-split` writes them).
pub fn split_part(name: &str) -> Option<(&str, usize, usize)> {
    let stem = name.strip_suffix(".gguf")?;
    let (head, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = head.rsplit_once('-')?;
    let five = |d: &str| d.len() == 5 && d.bytes().all(|b| b.is_ascii_digit());
    if !five(no) || !five(count) {
        return None;
    }
    Some((prefix, no.parse().ok()?, count.parse().ok()?))
}

/// The names of every part of a split model whose parts are named from `prefix` (see
/// [`split_part`]).
pub fn split_part_names(prefix: &str, count: usize) -> Vec<String> {
    (1..=count)
        .map(|i| format!("{prefix}-{i:05}-of-{count:05}.gguf"))
        .collect()
}

/// Every file of the split model whose first file is `path`; None when `path` is not named as
/// a first part.
fn split_names(path: &Path) -> Option<Vec<PathBuf>> {
    let name = path.file_name()?.to_str()?;
    match split_part(name)? {
        (prefix, 1, n) => Some(
            split_part_names(prefix, n)
                .into_iter()
                .map(|f| path.with_file_name(f))
                .collect(),
        ),
        _ => None,
    }
}

impl Gguf {
    /// Parses `path` and, when it is the first file of a split model, the other files.
    pub fn open(path: &Path) -> Result<Gguf> {
        let first = parse_file(path, 0)?;
        let declared = first.metadata.get("split.count").and_then(|v| v.as_u64());
        let paths = match (split_names(path), declared) {
            (_, None | Some(1)) => vec![path.to_path_buf()],
            (Some(names), Some(n)) if names.len() as u64 == n => names,
            (_, Some(n)) => {
                return Err(bad(
                    path,
                    format!(
                        "split.count is {n}, but the file is not named as the first of {n} (NAME-00001-of-{n:05}.gguf)"
                    ),
                ))
            }
        };
        let mut gguf = Gguf {
            paths: paths.clone(),
            version: first.version,
            metadata: first.metadata,
            tensors: first.tensors,
        };
        for (i, p) in paths.iter().enumerate().skip(1) {
            if !p.is_file() {
                return Err(bad(path, format!("split file {} is missing", p.display())));
            }
            let part = parse_file(p, i)?;
            let no = part.metadata.get("split.no").and_then(|v| v.as_u64());
            if no != Some(i as u64) {
                return Err(bad(p, format!("split.no is {no:?}, expected {i}")));
            }
            gguf.tensors.extend(part.tensors);
        }
        let mut seen = HashMap::new();
        for (i, t) in gguf.tensors.iter().enumerate() {
            if let Some(j) = seen.insert(t.name.as_str(), i) {
                let file = &gguf.paths[gguf.tensors[j].file];
                return Err(bad(file, format!("tensor `{}` appears twice", t.name)));
            }
        }
        Ok(gguf)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| self.key_error("general.architecture", "missing or not a string"))
    }

    pub fn key_error(&self, key: &str, reason: impl Into<String>) -> FormatError {
        FormatError::BadKey {
            path: self.paths[0].clone(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    /// A required integer key.
    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.key_error(key, "missing (required by this architecture)"))
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                self.key_error(
                    key,
                    format!("expected a non-negative integer, found {}", v.type_name()),
                )
            }),
        }
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.key_error(key, format!("expected a number, found {}", v.type_name()))),
        }
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.key_error(key, format!("expected a string, found {}", v.type_name()))),
        }
    }
}

struct Parsed {
    version: u32,
    metadata: HashMap<String, Value>,
    tensors: Vec<GgufTensor>,
}

/// A reader of one file's header that knows how many bytes are left, so no count can ask for
/// more than the file holds. `avail` bytes can be read (all of them for a local file; the
/// fetched prefix of a remote one, [`header_end`]): a read past them sets `short`.
struct Header<'a, R: Read> {
    r: R,
    path: &'a Path,
    pos: u64,
    len: u64,
    avail: u64,
    short: bool,
}

impl<R: Read> Header<'_, R> {
    /// Fails (marking `short`) when the next `n` bytes are in the file but not in what can be
    /// read: checked before anything is allocated for them.
    fn within_prefix(&mut self, n: u64, what: &str) -> Result<()> {
        if self.pos + n > self.avail && self.avail < self.len {
            self.short = true;
            return Err(bad(
                self.path,
                format!("the header goes on past byte {} ({what})", self.avail),
            ));
        }
        Ok(())
    }

    fn read_exact(&mut self, b: &mut [u8], what: &str) -> Result<()> {
        self.within_prefix(b.len() as u64, what)?;
        self.r.read_exact(b).map_err(|_| {
            bad(
                self.path,
                format!("the file ends at byte {} inside the header ({what})", self.len),
            )
        })?;
        self.pos += b.len() as u64;
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.read_exact(&mut b, what)?;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    /// A count of items of at least `min_bytes` each that must fit in the rest of the file.
    fn count(&mut self, what: &str, min_bytes: u64) -> Result<u64> {
        let n = self.u64(what)?;
        let left = self.len - self.pos;
        if n.saturating_mul(min_bytes.max(1)) > left {
            return Err(bad(
                self.path,
                format!("{what} is {n}, more than the {left} bytes left in the file can hold"),
            ));
        }
        Ok(n)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)? as usize;
        self.within_prefix(n as u64, what)?;
        let mut b = vec![0u8; n];
        self.read_exact(&mut b, what)?;
        String::from_utf8(b).map_err(|_| bad(self.path, format!("{what} is not UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.bytes::<1>(key)?[0]),
            1 => Value::I8(self.bytes::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.bytes(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(i32::from_le_bytes(self.bytes(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes(key)?)),
            7 => match self.bytes::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(bad(self.path, format!("key `{key}`: bool byte {b}"))),
            },
            8 => Value::String(self.string(&format!("the length of key `{key}`'s string"))?),
            9 => {
                if depth > 0 {
                    return Err(bad(self.path, format!("key `{key}`: arrays nested in arrays")));
                }
                let elem = self.u32(key)?;
                let size = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    _ => 1,
                };
                let n = self.count(&format!("the length of key `{key}`'s array"), size)?;
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(i64::from_le_bytes(self.bytes(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes(key)?)),
            t => return Err(bad(self.path, format!("key `{key}`: unknown value type {t}"))),
        })
    }
}

fn parse_file(path: &Path, file: usize) -> Result<Parsed> {
    let f = File::open(path).map_err(|e| FormatError::io(path, e))?;
    let len = f.metadata().map_err(|e| FormatError::io(path, e))?.len();
    let mut h = Header {
        r: BufReader::with_capacity(1 << 20, f),
        path,
        pos: 0,
        len,
        avail: len,
        short: false,
    };
    parse_header(&mut h, file).map(|(parsed, _)| parsed)
}

/// Where the data section of a GGUF file of `file_len` bytes starts, from a prefix of it:
/// `Ok(None)` when the header goes on past the prefix (fetch more and ask again), an error when
/// the header is malformed. A remote GGUF's header is fetched this way before it is opened.
pub fn header_end(prefix: &[u8], file_len: u64, path: &Path) -> Result<Option<u64>> {
    let mut h = Header {
        r: prefix,
        path,
        pos: 0,
        len: file_len,
        avail: (prefix.len() as u64).min(file_len),
        short: false,
    };
    match parse_header(&mut h, 0) {
        Ok((_, data_start)) => Ok(Some(data_start)),
        Err(_) if h.short => Ok(None),
        Err(e) => Err(e),
    }
}

/// The header of one file: (what it holds, where its data section starts).
fn parse_header<R: Read>(h: &mut Header<'_, R>, file: usize) -> Result<(Parsed, u64)> {
    let (path, len) = (h.path, h.len);
    let magic = h.bytes::<4>("magic")?;
    if &magic != MAGIC {
        return Err(bad(path, format!("magic {magic:02x?} is not \"GGUF\"")));
    }
    let version = h.u32("version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(bad(
                path,
                "GGUF version 1 (32-bit counts) is not supported: convert it again",
            ))
        }
        v if v.swap_bytes() <= 3 => {
            return Err(bad(path, "a big-endian GGUF: only little-endian files are read"))
        }
        v => return Err(bad(path, format!("unknown GGUF version {v}"))),
    }
    // A tensor info takes at least 8 (name) + 4 + 4 + 8 bytes, a key-value 8 + 4 + 1.
    let n_tensors = h.count("the tensor count", 24)?;
    let n_kv = h.count("the key-value count", 13)?;
    let mut metadata = HashMap::new();
    for i in 0..n_kv {
        let key = h.string(&format!("the length of key {i}"))?;
        let ty = h.u32(&key)?;
        let value = h.value(ty, &key, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(bad(path, format!("key `{key}` appears twice")));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
            _ => {
                return Err(bad(
                    path,
                    format!("general.alignment {v:?} is not a power of two"),
                ))
            }
        },
    };
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = h.string(&format!("the name length of tensor {i}"))?;
        let n_dims = h.u32(&name)?;
        if n_dims > 8 {
            return Err(bad(path, format!("tensor `{name}`: {n_dims} dimensions")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(h.u64(&name)?);
        }
        let ty = GgmlType(h.u32(&name)?);
        let offset = h.u64(&name)?;
        tensors.push(GgufTensor {
            name,
            dims,
            ty,
            file,
            offset,
            len: 0,
        });
    }
    let data_start = h.pos.div_ceil(alignment) * alignment;
    place_tensors(path, &mut tensors, alignment, data_start, len)?;
    let parsed = Parsed {
        version,
        metadata,
        tensors,
    };
    Ok((parsed, data_start))
}

/// Sizes each tensor, makes its offset absolute, and checks that it is aligned, inside the file
/// and clear of the others.
fn place_tensors(
    path: &Path,
    tensors: &mut [GgufTensor],
    alignment: u64,
    data_start: u64,
    len: u64,
) -> Result<()> {
    for t in tensors.iter_mut() {
        let err = |reason: String| FormatError::BadTensor {
            path: path.to_path_buf(),
            tensor: t.name.clone(),
            reason,
        };
        if !t.offset.is_multiple_of(alignment) {
            return Err(err(format!(
                "offset {} is not a multiple of the alignment {alignment}",
                t.offset
            )));
        }
        let numel = t
            .dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| err(format!("dimensions {:?} overflow", t.dims)))?;
        if let Some((block, bytes)) = t.ty.block() {
            let inner = t.dims.first().copied().unwrap_or(1);
            if !inner.is_multiple_of(block) {
                return Err(err(format!(
                    "{} stores blocks of {block} elements, but the innermost dimension is {inner}",
                    t.ty
                )));
            }
            t.len = (numel / block)
                .checked_mul(bytes)
                .ok_or_else(|| err(format!("dimensions {:?} overflow", t.dims)))?;
        }
        t.offset = data_start
            .checked_add(t.offset)
            .filter(|o| o.checked_add(t.len).is_some_and(|end| end <= len))
            .ok_or_else(|| {
                err(format!(
                    "its {} bytes at data offset {} end past the end of the file ({len} bytes)",
                    t.len, t.offset
                ))
            })?;
    }
    let mut order: Vec<&GgufTensor> = tensors.iter().filter(|t| t.len > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if w[0].offset + w[0].len > w[1].offset {
            return Err(FormatError::BadTensor {
                path: path.to_path_buf(),
                tensor: w[1].name.clone(),
                reason: format!("its bytes overlap those of `{}`", w[0].name),
            });
        }
    }
    Ok(())
}

/// Reads a whole small file region (tests, tools): `len` bytes at `offset`.
pub fn read_at(path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    let mut f = File::open(path).map_err(|e| FormatError::io(path, e))?;
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| FormatError::io(path, e))?;
    let mut b = vec![0u8; len];
    f.read_exact(&mut b).map_err(|e| FormatError::io(path, e))?;
    Ok(b)
}

#[cfg(test)]
#[path = "gguf_tests.rs"]
mod tests;
