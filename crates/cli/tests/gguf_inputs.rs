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
    // IQ2_XXS: a ggml type (256 weights in 66 bytes) strata has no kernel for.
    w.tensor("token_embd.weight", &[256, 4], GgmlType(16), vec![0; 4 * 66]);
    w.write(&path).unwrap();
    expect_error(
        &path,
        &["type.gguf", "token_embd.weight", "IQ2_XXS", "supported: F32"],
    );
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

/// Writes an F32 tensor of `dims` with small repeating values.
fn small_f32(w: &mut GgufWriter, name: &str, dims: &[u64]) {
    let n: u64 = dims.iter().product();
    let bytes = (0..n)
        .flat_map(|i| ((i % 7) as f32 * 0.01).to_le_bytes())
        .collect();
    w.tensor(name, dims, GgmlType::F32, bytes);
}

/// The tensors of `qwen3moe()`'s one layer (vocabulary of 8), F32, small values.
fn qwen3moe_tensors(w: &mut GgufWriter) {
    let mut t = |name: &str, dims: &[u64]| small_f32(w, name, dims);
    t("token_embd.weight", &[64, 8]);
    t("output_norm.weight", &[64]);
    t("output.weight", &[64, 8]);
    t("blk.0.attn_norm.weight", &[64]);
    t("blk.0.attn_q.weight", &[64, 64]);
    t("blk.0.attn_k.weight", &[64, 32]);
    t("blk.0.attn_v.weight", &[64, 32]);
    t("blk.0.attn_output.weight", &[64, 64]);
    t("blk.0.attn_q_norm.weight", &[32]);
    t("blk.0.attn_k_norm.weight", &[32]);
    t("blk.0.ffn_norm.weight", &[64]);
    t("blk.0.ffn_gate_inp.weight", &[64, 2]);
    t("blk.0.ffn_gate_exps.weight", &[64, 32, 2]);
    t("blk.0.ffn_up_exps.weight", &[64, 32, 2]);
    t("blk.0.ffn_down_exps.weight", &[32, 64, 2]);
}

#[test]
fn a_vocabulary_not_supported_yet_leaves_token_ids_working() {
    let path = tmp("vocab.gguf");
    let mut w = qwen3moe();
    w.kv("qwen3moe.attention.key_length", Value::U32(32));
    w.kv("tokenizer.ggml.model", Value::String("bert".into()));
    qwen3moe_tensors(&mut w);
    w.write(&path).unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(args)
            .args(["--model", path.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = run(&["logits", "--ids", "1,2,3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("vocabulary type `bert` is not supported yet"),
        "{stderr}"
    );
    assert!(stderr.contains("token ids only"), "{stderr}");
    // A warning into a pipe carries no terminal colour codes.
    assert!(!stderr.contains('\u{1b}'), "escape codes in a pipe: {stderr:?}");
    let out = run(&["tokenize", "--text", "hi"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("vocab.gguf") && stderr.contains("`bert`"),
        "{stderr}"
    );
}

/// A dense `llama` GGUF with q/k/v biases but none on o (`qkv_bias`), linear rope scaling and a
/// vocabulary of 8: it loads and runs; a bias's absence where the file names one is an error.
#[test]
fn a_dense_llama_with_q_k_v_biases_and_linear_rope_runs() {
    let path = tmp("dense.gguf");
    let write = |with_v_bias: bool| {
        let mut w = GgufWriter::default();
        w.kv("general.architecture", Value::String("llama".into()));
        for (k, v) in [
            ("block_count", 1),
            ("context_length", 128),
            ("embedding_length", 64),
            ("feed_forward_length", 128),
            ("attention.head_count", 2),
            ("attention.head_count_kv", 1),
        ] {
            w.kv(&format!("llama.{k}"), Value::U32(v));
        }
        w.kv("llama.rope.scaling.type", Value::String("linear".into()));
        w.kv("llama.rope.scaling.factor", Value::F32(2.0));
        let mut t = |name: &str, dims: &[u64]| small_f32(&mut w, name, dims);
        t("token_embd.weight", &[64, 8]);
        t("output_norm.weight", &[64]);
        t("output.weight", &[64, 8]);
        t("blk.0.attn_norm.weight", &[64]);
        t("blk.0.attn_q.weight", &[64, 64]);
        t("blk.0.attn_q.bias", &[64]);
        t("blk.0.attn_k.weight", &[64, 32]);
        t("blk.0.attn_k.bias", &[32]);
        t("blk.0.attn_v.weight", &[64, 32]);
        if with_v_bias {
            t("blk.0.attn_v.bias", &[32]);
        }
        t("blk.0.attn_output.weight", &[64, 64]);
        t("blk.0.ffn_norm.weight", &[64]);
        t("blk.0.ffn_gate.weight", &[64, 128]);
        t("blk.0.ffn_up.weight", &[64, 128]);
        t("blk.0.ffn_down.weight", &[128, 64]);
        w.write(&path).unwrap();
    };
    write(true);
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["logits", "--model", path.to_str().unwrap(), "--ids", "1,2,3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    write(false);
    expect_error(&path, &["dense.gguf", "blk.0.attn_v.bias"]);
}

#[test]
fn kimi_linear_needs_one_kv_head_count_per_layer() {
    let kimi = |kv: Value| {
        let mut w = GgufWriter::default();
        w.kv("general.architecture", Value::String("kimi-linear".into()));
        for (k, v) in [
            ("block_count", 2),
            ("context_length", 128),
            ("embedding_length", 64),
            ("feed_forward_length", 128),
            ("attention.head_count", 2),
            ("expert_count", 2),
            ("expert_used_count", 1),
        ] {
            w.kv(&format!("kimi-linear.{k}"), Value::U32(v));
        }
        w.kv("kimi-linear.attention.head_count_kv", kv);
        w.tensor("token_embd.weight", &[64, 4], GgmlType::F32, vec![0; 64 * 4 * 4]);
        w
    };
    let path = tmp("kimi-scalar.gguf");
    kimi(Value::U32(1)).write(&path).unwrap();
    expect_error(
        &path,
        &[
            "kimi-scalar.gguf",
            "kimi-linear.attention.head_count_kv",
            "one KV head count per layer",
        ],
    );
    let path = tmp("kimi-short.gguf");
    kimi(Value::Array(vec![Value::I32(0)])).write(&path).unwrap();
    expect_error(
        &path,
        &[
            "kimi-short.gguf",
            "kimi-linear.attention.head_count_kv",
            "1 entries for 2 layers",
        ],
    );
}
