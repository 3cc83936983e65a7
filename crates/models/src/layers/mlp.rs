//! The gated MLP: down(act(gate(x), up(x))), act SwiGLU or SiTU-GLU. Dense layers, shared experts
//! and routed experts.

use strata_kernels::offload::{matmul_group, Product};
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
    strata_kernels::profile::span("GLU activation", n_tokens, || glu(&mut g, &u, act));
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

/// [`expert_forward`] for several experts at once, `xs[i]` (n_i, D) the rows routed to
/// `experts[i]`: every gate and up product as one group, then every down product as one, so a
/// device that takes the experts runs each group in one submission. Each output has the bits
/// `expert_forward` gives it (a product runs on the same device either way).
pub fn experts_forward_grouped(experts: &[&Expert], xs: &[Vec<f32>], act: Activation) -> Vec<Vec<f32>> {
    let d = |e: &Expert| e.gate.in_dim;
    let tokens: Vec<usize> = experts.iter().zip(xs).map(|(e, x)| x.len() / d(e)).collect();
    let mut g: Vec<Vec<f32>> = experts
        .iter()
        .zip(&tokens)
        .map(|(e, n)| vec![0f32; n * e.gate.out_dim])
        .collect();
    let mut u: Vec<Vec<f32>> = experts
        .iter()
        .zip(&tokens)
        .map(|(e, n)| vec![0f32; n * e.up.out_dim])
        .collect();
    let mut first: Vec<Product<'_>> = Vec::with_capacity(2 * experts.len());
    for (((e, x), n), (gi, ui)) in experts
        .iter()
        .zip(xs)
        .zip(&tokens)
        .zip(g.iter_mut().zip(u.iter_mut()))
    {
        first.push(Product {
            lin: &e.gate,
            xs: x,
            tokens: *n,
            ys: gi,
        });
        first.push(Product {
            lin: &e.up,
            xs: x,
            tokens: *n,
            ys: ui,
        });
    }
    matmul_group(&mut first);
    drop(first);
    for (gi, ui) in g.iter_mut().zip(&u) {
        glu(gi, ui, act);
    }
    let mut y: Vec<Vec<f32>> = experts
        .iter()
        .zip(&tokens)
        .map(|(e, n)| vec![0f32; n * e.down.out_dim])
        .collect();
    let mut second: Vec<Product<'_>> = experts
        .iter()
        .zip(&g)
        .zip(&tokens)
        .zip(y.iter_mut())
        .map(|(((e, h), n), yi)| Product {
            lin: &e.down,
            xs: h,
            tokens: *n,
            ys: yi,
        })
        .collect();
    matmul_group(&mut second);
    drop(second);
    y
}
