//! A MoE layer's routed rows on the GPU, with one table per layer ([`Recorder::routing`]) that
//! says which token rows go to each expert and how each token sums its experts' outputs. One
//! dispatch gathers every expert's rows, packed expert after expert
//! ([`Recorder::gather_routed`]). The experts' products then run on their slices
//! ([`Recorder::matmul_at`]), and one dispatch sums each token's weighted outputs in ascending
//! expert order ([`Recorder::combine`]). So a token's sum never depends on its batch, and a layer
//! costs one upload and two dispatches besides its products.

use crate::ops::{grid, need, GpuTensor, Recorder};
use crate::ops_state::Kernel;
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
        let (groups, line) = grid(p);
        let mut prm = [0u32; 16];
        prm[..3].copy_from_slice(&[p as u32, dim as u32, 0]);
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
        let (groups, line) = grid(t);
        let mut prm = [0u32; 16];
        prm[..4].copy_from_slice(&[t as u32, dim as u32, p as u32, (p + t + 1) as u32]);
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
