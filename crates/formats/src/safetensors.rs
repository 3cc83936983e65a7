//! The safetensors header: an 8-byte little-endian length, then a JSON object mapping each tensor
//! name to its dtype, shape and byte range inside the data section that follows the header.
//! Every inconsistency (header past the end of the file, ranges out of bounds or overlapping, a size
//! that does not match dtype x shape) is reported with the file and tensor at fault.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::{DType, FormatError, Result};

/// Headers larger than this are refused rather than allocated (real checkpoints stay far below).
pub const MAX_HEADER_BYTES: u64 = 256 << 20;

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first byte in the file.
    pub offset: u64,
    pub len: u64,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

#[derive(Clone, Debug)]
pub struct ShardHeader {
    pub path: PathBuf,
    pub file_len: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    pub tensors: Vec<TensorInfo>,
    pub metadata: BTreeMap<String, String>,
}

/// Reads and validates the header of one safetensors file.
pub fn parse_header(path: &Path) -> Result<ShardHeader> {
    let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    let bad = |reason: String| FormatError::BadSafetensors {
        path: path.to_path_buf(),
        reason,
    };
    if file_len < 8 {
        return Err(bad(format!(
            "file is {file_len} bytes, too short for the 8-byte header length (truncated?)"
        )));
    }
    let mut len_bytes = [0u8; 8];
    file.read_exact_at(&mut len_bytes, 0)
        .map_err(|e| FormatError::io(path, e))?;
    let header_len = u64::from_le_bytes(len_bytes);
    check_header_len(path, header_len, file_len)?;
    let mut header = vec![0u8; header_len as usize];
    file.read_exact_at(&mut header, 8)
        .map_err(|e| FormatError::io(path, e))?;
    let data_start = 8 + header_len;
    parse_header_json(path, &header, data_start, file_len)
}

/// The header length against the limit and the file.
fn check_header_len(path: &Path, header_len: u64, file_len: u64) -> Result<()> {
    let bad = |reason: String| FormatError::BadSafetensors {
        path: path.to_path_buf(),
        reason,
    };
    if header_len > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "header length {header_len} is implausibly large (limit {MAX_HEADER_BYTES})"
        )));
    }
    if 8 + header_len > file_len {
        return Err(bad(format!(
            "header length {header_len} runs past the end of the file ({file_len} bytes; truncated?)"
        )));
    }
    Ok(())
}

/// Parses and validates the header of a safetensors file held in memory (`path` names it in
/// errors), as [`parse_header`] does for one on disk.
pub fn parse_header_bytes(path: &Path, file: &[u8]) -> Result<ShardHeader> {
    let file_len = file.len() as u64;
    let Some(len_bytes) = file.get(..8) else {
        return Err(FormatError::BadSafetensors {
            path: path.to_path_buf(),
            reason: format!("file is {file_len} bytes, too short for the 8-byte header length (truncated?)"),
        });
    };
    let header_len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    check_header_len(path, header_len, file_len)?;
    let header = &file[8..8 + header_len as usize];
    parse_header_json(path, header, 8 + header_len, file_len)
}

fn parse_header_json(path: &Path, header: &[u8], data_start: u64, file_len: u64) -> Result<ShardHeader> {
    let bad = |reason: String| FormatError::BadSafetensors {
        path: path.to_path_buf(),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_slice(header).map_err(|e| bad(format!("header is not valid JSON: {e}")))?;
    let object = value
        .as_object()
        .ok_or_else(|| bad("header is not a JSON object".into()))?;

    let mut tensors = Vec::with_capacity(object.len());
    let mut metadata = BTreeMap::new();
    for (name, entry) in object {
        if name == "__metadata__" {
            if let Some(map) = entry.as_object() {
                for (k, v) in map {
                    metadata.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
                }
            }
            continue;
        }
        tensors.push(parse_entry(path, name, entry, data_start, file_len)?);
    }

    // Ranges must not overlap: a writer bug or a corrupted header would otherwise alias tensors.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| (tensors[i].offset, tensors[i].len));
    for pair in order.windows(2) {
        let (a, b) = (&tensors[pair[0]], &tensors[pair[1]]);
        if a.offset + a.len > b.offset && b.len > 0 && a.len > 0 {
            return Err(FormatError::BadTensor {
                path: path.to_path_buf(),
                tensor: b.name.clone(),
                reason: format!(
                    "byte range overlaps tensor `{}` ([{}, {}) vs [{}, {}) in the data section)",
                    a.name,
                    a.offset - data_start,
                    a.offset - data_start + a.len,
                    b.offset - data_start,
                    b.offset - data_start + b.len
                ),
            });
        }
    }

    Ok(ShardHeader {
        path: path.to_path_buf(),
        file_len,
        data_start,
        tensors,
        metadata,
    })
}

fn parse_entry(
    path: &Path,
    name: &str,
    entry: &serde_json::Value,
    data_start: u64,
    file_len: u64,
) -> Result<TensorInfo> {
    let bad = |reason: String| FormatError::BadTensor {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        reason,
    };
    let dtype_name = entry
        .get("dtype")
        .and_then(|v| v.as_str())
        .ok_or_else(|| bad("missing `dtype`".into()))?;
    let dtype =
        DType::from_safetensors(dtype_name).ok_or_else(|| bad(format!("unknown dtype `{dtype_name}`")))?;
    let shape = entry
        .get("shape")
        .and_then(|v| v.as_array())
        .ok_or_else(|| bad("missing `shape`".into()))?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| bad("`shape` must be a list of non-negative integers".into()))?;
    let offsets = entry
        .get("data_offsets")
        .and_then(|v| v.as_array())
        .filter(|a| a.len() == 2)
        .ok_or_else(|| bad("missing `data_offsets` [begin, end]".into()))?;
    let (begin, end) = match (offsets[0].as_u64(), offsets[1].as_u64()) {
        (Some(b), Some(e)) => (b, e),
        _ => return Err(bad("`data_offsets` must be two non-negative integers".into())),
    };
    if end < begin {
        return Err(bad(format!("data_offsets [{begin}, {end}] end before begin")));
    }
    let numel = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    let expected = numel
        .checked_mul(dtype.size() as u64)
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    if end - begin != expected {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] hold {} bytes but {dtype} x {shape:?} needs {expected}",
            end - begin
        )));
    }
    // Checked: an offset near u64::MAX must not wrap around into the file.
    if data_start.checked_add(end).is_none_or(|e| e > file_len) {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] run past the end of the file (data section is {} bytes; truncated?)",
            file_len.saturating_sub(data_start)
        )));
    }
    Ok(TensorInfo {
        name: name.to_string(),
        dtype,
        shape,
        offset: data_start + begin,
        len: end - begin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(json: &str, file_len: u64) -> Result<ShardHeader> {
        let data_start = 8 + json.len() as u64;
        parse_header_json(Path::new("x.safetensors"), json.as_bytes(), data_start, file_len)
    }

    #[test]
    fn accepts_a_valid_header() {
        let h = header(
            r#"{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"__metadata__":{"format":"pt"}}"#,
            200,
        )
        .unwrap();
        assert_eq!(h.tensors.len(), 1);
        assert_eq!(h.tensors[0].numel(), 6);
        assert_eq!(h.metadata["format"], "pt");
    }

    #[test]
    fn rejects_size_mismatch_overlap_and_out_of_range() {
        let e = header(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#, 200).unwrap_err();
        assert!(
            e.to_string().contains("`a`") && e.to_string().contains("needs 8"),
            "{e}"
        );
        let e = header(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            200,
        )
        .unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        let e = header(
            r#"{"a":{"dtype":"F32","shape":[64],"data_offsets":[0,256]}}"#,
            100,
        )
        .unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
    }

    #[test]
    fn offsets_near_u64_max_are_an_error_not_a_wrapped_range() {
        let max = u64::MAX;
        let json = format!(
            r#"{{"w":{{"dtype":"F32","shape":[2],"data_offsets":[{},{max}]}}}}"#,
            max - 8
        );
        let e = header(&json, 200).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("past the end"), "{e}");
        // A huge shape whose byte count overflows.
        let json = format!(r#"{{"w":{{"dtype":"F32","shape":[{max},{max}],"data_offsets":[0,8]}}}}"#);
        let e = header(&json, 200).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("overflows"), "{e}");
    }
}
