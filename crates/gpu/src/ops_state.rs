//! What the layer kernels keep between submissions: their pipelines, a pool of buffers for
//! tensors, and the bind groups made with the one parameter buffer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::product::{storage, PARAMS_STRIDE};

/// Bytes of one kernel's parameters (sixteen words).
pub(crate) const OPS_PARAMS: u64 = 64;

/// Buffers no longer used, by (bytes, usage), up to [`POOL_MAX`] bytes: making a buffer and
/// its first-use clearing cost more than many a layer's kernel.
#[derive(Default)]
pub(crate) struct Pool {
    free: HashMap<(u64, u32), Vec<wgpu::Buffer>>,
    bytes: u64,
}

/// Bytes of unused buffers a pool keeps.
const POOL_MAX: u64 = 1 << 30;

impl Pool {
    pub(crate) fn take(pool: &Mutex<Pool>, bytes: u64, usage: wgpu::BufferUsages) -> Option<wgpu::Buffer> {
        let mut p = pool.lock().unwrap_or_else(|e| e.into_inner());
        let b = p.free.get_mut(&(bytes, usage.bits()))?.pop()?;
        p.bytes -= bytes;
        Some(b)
    }

    pub(crate) fn put(pool: &Mutex<Pool>, buf: wgpu::Buffer) {
        let mut p = pool.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = buf.size();
        if p.bytes + bytes <= POOL_MAX {
            p.bytes += bytes;
            p.free.entry((bytes, buf.usage().bits())).or_default().push(buf);
        }
    }
}

/// A pooled buffer, back to its pool when dropped.
pub(crate) struct Pooled {
    pub(crate) buf: Option<wgpu::Buffer>,
    pub(crate) pool: Arc<Mutex<Pool>>,
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            Pool::put(&self.pool, b);
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Kernel {
    RmsNorm,
    Add,
    Glu,
    NormRope,
    AttendPart,
    AttendCombine,
    Gather,
    ScaleSigmoid,
    HeadMatvec,
    Combine,
    Route,
    RouteTable,
    ExpertItems,
}

impl Kernel {
    pub(crate) fn entry(self) -> &'static str {
        match self {
            Kernel::RmsNorm => "rms_norm",
            Kernel::Add => "add",
            Kernel::Glu => "glu",
            Kernel::NormRope => "norm_rope",
            Kernel::AttendPart => "attend_part",
            Kernel::AttendCombine => "attend_combine",
            Kernel::Gather => "gather",
            Kernel::ScaleSigmoid => "scale_sigmoid",
            Kernel::HeadMatvec => "head_matvec",
            Kernel::Combine => "combine",
            Kernel::Route => "route",
            Kernel::RouteTable => "route_table",
            Kernel::ExpertItems => "expert_items",
        }
    }
}

/// The kernels' layout and pipelines (made at first use), and a buffer for unused bindings.
pub(crate) struct Pipelines {
    pub(crate) layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    module: OnceLock<wgpu::ShaderModule>,
    pipes: [OnceLock<wgpu::ComputePipeline>; 13],
    pub(crate) unused: wgpu::Buffer,
}

impl Pipelines {
    pub(crate) fn new(device: &wgpu::Device) -> Pipelines {
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("ops"),
            entries: &[
                storage(0, false),
                storage(1, true),
                storage(2, true),
                storage(3, true),
                wgpu::BindGroupLayoutEntry {
                    binding: 4,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: wgpu::BufferSize::new(OPS_PARAMS),
                    },
                    count: None,
                },
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("ops"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let unused = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("unused binding"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Pipelines {
            layout,
            pipeline_layout,
            module: OnceLock::new(),
            pipes: Default::default(),
            unused,
        }
    }

    pub(crate) fn pipeline(&self, device: &wgpu::Device, k: Kernel) -> &wgpu::ComputePipeline {
        self.pipes[k as usize].get_or_init(|| {
            let module = self
                .module
                .get_or_init(|| crate::module(device, "ops", include_str!("shaders/ops.wgsl")));
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(k.entry()),
                layout: Some(&self.pipeline_layout),
                module,
                entry_point: Some(k.entry()),
                compilation_options: Default::default(),
                cache: None,
            })
        })
    }
}

/// The parameter buffer every submission writes, and the bind groups made with it, by layout
/// and buffers: pooled tensors come back, so a decode loop meets the same buffers at every
/// token and binds them without making anything.
#[derive(Default)]
pub(crate) struct BindCache {
    params: Option<wgpu::Buffer>,
    groups: HashMap<BindKey, wgpu::BindGroup>,
}

/// A layout's index and its storage buffers with the bytes bound (0: the whole buffer).
type BindKey = (u8, [Option<(wgpu::Buffer, u64)>; 4]);

/// Bind groups a cache keeps before it starts over.
const BIND_CACHE_MAX: usize = 8192;

impl BindCache {
    /// The parameter buffer, at least `bytes` long (a new one forgets the bind groups).
    pub(crate) fn params(&mut self, device: &wgpu::Device, bytes: u64) -> wgpu::Buffer {
        if self.params.as_ref().is_none_or(|p| p.size() < bytes) {
            self.groups.clear();
            self.params = Some(device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("ops params"),
                size: bytes.max(PARAMS_STRIDE).next_power_of_two(),
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        self.params.clone().expect("made above")
    }

    /// Forgets every bind group (they hold their buffers: an expert slab given back must not
    /// outlive its budget in them).
    pub(crate) fn forget(&mut self) {
        self.groups.clear();
    }

    pub(crate) fn get(
        &mut self,
        layout: u8,
        buffers: [Option<(&wgpu::Buffer, u64)>; 4],
        make: impl FnOnce() -> wgpu::BindGroup,
    ) -> wgpu::BindGroup {
        let key = (layout, buffers.map(|b| b.map(|(buf, n)| (buf.clone(), n))));
        if let Some(b) = self.groups.get(&key) {
            return b.clone();
        }
        if self.groups.len() >= BIND_CACHE_MAX {
            self.groups.clear();
        }
        let b = make();
        self.groups.insert(key, b.clone());
        b
    }
}
