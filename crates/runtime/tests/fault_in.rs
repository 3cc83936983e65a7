//! When the expert cache's memory is faulted in (`--fault-in`): with `at-load` every read buffer
//! decoding uses was faulted in before the first token (none made by a read), enough for every
//! expert the cache can hold; with `on-read` the reads make them.

use std::sync::atomic::Ordering::Relaxed;

use strata_experts::FaultIn;
use strata_runtime::{Engine, LoadOptions, ModelPlan};
use strata_testkit::{as_u32s, fixture, golden, BF16_MODELS};

#[test]
fn at_load_no_read_faults_in_a_buffer_and_on_read_every_one_does() {
    for name in BF16_MODELS {
        let plan = ModelPlan::from_dir(&fixture(name)).unwrap();
        let all_experts =
            plan.bytes_per_expert() * (plan.layout.n_experts * plan.layout.moe_layers.len()) as u64;
        let ids = as_u32s(&golden(name)["prompts"][0]["ids"]);
        for fault_in in [FaultIn::AtLoad, FaultIn::OnRead] {
            let options = LoadOptions {
                fault_in,
                ..Default::default()
            };
            let engine = Engine::load(&fixture(name), &options).unwrap_or_else(|e| panic!("{name}: {e}"));
            let store = engine.experts.as_ref().expect("a store of routed experts");
            engine.logits(&ids).unwrap();
            engine.logits(&ids[..ids.len() / 2 + 1]).unwrap();
            let read = store.stats.bytes_read.load(Relaxed);
            assert!(read > 0, "{name}: the prompt read experts");
            let (warmed, fresh) = (store.warmed_buffer_bytes(), store.fresh_buffer_bytes());
            eprintln!("{name} {fault_in:?}: read {read} B, warmed {warmed} B, fresh {fresh} B");
            match fault_in {
                FaultIn::AtLoad => {
                    assert!(
                        warmed >= all_experts,
                        "{name}: {warmed} B faulted in, {all_experts} B of experts"
                    );
                    assert_eq!(fresh, 0, "{name}: a read faulted in its own buffer");
                }
                FaultIn::OnRead => {
                    assert_eq!(warmed, 0, "{name}");
                    assert!(fresh >= read, "{name}: {fresh} B made by reads of {read} B");
                }
            }
        }
    }
}
