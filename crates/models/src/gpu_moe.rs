//! A MoE layer inside the GPU decoder's submission, when the GPU takes the routed experts
//! (`--gpu-experts`): the router's logits (and the next layer's guess) are the only values that
//! go back; the CPU routes and asks the expert store, and the experts' work is recorded with the
//! layer. One table per layer (uploaded once) packs every expert's token rows one expert after
//! the other: one dispatch gathers them; once the store has delivered every expert, their gate,
//! up and down products each run as one dispatch per slab of kept experts (one product each for
//! the others), one activation covers all of them between, and one dispatch sums each token's
//! weighted outputs.
//!
//! Each token sums its experts' outputs in ascending expert order from zero, then adds the
//! shared expert's: so a token's sum never depends on its batch, on the order the store
//! delivered the experts in, or on what the cache held.

use std::sync::Arc;

use strata_gpu::{GpuTensor, RouteRule, Routing, MAX_PICKS, MAX_ROUTED_EXPERTS};
use strata_kernels::Linear;
use strata_weights::Expert;

use crate::decoder::next_moe_input;
use crate::decoder::{Decoder, SeqInput};
use crate::gpu_decoder::{glu_of, gpu_err, Pass, Role};
use crate::layers::moe::{MoeLayer, Route, Router, RoutingRule};
use crate::{ModelError, Result};

impl Decoder {
    /// Layer `l`'s experts of the normed rows `h` (T, D), added to the residual `xt`.
    pub(crate) fn moe_gpu(
        &self,
        pass: &mut Pass<'_>,
        l: usize,
        moe: &MoeLayer,
        xt: &GpuTensor,
        h: &GpuTensor,
        batch: &mut [SeqInput<'_>],
    ) -> Result<()> {
        let n_tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let d = self.info.hidden_dim;
        let n_experts = moe.router.weight.out_dim;
        let logits = pass.tensor(n_tokens * n_experts)?;
        pass.product(&moe.router.weight, h, n_tokens, &logits)?;
        // The routes themselves on the GPU where its kernels take the router ([`route_on_gpu`]);
        // only they go back.
        let k = moe.router.top_k;
        let routes = match self.route_on_gpu(pass, moe, &logits, n_tokens)? {
            // A layer whose every expert the GPU keeps lays out its products there: no wait.
            Some(r) => match self.resident_layer(pass, moe, n_tokens)? {
                Some(layer) => return self.moe_resident(pass, moe, &layer, (xt, h), r, n_tokens),
                None => Some(r),
            },
            None => None,
        };
        let next_block = self.next_moe(l);
        let next = next_moe_input(&next_block, self.eps)
            .map(|(_, n)| n)
            .filter(|_| moe.store.wants_guesses());
        // The next MoE layer's guess from this residual, in the same submission (when the store
        // has a use for it).
        let guess = match &next {
            Some(nx) => {
                let hn = pass.tensor(n_tokens * d)?;
                let w = self.gpu_vector(pass.gpu, nx.layer, Role::FfnNorm, nx.norm)?;
                (pass.rec.rms_norm(xt, 0, &w, &hn, 0, n_tokens, d, nx.eps)).map_err(gpu_err)?;
                let lg = pass.tensor(n_tokens * nx.router.weight.out_dim)?;
                pass.product(&nx.router.weight, &hn, n_tokens, &lg)?;
                Some(lg)
            }
            None => None,
        };
        let mut reads = vec![match &routes {
            Some(r) => (r, 0, n_tokens * k * 2),
            None => (&logits, 0, n_tokens * n_experts),
        }];
        if let (Some(lg), Some(nx)) = (&guess, &next) {
            reads.push((lg, 0, n_tokens * nx.router.weight.out_dim));
        }
        let got = pass.wait(batch, &reads)?;
        let assigned = match &routes {
            Some(_) => moe.submit_routes(&routes_of(&got[0], k, n_experts)?),
            None => moe.route_and_submit(&got[0], n_tokens).1,
        };
        let ids: Vec<usize> = assigned.keys().copied().collect();
        if let Some(nx) = &next {
            moe.store
                .prefetch(nx.layer, &MoeLayer::union_of_logits(nx.router, &got[1]));
        }

        // The shared expert first (resident weights), while the routed experts' reads fly.
        let shared = self.shared_expert_gpu(pass, moe, h, n_tokens)?;
        let routing = match &routes {
            Some(r) => {
                let mut starts = vec![0];
                for list in assigned.values() {
                    starts.push(starts[starts.len() - 1] + list.len());
                }
                let table = pass.tensor(Routing::table_len(n_tokens, k, n_experts))?;
                let shape = (n_tokens, k, n_experts);
                pass.rec.route_table(r, shape, table, starts).map_err(gpu_err)?
            }
            None => {
                let lists: Vec<&[(usize, f32)]> = assigned.values().map(|v| v.as_slice()).collect();
                pass.rec.routing(&lists, n_tokens).map_err(gpu_err)?
            }
        };
        let rows = routing.rows();
        let f = self.inter_dim()?;
        let xe = pass.tensor(rows * d)?;
        pass.rec.gather_routed(h, &routing, d, &xe).map_err(gpu_err)?;
        // The experts as the store delivers them; then each of their three products as one
        // dispatch per slab ([`Pass::experts_product`]).
        let mut held: Vec<Option<Arc<Expert>>> = vec![None; ids.len()];
        let mut failed: Option<ModelError> = None;
        moe.store
            .get_batches(moe.layer, &ids, &mut |ready| {
                for (i, expert) in ready {
                    let (gate, down) = (&expert.gate, &expert.down);
                    if gate.out_dim != f || gate.in_dim != d || down.in_dim != f || down.out_dim != d {
                        let e = gpu_err(format!(
                            "expert {} of layer {} is {}x{} -> {}x{}, the layout says {f}x{d}",
                            ids[*i], moe.layer, gate.out_dim, gate.in_dim, down.out_dim, down.in_dim
                        ));
                        let text = e.to_string();
                        failed = Some(e);
                        return Err(text.into());
                    }
                    held[*i] = Some(expert.clone());
                }
                Ok(())
            })
            .map_err(|cause| match failed.take() {
                Some(e) => e,
                None => ModelError::Experts {
                    layer: moe.layer,
                    cause,
                },
            })?;
        let experts = held
            .iter()
            .enumerate()
            .map(|(i, e)| {
                e.as_deref().ok_or_else(|| ModelError::Experts {
                    layer: moe.layer,
                    cause: format!("expert {} never delivered", ids[i]).into(),
                })
            })
            .collect::<Result<Vec<&Expert>>>()?;
        let spans: Vec<(usize, usize)> = (0..ids.len()).map(|i| routing.expert(i)).collect();
        let (g, u) = (pass.tensor(rows * f)?, pass.tensor(rows * f)?);
        let gates: Vec<&Linear> = experts.iter().map(|e| &e.gate).collect();
        pass.experts_product(&gates, &spans, &xe, &g)?;
        let ups: Vec<&Linear> = experts.iter().map(|e| &e.up).collect();
        pass.experts_product(&ups, &spans, &xe, &u)?;
        pass.rec.glu(&g, &u, rows * f, glu_of(moe.act)).map_err(gpu_err)?;
        let ys = pass.tensor(rows * d)?;
        let downs: Vec<&Linear> = experts.iter().map(|e| &e.down).collect();
        pass.experts_product(&downs, &spans, &g, &ys)?;
        sum_into_residual(pass, (&ys, &routing), shared.as_ref(), xt, d)
    }
}

impl Decoder {
    /// The shared expert of `moe` applied to the normed rows `h` (T, D), with its gate.
    pub(crate) fn shared_expert_gpu(
        &self,
        pass: &mut Pass<'_>,
        moe: &MoeLayer,
        h: &GpuTensor,
        n_tokens: usize,
    ) -> Result<Option<GpuTensor>> {
        let Some(m) = &moe.shared else {
            return Ok(None);
        };
        let y = pass.mlp(&m.gate, &m.up, &m.down, m.act, h, n_tokens)?;
        if let Some(gate) = &moe.shared_gate {
            let g = pass.tensor(n_tokens)?;
            pass.product(gate, h, n_tokens, &g)?;
            let d = self.info.hidden_dim;
            pass.rec.scale_sigmoid(&y, &g, n_tokens, d).map_err(gpu_err)?;
        }
        Ok(Some(y))
    }

    /// Records the routes of router `logits` (T, E) on the GPU, (T, k, 2) (expert id bits,
    /// weight; ascending by expert), where its kernels take the router: at most
    /// [`MAX_ROUTED_EXPERTS`] experts and [`MAX_PICKS`] picks. None: the CPU routes.
    fn route_on_gpu(
        &self,
        pass: &mut Pass<'_>,
        moe: &MoeLayer,
        logits: &GpuTensor,
        n_tokens: usize,
    ) -> Result<Option<GpuTensor>> {
        let (n, k) = (moe.router.weight.out_dim, moe.router.top_k);
        let bias = match &moe.router.rule {
            RoutingRule::SigmoidGrouped { correction_bias, .. } if correction_bias.len() == n => {
                Some(self.gpu_vector(pass.gpu, moe.layer, Role::RouterBias, correction_bias)?)
            }
            _ => None,
        };
        let Some(rule) = moe.router.gpu_rule(bias.as_deref()) else {
            return Ok(None);
        };
        let routes = pass.tensor(n_tokens * k * 2)?;
        pass.rec
            .route(logits, (n_tokens, n, k), rule, &routes)
            .map_err(gpu_err)?;
        Ok(Some(routes))
    }
}

impl Router {
    /// The rule of this router as the GPU's routing kernel takes it, with the correction bias
    /// there (`bias`, for the sigmoid rule); None where the kernel cannot take it (more than
    /// [`MAX_ROUTED_EXPERTS`] experts or [`MAX_PICKS`] picks, groups it does not split into) or
    /// the bias is missing.
    pub fn gpu_rule<'a>(&self, bias: Option<&'a GpuTensor>) -> Option<RouteRule<'a>> {
        let (n, k) = (self.weight.out_dim, self.top_k);
        if n > MAX_ROUTED_EXPERTS || k > MAX_PICKS.min(n) || k == 0 {
            return None;
        }
        Some(match &self.rule {
            RoutingRule::SoftmaxTopK { norm_topk_prob } => RouteRule::Softmax {
                norm: *norm_topk_prob,
            },
            RoutingRule::SigmoidGrouped {
                n_group,
                topk_group,
                norm_topk_prob,
                routed_scaling_factor,
                ..
            } => {
                let groups = (*n_group).max(1);
                let fits = groups <= 128
                    && n.is_multiple_of(groups)
                    && (1..=groups).contains(topk_group)
                    && k <= topk_group * (n / groups);
                if !fits {
                    return None;
                }
                RouteRule::SigmoidGrouped {
                    bias: bias.filter(|b| b.len() >= n)?,
                    groups,
                    topk_group: *topk_group,
                    norm: *norm_topk_prob,
                    scale: *routed_scaling_factor,
                }
            }
        })
    }
}

/// Each token's sum of its experts' outputs `ys` (packed as `routing` lays them out), plus
/// the shared expert's `shared`, added to the residual `xt` (rows of `d`).
pub(crate) fn sum_into_residual(
    pass: &mut Pass<'_>,
    (ys, routing): (&GpuTensor, &Routing),
    shared: Option<&GpuTensor>,
    xt: &GpuTensor,
    d: usize,
) -> Result<()> {
    let n_tokens = routing.tokens();
    let sum = pass.tensor(n_tokens * d)?;
    pass.rec.combine(&sum, ys, routing, d).map_err(gpu_err)?;
    if let Some(y) = shared {
        pass.rec
            .add(&sum, n_tokens * d, y, n_tokens * d)
            .map_err(gpu_err)?;
    }
    pass.rec
        .add(xt, n_tokens * d, &sum, n_tokens * d)
        .map_err(gpu_err)
}

/// Each token's route from the GPU's (expert id bits, weight) pairs, `k` a token, of `n`
/// experts.
fn routes_of(values: &[f32], k: usize, n: usize) -> Result<Vec<Route>> {
    values
        .chunks_exact(2 * k)
        .map(|r| {
            let experts: Vec<usize> = r.chunks_exact(2).map(|p| p[0].to_bits() as usize).collect();
            if experts.windows(2).any(|w| w[0] >= w[1]) || experts.iter().any(|&e| e >= n) {
                return Err(gpu_err(format!("the GPU routed a token to experts {experts:?}")));
            }
            Ok(Route {
                experts,
                weights: r.chunks_exact(2).map(|p| p[1]).collect(),
            })
        })
        .collect()
}
