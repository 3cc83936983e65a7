//! The GPU as the device of `strata_kernels::offload`: weights of the formats with GPU kernels
//! are kept in GPU memory from their first product up to a byte budget; the others (streamed,
//! past the budget) are copied for each product. With `experts`, routed experts run here too,
//! kept while the budget has room for as long as the expert cache keeps them (a kept copy gives
//! its bytes back to the budget when it is dropped; a VRAM tier inside the RAM one), copied for
//! each product otherwise.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use strata_kernels::offload::{Device, DeviceMatrix, Job};
use strata_kernels::{Linear, WeightData};

use crate::matrix::{Target, WeightFormat};
use crate::slab::Reservation;
use crate::{Gpu, GpuError, GpuMatrix};

/// The GPU with its budget for weights and its counters.
pub struct Offload {
    gpu: Arc<Gpu>,
    budget: u64,
    used: Arc<AtomicU64>,
    /// Set at an allocation the device refused: nothing more is kept until a kept copy goes.
    full: Arc<AtomicBool>,
    /// Whether routed experts run here (`--gpu-experts`).
    experts: bool,
    products: Arc<AtomicU64>,
    expert_products: Arc<AtomicU64>,
    /// Bytes copied for one product only (streamed weights, weights past the budget).
    streamed: AtomicU64,
    /// The model's non-expert bytes ([`Device::hold_back_for_resident`]), and those kept so
    /// far: routed experts leave the difference of the budget free.
    resident_want: AtomicU64,
    resident_used: Arc<AtomicU64>,
    resident_layers: AtomicU64,
    /// Whether MoE layers whose every expert is kept here lay out their products here
    /// (`STRATA_GPU_RESIDENT=0`: off).
    resident_on: AtomicBool,
}

impl Offload {
    /// `budget`: bytes of weights the GPU may hold (`--gpu-mem`); None: until an allocation
    /// fails.
    /// `experts`: routed experts' products run here too, from copies kept within the budget.
    pub fn new(gpu: Gpu, budget: Option<u64>, experts: bool) -> Offload {
        Offload {
            gpu: Arc::new(gpu),
            budget: budget.unwrap_or(u64::MAX),
            used: Arc::default(),
            full: Arc::default(),
            experts,
            products: Arc::new(AtomicU64::new(0)),
            expert_products: Arc::new(AtomicU64::new(0)),
            streamed: AtomicU64::new(0),
            resident_want: AtomicU64::new(0),
            resident_used: Arc::default(),
            resident_layers: AtomicU64::new(0),
            resident_on: AtomicBool::new(!std::env::var("STRATA_GPU_RESIDENT").is_ok_and(|v| v == "0")),
        }
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The GPU of the installed device, when it is this backend.
    pub fn installed() -> Option<&'static Offload> {
        strata_kernels::offload::device()?
            .as_any()
            .downcast_ref::<Offload>()
    }

    /// The matrix behind one of this device's copies ([`Linear::on_device`]), counted as a
    /// product run here.
    pub fn matrix<'a>(&self, m: &'a dyn DeviceMatrix) -> Option<&'a GpuMatrix> {
        let r = m.as_any().downcast_ref::<Resident>()?;
        r.products.fetch_add(1, Ordering::Relaxed);
        Some(&r.m)
    }

    /// [`Offload::matrix`] without counting a product.
    pub fn kept_matrix<'a>(&self, m: &'a dyn DeviceMatrix) -> Option<&'a GpuMatrix> {
        Some(&m.as_any().downcast_ref::<Resident>()?.m)
    }

    /// Counts a MoE layer whose every expert the GPU keeps and lays out itself (the GPU
    /// decoder's resident layers).
    pub fn count_resident_layer(&self) {
        self.resident_layers.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether MoE layers whose every expert is kept here lay out their products here (the
    /// GPU decoder's resident layers; on unless `STRATA_GPU_RESIDENT=0`).
    pub fn resident_layers_on(&self) -> bool {
        self.resident_on.load(Ordering::Relaxed)
    }

    /// Turns resident layers on or off for the models' next steps (tests compare the two forms).
    pub fn set_resident_layers(&self, on: bool) {
        self.resident_on.store(on, Ordering::Relaxed);
    }

    /// MoE layers made resident so far ([`Offload::count_resident_layer`]).
    pub fn resident_layers(&self) -> u64 {
        self.resident_layers.load(Ordering::Relaxed)
    }

    /// Counts `n` routed experts' products run on the GPU by code that laid them out there.
    pub fn count_expert_products(&self, n: u64) {
        self.expert_products.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes of weights uploaded so far.
    pub fn resident_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes of weights copied for one product only, so far.
    pub fn streamed_bytes(&self) -> u64 {
        self.streamed.load(Ordering::Relaxed)
    }

    /// Products run on the GPU so far (routed experts' included).
    pub fn products(&self) -> u64 {
        self.products.load(Ordering::Relaxed) + self.expert_products()
    }

    /// Routed experts' products run on the GPU so far.
    pub fn expert_products(&self) -> u64 {
        self.expert_products.load(Ordering::Relaxed)
    }

    /// Takes `bytes` of the budget; a routed expert's (`expert`) only where what is left still
    /// holds the non-expert weights not kept yet. A copy for one product takes none.
    fn reserve(&self, bytes: u64, expert: bool) -> bool {
        if bytes == 0 {
            return true;
        }
        let held = match expert {
            true => {
                let want = self.resident_want.load(Ordering::Relaxed);
                want.saturating_sub(self.resident_used.load(Ordering::Relaxed))
            }
            false => 0,
        };
        let ok = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_add(bytes)
                    .filter(|&n| n.saturating_add(held) <= self.budget)
            })
            .is_ok();
        if ok && !expert {
            self.resident_used.fetch_add(bytes, Ordering::Relaxed);
        }
        ok
    }
}

impl Offload {
    /// A kept routed expert in a slab slot ([`crate::slab`]); None where it found no slot
    /// (no room in the budget, or a matrix of several chunks); Err: the device refused memory.
    fn upload_to_slot(&self, lin: &Linear) -> Result<Option<Resident>, GpuError> {
        let reserve = |bytes: u64| -> Option<Reservation> {
            self.reserve(bytes, true).then(|| {
                Box::new(Lease {
                    bytes,
                    used: self.used.clone(),
                    full: self.full.clone(),
                    resident: None,
                }) as Reservation
            })
        };
        let Some(m) = self
            .gpu
            .upload_weights_to(&lin.data, lin.in_dim, Target::Slot(&reserve))
        else {
            return Ok(None);
        };
        Ok(m?.map(|m| Resident {
            gpu: self.gpu.clone(),
            m,
            products: self.expert_products.clone(),
            // The slab holds the budget's bytes.
            _lease: Lease {
                bytes: 0,
                used: self.used.clone(),
                full: self.full.clone(),
                resident: None,
            },
        }))
    }
}

impl Device for Offload {
    fn upload(&self, lin: &Linear, keep: bool) -> Option<Box<dyn DeviceMatrix>> {
        if !supported(&lin.data) || (keep && self.full.load(Ordering::Relaxed)) {
            return None;
        }
        if keep && lin.is_routed_expert() {
            match self.upload_to_slot(lin) {
                Ok(Some(r)) => return Some(Box::new(r)),
                Ok(None) => {}
                Err(_) => {
                    self.full.store(true, Ordering::Relaxed);
                    return None;
                }
            }
        }
        let bytes = if keep { lin.bytes() as u64 } else { 0 };
        let expert = lin.is_routed_expert();
        if !self.reserve(bytes, expert) {
            return None;
        }
        if !keep {
            self.streamed.fetch_add(lin.bytes() as u64, Ordering::Relaxed);
        }
        let g = &self.gpu;
        let scope = g.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let m = g.upload_weights(&lin.data, lin.in_dim).expect("checked above");
        let refused = pollster::block_on(scope.pop()).is_some();
        let counter = if lin.is_routed_expert() {
            &self.expert_products
        } else {
            &self.products
        };
        match m {
            Ok(m) if !refused => Some(Box::new(Resident {
                gpu: self.gpu.clone(),
                m,
                products: counter.clone(),
                _lease: Lease {
                    bytes,
                    used: self.used.clone(),
                    full: self.full.clone(),
                    resident: (!expert).then(|| self.resident_used.clone()),
                },
            })),
            _ => {
                self.used.fetch_sub(bytes, Ordering::Relaxed);
                if !expert {
                    self.resident_used.fetch_sub(bytes, Ordering::Relaxed);
                }
                if refused && keep {
                    self.full.store(true, Ordering::Relaxed);
                }
                None
            }
        }
    }

    fn takes_experts(&self) -> bool {
        self.experts
    }

    fn hold_back_for_resident(&self, bytes: u64) {
        self.resident_want.store(bytes, Ordering::Relaxed);
    }

    fn supports(&self, lin: &Linear) -> bool {
        supported(&lin.data)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn matmul_group(&self, jobs: &mut [Job<'_>]) -> Result<(), String> {
        let mats: Option<Vec<&Resident>> = jobs
            .iter()
            .map(|j| j.m.as_any().downcast_ref::<Resident>())
            .collect();
        let Some(mats) = mats else {
            return Err("a matrix of another device in a GPU group".into());
        };
        let args: Vec<(&GpuMatrix, &[f32], usize)> = mats
            .iter()
            .zip(jobs.iter())
            .map(|(r, j)| (&r.m, j.xs, j.tokens))
            .collect();
        let outs = self.gpu.matmul_many(&args).map_err(|e| e.to_string())?;
        for ((j, r), out) in jobs.iter_mut().zip(&mats).zip(outs) {
            if out.len() != j.ys.len() {
                return Err(format!("{} outputs for {} places", out.len(), j.ys.len()));
            }
            j.ys.copy_from_slice(&out);
            r.products.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// A kept copy's bytes of the budget, given back when the copy goes.
struct Lease {
    bytes: u64,
    used: Arc<AtomicU64>,
    full: Arc<AtomicBool>,
    /// The non-expert weights' count the bytes are in too.
    resident: Option<Arc<AtomicU64>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.used.fetch_sub(self.bytes, Ordering::Relaxed);
            if let Some(r) = &self.resident {
                r.fetch_sub(self.bytes, Ordering::Relaxed);
            }
            self.full.store(false, Ordering::Relaxed);
        }
    }
}

/// Whether the GPU has kernels for `data`'s format.
fn supported(data: &WeightData) -> bool {
    !matches!(data, WeightData::Q8_0 { .. } | WeightData::Ggml { .. })
}

impl Gpu {
    /// Uploads a weight in the format the CPU holds it; None for formats without GPU kernels
    /// (GGUF's block types, for now).
    pub fn upload_weights(&self, data: &WeightData, in_dim: usize) -> Option<Result<GpuMatrix, GpuError>> {
        let m = self.upload_weights_to(data, in_dim, Target::Own)?;
        Some(m.map(|m| m.expect("own buffers always take a chunk")))
    }

    /// Uploads a routed expert's weight into a slot of the GPU's expert slabs, as the offload
    /// keeps experts (no budget here), or into buffers of its own where no slot takes it (a
    /// matrix of several chunks); None for formats without GPU kernels.
    pub fn upload_expert(&self, data: &WeightData, in_dim: usize) -> Option<Result<GpuMatrix, GpuError>> {
        let unbounded = |_: u64| Some(Box::new(()) as Reservation);
        match self.upload_weights_to(data, in_dim, Target::Slot(&unbounded))? {
            Ok(Some(m)) => Some(Ok(m)),
            Ok(None) => self.upload_weights(data, in_dim),
            Err(e) => Some(Err(e)),
        }
    }

    /// [`Gpu::upload_weights`] to `target`; `Ok(None)`: the target had no room for it.
    pub(crate) fn upload_weights_to(
        &self,
        data: &WeightData,
        in_dim: usize,
        target: Target<'_>,
    ) -> Option<Result<Option<GpuMatrix>, GpuError>> {
        use crate::matrix::le_bytes;
        Some(match data {
            WeightData::Bf16(w) => self.upload(WeightFormat::Bf16, &le_bytes(w), w.len(), in_dim, target),
            WeightData::F16(w) => self.upload(WeightFormat::F16, &le_bytes(w), w.len(), in_dim, target),
            WeightData::F32(w) => self.upload(WeightFormat::F32, &le_bytes(w), w.len(), in_dim, target),
            WeightData::Int8 { w, scales } => self.int8_to(w, scales, in_dim, target),
            WeightData::Fp8 { w, scales, block } => self.fp8_to(w, scales, *block, in_dim, target),
            WeightData::Int4 {
                packed,
                scales,
                group,
            } => self.int4_to(packed, scales, *group, in_dim, target),
            WeightData::Mxfp4 { packed, scales } => self.mxfp4_to(packed, scales, in_dim, target),
            WeightData::Q8_0 { .. } | WeightData::Ggml { .. } => return None,
        })
    }
}

struct Resident {
    gpu: Arc<Gpu>,
    m: GpuMatrix,
    products: Arc<AtomicU64>,
    /// Gives the copy's bytes back to the budget when it goes.
    _lease: Lease,
}

impl DeviceMatrix for Resident {
    fn matmul(&self, xs: &[f32], tokens: usize, ys: &mut [f32]) -> Result<(), String> {
        let out = self.gpu.matmul(&self.m, xs, tokens).map_err(|e| e.to_string())?;
        if out.len() != ys.len() {
            return Err(format!("{} outputs for {} places", out.len(), ys.len()));
        }
        ys.copy_from_slice(&out);
        self.products.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
