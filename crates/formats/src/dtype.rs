//! Element types as safetensors names them.

use std::fmt;

use crate::gguf::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    F8E4M3,
    F8E5M2,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
    /// GGUF's Q8_0 (blocks of 32 weights in 34 bytes: an F16 scale, 32 signed bytes); GGUF
    /// files only.
    Q8_0,
    /// One of GGUF's other block types (Q4_K, Q6_K, ...: a known ggml type with blocks); GGUF
    /// files only.
    Ggml(GgmlType),
}

impl DType {
    pub fn from_safetensors(name: &str) -> Option<DType> {
        Some(match name {
            "F64" => DType::F64,
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "F8_E4M3" => DType::F8E4M3,
            "F8_E5M2" => DType::F8E5M2,
            "I64" => DType::I64,
            "I32" => DType::I32,
            "I16" => DType::I16,
            "I8" => DType::I8,
            "U8" => DType::U8,
            "BOOL" => DType::Bool,
            _ => return None,
        })
    }

    /// Bytes per element (for a block type, [`DType::block`]: bytes per block).
    pub fn size(self) -> usize {
        match self {
            DType::Q8_0 => 34,
            DType::Ggml(t) => t.block().map_or(1, |(_, bytes)| bytes as usize),
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "F64",
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U8 => "U8",
            DType::Bool => "BOOL",
            DType::Q8_0 => "Q8_0",
            DType::Ggml(t) => t.static_name().unwrap_or("GGML"),
        }
    }
}

impl DType {
    /// Elements per block of a block type (Q8_0: 32, Q4_K: 256); 1 otherwise.
    pub fn block(self) -> usize {
        match self {
            DType::Q8_0 => 32,
            DType::Ggml(t) => t.block().map_or(1, |(n, _)| n as usize),
            _ => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
