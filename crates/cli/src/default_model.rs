//! The embedded default model, so `strata run --prompt ...` works with no download: strata's
//! own demo model, a 20M-parameter DeepSeek-V3-style MoE (MLA, 32 routed experts of which 4 a
//! token, a shared expert) trained on the King James Bible and WordNet's glosses
//! (`tools/train-demo/`), its routed experts stored as INT4. Small, but it writes English.
//! Compiled into the binary and written once to the cache directory on first use.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

const FILES: &[(&str, &[u8])] = &[
    ("config.json", include_bytes!("../default-model/config.json")),
    (
        "generation_config.json",
        include_bytes!("../default-model/generation_config.json"),
    ),
    (
        "model.safetensors.index.json",
        include_bytes!("../default-model/model.safetensors.index.json"),
    ),
    (
        "model-00001-of-00002.safetensors",
        include_bytes!("../default-model/model-00001-of-00002.safetensors"),
    ),
    (
        "model-00002-of-00002.safetensors",
        include_bytes!("../default-model/model-00002-of-00002.safetensors"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../default-model/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_bytes!("../default-model/tokenizer_config.json"),
    ),
];

pub const NAME: &str = "strata-demo (embedded)";

fn cache_root() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("strata");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".cache").join("strata");
    }
    std::env::temp_dir().join("strata")
}

/// A content hash of the embedded files (FNV-1a), so a new build never reuses an old copy.
fn fingerprint() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, bytes) in FILES {
        for b in name.as_bytes().iter().chain(bytes.iter()) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// The folder holding the embedded model, written on first use (atomically: a temp folder renamed).
pub fn path() -> Result<PathBuf> {
    let dir = cache_root().join(format!("default-model-{}", fingerprint()));
    if dir.join("config.json").exists() {
        return Ok(dir);
    }
    let parent = dir.parent().expect("cache dir has a parent");
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = parent.join(format!(".default-model-{}.{}", fingerprint(), std::process::id()));
    write_all(&tmp).with_context(|| format!("writing the embedded model to {}", tmp.display()))?;
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        let _ = std::fs::remove_dir_all(&tmp);
        // Another process may have won the race; its copy is identical.
        if !dir.join("config.json").exists() {
            return Err(e).with_context(|| format!("moving the embedded model to {}", dir.display()));
        }
    }
    Ok(dir)
}

fn write_all(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in FILES {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}
