//! `strata bench` through the binary, as an outside check runs it: the JSON object on the last line
//! of stdout with the names such checks read, the per-token table, and the `--io` / `--prefetch`
//! flags.

use std::process::Command;

use serde_json::Value;
use strata_testkit::fixture;

mod common;

/// (stdout, the JSON object on its last line).
fn bench(args: &[&str]) -> (String, Value) {
    let stdout = common::strata_stdout(&[&["bench"], args].concat());
    let last = stdout.lines().last().expect("some output");
    let json = serde_json::from_str(last).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"));
    (stdout, json)
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

#[test]
fn bench_ends_with_one_json_line_of_the_figures_checks_read() {
    let model = fixture("kimi-k2-tiny-int4");
    let model = model.to_str().unwrap();
    let tokens = 5;
    for (io, prefetch) in [
        ("pread", "off"),
        ("pread", "auto"),
        ("pread", "on"),
        ("uring", "on"),
        ("mmap", "off"),
    ] {
        let what = format!("--io {io} --prefetch {prefetch}");
        let (text, j) = bench(&[
            "-m",
            model,
            "--tokens",
            &tokens.to_string(),
            "--expert-cache",
            "1K",
            "--io",
            io,
            "--prefetch",
            prefetch,
            "--json",
        ]);
        assert_eq!(j["tokens"].as_u64(), Some(tokens as u64), "{what}");
        for key in [
            "seconds_per_token",
            "bytes_read_per_token",
            "read_gbps",
            "raw_gbps",
            "hit_rate",
            "io_wait_fraction",
            "prefetch_recall",
        ] {
            let v = num(&j, key);
            assert!(v.is_finite() && v >= 0.0, "{what}: {key} = {v}");
        }
        // The prompt's time split: parts that add up to at most its whole.
        let parts: f64 = [
            "prefill_attention_s",
            "prefill_moe_s",
            "prefill_wait_s",
            "prefill_other_s",
        ]
        .map(|k| num(&j, k))
        .iter()
        .inspect(|v| assert!(v.is_finite() && **v >= 0.0, "{what}: prefill split {v}"))
        .sum();
        let whole = num(&j, "prefill_s");
        assert!(
            whole > 0.0 && parts <= whole * 1.001 + 1e-6,
            "{what}: prefill parts {parts} s of {whole} s"
        );
        assert!(
            num(&j, "prefill_attention_s") > 0.0
                && num(&j, "prefill_moe_s") + num(&j, "prefill_wait_s") > 0.0,
            "{what}: the prompt's attention and MoE layers take time"
        );
        // A 1 KiB cache holds no expert: every routed expert of every token is read, as the
        // plan shown beside the figures expects.
        assert!(num(&j, "bytes_read_per_token") > 0.0, "{what}");
        let plan = &j["memory_plan"];
        assert_eq!(num(plan, "expert_cache"), 1024.0, "{what}: {plan}");
        // At least every tensor byte of every routed expert: coalesced reads also span small
        // gaps between an expert's tensors, an expert too large for the cache whose submitted
        // read completes before its layer asks is read again, guessed reads come on top.
        let (expected, read) = (
            num(plan, "expected_read_per_token"),
            num(&j, "bytes_read_per_token"),
        );
        assert!(
            expected > 0.0 && expected <= read,
            "{what}: expected {expected} B/token, read {read}"
        );
        assert!(
            text.contains("memory plan") && text.contains("expected reads"),
            "{what}"
        );
        assert_eq!(num(&j, "hit_rate"), 0.0, "{what}");
        assert!(num(&j, "read_gbps") > 0.0 && num(&j, "raw_gbps") > 0.0, "{what}");
        for key in ["hit_rate", "io_wait_fraction", "prefetch_recall"] {
            assert!(num(&j, key) <= 1.0, "{what}: {key} is a fraction");
        }
        assert_eq!(
            j["prefetch"].as_str(),
            Some(if io == "mmap" { "off" } else { prefetch }),
            "{what}"
        );
        // The routed experts' products are part of the MoE layers' time (less their reads).
        let (routed, moe) = (
            num(&j, "routed_expert_s_per_token"),
            num(&j, "expert_compute_s_per_token"),
        );
        assert!(
            routed > 0.0 && routed <= moe * 1.01 + 1e-5,
            "{what}: routed {routed} s of the MoE layers' {moe} s"
        );
        assert!(text.contains("the routed experts' products"), "{what}");
        let per_token = j["per_token"].as_array().expect("per_token");
        assert_eq!(
            per_token.len(),
            tokens - 1,
            "{what}: each decoded token after the first is timed"
        );
        for t in per_token {
            let parts = ["io_wait_s", "expert_compute_s", "attention_s", "other_s"]
                .map(|k| num(t, k))
                .iter()
                .sum::<f64>();
            let s = num(t, "seconds");
            assert!(
                (parts - s).abs() <= 1e-6 + 1e-3 * s,
                "{what}: the split adds up to the token's time: {t}"
            );
        }
        // The text before it: a row per timed token and their mean.
        assert!(
            text.contains("I/O wait") && text.contains("attention"),
            "{what}: {text}"
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.trim_start().starts_with(char::is_numeric))
                .count(),
            tokens - 1,
            "{what}: {text}"
        );
        assert!(text.lines().any(|l| l.trim_start().starts_with("mean")), "{what}");
    }
}

#[test]
fn prefetch_alone_means_on_and_other_values_are_refused() {
    let model = fixture("qwen3-moe-tiny");
    let model = model.to_str().unwrap();
    let (_, j) = bench(&["-m", model, "--tokens", "2", "--prefetch", "--json"]);
    assert_eq!(j["prefetch"].as_str(), Some("on"));
    let (_, j) = bench(&["-m", model, "--tokens", "2", "--json"]);
    assert_eq!(j["prefetch"].as_str(), Some("off"), "no guess is read by default");
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["bench", "-m", model, "--tokens", "2", "--prefetch", "maybe"])
        .output()
        .expect("spawn strata");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("maybe") && err.contains("on"), "{err}");
}

#[test]
fn bench_counts_streamed_layers_reads() {
    let model = fixture("kimi-linear-tiny");
    let model = model.to_str().unwrap();
    let plan = common::strata_json(&["inspect", "-m", model, "--json", "--spine", "stream"]);
    let per_pass = plan["memory"]["streamed_bytes_per_token"].as_f64().unwrap();
    let (text, j) = bench(&["-m", model, "--tokens", "4", "--spine", "stream", "--json"]);
    assert!(text.contains("streamed layers"), "{text}");
    assert_eq!(j["streamed_layers"].as_u64(), plan["layers"].as_u64());
    // Every token reads every streamed layer once; the reads run two layers ahead across token
    // boundaries, so the timed tokens' total is off by at most the two layers in flight at
    // either end.
    let spine = num(&j, "spine_bytes_per_token");
    let timed = num(&j, "timed_tokens");
    let largest = (plan["layer_bytes"].as_array().unwrap().iter())
        .map(|b| b.as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(
        (spine * timed - per_pass * timed).abs() <= 2.0 * largest,
        "{spine} bytes of layers per token over {timed} tokens, {per_pass} per pass"
    );
    assert!(num(&j, "bytes_read_per_token") >= spine);
    let (_, resident) = bench(&["-m", model, "--tokens", "4", "--json"]);
    assert_eq!(resident["streamed_layers"].as_u64(), Some(0));
    assert_eq!(num(&resident, "spine_bytes_per_token"), 0.0);
}

/// `--compute-only`: every expert is read into the cache before the prompt, so the timed tokens
/// read nothing and hit every expert; the weight bytes the products touched per token are at
/// least the routed experts' and come with the memory's bandwidth measured in the same run. A
/// cache too small for every expert is refused with both sizes.
#[test]
fn compute_only_reads_nothing_while_timing_and_counts_the_weights_touched() {
    let model = fixture("kimi-k2-tiny-int4");
    let model = model.to_str().unwrap();
    let (text, j) = bench(&["-m", model, "--tokens", "4", "--compute-only", "--json"]);
    assert_eq!(num(&j, "bytes_read_per_token"), 0.0, "{text}");
    assert_eq!(num(&j, "hit_rate"), 1.0, "{text}");
    let c = &j["compute_only"];
    let (touched, memory) = (num(c, "weight_bytes_per_token"), num(c, "memory_gbs"));
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("kimi-k2-tiny-int4").join("config.json")).unwrap(),
    )
    .unwrap();
    let (k, moe_ffn, hidden) = (
        config["num_experts_per_tok"].as_f64().unwrap(),
        config["moe_intermediate_size"].as_f64().unwrap(),
        config["hidden_size"].as_f64().unwrap(),
    );
    // At 4 bits, at least half a byte per weight of each routed expert's three matrices.
    assert!(touched >= k * 3.0 * moe_ffn * hidden * 0.5, "{c}");
    assert!(memory > 0.0 && num(c, "weights_gbs") > 0.0, "{c}");
    assert!(text.contains("of the memory's read bandwidth"), "{text}");
    // `-t N` (`--threads`) sizes the compute threads, as in llama.cpp.
    for (flag, n) in [("-t", 1u64), ("--threads", 3)] {
        let (_, j) = bench(&[
            flag,
            &n.to_string(),
            "-m",
            model,
            "--tokens",
            "2",
            "--compute-only",
            "--json",
        ]);
        assert_eq!(j["threads"].as_u64(), Some(n), "{flag} {n}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "bench",
            "-m",
            model,
            "--tokens",
            "2",
            "--compute-only",
            "--expert-cache",
            "1K",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--compute-only") && err.contains("GiB"),
        "{err}"
    );
}
