//! Test support: the one resolver for the reference fixtures, and golden-file helpers.
//!
//! Fixtures come from `../shared/fixtures` beside the repository (made by
//! `shared/tools/make_fixtures.py`); `STRATA_FIXTURES` points elsewhere. The dense ones live in
//! the repository, `tests/data` (made by the script there). A missing folder fails the
//! test with this explanation: it is never a skip.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The fixtures root.
pub fn fixtures_dir() -> PathBuf {
    let dir = match std::env::var_os("STRATA_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    };
    if !dir.is_dir() {
        panic!(
            "reference fixtures not found at {}: they live in ../shared/fixtures beside the repository \
             (made by shared/tools/make_fixtures.py); set STRATA_FIXTURES to their path",
            dir.display()
        );
    }
    dir.canonicalize().unwrap_or(dir)
}

/// The repository's own fixtures (dense models, Qwen2-MoE), with goldens from transformers.
pub fn repo_fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data")
}

/// One fixture folder (e.g. `qwen3-moe-tiny`, `tokenizers/qwen3`, `llama-dense-tiny`).
pub fn fixture(name: &str) -> PathBuf {
    let own = repo_fixtures_dir().join(name);
    if REPO_MODELS.contains(&name) && own.is_dir() {
        return own.canonicalize().unwrap_or(own);
    }
    if name == "strata-demo" {
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cli/default-model");
        return demo.canonicalize().unwrap_or(demo);
    }
    let dir = fixtures_dir().join(name);
    assert!(dir.is_dir(), "fixture folder {} is missing", dir.display());
    dir
}

/// The model folders with BF16 weights and goldens from transformers.
pub const BF16_MODELS: &[&str] = &[
    "deepseek-v3-tiny",
    "kimi-k2-tiny",
    "qwen3-moe-tiny",
    "mixtral-tiny",
    "kimi-linear-tiny",
    "llama-dense-tiny",
    "qwen2-dense-tiny",
    "qwen3-dense-tiny",
    "qwen2-moe-tiny",
];

/// The ones kept in the repository's `tests/data` rather than `../shared/fixtures`.
pub const REPO_MODELS: &[&str] = &[
    "llama-dense-tiny",
    "qwen2-dense-tiny",
    "qwen3-dense-tiny",
    "qwen2-moe-tiny",
];

/// The dense ones among them (no experts).
pub const DENSE_MODELS: &[&str] = &["llama-dense-tiny", "qwen2-dense-tiny", "qwen3-dense-tiny"];

/// The BF16 models with routed experts.
pub fn moe_models() -> impl Iterator<Item = &'static str> {
    BF16_MODELS.iter().copied().filter(|n| !DENSE_MODELS.contains(n))
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn golden(name: &str) -> Value {
    read_json(&fixture(name).join("golden.json"))
}

/// The token ids of a fixture's golden prompts.
pub fn golden_prompts(name: &str) -> Vec<Vec<u32>> {
    let g = golden(name);
    let prompts = g["prompts"].as_array().expect("golden prompts");
    prompts.iter().map(|p| as_u32s(&p["ids"])).collect()
}

pub fn as_u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn as_f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array of numbers")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

pub fn as_usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("array of integers")
        .iter()
        .map(|x| x.as_u64().expect("integer") as usize)
        .collect()
}

/// The logits tolerance for an f32 engine, from golden.json.
pub fn rel_tolerance(golden: &Value) -> f32 {
    golden["tolerances"]["logits"]["rel_f32_engine"]
        .as_f64()
        .unwrap_or(1e-3) as f32
}

/// Reads one F32 tensor of a golden `.safetensors` trace file.
pub fn golden_tensor(path: &Path, name: &str) -> Option<Vec<f32>> {
    use std::os::unix::fs::FileExt;
    let header = strata_formats::parse_header(path).unwrap_or_else(|e| panic!("{e}"));
    let info = header.tensors.iter().find(|t| t.name == name)?;
    let file = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; info.len as usize];
    file.read_exact_at(&mut buf, info.offset).unwrap();
    Some(strata_formats::bytes_to_f32(&buf, info.dtype))
}

/// Compares engine logits with the golden per the fixtures' rule; returns a description of the
/// first failure.
pub fn check_last_logits(engine: &[f32], golden: &[f32], absmax: f32, rel: f32) -> Result<f32, String> {
    if engine.len() != golden.len() {
        return Err(format!("{} logits, golden has {}", engine.len(), golden.len()));
    }
    let worst = engine
        .iter()
        .zip(golden)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    if worst <= rel * absmax {
        Ok(worst)
    } else {
        Err(format!("max |diff| {worst} > {rel} x {absmax}"))
    }
}

/// The model folders with quantized weights (FP8 block-scaled; INT4 pack-quantized experts) and
/// goldens computed from their exactly dequantized weights.
/// `strata-demo` is the embedded default model (`crates/cli/default-model`, INT4 experts), with
/// goldens from transformers on its dequantized weights.
pub const QUANTIZED_MODELS: &[&str] = &["deepseek-v3-tiny-fp8", "kimi-k2-tiny-int4", "strata-demo"];

/// A writable scratch copy of a fixture model folder (golden files left out), removed on drop.
pub struct ScratchCopy(pub std::path::PathBuf);

impl ScratchCopy {
    pub fn new(model: &str, tag: &str) -> ScratchCopy {
        let dir = std::env::temp_dir().join(format!("strata-scratch-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(fixture(model)).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if name.to_string_lossy().starts_with("golden") {
                continue;
            }
            let to = dir.join(&name);
            std::fs::copy(entry.path(), &to).unwrap();
            let mut perm = std::fs::metadata(&to).unwrap().permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perm.set_readonly(false);
            std::fs::set_permissions(&to, perm).unwrap();
        }
        ScratchCopy(dir)
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for ScratchCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How many generated tokens must match: up to and including the first step whose top-2 margin
/// is below 2 x rel x absmax (a near-tie; after it the sequences may diverge).
pub fn checked_generation_len(step_margins: &[f32], rel: f32, absmax: f32) -> usize {
    step_margins
        .iter()
        .position(|&m| m < 2.0 * rel * absmax)
        .map_or(step_margins.len(), |i| i + 1)
}
