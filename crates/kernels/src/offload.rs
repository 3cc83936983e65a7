//! Matrix products on another device (the GPU backend, `strata-gpu`), installed once per
//! process. Every `matmul` of a weight whose format the device has kernels for runs there,
//! whatever the number of tokens, so each output's sum takes one fixed path (batch invariance)
//! and a streamed weight gives the bits of a resident one. A weight that owns its elements
//! (resident) is copied to the device at its first product and kept there while the budget has
//! room; a streamed one, or one past the budget, is copied for each product.
//!
//! Routed experts (marked [`Linear::routed_expert`]) go to the device only when it takes them
//! ([`Device::takes_experts`]), and then every time: an expert is copied at its first product
//! when the budget has room and stays there as long as its owner (the expert cache) keeps it;
//! one that finds no room is copied for each product, like a streamed weight. So where a
//! product runs never depends on what the cache or the budget held (batch invariance).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::Linear;

/// A device that holds weight matrices and multiplies activations with them.
pub trait Device: Send + Sync {
    /// A copy of `lin` in the device's memory; None when its format has no kernels there, or
    /// (`keep`: a copy kept for later products, counted against the budget) the budget has no
    /// room for it.
    fn upload(&self, lin: &Linear, keep: bool) -> Option<Box<dyn DeviceMatrix>>;

    /// Whether routed experts' products may run here (as kept copies only).
    fn takes_experts(&self) -> bool {
        false
    }

    /// Whether this device has kernels for `lin`'s format.
    fn supports(&self, lin: &Linear) -> bool;

    /// The bytes of a model's non-expert weights, told at its load: a device that keeps routed
    /// experts holds that much of its budget back from them, so the weights every token reads
    /// find room first whatever order their first products come in.
    fn hold_back_for_resident(&self, _bytes: u64) {}

    /// The device as its own type (for code that drives it directly, such as the GPU decoder).
    fn as_any(&self) -> &dyn std::any::Any;

    /// Runs `jobs` (matrices this device made) as one submission where it can: one wait for
    /// all of them. Each output gets the bits its lone product gives.
    fn matmul_group(&self, jobs: &mut [Job<'_>]) -> Result<(), String> {
        for j in jobs.iter_mut() {
            j.m.matmul(j.xs, j.tokens, j.ys)?;
        }
        Ok(())
    }
}

/// One matrix on a device: `ys` (T x out) for `xs` (T x in), as [`Linear::matmul`] lays them out.
pub trait DeviceMatrix: Send + Sync {
    fn matmul(&self, xs: &[f32], tokens: usize, ys: &mut [f32]) -> Result<(), String>;
    /// The matrix as its device's own type (for [`Device::matmul_group`]).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A weight's copy on the installed device: the kept one, or one made for a single use.
pub struct DeviceWeight<'a>(OnDevice<'a>);

impl DeviceWeight<'_> {
    pub fn matrix(&self) -> &dyn DeviceMatrix {
        self.0.get()
    }

    /// Whether the device keeps this copy (false: made for one use, past the budget).
    pub fn is_kept(&self) -> bool {
        matches!(self.0, OnDevice::Kept(_))
    }
}

/// A weight's copy on the device for one product.
enum OnDevice<'a> {
    Kept(&'a dyn DeviceMatrix),
    /// Made for this product only (a streamed weight, or one past the budget).
    Once(Box<dyn DeviceMatrix>),
}

impl OnDevice<'_> {
    fn get(&self) -> &dyn DeviceMatrix {
        match self {
            OnDevice::Kept(m) => *m,
            OnDevice::Once(m) => m.as_ref(),
        }
    }
}

/// One product of a group on the device.
pub struct Job<'a> {
    pub m: &'a dyn DeviceMatrix,
    pub xs: &'a [f32],
    pub tokens: usize,
    pub ys: &'a mut [f32],
}

/// One product of [`matmul_group`]: `ys` (T x out) = `lin` applied to `xs` (T x in).
pub struct Product<'a> {
    pub lin: &'a Linear,
    pub xs: &'a [f32],
    pub tokens: usize,
    pub ys: &'a mut [f32],
}

/// Runs independent products: those whose weights the installed device keeps go to it as one
/// submission (one round trip for all, instead of one each), the others through
/// [`Linear::matmul`]. Each output gets the bits its lone `matmul` gives.
pub fn matmul_group(products: &mut [Product<'_>]) {
    for p in products.iter() {
        assert_eq!(p.xs.len(), p.tokens * p.lin.in_dim, "matmul input is not (T, in)");
        assert_eq!(
            p.ys.len(),
            p.tokens * p.lin.out_dim,
            "matmul output is not (T, out)"
        );
    }
    let device = DEVICE.get();
    let copies: Vec<Option<OnDevice>> = products
        .iter()
        .map(|p| device.and_then(|d| p.lin.device_copy(d.as_ref())))
        .collect();
    let mut ok = true;
    if let Some(d) = device.filter(|_| copies.iter().any(Option::is_some)) {
        let mut jobs: Vec<Job<'_>> = products
            .iter_mut()
            .zip(&copies)
            .filter_map(|(p, c)| {
                c.as_ref().map(|c| {
                    p.lin.count_bytes();
                    Job {
                        m: c.get(),
                        xs: p.xs,
                        tokens: p.tokens,
                        ys: &mut *p.ys,
                    }
                })
            })
            .collect();
        if let Err(e) = d.matmul_group(&mut jobs) {
            warn_once(&e);
            ok = false;
        }
    }
    for (p, c) in products.iter().zip(&copies) {
        if c.is_none() {
            p.lin.count_bytes();
        }
    }
    // The rest on the CPU, side by side on the kernels' threads.
    let mut cpu: Vec<&mut Product<'_>> = products
        .iter_mut()
        .zip(&copies)
        .filter(|(_, c)| !ok || c.is_none())
        .map(|(p, _)| p)
        .collect();
    crate::for_each_chunk(&mut cpu, 1, |_, p| {
        let q = &mut *p[0];
        q.lin.matmul_cpu(q.xs, q.tokens, q.ys);
    });
}

/// Whether the installed device, if any, takes routed experts.
pub fn takes_experts() -> bool {
    DEVICE.get().is_some_and(|d| d.takes_experts())
}

static DEVICE: OnceLock<Arc<dyn Device>> = OnceLock::new();

/// Makes `device` the one every owned weight's products try first. Once per process: false when
/// one was installed already.
pub fn install(device: Arc<dyn Device>) -> bool {
    DEVICE.set(device).is_ok()
}

/// Whether a device is installed.
pub fn installed() -> bool {
    DEVICE.get().is_some()
}

/// The installed device, if any.
pub fn device() -> Option<&'static dyn Device> {
    DEVICE.get().map(|d| d.as_ref())
}

/// A weight's kept copy on the installed device, made at its first product.
#[derive(Clone, Default)]
pub struct DeviceCopy {
    kept: OnceLock<Option<Arc<dyn DeviceMatrix>>>,
    expert: bool,
}

impl fmt::Debug for DeviceCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match (self.expert, self.kept.get()) {
            (true, None) => "a routed expert, not on the device",
            (_, None) => "not kept",
            (_, Some(None)) => "copied per product",
            (_, Some(Some(_))) => "kept on the device",
        };
        f.write_str(state)
    }
}

static FAILED: AtomicBool = AtomicBool::new(false);
static EXPERT_HITS: AtomicU64 = AtomicU64::new(0);
static EXPERT_COPIES: AtomicU64 = AtomicU64::new(0);

/// Uses of routed experts' weights on the device so far: (found there, copied there first: kept
/// from then on while the budget has room, else for that use only).
pub fn expert_uses() -> (u64, u64) {
    (
        EXPERT_HITS.load(Ordering::Relaxed),
        EXPERT_COPIES.load(Ordering::Relaxed),
    )
}

/// Counts `n` uses of routed experts' weights found on the device by code that reads their
/// kept copies itself (the GPU decoder's layers whose experts all stay there).
pub fn count_expert_hits(n: u64) {
    EXPERT_HITS.fetch_add(n, Ordering::Relaxed);
}

impl Linear {
    /// Marks a routed expert's weight: on the device only as a kept copy (see the module).
    pub fn routed_expert(mut self) -> Linear {
        self.device.expert = true;
        self
    }

    /// Whether this is a routed expert's weight ([`Linear::routed_expert`]).
    pub fn is_routed_expert(&self) -> bool {
        self.device.expert
    }

    /// This weight's copy on `device` for a product: the one it keeps (made at the first
    /// product while the budget has room), else one made for this product only; None when the
    /// device has no kernels for its format (or takes no routed experts and this is one).
    fn device_copy<'a>(&'a self, device: &dyn Device) -> Option<OnDevice<'a>> {
        let expert = self.device.expert;
        if expert && !device.takes_experts() {
            return None;
        }
        if expert || !self.data.is_borrowed() {
            let mut copied = false;
            let kept = self.device.kept.get_or_init(|| {
                copied = true;
                device.upload(self, true).map(Arc::from)
            });
            if let Some(m) = kept.as_deref() {
                if expert {
                    let seen = if copied { &EXPERT_COPIES } else { &EXPERT_HITS };
                    seen.fetch_add(1, Ordering::Relaxed);
                }
                return Some(OnDevice::Kept(m));
            }
        }
        let once = device.upload(self, false).map(OnDevice::Once);
        if expert && once.is_some() {
            EXPERT_COPIES.fetch_add(1, Ordering::Relaxed);
        }
        once
    }

    /// This weight's copy on the installed device for code that records its products itself
    /// (the GPU decoder), counted as touched; None when no device takes it.
    pub fn on_device(&self) -> Option<DeviceWeight<'_>> {
        let copy = self.device_copy(DEVICE.get()?.as_ref())?;
        self.count_bytes();
        Some(DeviceWeight(copy))
    }

    /// Runs the product on the installed device when it takes this weight; false when the CPU
    /// must compute it.
    pub(crate) fn matmul_on_device(&self, xs: &[f32], tokens: usize, ys: &mut [f32]) -> bool {
        let Some(device) = DEVICE.get() else {
            return false;
        };
        match self.device_copy(device.as_ref()) {
            Some(c) => run(c.get(), xs, tokens, ys),
            None => false,
        }
    }
}

fn run(m: &dyn DeviceMatrix, xs: &[f32], tokens: usize, ys: &mut [f32]) -> bool {
    match m.matmul(xs, tokens, ys) {
        Ok(()) => true,
        Err(e) => {
            warn_once(&e);
            false
        }
    }
}

/// A device that fails mid-run (lost, out of memory) cannot keep the run going; the CPU computes
/// the product and says so once.
fn warn_once(e: &str) {
    if !FAILED.swap(true, Ordering::Relaxed) {
        eprintln!("warning: a product on the GPU failed ({e}); computing on the CPU");
    }
}
