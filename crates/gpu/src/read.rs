//! The GPU memory's own read rate, measured the way the products read weights (passes over a
//! buffer), and the host-to-GPU link's copy rate, so a product's rate and an upload's can be
//! set beside them in one run.

use wgpu::util::DeviceExt;

use crate::matrix::entry;
use crate::{Gpu, GpuError};

const WORKGROUP: usize = 256;
/// vec4 words each invocation reads.
const PER_INVOCATION: usize = 16;
/// Passes over the buffer per submission (so a submission's own cost is a small part).
const PASSES: usize = 4;

impl Gpu {
    /// Bytes per second read from a buffer of `bytes` (rounded down to 16-byte words, at most
    /// one binding), best of `reps` submissions of four passes each, after a warm-up.
    pub fn read_rate(&self, bytes: u64, reps: usize) -> Result<f64, GpuError> {
        let bytes = bytes.min(self.max_binding) / 16 * 16;
        let words = (bytes / 16) as usize;
        if words == 0 {
            return Err(GpuError::Shape("a read of less than 16 bytes".into()));
        }
        let src = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read source"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let sink = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read sink"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let invocations = words.div_ceil(PER_INVOCATION);
        let groups = invocations.div_ceil(WORKGROUP);
        let gx = groups.min(65535);
        let gy = groups.div_ceil(gx);
        let per_inv = words.div_ceil(gx * gy * WORKGROUP);
        let mut prm = [0u8; 16];
        prm[..4].copy_from_slice(&(words as u32).to_le_bytes());
        prm[4..8].copy_from_slice(&(per_inv as u32).to_le_bytes());
        let ub = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("read params"),
            contents: &prm,
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let layout = self.read.get_bind_group_layout(0);
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &[entry(0, &src), entry(1, &sink), entry(2, &ub)],
        });
        let mut best = 0f64;
        for rep in 0..=reps.max(1) {
            let mut enc = self.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&self.read);
                pass.set_bind_group(0, &bind, &[]);
                for _ in 0..PASSES {
                    pass.dispatch_workgroups(gx as u32, gy as u32, 1);
                }
            }
            let t = std::time::Instant::now();
            self.queue.submit([enc.finish()]);
            self.wait("read")?;
            if rep > 0 {
                best = best.max((PASSES as u64 * bytes) as f64 / t.elapsed().as_secs_f64());
            }
        }
        Ok(best)
    }

    /// Copy rates of `bytes` over the host link (best of `reps` after a warm-up), bytes per
    /// second.
    pub fn upload_rates(&self, bytes: u64, reps: usize) -> Result<UploadRates, GpuError> {
        let bytes = bytes.max(16) / 16 * 16;
        let dst = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("upload target"),
            size: bytes,
            usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readable = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read back"),
            size: bytes,
            usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
            mapped_at_creation: false,
        });
        let host: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
        let mut best = UploadRates::default();
        let timed = |f: &mut dyn FnMut() -> Result<(), GpuError>| -> Result<f64, GpuError> {
            let t = std::time::Instant::now();
            f()?;
            Ok(bytes as f64 / t.elapsed().as_secs_f64())
        };
        let copy = |from: &wgpu::Buffer, to: &wgpu::Buffer, what: &str| {
            let mut enc = self.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(from, 0, to, 0, bytes);
            self.queue.submit([enc.finish()]);
            self.wait(what)
        };
        for rep in 0..=reps.max(1) {
            let to_host = timed(&mut || copy(&dst, &readable, "GPU-to-host copy"))?;
            let queued = timed(&mut || {
                self.queue.write_buffer(&dst, 0, &host);
                self.queue.submit([]);
                self.wait("host-to-GPU write through the queue")
            })?;
            let staged = timed(&mut || {
                self.staged_write(&dst, 0, bytes, &[&host])?;
                self.wait("host-to-GPU write through staging")
            })?;
            // The same bytes in WRITERS pieces written side by side, as a layer's expert
            // copies are.
            let piece = (bytes / WRITERS as u64).next_multiple_of(16) as usize;
            let side_by_side = timed(&mut || {
                std::thread::scope(|s| {
                    let writers: Vec<_> = host
                        .chunks(piece)
                        .enumerate()
                        .map(|(i, part)| {
                            let dst = &dst;
                            s.spawn(move || {
                                self.staged_write(dst, (i * piece) as u64, part.len() as u64, &[part])
                            })
                        })
                        .collect();
                    writers.into_iter().try_for_each(|w| {
                        w.join()
                            .unwrap_or_else(|_| Err(GpuError::Shape("a writer panicked".into())))
                    })
                })?;
                self.wait("host-to-GPU writes side by side")
            })?;
            if rep > 0 {
                best.to_host = best.to_host.max(to_host);
                best.to_gpu = best.to_gpu.max(side_by_side);
                best.queued = best.queued.max(queued);
                best.staged = best.staged.max(staged);
            }
        }
        Ok(best)
    }
}

/// Threads that write side by side for [`UploadRates::to_gpu`].
pub const WRITERS: usize = 8;

/// The host link's copy rates (bytes per second): [`Gpu::upload_rates`].
#[derive(Clone, Copy, Debug, Default)]
pub struct UploadRates {
    /// GPU memory copied into mappable host memory, which drivers keep on the host for
    /// reading back.
    pub to_host: f64,
    /// Host bytes written by [`WRITERS`] threads side by side through staging buffers, as a
    /// layer's expert copies are: the link's way in as weights can use it. (A GPU copy from a
    /// mappable buffer is no measure of it: NVIDIA's driver places such buffers in GPU memory,
    /// so the host's writes into them are what cross the link.)
    pub to_gpu: f64,
    /// Host bytes written through the queue (fresh mappable memory, then the GPU's copy).
    pub queued: f64,
    /// Host bytes written as weights are: into reused staging memory, then the GPU's copy.
    pub staged: f64,
}
