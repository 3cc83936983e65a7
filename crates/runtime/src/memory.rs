//! `--mem`: one budget for everything strata holds. Resident non-expert weights, a reserve for
//! decoding state (KV cache), buffers for reads in flight, and the expert cache, which gets what
//! is left (unless `--expert-cache` sets it).

use crate::{EngineError, ModelPlan};

/// Positions of decoding state reserved in the plan (or the model's context, when shorter).
pub const STATE_RESERVE_TOKENS: usize = 8192;

/// Working memory besides reads: activations, logits, thread stacks, allocator slack, the
/// binary and the page cache the kernel needs to make progress under a hard cap.
const WORK_BYTES: usize = 640 << 20;

#[derive(Clone, Debug)]
pub struct MemoryPlan {
    /// The whole budget.
    pub mem: usize,
    /// Non-expert weights, loaded into RAM.
    pub resident: usize,
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
        self.resident + self.state_reserve() + self.buffers + self.expert_cache
    }

    /// Default budget: 90 % of the memory available now.
    pub fn default_mem() -> usize {
        crate::available_memory().map_or(8 << 30, |m| m / 10 * 9)
    }

    pub fn new(
        plan: &ModelPlan,
        mem: Option<usize>,
        expert_cache: Option<usize>,
    ) -> Result<MemoryPlan, EngineError> {
        let mem = mem.unwrap_or_else(Self::default_mem);
        let resident = plan.non_expert_bytes as usize;
        let state_reserve_tokens = STATE_RESERVE_TOKENS.min(plan.max_positions);
        let buffers = 2 * strata_experts::DEFAULT_IO_THREADS * plan.bytes_per_expert() as usize + WORK_BYTES;
        let mut p = MemoryPlan {
            mem,
            resident,
            state_per_token: plan.state_bytes_per_token,
            state_per_sequence: plan.state_bytes_per_sequence,
            state_reserve_tokens,
            buffers,
            expert_cache: 0,
            expert_cache_set: expert_cache.is_some(),
        };
        let fixed = p.resident + p.state_reserve() + p.buffers;
        p.expert_cache = match expert_cache {
            Some(bytes) => bytes,
            None if fixed <= mem => mem - fixed,
            None => {
                return Err(EngineError::MemoryTooSmall {
                    mem,
                    resident: p.resident,
                    state: p.state_reserve(),
                    buffers: p.buffers,
                })
            }
        };
        Ok(p)
    }
}
