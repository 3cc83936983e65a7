//! The reference checks of every BF16 fixture model through the engine: last-position logits,
//! argmax where the margin allows, routing of prompt 1, hidden-state traces, and greedy generation
//! with the KV cache. Shapes come from config.json, lengths from golden.json.

use serde_json::Value;
use strata_models::Trace;
use strata_runtime::{Engine, FinishReason, GenEvent, LoadOptions, ModelPlan, Request, SamplingParams};
use strata_testkit::{
    as_f32s, as_u32s, as_usizes, check_last_logits, checked_generation_len, fixture, golden, golden_tensor,
    moe_models, rel_tolerance, BF16_MODELS, QUANTIZED_MODELS,
};

fn load(name: &str) -> Engine {
    Engine::load(&fixture(name), &LoadOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// An engine whose expert cache holds 3 experts: less than one layer's, so nearly every routed
/// expert is read from disk and the cache evicts all the time; next-layer prefetch is on, so
/// guessed reads, cancellations and in-flight sharing are exercised too.
fn load_streaming(name: &str) -> Engine {
    let plan = ModelPlan::from_dir(&fixture(name)).unwrap();
    assert!(
        plan.layout.n_experts > 3,
        "{name}: the test needs more than 3 experts per layer"
    );
    let options = LoadOptions {
        expert_cache: Some(3 * plan.bytes_per_expert() as usize),
        prefetch: strata_experts::Prefetch::On,
        ..Default::default()
    };
    Engine::load(&fixture(name), &options).unwrap_or_else(|e| panic!("{name}: {e}"))
}

pub fn check_prompts(name: &str, engine: &Engine, g: &Value, rel: f32) {
    for (p, prompt) in g["prompts"].as_array().unwrap().iter().enumerate() {
        let ids = as_u32s(&prompt["ids"]);
        let out = engine.logits(&ids).unwrap();
        let absmax = prompt["last_logits_absmax"].as_f64().unwrap() as f32;
        let worst = check_last_logits(&out.last_logits, &as_f32s(&prompt["last_logits"]), absmax, rel)
            .unwrap_or_else(|e| panic!("{name} prompt {p}: last logits: {e}"));
        eprintln!(
            "{name} prompt {p}: max |diff| {worst:.2e} (limit {:.2e})",
            rel * absmax
        );
        let margins = as_f32s(&prompt["top2_margin"]);
        let golden_argmax = as_u32s(&prompt["argmax"]);
        assert_eq!(out.argmax.len(), golden_argmax.len());
        for (i, (a, b)) in out.argmax.iter().zip(&golden_argmax).enumerate() {
            if margins[i] >= 2.0 * rel * absmax {
                assert_eq!(
                    a, b,
                    "{name} prompt {p}: argmax at position {i} (margin {})",
                    margins[i]
                );
            }
        }
    }
}

pub fn check_routing(name: &str, engine: &Engine, g: &Value) {
    let routing = &g["routing"];
    let p = routing["prompt_index"].as_u64().unwrap() as usize;
    let ids = as_u32s(&g["prompts"][p]["ids"]);
    let mut trace = Trace::default();
    engine.logits_traced(&ids, Some(&mut trace)).unwrap();
    let layers = routing["layers"].as_array().unwrap();
    assert_eq!(trace.routing.len(), layers.len(), "{name}: number of MoE layers");
    for (rec, want) in trace.routing.iter().zip(layers) {
        let layer = want["layer"].as_u64().unwrap() as usize;
        assert_eq!(rec.layer, layer, "{name}: MoE layer order");
        for (t, want_experts) in want["experts"].as_array().unwrap().iter().enumerate() {
            let want_logits = as_f32s(&want["router_logits"][t]);
            for (a, b) in rec.router_logits[t].iter().zip(&want_logits) {
                assert!(
                    (a - b).abs() <= 1e-3,
                    "{name} layer {layer} token {t}: router logit {a} vs {b}"
                );
            }
            let margin = want["selection_margin"][t].as_f64().unwrap();
            if margin < 1e-4 {
                continue;
            }
            assert_eq!(
                rec.experts[t],
                as_usizes(want_experts),
                "{name} layer {layer} token {t}: experts"
            );
            for (a, b) in rec.weights[t].iter().zip(as_f32s(&want["weights"][t])) {
                assert!(
                    (a - b).abs() <= 1e-4,
                    "{name} layer {layer} token {t}: weight {a} vs {b}"
                );
            }
        }
    }
    // Hidden-state traces, when the fixture has them (max abs diff <= 1e-3 x max abs value).
    let path = fixture(name).join("golden.safetensors");
    if path.exists() && p == 1 {
        for (hname, values) in &trace.hidden {
            let Some(want) = golden_tensor(&path, &format!("prompt1.hidden.{hname}")) else {
                continue;
            };
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = values
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= 1e-3 * scale,
                "{name}: hidden {hname}: max |diff| {worst} > 1e-3 x {scale}"
            );
        }
    }
}

pub fn check_generation(name: &str, engine: &Engine, g: &Value, rel: f32) {
    for entry in g["generation"].as_array().unwrap() {
        let p = entry["prompt_index"].as_u64().unwrap() as usize;
        let absmax = g["prompts"][p]["last_logits_absmax"].as_f64().unwrap() as f32;
        let want = as_u32s(&entry["new_ids"]);
        let request = Request {
            prompt: as_u32s(&entry["prompt_ids"]),
            max_new_tokens: want.len(),
            sampling: SamplingParams::default(),
            stop: vec![],
            ignore_eos: true,
        };
        let mut finished = None;
        let got = engine
            .generate(std::slice::from_ref(&request), |_, e| {
                if let GenEvent::Done { reason } = e {
                    finished = Some(reason);
                }
            })
            .unwrap()
            .remove(0);
        assert_eq!(finished, Some(FinishReason::Length));
        let margins = as_f32s(&entry["step_top2_margin"]);
        let checked = checked_generation_len(&margins, rel, absmax);
        assert_eq!(
            &got[..checked],
            &want[..checked],
            "{name} generation from prompt {p} (checked {checked} steps)"
        );
    }
}

/// Every check of golden.json against one engine.
fn check_all(name: &str, engine: &Engine) {
    let g = golden(name);
    // f32 tolerance for the quantized folders too: their goldens come from exactly dequantized
    // weights and strata decodes exactly.
    let rel = rel_tolerance(&g);
    check_prompts(name, engine, &g, rel);
    check_routing(name, engine, &g);
    check_generation(name, engine, &g, rel);
}

#[test]
fn bf16_models_match_goldens() {
    for name in BF16_MODELS {
        check_all(name, &load(name));
    }
}

/// Prompts fed in chunks of 7 tokens (as the server feeds a long prompt between other
/// sequences' steps) generate the goldens too.
#[test]
fn prompts_fed_in_chunks_generate_the_goldens() {
    for name in BF16_MODELS.iter().chain(QUANTIZED_MODELS) {
        let options = LoadOptions {
            prefill_chunk: Some(7),
            ..Default::default()
        };
        let engine = Engine::load(&fixture(name), &options).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(engine.memory.prefill_chunk, 7);
        let g = golden(name);
        check_generation(name, &engine, &g, rel_tolerance(&g));
    }
}

#[test]
fn quantized_models_match_goldens() {
    for name in QUANTIZED_MODELS {
        check_all(name, &load(name));
    }
}

#[test]
fn streaming_every_expert_from_disk_changes_no_result() {
    for name in moe_models().chain(QUANTIZED_MODELS.iter().copied()) {
        let engine = load_streaming(name);
        check_all(name, &engine);
        let g = golden(name);
        // And bit-for-bit the same logits as with every expert cached.
        let ids = as_u32s(&g["prompts"][2]["ids"]);
        let cached = load(name).logits(&ids).unwrap();
        assert_eq!(
            engine.logits(&ids).unwrap().all_logits,
            cached.all_logits,
            "{name}: streaming changed logits"
        );
        let stats = &engine.experts.as_ref().unwrap().stats;
        let evictions = stats.evictions.load(std::sync::atomic::Ordering::Relaxed);
        let read = stats.bytes_read.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            evictions > 0 && read > 0,
            "{name}: expected reads and evictions, got {read} bytes, {evictions} evictions"
        );
        // Experts compute on the bytes read from disk: no copy (every fixture's tensors are
        // aligned and stored as their compute type; FP8 scales are f32).
        let copied = stats.copied_matrices.load(std::sync::atomic::Ordering::Relaxed);
        let zero = stats
            .zero_copy_matrices
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            zero > 0 && copied == 0,
            "{name}: {zero} matrices read zero-copy, {copied} copied"
        );
    }
}
