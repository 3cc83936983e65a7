//! `strata synth --preset qwen3-moe`: the checkpoint it writes is one the qwen3_moe family loads
//! (its config, tensor names, shapes and formats), and decoding it reads its experts.

use serde_json::Value;

mod common;

#[test]
fn a_qwen3_moe_synth_checkpoint_loads_and_decodes() {
    let dir = std::env::temp_dir().join(format!("strata-synth-qwen3-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.to_str().unwrap();
    common::strata_stdout(&[
        "synth",
        "--preset",
        "qwen3-moe",
        "--out",
        out,
        "--layers",
        "1",
        "--experts",
        "8",
        "--vocab",
        "256",
    ]);
    let inspect = common::strata_stdout(&["inspect", "-m", out]);
    assert!(inspect.contains("family qwen3_moe"), "{inspect}");
    assert!(inspect.contains("8 routed per MoE layer, 8 active"), "{inspect}");
    let stdout = common::strata_stdout(&[
        "bench",
        "-m",
        out,
        "--tokens",
        "2",
        "--raw-samples",
        "4",
        "--json",
    ]);
    let j: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(j["tokens"].as_u64(), Some(2), "{j}");
    // 8 experts of 2048 x 768 in BF16, gate, up and down: 9 MiB each.
    assert_eq!(
        j["memory_plan"]["expert_cache"].as_u64(),
        Some((8 * 9) << 20),
        "{j}"
    );
    // A folder that holds a model is refused.
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["synth", "--preset", "qwen3-moe", "--out", out, "--layers", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("already holds a model"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
