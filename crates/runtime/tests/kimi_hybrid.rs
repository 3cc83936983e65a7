//! The KDA + MLA hybrids: Kimi Linear's recurrent state against transformers' own, chunked
//! prompts against token-by-token decoding, and Kimi K3 against the project's reference
//! (`k3ref-golden-v1`: logits, argmax, routing sets, per-layer outputs, greedy decoding with
//! state), with every expert cached and streamed through a cache smaller than one layer's.
//! (Kimi Linear's logits, routing, traces and generation are in `golden_models.rs`.)

use serde_json::Value;
use strata_models::{KvCache, SeqInput, Trace};
use strata_runtime::{Engine, GenEvent, LoadOptions, ModelPlan, Request, SamplingParams};
use strata_testkit::{as_f32s, as_u32s, as_usizes, fixture, golden, golden_tensor, read_json, ScratchCopy};

const KIMI_LINEAR: &str = "kimi-linear-tiny";
const KIMI_K3: &str = "kimi-k3-tiny";
/// The K3 golden records no tolerance; kimi-k3 README: last logits within 1e-3 x absmax for an
/// f32 engine, argmax exact except where the top-2 margin is below 2e-3 x absmax.
const K3_REL: f32 = 1e-3;

fn load(name: &str, expert_cache: Option<usize>) -> Engine {
    let options = LoadOptions {
        expert_cache,
        ..Default::default()
    };
    Engine::load(&fixture(name), &options).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Runs `chunks` of `ids` one after the other through one cache; logits of every position.
fn run_in_pieces(engine: &Engine, ids: &[u32], pieces: &[usize]) -> (Vec<f32>, KvCache) {
    let mut cache = engine.new_cache();
    let mut logits = Vec::new();
    let mut start = 0;
    for &end in pieces.iter().chain(std::iter::once(&ids.len())) {
        let mut batch = [SeqInput {
            tokens: &ids[start..end],
            cache: &mut cache,
            all_logits: true,
        }];
        logits.extend(engine.model.forward(&mut batch, None).unwrap().remove(0));
        start = end;
    }
    (logits, cache)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

fn absmax(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

fn top2_margin(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

#[test]
fn kimi_linear_recurrent_and_conv_state_match_transformers() {
    let engine = load(KIMI_LINEAR, None);
    let g = golden(KIMI_LINEAR);
    let ids = as_u32s(&g["prompts"][1]["ids"]);
    let (_, cache) = run_in_pieces(&engine, &ids, &[]);
    let path = fixture(KIMI_LINEAR).join("golden.safetensors");
    let config = read_json(&fixture(KIMI_LINEAR).join("config.json"));
    let k1 = config["linear_attn_config"]["short_conv_kernel_size"]
        .as_u64()
        .unwrap() as usize
        - 1;
    let mut checked = 0;
    for (l, layer) in cache.layers.iter().enumerate() {
        let Some(want) = golden_tensor(&path, &format!("prompt1.kda.layer{l}.recurrent_state")) else {
            assert!(layer.recurrent.is_empty(), "layer {l} has state the golden lacks");
            continue;
        };
        let worst = max_abs_diff(&layer.recurrent, &want);
        assert!(
            worst <= 1e-4 * absmax(&want),
            "layer {l}: recurrent state off by {worst}"
        );
        // The golden's conv state is (3C, K-1), channel-major; strata keeps (K-1, 3C).
        let conv = golden_tensor(&path, &format!("prompt1.kda.layer{l}.conv_state")).unwrap();
        let channels = conv.len() / k1;
        let transposed: Vec<f32> = (0..k1)
            .flat_map(|j| (0..channels).map(move |c| c * k1 + j))
            .map(|i| conv[i])
            .collect();
        let worst = max_abs_diff(&layer.conv, &transposed);
        assert!(
            worst <= 1e-4 * absmax(&conv),
            "layer {l}: conv state off by {worst}"
        );
        checked += 1;
    }
    assert!(checked > 0, "no KDA layer state in the golden");
}

#[test]
fn kimi_linear_split_prefill_and_token_by_token_match_one_prefill() {
    let engine = load(KIMI_LINEAR, None);
    let g = golden(KIMI_LINEAR);
    let split = &g["split_prefill"];
    let p = split["prompt_index"].as_u64().unwrap() as usize;
    let at = split["split_at"].as_u64().unwrap() as usize;
    let ids = as_u32s(&g["prompts"][p]["ids"]);
    let absmax = g["prompts"][p]["last_logits_absmax"].as_f64().unwrap() as f32;
    let (one, _) = run_in_pieces(&engine, &ids, &[]);
    let (two, _) = run_in_pieces(&engine, &ids, &[at]);
    // Every token on its own: the recurrence only, never the chunked form.
    let steps: Vec<usize> = (1..ids.len()).collect();
    let (each, _) = run_in_pieces(&engine, &ids, &steps);
    for (what, other) in [("split prefill", &two), ("token by token", &each)] {
        let worst = max_abs_diff(&one, other);
        eprintln!("{KIMI_LINEAR}: {what} vs one prefill, all positions: max |diff| {worst:.2e}");
        assert!(worst <= 1e-3 * absmax, "{what}: logits differ by {worst}");
    }
}

fn check_k3_prompts(engine: &Engine, g: &Value, label: &str) {
    for prompt in g["prompts"].as_array().unwrap() {
        let name = prompt["name"].as_str().unwrap();
        let ids = as_u32s(&prompt["ids"]);
        let mut trace = Trace::default();
        let out = engine.logits_traced(&ids, Some(&mut trace)).unwrap();
        let want = as_f32s(&prompt["last_logits"]);
        let limit = K3_REL * absmax(&want);
        let worst = max_abs_diff(&out.last_logits, &want);
        eprintln!("{label} {name}: last logits max |diff| {worst:.2e} (limit {limit:.2e})");
        assert!(
            worst <= limit,
            "{label} {name}: last logits off by {worst} > {limit}"
        );

        let vocab = engine.model.info().vocab_size;
        let golden_argmax = as_u32s(&prompt["argmax"]);
        for (i, (a, b)) in out.argmax.iter().zip(&golden_argmax).enumerate() {
            let row = &out.all_logits[i * vocab..(i + 1) * vocab];
            if top2_margin(row) >= 2.0 * K3_REL * absmax(row) {
                assert_eq!(a, b, "{label} {name}: argmax at position {i}");
            }
        }

        if let Some(outputs) = prompt.get("layer_outputs") {
            for (l, want) in outputs.as_array().unwrap().iter().enumerate() {
                let want: Vec<f32> = want.as_array().unwrap().iter().flat_map(as_f32s).collect();
                let got = trace.hidden(&format!("layer{l}")).unwrap();
                let worst = max_abs_diff(got, &want);
                assert!(
                    worst <= 1e-3 * absmax(&want),
                    "{label} {name}: layer {l} output off by {worst}"
                );
            }
        }
        if let Some(routing) = prompt.get("routing").and_then(Value::as_object) {
            assert_eq!(trace.routing.len(), routing.len(), "{label}: MoE layers");
            for rec in &trace.routing {
                let want = &routing[&rec.layer.to_string()];
                for (t, want_ids) in want["expert_ids"].as_array().unwrap().iter().enumerate() {
                    // The golden lists experts by biased score; strata sorts them by id.
                    let want_ids = as_usizes(want_ids);
                    let want_w = as_f32s(&want["weights"][t]);
                    let mut pairs: Vec<(usize, f32)> = want_ids.into_iter().zip(want_w).collect();
                    pairs.sort_by_key(|p| p.0);
                    let ids: Vec<usize> = pairs.iter().map(|p| p.0).collect();
                    assert_eq!(
                        rec.experts[t], ids,
                        "{label}: layer {} token {t} experts",
                        rec.layer
                    );
                    for (a, (_, b)) in rec.weights[t].iter().zip(&pairs) {
                        assert!(
                            (a - b).abs() <= 1e-4,
                            "{label}: layer {} token {t}: weight {a} vs {b}",
                            rec.layer
                        );
                    }
                }
            }
        }

        // Greedy decoding one token at a time with the KDA/MLA state, up to the first near-tie.
        let want = as_u32s(&prompt["greedy16"]);
        let request = Request {
            prompt: ids.clone(),
            max_new_tokens: want.len(),
            sampling: SamplingParams::default(),
            stop: vec![],
            ignore_eos: true,
        };
        let got = engine
            .generate(std::slice::from_ref(&request), |_, _: GenEvent| {})
            .unwrap()
            .remove(0);
        // Token i+1 follows from the logits of step i; stop at the first near-tie.
        let steps = prompt["greedy16_steps"].as_array().unwrap();
        let tie = 2.0 * K3_REL * absmax(&as_f32s(&prompt["last_logits"]));
        let mut checked = 0;
        for i in 0..want.len() {
            assert_eq!(got[i], want[i], "{label} {name}: greedy token {i}");
            checked += 1;
            let top = as_f32s(&steps[i]["top5_logits"]);
            if top[0] - top[1] < tie {
                break;
            }
        }
        assert!(checked > 0);
    }
}

#[test]
fn kimi_k3_matches_the_reference() {
    let g = golden(KIMI_K3);
    assert_eq!(g["format"], "k3ref-golden-v1");
    check_k3_prompts(&load(KIMI_K3, None), &g, "k3");
}

/// Prompts fed in chunks of 5 tokens (the server's prefill chunks) through the KDA and MLA
/// state give the reference's greedy tokens.
#[test]
fn kimi_k3_prompts_fed_in_chunks_match_the_reference() {
    let options = LoadOptions {
        prefill_chunk: Some(5),
        ..Default::default()
    };
    let engine = Engine::load(&fixture(KIMI_K3), &options).unwrap();
    check_k3_prompts(&engine, &golden(KIMI_K3), "k3 chunked");
}

#[test]
fn kimi_k3_streaming_through_a_cache_smaller_than_one_layer_changes_nothing() {
    let plan = ModelPlan::from_dir(&fixture(KIMI_K3)).unwrap();
    assert!(plan.layout.n_experts > 3);
    let engine = load(KIMI_K3, Some(3 * plan.bytes_per_expert() as usize));
    let g = golden(KIMI_K3);
    check_k3_prompts(&engine, &g, "k3 streaming");
    let ids = as_u32s(&g["prompts"][2]["ids"]);
    let cached = load(KIMI_K3, None).logits(&ids).unwrap();
    assert_eq!(engine.logits(&ids).unwrap().all_logits, cached.all_logits);
    let stats = &engine.experts.as_ref().unwrap().stats;
    assert!(stats.evictions.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

#[test]
fn kimi_k3_prompt_in_pieces_matches_one_prefill() {
    let engine = load(KIMI_K3, None);
    let g = golden(KIMI_K3);
    for prompt in g["prompts"].as_array().unwrap() {
        let ids = as_u32s(&prompt["ids"]);
        let (one, _) = run_in_pieces(&engine, &ids, &[]);
        let steps: Vec<usize> = (1..ids.len()).collect();
        let (each, _) = run_in_pieces(&engine, &ids, &steps);
        let worst = max_abs_diff(&one, &each);
        assert!(
            worst <= K3_REL * absmax(&one),
            "{}: token by token vs one prefill: {worst}",
            prompt["name"]
        );
    }
}

/// The spec's recorded switches are read from `k3ref`: the other A_log reading changes every
/// KDA layer (the golden separates the two readings by several logits), an unknown value is a
/// config error naming the key, and the clamp L2 form stays within the golden's tolerance.
#[test]
fn kimi_k3_switches_are_read_from_config() {
    let g = golden(KIMI_K3);
    let ids = as_u32s(&g["prompts"][0]["ids"]);
    let want = as_f32s(&g["prompts"][0]["last_logits"]);
    let with_switch = |key: &str, value: &str| {
        let copy = ScratchCopy::new(KIMI_K3, &format!("switch-{key}"));
        let path = copy.path("config.json");
        let mut cfg = read_json(&path);
        cfg["k3ref"][key] = Value::String(value.into());
        std::fs::write(&path, cfg.to_string()).unwrap();
        let out = Engine::load(&copy.0, &LoadOptions::default()).and_then(|e| e.logits(&ids));
        out.map(|o| max_abs_diff(&o.last_logits, &want))
    };
    let per_channel = with_switch("a_log_layout", "per_channel").unwrap();
    assert!(
        per_channel > 0.5,
        "per_channel A_log should change the logits, moved {per_channel}"
    );
    let clamp = with_switch("qk_l2norm", "clamp").unwrap();
    assert!(
        clamp <= K3_REL * absmax(&want),
        "clamp l2 norm moved the logits by {clamp}"
    );
    let err = with_switch("a_log_layout", "sideways").unwrap_err().to_string();
    assert!(err.contains("a_log_layout") && err.contains("sideways"), "{err}");
}
