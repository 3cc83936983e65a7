// The checks of `gpu_decoder.rs` and `gpu_decoder_cpu_experts.rs` (each installs the GPU
// once per process, with or without the routed experts).

use strata_runtime::LoadOptions;
use strata_testkit::{as_u32s, fixture, golden};

include!("helpers.rs");

#[test]
fn pieces_batches_and_cut_or_cloned_caches_give_the_bits_of_a_fresh_pass() {
    if !gpu() {
        return;
    }
    for name in ["qwen3-moe-tiny", "mixtral-tiny", "deepseek-v3-tiny", "kimi-k2-tiny-int4"] {
        let engine = Engine::load(&fixture(name), &LoadOptions::default()).unwrap();
        let g = golden(name);
        let ids = as_u32s(&g["prompts"][0]["ids"]);
        let other = as_u32s(&g["prompts"][1]["ids"]);
        assert!(ids.len() >= 3, "{name}: prompt 0 too short for the test");
        let n = ids.len();

        let mut whole = engine.new_cache();
        let all = step(&engine, &mut whole, &ids);
        assert!(on_gpu(&whole), "{name}: the GPU decoder did not run");
        assert_eq!(
            whole.layers[0].k.len(),
            n * whole.layers[0].k_dim,
            "{name}: CPU rows kept"
        );

        // The same prompt in pieces, then one token more on each.
        let mut pieces = engine.new_cache();
        step(&engine, &mut pieces, &ids[..1]);
        step(&engine, &mut pieces, &ids[1..n - 1]);
        assert_eq!(
            step(&engine, &mut pieces, &ids[n - 1..]),
            all,
            "{name}: prompt in pieces"
        );
        assert_eq!(pieces.layers[0].k, whole.layers[0].k, "{name}: cached keys");

        // A cut cache continued with another token gives the bits of a fresh pass of the same ids.
        let extra = other[0];
        let mut cut = pieces.clone();
        step(&engine, &mut cut, &[ids[0]]);
        assert!(cut.truncate(n - 1));
        let continued = step(&engine, &mut cut, &[extra]);
        let mut fresh = engine.new_cache();
        let fresh_ids: Vec<u32> = ids[..n - 1].iter().copied().chain([extra]).collect();
        assert_eq!(
            continued,
            step(&engine, &mut fresh, &fresh_ids),
            "{name}: cut cache"
        );

        // A clone shares its GPU copy until one of them moves on; each goes its own way.
        let mut a = whole.clone();
        let mut b = whole.clone();
        let la = step(&engine, &mut a, &[extra]);
        let lb = step(&engine, &mut b, &[extra]);
        assert_eq!(la, lb, "{name}: cloned caches");
        let lw = step(&engine, &mut whole, &[extra]);
        assert_eq!(la, lw, "{name}: the original after its clones");

        // Two sequences in one step: each its bits alone.
        let mut c1 = engine.new_cache();
        let mut c2 = engine.new_cache();
        let mut batch = [
            SeqInput {
                tokens: &other,
                cache: &mut c1,
                all_logits: true,
            },
            SeqInput {
                tokens: &ids,
                cache: &mut c2,
                all_logits: false,
            },
        ];
        let both = engine.model.forward(&mut batch, None).unwrap();
        assert_eq!(both[1], all, "{name}: a sequence batched with another");
        let mut alone = engine.new_cache();
        let mut one = [SeqInput {
            tokens: &other,
            cache: &mut alone,
            all_logits: true,
        }];
        assert_eq!(
            both[0],
            engine.model.forward(&mut one, None).unwrap().remove(0),
            "{name}: all logits"
        );
    }
}
