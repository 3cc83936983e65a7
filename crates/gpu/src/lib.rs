//! strata's GPU backend: WGSL compute shaders run through `wgpu` on Vulkan (NVIDIA, AMD, Intel,
//! and Mesa's software driver, lavapipe, for tests) and Metal (Apple). Each kernel has the CPU
//! implementation as its reference and a property test against it (`tests/`).
//!
//! [`select`] turns `--device auto|cpu|gpu` into a device: `auto` takes a discrete GPU and never
//! a software adapter (lavapipe computes on the CPU, slower than strata's own kernels) nor, for
//! now, an integrated one (it would hold a second copy of weights in the same memory); `gpu` takes
//! the best adapter there is, software included (so the tests run on machines without a GPU), and
//! fails with how to get one when there is none.

mod matrix;
mod offload;
mod ops;
mod ops_attend;
mod ops_moe;
mod ops_resident;
mod ops_route;
mod ops_state;
mod packed;
mod product;
mod read;
mod shader;
mod slab;
mod staging;
mod timing;

use std::fmt;
use std::sync::{Arc, Mutex};

pub use matrix::{GpuMatrix, Tile, WeightFormat};
pub use offload::Offload;
pub use ops::{AttendShape, Glu, GpuTensor, Recorder, Rotation, MAX_HEAD};
pub use ops_moe::Routing;
pub use ops_resident::{ResidentExperts, ResidentItems, MAX_RESIDENT_SLABS, MAX_ROUTED_ROWS};
pub use ops_route::{RouteRule, MAX_PICKS, MAX_ROUTED_EXPERTS};
pub use read::{UploadRates, WRITERS};

/// What `--device` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preference {
    Auto,
    Cpu,
    Gpu,
}

impl std::str::FromStr for Preference {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Preference::Auto),
            "cpu" => Ok(Preference::Cpu),
            "gpu" => Ok(Preference::Gpu),
            other => Err(format!("unknown device {other:?}: expected auto, cpu or gpu")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no GPU adapter found (Vulkan or Metal). On Linux install a Vulkan driver and loader: \
         your GPU vendor's, or Mesa's software one for tests (Debian/Ubuntu: `apt-get install \
         mesa-vulkan-drivers libvulkan1`); `--device cpu` runs without one"
    )]
    NoAdapter,
    #[error("GPU adapter {adapter} refused a device: {reason}")]
    Device { adapter: String, reason: String },
    #[error("GPU {what}: {reason}")]
    Run { what: String, reason: String },
    #[error("{0}")]
    Shape(String),
}

/// The device a run computes on, and why.
pub enum Selection {
    Cpu { why: String },
    Gpu(Box<Gpu>),
}

/// One adapter's description, as `select` saw it.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub kind: String,
    pub software: bool,
    pub driver: String,
}

impl fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}, {}", self.name, self.backend, self.kind)?;
        if !self.driver.is_empty() {
            write!(f, ", {}", self.driver)?;
        }
        write!(f, ")")
    }
}

fn summary(info: &wgpu::AdapterInfo) -> AdapterSummary {
    let driver = [info.driver.as_str(), info.driver_info.as_str()]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    AdapterSummary {
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        kind: match info.device_type {
            wgpu::DeviceType::DiscreteGpu => "discrete GPU",
            wgpu::DeviceType::IntegratedGpu => "integrated GPU",
            wgpu::DeviceType::VirtualGpu => "virtual GPU",
            wgpu::DeviceType::Cpu => "software",
            wgpu::DeviceType::Other => "other",
        }
        .to_string(),
        software: info.device_type == wgpu::DeviceType::Cpu,
        driver,
    }
}

/// Rank of an adapter kind: the first of these found is taken.
fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN | wgpu::Backends::METAL,
        flags: wgpu::InstanceFlags::empty(),
        memory_budget_thresholds: Default::default(),
        backend_options: Default::default(),
        display: None,
    })
}

/// Every adapter the Vulkan and Metal loaders report.
pub fn adapters() -> Vec<AdapterSummary> {
    let inst = instance();
    pollster::block_on(inst.enumerate_adapters(wgpu::Backends::VULKAN | wgpu::Backends::METAL))
        .iter()
        .map(|a| summary(&a.get_info()))
        .collect()
}

/// The device `pref` asks for: see the crate's documentation.
pub fn select(pref: Preference) -> Result<Selection, GpuError> {
    if pref == Preference::Cpu {
        return Ok(Selection::Cpu {
            why: "--device cpu".into(),
        });
    }
    let inst = instance();
    let mut found =
        pollster::block_on(inst.enumerate_adapters(wgpu::Backends::VULKAN | wgpu::Backends::METAL));
    found.sort_by_key(|a| rank(a.get_info().device_type));
    if pref == Preference::Gpu {
        return match found.into_iter().next() {
            Some(a) => Gpu::from_adapter(a).map(|g| Selection::Gpu(Box::new(g))),
            None => Err(GpuError::NoAdapter),
        };
    }
    // auto: a GPU with memory of its own. An integrated GPU shares the host's memory, where the
    // weights it would copy already are (a second copy of them, no faster memory).
    match found
        .iter()
        .position(|a| a.get_info().device_type == wgpu::DeviceType::DiscreteGpu)
    {
        Some(i) => Gpu::from_adapter(found.swap_remove(i)).map(|g| Selection::Gpu(Box::new(g))),
        None => Ok(Selection::Cpu {
            why: match found.first().map(|a| summary(&a.get_info())) {
                Some(a) if a.software => format!("only a software GPU adapter: {a}"),
                Some(a) => format!("{a} shares the host's memory; --device gpu uses it anyway"),
                None => "no GPU adapter (Vulkan or Metal) found".into(),
            },
        }),
    }
}

/// An open GPU device with strata's pipelines.
pub struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    adapter: AdapterSummary,
    /// The largest storage buffer one binding may address: weights above it are split by rows.
    max_binding: u64,
    /// The adapter's own limit (`max_binding` may be set lower).
    binding_limit: u64,
    /// The product pipelines, made at first use: one per [`WeightFormat`] and [`Tile`]
    /// (`format.index() * Tile::ALL.len() + tile.index()`).
    matmul: Vec<std::sync::OnceLock<wgpu::ComputePipeline>>,
    /// The products of several experts (`Recorder::matmul_experts`), by format and tile.
    grouped: Vec<std::sync::OnceLock<wgpu::ComputePipeline>>,
    /// A tile every product takes (`STRATA_GPU_TILE=RxT`, for measurements); None: by tokens.
    forced_tile: Option<Tile>,
    read: wgpu::ComputePipeline,
    /// Errors the device reported outside any error scope (validation, loss), oldest first.
    errors: Arc<Mutex<Vec<String>>>,
    /// The buffers products run through, one product at a time.
    scratch: Mutex<product::Scratch>,
    matmul_layout: wgpu::BindGroupLayout,
    matmul_pipeline_layout: wgpu::PipelineLayout,
    grouped_layout: wgpu::BindGroupLayout,
    grouped_pipeline_layout: wgpu::PipelineLayout,
    /// Storage bindings start at multiples of this (bytes).
    storage_align: u64,
    /// The layer kernels' pipelines (`ops`).
    ops: ops_state::Pipelines,
    /// Buffers of tensors no longer used.
    pool: Arc<Mutex<ops_state::Pool>>,
    /// The layer kernels' parameter buffer and the bind groups kept with it.
    pub(crate) binds: Mutex<ops_state::BindCache>,
    /// Waits so far, and the first that fails ([`Gpu::fail_from_wait`]).
    waits: std::sync::atomic::AtomicU64,
    fail_from: std::sync::atomic::AtomicU64,
    /// Whether ops can be timed inside compute passes (`timing.rs`).
    timestamps: bool,
    /// Kept routed experts' weights, in shared buffers of equal slots.
    slabs: slab::Slabs,
    /// Reused host memory that weights are copied through (`staging.rs`).
    staging: staging::Staging,
}

impl Gpu {
    fn from_adapter(a: wgpu::Adapter) -> Result<Gpu, GpuError> {
        let adapter = summary(&a.get_info());
        let limits = a.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("strata"),
            // Op timing for the profile where the adapter has it (`timing.rs`).
            required_features: a.features() & timing::features(),
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(a.request_device(&desc)).map_err(|e| GpuError::Device {
            adapter: adapter.to_string(),
            reason: e.to_string(),
        })?;
        let timestamps = device.features().contains(timing::features());
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let max_binding = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        let cells = || {
            (0..WeightFormat::ALL.len() * Tile::ALL.len())
                .map(|_| Default::default())
                .collect()
        };
        let (matmul, grouped) = (cells(), cells());
        let forced_tile = match std::env::var("STRATA_GPU_TILE") {
            Ok(v) => Some(v.parse::<Tile>().map_err(|e| GpuError::Device {
                adapter: adapter.to_string(),
                reason: format!("STRATA_GPU_TILE: {e}"),
            })?),
            Err(_) => None,
        };
        let read = pipeline(&device, "read", include_str!("shaders/read.wgsl"));
        let matmul_layout = product::matmul_layout(&device, false);
        let grouped_layout = product::matmul_layout(&device, true);
        let ops = ops_state::Pipelines::new(&device);
        let pipeline_layout = |layout: &wgpu::BindGroupLayout| {
            device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("matmul"),
                bind_group_layouts: &[Some(layout)],
                immediate_size: 0,
            })
        };
        let matmul_pipeline_layout = pipeline_layout(&matmul_layout);
        let grouped_pipeline_layout = pipeline_layout(&grouped_layout);
        Ok(Gpu {
            device,
            queue,
            adapter,
            max_binding,
            binding_limit: max_binding,
            matmul,
            grouped,
            forced_tile,
            read,
            errors,
            scratch: Mutex::default(),
            matmul_layout,
            matmul_pipeline_layout,
            grouped_layout,
            grouped_pipeline_layout,
            storage_align: u64::from(limits.min_storage_buffer_offset_alignment),
            ops,
            pool: Arc::default(),
            binds: Mutex::default(),
            waits: Default::default(),
            fail_from: u64::MAX.into(),
            timestamps,
            slabs: Default::default(),
            staging: Default::default(),
        })
    }

    pub fn adapter(&self) -> &AdapterSummary {
        &self.adapter
    }

    /// The largest weight chunk one binding holds (bytes).
    pub fn max_binding(&self) -> u64 {
        self.max_binding
    }

    /// Sets the largest chunk per binding, at most the adapter's limit (tests of the split path
    /// on any device).
    pub fn set_max_binding(&mut self, bytes: u64) {
        self.max_binding = bytes.clamp(4, self.binding_limit);
    }

    /// Sends every copy made so far (uploads wait for the next submission) and waits for them.
    pub fn flush(&self) -> Result<(), GpuError> {
        self.queue.submit([]);
        self.wait("copying weights")
    }

    /// Whether the profile gets the GPU time of each op (`STRATA_PROFILE=1`; adapters with
    /// timestamps inside compute passes).
    pub fn times_ops(&self) -> bool {
        self.timestamps
    }

    /// Fault injection for tests: the `n`th wait from now (0: the next) and every later one
    /// fail as a lost device's would; `u64::MAX` heals it.
    pub fn fail_from_wait(&self, n: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        self.fail_from
            .store(self.waits.load(SeqCst).saturating_add(n), SeqCst);
    }

    /// Waits for every submitted command; an error the device reported meanwhile fails it.
    fn wait(&self, what: &str) -> Result<(), GpuError> {
        use std::sync::atomic::Ordering::SeqCst;
        let fail = |reason: String| GpuError::Run {
            what: what.into(),
            reason,
        };
        if self.waits.fetch_add(1, SeqCst) >= self.fail_from.load(SeqCst) {
            return Err(fail("the device is lost (injected by a test)".into()));
        }
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| fail(e.to_string()))?;
        let reported = self
            .errors
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        match reported.into_iter().next() {
            Some(e) => Err(fail(e)),
            None => Ok(()),
        }
    }
}

/// A module of strata's own WGSL. `STRATA_GPU_CHECKS=0` (an experiment, off by default) leaves
/// out what naga adds to untrusted shaders: index clamps where the driver does not bound buffer
/// accesses itself, and a counter in every loop.
pub(crate) fn module(device: &wgpu::Device, label: &str, source: &str) -> wgpu::ShaderModule {
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    };
    static UNCHECKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *UNCHECKED.get_or_init(|| std::env::var("STRATA_GPU_CHECKS").is_ok_and(|v| v == "0")) {
        // SAFETY: every loop of these shaders ends (counts from parameters the host wrote, steps
        // above zero), and every index is within its array or binding for the parameters the
        // host writes (the property tests compare every output with the CPU's).
        unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
    } else {
        device.create_shader_module(desc)
    }
}

fn pipeline(device: &wgpu::Device, label: &str, source: &str) -> wgpu::ComputePipeline {
    let module = module(device, label, source);
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}
