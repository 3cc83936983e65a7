//! Matrix products on another device (the GPU backend, `strata-gpu`), installed once per
//! process. Every `matmul` of a weight whose format the device has kernels for runs there,
//! whatever the number of tokens, so each output's sum takes one fixed path (batch invariance)
//! and a streamed weight gives the bits of a resident one. A weight that owns its elements
//! (resident) is copied to the device at its first product and kept there while the budget has
//! room; a streamed one, or one past the budget, is copied for each product.
//!
//! Routed experts (marked [`Linear::routed_expert`]) go to the device only when it takes them
//! ([`Device::takes_experts`]) and only as kept copies: an expert is copied at its first product
//! when the budget has room and stays there as long as its owner (the expert cache) keeps it;
//! one that finds no room is computed on the CPU, never copied for one product.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
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
}

/// One matrix on a device: `ys` (T x out) for `xs` (T x in), as [`Linear::matmul`] lays them out.
pub trait DeviceMatrix: Send + Sync {
    fn matmul(&self, xs: &[f32], tokens: usize, ys: &mut [f32]) -> Result<(), String>;
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

    /// Runs the product on the installed device when it takes this weight; false when the CPU
    /// must compute it.
    pub(crate) fn matmul_on_device(&self, xs: &[f32], tokens: usize, ys: &mut [f32]) -> bool {
        let Some(device) = DEVICE.get() else {
            return false;
        };
        if self.device.expert {
            if !device.takes_experts() {
                return false;
            }
            let kept = self
                .device
                .kept
                .get_or_init(|| device.upload(self, true).map(Arc::from));
            return kept.as_ref().is_some_and(|m| run(m.as_ref(), xs, tokens, ys));
        }
        if !self.data.is_borrowed() {
            let kept = self
                .device
                .kept
                .get_or_init(|| device.upload(self, true).map(Arc::from));
            if let Some(m) = kept {
                return run(m.as_ref(), xs, tokens, ys);
            }
        }
        match device.upload(self, false) {
            Some(m) => run(m.as_ref(), xs, tokens, ys),
            None => false,
        }
    }
}

fn run(m: &dyn DeviceMatrix, xs: &[f32], tokens: usize, ys: &mut [f32]) -> bool {
    match m.matmul(xs, tokens, ys) {
        Ok(()) => true,
        Err(e) => {
            // A device that fails mid-run (lost, out of memory) cannot keep the run going; the
            // CPU computes this product and says so once.
            if !FAILED.swap(true, Ordering::Relaxed) {
                eprintln!("warning: a product on the GPU failed ({e}); computing on the CPU");
            }
            false
        }
    }
}
