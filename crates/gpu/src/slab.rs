//! Routed experts' kept weights in shared GPU buffers ("slabs") of equal slots, one matrix a
//! slot: the experts of one shape then sit in a few buffers, so one dispatch can run the
//! products of every routed expert of a layer whose matrices share a slab
//! ([`crate::Recorder::matmul_experts`]) instead of one dispatch (and one barrier) per expert.
//!
//! A slab holds the slots of one size. The first slab of a size holds 512 MiB of slots, each
//! later one as many slots as all the earlier ones of that size together, up to a binding's
//! bytes and 1 GiB (and halved until the budget grants it): a layer's experts then lie in a few
//! slabs, so its grouped products take few dispatches, and the memory reserved ahead of use
//! stays within 512 MiB or twice what is used. A slot goes back to its slab
//! when the matrix in it goes; a slab that holds nothing is dropped (its bytes go back to the
//! budget) when a new slab finds no room.

use std::sync::{Arc, Mutex};

use crate::matrix::RecordedKey;
use crate::{Gpu, GpuError};

/// The most bytes one slab takes.
const SLAB_MOST: u64 = 1 << 30;
/// The bytes of the first slab of a size.
const FIRST_BYTES: u64 = 512 << 20;
/// The most slots one slab holds.
const SLOTS_MOST: u64 = 1024;

/// A reservation of bytes against a budget, given back when dropped.
pub(crate) type Reservation = Box<dyn Send + Sync>;

/// Every slab of one GPU.
#[derive(Default)]
pub(crate) struct Slabs {
    slabs: Mutex<Vec<Arc<Slab>>>,
}

pub(crate) struct Slab {
    pub(crate) buffer: wgpu::Buffer,
    slot_bytes: u64,
    slots: u32,
    free: Mutex<Vec<u32>>,
    /// Bind groups recorded with this buffer (`Chunk::recorded`), shared by its slots.
    pub(crate) recorded: Arc<Mutex<Vec<(RecordedKey, wgpu::BindGroup)>>>,
    _reserved: Reservation,
}

impl Slab {
    pub(crate) fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }
}

/// One slot of a slab, back in its slab's free list when dropped.
pub(crate) struct Slot {
    pub(crate) slab: Arc<Slab>,
    index: u32,
}

impl Slot {
    /// The slot's first byte in its slab's buffer.
    pub(crate) fn base(&self) -> u64 {
        u64::from(self.index) * self.slab.slot_bytes
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut free = self.slab.free.lock().unwrap_or_else(|e| e.into_inner());
        free.push(self.index);
    }
}

impl Slabs {
    /// A slot of `bytes` (a multiple of 16): a free one of a slab of that size, or one of a new
    /// slab whose bytes `reserve` grants. None when it grants none, even for a lone slot.
    pub(crate) fn place(
        &self,
        gpu: &Gpu,
        bytes: u64,
        reserve: &dyn Fn(u64) -> Option<Reservation>,
    ) -> Result<Option<Slot>, GpuError> {
        let most_bytes = gpu.binding_limit.min(SLAB_MOST);
        if bytes == 0 || bytes > most_bytes || !bytes.is_multiple_of(16) {
            return Ok(None);
        }
        let mut slabs = self.slabs.lock().unwrap_or_else(|e| e.into_inner());
        for slab in slabs.iter().filter(|s| s.slot_bytes == bytes) {
            let index = slab.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
            if let Some(index) = index {
                return Ok(Some(Slot {
                    slab: slab.clone(),
                    index,
                }));
            }
        }
        let before: u64 = slabs
            .iter()
            .filter(|s| s.slot_bytes == bytes)
            .map(|s| u64::from(s.slots))
            .sum();
        let first = (FIRST_BYTES / bytes).max(1);
        let mut want = if before == 0 { first } else { before }
            .clamp(1, SLOTS_MOST)
            .min(most_bytes / bytes);
        let mut pruned = false;
        let (slots, reserved) = loop {
            if let Some(r) = reserve(want * bytes) {
                break (want, r);
            }
            if !pruned {
                // Slabs that hold nothing give their bytes back first (and the kept bind groups
                // that name them go).
                let before = slabs.len();
                slabs.retain(|s| Arc::strong_count(s) > 1);
                if slabs.len() < before {
                    gpu.binds.lock().unwrap_or_else(|e| e.into_inner()).forget();
                }
                pruned = true;
                continue;
            }
            if want == 1 {
                return Ok(None);
            }
            want /= 2;
        };
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("expert slab"),
            size: slots * bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Run {
                what: format!("making an expert slab of {} bytes", slots * bytes),
                reason: e.to_string(),
            });
        }
        let slab = Arc::new(Slab {
            buffer,
            slot_bytes: bytes,
            slots: slots as u32,
            free: Mutex::new((1..slots as u32).rev().collect()),
            recorded: Arc::default(),
            _reserved: reserved,
        });
        slabs.push(slab.clone());
        Ok(Some(Slot { slab, index: 0 }))
    }
}
