//! The GPU memory's own read rate, measured the way the products read weights (one pass over a
//! buffer), so a product's rate can be set beside it in one run.

use wgpu::util::DeviceExt;

use crate::matrix::entry;
use crate::{Gpu, GpuError};

const WORKGROUP: usize = 256;
/// vec4 words each invocation reads.
const PER_INVOCATION: usize = 16;

impl Gpu {
    /// Bytes per second read from a buffer of `bytes` (rounded down to 16-byte words, at most
    /// one binding), best of `reps` passes after a warm-up.
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
                pass.dispatch_workgroups(gx as u32, gy as u32, 1);
            }
            let t = std::time::Instant::now();
            self.queue.submit([enc.finish()]);
            self.wait("read")?;
            if rep > 0 {
                best = best.max(bytes as f64 / t.elapsed().as_secs_f64());
            }
        }
        Ok(best)
    }
}
