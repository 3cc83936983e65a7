//! Weight matrices in GPU memory and their products with f32 activations.

use wgpu::util::DeviceExt;

use crate::{Gpu, GpuError};

/// How a matrix's weights are stored on the GPU (the checkpoint's own bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    Bf16,
    F16,
    F32,
    /// INT8, one f32 scale per row.
    Int8,
    /// FP8 E4M3, one f32 scale per block of rows x inputs.
    Fp8,
    /// INT4 pack-quantized, eight weights per u32, one BF16 scale per group of inputs.
    Int4,
    /// MXFP4: two E2M1 weights per byte, one E8M0 scale per 32 inputs.
    Mxfp4,
}

impl WeightFormat {
    pub(crate) const ALL: [WeightFormat; 7] = [
        WeightFormat::Bf16,
        WeightFormat::F16,
        WeightFormat::F32,
        WeightFormat::Int8,
        WeightFormat::Fp8,
        WeightFormat::Int4,
        WeightFormat::Mxfp4,
    ];

    fn elem_bytes(self) -> usize {
        match self {
            WeightFormat::Bf16 | WeightFormat::F16 => 2,
            WeightFormat::F32 => 4,
            _ => 1,
        }
    }

    /// The format's WGSL: the product shader with its element functions.
    pub(crate) fn shader(self) -> String {
        let float = include_str!("shaders/float.wgsl");
        let packed = include_str!("shaders/packed.wgsl");
        let functions = match self {
            WeightFormat::Bf16 => [include_str!("shaders/bf16.wgsl"), float].concat(),
            WeightFormat::F16 => [include_str!("shaders/f16.wgsl"), float].concat(),
            WeightFormat::F32 => [include_str!("shaders/f32.wgsl"), float].concat(),
            WeightFormat::Int8 => [packed, include_str!("shaders/int8.wgsl")].concat(),
            WeightFormat::Fp8 => [packed, include_str!("shaders/fp8.wgsl")].concat(),
            WeightFormat::Int4 => [packed, include_str!("shaders/int4.wgsl")].concat(),
            WeightFormat::Mxfp4 => [packed, include_str!("shaders/mxfp4.wgsl")].concat(),
        };
        let word = if self == WeightFormat::F32 { "f32" } else { "u32" };
        include_str!("shaders/matmul.wgsl")
            .replace("WORD", word)
            .replace("FORMAT_FUNCTIONS", &functions)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// A (rows x in_dim) weight matrix in GPU memory, split by rows into chunks that each fit one
/// binding.
pub struct GpuMatrix {
    pub(crate) format: WeightFormat,
    pub(crate) rows: usize,
    pub(crate) in_dim: usize,
    pub(crate) chunks: Vec<Chunk>,
    /// Where the scales of a packed format lie (zero for the float formats).
    pub(crate) scales: ScaleLayout,
}

/// A packed format's row bytes and scale geometry, as the shaders read them.
#[derive(Clone, Copy, Default)]
pub(crate) struct ScaleLayout {
    /// Bytes of packed weights per row.
    pub row_bytes: u32,
    /// Scales per row of scales.
    pub per_row: u32,
    /// Weight rows per row of scales.
    pub rows: u32,
    /// Inputs per scale.
    pub cols: u32,
}

pub(crate) struct Chunk {
    pub row0: usize,
    pub rows: usize,
    /// The chunk's first weight within its first 16-byte word (float formats).
    pub elem0: u32,
    /// Byte offset of the chunk's scales in its buffer (packed formats).
    pub s_off: u32,
    pub buffer: wgpu::Buffer,
}

impl GpuMatrix {
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }
    pub fn format(&self) -> WeightFormat {
        self.format
    }
    /// Chunks the matrix was split into (one per binding).
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }
    /// Bytes of GPU memory its weights take.
    pub fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.buffer.size()).sum()
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MatmulParams {
    rows: u32,
    in_dim: u32,
    tokens: u32,
    out_stride: u32,
    row0: u32,
    grid_x: u32,
    elem0: u32,
    s_off: u32,
    scales: ScaleLayout,
}

impl MatmulParams {
    fn bytes(&self) -> [u8; 48] {
        let v = [
            self.rows,
            self.in_dim,
            self.tokens,
            self.out_stride,
            self.row0,
            self.grid_x,
            self.elem0,
            self.s_off,
            self.scales.row_bytes,
            self.scales.per_row,
            self.scales.rows,
            self.scales.cols,
        ];
        let mut out = [0u8; 48];
        for (o, x) in out.chunks_exact_mut(4).zip(v) {
            o.copy_from_slice(&x.to_le_bytes());
        }
        out
    }
}

/// Workgroups per dispatch dimension (WebGPU's minimum limit, which every adapter has).
const MAX_GROUPS: usize = 65535;
/// Tokens per workgroup of the matmul shaders (`TB` in the WGSL).
const TOKEN_BLOCK: usize = 8;

pub(crate) fn u32_of(v: usize, what: &str) -> Result<u32, GpuError> {
    u32::try_from(v)
        .map_err(|_| GpuError::Shape(format!("{what} {v} exceeds the GPU kernels' 32-bit indexing")))
}

impl Gpu {
    /// Uploads BF16 weights (`w`: rows x `in_dim`, row-major).
    pub fn upload_bf16(&self, w: &[u16], in_dim: usize) -> Result<GpuMatrix, GpuError> {
        self.upload(WeightFormat::Bf16, &u16_bytes(w), w.len(), in_dim)
    }

    /// Uploads F16 weights (`w`: rows x `in_dim`, row-major).
    pub fn upload_f16(&self, w: &[u16], in_dim: usize) -> Result<GpuMatrix, GpuError> {
        self.upload(WeightFormat::F16, &u16_bytes(w), w.len(), in_dim)
    }

    /// Uploads F32 weights (`w`: rows x `in_dim`, row-major).
    pub fn upload_f32(&self, w: &[f32], in_dim: usize) -> Result<GpuMatrix, GpuError> {
        self.upload(WeightFormat::F32, &f32_bytes(w), w.len(), in_dim)
    }

    /// Uploads `n` weights of `format` (`bytes`, little-endian), split by rows so that no chunk
    /// exceeds one binding. Each chunk starts on a 16-byte word at or before its first row.
    fn upload(
        &self,
        format: WeightFormat,
        bytes: &[u8],
        n: usize,
        in_dim: usize,
    ) -> Result<GpuMatrix, GpuError> {
        if in_dim == 0 || !n.is_multiple_of(in_dim) {
            return Err(GpuError::Shape(format!(
                "{format:?} weights of {n} values are not rows of {in_dim}"
            )));
        }
        let size = format.elem_bytes();
        let per_word = 16 / size;
        let rows = n / in_dim;
        let row_bytes = (size * in_dim) as u64;
        if row_bytes + 32 > self.max_binding {
            return Err(GpuError::Shape(format!(
                "one row of {in_dim} {format:?} weights ({row_bytes} bytes) exceeds the adapter's largest binding ({} bytes)",
                self.max_binding
            )));
        }
        u32_of(n + per_word, "weight count")?;
        let per_chunk = ((self.max_binding - 32) / row_bytes) as usize;
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let take = per_chunk.min(rows - row0);
            let first = row0 * in_dim;
            let start = first / per_word * per_word;
            let end = (row0 + take) * in_dim;
            let mut data = bytes[start * size..end * size].to_vec();
            data.resize(data.len().div_ceil(16) * 16, 0);
            let buffer = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("weights"),
                contents: &data,
                usage: wgpu::BufferUsages::STORAGE,
            });
            chunks.push(Chunk {
                row0,
                rows: take,
                elem0: (first - start) as u32,
                s_off: 0,
                buffer,
            });
            row0 += take;
        }
        Ok(GpuMatrix {
            format,
            rows,
            in_dim,
            chunks,
            scales: ScaleLayout::default(),
        })
    }

    /// `ys[t * rows + r] = dot(row r, xs[t])` for the `tokens` activations in `xs` (T x in_dim),
    /// as the CPU's `Linear::matmul` lays them out. Each output's sum runs in the same order
    /// whatever `tokens` is.
    pub fn matmul(&self, m: &GpuMatrix, xs: &[f32], tokens: usize) -> Result<Vec<f32>, GpuError> {
        if tokens == 0 || xs.len() != tokens * m.in_dim {
            return Err(GpuError::Shape(format!(
                "activations of {} values are not {tokens} tokens of {}",
                xs.len(),
                m.in_dim
            )));
        }
        let out_len = tokens * m.rows;
        let out_bytes = (out_len * 4) as u64;
        // One product at a time through buffers kept for the next (no buffers made per product).
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let Scratch { x, y, staging } = &mut *scratch;
        let use_x = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let x_buf = ensure(&self.device, x, (xs.len() * 4) as u64, use_x, "activations");
        self.queue.write_buffer(x_buf, 0, &f32_bytes(xs));
        let use_y = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        let y_buf = ensure(&self.device, y, out_bytes, use_y, "outputs");
        let use_s = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let staging = ensure(&self.device, staging, out_bytes, use_s, "read back");
        let mut enc = self.device.create_command_encoder(&Default::default());
        let _params = self.encode_matmul(&mut enc, m, x_buf, y_buf, tokens)?;
        self.read_back(enc, y_buf, staging, out_len)
    }

    /// Records the dispatches of one product into `enc`; returns the parameter buffers, which
    /// must live until it is submitted.
    fn encode_matmul(
        &self,
        enc: &mut wgpu::CommandEncoder,
        m: &GpuMatrix,
        x_buf: &wgpu::Buffer,
        y_buf: &wgpu::Buffer,
        tokens: usize,
    ) -> Result<Vec<wgpu::Buffer>, GpuError> {
        let groups_z = tokens.div_ceil(TOKEN_BLOCK);
        if groups_z > MAX_GROUPS {
            return Err(GpuError::Shape(format!("{tokens} tokens in one product")));
        }
        let mut params = Vec::new();
        for c in &m.chunks {
            let grid_x = c.rows.min(MAX_GROUPS);
            let grid_y = c.rows.div_ceil(grid_x);
            let p = MatmulParams {
                rows: c.rows as u32,
                in_dim: m.in_dim as u32,
                tokens: u32_of(tokens, "token count")?,
                out_stride: m.rows as u32,
                row0: c.row0 as u32,
                grid_x: grid_x as u32,
                elem0: c.elem0,
                s_off: c.s_off,
                scales: m.scales,
            };
            let ub = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("matmul params"),
                contents: &p.bytes(),
                usage: wgpu::BufferUsages::UNIFORM,
            });
            let pipeline = &self.matmul[m.format.index()];
            let layout = pipeline.get_bind_group_layout(0);
            let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &layout,
                entries: &[
                    entry(0, &c.buffer),
                    entry(1, x_buf),
                    entry(2, y_buf),
                    entry(3, &ub),
                ],
            });
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(grid_x as u32, grid_y as u32, groups_z as u32);
            drop(pass);
            params.push(ub);
        }
        Ok(params)
    }

    /// Seconds per product of `m` with `tokens` activations, averaged over `reps` products
    /// submitted together (weights and activations already on the GPU; no read back).
    pub fn time_matmul(&self, m: &GpuMatrix, tokens: usize, reps: usize) -> Result<f64, GpuError> {
        let xs: Vec<f32> = (0..tokens * m.in_dim)
            .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
            .collect();
        let x_buf = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("activations"),
            contents: &f32_bytes(&xs),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let y_buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("outputs"),
            size: (tokens * m.rows * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let run = |n: usize| -> Result<f64, GpuError> {
            let mut enc = self.device.create_command_encoder(&Default::default());
            let mut keep = Vec::new();
            for _ in 0..n {
                keep.push(self.encode_matmul(&mut enc, m, &x_buf, &y_buf, tokens)?);
            }
            let t = std::time::Instant::now();
            self.queue.submit([enc.finish()]);
            self.wait("timed product")?;
            Ok(t.elapsed().as_secs_f64())
        };
        run(1)?; // warm-up: pipelines, first touch
        Ok(run(reps.max(1))? / reps.max(1) as f64)
    }

    /// Submits `enc` with a copy of `src` into `staging` (mappable, at least `len` floats) and
    /// returns its `len` floats.
    pub(crate) fn read_back(
        &self,
        mut enc: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        staging: &wgpu::Buffer,
        len: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let bytes = (len * 4) as u64;
        enc.copy_buffer_to_buffer(src, 0, staging, 0, bytes);
        self.queue.submit([enc.finish()]);
        let slice = staging.slice(..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait("product")?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(GpuError::Run {
                    what: "reading results back".into(),
                    reason: e.to_string(),
                })
            }
            Err(_) => {
                return Err(GpuError::Run {
                    what: "reading results back".into(),
                    reason: "the mapping never completed".into(),
                })
            }
        }
        let data = slice.get_mapped_range().map_err(|e| GpuError::Run {
            what: "reading results back".into(),
            reason: e.to_string(),
        })?;
        let out = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        drop(data);
        staging.unmap();
        Ok(out)
    }
}

/// Buffers one product at a time works through, kept and grown for the next.
#[derive(Default)]
pub(crate) struct Scratch {
    x: Option<wgpu::Buffer>,
    y: Option<wgpu::Buffer>,
    staging: Option<wgpu::Buffer>,
}

/// `slot`'s buffer, made anew (a power of two of bytes) when it is missing or smaller than
/// `bytes`.
fn ensure<'a>(
    device: &wgpu::Device,
    slot: &'a mut Option<wgpu::Buffer>,
    bytes: u64,
    usage: wgpu::BufferUsages,
    label: &str,
) -> &'a wgpu::Buffer {
    if slot.as_ref().is_none_or(|b| b.size() < bytes) {
        *slot = Some(device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(16).next_power_of_two(),
            usage,
            mapped_at_creation: false,
        }));
    }
    slot.as_ref().expect("made above")
}

pub(crate) fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}

pub(crate) fn u16_bytes(w: &[u16]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(crate) fn f32_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|v| v.to_le_bytes()).collect()
}
