//! Every fixture through the binary on the GPU backend (`--device gpu`): logits and greedy
//! generation match the goldens with the fixtures' tolerances, and streamed non-expert weights
//! (copied to the GPU for each product) give the bits of resident ones (kept there). Needs a GPU
//! adapter: on a machine without a GPU, Mesa's software Vulkan driver (`apt-get install
//! mesa-vulkan-drivers libvulkan1`) is one; only where the environment says there is none
//! (`STRATA_NO_GPU=1`) do these tests pass without running.

use std::process::Command;

mod common;
use common::csv;

use serde_json::Value;
use strata_testkit::{as_u32s, fixture, golden, BF16_MODELS, QUANTIZED_MODELS};

/// `strata --device gpu ARGS`: its JSON output and what it said on stderr; None when there is no
/// adapter and `STRATA_NO_GPU=1` says so.
fn on_gpu(args: &[&str]) -> Option<(Value, String)> {
    on_gpu_with(&[], args)
}

/// [`on_gpu`] with `env` set.
fn on_gpu_with(env: &[(&str, &str)], args: &[&str]) -> Option<(Value, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .envs(env.iter().copied())
        .args(["--device", "gpu"])
        .args(args)
        .output()
        .expect("spawn strata");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        if stderr.contains("no GPU adapter") && std::env::var("STRATA_NO_GPU").is_ok_and(|v| v == "1") {
            eprintln!("STRATA_NO_GPU=1: GPU goldens not run");
            return None;
        }
        panic!("strata --device gpu {args:?} failed: {stderr}");
    }
    // Goldens met on the CPU after the GPU gave up would prove nothing of the GPU.
    for fallback in ["step failed on the GPU", "a product on the GPU failed"] {
        assert!(
            !stderr.contains(fallback),
            "strata --device gpu {args:?} fell back to the CPU: {stderr}"
        );
    }
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    // One JSON document (`logits`), or report lines and then one (`bench --json`).
    let doc = stdout.trim().lines().last().unwrap_or("");
    let json = serde_json::from_str(stdout.trim())
        .or_else(|_| serde_json::from_str(doc))
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"));
    Some((json, stderr))
}

#[test]
fn every_fixture_matches_its_goldens_on_the_gpu() {
    let Some((_, stderr)) = on_gpu(&["logits", "--ids", "1,2,3"]) else {
        return;
    };
    assert!(stderr.contains("device: GPU"), "not on the GPU: {stderr}");
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        common::check_goldens(name, &|args| on_gpu(args).expect("the GPU answered above").0);
    }
}

#[test]
fn streamed_weights_give_the_bits_of_resident_ones_on_the_gpu() {
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let ids = csv(&as_u32s(&golden(name)["prompts"][0]["ids"]));
        let Some((resident, _)) = on_gpu(&["logits", "--model", dir, "--ids", &ids]) else {
            return;
        };
        let (streamed, _) = on_gpu(&[
            "logits",
            "--model",
            dir,
            "--ids",
            &ids,
            "--expert-cache",
            "1K",
            "--spine",
            "stream",
        ])
        .expect("the GPU answered above");
        assert_eq!(
            streamed, resident,
            "{name}: streamed layers changed the logits on the GPU"
        );
    }
}

/// `strata --device gpu --gpu-experts EXTRA ARGS`: its JSON output.
fn with_gpu_experts(extra: &[&str], args: &[&str]) -> Value {
    let all: Vec<&str> = ["--gpu-experts"]
        .iter()
        .chain(extra)
        .chain(args)
        .copied()
        .collect();
    on_gpu(&all).expect("the GPU answered before").0
}

#[test]
fn routed_experts_on_the_gpu_match_the_goldens_also_when_few_fit() {
    if on_gpu(&["logits", "--ids", "1,2,3"]).is_none() {
        return;
    }
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        common::check_goldens(name, &|args| with_gpu_experts(&[], args));
        // 64 KiB of GPU memory: less than one layer's experts in every fixture, so some experts
        // are kept there and the rest computed on the CPU.
        common::check_goldens(name, &|args| with_gpu_experts(&["--gpu-mem", "64K"], args));
    }
    // Where a product runs never depends on what fits: the same bits with all kept or few.
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let ids = csv(&as_u32s(&golden(name)["prompts"][0]["ids"]));
        let logits =
            |budget| with_gpu_experts(&["--gpu-mem", budget], &["logits", "--model", dir, "--ids", &ids]);
        assert_eq!(
            logits("1G"),
            logits("64K"),
            "{name}: the GPU budget changed the logits"
        );
    }
    let dir = fixture("qwen3-moe-tiny");
    let dir = dir.to_str().unwrap();
    for budget in ["1G", "64K"] {
        let bench = with_gpu_experts(
            &["--gpu-mem", budget],
            &["bench", "-m", dir, "--prompt-len", "4", "--tokens", "3", "--json"],
        );
        let experts = bench["gpu"]["expert_products"].as_u64().unwrap_or(0);
        assert!(
            experts > 0,
            "--gpu-mem {budget}: no expert's product ran on the GPU: {bench}"
        );
        // Room for every expert: the timed tokens find some there; 64 KiB: some are copied.
        let (hits, copies) = (&bench["gpu"]["expert_hits"], &bench["gpu"]["expert_copies"]);
        let (hits, copies) = (hits.as_u64().unwrap(), copies.as_u64().unwrap());
        match budget {
            "1G" => assert!(hits > 0, "--gpu-mem 1G: no expert found on the GPU: {bench}"),
            _ => assert!(copies > 0, "--gpu-mem 64K: no expert copied: {bench}"),
        }
    }
}

/// A MoE layer whose every expert the GPU keeps lays out its products on the GPU, with no wait
/// (`crates/models/src/gpu_resident.rs`): the same bits as the form that waits for the routes
/// (`STRATA_GPU_RESIDENT=0`), for a prompt and for decoded tokens, in every fixture the GPU
/// decoder takes; and the bench says the layers ran that way.
#[test]
fn resident_layers_give_the_bits_of_the_layers_that_wait() {
    if on_gpu(&["logits", "--ids", "1,2,3"]).is_none() {
        return;
    }
    let off = [("STRATA_GPU_RESIDENT", "0")];
    let mut resident_somewhere = false;
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        let dir = fixture(name);
        let dir = dir.to_str().unwrap();
        let ids = csv(&as_u32s(&golden(name)["prompts"][0]["ids"]));
        let args = ["--gpu-experts", "logits", "--model", dir, "--ids", &ids];
        let on = on_gpu(&args).expect("the GPU answered above").0;
        let waiting = on_gpu_with(&off, &args).expect("the GPU answered above").0;
        assert_eq!(on, waiting, "{name}: resident layers changed the logits");
        let entry = &golden(name)["generation"][0];
        let greedy = common::greedy_args(dir, entry);
        let run_args: Vec<&str> = std::iter::once("--gpu-experts")
            .chain(greedy.iter().map(|s| s.as_str()))
            .collect();
        let on = on_gpu(&run_args).expect("the GPU answered above").0;
        let waiting = on_gpu_with(&off, &run_args).expect("the GPU answered above").0;
        assert!(on["token_ids"].is_array(), "{name}: {on}");
        assert_eq!(on, waiting, "{name}: resident layers changed the greedy run");
        let bench = [
            "--gpu-experts",
            "bench",
            "-m",
            dir,
            "--prompt-len",
            "4",
            "--tokens",
            "3",
            "--json",
        ];
        let layers = |env: &[(&str, &str)]| {
            let b = on_gpu_with(env, &bench).expect("the GPU answered above").0;
            b["gpu"]["resident_layers"].as_u64().unwrap_or(0)
        };
        assert_eq!(
            layers(&off),
            0,
            "{name}: STRATA_GPU_RESIDENT=0 made layers resident"
        );
        resident_somewhere |= layers(&[]) > 0;
    }
    assert!(resident_somewhere, "no fixture ran a resident layer");
}
