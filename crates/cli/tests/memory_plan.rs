//! The `--mem` plan through `strata inspect --json`, and runs under it: every byte of `--mem`
//! is spent or shown unused; no share exceeds what the model can use; a spine that fits stays
//! resident, and only what does not fit streams; a budget short of the plan is a clear error;
//! the embedded model runs under 64 MiB with its peak RSS inside `--mem`.

use std::process::Command;

use serde_json::Value;
use strata_testkit::{as_u32s, fixture, golden, BF16_MODELS, QUANTIZED_MODELS};

mod common;

fn strata(args: &[&str]) -> Value {
    common::strata_json(args)
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

fn inspect(dir: &str, extra: &[&str]) -> Value {
    strata(&[&["inspect", "--model", dir, "--json"][..], extra].concat())
}

const MODELS: &[&str] = &["kimi-k3-tiny", "kimi-linear-tiny"];

/// Everything but the expert cache and what is left unused.
fn fixed(m: &Value) -> u64 {
    num(&m["resident"])
        + num(&m["state_reserve"])
        + num(&m["buffers"])
        + num(&m["work"])
        + num(&m["spine_buffers"])
}

#[test]
fn the_plan_spends_mem_exactly_and_caps_every_share() {
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS).chain(MODELS) {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap())
                .unwrap();
        for mem in ["16M", "48M", "64M", "256M", "2G", "64G"] {
            for concurrent in ["1", "16"] {
                let out = inspect(dir, &["--mem", mem, "--max-concurrent", concurrent]);
                let m = &out["memory"];
                if m.is_null() {
                    let e = out["memory_error"].as_str().unwrap();
                    assert!(e.contains("too small"), "{name} {mem}: {e}");
                    assert!(mem == "16M" || mem == "48M", "{name}: --mem {mem} refused: {e}");
                    continue;
                }
                let label = format!("{name} --mem {mem} x{concurrent}");
                let expert_bytes = num(&out["expert_bytes"]);
                assert_eq!(
                    fixed(m) + num(&m["expert_cache"]) + num(&m["unused"]),
                    num(&m["mem"]),
                    "{label}: every byte spent or shown unused"
                );
                assert!(
                    num(&m["expert_cache"]) <= expert_bytes,
                    "{label}: a cache larger than every expert"
                );
                assert!(
                    num(&m["unused"]) == 0 || num(&m["expert_cache"]) == expert_bytes,
                    "{label}: memory left unused while experts miss the cache"
                );
                let model_ctx = cfg
                    .get("max_position_embeddings")
                    .or_else(|| {
                        cfg.get("text_config")
                            .and_then(|t| t.get("max_position_embeddings"))
                    })
                    .and_then(Value::as_u64)
                    .unwrap_or(u64::MAX);
                assert!(
                    num(&m["ctx_size"]) <= model_ctx,
                    "{label}: a context past the model's"
                );
                assert!(num(&m["state_tokens"]) >= num(&m["ctx_size"]), "{label}");
                // Read buffers: only what is in flight (top-k per sequence, the reader threads
                // at most), as many kept, one layer computing; no fixed floor.
                let top_k = num(&out["active_experts"]);
                let in_flight = num(&m["reads_in_flight"]);
                assert_eq!(
                    in_flight,
                    (top_k * concurrent.parse::<u64>().unwrap()).min(8),
                    "{label}"
                );
                assert_eq!(
                    num(&m["buffers"]),
                    (2 * in_flight + top_k) * (num(&out["bytes_per_expert"]) + 65536)
                );
                // The plan's price: streamed bytes + the experts' uniform miss share.
                let share = (num(&m["expert_cache"]) as f64 / expert_bytes as f64).min(1.0);
                let want = num(&m["streamed_bytes_per_token"]) as f64
                    + num(&out["uncached_token_bytes"]) as f64 * (1.0 - share);
                assert!(
                    (num(&m["expected_read_per_token"]) as f64 - want).abs() <= 1.0,
                    "{label}: {m}"
                );
            }
        }
    }
}

#[test]
fn a_spine_that_fits_stays_resident_and_only_what_does_not_fit_streams() {
    for name in MODELS {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        // The context pinned, so the state reserve does not move with --mem.
        let pin = ["--ctx-size", "64"];
        let all = inspect(dir, &[&pin[..], &["--spine", "stream"]].concat());
        let m = &all["memory"];
        let layers: Vec<u64> = all["layer_bytes"].as_array().unwrap().iter().map(num).collect();
        assert_eq!(num(&m["streamed_bytes_per_token"]), layers.iter().sum::<u64>());
        let rest = num(&m["state_reserve"]) + num(&m["buffers"]) + num(&m["work"]);
        let everything_resident = num(&all["non_expert_bytes"]) + rest;

        // Exactly enough for the spine: it stays, the expert cache gets nothing (experts are
        // read at every use: slower, never wrong).
        let exact = inspect(
            dir,
            &[&pin[..], &["--mem", &everything_resident.to_string()]].concat(),
        );
        let e = &exact["memory"];
        assert!(e["streamed_layers"].as_array().unwrap().is_empty(), "{name}: {e}");
        assert_eq!(num(&e["expert_cache"]), 0);
        assert_eq!(
            num(&e["expected_read_per_token"]),
            num(&all["uncached_token_bytes"])
        );

        // One byte short: the fewest layers stream (a few, not all), the rest stay.
        let short = (everything_resident - 1).to_string();
        let some = inspect(dir, &[&pin[..], &["--mem", &short]].concat());
        let s = &some["memory"];
        let streamed: Vec<u64> = s["streamed_layers"].as_array().unwrap().iter().map(num).collect();
        let n_streamable = layers.iter().filter(|&&b| b > 0).count();
        assert!(
            !streamed.is_empty() && streamed.len() < n_streamable,
            "{name}: --mem {short} streams {streamed:?}"
        );
        let resident_layers: u64 = (0..layers.len() as u64)
            .filter(|l| !streamed.contains(l))
            .map(|l| layers[l as usize])
            .sum();
        assert_eq!(num(&s["resident"]), num(&m["resident"]) + resident_layers);
        assert_eq!(
            fixed(s) + num(&s["expert_cache"]) + num(&s["unused"]),
            everything_resident - 1
        );
        // `--spine resident` refuses that budget with a clear error.
        let refused = inspect(
            dir,
            &[&pin[..], &["--mem", &short, "--spine", "resident"]].concat(),
        );
        assert!(
            refused["memory_error"].as_str().unwrap().contains("too small"),
            "{refused}"
        );

        // A tighter budget reads fewer layers ahead: each layer ahead needs a buffer the size of
        // the largest streamed layer, and two are the least (the one computing, one recycled).
        let largest = *layers.iter().max().unwrap();
        let base = num(&m["resident"]) + rest;
        for ahead in 0..=2u64 {
            let tight = (base + (ahead + 2) * largest).to_string();
            let plan = inspect(dir, &[&pin[..], &["--mem", &tight, "--spine", "stream"]].concat());
            assert_eq!(
                plan["memory"]["spine_ahead"].as_u64(),
                Some(ahead),
                "{name}: --mem {tight}"
            );
            assert_eq!(num(&plan["memory"]["spine_buffers"]), (ahead + 2) * largest);
        }

        // Runs under those budgets give the logits of everything cached.
        let ids = csv(&as_u32s(&golden(name)["prompts"][1]["ids"]));
        let cached = strata(&["logits", "--model", dir, "--ids", &ids]);
        for mem in [everything_resident, everything_resident - 1, base + 2 * largest] {
            let spine = if mem == base + 2 * largest {
                "stream"
            } else {
                "auto"
            };
            let got = strata(&[
                "logits",
                "--model",
                dir,
                "--ids",
                &ids,
                "--ctx-size",
                "64",
                "--mem",
                &mem.to_string(),
                "--spine",
                spine,
            ]);
            assert_eq!(got, cached, "{name}: --mem {mem} changed the logits");
        }
    }
}

#[test]
fn the_figures_of_a_plan() {
    let dir = fixture("kimi-k2-tiny");
    let dir = dir.to_str().unwrap();
    let out = inspect(dir, &["--mem", "2G"]);
    let m = &out["memory"];
    assert_eq!(num(&m["mem"]), 2 << 30);
    assert_eq!(num(&m["resident"]), num(&out["non_expert_bytes"]));
    assert_eq!(
        num(&m["expert_cache"]),
        num(&out["expert_bytes"]),
        "2 GiB holds every expert"
    );
    // MLA state: (kv_lora + rope) f32 per layer per position, from config.json.
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("kimi-k2-tiny").join("config.json")).unwrap())
            .unwrap();
    let per_token =
        num(&cfg["num_hidden_layers"]) * (num(&cfg["kv_lora_rank"]) + num(&cfg["qk_rope_head_dim"])) * 4;
    assert_eq!(num(&m["state_bytes_per_token"]), per_token);
    assert_eq!(
        num(&out["uncached_token_bytes"]),
        num(&out["bytes_per_expert"]) * num(&out["active_experts"]) * num(&out["moe_layers"])
    );
    let run = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["logits", "--model", dir, "--ids", "1,2", "--mem", "1K"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--mem") && stderr.contains("too small"),
        "{stderr}"
    );
}

/// Peak resident memory of the children waited for so far, in bytes.
fn children_peak_rss() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) }, 0);
    usage.ru_maxrss as u64 * 1024
}

#[test]
fn the_embedded_model_runs_within_64_mib() {
    let mem = 64u64 << 20;
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "run",
            "--prompt",
            "Hello",
            "--max-tokens",
            "24",
            "--ignore-eos",
            "--mem",
            "64M",
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 24);
    let peak = children_peak_rss();
    assert!(peak <= mem, "peak RSS {peak} over --mem {mem}");
}
