//! Where each expert's bytes are: its three projections resolved to tensors (weights and scales),
//! and those tensors grouped into the fewest contiguous reads per shard.

use strata_formats::Checkpoint;
use strata_weights::{resolve_linear, ExpertLayout, LinearSpec};

/// Tensors separated by less than this are read together (one request beats two seeks).
const COALESCE_GAP: u64 = 64 << 10;

/// One contiguous read, and where each tensor of the expert sits inside it.
#[derive(Clone, Debug)]
pub struct ReadRun {
    pub shard: usize,
    pub offset: u64,
    pub len: u64,
    /// (tensor index in the expert's list, offset inside the run, length)
    pub pieces: Vec<(usize, u64, u64)>,
}

#[derive(Clone, Debug)]
pub struct ExpertPlan {
    /// gate, up, down
    pub specs: [LinearSpec; 3],
    /// Every tensor name of the expert, in spec order (spec 0's tensors, then spec 1's, ...).
    pub tensors: Vec<String>,
    pub runs: Vec<ReadRun>,
    /// Bytes on disk (sum of tensor lengths; runs may read a little more across gaps).
    pub bytes: u64,
}

impl ExpertPlan {
    pub fn resolve(
        ckpt: &Checkpoint,
        layout: &ExpertLayout,
        layer: usize,
        expert: usize,
    ) -> strata_formats::Result<ExpertPlan> {
        let [g, u, d] = layout.shapes();
        let specs = [
            resolve_linear(ckpt, &layout.tensor_base(layer, expert, 0), g.0, g.1)?,
            resolve_linear(ckpt, &layout.tensor_base(layer, expert, 1), u.0, u.1)?,
            resolve_linear(ckpt, &layout.tensor_base(layer, expert, 2), d.0, d.1)?,
        ];
        let tensors: Vec<String> = specs.iter().flat_map(|s| s.tensors.iter().cloned()).collect();
        let mut located = Vec::with_capacity(tensors.len());
        let mut bytes = 0;
        for (i, name) in tensors.iter().enumerate() {
            let e = ckpt.entry(name)?;
            bytes += e.info.len;
            located.push((e.shard, e.info.offset, e.info.len, i));
        }
        let runs = coalesce(located, u64::MAX);
        Ok(ExpertPlan {
            specs,
            tensors,
            runs,
            bytes,
        })
    }
}

/// Groups tensors `(shard, offset, len, index)` into the fewest reads: tensors of one shard
/// separated by at most [`COALESCE_GAP`] bytes share a read, as long as it stays within
/// `max_run` bytes (a larger tensor is a read of its own).
pub fn coalesce(mut located: Vec<(usize, u64, u64, usize)>, max_run: u64) -> Vec<ReadRun> {
    located.sort();
    let mut runs: Vec<ReadRun> = Vec::new();
    for (shard, offset, len, i) in located {
        match runs.last_mut() {
            Some(r)
                if r.shard == shard
                    && offset >= r.offset + r.len
                    && offset - (r.offset + r.len) <= COALESCE_GAP
                    && offset + len - r.offset <= max_run =>
            {
                r.pieces.push((i, offset - r.offset, len));
                r.len = offset + len - r.offset;
            }
            _ => runs.push(ReadRun {
                shard,
                offset,
                len,
                pieces: vec![(i, 0, len)],
            }),
        }
    }
    runs
}
