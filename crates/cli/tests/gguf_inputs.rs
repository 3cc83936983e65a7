//! Broken and unsupported GGUF files through the binary: each fails with exit code 1 and an
//! error naming the file and the key, tensor or type at fault, never a panic. (The valid GGUF
//! files, made from the fixtures by the `gguf` package, are tested in `tests/gguf`.)

use std::path::{Path, PathBuf};
use std::process::Command;

use strata_formats::gguf::{GgmlType, Value};
use strata_formats::gguf_write::GgufWriter;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-gguf-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn expect_error(model: &Path, needles: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["logits", "--model", model.to_str().unwrap(), "--ids", "1,2,3"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a clean exit 1; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    for n in needles {
        assert!(stderr.contains(n), "error does not mention `{n}`: {stderr}");
    }
}

/// The header keys of a one-layer Qwen3-MoE GGUF (hidden 64, 2 experts) without tensors.
fn qwen3moe() -> GgufWriter {
    let mut w = GgufWriter::default();
    w.kv("general.architecture", Value::String("qwen3moe".into()));
    for (k, v) in [
        ("block_count", 1),
        ("context_length", 128),
        ("embedding_length", 64),
        ("feed_forward_length", 128),
        ("attention.head_count", 2),
        ("attention.head_count_kv", 1),
        ("expert_count", 2),
        ("expert_used_count", 1),
        ("expert_feed_forward_length", 32),
    ] {
        w.kv(&format!("qwen3moe.{k}"), Value::U32(v));
    }
    w
}

#[test]
fn an_unsupported_architecture_is_named() {
    let path = tmp("arch.gguf");
    let mut w = GgufWriter::default();
    w.kv("general.architecture", Value::String("gemma3".into()));
    w.write(&path).unwrap();
    expect_error(
        &path,
        &["arch.gguf", "general.architecture", "gemma3", "qwen3moe"],
    );
}

#[test]
fn an_unsupported_weight_type_names_the_tensor_and_type() {
    let path = tmp("type.gguf");
    let mut w = qwen3moe();
    w.tensor("token_embd.weight", &[256, 4], GgmlType(12), vec![0; 4 * 144]);
    w.write(&path).unwrap();
    expect_error(&path, &["type.gguf", "token_embd.weight", "Q4_K"]);
}

#[test]
fn a_missing_key_and_a_missing_tensor_are_named() {
    let path = tmp("key.gguf");
    let mut w = qwen3moe();
    w.kv.retain(|(k, _)| k != "qwen3moe.embedding_length");
    w.tensor("token_embd.weight", &[64, 4], GgmlType::F32, vec![0; 64 * 4 * 4]);
    w.write(&path).unwrap();
    expect_error(&path, &["key.gguf", "qwen3moe.embedding_length", "missing"]);

    let path = tmp("tensor.gguf");
    let mut w = qwen3moe();
    w.tensor("token_embd.weight", &[64, 4], GgmlType::F32, vec![0; 64 * 4 * 4]);
    w.write(&path).unwrap();
    expect_error(&path, &["tensor.gguf", "blk.0.ffn_gate_exps.weight, expert 0"]);
}

#[test]
fn a_truncated_gguf_is_named() {
    let path = tmp("cut.gguf");
    let mut w = qwen3moe();
    w.tensor("token_embd.weight", &[64, 4], GgmlType::F32, vec![0; 64 * 4 * 4]);
    let bytes = w.to_bytes();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    expect_error(
        &path,
        &["cut.gguf", "token_embd.weight", "past the end of the file"],
    );
    std::fs::write(&path, &bytes[..40]).unwrap();
    expect_error(&path, &["cut.gguf", "not a valid GGUF file"]);
}
