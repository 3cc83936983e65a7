//! Broken model folders: every one must fail with a clear error naming the file (and tensor or
//! key) at fault and a non-zero exit code, never a panic.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use strata_testkit::ScratchCopy;

const MODEL: &str = "qwen3-moe-tiny";

/// A scratch copy of the test model.
struct Scratch;

impl Scratch {
    #[allow(clippy::new_ret_no_self)]
    fn new(tag: &str) -> ScratchCopy {
        ScratchCopy::new(MODEL, tag)
    }
}

/// Runs `strata logits` on the folder; asserts failure and that stderr names every `needles`.
fn expect_error(dir: &Path, needles: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["logits", "--model", dir.to_str().unwrap(), "--ids", "1,2,3"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a clean exit 1 (not a panic); stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    for n in needles {
        assert!(stderr.contains(n), "error does not mention `{n}`: {stderr}");
    }
}

fn shard_names(dir: &Path) -> Vec<String> {
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let mut names: Vec<String> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Rewrites a shard's header JSON through `edit`, keeping the data section.
fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(header.as_object_mut().unwrap());
    let json = serde_json::to_vec(&header).unwrap();
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

fn first_tensor(header: &serde_json::Map<String, Value>) -> String {
    let mut names: Vec<&String> = header.keys().filter(|k| *k != "__metadata__").collect();
    names.sort();
    names[0].clone()
}

#[test]
fn truncated_shard() {
    let s = Scratch::new("truncated");
    let shard = shard_names(&s.0)[1].clone();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(s.path(&shard))
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len / 2).unwrap();
    expect_error(&s.0, &[&shard, "truncated"]);
}

#[test]
fn header_length_past_end_of_file() {
    let s = Scratch::new("header-len");
    let shard = shard_names(&s.0)[0].clone();
    let mut bytes = std::fs::read(s.path(&shard)).unwrap();
    let len = bytes.len() as u64;
    bytes[..8].copy_from_slice(&(len * 2).to_le_bytes());
    std::fs::write(s.path(&shard), bytes).unwrap();
    expect_error(&s.0, &[&shard, "header length"]);
}

#[test]
fn overlapping_tensor_offsets() {
    let s = Scratch::new("overlap");
    let shard = shard_names(&s.0)[2].clone();
    let mut victim = String::new();
    edit_header(&s.path(&shard), |h| {
        let mut names: Vec<String> = h.keys().filter(|k| *k != "__metadata__").cloned().collect();
        names.sort_by_key(|n| h[n]["data_offsets"][0].as_u64().unwrap());
        // Move the second tensor onto the first one's bytes (same size: both are expert weights).
        let first = h[&names[0]]["data_offsets"].clone();
        let len0 = first[1].as_u64().unwrap() - first[0].as_u64().unwrap();
        let second = &names[1];
        let len1 =
            h[second]["data_offsets"][1].as_u64().unwrap() - h[second]["data_offsets"][0].as_u64().unwrap();
        assert_eq!(len0, len1, "test expects equally sized neighbours");
        h[second]["data_offsets"] = first;
        victim = second.clone();
    });
    expect_error(&s.0, &[&shard, "overlaps"]);
    assert!(!victim.is_empty());
}

#[test]
fn tensor_offsets_out_of_range() {
    let s = Scratch::new("out-of-range");
    let shard = shard_names(&s.0)[0].clone();
    let mut name = String::new();
    edit_header(&s.path(&shard), |h| {
        name = first_tensor(h);
        let offs = h[&name]["data_offsets"].clone();
        let len = offs[1].as_u64().unwrap() - offs[0].as_u64().unwrap();
        let begin = 1u64 << 30;
        h[&name]["data_offsets"] = serde_json::json!([begin, begin + len]);
    });
    expect_error(&s.0, &[&shard, &name, "past the end"]);
}

#[test]
fn tensor_offsets_that_wrap_past_u64_max() {
    // begin + the data section's start would wrap around to a small, in-file offset.
    let s = Scratch::new("wrapped");
    let shard = shard_names(&s.0)[0].clone();
    let mut name = String::new();
    edit_header(&s.path(&shard), |h| {
        name = first_tensor(h);
        let offs = h[&name]["data_offsets"].clone();
        let len = offs[1].as_u64().unwrap() - offs[0].as_u64().unwrap();
        let begin = u64::MAX - len;
        h[&name]["data_offsets"] = serde_json::json!([begin, begin + len]);
    });
    expect_error(&s.0, &[&shard, &name, "past the end"]);
}

#[test]
fn missing_shard_named_by_the_index() {
    let s = Scratch::new("missing-shard");
    let shard = shard_names(&s.0)[2].clone();
    std::fs::remove_file(s.path(&shard)).unwrap();
    expect_error(&s.0, &[&shard, "missing"]);
}

#[test]
fn config_with_a_missing_key() {
    let s = Scratch::new("config-key");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(s.path("config.json")).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(s.path("config.json"), serde_json::to_string(&cfg).unwrap()).unwrap();
    expect_error(&s.0, &["config.json", "hidden_size"]);
}

#[test]
fn tensor_with_the_wrong_shape() {
    let s = Scratch::new("shape");
    let shard = shard_names(&s.0)[0].clone();
    let mut name = String::new();
    edit_header(&s.path(&shard), |h| {
        // A 2-D weight with its dimensions swapped keeps its byte count but not its shape.
        name = h
            .keys()
            .filter(|k| {
                h[*k]["shape"]
                    .as_array()
                    .is_some_and(|s| s.len() == 2 && s[0] != s[1])
            })
            .min()
            .unwrap()
            .clone();
        let shape = h[&name]["shape"].as_array().unwrap().clone();
        h[&name]["shape"] = serde_json::json!([shape[1], shape[0]]);
    });
    expect_error(&s.0, &[&shard, &name, "shape"]);
}

#[test]
fn tensor_missing_from_its_shard() {
    let s = Scratch::new("missing-tensor");
    let shard = shard_names(&s.0)[0].clone();
    let mut name = String::new();
    edit_header(&s.path(&shard), |h| {
        name = first_tensor(h);
        h.remove(&name);
    });
    expect_error(&s.0, &[&shard, &name]);
}

#[test]
fn unknown_architecture() {
    let s = Scratch::new("arch");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(s.path("config.json")).unwrap()).unwrap();
    cfg["model_type"] = "made_up".into();
    cfg["architectures"] = serde_json::json!(["MadeUpForCausalLM"]);
    std::fs::write(s.path("config.json"), serde_json::to_string(&cfg).unwrap()).unwrap();
    expect_error(
        &s.0,
        &["config.json", "MadeUpForCausalLM", "unknown architecture"],
    );
}

#[test]
fn wrong_dtype_and_bad_json() {
    let s = Scratch::new("dtype");
    let shard = shard_names(&s.0)[0].clone();
    edit_header(&s.path(&shard), |h| {
        let name = first_tensor(h);
        h[&name]["dtype"] = "F64".into();
    });
    expect_error(&s.0, &[&shard]);
    let s = Scratch::new("badjson");
    std::fs::write(s.path("config.json"), "{ not json").unwrap();
    expect_error(&s.0, &["config.json", "JSON"]);
}

/// `strata cache gc` never empties the cache unasked: it needs --max-size or --all.
#[test]
fn cache_gc_needs_a_size_or_all() {
    let dir = std::env::temp_dir().join(format!("strata-gc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gc = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["cache", "--cache-dir", dir.to_str().unwrap(), "gc"])
            .args(extra)
            .output()
            .unwrap()
    };
    let bare = gc(&[]);
    let stderr = String::from_utf8_lossy(&bare.stderr);
    assert!(!bare.status.success() && stderr.contains("--all"), "{stderr}");
    assert!(gc(&["--all"]).status.success());
    assert!(gc(&["--max-size", "1G"]).status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}
