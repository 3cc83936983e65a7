//! Helpers shared by the binary's integration tests.
#![allow(dead_code)]

pub mod faults;
pub mod nginx;

use std::process::Command;

/// Runs the binary with `args`; panics with its stderr unless it succeeds. Returns stdout.
pub fn strata_stdout(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("spawn strata");
    assert!(
        out.status.success(),
        "strata {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// Runs the binary with `args`, expecting success and one JSON document on stdout.
pub fn strata_json(args: &[&str]) -> serde_json::Value {
    let stdout = strata_stdout(args);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("strata {args:?}: {e}: {stdout}"))
}

/// An `HF_HOME` of a test's own: beside its `--cache-dir` when `args` give one (a pull shares
/// what it fetched with the Hugging Face cache there, so tests must not share one), else one
/// per process.
pub fn hf_home_for(args: &[&str]) -> std::path::PathBuf {
    match args.iter().position(|a| *a == "--cache-dir") {
        Some(i) if i + 1 < args.len() => std::path::PathBuf::from(format!("{}-hf-home", args[i + 1])),
        _ => std::env::temp_dir().join(format!("strata-test-hf-home-{}", std::process::id())),
    }
}

/// `1,2,3`: ids as the binary's `--ids` takes them.
pub fn csv(ids: &[u32]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// The arguments of a greedy `strata run` on one of a golden's generation entries (its prompt,
/// as many new tokens as it recorded, JSON output).
pub fn greedy_args(dir: &str, entry: &serde_json::Value) -> Vec<String> {
    let n = strata_testkit::as_u32s(&entry["new_ids"]).len().to_string();
    let prompt = csv(&strata_testkit::as_u32s(&entry["prompt_ids"]));
    let args = [
        "run",
        "--model",
        dir,
        "--ids",
        &prompt,
        "--max-tokens",
        &n,
        "--temperature",
        "0",
        "--ignore-eos",
        "--output",
        "json",
    ];
    args.iter().map(|s| s.to_string()).collect()
}

/// Fixture `name`'s goldens through `strata` (the binary with whatever flags the caller adds):
/// every prompt's last logits within the fixture's tolerance and its argmax where the margin
/// allows, and every greedy generation up to where its margins make it decidable.
pub fn check_goldens(name: &str, strata: &dyn Fn(&[&str]) -> serde_json::Value) {
    use strata_testkit::{as_f32s, as_u32s, check_last_logits, checked_generation_len, fixture, golden};
    let dir = fixture(name);
    let dir = dir.to_str().unwrap();
    let g = golden(name);
    let rel = strata_testkit::rel_tolerance(&g);
    for (p, prompt) in g["prompts"].as_array().unwrap().iter().enumerate() {
        let ids = as_u32s(&prompt["ids"]);
        let out = strata(&["logits", "--model", dir, "--ids", &csv(&ids)]);
        let absmax = prompt["last_logits_absmax"].as_f64().unwrap() as f32;
        check_last_logits(
            &as_f32s(&out["last_logits"]),
            &as_f32s(&prompt["last_logits"]),
            absmax,
            rel,
        )
        .unwrap_or_else(|e| panic!("{name} prompt {p}: {e}"));
        let margins = as_f32s(&prompt["top2_margin"]);
        let argmax = as_u32s(&out["argmax"]);
        assert_eq!(argmax.len(), ids.len());
        for (i, (a, b)) in argmax.iter().zip(as_u32s(&prompt["argmax"])).enumerate() {
            if margins[i] >= 2.0 * rel * absmax {
                assert_eq!(*a, b, "{name} prompt {p}: argmax at {i}");
            }
        }
    }
    for entry in g["generation"].as_array().unwrap() {
        let p = entry["prompt_index"].as_u64().unwrap() as usize;
        let absmax = g["prompts"][p]["last_logits_absmax"].as_f64().unwrap() as f32;
        let want = as_u32s(&entry["new_ids"]);
        let args = greedy_args(dir, entry);
        let out = strata(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let checked = checked_generation_len(&as_f32s(&entry["step_top2_margin"]), rel, absmax);
        assert_eq!(
            &as_u32s(&out["token_ids"])[..checked],
            &want[..checked],
            "{name}: generation"
        );
        assert!(out["text"].is_string());
    }
}
