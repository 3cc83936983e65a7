//! The decoder skeleton every family shares: embed -> blocks (norm, attention, residual, norm,
//! MLP or MoE, residual) -> final norm -> LM head. Families differ in how they fill the blocks.

use strata_kernels::Linear;

use crate::layers::attention::{GqaAttention, SeqView};
use crate::layers::math::{add_into, rms_normed};
use crate::layers::mla::MlaAttention;
use crate::layers::mlp::Mlp;
use crate::layers::moe::{MoeLayer, NextMoe};
use crate::{KvCache, Model, ModelError, ModelInfo, Result, RoutingRecord, Trace};

/// The new tokens of one sequence in a step, with its state.
pub struct SeqInput<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
    /// Return logits for every new token instead of only the last.
    pub all_logits: bool,
}

pub enum Attention {
    Gqa(GqaAttention),
    Mla(MlaAttention),
}

pub enum Ffn {
    Dense(Mlp),
    Moe(MoeLayer),
}

pub struct Block {
    /// (D,)
    pub attn_norm: Vec<f32>,
    pub attn: Attention,
    /// (D,)
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
}

pub struct Decoder {
    pub info: ModelInfo,
    /// (V, D)
    pub embed: Linear,
    pub blocks: Vec<Block>,
    /// (D,)
    pub norm: Vec<f32>,
    /// (V, D)
    pub lm_head: Linear,
    pub eps: f32,
}

impl Model for Decoder {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self) -> KvCache {
        KvCache::new(self.blocks.iter().map(|b| match &b.attn {
            Attention::Gqa(a) => a.cache_dims(),
            Attention::Mla(a) => a.cache_dims(),
        }))
    }

    fn forward(&self, batch: &mut [SeqInput<'_>], mut trace: Option<&mut Trace>) -> Result<Vec<Vec<f32>>> {
        let d = self.info.hidden_dim;
        let vocab = self.embed.out_dim;
        let n_tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();

        let mut x = Vec::with_capacity(n_tokens * d); // (T, D)
        for seq in batch.iter() {
            for &id in seq.tokens {
                if id as usize >= vocab {
                    return Err(ModelError::TokenOutOfRange { id, vocab });
                }
                x.extend(self.embed.row_f32(id as usize));
            }
        }
        if let Some(t) = trace.as_deref_mut() {
            t.hidden.push(("embed".into(), x.clone()));
        }

        for (l, block) in self.blocks.iter().enumerate() {
            let _span = tracing::trace_span!("layer", l).entered();
            let h = rms_normed(&x, &block.attn_norm, self.eps);
            let mut views = Vec::with_capacity(batch.len());
            let mut row = 0;
            for seq in batch.iter_mut() {
                let n = seq.tokens.len();
                views.push(SeqView {
                    rows: row..row + n,
                    start_pos: seq.cache.len,
                    cache: &mut seq.cache.layers[l],
                });
                row += n;
            }
            let a = match &block.attn {
                Attention::Gqa(attn) => attn.forward(&h, n_tokens, &mut views),
                Attention::Mla(attn) => attn.forward(&h, n_tokens, &mut views),
            };
            add_into(&mut x, &a);

            let h = rms_normed(&x, &block.ffn_norm, self.eps);
            // The next MoE layer's router, to guess its experts from this residual while this
            // block's MLP or experts run.
            let next = self.blocks[l + 1..]
                .iter()
                .enumerate()
                .find_map(|(i, b)| match &b.ffn {
                    Ffn::Moe(m) => Some((
                        m,
                        NextMoe {
                            layer: l + 1 + i,
                            router: &m.router,
                            norm: &b.ffn_norm,
                            eps: self.eps,
                        },
                    )),
                    Ffn::Dense(_) => None,
                });
            let f = match &block.ffn {
                Ffn::Dense(mlp) => {
                    if let Some((m, next)) = next {
                        m.prefetch_from(&x, n_tokens, &next);
                    }
                    mlp.forward(&h, n_tokens)
                }
                Ffn::Moe(moe) => {
                    let next = next.map(|(_, n)| n);
                    match trace.as_deref_mut() {
                        Some(t) => {
                            let mut rec = RoutingRecord::default();
                            let f = moe.forward(&h, n_tokens, &x, next, Some(&mut rec))?;
                            t.routing.push(rec);
                            f
                        }
                        None => moe.forward(&h, n_tokens, &x, next, None)?,
                    }
                }
            };
            add_into(&mut x, &f);
            if let Some(t) = trace.as_deref_mut() {
                t.hidden.push((format!("layer{l}"), x.clone()));
            }
        }
        for seq in batch.iter_mut() {
            seq.cache.len += seq.tokens.len();
        }

        let x = rms_normed(&x, &self.norm, self.eps);
        if let Some(t) = trace {
            t.hidden.push(("final_norm".into(), x.clone()));
        }
        let mut out = Vec::with_capacity(batch.len());
        let mut row = 0;
        for seq in batch.iter() {
            let n = seq.tokens.len();
            let rows = if seq.all_logits {
                row..row + n
            } else {
                row + n.saturating_sub(1)..row + n
            };
            let m = rows.len();
            let mut logits = vec![0f32; m * vocab]; // (m, V)
            self.lm_head
                .matmul(&x[rows.start * d..rows.end * d], m, &mut logits);
            out.push(logits);
            row += n;
        }
        Ok(out)
    }
}
