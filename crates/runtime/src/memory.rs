//! `--mem`: one budget for everything strata holds. Resident non-expert weights, a reserve for
//! decoding state (KV cache), buffers for reads in flight, and the expert cache, which gets what
//! is left (unless `--expert-cache` sets it).
//!
//! When the non-expert weights do not fit, decoder layers are streamed instead (`--spine`):
//! their weights are read from disk each time they run. A resident byte of a layer saves a read
//! of that byte at every token, more than a byte of expert cache saves (experts hit less than
//! always), so the plan keeps as many layers resident as fit once the expert cache has a
//! minimum (two MoE layers of active experts, room for the next layer's prefetched guesses),
//! and streams the rest, spread evenly through the model so their reads overlap the compute
//! of the resident ones.

use crate::{EngineError, ModelPlan};

/// Positions of decoding state reserved in the plan (or the model's context, when shorter).
pub const STATE_RESERVE_TOKENS: usize = 8192;

/// Working memory besides reads: activations, logits, thread stacks, allocator slack, the
/// binary and the page cache the kernel needs to make progress under a hard cap.
const WORK_BYTES: usize = 640 << 20;

/// What happens to non-expert weights (`--spine`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpineMode {
    /// Resident when they fit, otherwise as many layers resident as fit and the rest streamed.
    #[default]
    Auto,
    /// All resident (an error when they do not fit).
    Resident,
    /// Every decoder layer streamed (the embedding, final norm and head stay resident).
    Stream,
}

/// Streamed layers read ahead of the one computing, at most (fewer when the budget is tight).
pub const SPINE_AHEAD: usize = strata_experts::DEFAULT_AHEAD;

#[derive(Clone, Debug)]
pub struct MemoryPlan {
    /// The whole budget.
    pub mem: usize,
    /// Non-expert weights, loaded into RAM.
    pub resident: usize,
    /// Decoder layers whose non-expert weights stream (read at every token), in order.
    pub streamed: Vec<usize>,
    /// Bytes the streamed layers read per token.
    pub streamed_bytes: usize,
    /// Streamed layers read ahead of the one computing.
    pub spine_ahead: usize,
    /// Read buffers of streamed layers (the ones ahead, the one computing, one recycled).
    pub spine_buffers: usize,
    pub state_per_token: usize,
    /// State one sequence holds whatever its length (recurrent layers).
    pub state_per_sequence: usize,
    pub state_reserve_tokens: usize,
    /// Expert reads in flight (raw buffer + decoded copy per reader thread) and working memory.
    pub buffers: usize,
    pub expert_cache: usize,
    /// `--expert-cache` was given (the cache is not derived from `--mem`).
    pub expert_cache_set: bool,
}

impl MemoryPlan {
    /// One sequence of `state_reserve_tokens` positions.
    pub fn state_reserve(&self) -> usize {
        self.state_per_token * self.state_reserve_tokens + self.state_per_sequence
    }

    /// Bytes the plan accounts for.
    pub fn total(&self) -> usize {
        self.resident + self.state_reserve() + self.buffers + self.spine_buffers + self.expert_cache
    }

    /// Default budget: 90 % of the memory available now.
    pub fn default_mem() -> usize {
        crate::available_memory().map_or(8 << 30, |m| m / 10 * 9)
    }

    pub fn new(
        plan: &ModelPlan,
        mem: Option<usize>,
        expert_cache: Option<usize>,
        spine: SpineMode,
    ) -> Result<MemoryPlan, EngineError> {
        let mem = mem.unwrap_or_else(Self::default_mem);
        let state_reserve_tokens = STATE_RESERVE_TOKENS.min(plan.max_positions);
        let buffers = 2 * strata_experts::DEFAULT_IO_THREADS * plan.bytes_per_expert() as usize + WORK_BYTES;
        let layers: Vec<usize> = plan.layer_bytes.iter().map(|&b| b as usize).collect();
        let all_layers: usize = layers.iter().sum();
        let ends = plan.non_expert_bytes as usize - all_layers;
        let mut p = MemoryPlan {
            mem,
            resident: plan.non_expert_bytes as usize,
            streamed: Vec::new(),
            streamed_bytes: 0,
            spine_ahead: SPINE_AHEAD,
            spine_buffers: 0,
            state_per_token: plan.state_bytes_per_token,
            state_per_sequence: plan.state_bytes_per_sequence,
            state_reserve_tokens,
            buffers,
            expert_cache: 0,
            expert_cache_set: expert_cache.is_some(),
        };
        let stream = |p: &mut MemoryPlan, k: usize, ahead: usize| {
            p.streamed = spread(&layers, k);
            p.streamed_bytes = p.streamed.iter().map(|&l| layers[l]).sum();
            let largest = p.streamed.iter().map(|&l| layers[l]).max().unwrap_or(0);
            p.spine_ahead = ahead;
            p.spine_buffers = (ahead + 2) * largest;
            p.resident = ends + all_layers - p.streamed_bytes;
        };
        let min_cache = expert_cache.unwrap_or(2 * plan.layout.top_k * plan.bytes_per_expert() as usize);
        let fixed = |p: &MemoryPlan| p.resident + p.state_reserve() + p.buffers + p.spine_buffers;
        let fits = |p: &MemoryPlan| fixed(p) + min_cache <= mem;
        let streamable = layers.iter().filter(|&&b| b > 0).count();
        // Streamed layers, fewest first; for each number, reading as far ahead as fits (fewer
        // layers ahead need fewer buffers but hide less of the reads).
        let stream_fitting = |p: &mut MemoryPlan, counts: std::ops::RangeInclusive<usize>| {
            for k in counts {
                for ahead in (0..=SPINE_AHEAD).rev() {
                    stream(p, k, ahead);
                    if fits(p) {
                        return;
                    }
                }
            }
            stream(p, streamable, SPINE_AHEAD);
        };
        match spine {
            SpineMode::Resident => {}
            SpineMode::Stream => stream_fitting(&mut p, streamable..=streamable),
            SpineMode::Auto if !fits(&p) => stream_fitting(&mut p, 1..=streamable),
            SpineMode::Auto => {}
        }
        p.expert_cache = match expert_cache {
            Some(bytes) => bytes,
            None if fixed(&p) <= mem => mem - fixed(&p),
            None => {
                return Err(EngineError::MemoryTooSmall {
                    mem,
                    resident: p.resident,
                    state: p.state_reserve(),
                    buffers: p.buffers + p.spine_buffers,
                    streamed: p.streamed.len(),
                })
            }
        };
        Ok(p)
    }
}

/// `k` of the layers with weights, spread evenly (largest gaps first), in order.
fn spread(layers: &[usize], k: usize) -> Vec<usize> {
    let candidates: Vec<usize> = (0..layers.len()).filter(|&l| layers[l] > 0).collect();
    let n = candidates.len();
    let k = k.min(n);
    (0..n)
        .filter(|&i| (i + 1) * k / n > i * k / n)
        .map(|i| candidates[i])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn streamed_layers_are_spread_evenly() {
        let layers = [5usize; 8];
        assert_eq!(spread(&layers, 0), Vec::<usize>::new());
        assert_eq!(spread(&layers, 2), vec![3, 7]);
        assert_eq!(spread(&layers, 4), vec![1, 3, 5, 7]);
        assert_eq!(spread(&layers, 8), (0..8).collect::<Vec<_>>());
        // Layers without weights of their own are never streamed.
        assert_eq!(spread(&[0, 5, 0, 5], 9), vec![1, 3]);
    }
}
