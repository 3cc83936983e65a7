//! The decoder skeleton every family shares: embed -> blocks (norm, attention, residual, norm,
//! MLP or MoE, residual) -> final norm -> LM head. Families differ in how they fill the blocks,
//! and in the residual: a plain running sum, or Block AttnRes (Kimi K3), where each layer reads
//! a learned mixture of the completed block sums and the current partial sum.

use std::sync::Arc;

use strata_kernels::Linear;

use crate::layers::attention::{GqaAttention, SeqView};
use crate::layers::attn_res::{AttnRes, LayerRes};
use crate::layers::kda::KdaAttention;
use crate::layers::math::{add_into, rms_normed};
use crate::layers::mla::MlaAttention;
use crate::layers::mlp::Mlp;
use crate::layers::moe::{MoeLayer, NextMoe};
use crate::profile::{timed, PHASES};
use crate::spine::{Layer, LayerStore};
use crate::{KvCache, LayerState, Model, ModelError, ModelInfo, Result, RoutingRecord, Trace};
use strata_kernels::profile::span;

/// The new tokens of one sequence in a step, with its state.
pub struct SeqInput<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
    /// Return logits for every new token instead of only the last.
    pub all_logits: bool,
}

pub enum Attention {
    Gqa(Box<GqaAttention>),
    Mla(Box<MlaAttention>),
    Kda(Box<KdaAttention>),
}

/// One per layer, so the size difference of the variants does not matter.
#[allow(clippy::large_enum_variant)]
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
    /// This layer's AttnRes mixing weights (with [`Decoder::attn_res`]).
    pub res: Option<LayerRes>,
}

pub struct Decoder {
    pub info: ModelInfo,
    /// (V, D)
    pub embed: Linear,
    pub layers: Vec<Layer>,
    /// Each layer's decoding state.
    pub states: Vec<LayerState>,
    /// Where the streamed layers come from.
    pub spine: Option<Arc<dyn LayerStore>>,
    /// (D,)
    pub norm: Vec<f32>,
    /// (V, D)
    pub lm_head: Linear,
    pub eps: f32,
    /// Block AttnRes in place of the plain residual (every block has its `res`).
    pub attn_res: Option<AttnRes>,
    /// The GPU decoder's copies of the vectors, and whether the model runs there.
    pub gpu: crate::gpu_decoder::GpuState,
}

/// A block held by the model or by a streamed layer's reader.
pub(crate) enum BlockRef<'a> {
    Held(&'a Block),
    Streamed(Arc<Block>),
}

impl std::ops::Deref for BlockRef<'_> {
    type Target = Block;
    fn deref(&self) -> &Block {
        match self {
            BlockRef::Held(b) => b,
            BlockRef::Streamed(b) => b,
        }
    }
}

impl Decoder {
    /// Streamed layer `l`, waiting for its read (the wait counts as I/O wait).
    pub(crate) fn streamed(&self, l: usize) -> Result<Arc<Block>> {
        let store = self.spine.as_ref().ok_or_else(|| ModelError::Spine {
            layer: l,
            cause: "no layer store".into(),
        })?;
        store.get(l).map_err(|e| ModelError::Spine {
            layer: l,
            cause: e.to_string(),
        })
    }

    /// The first MoE layer after `l`, if its block is at hand (a streamed one only when its
    /// read has completed: the guess is not worth waiting for).
    pub(crate) fn next_moe(&self, l: usize) -> Option<(usize, BlockRef<'_>)> {
        for i in l + 1..self.layers.len() {
            let block = match &self.layers[i] {
                Layer::Resident(b) => BlockRef::Held(b),
                Layer::Streamed => BlockRef::Streamed(self.spine.as_ref()?.ready(i)?),
            };
            if matches!(block.ffn, Ffn::Moe(_)) {
                return Some((i, block));
            }
        }
        None
    }
}

/// The MoE layer [`Decoder::next_moe`] found, with what guessing its experts needs.
pub(crate) fn next_moe_input<'b>(
    next: &'b Option<(usize, BlockRef<'_>)>,
    eps: f32,
) -> Option<(&'b MoeLayer, NextMoe<'b>)> {
    let (i, b) = next.as_ref()?;
    match &b.ffn {
        Ffn::Moe(m) => Some((
            m,
            NextMoe {
                layer: *i,
                router: &m.router,
                norm: &b.ffn_norm,
                eps,
            },
        )),
        Ffn::Dense(_) => None,
    }
}

impl Model for Decoder {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self) -> KvCache {
        KvCache::new(self.states.iter().copied())
    }

    fn forward(&self, batch: &mut [SeqInput<'_>], mut trace: Option<&mut Trace>) -> Result<Vec<Vec<f32>>> {
        let d = self.info.hidden_dim;
        let vocab = self.embed.out_dim;
        let n_tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();

        let ids: Vec<usize> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().map(|&id| id as usize))
            .collect();
        if let Some(&id) = ids.iter().find(|&&id| id >= vocab) {
            return Err(ModelError::TokenOutOfRange { id: id as u32, vocab });
        }
        // (T, D): a prompt's rows on the kernels' threads.
        let mut x = vec![0f32; n_tokens * d];
        span("embedding", n_tokens, || {
            strata_kernels::for_each_chunk(&mut x, d, |t, row| self.embed.decode_row(ids[t], row))
        });
        if let Some(t) = trace.as_deref_mut() {
            t.hidden.push(("embed".into(), x.clone()));
        }
        if trace.is_none() {
            if let Some(off) = self.gpu_decoder() {
                match self.forward_gpu(off, batch, &x) {
                    Err(ModelError::Gpu(e)) => self.gpu_lost(batch, &e),
                    done => return done,
                }
            }
        }

        // AttnRes: the completed block sums, each (T, D).
        let mut done_blocks: Vec<Vec<f32>> = Vec::new();
        for l in 0..self.layers.len() {
            let _span = tracing::trace_span!("layer", l).entered();
            let streamed;
            let block = match &self.layers[l] {
                Layer::Resident(b) => b,
                Layer::Streamed => {
                    streamed = self.streamed(l)?;
                    &*streamed
                }
            };
            let (h, mut partial) = match (&self.attn_res, &block.res) {
                (Some(ar), Some(res)) => {
                    let h = if done_blocks.is_empty() {
                        rms_normed(&x, &block.attn_norm, self.eps)
                    } else {
                        let mixed = span("AttnRes mix", n_tokens, || {
                            res.attn.mix(&x, &done_blocks, self.eps)
                        });
                        rms_normed(&mixed, &block.attn_norm, self.eps)
                    };
                    if l.is_multiple_of(ar.block_size) {
                        done_blocks.push(std::mem::take(&mut x));
                        (h, vec![0f32; n_tokens * d])
                    } else {
                        (h, std::mem::take(&mut x))
                    }
                }
                _ => (rms_normed(&x, &block.attn_norm, self.eps), std::mem::take(&mut x)),
            };
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
            let a = timed(&PHASES.attention_ns, || match &block.attn {
                Attention::Gqa(attn) => attn.forward(&h, n_tokens, &mut views),
                Attention::Mla(attn) => attn.forward(&h, n_tokens, &mut views),
                Attention::Kda(attn) => attn.forward(&h, n_tokens, &mut views),
            });
            add_into(&mut partial, &a);

            let mixed = match &block.res {
                Some(res) if self.attn_res.is_some() => Some(span("AttnRes mix", n_tokens, || {
                    res.mlp.mix(&partial, &done_blocks, self.eps)
                })),
                _ => None,
            };
            let ffn_in = mixed.as_deref().unwrap_or(&partial);
            let h = rms_normed(ffn_in, &block.ffn_norm, self.eps);
            // The next MoE layer's router, to guess its experts from this residual while this
            // block's MLP or experts run.
            let next_block = self.next_moe(l);
            let next = next_moe_input(&next_block, self.eps);
            let f = match &block.ffn {
                Ffn::Dense(mlp) => {
                    if let Some((m, next)) = next {
                        m.prefetch_from(ffn_in, n_tokens, &next);
                    }
                    mlp.forward(&h, n_tokens)
                }
                Ffn::Moe(moe) => {
                    let next = next.map(|(_, n)| n);
                    timed(&PHASES.moe_ns, || match trace.as_deref_mut() {
                        Some(t) => {
                            let mut rec = RoutingRecord::default();
                            let f = moe.forward(&h, n_tokens, ffn_in, next, Some(&mut rec))?;
                            t.routing.push(rec);
                            Ok::<_, ModelError>(f)
                        }
                        None => moe.forward(&h, n_tokens, ffn_in, next, None),
                    })?
                }
            };
            add_into(&mut partial, &f);
            x = partial;
            if let Some(t) = trace.as_deref_mut() {
                t.hidden.push((format!("layer{l}"), x.clone()));
            }
        }
        if let Some(ar) = &self.attn_res {
            x = span("AttnRes mix", n_tokens, || {
                ar.output.mix(&x, &done_blocks, self.eps)
            });
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
