//! A checkpoint folder: `model.safetensors.index.json` + shards, or a single `model.safetensors`.
//! Opening it parses every shard header once; reading a tensor is one `pread` of its byte range
//! from a file handle kept open for the life of the checkpoint.

use std::any::Any;
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::safetensors::{parse_header, TensorInfo};
use crate::{DType, FormatError, QuantizationConfig, Result};

/// Where the bytes of a checkpoint that is not (yet) all on local disk come from: before any
/// read of a shard's byte range, the range is made present in the local file (a remote model's
/// sparse cache fills it, once).
pub trait RangeSource: Send + Sync {
    /// Makes bytes [offset, offset + len) of the shard file `file` (its name in the folder)
    /// present locally.
    fn ensure(&self, file: &str, offset: u64, len: u64) -> std::result::Result<(), String>;
}

/// Tensor bytes already in memory that a checkpoint view serves instead of reading its files
/// (a streamed layer's read buffers).
///
/// # Safety
/// The bytes returned must stay valid and unchanged for as long as the owner passed with them
/// to [`Checkpoint::with_preloaded`] lives: weights may view them without copying.
pub unsafe trait Preloaded: Send + Sync {
    /// The bytes of tensor `name`, when they are held here.
    fn bytes(&self, name: &str) -> Option<&[u8]>;
}

/// What keeps preloaded bytes alive, for weights that view them instead of copying.
pub type BytesOwner = Arc<dyn Any + Send + Sync>;

#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub shard: usize,
    pub info: TensorInfo,
}

struct Shard {
    path: PathBuf,
    file: File,
}

/// Linear layers converted to INT8 with one scale per row as they load (`--spine-format int8`),
/// and where the converted bytes are kept between starts (a sidecar in strata's cache). The
/// weight loader asks it first and gives it what it converted.
pub trait Int8Spine: Send + Sync {
    /// Whether the linear layer `base` is converted (routers, say, are not).
    fn converts(&self, base: &str) -> bool;
    /// `base`'s INT8 weight (out x in bytes) and f32 row scales, from an earlier start.
    fn get(&self, base: &str, out_dim: usize, in_dim: usize) -> Option<(Vec<i8>, Vec<f32>)>;
    /// Records `base`'s conversion for the next start (errors are the sidecar's: the load goes
    /// on with the converted weight either way).
    fn put(&self, base: &str, w: &[i8], scales: &[f32]);
}

/// Clones share the open files and the index.
#[derive(Clone)]
pub struct Checkpoint {
    dir: PathBuf,
    shards: Arc<Vec<Shard>>,
    tensors: Arc<HashMap<String, TensorEntry>>,
    quantization: Option<QuantizationConfig>,
    source: Option<Arc<dyn RangeSource>>,
    preloaded: Option<(Arc<dyn Preloaded>, BytesOwner)>,
    int8: Option<Arc<dyn Int8Spine>>,
    /// The name a tensor has in the files, when it is not the name the families ask for (a
    /// GGUF model's), for errors.
    file_name: Option<FileName>,
    /// Bytes [`Checkpoint::read_into`] has read from the files (shared by clones): a load's
    /// progress.
    read: Arc<AtomicU64>,
}

/// A tensor's name in a checkpoint's files, from the name the families ask for.
pub type FileName = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let index_path = dir.join(INDEX_FILE);
        let single_path = dir.join(SINGLE_FILE);
        let (shard_names, weight_map) = if index_path.exists() {
            let (names, map) = read_index(&index_path)?;
            (names, Some(map))
        } else if single_path.exists() {
            (vec![SINGLE_FILE.to_string()], None)
        } else {
            return Err(FormatError::BadCheckpoint {
                dir: dir.to_path_buf(),
                reason: format!("no {INDEX_FILE} and no {SINGLE_FILE}: not a safetensors checkpoint"),
            });
        };

        let mut shards = Vec::with_capacity(shard_names.len());
        let mut tensors = HashMap::new();
        for (shard_idx, name) in shard_names.iter().enumerate() {
            let path = dir.join(name);
            if !path.exists() {
                return Err(FormatError::BadCheckpoint {
                    dir: dir.to_path_buf(),
                    reason: format!("shard `{name}` named by {INDEX_FILE} is missing"),
                });
            }
            let header = parse_header(&path)?;
            for info in header.tensors {
                if let Some(map) = &weight_map {
                    match map.get(&info.name) {
                        Some(owner) if owner == name => {}
                        // A tensor the index attributes to another shard (or not at all) is ignored,
                        // as loaders of the index do; the index is the source of truth.
                        _ => continue,
                    }
                }
                let name = info.name.clone();
                tensors.insert(
                    name,
                    TensorEntry {
                        shard: shard_idx,
                        info,
                    },
                );
            }
            let file = File::open(&path).map_err(|e| FormatError::io(&path, e))?;
            shards.push(Shard { path, file });
        }
        if let Some(map) = &weight_map {
            let mut missing: Vec<_> = map.iter().filter(|(t, _)| !tensors.contains_key(*t)).collect();
            missing.sort();
            if let Some((tensor, shard)) = missing.first() {
                return Err(FormatError::BadTensor {
                    path: dir.join(shard),
                    tensor: tensor.to_string(),
                    reason: format!(
                        "{INDEX_FILE} places it in this shard but the shard's header does not list it ({} such tensors)",
                        missing.len()
                    ),
                });
            }
        }
        Ok(Checkpoint::new(dir, shards, tensors, None))
    }

    fn new(
        dir: &Path,
        shards: Vec<Shard>,
        tensors: HashMap<String, TensorEntry>,
        file_name: Option<FileName>,
    ) -> Checkpoint {
        Checkpoint {
            dir: dir.to_path_buf(),
            shards: Arc::new(shards),
            tensors: Arc::new(tensors),
            quantization: None,
            source: None,
            preloaded: None,
            int8: None,
            file_name,
            read: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A checkpoint over files whose tensors another format has indexed (a GGUF model): `dir`
    /// names it in errors, `paths` are its files and each entry's `shard` indexes them.
    /// `file_name` gives a tensor's name in those files, for errors.
    pub fn from_index(
        dir: &Path,
        paths: &[PathBuf],
        tensors: HashMap<String, TensorEntry>,
        file_name: FileName,
    ) -> Result<Checkpoint> {
        let mut shards = Vec::with_capacity(paths.len());
        for path in paths {
            let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
            shards.push(Shard {
                path: path.clone(),
                file,
            });
        }
        assert!(tensors.values().all(|e| e.shard < shards.len()));
        Ok(Checkpoint::new(dir, shards, tensors, Some(file_name)))
    }

    /// Reads go through `source` first (a remote model's local cache).
    pub fn with_source(mut self, source: Option<std::sync::Arc<dyn RangeSource>>) -> Checkpoint {
        self.source = source;
        self
    }

    pub fn source(&self) -> Option<&std::sync::Arc<dyn RangeSource>> {
        self.source.as_ref()
    }

    /// The same checkpoint (sharing its open files and index), whose reads of the tensors
    /// `bytes` holds come from there; `owner` keeps those bytes alive for weights that view them.
    pub fn with_preloaded(&self, bytes: Arc<dyn Preloaded>, owner: BytesOwner) -> Checkpoint {
        Checkpoint {
            dir: self.dir.clone(),
            shards: self.shards.clone(),
            tensors: self.tensors.clone(),
            quantization: self.quantization.clone(),
            source: self.source.clone(),
            preloaded: Some((bytes, owner)),
            // Streamed layers are built from the bytes read each time: they keep their format.
            int8: None,
            file_name: self.file_name.clone(),
            read: self.read.clone(),
        }
    }

    /// Resident linear layers load as INT8 (`--spine-format int8`), through `spine`.
    pub fn with_int8_spine(mut self, spine: Option<Arc<dyn Int8Spine>>) -> Checkpoint {
        self.int8 = spine;
        self
    }

    pub fn int8_spine(&self) -> Option<&Arc<dyn Int8Spine>> {
        self.int8.as_ref()
    }

    /// A tensor's bytes when this view holds them in memory, with what keeps them alive.
    pub fn preloaded(&self, name: &str) -> Option<(&[u8], &BytesOwner)> {
        let (bytes, owner) = self.preloaded.as_ref()?;
        let b = bytes.bytes(name)?;
        (self.entry(name).ok()?.info.len == b.len() as u64).then_some((b, owner))
    }

    /// Makes a byte range of shard `shard` present locally (a no-op for local checkpoints).
    pub fn ensure(&self, shard: usize, offset: u64, len: u64) -> Result<()> {
        let Some(source) = &self.source else { return Ok(()) };
        let path = &self.shards[shard].path;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        source
            .ensure(&name, offset, len)
            .map_err(|reason| FormatError::BadCheckpoint {
                dir: self.dir.clone(),
                reason,
            })
    }

    /// Attaches config.json's `quantization_config` (block and group sizes of quantized tensors).
    pub fn with_quantization(mut self, q: Option<QuantizationConfig>) -> Checkpoint {
        self.quantization = q;
        self
    }

    pub fn quantization(&self) -> Option<&QuantizationConfig> {
        self.quantization.as_ref()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.tensors.get(name).ok_or_else(|| self.missing(name))
    }

    /// The error for tensor `name` not being there (named as the files name it, too).
    pub fn missing(&self, name: &str) -> FormatError {
        FormatError::MissingTensor {
            dir: self.dir.clone(),
            tensor: name.to_string(),
            note: self.in_the_file(name),
        }
    }

    /// ` (in the file: NAME)` where the files name tensor `name` otherwise (GGUF), else "".
    fn in_the_file(&self, name: &str) -> String {
        match self.file_name.as_ref().and_then(|f| f(name)) {
            Some(file_name) => format!(" (in the file: {file_name})"),
            None => String::new(),
        }
    }

    /// `name` for an error about the tensor: with its name in the file where that differs.
    pub fn label(&self, name: &str) -> String {
        format!("{name}{}", self.in_the_file(name))
    }

    pub fn n_shards(&self) -> usize {
        self.shards.len()
    }

    pub fn shard_path(&self, shard: usize) -> &Path {
        &self.shards[shard].path
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    pub fn entries(&self) -> impl Iterator<Item = &TensorEntry> {
        self.tensors.values()
    }

    /// Bytes read from the files by [`Checkpoint::read_into`] so far, by this checkpoint and its
    /// clones.
    pub fn bytes_read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// Reads a tensor's raw bytes with one positioned read.
    pub fn read_bytes(&self, name: &str) -> Result<Vec<u8>> {
        let len = self.entry(name)?.info.len as usize;
        let mut buf = vec![0u8; len];
        self.read_into(name, &mut buf)?;
        Ok(buf)
    }

    /// Reads a tensor's bytes into `buf` (exactly its length), then tells the kernel the file's
    /// pages for that range are not needed again: loading resident weights must not fill the page
    /// cache (under a memory cap it is charged like any other memory).
    pub fn read_into(&self, name: &str, buf: &mut [u8]) -> Result<()> {
        let entry = self.entry(name)?;
        let shard = &self.shards[entry.shard];
        let bad = |reason: String| FormatError::BadTensor {
            path: shard.path.clone(),
            tensor: self.label(name),
            reason,
        };
        if buf.len() as u64 != entry.info.len {
            return Err(bad(format!(
                "buffer of {} bytes for a {}-byte tensor",
                buf.len(),
                entry.info.len
            )));
        }
        if let Some((bytes, _)) = self.preloaded(name) {
            buf.copy_from_slice(bytes);
            return Ok(());
        }
        self.ensure(entry.shard, entry.info.offset, entry.info.len)?;
        shard.file.read_exact_at(buf, entry.info.offset).map_err(|e| {
            bad(format!(
                "reading {} bytes at offset {} failed: {e} (was the file truncated or replaced?)",
                entry.info.len, entry.info.offset
            ))
        })?;
        drop_cached_range(&shard.file, entry.info.offset, entry.info.len);
        self.read.fetch_add(entry.info.len, Ordering::Relaxed);
        Ok(())
    }

    /// Checks a tensor's shape (and optionally dtype) before it is used.
    pub fn expect(&self, name: &str, shape: &[usize], dtypes: &[DType]) -> Result<&TensorEntry> {
        let entry = self.entry(name)?;
        let path = &self.shards[entry.shard].path;
        if entry.info.shape != shape {
            return Err(FormatError::BadTensor {
                path: path.clone(),
                tensor: self.label(name),
                reason: format!(
                    "shape {:?} does not match {shape:?} expected from config.json",
                    entry.info.shape
                ),
            });
        }
        if !dtypes.is_empty() && !dtypes.contains(&entry.info.dtype) {
            let names: Vec<_> = dtypes.iter().map(|d| d.name()).collect();
            return Err(FormatError::BadTensor {
                path: path.clone(),
                tensor: self.label(name),
                reason: format!(
                    "dtype {} is not supported here (expected one of {names:?})",
                    entry.info.dtype
                ),
            });
        }
        Ok(entry)
    }

    /// Reads a floating-point tensor of the expected shape as f32 (BF16/F16/F32 on disk).
    pub fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let entry = self.expect(name, shape, &[DType::BF16, DType::F16, DType::F32])?;
        let dtype = entry.info.dtype;
        let bytes = self.read_bytes(name)?;
        Ok(bytes_to_f32(&bytes, dtype))
    }
}

#[cfg(target_os = "linux")]
fn drop_cached_range(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: an advisory syscall on an open descriptor; it cannot affect memory safety.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn drop_cached_range(_file: &File, _offset: u64, _len: u64) {}

/// Converts little-endian BF16/F16/F32 bytes to f32 (exactly: all three widen losslessly).
pub fn bytes_to_f32(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        other => panic!("bytes_to_f32 called on {other}"),
    }
}

fn read_index(path: &Path) -> Result<(Vec<String>, HashMap<String, String>)> {
    let text = std::fs::read_to_string(path).map_err(|e| FormatError::io(path, e))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| FormatError::BadJson {
        path: path.to_path_buf(),
        reason: format!("not valid JSON: {e}"),
    })?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| FormatError::BadKey {
            path: path.to_path_buf(),
            key: "weight_map".into(),
            reason: "missing or not an object".into(),
        })?;
    let mut weight_map = HashMap::with_capacity(map.len());
    let mut shards = BTreeSet::new();
    for (tensor, shard) in map {
        let shard = shard.as_str().ok_or_else(|| FormatError::BadKey {
            path: path.to_path_buf(),
            key: format!("weight_map.{tensor}"),
            reason: "shard name must be a string".into(),
        })?;
        if shard.contains('/') || shard.contains("..") {
            return Err(FormatError::BadKey {
                path: path.to_path_buf(),
                key: format!("weight_map.{tensor}"),
                reason: format!("shard name `{shard}` must be a plain file name"),
            });
        }
        shards.insert(shard.to_string());
        weight_map.insert(tensor.clone(), shard.to_string());
    }
    Ok((shards.into_iter().collect(), weight_map))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a safetensors file from (name, dtype, shape, bytes).
    fn write_safetensors(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, dtype, shape, bytes) in tensors {
            let begin = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
            );
        }
        let json = serde_json::to_vec(&header).unwrap();
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&json);
        out.extend_from_slice(&data);
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn opens_a_single_file_checkpoint_and_reads_by_range() {
        let dir = std::env::temp_dir().join(format!("strata-single-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let b: Vec<u8> = [
            half::bf16::from_f32(0.25).to_bits(),
            half::bf16::from_f32(3.0).to_bits(),
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
        write_safetensors(
            &dir.join(SINGLE_FILE),
            &[("a", "F32", vec![2], a), ("b.weight", "BF16", vec![1, 2], b)],
        );
        let ckpt = Checkpoint::open(&dir).unwrap();
        assert_eq!(ckpt.read_f32("a", &[2]).unwrap(), vec![1.5, -2.0]);
        assert_eq!(ckpt.read_f32("b.weight", &[1, 2]).unwrap(), vec![0.25, 3.0]);
        let e = ckpt.read_f32("b.weight", &[2, 1]).unwrap_err().to_string();
        assert!(e.contains("b.weight") && e.contains("shape"), "{e}");
        let e = ckpt.entry("missing").unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_folder_without_weights_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("strata-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = Checkpoint::open(&dir).unwrap_err().to_string();
        assert!(e.contains(INDEX_FILE) && e.contains(SINGLE_FILE), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
