//! Kimi K3 through the binary: `strata logits`, `strata run` (greedy with state, with every
//! expert cached and with `--expert-cache 1K`, which holds none), the XTML chat prompt of
//! `strata tokenize --chat`, and `strata inspect --config-only` on K3's real config numbers.

use std::process::Command;

use serde_json::Value;
use strata_testkit::{as_f32s, as_u32s, fixture, golden};

const K3: &str = "kimi-k3-tiny";
/// kimi-k3 README: last logits within 1e-3 x absmax for an f32 engine.
const REL: f32 = 1e-3;

mod common;

fn strata(args: &[&str]) -> Value {
    common::strata_json(args)
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

fn absmax(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

#[test]
fn kimi_k3_logits_and_greedy_runs_match_the_reference() {
    logits_and_greedy_runs_match(&[]);
}

/// The same on the GPU backend (KDA and AttnRes layers: each product sent there, the rest on
/// the CPU), with the routed experts there too and with room for few of them. Needs an adapter,
/// as `gpu_goldens.rs` says; not run where `STRATA_NO_GPU=1` says there is none.
#[test]
fn kimi_k3_logits_and_greedy_runs_match_the_reference_on_the_gpu() {
    if std::env::var("STRATA_NO_GPU").is_ok_and(|v| v == "1") {
        eprintln!("STRATA_NO_GPU=1: Kimi K3 on the GPU not run");
        return;
    }
    logits_and_greedy_runs_match(&["--device", "gpu"]);
    logits_and_greedy_runs_match(&["--device", "gpu", "--gpu-experts", "--gpu-mem", "64K"]);
}

/// `strata logits` and greedy `strata run` on every prompt of the reference, with `device` (the
/// flags before the command) and each expert cache.
fn logits_and_greedy_runs_match(device: &[&str]) {
    let dir = fixture(K3);
    let dir = dir.to_str().unwrap();
    let g = golden(K3);
    for cache in [None, Some("1K")] {
        let extra: Vec<&str> = cache.map(|c| vec!["--expert-cache", c]).unwrap_or_default();
        let strata = |args: &[&str]| strata(&[device, args].concat());
        let cache = (device, cache);
        for prompt in g["prompts"].as_array().unwrap() {
            let name = prompt["name"].as_str().unwrap();
            let ids = as_u32s(&prompt["ids"]);
            let mut args = vec!["logits", "--model", dir, "--ids"];
            let ids_csv = csv(&ids);
            args.push(&ids_csv);
            args.extend(&extra);
            let out = strata(&args);
            let want = as_f32s(&prompt["last_logits"]);
            let got = as_f32s(&out["last_logits"]);
            let worst = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= REL * absmax(&want),
                "{name} {cache:?}: last logits off by {worst}"
            );
            // Argmax everywhere when the golden's smallest margin allows; else near-ties exist
            // (the library test checks positions against strata's own margins).
            let tie = 2.0 * REL * absmax(&want);
            let mismatches = as_u32s(&out["argmax"])
                .iter()
                .zip(as_u32s(&prompt["argmax"]))
                .filter(|(a, b)| **a != *b)
                .count();
            if prompt["argmax_min_margin"].as_f64().unwrap() as f32 >= tie {
                assert_eq!(mismatches, 0, "{name} {cache:?}: argmax");
            } else {
                assert!(
                    mismatches <= 1,
                    "{name} {cache:?}: {mismatches} argmax mismatches"
                );
            }

            let greedy = as_u32s(&prompt["greedy16"]);
            let n = greedy.len().to_string();
            let mut args = vec!["run", "--model", dir, "--ids", &ids_csv, "--max-tokens", &n];
            args.extend(["--temperature", "0", "--ignore-eos", "--output", "json"]);
            args.extend(&extra);
            let got = as_u32s(&strata(&args)["token_ids"]);
            for (i, step) in prompt["greedy16_steps"].as_array().unwrap().iter().enumerate() {
                assert_eq!(got[i], greedy[i], "{name} {cache:?}: greedy token {i}");
                let top = as_f32s(&step["top5_logits"]);
                if top[0] - top[1] < tie {
                    break;
                }
            }
        }
    }
}

#[test]
fn kimi_k3_chat_prompt_renders_as_xtml() {
    let g = golden(K3);
    let chat = g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "chat")
        .unwrap();
    // The reference's chat prompt is one user message (the only text segment that is not a tag).
    let user = chat["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_array().unwrap())
        .find(|s| s[1] == false && !s[0].as_str().unwrap().starts_with("message") && s[0] != "think")
        .map(|s| s[0].as_str().unwrap().to_string())
        .unwrap();
    let file = std::env::temp_dir().join(format!("strata-k3-chat-{}.json", std::process::id()));
    std::fs::write(
        &file,
        serde_json::json!([{"role": "user", "content": user}]).to_string(),
    )
    .unwrap();
    let dir = fixture(K3);
    let out = strata(&[
        "tokenize",
        "--model",
        dir.to_str().unwrap(),
        "--chat",
        file.to_str().unwrap(),
        "--add-generation-prompt",
    ]);
    std::fs::remove_file(&file).ok();
    assert_eq!(as_u32s(&out["ids"]), as_u32s(&chat["ids"]));
}

#[test]
fn inspect_config_only_gives_kimi_k3_figures() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kimi-k3-config.json");
    let out = strata(&[
        "inspect",
        "--config-only",
        config.to_str().unwrap(),
        "--json",
        "--mem",
        "2T",
    ]);
    let num = |k: &str| out[k].as_u64().unwrap_or_else(|| panic!("{k}: {out}"));
    // kimi-k3 spec section 1 and 7.
    assert_eq!(num("total_params"), 2_779_484_478_208, "2.78T total");
    let active = num("active_params") as f64 / 1e9;
    assert!((103.5..105.0).contains(&active), "~104B active, got {active:.2}B");
    assert_eq!(num("bytes_per_expert"), 17_547_264);
    assert_eq!(
        num("uncached_token_bytes"),
        25_829_572_608,
        "25.8 GB per token at zero hits"
    );
    assert_eq!(num("non_expert_bytes"), 113_509_540_864);
    let m = &out["memory"];
    // 69 KDA layers x (96 x 128 x 128 state + 3 x 3 x 12288 conv) f32; 24 MLA layers x 576 f32.
    assert_eq!(
        m["state_bytes_per_sequence"].as_u64().unwrap(),
        69 * (6_291_456 + 442_368)
    );
    assert_eq!(m["state_bytes_per_token"].as_u64().unwrap(), 24 * 576 * 4);

    let text = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["inspect", "--config-only", config.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("2.78T total") && text.contains("104.19B active"),
        "{text}"
    );
    assert!(text.contains("25.8 GB at zero cache hits"), "{text}");
}

/// Kimi K3 on a 64 GB machine: its BF16 spine (106 GiB) streams 43 of 93 layers, 47 GiB at
/// every token; the INT8 spine (53.5 GiB) stays resident and leaves the rest to the experts.
#[test]
fn kimi_k3_int8_spine_stays_resident_in_64g() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kimi-k3-config.json");
    let plan = |format: &str| {
        strata(&[
            "inspect",
            "--config-only",
            config.to_str().unwrap(),
            "--json",
            "--mem",
            "64G",
            "--ctx-size",
            "8192",
            "--spine-format",
            format,
        ])
    };
    let native = plan("native");
    let int8 = plan("int8");
    let num = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("{v}"));
    let (nm, im) = (&native["memory"], &int8["memory"]);
    // Native: streams about half the layers, and says what INT8 would read instead.
    let streamed = nm["streamed_layers"].as_array().unwrap().len();
    assert!((40..=50).contains(&streamed), "{streamed} layers streamed");
    assert!(num(&nm["streamed_bytes_per_token"]) > 40 << 30);
    assert_eq!(
        nm["int8_alternative_read_per_token"],
        im["expected_read_per_token"]
    );
    // INT8: every linear layer at a byte per weight (+ a scale per row): 57.41 GB, resident.
    assert_eq!(num(&int8["non_expert_bytes_int8"]), 57_410_211_200);
    assert!(num(&int8["non_expert_bytes_int8"]) * 100 < num(&int8["non_expert_bytes"]) * 51);
    assert!(im["streamed_layers"].as_array().unwrap().is_empty());
    assert_eq!(num(&im["resident"]), 57_410_211_200);
    // What is left goes to the expert cache: 64 GiB less the spine, 8192 positions of state,
    // read buffers and working memory.
    let fixed = num(&im["resident"]) + num(&im["state_reserve"]) + num(&im["buffers"]) + num(&im["work"]);
    assert_eq!(num(&im["expert_cache"]), (64u64 << 30) - fixed);
    assert!(num(&im["expert_cache"]) > 8 << 30, "{im}");
    // Its price: the experts alone (no streamed layers), about 24 GB per token at zero hits.
    assert_eq!(num(&im["streamed_bytes_per_token"]), 0);
    assert!(num(&im["expected_read_per_token"]) < num(&nm["expected_read_per_token"]) / 2);
}
