//! `--mem`: one budget for everything strata holds, spent where it saves the most bytes read
//! per token.
//!
//! - A resident non-expert byte saves one read at every token: nothing saves more, so the
//!   non-expert weights ("spine") come first, and decoder layers stream (`--spine`: read from
//!   disk each time they run, spread evenly through the model so their reads overlap the
//!   compute of resident ones) only when they cannot all stay.
//! - A byte of expert cache saves a read each time its expert is routed to again (at most once
//!   per token): the expert cache gets what is left, never more than all the experts (what the
//!   model cannot use is left to the system and shown as unused).
//! - Read buffers only as deep as the disk needs: the experts one step can have in flight
//!   (top-k per sequence, doubled with `--prefetch auto|on`, at most the reader threads), as many kept for
//!   reuse, and one layer's worth computed on uncached (experts compute on their read buffers,
//!   so a cached expert is its buffer, counted once, in the cache).
//! - Working memory sized from the model: a step's activations for one prompt chunk, the
//!   logits, and a fixed base for the binary, thread stacks and the allocator.
//!
//! Decoding state is reserved, not hoped for: one sequence holds at most `ctx_size` positions
//! (`--ctx-size`; by default the model's context, capped by a share of `--mem`, or exactly what
//! a run needs when it knows), and all the sequences decoded at once (`sequences`:
//! `--max-concurrent` when serving) share a pool of `state_tokens` positions, besides each
//! sequence's fixed recurrent state (twice: a copy is kept while several sequences step
//! together, so a failed step can be undone). The server admits a request only when its
//! positions fit the pool. `expected_read_per_token` prices the plan: streamed layers plus the
//! expert bytes a token misses if routing were uniform.

use crate::{EngineError, LoadOptions, ModelPlan};

/// Share of `--mem` the decoding-state pool takes by default (1/8), and the fewest positions it
/// offers whatever the budget (or the model's context, when shorter).
const STATE_SHARE_DIVISOR: usize = 8;
pub const MIN_STATE_TOKENS: usize = 2048;

/// Working memory of one step's activations that the default prompt chunk is sized to, and the
/// bytes one token's activations take per hidden unit (a generous estimate over every family:
/// attention projections, MoE intermediates, the residual stream).
const PREFILL_WORK_BYTES: usize = 256 << 20;
const ACTIVATION_BYTES_PER_HIDDEN: usize = 256;
/// Prompt chunks are whole multiples of this (Kimi's linear-attention chunk, so chunked prompts
/// compute the same chunks as whole ones) and at most `MAX_PREFILL_CHUNK` by default.
const PREFILL_CHUNK_STEP: usize = 64;
const MAX_PREFILL_CHUNK: usize = 512;

/// Working memory besides activations and logits: the binary's pages, thread stacks, the
/// allocator's slack, the tokenizer (measured: 16-20 MiB of peak RSS for the tiny models).
const WORK_BASE: usize = 32 << 20;
/// Alignment slack of one expert's reads (a few runs, each rounded out to 4 KiB at both ends).
const READ_SLACK: usize = 64 << 10;

/// How resident non-expert weights are held (`--spine-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpineFormat {
    /// As the checkpoint stores them.
    #[default]
    Native,
    /// Linear layers stored dense or FP8 as INT8 with one scale per row (half of BF16), kept in
    /// a sidecar for the next start; streamed layers stay native.
    Int8,
}

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
    /// Positions one sequence may hold (`--ctx-size`).
    pub ctx_size: usize,
    /// Sequences decoded at once that the reserve is for.
    pub sequences: usize,
    /// Positions all sequences together may hold (the pool the server admits requests into).
    pub state_tokens: usize,
    /// Prompt tokens processed per step at most (`--prefill-chunk`).
    pub prefill_chunk: usize,
    /// Expert reads one step can have in flight.
    pub in_flight: usize,
    /// Read buffers: the reads in flight, as many kept for reuse, one layer's uncached experts.
    pub buffers: usize,
    /// Activations of a step, logits, thread stacks, the allocator's slack.
    pub work: usize,
    pub expert_cache: usize,
    /// `--expert-cache` was given (the cache is not derived from `--mem`).
    pub expert_cache_set: bool,
    /// What the model cannot use (a cache as large as all its experts leaves the rest).
    pub unused: usize,
    /// Bytes a token reads: streamed layers, plus the expert bytes it misses if routing were
    /// uniform (each MoE layer's cache share hits).
    pub expected_read_per_token: u64,
    pub spine_format: SpineFormat,
    /// When the native spine streams and the INT8 one would not: the bytes a token would read
    /// with `--spine-format int8`.
    pub int8_alternative: Option<u64>,
    /// Bytes of all the routed experts (what the cache would need to hold every one).
    pub expert_bytes: u64,
    /// The server's prefix cache (decoding state kept for later requests).
    pub prefix_cache: usize,
}

impl MemoryPlan {
    /// The decoding-state reserve: the position pool and every sequence's fixed state (twice
    /// when several step together: the copy that undoes a failed step).
    pub fn state_reserve(&self) -> usize {
        let copies = if self.sequences > 1 { 2 } else { 1 };
        self.state_per_token * self.state_tokens + copies * self.sequences * self.state_per_sequence
    }

    /// Bytes the plan spends (everything but what is left unused).
    pub fn total(&self) -> usize {
        self.fixed() + self.expert_cache
    }

    /// Everything but the expert cache.
    fn fixed(&self) -> usize {
        self.resident
            + self.state_reserve()
            + self.buffers
            + self.work
            + self.spine_buffers
            + self.prefix_cache
    }

    /// Default budget: 90 % of the memory available now.
    pub fn default_mem() -> usize {
        crate::available_memory().map_or(8 << 30, |m| m / 10 * 9)
    }

    pub fn new(plan: &ModelPlan, options: &LoadOptions) -> Result<MemoryPlan, EngineError> {
        let mem = options.mem.unwrap_or_else(Self::default_mem);
        let (expert_cache, spine) = (options.expert_cache, options.spine);
        let sequences = options.sequences.max(1);
        let state = StateCosts {
            model_ctx: plan.max_positions,
            per_token: plan.state_bytes_per_token,
            per_sequence: plan.state_bytes_per_sequence,
        };
        // What a run says it needs counts as its context, within the model's.
        let needed = (options.positions).map(|n| n.clamp(1, plan.max_positions.max(1)));
        let (ctx_size, state_tokens) = state.pool(mem, options.ctx_size.or(needed), sequences)?;
        let state_tokens = match options.state_tokens {
            Some(n) if n < ctx_size => {
                return Err(EngineError::BadCtxSize(format!(
                    "--state-tokens {n} is less than one sequence's context ({ctx_size}, --ctx-size)"
                )))
            }
            Some(n) => n,
            None => state_tokens,
        };
        let prefill_chunk = options
            .prefill_chunk
            .unwrap_or_else(|| default_prefill_chunk(plan.hidden_dim))
            .clamp(1, ctx_size.max(1));
        let expert = plan.bytes_per_expert() as usize + READ_SLACK;
        let top_k = plan.layout.top_k.min(plan.layout.n_experts);
        let in_flight = (top_k
            * sequences
            * if options.prefetch != strata_experts::Prefetch::Off {
                2
            } else {
                1
            })
        .min(strata_experts::DEFAULT_IO_THREADS);
        let buffers = (2 * in_flight + top_k) * expert;
        let work_for = |chunk: usize| {
            WORK_BASE
                + chunk * ACTIVATION_BYTES_PER_HIDDEN * plan.hidden_dim
                + 2 * sequences * plan.vocab_size * 4
        };
        let work = work_for(prefill_chunk);
        // What a layer costs resident (in the spine's format) and streamed (always as stored).
        let int8 = options.spine_format == SpineFormat::Int8;
        let layers: Vec<usize> = plan.layer_bytes.iter().map(|&b| b as usize).collect();
        let held: Vec<usize> = if int8 {
            plan.layer_bytes_int8.iter().map(|&b| b as usize).collect()
        } else {
            layers.clone()
        };
        let all_held: usize = held.iter().sum();
        let spine_held = if int8 {
            plan.non_expert_bytes_int8
        } else {
            plan.non_expert_bytes
        } as usize;
        let ends = spine_held - all_held;
        let mut p = MemoryPlan {
            mem,
            resident: spine_held,
            streamed: Vec::new(),
            streamed_bytes: 0,
            spine_ahead: SPINE_AHEAD,
            spine_buffers: 0,
            state_per_token: plan.state_bytes_per_token,
            state_per_sequence: plan.state_bytes_per_sequence,
            ctx_size,
            sequences,
            state_tokens,
            prefill_chunk,
            in_flight,
            buffers,
            work,
            expert_cache: 0,
            expert_cache_set: expert_cache.is_some(),
            unused: 0,
            expected_read_per_token: 0,
            spine_format: options.spine_format,
            int8_alternative: None,
            expert_bytes: plan.expert_bytes,
            prefix_cache: match options.prefix_cache {
                crate::PrefixCacheSize::Off => 0,
                crate::PrefixCacheSize::Auto => (plan.state_bytes_per_token * state_tokens).min(mem / 16),
                crate::PrefixCacheSize::Bytes(n) => n,
            },
        };
        let stream = |p: &mut MemoryPlan, k: usize, ahead: usize| {
            p.streamed = spread(&layers, k);
            p.streamed_bytes = p.streamed.iter().map(|&l| layers[l]).sum();
            let largest = p.streamed.iter().map(|&l| layers[l]).max().unwrap_or(0);
            p.spine_ahead = ahead;
            p.spine_buffers = if k == 0 { 0 } else { (ahead + 2) * largest };
            p.resident = ends + all_held - p.streamed.iter().map(|&l| held[l]).sum::<usize>();
        };
        // An explicit --expert-cache is reserved like the rest; a derived one takes what is left.
        let reserved_cache = expert_cache.unwrap_or(0);
        let fits = |p: &MemoryPlan| p.fixed() + reserved_cache <= mem;
        let streamable = layers.iter().filter(|&&b| b > 0).count();
        // Streamed layers, fewest first (each costs its bytes at every token); for each number,
        // reading as far ahead as fits (fewer layers ahead need fewer buffers but hide less of
        // the reads).
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
        // Under a tight --mem, a default prompt chunk shrinks (to PREFILL_CHUNK_STEP at least)
        // before any layer is streamed: a smaller chunk only slows prompts a little.
        if options.prefill_chunk.is_none() && spine != SpineMode::Stream {
            while !fits(&p) && p.prefill_chunk > PREFILL_CHUNK_STEP {
                p.prefill_chunk =
                    (p.prefill_chunk / 2 / PREFILL_CHUNK_STEP * PREFILL_CHUNK_STEP).max(PREFILL_CHUNK_STEP);
                p.work = work_for(p.prefill_chunk);
            }
        }
        match spine {
            SpineMode::Resident => {}
            SpineMode::Stream => stream_fitting(&mut p, streamable..=streamable),
            SpineMode::Auto if !fits(&p) => stream_fitting(&mut p, 1..=streamable),
            SpineMode::Auto => {}
        }
        if !fits(&p) {
            let as_int8 = LoadOptions {
                spine_format: SpineFormat::Int8,
                ..options.clone()
            };
            let hint = if !int8 && MemoryPlan::new(plan, &as_int8).is_ok() {
                "; with --spine-format int8 it fits".to_string()
            } else {
                String::new()
            };
            return Err(EngineError::MemoryTooSmall {
                mem,
                resident: p.resident,
                state: p.state_reserve(),
                buffers: p.buffers + p.work + p.spine_buffers,
                streamed: p.streamed.len(),
                hint,
            });
        }
        let left = mem - p.fixed();
        p.expert_cache = expert_cache.unwrap_or_else(|| left.min(plan.expert_bytes as usize));
        p.unused = left.saturating_sub(p.expert_cache);
        let cached_share = (p.expert_cache as f64 / plan.expert_bytes.max(1) as f64).min(1.0);
        p.expected_read_per_token =
            p.streamed_bytes as u64 + (plan.uncached_token_bytes() as f64 * (1.0 - cached_share)) as u64;
        if !int8 && !p.streamed.is_empty() && options.spine == SpineMode::Auto {
            let as_int8 = LoadOptions {
                spine_format: SpineFormat::Int8,
                ..options.clone()
            };
            if let Ok(q) = MemoryPlan::new(plan, &as_int8) {
                if q.streamed.is_empty() {
                    p.int8_alternative = Some(q.expected_read_per_token);
                }
            }
        }
        Ok(p)
    }
}

/// (positions per sequence, positions of the pool). By default a sequence may hold the model's
/// whole context and the pool `sequences` of them, both within a share of `--mem` (at least
/// [`MIN_STATE_TOKENS`]); an explicit `--ctx-size` is taken as asked (the model's context at
/// most), with a pool of at least one such sequence.
struct StateCosts {
    model_ctx: usize,
    per_token: usize,
    per_sequence: usize,
}

impl StateCosts {
    fn pool(
        &self,
        mem: usize,
        ctx_size: Option<usize>,
        sequences: usize,
    ) -> Result<(usize, usize), EngineError> {
        let model_ctx = self.model_ctx.max(1);
        let copies = if sequences > 1 { 2 } else { 1 };
        let fixed = copies * sequences * self.per_sequence;
        let share = (mem / STATE_SHARE_DIVISOR).saturating_sub(fixed);
        let share_tokens = share
            .checked_div(self.per_token)
            .unwrap_or(usize::MAX)
            .max(MIN_STATE_TOKENS);
        let ctx = match ctx_size {
            Some(0) => return Err(EngineError::BadCtxSize("--ctx-size must be at least 1".into())),
            Some(n) if n > model_ctx => {
                return Err(EngineError::BadCtxSize(format!(
                    "--ctx-size {n} is longer than the model's context ({model_ctx} positions)"
                )))
            }
            Some(n) => n,
            None => model_ctx.min(share_tokens),
        };
        let pool = sequences.saturating_mul(ctx).min(share_tokens.max(ctx));
        Ok((ctx, pool))
    }
}

/// Prompt tokens per step whose activations stay within [`PREFILL_WORK_BYTES`]: a multiple of
/// [`PREFILL_CHUNK_STEP`], at most [`MAX_PREFILL_CHUNK`].
fn default_prefill_chunk(hidden_dim: usize) -> usize {
    let per_token = (ACTIVATION_BYTES_PER_HIDDEN * hidden_dim).max(1);
    let tokens = (PREFILL_WORK_BYTES / per_token).min(MAX_PREFILL_CHUNK);
    (tokens / PREFILL_CHUNK_STEP * PREFILL_CHUNK_STEP).max(PREFILL_CHUNK_STEP)
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
    use super::{default_prefill_chunk, spread, StateCosts};

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

    #[test]
    fn the_state_pool_holds_whole_contexts_within_its_share() {
        let gib = 1usize << 30;
        // 100 KiB per position, 1 MiB per sequence, a 40960-position model.
        let s = StateCosts {
            model_ctx: 40960,
            per_token: 100 << 10,
            per_sequence: 1 << 20,
        };
        // One sequence, 8 GiB: 1 GiB share -> 10485 positions, less the fixed state.
        let (ctx, pool) = s.pool(8 * gib, None, 1).unwrap();
        assert_eq!(ctx, (gib - (1 << 20)) / (100 << 10));
        assert_eq!(pool, ctx);
        // 16 sequences share the same pool; each may still hold a whole context.
        let (ctx16, pool16) = s.pool(8 * gib, None, 16).unwrap();
        assert_eq!(pool16, (gib - 32 * (1 << 20)) / (100 << 10));
        assert_eq!(ctx16, pool16);
        // A huge budget: the model's context, 16 of them in the pool.
        assert_eq!(s.pool(4096 * gib, None, 16).unwrap(), (40960, 16 * 40960));
        // A tiny budget still offers the minimum; an explicit --ctx-size is taken as asked.
        assert_eq!(s.pool(1 << 20, None, 1).unwrap(), (2048, 2048));
        assert_eq!(s.pool(8 * gib, Some(32768), 4).unwrap(), (32768, 32768));
        assert_eq!(s.pool(4096 * gib, Some(100), 4).unwrap(), (100, 400));
        assert!(s.pool(gib, Some(40961), 1).is_err());
        assert!(s.pool(gib, Some(0), 1).is_err());
    }

    #[test]
    fn prompt_chunks_are_whole_linear_attention_chunks() {
        for hidden in [1, 64, 2048, 4096, 7168, 1 << 20] {
            let c = default_prefill_chunk(hidden);
            assert!(c.is_multiple_of(64) && (64..=512).contains(&c), "{hidden}: {c}");
        }
        // Kimi K3's hidden size: 256 MiB of activations / (256 B x 7168) = 146 -> 128.
        assert_eq!(default_prefill_chunk(7168), 128);
    }
}
