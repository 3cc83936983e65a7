//! The decoder on the GPU (`--device gpu`): the residual stream stays in GPU memory, and a
//! layer's norms, products, rotations, attention over a GPU copy of the KV cache, dense MLP and
//! residual adds are recorded into one submission. Only a MoE layer's routing and experts (the
//! expert cache and the disk are the CPU's) make it wait: the normed rows go back, the experts'
//! sum comes up. So a dense layer crosses the bus zero times and a MoE layer once, where the
//! per-product offload crossed it once per product.
//!
//! Grouped-query and latent attention families without Block AttnRes run here (Qwen3-MoE,
//! Qwen2-MoE, Mixtral, dense Llama/Qwen, DeepSeek-V3, Kimi K2); the others (KDA, AttnRes), and
//! runs that record a trace, take the CPU decoder (whose products still go to the GPU one by
//! one). `STRATA_GPU_LAYERS=0` turns it off.
//!
//! The CPU's cache stays the truth: each new key and value row is read back with the layer's
//! other results, and a GPU copy out of step with it is made anew from it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use strata_gpu::{AttendShape, Glu, Gpu, GpuTensor, Offload, Recorder, Rotation};
use strata_kernels::Linear;

use crate::decoder::{next_moe_input, Attention, Block, BlockRef, Decoder, Ffn, SeqInput};
use crate::gpu_resident::{ResidentLayer, RoutesBack};
use crate::layers::attention::GqaAttention;
use crate::layers::math::Activation;
use crate::layers::mla::QueryProj;
use crate::layers::rope::{Rope, RopeStyle};
use crate::profile::{timed, PHASES};
use crate::spine::Layer;
use crate::{KvMirror, LayerCache, ModelError, Result};
use strata_kernels::profile::span;

/// A decoder's vectors (norm weights, biases) in GPU memory, made at first use, and whether it
/// runs on the GPU at all.
#[derive(Default)]
pub struct GpuState {
    vectors: Mutex<HashMap<(usize, Role), Arc<GpuTensor>>>,
    eligible: OnceLock<bool>,
    /// MoE layers whose every expert the GPU keeps (None: it could not take them all).
    resident: Mutex<HashMap<usize, Option<Arc<ResidentLayer>>>>,
    /// A step failed on the GPU: this model's layers run on the CPU from then on.
    lost: AtomicBool,
}

/// Which vector of a layer (the final norm is layer `usize::MAX`'s).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    AttnNorm,
    FfnNorm,
    QNorm,
    KNorm,
    QBias,
    KBias,
    VBias,
    OBias,
    Norm,
    /// MLA's per-head absorbed matrices.
    Uk,
    Uv,
    /// A MoE router's correction bias.
    RouterBias,
}

/// The GPU's form of an activation.
pub(crate) fn glu_of(act: Activation) -> Glu {
    match act {
        Activation::Silu => Glu::Silu,
        Activation::Situ { beta, linear_beta } => Glu::Situ { beta, linear_beta },
    }
}

pub(crate) fn gpu_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Gpu(e.to_string())
}

/// New key and value rows of one sequence at one layer, read back at the next wait.
pub(crate) struct KvRows {
    pub(crate) seq: usize,
    pub(crate) layer: usize,
    pub(crate) k: Arc<GpuTensor>,
    /// None: the layer caches no values (MLA).
    pub(crate) v: Option<Arc<GpuTensor>>,
    /// Where the rows are in `k` and `v`, and how many values they hold.
    pub(crate) at: usize,
    pub(crate) len: usize,
}

/// One forward pass's GPU work in progress.
pub(crate) struct Pass<'g> {
    pub(crate) gpu: &'g Gpu,
    pub(crate) off: &'static Offload,
    pub(crate) rec: Recorder<'g>,
    pub(crate) kv: Vec<KvRows>,
    /// Resident layers' routes, read back at the next wait.
    pub(crate) routes_back: Vec<RoutesBack>,
    /// Tokens of the step (for the profile's spans).
    tokens: usize,
}

impl<'g> Pass<'g> {
    /// `y` = `lin` applied to `x` (T rows), on the GPU.
    pub(crate) fn product(
        &mut self,
        lin: &Linear,
        x: &GpuTensor,
        tokens: usize,
        y: &GpuTensor,
    ) -> Result<()> {
        self.product_at(lin, x, 0, tokens, y, 0)
    }

    /// [`Pass::product`] of the T rows of `x` from value `x0`, written to `y` from value `y0`.
    pub(crate) fn product_at(
        &mut self,
        lin: &Linear,
        x: &GpuTensor,
        x0: usize,
        tokens: usize,
        y: &GpuTensor,
        y0: usize,
    ) -> Result<()> {
        let copy = lin
            .on_device()
            .ok_or_else(|| gpu_err(format!("no GPU copy of a {} weight", lin.data.format_name())))?;
        let m = self
            .off
            .matrix(copy.matrix())
            .ok_or_else(|| gpu_err("a weight on another device"))?;
        self.rec.matmul_at(m, x, x0, tokens, y, y0).map_err(gpu_err)
    }

    /// Expert i's rows of `y` = `lins[i]` applied to its rows of `x` (`rows[i]`: first row, rows;
    /// packed as a routing table lays them out), as one dispatch for the experts kept in one
    /// slab of GPU memory ([`strata_gpu::Recorder::matmul_experts`]).
    pub(crate) fn experts_product(
        &mut self,
        lins: &[&Linear],
        rows: &[(usize, usize)],
        x: &GpuTensor,
        y: &GpuTensor,
    ) -> Result<()> {
        // Copies of experts the GPU does not keep yet are made side by side (each its own
        // upload), so a layer's copies share the link instead of taking turns at it.
        use rayon::prelude::*;
        let copies = lins
            .par_iter()
            .map(|lin| {
                lin.on_device().ok_or_else(|| {
                    gpu_err(format!(
                        "no GPU copy of a {} expert weight",
                        lin.data.format_name()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ms = copies
            .iter()
            .map(|c| {
                self.off
                    .matrix(c.matrix())
                    .ok_or_else(|| gpu_err("a weight on another device"))
            })
            .collect::<Result<Vec<_>>>()?;
        self.rec.matmul_experts(&ms, rows, x, y).map_err(gpu_err)
    }

    /// `down(act(gate(x), up(x)))` of the T rows of `x`: (T, down's rows).
    pub(crate) fn mlp(
        &mut self,
        gate: &Linear,
        up: &Linear,
        down: &Linear,
        act: Activation,
        x: &GpuTensor,
        tokens: usize,
    ) -> Result<GpuTensor> {
        let f = gate.out_dim;
        let (g, u) = (self.tensor(tokens * f)?, self.tensor(tokens * f)?);
        self.product(gate, x, tokens, &g)?;
        self.product(up, x, tokens, &u)?;
        self.rec.glu(&g, &u, tokens * f, glu_of(act)).map_err(gpu_err)?;
        let y = self.tensor(tokens * down.out_dim)?;
        self.product(down, &g, tokens, &y)?;
        Ok(y)
    }

    pub(crate) fn tensor(&self, len: usize) -> Result<GpuTensor> {
        self.gpu.tensor(len).map_err(gpu_err)
    }

    /// Runs what was recorded, reads `reads` back and appends every pending key and value row to
    /// its sequence's CPU cache.
    pub(crate) fn wait(
        &mut self,
        batch: &mut [SeqInput<'_>],
        reads: &[(&GpuTensor, usize, usize)],
    ) -> Result<Vec<Vec<f32>>> {
        let rec = std::mem::replace(&mut self.rec, self.gpu.recorder());
        let kv = std::mem::take(&mut self.kv);
        let routes = std::mem::take(&mut self.routes_back);
        let mut all: Vec<(&GpuTensor, usize, usize)> = reads.to_vec();
        for r in &routes {
            all.push((&r.routes, 0, r.tokens * r.k * 2));
        }
        for r in &kv {
            all.push((&r.k, r.at, r.len));
            if let Some(v) = &r.v {
                all.push((v, r.at, r.len));
            }
        }
        let mut got = span("GPU submit and wait", self.tokens, || rec.finish(&all)).map_err(gpu_err)?;
        let mut rows = got.split_off(reads.len()).into_iter();
        // Each resident layer's experts used, three matrices each, all found on the GPU.
        for r in &routes {
            let used = RoutesBack::distinct(&rows.next().unwrap_or_default()) as u64;
            strata_kernels::offload::count_expert_hits(3 * used);
            strata_kernels::count_weight_bytes(used * r.expert_bytes);
            self.off.count_expert_products(3 * used);
        }
        for r in &kv {
            let c = &mut batch[r.seq].cache.layers[r.layer];
            c.k.extend_from_slice(&rows.next().unwrap_or_default());
            if r.v.is_some() {
                c.v.extend_from_slice(&rows.next().unwrap_or_default());
            }
        }
        Ok(got)
    }
}

impl Decoder {
    /// The GPU backend when it is installed and this model runs there.
    pub(crate) fn gpu_decoder(&self) -> Option<&'static Offload> {
        if std::env::var("STRATA_GPU_LAYERS").is_ok_and(|v| v == "0") {
            return None;
        }
        let off = Offload::installed()?;
        if self.gpu.lost.load(Ordering::Relaxed) {
            return None;
        }
        self.gpu
            .eligible
            .get_or_init(|| self.runs_on_gpu(off))
            .then_some(off)
    }

    /// A step failed on the GPU (`why`): its key and value rows go (the CPU's rows stay the truth,
    /// the sequences' lengths did not move), the step is run again on the CPU by the caller, and
    /// so is every later one; said once.
    pub(crate) fn gpu_lost(&self, batch: &mut [SeqInput<'_>], why: &str) {
        if !self.gpu.lost.swap(true, Ordering::Relaxed) {
            eprintln!(
                "warning: a step failed on the GPU ({why}); this model's layers run on the CPU from here"
            );
        }
        for seq in batch.iter_mut() {
            let len = seq.cache.len;
            seq.cache.truncate(len);
        }
    }

    /// Whether every layer is grouped-query attention the GPU kernels take, with weights of
    /// formats the GPU has (streamed layers: the first, read here once).
    fn runs_on_gpu(&self, off: &Offload) -> bool {
        use strata_kernels::offload::Device;
        if self.attn_res.is_some() || !off.supports(&self.lm_head) {
            return false;
        }
        let fits = |b: &Block| {
            let (mut lins, shapes_fit) = match &b.attn {
                Attention::Gqa(a) => (
                    vec![&a.q, &a.k, &a.v, &a.o],
                    a.head_dim <= strata_gpu::MAX_HEAD
                        && a.rope.dim <= a.head_dim
                        && a.rope.dim.is_multiple_of(2),
                ),
                Attention::Mla(a) => {
                    let mut lins = vec![&a.kv_a, &a.o];
                    match &a.q {
                        QueryProj::Direct(w) => lins.push(w),
                        QueryProj::LowRank { a: qa, b: qb, .. } => lins.extend([qa, qb]),
                    }
                    let width = a.kv_lora + a.rope_dim;
                    let rope_fits = a.rope.as_ref().is_none_or(|r| r.dim == a.rope_dim);
                    (
                        lins,
                        a.gate.is_none() && width <= strata_gpu::MAX_HEAD && rope_fits,
                    )
                }
                Attention::Kda(_) => return false,
            };
            if let Ffn::Dense(m) = &b.ffn {
                lins.extend([&m.gate, &m.up, &m.down]);
            }
            shapes_fit && lins.iter().all(|l| off.supports(l))
        };
        let mut streamed_seen = false;
        for (l, layer) in self.layers.iter().enumerate() {
            match layer {
                Layer::Resident(b) => {
                    if !fits(b) {
                        return false;
                    }
                }
                Layer::Streamed if !streamed_seen => {
                    streamed_seen = true;
                    match self.streamed(l) {
                        Ok(b) if fits(&b) => {}
                        _ => return false,
                    }
                }
                Layer::Streamed => {}
            }
        }
        true
    }

    /// Layer `layer`'s resident form as made before (None inside: it cannot be made); None:
    /// not tried yet.
    pub(crate) fn gpu_resident_get(&self, layer: usize) -> Option<Option<Arc<ResidentLayer>>> {
        let kept = self.gpu.resident.lock().unwrap_or_else(|e| e.into_inner());
        kept.get(&layer).cloned()
    }

    pub(crate) fn gpu_resident_put(&self, layer: usize, made: Option<Arc<ResidentLayer>>) {
        let mut kept = self.gpu.resident.lock().unwrap_or_else(|e| e.into_inner());
        kept.insert(layer, made);
    }

    /// A vector of the model in GPU memory (made at its first use).
    pub(crate) fn gpu_vector(
        &self,
        gpu: &Gpu,
        layer: usize,
        role: Role,
        v: &[f32],
    ) -> Result<Arc<GpuTensor>> {
        let mut kept = self.gpu.vectors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = kept.get(&(layer, role)).filter(|t| t.len() == v.len()) {
            return Ok(t.clone());
        }
        let t = Arc::new(gpu.upload_tensor(v).map_err(gpu_err)?);
        kept.insert((layer, role), t.clone());
        Ok(t)
    }

    /// Two tensors of layer `l` made by `make` at their first use, kept like the vectors.
    pub(crate) fn gpu_tensors(
        &self,
        gpu: &Gpu,
        layer: usize,
        (ra, rb): (Role, Role),
        make: impl FnOnce() -> (Vec<f32>, Vec<f32>),
    ) -> Result<(Arc<GpuTensor>, Arc<GpuTensor>)> {
        let mut kept = self.gpu.vectors.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(a), Some(b)) = (kept.get(&(layer, ra)), kept.get(&(layer, rb))) {
            return Ok((a.clone(), b.clone()));
        }
        let (a, b) = make();
        let a = Arc::new(gpu.upload_tensor(&a).map_err(gpu_err)?);
        let b = Arc::new(gpu.upload_tensor(&b).map_err(gpu_err)?);
        kept.insert((layer, ra), a.clone());
        kept.insert((layer, rb), b.clone());
        Ok((a, b))
    }

    /// [`crate::Model::forward`] on the GPU (see the module); `x` is the embedded rows (T, D).
    pub(crate) fn forward_gpu(
        &self,
        off: &'static Offload,
        batch: &mut [SeqInput<'_>],
        x: &[f32],
    ) -> Result<Vec<Vec<f32>>> {
        let gpu = off.gpu();
        let n_tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let d = self.info.hidden_dim;
        let mut pass = Pass {
            gpu,
            off,
            rec: gpu.recorder(),
            kv: Vec::new(),
            routes_back: Vec::new(),
            tokens: n_tokens,
        };
        let xt = gpu.upload_tensor(x).map_err(gpu_err)?;
        let mut tables: Vec<(Rope, GpuTensor)> = Vec::new();
        let result = (|| {
            for l in 0..self.layers.len() {
                let streamed;
                let block = match &self.layers[l] {
                    Layer::Resident(b) => BlockRef::Held(b),
                    Layer::Streamed => {
                        streamed = self.streamed(l)?;
                        BlockRef::Streamed(streamed)
                    }
                };
                let rope = match &block.attn {
                    Attention::Gqa(a) => Some(&a.rope),
                    Attention::Mla(a) => a.rope.as_ref(),
                    Attention::Kda(_) => return Err(gpu_err(format!("layer {l}: KDA is not on the GPU"))),
                };
                let table = match rope {
                    Some(rope) => Some(match tables.iter().position(|(r, _)| same_rope(r, rope)) {
                        Some(i) => i,
                        None => {
                            tables.push((rope.clone(), rope_table(gpu, rope, batch)?));
                            tables.len() - 1
                        }
                    }),
                    None => None,
                };
                let table = table.map(|i| &tables[i].1);
                let h = pass.tensor(n_tokens * d)?;
                let w = self.gpu_vector(gpu, l, Role::AttnNorm, &block.attn_norm)?;
                (pass.rec.rms_norm(&xt, 0, &w, &h, 0, n_tokens, d, self.eps)).map_err(gpu_err)?;
                let a = match &block.attn {
                    Attention::Gqa(attn) => {
                        let table = table.ok_or_else(|| gpu_err("a rotation without its table"))?;
                        self.attention_gpu(&mut pass, l, attn, &h, table, batch)?
                    }
                    Attention::Mla(attn) => self.mla_gpu(&mut pass, l, attn, &h, table, batch)?,
                    Attention::Kda(_) => unreachable!("refused above"),
                };
                pass.rec
                    .add(&xt, n_tokens * d, &a, n_tokens * d)
                    .map_err(gpu_err)?;
                let h = pass.tensor(n_tokens * d)?;
                let w = self.gpu_vector(gpu, l, Role::FfnNorm, &block.ffn_norm)?;
                (pass.rec.rms_norm(&xt, 0, &w, &h, 0, n_tokens, d, self.eps)).map_err(gpu_err)?;
                self.ffn_gpu(&mut pass, l, &block, &xt, &h, batch)?;
            }
            self.logits_gpu(&mut pass, &xt, batch)
        })();
        if result.is_err() {
            // The CPU rows are the truth; copies that may be ahead of them go.
            for seq in batch.iter_mut() {
                seq.cache
                    .layers
                    .iter_mut()
                    .for_each(|c| c.gpu = Default::default());
            }
        }
        result
    }

    /// Layer `l`'s attention of the normed rows `h`: (T, D) in GPU memory.
    fn attention_gpu(
        &self,
        pass: &mut Pass<'_>,
        l: usize,
        attn: &GqaAttention,
        h: &GpuTensor,
        table: &GpuTensor,
        batch: &mut [SeqInput<'_>],
    ) -> Result<GpuTensor> {
        let gpu = pass.gpu;
        let n_tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let (heads, kv_heads, dh) = (attn.n_heads, attn.n_kv_heads, attn.head_dim);
        let width = kv_heads * dh;
        let q = pass.tensor(n_tokens * heads * dh)?;
        let k = Arc::new(pass.tensor(n_tokens * width)?);
        let v = Arc::new(pass.tensor(n_tokens * width)?);
        pass.product(&attn.q, h, n_tokens, &q)?;
        pass.product(&attn.k, h, n_tokens, &k)?;
        pass.product(&attn.v, h, n_tokens, &v)?;
        if let Some(b) = &attn.biases {
            for (t, bias, role) in [
                (&q, &b.q, Role::QBias),
                (&*k, &b.k, Role::KBias),
                (&*v, &b.v, Role::VBias),
            ] {
                let bt = self.gpu_vector(gpu, l, role, bias)?;
                (pass.rec.add(t, n_tokens * bias.len(), &bt, bias.len())).map_err(gpu_err)?;
            }
        }
        let rope = Rotation {
            offset: 0,
            dim: attn.rope.dim,
            interleaved: attn.rope.style == RopeStyle::Interleaved,
            cos_sin: table,
        };
        for (t, n, norm, role) in [
            (&q, heads, &attn.q_norm, Role::QNorm),
            (&*k, kv_heads, &attn.k_norm, Role::KNorm),
        ] {
            let w = match norm {
                Some(w) => Some(self.gpu_vector(gpu, l, role, w)?),
                None => None,
            };
            let norm = w.as_deref().map(|w| (w, dh, attn.eps));
            (pass.rec.norm_rope(t, n_tokens, n, dh, norm, Some(rope))).map_err(gpu_err)?;
        }
        let out = pass.tensor(n_tokens * heads * dh)?;
        let mut row = 0;
        for (i, seq) in batch.iter_mut().enumerate() {
            let n = seq.tokens.len();
            let start = seq.cache.len;
            let m = mirror(
                gpu,
                &mut pass.rec,
                &mut seq.cache.layers[l],
                (width, width),
                start,
                n,
            )?;
            (pass.rec.copy(&k, row * width, &m.k, start * width, n * width)).map_err(gpu_err)?;
            (pass.rec.copy(&v, row * width, &m.v, start * width, n * width)).map_err(gpu_err)?;
            let shape = AttendShape {
                heads,
                group: heads / kv_heads,
                head_dim: dh,
                value_dim: dh,
                kv_width: width,
                row0: row,
                tokens: n,
                start_pos: start,
                window: attn.sliding_window,
                scale: 1.0 / (dh as f32).sqrt(),
            };
            pass.rec.attend(&out, &q, &m.k, &m.v, &shape).map_err(gpu_err)?;
            pass.kv.push(KvRows {
                seq: i,
                layer: l,
                k: k.clone(),
                v: Some(v.clone()),
                at: row * width,
                len: n * width,
            });
            row += n;
        }
        let y = pass.tensor(n_tokens * attn.o.out_dim)?;
        pass.product(&attn.o, &out, n_tokens, &y)?;
        if let Some(o) = attn.biases.as_ref().and_then(|b| b.o.as_ref()) {
            let bt = self.gpu_vector(gpu, l, Role::OBias, o)?;
            (pass.rec.add(&y, n_tokens * o.len(), &bt, o.len())).map_err(gpu_err)?;
        }
        Ok(y)
    }

    /// Layer `l`'s MLP or experts of the normed rows `h`, added to the residual `xt`.
    fn ffn_gpu(
        &self,
        pass: &mut Pass<'_>,
        l: usize,
        block: &Block,
        xt: &GpuTensor,
        h: &GpuTensor,
        batch: &mut [SeqInput<'_>],
    ) -> Result<()> {
        let n_tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let d = self.info.hidden_dim;
        match &block.ffn {
            Ffn::Dense(mlp) => {
                let y = pass.mlp(&mlp.gate, &mlp.up, &mlp.down, mlp.act, h, n_tokens)?;
                pass.rec.add(xt, n_tokens * d, &y, n_tokens * d).map_err(gpu_err)
            }
            Ffn::Moe(moe) if strata_kernels::offload::takes_experts() && moe.latent.is_none() => {
                self.moe_gpu(pass, l, moe, xt, h, batch)
            }
            Ffn::Moe(moe) => {
                // Routing and the experts on the CPU (or through the offload with
                // --gpu-experts): the normed rows and the residual (the next layer's guess) go
                // back, the experts' sum comes up.
                let n = n_tokens * d;
                let got = pass.wait(batch, &[(h, 0, n), (xt, 0, n)])?;
                let next_block = self.next_moe(l);
                let next = next_moe_input(&next_block, self.eps).map(|(_, n)| n);
                let f = timed(&PHASES.moe_ns, || {
                    moe.forward(&got[0], n_tokens, &got[1], next, None)
                })?;
                let ft = pass.gpu.upload_tensor(&f).map_err(gpu_err)?;
                pass.rec.add(xt, n, &ft, n).map_err(gpu_err)
            }
        }
    }

    /// The final norm and the LM head of each sequence's rows (its last, or all with
    /// `all_logits`); the last wait of the pass.
    fn logits_gpu(
        &self,
        pass: &mut Pass<'_>,
        xt: &GpuTensor,
        batch: &mut [SeqInput<'_>],
    ) -> Result<Vec<Vec<f32>>> {
        let gpu = pass.gpu;
        let d = self.info.hidden_dim;
        let vocab = self.lm_head.out_dim;
        let mut rows = Vec::with_capacity(batch.len());
        let mut row = 0;
        for seq in batch.iter() {
            let n = seq.tokens.len();
            rows.push(if seq.all_logits {
                row..row + n
            } else {
                row + n.saturating_sub(1)..row + n
            });
            row += n;
        }
        let m: usize = rows.iter().map(|r| r.len()).sum();
        let xn = pass.tensor(m * d)?;
        let w = self.gpu_vector(gpu, usize::MAX, Role::Norm, &self.norm)?;
        let mut at = 0;
        for r in &rows {
            (pass
                .rec
                .rms_norm(xt, r.start * d, &w, &xn, at * d, r.len(), d, self.eps))
            .map_err(gpu_err)?;
            at += r.len();
        }
        let on_gpu = (m * vocab * 4) as u64 <= gpu.max_binding();
        let logits = if on_gpu {
            let y = pass.tensor(m * vocab)?;
            pass.product(&self.lm_head, &xn, m, &y)?;
            pass.wait(batch, &[(&y, 0, m * vocab)])?.remove(0)
        } else {
            let xs = pass.wait(batch, &[(&xn, 0, m * d)])?.remove(0);
            let mut y = vec![0f32; m * vocab];
            self.lm_head.matmul(&xs, m, &mut y);
            y
        };
        for seq in batch.iter_mut() {
            seq.cache.len += seq.tokens.len();
        }
        let mut out = Vec::with_capacity(batch.len());
        let mut at = 0;
        for r in &rows {
            out.push(logits[at * vocab..(at + r.len()) * vocab].to_vec());
            at += r.len();
        }
        Ok(out)
    }
}

fn same_rope(a: &Rope, b: &Rope) -> bool {
    a.dim == b.dim
        && a.style == b.style
        && a.attention_factor == b.attention_factor
        && a.inv_freq == b.inv_freq
}

/// Each new token's cosines then sines at its position (T x `rope.dim`).
fn rope_table(gpu: &Gpu, rope: &Rope, batch: &[SeqInput<'_>]) -> Result<GpuTensor> {
    let mut t = Vec::new();
    for seq in batch {
        for i in 0..seq.tokens.len() {
            let (cos, sin) = rope.cos_sin(seq.cache.len + i);
            t.extend_from_slice(&cos);
            t.extend_from_slice(&sin);
        }
    }
    gpu.upload_tensor(&t).map_err(gpu_err)
}

/// Layer cache `c`'s GPU copy with room for `n` more positions after `start` (rows of `width`),
/// made anew from the CPU rows when it is missing, shared or out of step; counted as holding
/// `start + n` (the recorded copies write them).
pub(crate) fn mirror<'c>(
    gpu: &Gpu,
    rec: &mut Recorder<'_>,
    c: &'c mut LayerCache,
    (width, v_width): (usize, usize),
    start: usize,
    n: usize,
) -> Result<&'c KvMirror> {
    if c.k.len() != start * width || c.v.len() != start * v_width {
        return Err(gpu_err(format!(
            "a KV cache of {} keys and {} values where {start} positions of {width} and {v_width} are due",
            c.k.len(),
            c.v.len()
        )));
    }
    let in_step = match c.gpu.0.as_mut() {
        Some(m) => Arc::get_mut(m).is_some_and(|m| m.synced == start),
        None => false,
    };
    if !in_step {
        let cap = (start + n).max(64).next_power_of_two();
        let (k, v) = (gpu.tensor(cap * width), gpu.tensor(cap * v_width));
        let (k, v) = (k.map_err(gpu_err)?, v.map_err(gpu_err)?);
        gpu.write_tensor(&k, 0, &c.k).map_err(gpu_err)?;
        gpu.write_tensor(&v, 0, &c.v).map_err(gpu_err)?;
        c.gpu.0 = Some(Arc::new(KvMirror {
            k,
            v,
            cap,
            synced: start,
        }));
    }
    let m = Arc::get_mut(c.gpu.0.as_mut().expect("made above")).expect("not shared");
    if start + n > m.cap {
        let cap = (start + n).next_power_of_two();
        let (k, v) = (gpu.tensor(cap * width), gpu.tensor(cap * v_width));
        let (k, v) = (k.map_err(gpu_err)?, v.map_err(gpu_err)?);
        rec.copy(&m.k, 0, &k, 0, start * width).map_err(gpu_err)?;
        rec.copy(&m.v, 0, &v, 0, start * v_width).map_err(gpu_err)?;
        (m.k, m.v, m.cap) = (k, v, cap);
    }
    m.synced = start + n;
    Ok(m)
}
