//! A MoE layer inside the GPU decoder's submission, when the GPU takes the routed experts
//! (`--gpu-experts`): the router's logits (and the residual, for the next layer's guess) are
//! the only values that go back; the CPU routes and asks the expert store, and every expert's
//! products, its tokens' rows gathered and its outputs added back, are recorded with the layer.
//!
//! Each token sums its experts' weighted outputs in ascending expert order (one dispatch per
//! expert, recorded in that order whatever order the store delivered them in), then the shared
//! expert's: so a token's sum never depends on its batch or on what the cache held.

use strata_gpu::GpuTensor;

use crate::decoder::next_moe_input;
use crate::decoder::{Decoder, SeqInput};
use crate::gpu_decoder::{gpu_err, Pass, Role};
use crate::layers::moe::MoeLayer;
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
        let next_block = self.next_moe(l);
        let next = next_moe_input(&next_block, self.eps).map(|(_, n)| n);
        // The next MoE layer's guess from this residual, in the same submission.
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
        let mut reads = vec![(&logits, 0, n_tokens * n_experts)];
        if let (Some(lg), Some(nx)) = (&guess, &next) {
            reads.push((lg, 0, n_tokens * nx.router.weight.out_dim));
        }
        let got = pass.wait(batch, &reads)?;
        let (_, assigned) = moe.route_and_submit(&got[0], n_tokens);
        let ids: Vec<usize> = assigned.keys().copied().collect();
        if let Some(nx) = &next {
            moe.store
                .prefetch(nx.layer, &MoeLayer::union_of_logits(nx.router, &got[1]));
        }

        // The shared expert first (resident weights), while the routed experts' reads fly.
        let shared = match &moe.shared {
            Some(m) => {
                let y = pass.mlp(&m.gate, &m.up, &m.down, m.act, h, n_tokens)?;
                if let Some(gate) = &moe.shared_gate {
                    let g = pass.tensor(n_tokens)?;
                    pass.product(gate, h, n_tokens, &g)?;
                    pass.rec.scale_sigmoid(&y, &g, n_tokens, d).map_err(gpu_err)?;
                }
                Some(y)
            }
            None => None,
        };
        let tokens_of: Vec<&Vec<(usize, f32)>> = assigned.values().collect();
        let mut outs: Vec<Option<GpuTensor>> = (0..ids.len()).map(|_| None).collect();
        let mut failed: Option<ModelError> = None;
        moe.store
            .get_batches(moe.layer, &ids, &mut |ready| {
                for (i, expert) in ready {
                    let rows: Vec<usize> = tokens_of[*i].iter().map(|&(t, _)| t).collect();
                    let run = |pass: &mut Pass<'_>| -> Result<GpuTensor> {
                        let xe = pass.tensor(rows.len() * d)?;
                        pass.rec.gather(h, &rows, d, &xe).map_err(gpu_err)?;
                        pass.mlp(&expert.gate, &expert.up, &expert.down, moe.act, &xe, rows.len())
                    };
                    match run(pass) {
                        Ok(y) => outs[*i] = Some(y),
                        Err(e) => {
                            let text = e.to_string();
                            failed = Some(e);
                            return Err(text.into());
                        }
                    }
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
        let sum = pass.tensor(n_tokens * d)?;
        pass.rec.clear(&sum);
        for (i, out) in outs.iter().enumerate() {
            let Some(y) = out else {
                return Err(ModelError::Experts {
                    layer: moe.layer,
                    cause: format!("expert {} never delivered", ids[i]).into(),
                });
            };
            pass.rec.scatter_add(&sum, y, tokens_of[i], d).map_err(gpu_err)?;
        }
        if let Some(y) = &shared {
            pass.rec
                .add(&sum, n_tokens * d, y, n_tokens * d)
                .map_err(gpu_err)?;
        }
        pass.rec
            .add(xt, n_tokens * d, &sum, n_tokens * d)
            .map_err(gpu_err)
    }
}
