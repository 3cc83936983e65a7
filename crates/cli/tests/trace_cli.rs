//! `--trace FILE` writes each MoE layer's routing per step, and `strata trace FILE` replays it:
//! a line per layer and step, hit rates that Belady's optimum bounds, predictors scored.

use std::process::Command;

use serde_json::Value;

fn strata(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("spawn strata")
}

#[test]
fn a_run_s_trace_replays_within_the_optimum() {
    let dir = std::env::temp_dir().join(format!("strata-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("routing.jsonl");
    let n = 24;
    let out = strata(&[
        "run",
        "--prompt",
        "The king said",
        "--max-tokens",
        &n.to_string(),
        "--ignore-eos",
        "--temperature",
        "0",
        "--trace",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = strata(&[
        "trace",
        file.to_str().unwrap(),
        "--sizes",
        "10%,25%,50%,100%",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let layers = v["moe_layers"].as_u64().unwrap();
    // The prompt's pass, then one pass per generated token but the last.
    assert_eq!(v["groups"].as_u64().unwrap(), layers * n);
    assert_eq!(v["one_token_groups"].as_u64().unwrap(), layers * (n - 1));
    let mut last_belady = 0.0;
    for r in v["hit_rates"].as_array().unwrap() {
        let rate = |k: &str| r[k].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&rate("belady")), "{r}");
        assert!(
            rate("lru") <= rate("belady") && rate("lfu") <= rate("belady"),
            "{r}"
        );
        assert!(
            rate("belady") >= last_belady,
            "the optimum grows with the cache: {r}"
        );
        last_belady = rate("belady");
    }
    // Room for every expert: only first uses miss, whatever the policy.
    let all = &v["hit_rates"][3];
    assert_eq!(all["lru"], all["belady"]);
    assert!(v["next_layer_guess"]["layers"].as_u64().unwrap() > 0);
    assert_eq!(v["previous_token"]["pairs"].as_u64().unwrap(), layers * (n - 2));
    let text = strata(&["trace", file.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("Belady"));
    // Not a trace: a clear error naming the file.
    let other = dir.join("other.jsonl");
    std::fs::write(&other, "{\"layer\": 1}\n").unwrap();
    let out = strata(&["trace", other.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("other.jsonl:1")
            && stderr.contains("not a strata routing trace"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
