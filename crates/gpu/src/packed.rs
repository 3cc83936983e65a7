//! Weights of the packed formats (INT8, FP8 block, INT4 g, MXFP4) in GPU memory: each chunk of
//! rows holds the checkpoint's bytes of its rows and, behind them, the scales of those rows.

use crate::matrix::{le_bytes, u32_of, GpuMatrix, ScaleLayout, Target, WeightFormat};
use crate::{Gpu, GpuError};

/// A packed matrix as the CPU holds it: bytes of weights per row and its scales.
struct Packed<'a> {
    format: WeightFormat,
    in_dim: usize,
    weights: &'a [u8],
    row_bytes: usize,
    /// The scales, `scale_bytes` each, `per_row` per row of scales.
    scales: &'a [u8],
    scale_bytes: usize,
    per_row: usize,
    /// Weight rows per row of scales (FP8's row blocks; 1 for the others).
    block_rows: usize,
    /// Inputs per scale.
    block_cols: usize,
}

/// A matrix always takes its own buffers.
fn own(m: Result<Option<GpuMatrix>, GpuError>) -> Result<GpuMatrix, GpuError> {
    Ok(m?.expect("own buffers always take a chunk"))
}

impl Gpu {
    /// Uploads INT8 weights (`w`: rows x `in_dim`) with one f32 scale per row.
    pub fn upload_int8(&self, w: &[i8], scales: &[f32], in_dim: usize) -> Result<GpuMatrix, GpuError> {
        own(self.int8_to(w, scales, in_dim, Target::Own))
    }

    /// Uploads FP8 E4M3 weights (`w`: rows x `in_dim`) with f32 scales per block of
    /// `block.0` rows x `block.1` inputs (ceil(rows / block.0) x ceil(in_dim / block.1)).
    pub fn upload_fp8(
        &self,
        w: &[u8],
        scales: &[f32],
        block: (usize, usize),
        in_dim: usize,
    ) -> Result<GpuMatrix, GpuError> {
        own(self.fp8_to(w, scales, block, in_dim, Target::Own))
    }

    /// Uploads INT4 pack-quantized weights (`packed`: rows x ceil(in_dim / 8) words, code - 8
    /// per nibble, low first) with BF16 scales per `group` inputs (rows x ceil(in_dim / group)).
    pub fn upload_int4(
        &self,
        packed: &[u32],
        scales: &[u16],
        group: usize,
        in_dim: usize,
    ) -> Result<GpuMatrix, GpuError> {
        own(self.int4_to(packed, scales, group, in_dim, Target::Own))
    }

    /// Uploads MXFP4 weights (`packed`: rows x ceil(in_dim / 2) bytes) with E8M0 scales per 32
    /// inputs (rows x ceil(in_dim / 32)).
    pub fn upload_mxfp4(&self, packed: &[u8], scales: &[u8], in_dim: usize) -> Result<GpuMatrix, GpuError> {
        own(self.mxfp4_to(packed, scales, in_dim, Target::Own))
    }

    pub(crate) fn int8_to(
        &self,
        w: &[i8],
        scales: &[f32],
        in_dim: usize,
        target: Target<'_>,
    ) -> Result<Option<GpuMatrix>, GpuError> {
        let bytes = le_bytes(w);
        let scale_bytes = le_bytes(scales);
        let p = Packed {
            format: WeightFormat::Int8,
            in_dim,
            weights: &bytes,
            row_bytes: in_dim,
            scales: &scale_bytes,
            scale_bytes: 4,
            per_row: 1,
            block_rows: 1,
            block_cols: in_dim.max(1),
        };
        self.upload_packed(p, target)
    }

    pub(crate) fn fp8_to(
        &self,
        w: &[u8],
        scales: &[f32],
        block: (usize, usize),
        in_dim: usize,
        target: Target<'_>,
    ) -> Result<Option<GpuMatrix>, GpuError> {
        let scale_bytes = le_bytes(scales);
        let p = Packed {
            format: WeightFormat::Fp8,
            in_dim,
            weights: w,
            row_bytes: in_dim,
            scales: &scale_bytes,
            scale_bytes: 4,
            per_row: in_dim.div_ceil(block.1.max(1)),
            block_rows: block.0,
            block_cols: block.1,
        };
        self.upload_packed(p, target)
    }

    pub(crate) fn int4_to(
        &self,
        packed: &[u32],
        scales: &[u16],
        group: usize,
        in_dim: usize,
        target: Target<'_>,
    ) -> Result<Option<GpuMatrix>, GpuError> {
        let words = le_bytes(packed);
        let scale_bytes = le_bytes(scales);
        let p = Packed {
            format: WeightFormat::Int4,
            in_dim,
            weights: &words,
            row_bytes: 4 * in_dim.div_ceil(8),
            scales: &scale_bytes,
            scale_bytes: 2,
            per_row: in_dim.div_ceil(group.max(1)),
            block_rows: 1,
            block_cols: group,
        };
        self.upload_packed(p, target)
    }

    pub(crate) fn mxfp4_to(
        &self,
        packed: &[u8],
        scales: &[u8],
        in_dim: usize,
        target: Target<'_>,
    ) -> Result<Option<GpuMatrix>, GpuError> {
        let p = Packed {
            format: WeightFormat::Mxfp4,
            in_dim,
            weights: packed,
            row_bytes: in_dim.div_ceil(2),
            scales,
            scale_bytes: 1,
            per_row: in_dim.div_ceil(32),
            block_rows: 1,
            block_cols: 32,
        };
        self.upload_packed(p, target)
    }

    /// Splits `p` by whole rows of scales into chunks that each fit one binding. None: `target`
    /// is a slab slot and had no room, or the matrix takes more than one chunk.
    fn upload_packed(&self, p: Packed, target: Target<'_>) -> Result<Option<GpuMatrix>, GpuError> {
        let format = p.format;
        if p.in_dim == 0 || p.block_rows == 0 || p.block_cols == 0 {
            return Err(GpuError::Shape(format!(
                "{format:?} weights of {} inputs, scale blocks {}x{}",
                p.in_dim, p.block_rows, p.block_cols
            )));
        }
        if p.weights.is_empty() || !p.weights.len().is_multiple_of(p.row_bytes) {
            return Err(GpuError::Shape(format!(
                "{format:?} weights of {} bytes are not rows of {} inputs ({} bytes)",
                p.weights.len(),
                p.in_dim,
                p.row_bytes
            )));
        }
        let rows = p.weights.len() / p.row_bytes;
        let scale_row = p.per_row * p.scale_bytes;
        let want = rows.div_ceil(p.block_rows) * scale_row;
        if p.scales.len() != want {
            return Err(GpuError::Shape(format!(
                "{format:?} scales of {} bytes for {rows} x {} weights: {want} expected",
                p.scales.len(),
                p.in_dim
            )));
        }
        let block_bytes = (p.block_rows * p.row_bytes + scale_row + 32) as u64;
        if block_bytes > self.max_binding {
            return Err(GpuError::Shape(format!(
                "{} rows of {} {format:?} weights with their scales ({block_bytes} bytes) exceed the adapter's largest binding ({} bytes)",
                p.block_rows, p.in_dim, self.max_binding
            )));
        }
        u32_of(rows * p.row_bytes + want + 32, "weight bytes")?;
        let per_chunk = ((self.max_binding / block_bytes) as usize).max(1) * p.block_rows;
        if matches!(target, Target::Slot(_)) && per_chunk < rows {
            return Ok(None);
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let take = per_chunk.min(rows - row0);
            let weights = &p.weights[row0 * p.row_bytes..(row0 + take) * p.row_bytes];
            let s_off = weights.len().next_multiple_of(16);
            let s0 = row0 / p.block_rows * scale_row;
            let s1 = (row0 + take).div_ceil(p.block_rows) * scale_row;
            let parts = [weights, &p.scales[s0..s1]];
            match self.chunk((row0, take), 0, s_off as u32, &parts, target)? {
                Some(c) => chunks.push(c),
                None => return Ok(None),
            }
            row0 += take;
        }
        Ok(Some(GpuMatrix {
            format,
            rows,
            in_dim: p.in_dim,
            chunks,
            scales: ScaleLayout {
                row_bytes: p.row_bytes as u32,
                per_row: p.per_row as u32,
                rows: p.block_rows as u32,
                cols: p.block_cols as u32,
            },
        }))
    }
}
