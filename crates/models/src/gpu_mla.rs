//! Multi-head latent attention (DeepSeek-V3, Kimi K2) inside the GPU decoder, in the absorbed
//! form of `layers/mla.rs`: each head's query is turned into the latent space
//! (`W_uk^T q_nope`, then its rotated part) and attends to the cached `[c_kv | k_rope]` rows (its
//! values their `c_kv` part); the latent output goes through `W_uv` per head. Both per-head
//! matrices are `kv_b`'s rows decoded to f32 once per layer (as the CPU's products decode them),
//! kept in GPU memory beside the weights (for a Kimi K2 layer 32 MiB, outside `--gpu-mem`).

use std::sync::Arc;

use strata_gpu::{AttendShape, GpuTensor, Rotation};

use crate::decoder::{Decoder, SeqInput};
use crate::gpu_decoder::{gpu_err, mirror, KvRows, Pass, Role};
use crate::layers::mla::{MlaAttention, QueryProj};
use crate::layers::rope::RopeStyle;
use crate::Result;

impl Decoder {
    /// Layer `l`'s attention of the normed rows `h`: (T, D) in GPU memory. `table`: the
    /// rotary cosines and sines of the new tokens (None without rotation).
    pub(crate) fn mla_gpu(
        &self,
        pass: &mut Pass<'_>,
        l: usize,
        attn: &MlaAttention,
        h: &GpuTensor,
        table: Option<&GpuTensor>,
        batch: &mut [SeqInput<'_>],
    ) -> Result<GpuTensor> {
        let gpu = pass.gpu;
        let n_tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let (heads, nope, rd, vd, lora) = (
            attn.n_heads,
            attn.nope_dim,
            attn.rope_dim,
            attn.v_dim,
            attn.kv_lora,
        );
        let (qk, width) = (nope + rd, lora + rd);
        let q = pass.tensor(n_tokens * heads * qk)?;
        match &attn.q {
            QueryProj::Direct(w) => pass.product(w, h, n_tokens, &q)?,
            QueryProj::LowRank { a, norm, b } => {
                let qa = pass.tensor(n_tokens * a.out_dim)?;
                pass.product(a, h, n_tokens, &qa)?;
                let qn = pass.tensor(n_tokens * a.out_dim)?;
                let w = self.gpu_vector(gpu, l, Role::QNorm, norm)?;
                (pass
                    .rec
                    .rms_norm(&qa, 0, &w, &qn, 0, n_tokens, a.out_dim, attn.eps))
                .map_err(gpu_err)?;
                pass.product(b, &qn, n_tokens, &q)?;
            }
        }
        let kv = Arc::new(pass.tensor(n_tokens * width)?);
        pass.product(&attn.kv_a, h, n_tokens, &kv)?;
        let rotation = |offset| {
            let rope = attn.rope.as_ref()?;
            Some(Rotation {
                offset,
                dim: rd,
                interleaved: rope.style == RopeStyle::Interleaved,
                cos_sin: table?,
            })
        };
        if let Some(r) = rotation(nope) {
            pass.rec
                .norm_rope(&q, n_tokens, heads, qk, None, Some(r))
                .map_err(gpu_err)?;
        }
        let kv_norm = self.gpu_vector(gpu, l, Role::KNorm, &attn.kv_a_norm)?;
        let norm = Some((&*kv_norm, lora, attn.eps));
        (pass.rec.norm_rope(&kv, n_tokens, 1, width, norm, rotation(lora))).map_err(gpu_err)?;

        // Each head's query in the latent space, then its rotated part: (T, H, lora + rope).
        let (uk, uv) = self.absorbed(pass, l, attn)?;
        let q_lat = pass.tensor(n_tokens * heads * width)?;
        (pass
            .rec
            .head_matvec(&uk, &q, &q_lat, n_tokens, heads, (lora, nope), (qk, width), rd))
        .map_err(gpu_err)?;
        let lat = pass.tensor(n_tokens * heads * lora)?;
        let mut row = 0;
        for (i, seq) in batch.iter_mut().enumerate() {
            let n = seq.tokens.len();
            let start = seq.cache.len;
            let m = mirror(gpu, &mut pass.rec, &mut seq.cache.layers[l], (width, 0), start, n)?;
            (pass.rec.copy(&kv, row * width, &m.k, start * width, n * width)).map_err(gpu_err)?;
            let shape = AttendShape {
                heads,
                group: heads,
                head_dim: width,
                value_dim: lora,
                kv_width: width,
                row0: row,
                tokens: n,
                start_pos: start,
                window: None,
                scale: attn.softmax_scale,
            };
            pass.rec
                .attend(&lat, &q_lat, &m.k, &m.k, &shape)
                .map_err(gpu_err)?;
            pass.kv.push(KvRows {
                seq: i,
                layer: l,
                k: kv.clone(),
                v: None,
                at: row * width,
                len: n * width,
            });
            row += n;
        }
        let out = pass.tensor(n_tokens * heads * vd)?;
        (pass
            .rec
            .head_matvec(&uv, &lat, &out, n_tokens, heads, (vd, lora), (lora, vd), 0))
        .map_err(gpu_err)?;
        let y = pass.tensor(n_tokens * attn.o.out_dim)?;
        pass.product(&attn.o, &out, n_tokens, &y)?;
        Ok(y)
    }

    /// Layer `l`'s per-head `W_uk^T` (H, lora, nope) and `W_uv` (H, v, lora) in f32, made from
    /// `kv_b` at their first use.
    fn absorbed(
        &self,
        pass: &Pass<'_>,
        l: usize,
        attn: &MlaAttention,
    ) -> Result<(Arc<GpuTensor>, Arc<GpuTensor>)> {
        let (heads, nope, vd, lora) = (attn.n_heads, attn.nope_dim, attn.v_dim, attn.kv_lora);
        let make = || {
            let mut uk = vec![0f32; heads * lora * nope];
            let mut uv = vec![0f32; heads * vd * lora];
            let mut row = vec![0f32; lora];
            for h in 0..heads {
                let base = h * (nope + vd);
                for j in 0..nope {
                    attn.kv_b.decode_row(base + j, &mut row);
                    for (r, v) in row.iter().enumerate() {
                        uk[(h * lora + r) * nope + j] = *v;
                    }
                }
                for r in 0..vd {
                    attn.kv_b
                        .decode_row(base + nope + r, &mut uv[(h * vd + r) * lora..][..lora]);
                }
            }
            (uk, uv)
        };
        self.gpu_tensors(pass.gpu, l, (Role::Uk, Role::Uv), make)
    }
}
