//! Attention on the GPU: absorbed MLA's per-head products ([`Recorder::head_matvec`]) and
//! causal attention over a cached sequence in splits of positions ([`Recorder::attend`]).

use crate::matrix::{u32_of, MAX_GROUPS};
use crate::ops::{need, shape, AttendShape, GpuTensor, Recorder, MAX_HEAD};
use crate::ops_state::Kernel;
use crate::GpuError;

/// Rows per workgroup of a per-head product (`HM_ROWS` in the shader).
const HEAD_MATVEC_ROWS: usize = 16;
/// Positions per split of a token's attention (`SPLIT` in the shader).
const ATTEND_SPLIT: usize = 64;
/// The most bytes of attention splits one dispatch writes, and at most one binding's (a
/// prompt's tokens go in blocks).
const ATTEND_PARTS_MOST: usize = 64 << 20;

impl Recorder<'_> {
    /// Per head h of each of `tokens` tokens: `y[t][h][..rows]` = `m[h]` (rows x cols, f32) times
    /// `x[t][h][..cols]`, then the `extra` values of `x[t][h]` after its first `cols` copied
    /// after them. Rows of `x` and `y` per head: `x_stride` and `y_stride` values.
    #[allow(clippy::too_many_arguments)]
    pub fn head_matvec(
        &mut self,
        m: &GpuTensor,
        x: &GpuTensor,
        y: &GpuTensor,
        tokens: usize,
        heads: usize,
        (rows, cols): (usize, usize),
        (x_stride, y_stride): (usize, usize),
        extra: usize,
    ) -> Result<(), GpuError> {
        need(m, heads * rows * cols, "per-head matrices")?;
        need(x, tokens * heads * x_stride, "per-head inputs")?;
        need(y, tokens * heads * y_stride, "per-head outputs")?;
        if cols + extra > x_stride || rows + extra > y_stride || cols > MAX_HEAD {
            return Err(shape(format!(
                "per-head products of {rows}x{cols} (+{extra}) over rows of {x_stride} into rows of {y_stride}"
            )));
        }
        if tokens == 0 || heads == 0 {
            return Ok(());
        }
        if tokens > MAX_GROUPS || heads > MAX_GROUPS {
            return Err(shape(format!("{tokens} tokens of {heads} heads in one dispatch")));
        }
        let mut p = [0u32; 16];
        p[..6].copy_from_slice(&[
            heads as u32,
            rows as u32,
            cols as u32,
            x_stride as u32,
            y_stride as u32,
            extra as u32,
        ]);
        // Blocks of HEAD_MATVEC_ROWS rows (the shader's HM_ROWS) on workgroups of their own.
        let blocks = rows.div_ceil(HEAD_MATVEC_ROWS).max(1) as u32;
        let groups = [heads as u32, tokens as u32, blocks];
        self.kernel(Kernel::HeadMatvec, [Some(y), Some(x), None, Some(m)], p, groups);
        Ok(())
    }

    /// Causal attention of one sequence's new tokens: `out` rows `s.row0..` get each query
    /// head's softmax-weighted sum of the cached values (`v_cache`) over the cached keys
    /// (`k_cache`) up to its own position, which the caches already hold.
    pub fn attend(
        &mut self,
        out: &GpuTensor,
        q: &GpuTensor,
        k_cache: &GpuTensor,
        v_cache: &GpuTensor,
        s: &AttendShape,
    ) -> Result<(), GpuError> {
        need(q, (s.row0 + s.tokens) * s.heads * s.head_dim, "queries")?;
        need(
            out,
            (s.row0 + s.tokens) * s.heads * s.value_dim,
            "attention outputs",
        )?;
        let positions = s.start_pos + s.tokens;
        need(k_cache, positions * s.kv_width, "cached keys")?;
        need(v_cache, positions * s.kv_width, "cached values")?;
        let kv_heads = s.heads / s.group.max(1);
        if s.head_dim > MAX_HEAD
            || s.value_dim > MAX_HEAD
            || s.group == 0
            || !s.heads.is_multiple_of(s.group)
            || kv_heads * s.head_dim.max(s.value_dim) > s.kv_width
        {
            return Err(shape(format!(
                "attention of {} heads in groups of {} over {} values per position, heads of {}",
                s.heads, s.group, s.kv_width, s.head_dim
            )));
        }
        if s.tokens == 0 {
            return Ok(());
        }
        if s.tokens > MAX_GROUPS || s.heads > MAX_GROUPS {
            return Err(shape(format!(
                "{} tokens of {} heads in one dispatch",
                s.tokens, s.heads
            )));
        }
        let mut p = [0u32; 16];
        p[..8].copy_from_slice(&[
            s.heads as u32,
            s.group as u32,
            s.head_dim as u32,
            s.kv_width as u32,
            s.row0 as u32,
            u32_of(s.start_pos, "position")?,
            s.window.map_or(0, |w| w.max(1) as u32),
            s.scale.to_bits(),
        ]);
        p[8] = s.value_dim as u32;
        // Each token's seen positions in splits of ATTEND_SPLIT, from its first seen one; the
        // last token sees the most.
        let seen = positions.min(s.window.map_or(usize::MAX, |w| w.max(1)));
        let splits = seen.div_ceil(ATTEND_SPLIT);
        p[10] = u32_of(splits, "attention splits")?;
        let per_token = s.heads * splits * (s.value_dim + 2);
        let most = (self.gpu().max_binding as usize).min(ATTEND_PARTS_MOST);
        let block = (most / 4 / per_token).clamp(1, s.tokens);
        if splits > MAX_GROUPS {
            return Err(shape(format!("{seen} positions seen in one dispatch")));
        }
        let parts = self.gpu().tensor(block * per_token)?;
        for t0 in (0..s.tokens).step_by(block) {
            let n = block.min(s.tokens - t0);
            p[9] = t0 as u32;
            let g = [s.heads as u32, n as u32, splits as u32];
            self.kernel(
                Kernel::AttendPart,
                [Some(&parts), Some(q), Some(k_cache), Some(v_cache)],
                p,
                g,
            );
            let g = [s.heads as u32, n as u32, 1];
            self.kernel(Kernel::AttendCombine, [Some(out), Some(&parts), None, None], p, g);
        }
        Ok(())
    }
}
