//! The reference checks driven through the real `strata` binary, as external checks use it:
//! `strata logits`, `strata run --output json`, `strata tokenize`, `strata detokenize`.

use std::process::Command;

use serde_json::Value;
use strata_testkit::{
    as_f32s, as_u32s, check_last_logits, checked_generation_len, fixture, golden, rel_tolerance, BF16_MODELS,
    QUANTIZED_MODELS,
};

mod common;

fn strata(args: &[&str]) -> Value {
    common::strata_json(args)
}

/// `strata run` greedy on one of a golden's generation entries (its prompt, as many new tokens
/// as it recorded), with `extra` flags; the JSON output.
fn greedy_run(dir: &str, entry: &Value, extra: &[&str]) -> Value {
    let n = as_u32s(&entry["new_ids"]).len().to_string();
    let prompt = csv(&as_u32s(&entry["prompt_ids"]));
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
    strata(&[&args[..], extra].concat())
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

#[test]
fn logits_and_run_through_the_binary_match_goldens() {
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let g = golden(name);
        let rel = rel_tolerance(&g);
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
            .unwrap_or_else(|e| panic!("{name} prompt {p} via CLI: {e}"));
            let margins = as_f32s(&prompt["top2_margin"]);
            let argmax = as_u32s(&out["argmax"]);
            assert_eq!(argmax.len(), ids.len());
            for (i, (a, b)) in argmax.iter().zip(as_u32s(&prompt["argmax"])).enumerate() {
                if margins[i] >= 2.0 * rel * absmax {
                    assert_eq!(*a, b, "{name} prompt {p} via CLI: argmax at {i}");
                }
            }
        }
        for entry in g["generation"].as_array().unwrap() {
            let p = entry["prompt_index"].as_u64().unwrap() as usize;
            let absmax = g["prompts"][p]["last_logits_absmax"].as_f64().unwrap() as f32;
            let want = as_u32s(&entry["new_ids"]);
            let out = greedy_run(dir, entry, &[]);
            let got = as_u32s(&out["token_ids"]);
            let margins = as_f32s(&entry["step_top2_margin"]);
            let checked = checked_generation_len(&margins, rel, absmax);
            assert_eq!(&got[..checked], &want[..checked], "{name} generation via CLI");
            assert!(out["text"].is_string());
        }
    }
}

#[test]
fn tokenize_and_detokenize_through_the_binary_match_goldens() {
    for name in BF16_MODELS {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let g = golden(name);
        for case in g["tokenizer"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let out = strata(&["tokenize", "--model", dir, "--text", text]);
            assert_eq!(
                as_u32s(&out["ids"]),
                as_u32s(&case["ids"]),
                "{name}: tokenize {text:?}"
            );
            let out = strata(&["tokenize", "--model", dir, "--text", text, "--add-special"]);
            assert_eq!(
                as_u32s(&out["ids"]),
                as_u32s(&case["ids_add_special_tokens"]),
                "{name}: {text:?} +special"
            );
            let ids = csv(&as_u32s(&case["ids"]));
            if !ids.is_empty() {
                let out = strata(&["detokenize", "--model", dir, "--ids", &ids]);
                assert_eq!(out["text"], case["decoded"], "{name}: detokenize {text:?}");
                let out = strata(&["detokenize", "--model", dir, "--ids", &ids, "--skip-special"]);
                assert_eq!(
                    out["text"], case["decoded_skip_special"],
                    "{name}: detokenize --skip-special {text:?}"
                );
            }
        }
        let tmp = std::env::temp_dir().join(format!("strata-chat-{}-{name}.json", std::process::id()));
        for case in g["chat_template"].as_array().unwrap() {
            std::fs::write(&tmp, serde_json::to_string(&case["messages"]).unwrap()).unwrap();
            let mut args = vec!["tokenize", "--model", dir, "--chat", tmp.to_str().unwrap()];
            if case["add_generation_prompt"].as_bool().unwrap() {
                args.push("--add-generation-prompt");
            }
            let kwargs = serde_json::to_string(&case["extra_template_kwargs"]).unwrap();
            args.extend(["--template-kwargs", &kwargs]);
            let out = strata(&args);
            assert_eq!(out["text"], case["rendered"], "{name}: chat rendering");
            assert_eq!(as_u32s(&out["ids"]), as_u32s(&case["ids"]), "{name}: chat ids");
        }
        let _ = std::fs::remove_file(&tmp);
    }
}

#[test]
fn tokenizer_commands_work_on_a_folder_with_only_tokenizer_files() {
    let dir = fixture("tokenizers/qwen3");
    let dir = dir.to_str().unwrap();
    let out = strata(&["tokenize", "--model", dir, "--text", "Hello world"]);
    let ids = as_u32s(&out["ids"]);
    assert!(!ids.is_empty());
    let out = strata(&["detokenize", "--model", dir, "--ids", &csv(&ids)]);
    assert_eq!(out["text"], "Hello world");
}

#[test]
fn a_cache_smaller_than_one_expert_changes_nothing_through_the_binary() {
    // `--expert-cache 1K` holds no expert: every routed expert is read from disk at every use.
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let g = golden(name);
        let rel = rel_tolerance(&g);
        for prompt in g["prompts"].as_array().unwrap() {
            let ids = csv(&as_u32s(&prompt["ids"]));
            let streamed = strata(&["logits", "--model", dir, "--ids", &ids, "--expert-cache", "1K"]);
            let cached = strata(&["logits", "--model", dir, "--ids", &ids]);
            assert_eq!(streamed, cached, "{name}: streaming changed the logits");
            let through = |io: &str| {
                strata(&[
                    "logits",
                    "--model",
                    dir,
                    "--ids",
                    &ids,
                    "--expert-cache",
                    "1K",
                    "--io",
                    io,
                ])
            };
            assert_eq!(through("mmap"), cached, "{name}: --io mmap changed the logits");
            if strata_experts::uring_available() {
                assert_eq!(through("uring"), cached, "{name}: --io uring changed the logits");
            } else {
                eprintln!("io_uring is not available to this process: --io uring not checked");
            }
            let absmax = prompt["last_logits_absmax"].as_f64().unwrap() as f32;
            check_last_logits(
                &as_f32s(&streamed["last_logits"]),
                &as_f32s(&prompt["last_logits"]),
                absmax,
                rel,
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let entry = &g["generation"][0];
        let want = as_u32s(&entry["new_ids"]);
        let out = greedy_run(dir, &g["generation"][0], &["--expert-cache", "1K"]);
        let p = entry["prompt_index"].as_u64().unwrap() as usize;
        let absmax = g["prompts"][p]["last_logits_absmax"].as_f64().unwrap() as f32;
        let margins = as_f32s(&entry["step_top2_margin"]);
        let checked = checked_generation_len(&margins, rel, absmax);
        assert_eq!(
            &as_u32s(&out["token_ids"])[..checked],
            &want[..checked],
            "{name}: streamed generation"
        );
    }
}

#[test]
fn inspect_reports_the_memory_plan_and_a_too_small_mem_is_a_clear_error() {
    let dir = fixture("kimi-k2-tiny");
    let dir = dir.to_str().unwrap();
    let out = strata(&["inspect", "--model", dir, "--json", "--mem", "2G"]);
    let m = &out["memory"];
    let num = |v: &Value| v.as_u64().unwrap();
    assert_eq!(num(&m["mem"]), 2 << 30);
    assert_eq!(num(&m["resident"]), num(&out["non_expert_bytes"]));
    assert_eq!(
        num(&m["expert_cache"]),
        num(&m["mem"]) - num(&m["resident"]) - num(&m["state_reserve"]) - num(&m["buffers"]),
        "the expert cache gets what --mem leaves"
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

#[test]
fn streamed_layers_change_nothing_through_the_binary() {
    // `--spine stream`: every decoder layer's non-expert weights are read from disk each time
    // the layer runs (and `--expert-cache 1K` reads every expert too).
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let g = golden(name);
        let prompt = &g["prompts"][0];
        let ids = csv(&as_u32s(&prompt["ids"]));
        let cached = strata(&["logits", "--model", dir, "--ids", &ids]);
        for io in ["pread", "mmap"] {
            let streamed = strata(&[
                "logits",
                "--model",
                dir,
                "--ids",
                &ids,
                "--expert-cache",
                "1K",
                "--spine",
                "stream",
                "--io",
                io,
            ]);
            assert_eq!(
                streamed, cached,
                "{name}: streamed layers (--io {io}) changed the logits"
            );
        }
        let run =
            |spine: &str| greedy_run(dir, &g["generation"][0], &["--spine", spine])["token_ids"].clone();
        assert_eq!(run("stream"), run("resident"), "{name}: streamed generation");
    }
}

#[test]
fn a_mem_below_the_non_expert_weights_streams_some_layers() {
    let num = |v: &Value| v.as_u64().unwrap();
    // Streaming k layers saves k layers' bytes but costs read buffers for a few of them, so a
    // budget just short of everything resident streams some layers of a deep enough model.
    for name in ["kimi-k3-tiny", "kimi-linear-tiny"] {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        // Everything streamed: what stays (embedding, norm, head), the layer buffers at most.
        let all = strata(&["inspect", "--model", dir, "--json", "--spine", "stream"]);
        let m = &all["memory"];
        let layers: Vec<u64> = all["layer_bytes"].as_array().unwrap().iter().map(num).collect();
        assert_eq!(layers.len() as u64, num(&all["layers"]));
        let n_streamed = m["streamed_layers"].as_array().unwrap().len();
        assert_eq!(n_streamed, layers.iter().filter(|&&b| b > 0).count());
        assert_eq!(num(&m["streamed_bytes_per_token"]), layers.iter().sum::<u64>());
        assert_eq!(
            num(&m["resident"]),
            num(&all["non_expert_bytes"]) - layers.iter().sum::<u64>()
        );
        let min_cache = 2 * num(&all["active_experts"]) * num(&all["bytes_per_expert"]);
        let all_resident = num(&all["non_expert_bytes"]) + num(&m["state_reserve"]) + num(&m["buffers"]);
        let mem = all_resident + min_cache - 1;

        let some = strata(&["inspect", "--model", dir, "--json", "--mem", &mem.to_string()]);
        let s = &some["memory"];
        let streamed: Vec<u64> = s["streamed_layers"].as_array().unwrap().iter().map(num).collect();
        assert!(
            !streamed.is_empty() && streamed.len() < n_streamed,
            "{name}: --mem {mem} streams {streamed:?}"
        );
        let resident_layers: u64 = (0..layers.len() as u64)
            .filter(|l| !streamed.contains(l))
            .map(|l| layers[l as usize])
            .sum();
        assert_eq!(num(&s["resident"]), num(&m["resident"]) + resident_layers);
        let total = num(&s["resident"])
            + num(&s["state_reserve"])
            + num(&s["buffers"])
            + num(&s["spine_buffers"])
            + num(&s["expert_cache"]);
        assert_eq!(total, mem, "{name}: the plan spends --mem exactly");
        assert!(num(&s["expert_cache"]) >= min_cache);
        // `--spine resident` refuses a budget short of the non-expert weights.
        let short = (all_resident - 1).to_string();
        let refused = strata(&[
            "inspect", "--model", dir, "--json", "--mem", &short, "--spine", "resident",
        ]);
        assert!(
            refused["memory_error"].as_str().unwrap().contains("too small"),
            "{refused}"
        );

        // A tighter budget reads fewer layers ahead: each layer ahead needs a buffer the size of
        // the largest streamed layer, and two are the least (the one computing, one recycled).
        let largest = *layers.iter().max().unwrap();
        let base = num(&m["resident"]) + num(&m["state_reserve"]) + num(&m["buffers"]) + min_cache;
        for ahead in 0..=2u64 {
            let tight = (base + (ahead + 2) * largest).to_string();
            let plan = strata(&[
                "inspect", "--model", dir, "--json", "--mem", &tight, "--spine", "stream",
            ]);
            assert_eq!(
                plan["memory"]["spine_ahead"].as_u64(),
                Some(ahead),
                "{name}: --mem {tight}"
            );
            assert_eq!(num(&plan["memory"]["spine_buffers"]), (ahead + 2) * largest);
        }

        let ids = csv(&as_u32s(&golden(name)["prompts"][1]["ids"]));
        let cached = strata(&["logits", "--model", dir, "--ids", &ids]);
        for ahead_budget in [0u64, 1] {
            let tight = (base + (ahead_budget + 2) * largest).to_string();
            let streamed = strata(&[
                "logits", "--model", dir, "--ids", &ids, "--mem", &tight, "--spine", "stream",
            ]);
            assert_eq!(
                streamed, cached,
                "{name}: {ahead_budget} layer(s) ahead changed the logits"
            );
        }
        let budgeted = strata(&["logits", "--model", dir, "--ids", &ids, "--mem", &mem.to_string()]);
        assert_eq!(
            budgeted, cached,
            "{name}: streaming some layers changed the logits"
        );
    }
}
