//! A GPU that fails in the middle of a step (lost, out of memory): the GPU decoder's step runs
//! again on the CPU, the cache keeps exactly the CPU's rows, and the model stays on the CPU, its
//! logits those of the goldens. Needs a GPU adapter, as `crates/gpu/tests` say; the failure is
//! injected (`Gpu::fail_from_wait`).

use strata_runtime::LoadOptions;
use strata_testkit::{as_f32s, as_u32s, fixture, golden, rel_tolerance};

const EXPERTS_ON_GPU: bool = true;
include!("gpu_decoder/helpers.rs");

#[test]
fn a_gpu_lost_mid_step_leaves_the_run_on_the_cpu_with_the_goldens() {
    if !gpu() {
        return;
    }
    let off = Offload::installed().expect("installed above");
    // MoE layers whose experts all stay on the GPU make a step wait once, at its end (the
    // third case); in the first two the layers wait for their routes, so the failure comes in
    // the middle of a step.
    for (name, resident, fail_at) in [
        ("qwen3-moe-tiny", false, 1),
        ("deepseek-v3-tiny", false, 1),
        ("qwen3-moe-tiny", true, 0),
    ] {
        off.set_resident_layers(resident);
        off.gpu().fail_from_wait(u64::MAX);
        let engine = Engine::load(&fixture(name), &LoadOptions::default()).unwrap();
        let g = golden(name);
        let ids = as_u32s(&g["prompts"][0]["ids"]);
        let n = ids.len();
        assert!(n >= 2, "{name}: prompt 0 too short for the test");
        let mut cache = engine.new_cache();
        let made = off.resident_layers();
        step(&engine, &mut cache, &ids[..1]);
        assert!(on_gpu(&cache), "{name}: the GPU decoder did not run");
        assert_eq!(
            off.resident_layers() > made,
            resident,
            "{name}: resident layers {resident} asked, not what ran"
        );
        // The second wait of the next step fails (the first layer's rows came back by then),
        // or with resident layers its one wait.
        off.gpu().fail_from_wait(fail_at);
        let last = step(&engine, &mut cache, &ids[1..]);
        assert!(!on_gpu(&cache), "{name}: a GPU copy left after the failure");
        assert_eq!(cache.len, n, "{name}: positions");
        for (l, c) in cache.layers.iter().enumerate() {
            assert_eq!(c.k.len(), n * c.k_dim, "{name}: layer {l}'s keys");
            assert_eq!(c.v.len(), n * c.v_dim, "{name}: layer {l}'s values");
        }
        let near_goldens = |got: &[f32], what: &str| {
            let want = as_f32s(&g["prompts"][0]["last_logits"]);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= rel_tolerance(&g) * scale,
                "{name}, {what}: logits {worst} from the goldens (scale {scale})"
            );
        };
        near_goldens(&last, "after the failure");
        // Healed or not, this model stays on the CPU, and goes on.
        off.gpu().fail_from_wait(u64::MAX);
        step(&engine, &mut cache, &ids[..1]);
        assert!(!on_gpu(&cache), "{name}: back on the GPU after a failure");
        assert_eq!(cache.len, n + 1, "{name}: positions after one more token");
        // A model loaded after it runs on the GPU again, through the buffers the failure left
        // (the same steps, so the same sizes from the pool).
        let fresh = Engine::load(&fixture(name), &LoadOptions::default()).unwrap();
        let mut cache = fresh.new_cache();
        step(&fresh, &mut cache, &ids[..1]);
        let last = step(&fresh, &mut cache, &ids[1..]);
        assert!(on_gpu(&cache), "{name}: the GPU did not run after healing");
        near_goldens(&last, "on the GPU after healing");
    }
}
