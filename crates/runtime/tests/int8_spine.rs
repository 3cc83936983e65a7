//! `--spine-format int8` (resident linear layers as INT8, one scale per row) against every
//! fixture's goldens. Each fixture's deviation is documented in docs/INT8.md: on these
//! random-weight models a quantization error flips a near-tied expert choice somewhere and
//! moves many logits at once, so the bound is per fixture. Within it: the last logits of every
//! prompt, the argmax wherever the goldens' top-2 margin exceeds twice the bound, and greedy
//! generation up to the first step whose margin is below that (the first near-tie under INT8).
//! The sidecar is written by the first load and read by the next (counted).

use serde_json::Value;
use strata_runtime::{Engine, GenEvent, LoadOptions, Request, SamplingParams, SpineFormat};
use strata_testkit::{as_f32s, as_u32s, fixture, golden, golden_tensor};

/// Steps before the first whose top-2 margin is below twice the bound (that step's token may
/// flip under INT8).
fn steps_before_a_near_tie(margins: &[f32], bound: f32, scale: f32) -> usize {
    margins
        .iter()
        .position(|&m| m < 2.0 * bound * scale)
        .unwrap_or(margins.len())
}

/// (fixture, documented max |diff| of the logits, at every position the fixture records,
/// relative to their absmax: the measured deviation (docs/INT8.md) with a quarter more).
const BOUNDS: &[(&str, f32)] = &[
    ("deepseek-v3-tiny", 0.9),
    ("deepseek-v3-tiny-fp8", 0.7),
    ("kimi-k2-tiny", 0.22),
    ("kimi-k2-tiny-int4", 0.2),
    ("qwen3-moe-tiny", 0.125),
    ("mixtral-tiny", 0.25),
    ("kimi-linear-tiny", 0.86),
    ("kimi-k3-tiny", 1.33),
];

fn load(name: &str, cache: Option<&std::path::Path>) -> Engine {
    let options = LoadOptions {
        spine_format: SpineFormat::Int8,
        cache_dir: cache.map(|c| c.to_path_buf()),
        ..Default::default()
    };
    Engine::load(&fixture(name), &options).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn greedy(engine: &Engine, prompt: Vec<u32>, n: usize) -> Vec<u32> {
    let r = Request {
        prompt,
        max_new_tokens: n,
        sampling: SamplingParams::default(),
        stop: vec![],
        ignore_eos: true,
    };
    engine
        .generate(std::slice::from_ref(&r), |_, _: GenEvent| {})
        .unwrap()
        .remove(0)
}

fn absmax(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// A fixture's figures.
struct Measured {
    worst: f32,
    /// Argmax agreeing / checked where the margin allows, and over every position.
    argmax: (usize, usize),
    argmax_all: (usize, usize),
    /// Per generation: (steps equal before the first near-tie, those steps), (steps equal from
    /// the start, all steps).
    gens: Vec<((usize, usize), (usize, usize))>,
}

fn measure(name: &str, bound: f32) -> Measured {
    let engine = load(name, None);
    let g = golden(name);
    let k3 = g["format"] == "k3ref-golden-v1";
    let (mut worst, mut agree, mut checked, mut agree_all, mut all) = (0f32, 0, 0, 0, 0);
    let mut gens = Vec::new();
    for (i, p) in g["prompts"].as_array().unwrap().iter().enumerate() {
        let ids = as_u32s(&p["ids"]);
        let out = engine.logits(&ids).unwrap();
        let want = as_f32s(&p["last_logits"]);
        let scale = p["last_logits_absmax"]
            .as_f64()
            .map_or_else(|| absmax(&want), |a| a as f32);
        let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        worst = worst.max(diff(&out.last_logits, &want) / scale);
        // Every position, where the fixture keeps them (`golden.safetensors`).
        let trace = fixture(name).join("golden.safetensors");
        let every = trace
            .exists()
            .then(|| golden_tensor(&trace, &format!("prompt{i}.logits")))
            .flatten();
        if let Some(every) = every {
            worst = worst.max(diff(&out.all_logits, &every) / absmax(&every).max(scale));
        }
        if !k3 {
            let margins = as_f32s(&p["top2_margin"]);
            for ((a, b), m) in out.argmax.iter().zip(as_u32s(&p["argmax"])).zip(margins) {
                all += 1;
                agree_all += usize::from(*a == b);
                if m >= 2.0 * bound * scale {
                    checked += 1;
                    agree += usize::from(*a == b);
                }
            }
        } else {
            // K3's greedy16: the steps' top-5 logits give the margins.
            let want = as_u32s(&p["greedy16"]);
            let margins: Vec<f32> = p["greedy16_steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    let t = as_f32s(&s["top5_logits"]);
                    t[0] - t[1]
                })
                .collect();
            let n = steps_before_a_near_tie(&margins, bound, scale);
            let golden_argmax = as_u32s(&p["argmax"]);
            all += golden_argmax.len();
            agree_all += out
                .argmax
                .iter()
                .zip(&golden_argmax)
                .filter(|(a, b)| a == b)
                .count();
            let got = greedy(&engine, ids, want.len());
            let equal = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            gens.push(((equal.min(n), n), (equal, want.len())));
        }
    }
    if !k3 {
        for e in g["generation"].as_array().unwrap() {
            let p = e["prompt_index"].as_u64().unwrap() as usize;
            let scale = g["prompts"][p]["last_logits_absmax"].as_f64().unwrap() as f32;
            let want = as_u32s(&e["new_ids"]);
            let n = steps_before_a_near_tie(&as_f32s(&e["step_top2_margin"]), bound, scale);
            let got = greedy(&engine, as_u32s(&e["prompt_ids"]), want.len());
            let equal = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            gens.push(((equal.min(n), n), (equal, want.len())));
        }
    }
    Measured {
        worst,
        argmax: (agree, checked),
        argmax_all: (agree_all, all),
        gens,
    }
}

#[test]
fn every_fixture_is_within_its_documented_int8_deviation() {
    eprintln!(
        "fixture | max |diff| / absmax | argmax where margin > 2 x bound | argmax, every position | greedy equal before the first near-tie | greedy equal from the start"
    );
    let mut failures = Vec::new();
    for &(name, bound) in BOUNDS {
        let m = measure(name, bound);
        let tie: Vec<String> = m.gens.iter().map(|((e, n), _)| format!("{e}/{n}")).collect();
        let start: Vec<String> = m.gens.iter().map(|(_, (e, n))| format!("{e}/{n}")).collect();
        eprintln!(
            "{name} | {:.4} (bound {bound}) | {}/{} | {}/{} | {} | {}",
            m.worst,
            m.argmax.0,
            m.argmax.1,
            m.argmax_all.0,
            m.argmax_all.1,
            tie.join(" "),
            start.join(" ")
        );
        if m.worst > bound {
            failures.push(format!("{name}: deviation {} over {bound}", m.worst));
        }
        if m.argmax.0 != m.argmax.1 {
            failures.push(format!(
                "{name}: argmax {}/{} where the margin allows",
                m.argmax.0, m.argmax.1
            ));
        }
        if let Some(((e, n), _)) = m.gens.iter().find(|((e, n), _)| e < n) {
            failures.push(format!(
                "{name}: greedy {e} of {n} steps before the first near-tie"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn the_sidecar_is_written_once_and_read_on_the_next_start() {
    use std::sync::atomic::Ordering::Relaxed;
    let cache = std::env::temp_dir().join(format!("strata-int8-sidecar-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let name = "deepseek-v3-tiny";
    let ids = as_u32s(&golden(name)["prompts"][1]["ids"]);
    let first = load(name, Some(&cache));
    let s1 = &first.int8.as_ref().unwrap().stats;
    let converted = s1.converted_layers.load(Relaxed);
    assert!(converted > 0);
    assert_eq!(s1.read_layers.load(Relaxed), 0);
    let second = load(name, Some(&cache));
    let s2 = &second.int8.as_ref().unwrap().stats;
    assert_eq!(
        s2.converted_layers.load(Relaxed),
        0,
        "the second start converted again"
    );
    assert_eq!(s2.read_layers.load(Relaxed), converted);
    assert_eq!(s2.read_bytes.load(Relaxed), s1.converted_bytes.load(Relaxed));
    assert_eq!(
        first.logits(&ids).unwrap().all_logits,
        second.logits(&ids).unwrap().all_logits,
        "the sidecar's weights differ from the conversion's"
    );
    // A torn index (a crash while writing it) is ignored: the next start converts again.
    let dir = second.int8.as_ref().unwrap().dir().unwrap().to_path_buf();
    std::fs::write(dir.join("index.json"), "{\"version\": \"strata-int8").unwrap();
    let third = load(name, Some(&cache));
    assert_eq!(
        third.int8.as_ref().unwrap().stats.converted_layers.load(Relaxed),
        converted
    );
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn the_int8_plan_holds_linear_layers_at_a_byte_per_weight() {
    let plan = strata_runtime::ModelPlan::from_dir(&fixture("qwen3-moe-tiny")).unwrap();
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("qwen3-moe-tiny").join("config.json")).unwrap(),
    )
    .unwrap();
    let n = |k: &str| cfg[k].as_u64().unwrap();
    let (d, v, l) = (n("hidden_size"), n("vocab_size"), n("num_hidden_layers"));
    let (h, kv, hd, e) = (
        n("num_attention_heads"),
        n("num_key_value_heads"),
        n("head_dim"),
        n("num_experts"),
    );
    // Per layer: q, k, v, o projections as INT8 (+ a scale per row); the router, norms as stored.
    let proj = |rows: u64, cols: u64| rows * cols + 4 * rows;
    let attn = proj(h * hd, d) + 2 * proj(kv * hd, d) + proj(d, h * hd);
    let per_layer = attn + e * d * 2 + 2 * d * 2 + 2 * hd * 2;
    assert_eq!(plan.layer_bytes_int8[0], per_layer);
    let ends = 2 * proj(v, d) + d * 2;
    assert_eq!(plan.non_expert_bytes_int8, l * per_layer + ends);
}
