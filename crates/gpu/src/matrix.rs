//! Weight matrices in GPU memory and their products with f32 activations.

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

    /// Whether weights and scales are packed into bytes (the rest are float formats).
    pub(crate) fn packed(self) -> bool {
        !matches!(self, WeightFormat::Bf16 | WeightFormat::F16 | WeightFormat::F32)
    }

    pub(crate) fn elem_bytes(self) -> usize {
        match self {
            WeightFormat::Bf16 | WeightFormat::F16 => 2,
            WeightFormat::F32 => 4,
            _ => 1,
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// The block of rows and tokens one workgroup of the product shader computes. Every tile gives
/// each output the same sum, step by step; they differ in how many weights and activations an
/// invocation loads and reuses at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    pub rows: u32,
    pub tokens: u32,
}

impl Tile {
    /// The tiles there are pipelines for.
    pub const ALL: [Tile; 13] = [
        Tile::new(1, 1),
        Tile::new(2, 1),
        Tile::new(4, 1),
        Tile::new(8, 1),
        Tile::new(1, 4),
        Tile::new(2, 4),
        Tile::new(4, 4),
        Tile::new(8, 4),
        Tile::new(1, 8),
        Tile::new(2, 8),
        Tile::new(4, 8),
        Tile::new(8, 8),
        Tile::new(4, 16),
    ];

    const fn new(rows: u32, tokens: u32) -> Tile {
        Tile { rows, tokens }
    }

    /// The tile a product of `tokens` with a matrix of `rows` x `in_dim` takes: measured on an
    /// NVIDIA H200 and H100 (`gpu_matvec`, docs/PERFORMANCE.md), two rows a workgroup for one
    /// token of a matrix with fewer than 16,384 rows (more workgroups at once would only wait on
    /// the same reads), one row for larger ones and for rows of 8,192 inputs or more (an
    /// invocation then has enough of its own to read), and two rows x four tokens for any
    /// prompt.
    pub fn for_product(tokens: usize, rows: usize, in_dim: usize) -> Tile {
        match (tokens, rows) {
            (1, 16384..) => Tile::new(1, 1),
            (1, _) if in_dim >= 8192 => Tile::new(1, 1),
            (1, _) => Tile::new(2, 1),
            _ => Tile::new(2, 4),
        }
    }

    pub(crate) fn index(self) -> usize {
        Tile::ALL
            .iter()
            .position(|&t| t == self)
            .expect("tiles come from ALL")
    }
}

impl std::str::FromStr for Tile {
    type Err = String;
    fn from_str(s: &str) -> Result<Tile, String> {
        let tiles = || {
            let all: Vec<String> = Tile::ALL.iter().map(|t| t.to_string()).collect();
            format!("{s:?} is not a tile: one of {}", all.join(", "))
        };
        let (r, t) = s.split_once('x').ok_or_else(tiles)?;
        let tile = Tile::new(r.parse().map_err(|_| tiles())?, t.parse().map_err(|_| tiles())?);
        if Tile::ALL.contains(&tile) {
            Ok(tile)
        } else {
            Err(tiles())
        }
    }
}

impl std::fmt::Display for Tile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.rows, self.tokens)
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
#[derive(Clone, Copy, Default, PartialEq, Eq)]
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
    /// Byte offset of the chunk's scales from its first byte (packed formats).
    pub s_off: u32,
    pub buffer: wgpu::Buffer,
    /// The chunk's first byte in `buffer` (a multiple of 16; not 0 in an expert slab).
    pub base: u64,
    /// The slab slot it lies in, held as long as the chunk (and any work recorded with it).
    pub slot: Option<std::sync::Arc<crate::slab::Slot>>,
    /// Its bind group with the product buffers of generation `.0` (made once per generation).
    pub bind: std::sync::Mutex<Option<(u64, wgpu::BindGroup)>>,
    /// Bind groups a [`crate::Recorder`] made for it, newest last: they name the chunk's buffer,
    /// so they live and go with the matrix (a bind group in a shared cache would keep an evicted
    /// expert's memory past its budget).
    pub recorded: std::sync::Arc<std::sync::Mutex<Vec<(RecordedKey, wgpu::BindGroup)>>>,
}

/// The activation, output and parameter buffers of a recorded product's bind group, with the
/// bytes bound of the first two.
pub(crate) type RecordedKey = [(wgpu::Buffer, u64); 3];

/// Recorded bind groups a chunk keeps (the oldest goes first).
pub(crate) const RECORDED_MAX: usize = 8;

/// Where an upload's weights go.
#[derive(Clone, Copy)]
pub(crate) enum Target<'a> {
    /// Buffers of their own, one per chunk.
    Own,
    /// One slot of the GPU's expert slabs, for a matrix of one chunk; the bytes of a new slab
    /// are reserved through the function.
    Slot(&'a dyn Fn(u64) -> Option<crate::slab::Reservation>),
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
    /// Bytes of GPU memory its weights take (a slab slot's, for an expert in one).
    pub fn bytes(&self) -> u64 {
        let each = |c: &Chunk| match &c.slot {
            Some(s) => s.slab.slot_bytes(),
            None => c.buffer.size(),
        };
        self.chunks.iter().map(each).sum()
    }

    /// Whether it lies in a slot of the expert slabs ([`Gpu::upload_expert`]).
    pub fn in_slab(&self) -> bool {
        self.slab().is_some()
    }

    /// The slab buffer of its one chunk, when it lies in an expert slab.
    pub(crate) fn slab(&self) -> Option<&wgpu::Buffer> {
        match self.chunks.as_slice() {
            [c] if c.slot.is_some() => Some(&c.buffer),
            _ => None,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MatmulParams {
    pub rows: u32,
    pub in_dim: u32,
    pub tokens: u32,
    pub out_stride: u32,
    pub row0: u32,
    pub grid_x: u32,
    pub elem0: u32,
    pub s_off: u32,
    pub scales: ScaleLayout,
    /// First activation and first output of the product in `x` and `y` (values).
    pub x0: u32,
    pub y0: u32,
    /// The chunk's first byte in its buffer (packed formats; the float formats fold it into
    /// `elem0`).
    pub w0: u32,
    /// The first item of a product of several experts (`matmul.wgsl`'s grouped form).
    pub items0: u32,
}

/// Bytes of a product's parameter block.
pub(crate) const MATMUL_PARAMS: usize = 64;

impl MatmulParams {
    pub(crate) fn bytes(&self) -> [u8; MATMUL_PARAMS] {
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
            self.x0,
            self.y0,
            self.w0,
            self.items0,
        ];
        let mut out = [0u8; MATMUL_PARAMS];
        for (o, x) in out.chunks_exact_mut(4).zip(v) {
            o.copy_from_slice(&x.to_le_bytes());
        }
        out
    }
}

/// Workgroups per dispatch dimension (WebGPU's minimum limit, which every adapter has).
pub(crate) const MAX_GROUPS: usize = 65535;

pub(crate) fn u32_of(v: usize, what: &str) -> Result<u32, GpuError> {
    u32::try_from(v)
        .map_err(|_| GpuError::Shape(format!("{what} {v} exceeds the GPU kernels' 32-bit indexing")))
}

impl Gpu {
    /// Uploads BF16 weights (`w`: rows x `in_dim`, row-major).
    pub fn upload_bf16(&self, w: &[u16], in_dim: usize) -> Result<GpuMatrix, GpuError> {
        self.upload_own(WeightFormat::Bf16, &le_bytes(w), w.len(), in_dim)
    }

    /// Uploads F16 weights (`w`: rows x `in_dim`, row-major).
    pub fn upload_f16(&self, w: &[u16], in_dim: usize) -> Result<GpuMatrix, GpuError> {
        self.upload_own(WeightFormat::F16, &le_bytes(w), w.len(), in_dim)
    }

    /// Uploads F32 weights (`w`: rows x `in_dim`, row-major).
    pub fn upload_f32(&self, w: &[f32], in_dim: usize) -> Result<GpuMatrix, GpuError> {
        self.upload_own(WeightFormat::F32, &le_bytes(w), w.len(), in_dim)
    }

    /// A chunk of `rows` rows from `row0` whose buffer holds `parts` one after the other, each
    /// from a 16-byte word (copied in through staging memory, into a buffer of its own or a
    /// slab slot). None: `target` had no room for it.
    pub(crate) fn chunk(
        &self,
        (row0, rows): (usize, usize),
        elem0: u32,
        s_off: u32,
        parts: &[&[u8]],
        target: Target<'_>,
    ) -> Result<Option<Chunk>, GpuError> {
        let size: usize = parts.iter().map(|p| p.len().next_multiple_of(16)).sum();
        let size = size.max(16) as u64;
        let (buffer, base, slot, recorded) = match target {
            Target::Own => {
                // Through reused staging memory (`staging.rs`): a buffer mapped at creation
                // would take fresh host memory for each copy.
                let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("weights"),
                    size,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                self.staged_write(&buffer, 0, size, parts)?;
                (buffer, 0, None, Default::default())
            }
            Target::Slot(reserve) => {
                let Some(slot) = self.slabs.place(self, size, reserve)? else {
                    return Ok(None);
                };
                let buffer = slot.slab.buffer.clone();
                self.staged_write(&buffer, slot.base(), size, parts)?;
                let recorded = slot.slab.recorded.clone();
                (buffer, slot.base(), Some(std::sync::Arc::new(slot)), recorded)
            }
        };
        Ok(Some(Chunk {
            row0,
            rows,
            elem0,
            s_off,
            buffer,
            base,
            slot,
            bind: Default::default(),
            recorded,
        }))
    }

    /// [`Gpu::upload`] into its own buffers.
    fn upload_own(
        &self,
        format: WeightFormat,
        bytes: &[u8],
        n: usize,
        in_dim: usize,
    ) -> Result<GpuMatrix, GpuError> {
        let m = self.upload(format, bytes, n, in_dim, Target::Own)?;
        Ok(m.expect("own buffers always take a chunk"))
    }

    /// Uploads `n` weights of `format` (`bytes`, little-endian), split by rows so that no chunk
    /// exceeds one binding. Each chunk starts on a 16-byte word at or before its first row.
    /// None: `target` is a slab slot and had no room, or the matrix takes more than one chunk.
    pub(crate) fn upload(
        &self,
        format: WeightFormat,
        bytes: &[u8],
        n: usize,
        in_dim: usize,
        target: Target<'_>,
    ) -> Result<Option<GpuMatrix>, GpuError> {
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
        if matches!(target, Target::Slot(_)) && per_chunk < rows {
            return Ok(None);
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let take = per_chunk.min(rows - row0);
            let first = row0 * in_dim;
            let start = first / per_word * per_word;
            let end = (row0 + take) * in_dim;
            let data = &bytes[start * size..end * size];
            let elem0 = (first - start) as u32;
            match self.chunk((row0, take), elem0, 0, &[data], target)? {
                Some(c) => chunks.push(c),
                None => return Ok(None),
            }
            row0 += take;
        }
        Ok(Some(GpuMatrix {
            format,
            rows,
            in_dim,
            chunks,
            scales: ScaleLayout::default(),
        }))
    }
}

/// Writes `parts` one after the other, each from a 16-byte word.
pub(crate) fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}

/// Little-endian bytes of `v`: the slice itself where the machine is little-endian (no copy).
pub(crate) fn le_bytes<T: LeBytes>(v: &[T]) -> std::borrow::Cow<'_, [u8]> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: u8, u16, u32, f32 and i8 have no padding and every byte pattern of them is
        // a valid u8; the view covers exactly the slice's bytes and borrows it.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v))
        })
    }
    #[cfg(not(target_endian = "little"))]
    {
        std::borrow::Cow::Owned(v.iter().flat_map(|x| x.le()).collect())
    }
}

/// The element types weights come in.
pub(crate) trait LeBytes: Copy {
    #[cfg_attr(target_endian = "little", allow(dead_code))]
    fn le(self) -> Vec<u8>;
}
impl LeBytes for u8 {
    fn le(self) -> Vec<u8> {
        vec![self]
    }
}
impl LeBytes for i8 {
    fn le(self) -> Vec<u8> {
        vec![self as u8]
    }
}
impl LeBytes for u16 {
    fn le(self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
}
impl LeBytes for u32 {
    fn le(self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
}
impl LeBytes for f32 {
    fn le(self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
}
