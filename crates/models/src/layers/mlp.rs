//! The gated MLP: down(act(gate(x), up(x))), act SwiGLU or SiTU-GLU. Dense layers, shared experts
//! and routed experts.

use strata_kernels::Linear;

use super::math::{glu, Activation};
use crate::Expert;

pub struct Mlp {
    /// (F, D)
    pub gate: Linear,
    /// (F, D)
    pub up: Linear,
    /// (D, F)
    pub down: Linear,
    pub act: Activation,
}

/// X (T, D) -> (T, D) through one gated MLP.
pub fn glu_mlp(
    gate: &Linear,
    up: &Linear,
    down: &Linear,
    act: Activation,
    x: &[f32],
    n_tokens: usize,
) -> Vec<f32> {
    let f = gate.out_dim;
    let mut g = vec![0f32; n_tokens * f]; // (T, F)
    let mut u = vec![0f32; n_tokens * f]; // (T, F)
    gate.matmul(x, n_tokens, &mut g);
    up.matmul(x, n_tokens, &mut u);
    glu(&mut g, &u, act);
    let mut y = vec![0f32; n_tokens * down.out_dim]; // (T, D)
    down.matmul(&g, n_tokens, &mut y);
    y
}

impl Mlp {
    pub fn forward(&self, x: &[f32], n_tokens: usize) -> Vec<f32> {
        glu_mlp(&self.gate, &self.up, &self.down, self.act, x, n_tokens)
    }
}

/// X (T, D) -> (T, D) through a routed expert; the activation is the model's (the store hands
/// over weights only).
pub fn expert_forward(expert: &Expert, x: &[f32], n_tokens: usize, act: Activation) -> Vec<f32> {
    glu_mlp(&expert.gate, &expert.up, &expert.down, act, x, n_tokens)
}
