//! The MoE layer, in three parts kept apart: routing (the rule is the family's, chosen here by
//! [`Router`]), fetching the picked experts (the [`ExpertStore`]), and computing them (kernels).
//!
//! All tokens of a step are routed first; the union of their experts is asked of the store once,
//! so an expert read once serves every token (of every sequence) routed to it.

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_kernels::Linear;

use super::math::{rms_norm, sigmoid, softmax, Activation};
use super::mlp::Mlp;
use crate::{ExpertStore, ModelError, Result, RoutingRecord};

pub enum RoutingRule {
    /// Softmax over all experts, top-k, optionally renormalised (Qwen3-MoE, Mixtral).
    SoftmaxTopK { norm_topk_prob: bool },
    /// DeepSeek-V3 `noaux_tc`: sigmoid scores, selection on score + correction bias within the
    /// best groups, weights from the unbiased scores, renormalised, scaled.
    SigmoidGrouped {
        correction_bias: Vec<f32>,
        n_group: usize,
        topk_group: usize,
        norm_topk_prob: bool,
        routed_scaling_factor: f32,
    },
}

pub struct Router {
    /// (E, D)
    pub weight: Linear,
    pub top_k: usize,
    pub rule: RoutingRule,
}

/// The routing of one token: expert ids sorted ascending and their weights in the same order.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Indices of the k largest values, largest first; ties go to the lower index.
fn top_k_indices(values: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

impl Router {
    /// logits (E,) -> route
    pub fn route(&self, logits: &[f32]) -> Route {
        let k = self.top_k;
        let (mut picked, mut weights): (Vec<usize>, Vec<f32>) = match &self.rule {
            RoutingRule::SoftmaxTopK { norm_topk_prob } => {
                let mut p = logits.to_vec();
                softmax(&mut p);
                let idx = top_k_indices(&p, k);
                let mut w: Vec<f32> = idx.iter().map(|&i| p[i]).collect();
                if *norm_topk_prob {
                    let sum: f32 = w.iter().sum();
                    w.iter_mut().for_each(|v| *v /= sum);
                }
                (idx, w)
            }
            RoutingRule::SigmoidGrouped {
                correction_bias,
                n_group,
                topk_group,
                norm_topk_prob,
                routed_scaling_factor,
            } => {
                let s: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
                let mut c: Vec<f32> = s.iter().zip(correction_bias).map(|(s, b)| s + b).collect();
                let group_size = c.len() / n_group;
                if *n_group > 1 {
                    // Group score: the sum of its two best biased scores.
                    let group_scores: Vec<f32> = c
                        .chunks_exact(group_size)
                        .map(|g| top_k_indices(g, 2).iter().map(|&i| g[i]).sum())
                        .collect();
                    let keep = top_k_indices(&group_scores, *topk_group);
                    for (g, chunk) in c.chunks_exact_mut(group_size).enumerate() {
                        if !keep.contains(&g) {
                            chunk.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                        }
                    }
                }
                let idx = top_k_indices(&c, k);
                let mut w: Vec<f32> = idx.iter().map(|&i| s[i]).collect();
                if *norm_topk_prob {
                    let sum: f32 = w.iter().sum::<f32>() + 1e-20;
                    w.iter_mut().for_each(|v| *v /= sum);
                }
                w.iter_mut().for_each(|v| *v *= routed_scaling_factor);
                (idx, w)
            }
        };
        // Sort by expert id so the weighted sum runs in the same order whatever the batch.
        let mut order: Vec<usize> = (0..picked.len()).collect();
        order.sort_by_key(|&i| picked[i]);
        picked = order.iter().map(|&i| picked[i]).collect();
        weights = order.iter().map(|&i| weights[i]).collect();
        Route {
            experts: picked,
            weights,
        }
    }
}

/// Expert id -> the tokens routed to it with their weights, ascending by expert id.
pub(crate) type Assigned = BTreeMap<usize, Vec<(usize, f32)>>;

/// The next MoE layer's router, to guess its experts from this layer's residual.
pub struct NextMoe<'a> {
    pub layer: usize,
    pub router: &'a Router,
    /// (D,) that layer's pre-MoE RMSNorm weight.
    pub norm: &'a [f32],
    pub eps: f32,
}

/// LatentMoE (Kimi K3): routed experts run in a narrower latent space. The token is projected
/// down before the experts, their weighted sum is RMS-normed and projected back up. The router
/// and the shared experts see the full-width input.
pub struct LatentProj {
    /// (L, D)
    pub down: Linear,
    /// (L,) RMSNorm of the experts' weighted sum, when the model has one.
    pub norm: Option<Vec<f32>>,
    /// (D, L)
    pub up: Linear,
    pub eps: f32,
}

pub struct MoeLayer {
    /// Decoder layer index (the store's key).
    pub layer: usize,
    pub router: Router,
    /// Shared experts, added unweighted (DeepSeek-V3: one MLP of n_shared x moe_inter)...
    pub shared: Option<Mlp>,
    /// ... or scaled per token by sigmoid(gate . x) (Qwen2-MoE's `shared_expert_gate`, (1, D)).
    pub shared_gate: Option<Linear>,
    pub latent: Option<LatentProj>,
    /// The routed experts' activation.
    pub act: Activation,
    pub store: Arc<dyn ExpertStore>,
}

impl MoeLayer {
    /// Experts the router picks for any of the tokens of `x` (T, D) normed, ascending.
    fn union_of_routes(router: &Router, x: &[f32], n_tokens: usize) -> Vec<usize> {
        let n_experts = router.weight.out_dim;
        let mut logits = vec![0f32; n_tokens * n_experts]; // (T, E)
        router.weight.matmul(x, n_tokens, &mut logits);
        Self::union_of_logits(router, &logits)
    }

    /// Experts the router picks for any token whose router logits are in `logits` (T, E),
    /// ascending.
    pub(crate) fn union_of_logits(router: &Router, logits: &[f32]) -> Vec<usize> {
        let mut ids: Vec<usize> = logits
            .chunks_exact(router.weight.out_dim)
            .flat_map(|l| router.route(l).experts)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Guesses `next`'s experts from `residual` (T, D, un-normed) and asks the store to read them
    /// early (the store is shared by every MoE layer of the model).
    /// Nothing when the store has no use for a guess (`--prefetch off` without a trace).
    pub fn prefetch_from(&self, residual: &[f32], n_tokens: usize, next: &NextMoe<'_>) {
        if !self.store.wants_guesses() {
            return;
        }
        let guess_input = super::math::rms_normed(residual, next.norm, next.eps);
        let guess = Self::union_of_routes(next.router, &guess_input, n_tokens);
        self.store.prefetch(next.layer, &guess);
    }

    /// Routes each token from its router logits (T, E), tells the store what every token picked
    /// and asks it for the union. Returns the routes and, per expert id ascending, its tokens
    /// with their weights.
    pub(crate) fn route_and_submit(&self, logits: &[f32], n_tokens: usize) -> (Vec<Route>, Assigned) {
        let n_experts = self.router.weight.out_dim;
        let routes: Vec<Route> = strata_kernels::profile::span("MoE routing", n_tokens, || {
            logits
                .chunks_exact(n_experts)
                .map(|l| self.router.route(l))
                .collect()
        });
        let assigned = self.submit_routes(&routes);
        (routes, assigned)
    }

    /// Each expert's tokens and weights from `routes` (one per token); the routes are told to
    /// the store and their experts asked of it.
    pub(crate) fn submit_routes(&self, routes: &[Route]) -> Assigned {
        let mut assigned: Assigned = BTreeMap::new();
        for (t, r) in routes.iter().enumerate() {
            for (&e, &w) in r.experts.iter().zip(&r.weights) {
                assigned.entry(e).or_default().push((t, w));
            }
        }
        let ids: Vec<usize> = assigned.keys().copied().collect();
        let picked: Vec<&[usize]> = routes.iter().map(|r| r.experts.as_slice()).collect();
        self.store.routed(self.layer, &picked);
        self.store.submit(self.layer, &ids);
        assigned
    }

    /// x (T, D) normed -> (T, D). `residual` (T, D) is the un-normed input, from which the next
    /// MoE layer's experts are guessed and prefetched while this layer's are read and computed.
    pub fn forward(
        &self,
        x: &[f32],
        n_tokens: usize,
        residual: &[f32],
        next: Option<NextMoe<'_>>,
        record: Option<&mut RoutingRecord>,
    ) -> Result<Vec<f32>> {
        let n_experts = self.router.weight.out_dim;
        let mut logits = vec![0f32; n_tokens * n_experts]; // (T, E)
        self.router.weight.matmul(x, n_tokens, &mut logits);
        let (routes, assigned) = self.route_and_submit(&logits, n_tokens);
        let ids: Vec<usize> = assigned.keys().copied().collect();
        if let Some(next) = next {
            self.prefetch_from(residual, n_tokens, &next);
        }
        // The shared expert runs first: its weights are resident, and the routed experts' reads
        // are in flight meanwhile.
        let shared = self.shared.as_ref().map(|m| {
            let mut ys = m.forward(x, n_tokens); // (T, D)
            if let Some(gate) = &self.shared_gate {
                let mut g = vec![0f32; n_tokens]; // (T, 1)
                gate.matmul(x, n_tokens, &mut g);
                let width = ys.len() / n_tokens.max(1);
                for (row, g) in ys.chunks_exact_mut(width).zip(&g) {
                    let s = sigmoid(*g);
                    row.iter_mut().for_each(|v| *v *= s);
                }
            }
            ys
        });
        // The experts' input: x itself, or its latent projection (T, L).
        let latent_x = self.latent.as_ref().map(|lat| {
            let mut z = vec![0f32; n_tokens * lat.down.out_dim];
            lat.down.matmul(x, n_tokens, &mut z);
            z
        });
        let (xr, d) = match (&latent_x, &self.latent) {
            (Some(z), Some(lat)) => (z.as_slice(), lat.down.out_dim),
            _ => (x, self.router.weight.in_dim),
        };

        // The routed experts are computed as soon as the store hands them over (the cache hits
        // at once, then reads in completion order), each for every token routed to it; on the
        // CPU the experts of one batch side by side on the kernels' threads (small products
        // alone would leave most cores waiting on their fork and join), on a device that takes
        // them as two submissions per batch.
        let tokens_of: Vec<&Vec<(usize, f32)>> = assigned.values().collect();
        // Per token, (expert's place in `ids`, the token's row in that expert's output, weight)
        // in ascending expert order (the order its contributions are summed in).
        let mut rows_of: Vec<Vec<(usize, usize, f32)>> = vec![Vec::new(); n_tokens];
        for (i, tokens) in tokens_of.iter().enumerate() {
            for (j, &(t, w)) in tokens.iter().enumerate() {
                rows_of[t].push((i, j, w));
            }
        }
        let mut expert_out: Vec<Vec<f32>> = vec![Vec::new(); ids.len()]; // each (n_e, D)
        let mut delivered = 0;
        self.store
            .get_batches(self.layer, &ids, &mut |batch| {
                // The rows of the tokens routed to expert `i`: (n_e, D).
                let rows_for = |i: usize| {
                    let tokens = tokens_of[i];
                    let mut xe = Vec::with_capacity(tokens.len() * d);
                    for &(t, _) in tokens {
                        xe.extend_from_slice(&xr[t * d..(t + 1) * d]);
                    }
                    xe
                };
                let outs: Vec<Vec<f32>> = crate::profile::timed(&crate::profile::PHASES.routed_ns, || {
                    if strata_kernels::offload::takes_experts() {
                        // On a device: the batch's products as two submissions (gate and up, then
                        // down), not three round trips per expert.
                        let xes: Vec<Vec<f32>> = batch.iter().map(|(i, _)| rows_for(*i)).collect();
                        let experts: Vec<&crate::Expert> = batch.iter().map(|(_, e)| e.as_ref()).collect();
                        super::mlp::experts_forward_grouped(&experts, &xes, self.act)
                    } else {
                        let mut outs: Vec<Vec<f32>> = vec![Vec::new(); batch.len()];
                        strata_kernels::for_each_chunk(&mut outs, 1, |b, out| {
                            let (i, expert) = &batch[b];
                            let xe = rows_for(*i);
                            out[0] = super::mlp::expert_forward(expert, &xe, tokens_of[*i].len(), self.act);
                            // (n_e, D)
                        });
                        outs
                    }
                });
                for ((i, _), ye) in batch.iter().zip(outs) {
                    expert_out[*i] = ye;
                }
                delivered += batch.len();
                Ok(())
            })
            .map_err(|cause| ModelError::Experts {
                layer: self.layer,
                cause,
            })?;
        if delivered != ids.len() {
            return Err(ModelError::Experts {
                layer: self.layer,
                cause: format!("asked for {} experts, got {delivered}", ids.len()).into(),
            });
        }

        // Per token, contributions (each the expert's output times its weight) are summed in
        // ascending expert order whatever order they arrived in (batch invariant and
        // deterministic), the tokens on the kernels' threads.
        let mut out = vec![0f32; n_tokens * d];
        strata_kernels::profile::span("MoE weighted sums", n_tokens, || {
            strata_kernels::for_each_chunk(&mut out, d, |t, row| {
                for &(i, j, w) in &rows_of[t] {
                    for (o, v) in row.iter_mut().zip(&expert_out[i][j * d..(j + 1) * d]) {
                        *o += v * w;
                    }
                }
            })
        });
        if let Some(lat) = &self.latent {
            if let Some(w) = &lat.norm {
                rms_norm(&mut out, w, lat.eps);
            }
            let mut up = vec![0f32; n_tokens * lat.up.out_dim]; // (T, D)
            lat.up.matmul(&out, n_tokens, &mut up);
            out = up;
        }
        if let Some(ys) = shared {
            for (o, v) in out.iter_mut().zip(&ys) {
                *o += v;
            }
        }
        if let Some(rec) = record {
            rec.layer = self.layer;
            rec.router_logits = logits.chunks_exact(n_experts).map(|l| l.to_vec()).collect();
            rec.experts = routes.iter().map(|r| r.experts.clone()).collect();
            rec.weights = routes.iter().map(|r| r.weights.clone()).collect();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(rule: RoutingRule, n: usize, k: usize) -> Router {
        Router {
            weight: Linear::from_f32(n, 1, vec![0.0; n]),
            top_k: k,
            rule,
        }
    }

    #[test]
    fn softmax_top_k_renormalises_and_sorts_by_id() {
        let r = router(RoutingRule::SoftmaxTopK { norm_topk_prob: true }, 4, 2);
        let route = r.route(&[0.0, 3.0, 1.0, 2.0]);
        assert_eq!(route.experts, vec![1, 3]);
        let e = 1f32.exp();
        assert!((route.weights[0] - e / (e + 1.0)).abs() < 1e-6);
        assert!((route.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn grouped_routing_masks_losing_groups_even_with_negative_bias() {
        // 2 groups of 2; group 1 wins on biased scores; the best raw score in group 0 is masked.
        let r = router(
            RoutingRule::SigmoidGrouped {
                correction_bias: vec![-1.0, -1.0, 0.0, 0.0],
                n_group: 2,
                topk_group: 1,
                norm_topk_prob: true,
                routed_scaling_factor: 2.0,
            },
            4,
            2,
        );
        let route = r.route(&[5.0, 4.0, 0.0, -1.0]);
        assert_eq!(route.experts, vec![2, 3]);
        let (a, b) = (sigmoid(0.0), sigmoid(-1.0));
        assert!((route.weights[0] - 2.0 * a / (a + b)).abs() < 1e-6);
    }
}
