//! A MoE layer whose every routed expert the GPU keeps: the expert cache holds the whole
//! model's experts and already has every one of this layer's ([`crate::ExpertStore::holds_layer`]),
//! and the GPU took all of them into its slabs. Then the GPU routes, lays out the experts'
//! products from its own routing table ([`strata_gpu::ResidentExperts`]) and runs them, so the
//! layer records into the step's submission with no wait: a decoded token whose MoE layers are
//! all like this crosses the bus once, for its logits. The routes go back with the step's last
//! wait, where the experts' uses are counted.
//!
//! Each output has the bits the layer's other form gives it (the same products, gathered rows
//! and sums; `STRATA_GPU_RESIDENT=0` turns this form off, and the tests compare the two).

use std::sync::Arc;

use strata_gpu::{GpuMatrix, GpuTensor, ResidentExperts, Routing};
use strata_weights::Expert;

use crate::decoder::Decoder;
use crate::gpu_decoder::{glu_of, gpu_err, Pass};
use crate::gpu_moe::sum_into_residual;
use crate::layers::moe::MoeLayer;
use crate::{ModelError, Result};

/// A layer's experts as the GPU keeps them, and the experts themselves (held, so their GPU
/// copies stay as long as this does).
pub(crate) struct ResidentLayer {
    experts: ResidentExperts,
    /// Bytes of one expert's three matrices.
    expert_bytes: u64,
    _held: Vec<Arc<Expert>>,
}

/// A step's routes of a resident layer, read back at the step's next wait.
pub(crate) struct RoutesBack {
    pub(crate) routes: GpuTensor,
    pub(crate) tokens: usize,
    pub(crate) k: usize,
    /// Bytes of one expert's three matrices.
    pub(crate) expert_bytes: u64,
}

impl RoutesBack {
    /// Distinct experts among the routes read back (`values`: (expert id bits, weight) pairs).
    pub(crate) fn distinct(values: &[f32]) -> usize {
        let mut ids: Vec<u32> = values.chunks_exact(2).map(|p| p[0].to_bits()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }
}

impl Decoder {
    /// `moe`'s resident form for a step of `n_tokens` tokens: made at the first step where the
    /// store holds the layer, then kept (None for good where the GPU could not take every
    /// expert into its slabs).
    pub(crate) fn resident_layer(
        &self,
        pass: &Pass<'_>,
        moe: &MoeLayer,
        n_tokens: usize,
    ) -> Result<Option<Arc<ResidentLayer>>> {
        if !pass.off.resident_layers_on() || n_tokens * moe.router.top_k > strata_gpu::MAX_ROUTED_ROWS {
            return Ok(None);
        }
        if let Some(made) = self.gpu_resident_get(moe.layer) {
            return Ok(made);
        }
        if !moe.store.holds_layer(moe.layer) {
            return Ok(None);
        }
        let made = self.make_resident(pass, moe)?.map(Arc::new);
        if made.is_some() {
            pass.off.count_resident_layer();
        }
        self.gpu_resident_put(moe.layer, made.clone());
        Ok(made)
    }

    fn make_resident(&self, pass: &Pass<'_>, moe: &MoeLayer) -> Result<Option<ResidentLayer>> {
        let n = moe.router.weight.out_dim;
        let ids: Vec<usize> = (0..n).collect();
        let held = moe
            .store
            .get(moe.layer, &ids)
            .map_err(|cause| ModelError::Experts {
                layer: moe.layer,
                cause,
            })?;
        let (d, f) = (self.info.hidden_dim, self.inter_dim()?);
        // Each matrix's kept GPU copy (made now where it is not there yet).
        let mut copies = Vec::with_capacity(3 * n);
        for e in &held {
            let (g, u, dn) = (&e.gate, &e.up, &e.down);
            if (g.out_dim, g.in_dim, u.out_dim, u.in_dim) != (f, d, f, d) || (dn.out_dim, dn.in_dim) != (d, f)
            {
                return Ok(None);
            }
            for lin in [g, u, dn] {
                match lin.on_device() {
                    Some(c) if c.is_kept() => copies.push(c),
                    _ => return Ok(None),
                }
            }
        }
        let mut mats: [Vec<&GpuMatrix>; 3] = Default::default();
        for (i, c) in copies.iter().enumerate() {
            match pass.off.kept_matrix(c.matrix()) {
                Some(m) => mats[i % 3].push(m),
                None => return Ok(None),
            }
        }
        let experts = ResidentExperts::new(pass.gpu, [&mats[0], &mats[1], &mats[2]]).map_err(gpu_err)?;
        drop(mats);
        drop(copies);
        let expert_bytes = held[0].gate.bytes() + held[0].up.bytes() + held[0].down.bytes();
        Ok(experts.map(|experts| ResidentLayer {
            experts,
            expert_bytes: expert_bytes as u64,
            _held: held,
        }))
    }

    /// The routed experts' inner width.
    pub(crate) fn inter_dim(&self) -> Result<usize> {
        match &self.info.experts {
            Some(layout) => Ok(layout.inter_dim),
            None => Err(gpu_err("a MoE layer in a model without an expert layout")),
        }
    }

    /// `moe` on the normed rows `h` (T, D), added to the residual `xt`, from the GPU's `routes`
    /// of the step: everything recorded, nothing waited for.
    pub(crate) fn moe_resident(
        &self,
        pass: &mut Pass<'_>,
        moe: &MoeLayer,
        layer: &ResidentLayer,
        (xt, h): (&GpuTensor, &GpuTensor),
        routes: GpuTensor,
        n_tokens: usize,
    ) -> Result<()> {
        let (d, f) = (self.info.hidden_dim, self.inter_dim()?);
        let (k, n) = (moe.router.top_k, moe.router.weight.out_dim);
        let shared = self.shared_expert_gpu(pass, moe, h, n_tokens)?;
        let rows = n_tokens * k;
        let table = pass.tensor(Routing::table_len(n_tokens, k, n))?;
        let shape = (n_tokens, k, n);
        let routing = pass
            .rec
            .route_table(&routes, shape, table, vec![0, rows])
            .map_err(gpu_err)?;
        let xe = pass.tensor(rows * d)?;
        pass.rec.gather_routed(h, &routing, d, &xe).map_err(gpu_err)?;
        let res = &layer.experts;
        let items = pass.rec.resident_items(res, &routing, k).map_err(gpu_err)?;
        let (g, u) = (pass.tensor(rows * f)?, pass.tensor(rows * f)?);
        pass.rec
            .resident_product(res, &items, 0, &xe, &g)
            .map_err(gpu_err)?;
        pass.rec
            .resident_product(res, &items, 1, &xe, &u)
            .map_err(gpu_err)?;
        pass.rec.glu(&g, &u, rows * f, glu_of(moe.act)).map_err(gpu_err)?;
        let ys = pass.tensor(rows * d)?;
        pass.rec
            .resident_product(res, &items, 2, &g, &ys)
            .map_err(gpu_err)?;
        sum_into_residual(pass, (&ys, &routing), shared.as_ref(), xt, d)?;
        pass.routes_back.push(RoutesBack {
            routes,
            tokens: n_tokens,
            k,
            expert_bytes: layer.expert_bytes,
        });
        Ok(())
    }
}
