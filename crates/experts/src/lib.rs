//! Where expert bytes live and how they move. The models ask an [`ExpertStore`] for the experts
//! their routers picked; this crate implements the stores. Today: [`ResidentStore`], every routed
//! expert decoded into RAM at load time. The disk and network tiers replace its inside, not the
//! models.

use std::collections::HashMap;
use std::sync::Arc;

use strata_formats::Checkpoint;
use strata_models::{load_linear, Expert, ExpertLayout, ExpertStore};

/// Reads one expert's three projections from the checkpoint.
pub fn load_expert(
    ckpt: &Checkpoint,
    layout: &ExpertLayout,
    layer: usize,
    expert: usize,
) -> strata_models::Result<Expert> {
    let [g, u, d] = layout.shapes();
    Ok(Expert {
        gate: load_linear(ckpt, &layout.tensor_base(layer, expert, 0), g.0, g.1)?,
        up: load_linear(ckpt, &layout.tensor_base(layer, expert, 1), u.0, u.1)?,
        down: load_linear(ckpt, &layout.tensor_base(layer, expert, 2), d.0, d.1)?,
    })
}

/// Every routed expert held in memory.
pub struct ResidentStore {
    experts: HashMap<(usize, usize), Arc<Expert>>,
    bytes: usize,
}

impl ResidentStore {
    pub fn load(ckpt: &Checkpoint, layout: &ExpertLayout) -> strata_models::Result<ResidentStore> {
        let mut experts = HashMap::new();
        let mut bytes = 0;
        for &layer in &layout.moe_layers {
            for e in 0..layout.n_experts {
                let expert = load_expert(ckpt, layout, layer, e)?;
                bytes += expert.bytes();
                experts.insert((layer, e), Arc::new(expert));
            }
        }
        Ok(ResidentStore { experts, bytes })
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl ExpertStore for ResidentStore {
    fn get(
        &self,
        layer: usize,
        ids: &[usize],
    ) -> Result<Vec<Arc<Expert>>, Box<dyn std::error::Error + Send + Sync>> {
        ids.iter()
            .map(|&e| {
                self.experts
                    .get(&(layer, e))
                    .cloned()
                    .ok_or_else(|| format!("expert {e} of layer {layer} is not in the checkpoint").into())
            })
            .collect()
    }
}
