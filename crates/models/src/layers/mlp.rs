//! The SwiGLU MLP: down(silu(gate(x)) * up(x)). Dense layers, shared experts and routed experts.

use strata_kernels::Linear;

use super::math::swiglu;
use crate::Expert;

pub struct Mlp {
    /// (F, D)
    pub gate: Linear,
    /// (F, D)
    pub up: Linear,
    /// (D, F)
    pub down: Linear,
}

/// X (T, D) -> (T, D) through one SwiGLU MLP.
pub fn swiglu_mlp(gate: &Linear, up: &Linear, down: &Linear, x: &[f32], n_tokens: usize) -> Vec<f32> {
    let f = gate.out_dim;
    let mut g = vec![0f32; n_tokens * f]; // (T, F)
    let mut u = vec![0f32; n_tokens * f]; // (T, F)
    gate.matmul(x, n_tokens, &mut g);
    up.matmul(x, n_tokens, &mut u);
    swiglu(&mut g, &u);
    let mut y = vec![0f32; n_tokens * down.out_dim]; // (T, D)
    down.matmul(&g, n_tokens, &mut y);
    y
}

impl Mlp {
    pub fn forward(&self, x: &[f32], n_tokens: usize) -> Vec<f32> {
        swiglu_mlp(&self.gate, &self.up, &self.down, x, n_tokens)
    }
}

impl Expert {
    pub fn forward(&self, x: &[f32], n_tokens: usize) -> Vec<f32> {
        swiglu_mlp(&self.gate, &self.up, &self.down, x, n_tokens)
    }
}
