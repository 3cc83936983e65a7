//! One sequence of a [`crate::Batch`]: its request, decoding state, sampler, detokenizer and stop
//! matcher, and what it does with the logits of its last position (sample, stream, finish).

use strata_models::KvCache;
use strata_tokenizer::StreamDecoder;

use crate::{
    Engine, EngineError, FinishReason, GenEvent, Request, RequestExtras, Sampler, StopMatcher, TokenLogprobs,
};

/// Copies of a recurrent state one sequence keeps at most (see [`SeqState::mark`]).
pub(crate) const MAX_MARKS: usize = 16;

pub(crate) struct SeqState {
    /// The caller's id for this sequence.
    pub id: u64,
    pub request: Request,
    pub extras: RequestExtras,
    pub cache: KvCache,
    sampler: Sampler,
    seen: Vec<u32>,
    pub generated: Vec<u32>,
    decoder: StreamDecoder,
    stop: StopMatcher,
    /// Tokens not yet fed to the model: the prompt (fed a chunk per step), then one sampled
    /// token at a time.
    pub pending: Vec<u32>,
    /// A forward pass or a step after it failed (its cache may hold part of a pass).
    pub failed: bool,
    /// The grammar its output must match.
    pub(crate) guided: Option<crate::guided::Guided>,
    /// Copies of its recurrent state as its prompt was fed (see [`crate::Batch::mark_prompts`]).
    pub marks: Vec<crate::Mark>,
}

/// log-softmax of `logits` at `id` and the `k` most likely tokens (masked ones never among them).
pub(crate) fn logprobs_of(logits: &[f32], id: u32, k: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|l| ((l - max) as f64).exp()).sum::<f64>().ln() as f32;
    let mut order: Vec<u32> = (0..logits.len() as u32)
        .filter(|&t| logits[t as usize].is_finite())
        .collect();
    let k = k.min(order.len());
    if k > 0 {
        order.select_nth_unstable_by(k - 1, |&a, &b| {
            logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b))
        });
        order.truncate(k);
        order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    } else {
        order.clear();
    }
    TokenLogprobs {
        logprob: logits[id as usize] - lse,
        top: order.iter().map(|&t| (t, logits[t as usize] - lse)).collect(),
    }
}

impl SeqState {
    pub fn new(engine: &Engine, id: u64, request: Request, extras: RequestExtras) -> SeqState {
        let resume = crate::Resume {
            cache: engine.new_cache(),
            marks: Vec::new(),
        };
        SeqState::resume(engine, id, request, extras, resume)
    }

    /// A sequence whose cache already holds the first tokens of its prompt (a conversation's
    /// earlier turns): only the rest is fed.
    pub fn resume(
        engine: &Engine,
        id: u64,
        request: Request,
        extras: RequestExtras,
        resume: crate::Resume,
    ) -> SeqState {
        let crate::Resume { mut cache, marks } = resume;
        let reused = cache.len;
        debug_assert!(reused < request.prompt.len());
        cache.reserve(engine.positions(&request));
        SeqState {
            id,
            cache,
            sampler: Sampler::new(request.sampling.clone()),
            seen: request.prompt.clone(),
            generated: Vec::new(),
            decoder: StreamDecoder::new(!extras.keep_special),
            stop: StopMatcher::new(request.stop.clone()),
            pending: request.prompt[reused..].to_vec(),
            request,
            extras,
            failed: false,
            guided: None,
            marks,
        }
    }

    /// Keeps a copy of its recurrent state where it stands (none without one). Past
    /// [`MAX_MARKS`] copies, every other older one goes (the spacing doubles), so a long prompt's
    /// copies stay bounded.
    pub fn mark(&mut self) {
        let at = self.cache.len;
        if self.cache.has_recurrent() && self.marks.last().is_none_or(|m| m.at < at) {
            let mut state = Vec::new();
            self.cache.save_recurrent(&mut state);
            self.marks.push(crate::Mark { at, state });
            if self.marks.len() > MAX_MARKS {
                let last = self.marks.len() - 1;
                let mut i = 0;
                self.marks.retain(|_| {
                    i += 1;
                    (i - 1) % 2 == 1 || i - 1 == last
                });
            }
        }
    }

    /// The tokens the cache holds: the prompt and the generated tokens fed so far.
    pub fn cached_tokens(&self) -> Vec<u32> {
        let all = self.request.prompt.iter().chain(&self.generated);
        all.take(self.cache.len).copied().collect()
    }

    /// Whether the next feed is (part of) a prompt rather than one sampled token.
    pub fn prefilling(&self) -> bool {
        self.pending.len() > 1
    }

    /// Samples from the last position's `logits` (V,), streams the token's text, and says
    /// whether the sequence ends. Ids the tokenizer cannot decode (`masked`) are never sampled.
    /// Returns (finish, the consumer still wants it).
    pub fn advance(
        &mut self,
        engine: &Engine,
        mut logits: Vec<f32>,
        on_event: &mut dyn FnMut(u64, GenEvent<'_>) -> bool,
    ) -> Result<(Option<FinishReason>, bool), EngineError> {
        for &id in &engine.masked_ids {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        if let Some(g) = &mut self.guided {
            g.mask(&mut logits).map_err(EngineError::Guide)?;
        }
        let id = strata_kernels::profile::span("sampling", 1, || {
            self.sampler.sample(&logits, &self.seen, &self.generated)
        });
        let guide_done = match &mut self.guided {
            Some(g) => {
                g.take(id).map_err(EngineError::Guide)?;
                g.done()
            }
            None => false,
        };
        let lp = self.extras.logprobs.map(|k| logprobs_of(&logits, id, k));
        self.seen.push(id);
        self.generated.push(id);
        self.pending = vec![id];

        let is_eos = engine.generation.eos_token_ids.contains(&id);
        let ends = is_eos && !self.request.ignore_eos;
        let mut text = String::new();
        let mut stop_hit = false;
        if let (Some(tok), false) = (&engine.tokenizer, ends) {
            if let Some(delta) = self.decoder.push(tok, id)? {
                let (out, hit) = self.stop.push(&delta);
                text = out;
                stop_hit = hit;
            }
        }
        let ctx = engine.memory.ctx_size;
        let mut finish = if stop_hit || ends || guide_done {
            Some(FinishReason::Stop)
        } else if self.generated.len() >= self.request.max_new_tokens || self.cache.len + 1 >= ctx {
            Some(FinishReason::Length)
        } else {
            None
        };
        if finish.is_some() && !stop_hit {
            // Release what the detokenizer and the stop matcher still hold.
            if let Some(tok) = &engine.tokenizer {
                if let Some(rest) = self.decoder.flush(tok)? {
                    let (out, hit) = self.stop.push(&rest);
                    text.push_str(&out);
                    stop_hit = hit;
                }
            }
            if stop_hit {
                finish = Some(FinishReason::Stop);
            } else {
                text.push_str(&self.stop.finish());
            }
        }
        let alive = on_event(
            self.id,
            GenEvent::Token {
                id,
                text: &text,
                logprobs: lp.as_ref(),
            },
        );
        Ok((finish, alive))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_with_the_top_tokens_first() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let lp = logprobs_of(&logits, 2, 3);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((lp.logprob - (2f32.exp() / z).ln()).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert!(logprobs_of(&logits, 0, 0).top.is_empty());
    }

    #[test]
    fn masked_ids_never_appear_among_the_top_logprobs() {
        let logits = [1.0f32, f32::NEG_INFINITY, 2.0];
        let lp = logprobs_of(&logits, 0, 5);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![2, 0]);
        assert!(lp.top.iter().all(|t| t.1.is_finite()));
    }
}
