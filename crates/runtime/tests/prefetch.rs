//! `--prefetch auto`: a prompt's guesses of the next MoE layer's experts (which name most of its
//! experts) are read early, a lone token's are not; `off` (the default) reads none, `on` both;
//! reading them changes no result; `off` makes no guess at all (no router product for it). Shapes come from the fixture's config.json.

use std::sync::atomic::Ordering;

use strata_experts::Prefetch;
use strata_runtime::{Engine, LoadOptions, ModelPlan};
use strata_testkit::fixture;

const MODEL: &str = "qwen3-moe-tiny";

/// An engine whose cache holds 3 experts (fewer than a layer's), with `prefetch`.
fn load(prefetch: Prefetch) -> Engine {
    let plan = ModelPlan::from_dir(&fixture(MODEL)).unwrap();
    let options = LoadOptions {
        expert_cache: Some(3 * plan.bytes_per_expert() as usize),
        prefetch,
        ..Default::default()
    };
    Engine::load(&fixture(MODEL), &options).unwrap_or_else(|e| panic!("{MODEL}: {e}"))
}

/// Routed experts asked for in a layer that had a guess read ahead, so far.
fn guessed(engine: &Engine) -> u64 {
    engine
        .experts
        .as_ref()
        .expect("a MoE model")
        .stats
        .predicted_asked
        .load(Ordering::Relaxed)
}

#[test]
fn auto_reads_a_prompts_guesses_ahead_and_not_a_lone_tokens() {
    let plan = ModelPlan::from_dir(&fixture(MODEL)).unwrap();
    let (experts, top_k) = (plan.layout.n_experts, plan.layout.top_k);
    assert!(
        2 * top_k < experts,
        "a lone token must guess fewer than half the experts"
    );
    let prompt: Vec<u32> = (1..=24).collect();

    let auto = load(Prefetch::Batches);
    let lone = auto.logits(&[7]).unwrap();
    assert_eq!(
        guessed(&auto),
        0,
        "a lone token's guesses ({top_k} of {experts}) are not read"
    );
    let batch = auto.logits(&prompt).unwrap();
    assert!(guessed(&auto) > 0, "a 24-token prompt's guesses are read ahead");

    let off = load(Prefetch::default());
    assert_eq!(off.logits(&[7]).unwrap().last_logits, lone.last_logits);
    assert_eq!(off.logits(&prompt).unwrap().all_logits, batch.all_logits);
    assert_eq!(guessed(&off), 0, "--prefetch off reads no guess");

    let on = load(Prefetch::On);
    let (off_bytes, on_bytes) = (bytes_of(|| off.logits(&[7])), bytes_of(|| on.logits(&[7])));
    assert!(guessed(&on) > 0, "--prefetch on reads a lone token's guesses too");
    // Off, no guess is made: the next layers' router products are skipped (this binary's one
    // test, so no other product runs meanwhile).
    assert!(
        off_bytes < on_bytes,
        "a lone token's products read {off_bytes} weight bytes with --prefetch off, {on_bytes} with on"
    );
}

/// Weight bytes the products of `f` read.
fn bytes_of<T>(f: impl FnOnce() -> T) -> u64 {
    let before = strata_kernels::weight_bytes_touched();
    f();
    strata_kernels::weight_bytes_touched() - before
}
