//! A small GGUF (version 3) writer: what the tests need to build files, valid and broken, and
//! what a tool needs to write one. Tensors are written in order, each aligned.

use std::io::Write;
use std::path::Path;

use crate::gguf::{GgmlType, Value};

#[derive(Default)]
pub struct GgufWriter {
    pub kv: Vec<(String, Value)>,
    /// (name, ggml dimensions (innermost first), type, bytes)
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    /// `general.alignment` (32 when `None`, and then not written).
    pub alignment: Option<u32>,
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => {
            out.extend(a.first().map(type_id).unwrap_or(4).to_le_bytes());
            out.extend((a.len() as u64).to_le_bytes());
            for x in a {
                put_value(out, x);
            }
        }
    }
}

impl GgufWriter {
    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.kv.push((key.to_string(), v));
        self
    }

    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, bytes: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), dims.to_vec(), ty, bytes));
        self
    }

    /// The whole file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment.unwrap_or(32) as usize;
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        let n_kv = self.kv.len() + self.alignment.is_some() as usize;
        out.extend((n_kv as u64).to_le_bytes());
        if let Some(a) = self.alignment {
            put_str(&mut out, "general.alignment");
            out.extend(4u32.to_le_bytes());
            out.extend(a.to_le_bytes());
        }
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            out.extend(type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0usize;
        for (name, dims, ty, bytes) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.0.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset = (offset + bytes.len()).div_ceil(align) * align;
        }
        out.resize(out.len().div_ceil(align) * align, 0);
        for (_, _, _, bytes) in &self.tensors {
            out.extend(bytes);
            out.resize(out.len().div_ceil(align) * align, 0);
        }
        out
    }

    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::File::create(path)?.write_all(&self.to_bytes())
    }
}
