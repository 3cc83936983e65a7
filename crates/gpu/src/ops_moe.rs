//! A MoE layer's routed rows on the GPU, with one table per layer ([`Recorder::routing`]) that
//! says which token rows go to each expert and how each token sums its experts' outputs. One
//! dispatch gathers every expert's rows, packed expert after expert
//! ([`Recorder::gather_routed`]). The experts' products then run on their slices
//! ([`Recorder::matmul_at`]), and one dispatch sums each token's weighted outputs in ascending
//! expert order ([`Recorder::combine`]). So a token's sum never depends on its batch, and a layer
//! costs one upload and two dispatches besides its products. The experts' products themselves
//! run as one dispatch for all the experts whose matrices share a slab
//! ([`Recorder::matmul_experts`]).

use crate::matrix::{u32_of, GpuMatrix, MatmulParams, Tile, MAX_GROUPS};
use crate::ops::{grid, need, GpuTensor, Recorder};
use crate::ops_state::Kernel;
use crate::product::{chunk_base, row_grid, Dispatch};
use crate::GpuError;

/// Where each expert's rows lie once gathered, and the table the kernels read.
pub struct Routing {
    /// [packed rows' token indices (P)] [each token's first entry (T + 1)] [entries (2P):
    /// (packed row, weight), each token's in ascending expert order].
    table: GpuTensor,
    /// Each expert's first packed row, and the number of rows after the last.
    starts: Vec<usize>,
    tokens: usize,
}

impl Routing {
    /// Values of a table of `tokens` tokens picking `k` experts each, of `experts` experts, as
    /// [`Recorder::route_table`] writes it (each expert's first packed row after the rest).
    pub fn table_len(tokens: usize, k: usize, experts: usize) -> usize {
        3 * tokens * k + tokens + 1 + experts + 1
    }

    /// A table made on the GPU, with each expert's first packed row (and the end) as the CPU
    /// knows them.
    pub(crate) fn from_table(table: GpuTensor, starts: Vec<usize>, tokens: usize) -> Routing {
        Routing {
            table,
            starts,
            tokens,
        }
    }

    /// The table (its values are u32 bits but for the weights).
    pub fn table(&self) -> &GpuTensor {
        &self.table
    }

    /// Token rows of the batch.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Rows of all experts together.
    pub fn rows(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// Expert `i`'s first packed row and its number of rows.
    pub fn expert(&self, i: usize) -> (usize, usize) {
        (self.starts[i], self.starts[i + 1] - self.starts[i])
    }
}

impl Recorder<'_> {
    /// The table for `experts`, each expert's (token row, weight) pairs, the experts in the
    /// order each token sums them (ascending ids), over a batch of `tokens` rows; uploaded once.
    pub fn routing(&mut self, experts: &[&[(usize, f32)]], tokens: usize) -> Result<Routing, GpuError> {
        let mut starts = Vec::with_capacity(experts.len() + 1);
        let mut rows = Vec::new();
        let mut per_token: Vec<Vec<(usize, f32)>> = vec![Vec::new(); tokens];
        for list in experts {
            starts.push(rows.len());
            for &(t, w) in list.iter() {
                if t >= tokens {
                    return Err(GpuError::Shape(format!(
                        "an expert routed token row {t} of a batch of {tokens}"
                    )));
                }
                per_token[t].push((rows.len(), w));
                rows.push(t);
            }
        }
        starts.push(rows.len());
        let p = rows.len();
        let bits = |v: usize| -> Result<f32, GpuError> {
            Ok(f32::from_bits(crate::matrix::u32_of(v, "routed rows")?))
        };
        let mut table = Vec::with_capacity(3 * p + tokens + 1);
        for &t in &rows {
            table.push(bits(t)?);
        }
        let mut at = 0;
        for list in &per_token {
            table.push(bits(at)?);
            at += list.len();
        }
        table.push(bits(at)?);
        for &(r, w) in per_token.iter().flatten() {
            table.extend([bits(r)?, w]);
        }
        Ok(Routing {
            table: self.gpu().upload_tensor(&table)?,
            starts,
            tokens,
        })
    }

    /// Row j of `dst` (rows of `dim`) = the row of `src` that packed row j stands for.
    pub fn gather_routed(
        &mut self,
        src: &GpuTensor,
        routing: &Routing,
        dim: usize,
        dst: &GpuTensor,
    ) -> Result<(), GpuError> {
        let p = routing.rows();
        need(src, routing.tokens * dim, "rows to gather")?;
        need(dst, p * dim, "gathered rows")?;
        if p == 0 {
            return Ok(());
        }
        // A workgroup per block of 128 values of a row.
        let blocks = dim.div_ceil(128).max(1);
        let (groups, line) = grid(p * blocks);
        let mut prm = [0u32; 16];
        prm[..3].copy_from_slice(&[p as u32, dim as u32, 0]);
        prm[4] = blocks as u32;
        prm[15] = line;
        let table = &routing.table;
        self.kernel(
            Kernel::Gather,
            [Some(dst), Some(src), Some(table), None],
            prm,
            groups,
        );
        Ok(())
    }

    /// Row t of `dst` (rows of `dim`) = the sum of token t's experts' rows of `ys` (packed as
    /// gathered), each times its weight, in ascending expert order from zero.
    pub fn combine(
        &mut self,
        dst: &GpuTensor,
        ys: &GpuTensor,
        routing: &Routing,
        dim: usize,
    ) -> Result<(), GpuError> {
        let (p, t) = (routing.rows(), routing.tokens);
        need(ys, p * dim, "expert outputs")?;
        need(dst, t * dim, "combined rows")?;
        if t == 0 {
            return Ok(());
        }
        let blocks = dim.div_ceil(128).max(1);
        let (groups, line) = grid(t * blocks);
        let mut prm = [0u32; 16];
        prm[..4].copy_from_slice(&[t as u32, dim as u32, p as u32, (p + t + 1) as u32]);
        prm[4] = blocks as u32;
        prm[15] = line;
        let table = &routing.table;
        self.kernel(
            Kernel::Combine,
            [Some(dst), Some(ys), Some(table), None],
            prm,
            groups,
        );
        Ok(())
    }
}

/// The experts of one grouped dispatch: their slab, their scales' offset, their indices.
struct Group<'a> {
    slab: &'a wgpu::Buffer,
    s_off: u32,
    experts: Vec<usize>,
}

impl Recorder<'_> {
    /// Expert i's rows of `y` = `ms[i]` applied to its rows of `x`: `rows[i].1` rows from row
    /// `rows[i].0`, packed as a [`Routing`] lays them out (rows of `x` of the matrices' inputs,
    /// of `y` of their outputs). Each output has the bits [`Recorder::matmul_at`] gives it. The
    /// experts whose matrices lie in one slab run as one dispatch, each workgroup on one item
    /// (an expert and a block of its rows); the others as a product each.
    pub fn matmul_experts(
        &mut self,
        ms: &[&GpuMatrix],
        rows: &[(usize, usize)],
        x: &GpuTensor,
        y: &GpuTensor,
    ) -> Result<(), GpuError> {
        let Some(first) = ms.first() else {
            return Ok(());
        };
        let (out, ind) = (first.rows, first.in_dim);
        if ms.len() != rows.len() {
            return Err(GpuError::Shape(format!(
                "{} experts, {} row ranges",
                ms.len(),
                rows.len()
            )));
        }
        if let Some(m) = ms
            .iter()
            .find(|m| m.rows != out || m.in_dim != ind || m.format != first.format)
        {
            return Err(GpuError::Shape(format!(
                "experts of one product are {:?} {}x{} and {:?} {}x{}",
                first.format, out, ind, m.format, m.rows, m.in_dim
            )));
        }
        let end = rows.iter().map(|r| r.0 + r.1).max().unwrap_or(0);
        need(x, end * ind, "experts' activations")?;
        need(y, end * out, "experts' outputs")?;
        let most = rows.iter().map(|r| r.1).max().unwrap_or(0);
        let tile = self
            .gpu()
            .forced_tile
            .unwrap_or(Tile::for_product(most.min(2), out, ind));
        let mut groups: Vec<Group<'_>> = Vec::new();
        for (i, m) in ms.iter().enumerate() {
            let (r0, n) = rows[i];
            match m.slab() {
                _ if n == 0 => {}
                Some(slab) if m.scales == first.scales => {
                    let s_off = m.chunks[0].s_off;
                    match groups.iter_mut().find(|g| g.slab == slab && g.s_off == s_off) {
                        Some(g) => g.experts.push(i),
                        None => groups.push(Group {
                            slab,
                            s_off,
                            experts: vec![i],
                        }),
                    }
                }
                _ => self.matmul_at(m, x, r0 * ind, n, y, r0 * out)?,
            }
        }
        if groups.is_empty() {
            return Ok(());
        }
        // Every group's items, one upload: (start in `w`, first row, rows, first row taken).
        let mut items: Vec<f32> = Vec::new();
        let mut spans = Vec::with_capacity(groups.len());
        for g in &groups {
            let at = items.len() / 4;
            for &i in &g.experts {
                let m = ms[i];
                let (elem0, w0) = chunk_base(m, &m.chunks[0])?;
                let base = if m.format.packed() { w0 } else { elem0 };
                let (r0, n) = (
                    u32_of(rows[i].0, "first routed row")?,
                    u32_of(rows[i].1, "routed rows")?,
                );
                for t0 in (0..n).step_by(tile.tokens as usize) {
                    items.extend([base, r0, n, t0].map(f32::from_bits));
                }
            }
            spans.push((at, items.len() / 4 - at));
        }
        let table = self.gpu().upload_tensor(&items)?;
        let (grid_x, grid_y) = row_grid(out, tile);
        for (g, (at, n)) in groups.iter().zip(spans) {
            for &i in &g.experts {
                self.hold_slots(ms[i]);
            }
            for from in (0..n).step_by(MAX_GROUPS) {
                let p = MatmulParams {
                    rows: u32_of(out, "rows")?,
                    in_dim: u32_of(ind, "inputs")?,
                    tokens: 0,
                    out_stride: u32_of(out, "rows")?,
                    row0: 0,
                    grid_x: grid_x as u32,
                    elem0: 0,
                    s_off: g.s_off,
                    scales: first.scales,
                    x0: 0,
                    y0: 0,
                    w0: 0,
                    items0: u32_of(at + from, "first item")?,
                };
                let d = Dispatch {
                    params: p.bytes(),
                    groups: [grid_x as u32, grid_y as u32, (n - from).min(MAX_GROUPS) as u32],
                };
                self.push_grouped((first.format, tile), (g.slab, d), (&table, None), x, y);
            }
        }
        Ok(())
    }
}
