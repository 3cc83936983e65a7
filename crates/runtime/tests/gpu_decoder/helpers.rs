// Shared by the GPU decoder's tests (`include!`d after `const EXPERTS_ON_GPU: bool`): the GPU
// installed once per process, a step, and whether a cache has a GPU copy.

use std::sync::{Arc, OnceLock};

use strata_gpu::{select, Offload, Preference, Selection};
use strata_models::{KvCache, SeqInput};
use strata_runtime::Engine;

/// Installs the GPU for this process's products; false where the environment says there is
/// no adapter (`STRATA_NO_GPU=1`).
fn gpu() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| match select(Preference::Gpu) {
        Ok(Selection::Gpu(g)) => {
            eprintln!("GPU tests on {}", g.adapter());
            strata_kernels::offload::install(Arc::new(Offload::new(*g, None, EXPERTS_ON_GPU)))
        }
        Ok(Selection::Cpu { why }) => panic!("--device gpu chose the CPU: {why}"),
        Err(e) if std::env::var("STRATA_NO_GPU").is_ok_and(|v| v == "1") => {
            eprintln!("STRATA_NO_GPU=1: GPU tests not run ({e})");
            false
        }
        Err(e) => panic!("{e}"),
    })
}

/// The last logits of `ids` fed to `cache` in one step.
fn step(engine: &Engine, cache: &mut KvCache, ids: &[u32]) -> Vec<f32> {
    let mut batch = [SeqInput {
        tokens: ids,
        cache,
        all_logits: false,
    }];
    engine.model.forward(&mut batch, None).unwrap().remove(0)
}

fn on_gpu(cache: &KvCache) -> bool {
    format!("{:?}", cache.layers[0].gpu).contains("positions")
}
