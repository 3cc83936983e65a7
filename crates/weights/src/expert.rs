//! Routed experts: where a family keeps them in the checkpoint, and one built from its bytes.

use strata_kernels::{Linear, Owner};

use crate::LinearSpec;

/// One routed expert: a SwiGLU MLP, `down(silu(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct Expert {
    /// (F, D)
    pub gate: Linear,
    /// (F, D)
    pub up: Linear,
    /// (D, F)
    pub down: Linear,
}

impl Expert {
    pub fn bytes(&self) -> usize {
        self.gate.bytes() + self.up.bytes() + self.down.bytes()
    }

    /// The expert whose gate, up and down projections are `specs`, from their tensors' bytes in
    /// spec order (spec 0's tensors, then spec 1's, then spec 2's): views into them where
    /// `owner` holds them and the format allows, copies otherwise.
    ///
    /// # Safety
    /// As [`LinearSpec::build_in`].
    pub unsafe fn build_in(
        specs: &[LinearSpec; 3],
        pieces: &[&[u8]],
        owner: Option<&Owner>,
    ) -> Result<Expert, String> {
        let wanted: usize = specs.iter().map(|s| s.tensors.len()).sum();
        if pieces.len() != wanted {
            return Err(format!("expert: expected {wanted} tensors, got {}", pieces.len()));
        }
        let mut next = 0;
        let mut build = |spec: &LinearSpec| {
            let refs = &pieces[next..next + spec.tensors.len()];
            next += spec.tensors.len();
            // SAFETY: the caller's contract.
            // On a device only as kept copies (see `strata_kernels::offload`).
            unsafe { spec.build_in(refs, owner) }.map(Linear::routed_expert)
        };
        Ok(Expert {
            gate: build(&specs[0])?,
            up: build(&specs[1])?,
            down: build(&specs[2])?,
        })
    }
}

/// Where a family's routed experts live in the checkpoint and what shape they have.
#[derive(Clone, Debug)]
pub struct ExpertLayout {
    /// Tensor-name template with `{layer}` and `{expert}`, ending before the projection name,
    /// e.g. `model.layers.{layer}.mlp.experts.{expert}.`
    pub prefix: String,
    /// Projection names for gate, up, down (e.g. `gate_proj`, `up_proj`, `down_proj`).
    pub projections: [String; 3],
    pub hidden_dim: usize,
    pub inter_dim: usize,
    pub n_experts: usize,
    /// Decoder layers that have routed experts.
    pub moe_layers: Vec<usize>,
    /// Experts each token activates.
    pub top_k: usize,
}

impl ExpertLayout {
    /// Base name of one projection's tensors (`...gate_proj`); format suffixes follow (`.weight`, ...).
    pub fn tensor_base(&self, layer: usize, expert: usize, projection: usize) -> String {
        let prefix = self
            .prefix
            .replace("{layer}", &layer.to_string())
            .replace("{expert}", &expert.to_string());
        format!("{prefix}{}", self.projections[projection])
    }

    /// (out, in) of gate, up, down.
    pub fn shapes(&self) -> [(usize, usize); 3] {
        [
            (self.inter_dim, self.hidden_dim),
            (self.inter_dim, self.hidden_dim),
            (self.hidden_dim, self.inter_dim),
        ]
    }
}
