//! When the expert cache's memory is faulted in (`--fault-in`): with `preload` the experts the
//! cache holds are read into it while the model loads (every MoE layer its share), so the first
//! prompt reads nothing when they all fit; with `at-load` every read buffer decoding uses was
//! faulted in before the first token (none made by a read), enough for every expert the cache
//! can hold; with `on-read` the reads make them.

use std::sync::atomic::Ordering::Relaxed;

use strata_experts::FaultIn;
use strata_runtime::{Engine, LoadOptions, ModelPlan};
use strata_testkit::{as_u32s, fixture, golden, moe_models};

#[test]
fn at_load_no_read_faults_in_a_buffer_and_on_read_every_one_does() {
    for name in moe_models() {
        let plan = ModelPlan::from_dir(&fixture(name)).unwrap();
        let all_experts =
            plan.bytes_per_expert() * (plan.layout.n_experts * plan.layout.moe_layers.len()) as u64;
        let ids = as_u32s(&golden(name)["prompts"][0]["ids"]);
        for fault_in in [FaultIn::Preload, FaultIn::AtLoad, FaultIn::OnRead] {
            let options = LoadOptions {
                fault_in,
                ..Default::default()
            };
            let engine = Engine::load(&fixture(name), &options).unwrap_or_else(|e| panic!("{name}: {e}"));
            let store = engine.experts.as_ref().expect("a store of routed experts");
            let (read_at_load, fresh_at_load) =
                (store.stats.bytes_read.load(Relaxed), store.fresh_buffer_bytes());
            engine.logits(&ids).unwrap();
            engine.logits(&ids[..ids.len() / 2 + 1]).unwrap();
            let read = store.stats.bytes_read.load(Relaxed) - read_at_load;
            let (warmed, fresh) = (
                store.warmed_buffer_bytes(),
                store.fresh_buffer_bytes() - fresh_at_load,
            );
            let preloaded = engine.warmed.preloaded_bytes;
            eprintln!("{name} {fault_in:?}: preloaded {preloaded} B, read {read} B, warmed {warmed} B, fresh {fresh} B");
            match fault_in {
                FaultIn::Preload => {
                    // The default cache holds every expert of a fixture: all read at load.
                    assert_eq!(preloaded, all_experts, "{name}: preloaded");
                    // Runs may span small gaps between an expert's tensors.
                    assert!(
                        read_at_load >= all_experts,
                        "{name}: {read_at_load} B read at load"
                    );
                    assert_eq!(read, 0, "{name}: the prompts found every expert cached");
                    assert_eq!(fresh, 0, "{name}");
                }
                FaultIn::AtLoad => {
                    assert!(read > 0, "{name}: the prompt read experts");
                    assert!(
                        warmed >= all_experts,
                        "{name}: {warmed} B faulted in, {all_experts} B of experts"
                    );
                    assert_eq!(fresh, 0, "{name}: a read faulted in its own buffer");
                    assert_eq!(preloaded, 0, "{name}");
                }
                FaultIn::OnRead => {
                    assert!(read > 0, "{name}: the prompt read experts");
                    assert_eq!(warmed, 0, "{name}");
                    assert!(fresh >= read, "{name}: {fresh} B made by reads of {read} B");
                    assert_eq!(preloaded, 0, "{name}");
                }
            }
        }
    }
}

/// A cache that holds part of the experts is preloaded up to its budget, every MoE layer
/// within one expert of the others, and gives the same logits as one that preloaded nothing.
#[test]
fn a_partial_preload_shares_the_budget_and_changes_no_logit() {
    for name in moe_models() {
        let plan = ModelPlan::from_dir(&fixture(name)).unwrap();
        let (per_expert, layers) = (plan.bytes_per_expert(), plan.layout.moe_layers.len());
        // Room for a third of the experts (at least one per layer).
        let held = (plan.layout.n_experts * layers / 3).max(layers);
        let options = |fault_in| LoadOptions {
            fault_in,
            expert_cache: Some(held * per_expert as usize),
            ..Default::default()
        };
        let engine = Engine::load(&fixture(name), &options(FaultIn::Preload)).unwrap();
        let store = engine.experts.as_ref().unwrap();
        assert_eq!(engine.warmed.preloaded_experts, held, "{name}");
        assert!(store.cached_bytes() <= store.budget(), "{name}");
        let ids = as_u32s(&golden(name)["prompts"][1]["ids"]);
        let cold = Engine::load(&fixture(name), &options(FaultIn::OnRead)).unwrap();
        assert_eq!(
            engine.logits(&ids).unwrap().all_logits,
            cold.logits(&ids).unwrap().all_logits,
            "{name}: preloading changed logits"
        );
        assert_eq!(cold.warmed.preloaded_experts, 0, "{name}");
    }
}
