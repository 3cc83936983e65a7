//! The generation loop: one forward pass per step for every active sequence together (so an
//! expert read once serves all of them), sampling, streaming text, EOS, stop strings and length
//! limits. [`Batch`] is continuous: sequences join between steps (their prompt is processed in
//! the step they join) and leave when they finish or their consumer goes away. A sequence's
//! logits never depend on what else is in the batch (batch-invariant kernels), so greedy output is
//! the same alone or under load. [`Engine::generate`] runs a fixed set of requests to completion.

use strata_models::{KvCache, SeqInput};
use strata_tokenizer::StreamDecoder;

use crate::{Engine, EngineError, Sampler, SamplingParams, StopMatcher};

#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
}

/// Options of a request beyond the CLI's (the server's).
#[derive(Clone, Debug, Default)]
pub struct RequestExtras {
    /// Report the sampled token's log-probability and this many most likely alternatives.
    pub logprobs: Option<usize>,
    /// Stream special tokens' text too (tool-call and reasoning markers); the EOS that ends a
    /// sequence is never text.
    pub keep_special: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS or a stop string.
    Stop,
    /// max_new_tokens or the model's context reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Log-probabilities (natural log, of the model's distribution before sampling filters) of a
/// sampled token and the most likely tokens at its step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// (id, logprob), most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug)]
pub enum GenEvent<'a> {
    /// A new token and the text it released (may be empty while text is held back).
    Token {
        id: u32,
        text: &'a str,
        logprobs: Option<&'a TokenLogprobs>,
    },
    Done {
        reason: FinishReason,
    },
}

struct SeqState {
    /// The caller's id for this sequence.
    id: u64,
    request: Request,
    extras: RequestExtras,
    cache: KvCache,
    sampler: Sampler,
    seen: Vec<u32>,
    generated: Vec<u32>,
    decoder: StreamDecoder,
    stop: StopMatcher,
    /// Tokens fed in the next step (the prompt, then one sampled token at a time).
    next: Vec<u32>,
}

/// log-softmax of `logits` at `id` and the `k` most likely tokens.
fn logprobs_of(logits: &[f32], id: u32, k: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|l| ((l - max) as f64).exp()).sum::<f64>().ln() as f32;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(logits.len());
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

/// Sequences decoded together, step by step.
pub struct Batch<'e> {
    engine: &'e Engine,
    seqs: Vec<SeqState>,
}

impl<'e> Batch<'e> {
    pub fn new(engine: &'e Engine) -> Batch<'e> {
        Batch {
            engine,
            seqs: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Checks a request against the model (empty prompt, context length) without adding it.
    pub fn check(&self, request: &Request) -> Result<(), EngineError> {
        let max = self.engine.model.info().max_positions;
        if request.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if request.prompt.len() > max {
            return Err(EngineError::PromptTooLong {
                prompt: request.prompt.len(),
                max,
            });
        }
        let vocab = self.engine.model.info().vocab_size;
        if let Some(&bad) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::Model(strata_models::ModelError::TokenOutOfRange {
                id: bad,
                vocab,
            }));
        }
        Ok(())
    }

    /// Adds a sequence; it joins at the next step. A request for no new tokens finishes at once
    /// (reported by the next [`Batch::step`]).
    pub fn add(&mut self, id: u64, request: Request, extras: RequestExtras) -> Result<(), EngineError> {
        self.check(&request)?;
        self.seqs.push(SeqState {
            id,
            cache: self.engine.new_cache(),
            sampler: Sampler::new(request.sampling.clone()),
            seen: request.prompt.clone(),
            generated: Vec::new(),
            decoder: StreamDecoder::new(!extras.keep_special),
            stop: StopMatcher::new(request.stop.clone()),
            next: request.prompt.clone(),
            request,
            extras,
        });
        Ok(())
    }

    /// Drops a sequence (its consumer went away).
    pub fn cancel(&mut self, id: u64) {
        self.seqs.retain(|s| s.id != id);
    }

    /// One forward pass over every sequence, then one token each. `on_event(id, event)` streams
    /// the results; returning false cancels that sequence at once. A failed pass ends every
    /// sequence of the batch with the error (the engine itself keeps working).
    pub fn step(&mut self, on_event: &mut dyn FnMut(u64, GenEvent<'_>) -> bool) -> Result<(), EngineError> {
        let engine = self.engine;
        let max_pos = engine.model.info().max_positions;
        // Requests for no tokens finish without a pass.
        self.seqs.retain(|s| {
            if s.request.max_new_tokens == 0 {
                on_event(
                    s.id,
                    GenEvent::Done {
                        reason: FinishReason::Length,
                    },
                );
                false
            } else {
                true
            }
        });
        if self.seqs.is_empty() {
            return Ok(());
        }
        let logits = {
            let mut batch: Vec<SeqInput<'_>> = self
                .seqs
                .iter_mut()
                .map(|s| SeqInput {
                    tokens: &s.next,
                    cache: &mut s.cache,
                    all_logits: false,
                })
                .collect();
            match engine.model.forward(&mut batch, None) {
                Ok(l) => l,
                Err(e) => {
                    self.seqs.clear();
                    return Err(e.into());
                }
            }
        };
        let mut finished = vec![false; self.seqs.len()];
        for ((s, logits), finished) in self.seqs.iter_mut().zip(&logits).zip(finished.iter_mut()) {
            let id = s.sampler.sample(logits, &s.seen, &s.generated);
            let lp = s.extras.logprobs.map(|k| logprobs_of(logits, id, k));
            s.seen.push(id);
            s.generated.push(id);
            s.next = vec![id];

            let is_eos = engine.generation.eos_token_ids.contains(&id);
            let ends = is_eos && !s.request.ignore_eos;
            let mut text = String::new();
            let mut stop_hit = false;
            if let (Some(tok), false) = (&engine.tokenizer, ends) {
                if let Some(delta) = s.decoder.push(tok, id)? {
                    let (out, hit) = s.stop.push(&delta);
                    text = out;
                    stop_hit = hit;
                }
            }
            let mut finish = if stop_hit || ends {
                Some(FinishReason::Stop)
            } else if s.generated.len() >= s.request.max_new_tokens || s.cache.len + 1 >= max_pos {
                Some(FinishReason::Length)
            } else {
                None
            };
            if finish.is_some() && !stop_hit {
                // Release what the detokenizer and the stop matcher still hold.
                if let Some(tok) = &engine.tokenizer {
                    if let Some(rest) = s.decoder.flush(tok)? {
                        let (out, hit) = s.stop.push(&rest);
                        text.push_str(&out);
                        stop_hit = hit;
                    }
                }
                if stop_hit {
                    finish = Some(FinishReason::Stop);
                } else {
                    text.push_str(&s.stop.finish());
                }
            }
            let alive = on_event(
                s.id,
                GenEvent::Token {
                    id,
                    text: &text,
                    logprobs: lp.as_ref(),
                },
            );
            if let Some(reason) = finish {
                on_event(s.id, GenEvent::Done { reason });
                *finished = true;
            } else if !alive {
                *finished = true;
            }
        }
        let mut i = 0;
        self.seqs.retain(|_| {
            i += 1;
            !finished[i - 1]
        });
        Ok(())
    }
}

impl Engine {
    /// Generates for every request together. `on_event(i, event)` streams request i's tokens.
    /// Returns the generated ids of each request.
    pub fn generate(
        &self,
        requests: &[Request],
        mut on_event: impl FnMut(usize, GenEvent<'_>),
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut batch = Batch::new(self);
        for r in requests {
            batch.check(r)?;
        }
        for (i, r) in requests.iter().enumerate() {
            batch.add(i as u64, r.clone(), RequestExtras::default())?;
        }
        let mut out = vec![Vec::new(); requests.len()];
        while !batch.is_empty() {
            batch.step(&mut |i, e| {
                if let GenEvent::Token { id, .. } = &e {
                    out[i as usize].push(*id);
                }
                on_event(i as usize, e);
                true
            })?;
        }
        Ok(out)
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
}
