//! Weight copies from host memory into GPU buffers through staging buffers that are kept and
//! reused. A write through the queue (`Queue::write_buffer`) takes fresh mappable memory for each
//! copy, whose pages the host then touches for the first time: on the H100 machine that ran at
//! 4.3-5.0 GB/s against a link that copies at about 50 GB/s. Here a copy goes into a staging buffer
//! already mapped (its pages touched by an earlier copy), the GPU copies it into place, and the
//! buffer is mapped again for a later copy once that copy ran.
//!
//! The copy is submitted at once, so like a queue write it lands before any work submitted
//! after the call. A write larger than a staging buffer goes a staging buffer's bytes at a time.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::{Gpu, GpuError};

/// Bytes of one staging buffer.
pub(crate) const STAGING_BYTES: u64 = 16 << 20;
/// Staging buffers one GPU keeps at most (in use by copies in flight, or free).
const STAGING_MOST: usize = 8;

/// A pending buffer's mapping: under way, done, or failed (the buffer is then dropped).
const MAPPING: u8 = 0;
const MAPPED: u8 = 1;
const FAILED: u8 = 2;

/// The staging buffers of one GPU: free ones (mapped, ready to write) and those whose copy or
/// mapping is still under way.
#[derive(Default)]
pub(crate) struct Staging {
    free: Mutex<Vec<wgpu::Buffer>>,
    pending: Mutex<Vec<(wgpu::Buffer, Arc<AtomicU8>)>>,
    /// Buffers that exist: free, pending, or being written by a caller.
    made: AtomicUsize,
}

impl Staging {
    /// A mapped buffer: a free one, else a new one while there are fewer than the most, else
    /// the next whose mapping completes (waiting on the device).
    fn take(&self, gpu: &Gpu) -> Result<wgpu::Buffer, GpuError> {
        loop {
            self.collect();
            if let Some(b) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
                return Ok(b);
            }
            let room = self
                .made
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < STAGING_MOST).then_some(n + 1)
                })
                .is_ok();
            if room {
                return Ok(gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("weight staging"),
                    size: STAGING_BYTES,
                    usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: true,
                }));
            }
            gpu.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| GpuError::Run {
                    what: "waiting for a staging buffer".into(),
                    reason: e.to_string(),
                })?;
        }
    }

    /// Moves the buffers whose mapping completed to the free list, and drops those whose
    /// mapping failed.
    fn collect(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        pending.retain(|(b, state)| match state.load(Ordering::Acquire) {
            MAPPING => true,
            MAPPED => {
                free.push(b.clone());
                false
            }
            _ => {
                self.made.fetch_sub(1, Ordering::AcqRel);
                false
            }
        });
    }

    /// `buffer` back, to be mapped again once the GPU's copy from it ran.
    fn give_back(&self, buffer: wgpu::Buffer) {
        let state = Arc::new(AtomicU8::new(MAPPING));
        let flag = state.clone();
        buffer.slice(..).map_async(wgpu::MapMode::Write, move |r| {
            flag.store(if r.is_ok() { MAPPED } else { FAILED }, Ordering::Release);
        });
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((buffer, state));
    }
}

impl Gpu {
    /// Writes `parts` into `dst` from byte `at` through staging buffers, a staging buffer's
    /// bytes at a time: each part from a 16-byte word after the one before, the gaps and the
    /// rest of the `size` bytes zeroed, as in fresh memory.
    pub(crate) fn staged_write(
        &self,
        dst: &wgpu::Buffer,
        at: u64,
        size: u64,
        parts: &[&[u8]],
    ) -> Result<(), GpuError> {
        // Each part's first byte.
        let mut starts = Vec::with_capacity(parts.len());
        let mut laid = 0u64;
        for p in parts {
            starts.push(laid);
            laid += (p.len() as u64).next_multiple_of(16);
        }
        if laid > size || !size.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
            return Err(GpuError::Shape(format!(
                "{laid} bytes of weights laid out in a copy of {size}"
            )));
        }
        let mut piece = 0u64;
        while piece < size {
            let n = STAGING_BYTES.min(size - piece);
            let buffer = self.staging.take(self)?;
            {
                let mut view = buffer
                    .slice(..n)
                    .get_mapped_range_mut()
                    .map_err(|e| GpuError::Run {
                        what: "writing weights into a staging buffer".into(),
                        reason: e.to_string(),
                    })?;
                // Bytes [piece, piece + n) of the laid-out parts, through a cursor.
                let mut cursor = 0usize;
                for (p, &start) in parts.iter().zip(&starts) {
                    let (from, to) = (start.max(piece), (start + p.len() as u64).min(piece + n));
                    if from >= to {
                        continue;
                    }
                    let (v0, v1) = ((from - piece) as usize, (to - piece) as usize);
                    view.slice(cursor..v0).fill(0);
                    view.slice(v0..v1)
                        .copy_from_slice(&p[(from - start) as usize..(to - start) as usize]);
                    cursor = v1;
                }
                view.slice(cursor..).fill(0);
            }
            buffer.unmap();
            let mut enc = self.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&buffer, 0, dst, at + piece, n);
            self.queue.submit([enc.finish()]);
            self.staging.give_back(buffer);
            piece += n;
        }
        Ok(())
    }
}
