//! The generation loop over a batch of sequences: one forward pass per step for every active
//! sequence together (so an expert read once serves all of them), sampling, streaming text, EOS,
//! stop strings and length limits. One sequence is the special case of a batch of one.

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

#[derive(Debug)]
pub enum GenEvent<'a> {
    /// A new token and the text it released (may be empty while text is held back).
    Token {
        id: u32,
        text: &'a str,
    },
    Done {
        reason: FinishReason,
    },
}

struct SeqState {
    cache: KvCache,
    sampler: Sampler,
    seen: Vec<u32>,
    generated: Vec<u32>,
    decoder: StreamDecoder,
    stop: StopMatcher,
    /// Token fed in the next step.
    next: Vec<u32>,
    done: bool,
}

impl Engine {
    /// Generates for every request together. `on_event(i, event)` streams request i's tokens.
    /// Returns the generated ids of each request.
    pub fn generate(
        &self,
        requests: &[Request],
        mut on_event: impl FnMut(usize, GenEvent<'_>),
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        let info = self.model.info();
        let max_pos = info.max_positions;
        let mut seqs = Vec::with_capacity(requests.len());
        for r in requests {
            if r.prompt.is_empty() {
                return Err(EngineError::EmptyPrompt);
            }
            if r.prompt.len() > max_pos {
                return Err(EngineError::PromptTooLong {
                    prompt: r.prompt.len(),
                    max: max_pos,
                });
            }
            seqs.push(SeqState {
                cache: self.new_cache(),
                sampler: Sampler::new(r.sampling.clone()),
                seen: r.prompt.clone(),
                generated: Vec::new(),
                decoder: StreamDecoder::new(true),
                stop: StopMatcher::new(r.stop.clone()),
                next: r.prompt.clone(),
                done: r.max_new_tokens == 0,
            });
        }
        for (i, s) in seqs.iter().enumerate() {
            if s.done {
                on_event(
                    i,
                    GenEvent::Done {
                        reason: FinishReason::Length,
                    },
                );
            }
        }

        loop {
            let active: Vec<usize> = (0..seqs.len()).filter(|&i| !seqs[i].done).collect();
            if active.is_empty() {
                break;
            }
            let logits = {
                let mut batch: Vec<SeqInput<'_>> = Vec::with_capacity(active.len());
                let mut remaining: Vec<&mut SeqState> = seqs.iter_mut().filter(|s| !s.done).collect();
                for s in remaining.iter_mut() {
                    batch.push(SeqInput {
                        tokens: &s.next,
                        cache: &mut s.cache,
                        all_logits: false,
                    });
                }
                self.model.forward(&mut batch, None)?
            };
            for (&i, logits) in active.iter().zip(&logits) {
                let req = &requests[i];
                let s = &mut seqs[i];
                let id = s.sampler.sample(logits, &s.seen);
                s.seen.push(id);
                s.generated.push(id);
                s.next = vec![id];

                let is_eos = self.generation.eos_token_ids.contains(&id);
                let mut text = String::new();
                let mut stop_hit = false;
                if let Some(tok) = &self.tokenizer {
                    if let Some(delta) = s.decoder.push(tok, id)? {
                        let (out, hit) = s.stop.push(&delta);
                        text = out;
                        stop_hit = hit;
                    }
                }
                let mut finish = if stop_hit || (is_eos && !req.ignore_eos) {
                    Some(FinishReason::Stop)
                } else if s.generated.len() >= req.max_new_tokens || s.cache.len + 1 >= max_pos {
                    Some(FinishReason::Length)
                } else {
                    None
                };
                if finish.is_some() && !stop_hit {
                    // Release what the detokenizer and the stop matcher still hold.
                    if let Some(tok) = &self.tokenizer {
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
                on_event(i, GenEvent::Token { id, text: &text });
                if let Some(reason) = finish {
                    s.done = true;
                    on_event(i, GenEvent::Done { reason });
                }
            }
        }
        Ok(seqs.into_iter().map(|s| s.generated).collect())
    }
}
