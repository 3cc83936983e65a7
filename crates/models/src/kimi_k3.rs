//! Kimi K3 (`model_type: kimi_k3`): the Kimi Linear hybrid (KDA + NoPE MLA, see
//! `kimi_linear.rs`, which reads every switch from config) with Block AttnRes in place of the
//! residual stream, a gated MLA, a bounded KDA forget gate with a full-rank output gate, SiTU-GLU
//! and LatentMoE with MXFP4 routed experts. The language model's config nests under
//! `text_config` and its tensors under `language_model.` (`../shared/specs/kimi-k3.md`).
//!
//! The spec's recorded choices (`k3ref` at the root: `a_log_layout`, `mla_latent_norm_eps`, ...)
//! are read when present; their defaults are the spec's.

use strata_formats::{Checkpoint, JsonConfig};

use crate::kimi_linear::{k3_model_info, load_hybrid, Config, Names};
use crate::registry::{ConfigSummary, TensorDesc};
use crate::spine::Loading;
use crate::{ExpertLayout, Model, Result};

const K3_NAMES: Names = Names {
    model: "language_model.model.",
    head: "language_model.lm_head",
};

fn read(root: &JsonConfig) -> Result<Config> {
    let text = root.text_config()?;
    let switches = root.opt_object("k3ref")?;
    Config::read(&text, switches.as_ref(), true)
}

pub fn expert_layout(root: &JsonConfig) -> Result<ExpertLayout> {
    Ok(read(root)?.expert_layout(&K3_NAMES))
}

pub fn summary(root: &JsonConfig) -> Result<ConfigSummary> {
    Ok(read(root)?.summary())
}

/// K3's tensors from its config alone (routed experts MXFP4 when `quantization_config` says so).
pub fn inventory(root: &JsonConfig) -> Result<Vec<TensorDesc>> {
    let text = root.text_config()?;
    let mxfp4 = text
        .opt_object("quantization_config")?
        .map(|q| {
            q.opt_str("format")
                .map(|f| f.is_some_and(|f| f.contains("mxfp4")))
        })
        .transpose()?
        .unwrap_or(false);
    Ok(read(root)?.inventory(&K3_NAMES, mxfp4))
}

pub fn load(root: &JsonConfig, ckpt: &Checkpoint, loading: &Loading) -> Result<Box<dyn Model>> {
    let c = read(root)?;
    let info = k3_model_info(root, &c)?;
    load_hybrid(c, &K3_NAMES, info, ckpt, loading)
}
