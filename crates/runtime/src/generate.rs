//! The generation loop: one forward pass per step for every active sequence together (so an
//! expert read once serves all of them), sampling, streaming text, EOS, stop strings and length
//! limits. [`Batch`] is continuous: sequences join between steps and leave when they finish,
//! fail, or their consumer goes away. Prompts are fed in chunks of `--prefill-chunk` tokens, at
//! most one chunk's worth of prompt tokens per step, beside every decoding sequence's one token,
//! so a long prompt neither stalls the other streams nor outgrows the working memory. A
//! sequence's logits never depend on what else is in the batch (batch-invariant kernels, and
//! chunks cut at the same places whatever runs beside them), so greedy output is the same alone
//! or under load. [`Engine::generate`] runs a fixed set of requests to completion.
//!
//! Faults stay with their sequence: an error while sampling, detokenizing or matching stops
//! ends that sequence alone, and a failed forward pass over several sequences is undone (each
//! cache rewound to where the step began) and retried one sequence at a time, so only the
//! sequences that fail alone get the error. A panic inside the model is the one fault that ends
//! the batch: the engine's shared state may be broken, so [`Batch::step`] returns it.

use std::panic::{catch_unwind, AssertUnwindSafe};

use strata_models::SeqInput;

use crate::sequence::SeqState;
use crate::{Engine, EngineError, SamplingParams};

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
    /// What the output must match (structured output).
    pub guide: Option<crate::Guide>,
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
    /// The sequence failed; it has left the batch. Nothing else is affected.
    Failed {
        error: EngineError,
    },
}

/// Sequences decoded together, step by step.
pub struct Batch<'e> {
    engine: &'e Engine,
    seqs: Vec<SeqState>,
    /// Each stepping sequence's recurrent state as the step began (several sequences only).
    saved: Vec<Vec<f32>>,
    /// Sequences that sit out the coming steps (their consumer has not taken what they made).
    held: Vec<u64>,
    /// Ids whose state is kept when they leave, and the states kept (see [`Batch::add_resumed`]).
    keep: Vec<u64>,
    kept: Vec<SeqState>,
    /// Told (id, prompt tokens in, of all) after each step that leaves part of a prompt to feed.
    prefill_progress: Option<PrefillProgress<'e>>,
    /// Whether a recurrent state is copied as its prompt is fed (for a prefix cache: such a
    /// state cannot be cut back later), at every multiple of the prefill chunk and where the
    /// prompt ends.
    mark_prompts: bool,
}

/// `f(id, prompt tokens in, of all)`.
type PrefillProgress<'e> = Box<dyn FnMut(u64, usize, usize) + 'e>;

/// What one sequence feeds in a step.
struct Feed {
    seq: usize,
    tokens: usize,
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

impl<'e> Batch<'e> {
    pub fn new(engine: &'e Engine) -> Batch<'e> {
        Batch {
            engine,
            seqs: Vec::new(),
            saved: Vec::new(),
            held: Vec::new(),
            keep: Vec::new(),
            kept: Vec::new(),
            prefill_progress: None,
            mark_prompts: false,
        }
    }

    /// Copy each recurrent state as its prompt is fed, at every multiple of the prefill chunk
    /// (where a prompt's chunks then end) and where the prompt ends: the [`Mark`](crate::Mark)s
    /// of what [`Batch::take_kept`] gives, where a later request can resume.
    pub fn mark_prompts(&mut self, on: bool) {
        self.mark_prompts = on;
    }

    /// `f(id, done, total)` after each step that leaves part of a sequence's prompt to feed
    /// (a long prompt's progress).
    pub fn on_prefill(&mut self, f: impl FnMut(u64, usize, usize) + 'e) {
        self.prefill_progress = Some(Box::new(f));
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Adds a sequence; it joins at the next step. A request for no new tokens finishes at once
    /// (reported by the next [`Batch::step`]).
    pub fn add(&mut self, id: u64, request: Request, extras: RequestExtras) -> Result<(), EngineError> {
        self.engine.check(&request)?;
        let guided = self.guided(&extras)?;
        let mut s = SeqState::new(self.engine, id, request, extras);
        s.guided = guided;
        self.seqs.push(s);
        Ok(())
    }

    /// The matcher of a request's guide.
    fn guided(&self, extras: &RequestExtras) -> Result<Option<crate::guided::Guided>, EngineError> {
        let Some(guide) = &extras.guide else {
            return Ok(None);
        };
        let m = self
            .engine
            .guidance()?
            .matcher(guide)
            .map_err(EngineError::Guide)?;
        Ok(Some(crate::guided::Guided(m)))
    }

    /// Adds a sequence whose cache holds the first tokens of its prompt (fewer than all of
    /// them), and keeps its state when it leaves for [`Batch::take_kept`].
    pub fn add_resumed(
        &mut self,
        id: u64,
        request: Request,
        extras: RequestExtras,
        resume: crate::Resume,
    ) -> Result<(), EngineError> {
        self.engine.check(&request)?;
        assert!(resume.cache.len < request.prompt.len());
        let guided = self.guided(&extras)?;
        let mut s = SeqState::resume(self.engine, id, request, extras, resume);
        s.guided = guided;
        self.seqs.push(s);
        self.keep.push(id);
        Ok(())
    }

    /// The state of a sequence added with [`Batch::add_resumed`] that has left (finished or
    /// cancelled): its cache, the tokens it holds and its marks; None while it runs, or when it
    /// failed (its cache may hold part of a pass).
    pub fn take_kept(&mut self, id: u64) -> Option<crate::Snapshot> {
        let at = self.kept.iter().position(|s| s.id == id)?;
        let s = self.kept.swap_remove(at);
        let tokens = s.cached_tokens();
        Some(crate::Snapshot {
            tokens,
            cache: s.cache,
            marks: s.marks,
        })
    }

    /// Drops a sequence (its consumer went away); its state is kept as when it finishes.
    pub fn cancel(&mut self, id: u64) {
        if let Some(at) = self.seqs.iter().position(|s| s.id == id) {
            let s = self.seqs.remove(at);
            if let Some(k) = self.keep.iter().position(|&k| k == id) {
                self.keep.swap_remove(k);
                if !s.failed {
                    self.kept.push(s);
                }
            }
        }
        self.held.retain(|&h| h != id);
        self.keep.retain(|&k| k != id);
    }

    /// Whether sequence `id` sits out the coming steps (its state kept as it is) until told
    /// otherwise: a consumer that does not keep up holds its sequences back.
    pub fn hold(&mut self, id: u64, held: bool) {
        let at = self.held.iter().position(|&h| h == id);
        match (held, at) {
            (true, None) => self.held.push(id),
            (false, Some(i)) => {
                self.held.swap_remove(i);
            }
            _ => {}
        }
    }

    /// Whether every sequence of the batch is held (a step would do nothing).
    pub fn all_held(&self) -> bool {
        self.seqs.iter().all(|s| self.held.contains(&s.id))
    }

    /// One forward pass over the sequences this step feeds, then one token for each whose
    /// prompt is all in. `on_event(id, event)` streams the results; returning false cancels
    /// that sequence at once. A sequence that fails gets [`GenEvent::Failed`] and leaves; the
    /// others go on. Err only for a panic inside the model, after which the batch is empty.
    pub fn step(&mut self, on_event: &mut dyn FnMut(u64, GenEvent<'_>) -> bool) -> Result<(), EngineError> {
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
        let feeds = self.feeds();
        if feeds.is_empty() {
            return Ok(()); // every sequence held
        }
        let results = match self.forward_isolated(&feeds) {
            Ok(r) => r,
            Err(e) => {
                self.seqs.clear();
                return Err(e);
            }
        };
        let mut leaves = vec![false; self.seqs.len()];
        for (feed, result) in feeds.iter().zip(results) {
            leaves[feed.seq] = self.finish_feed(feed, result, on_event);
        }
        let (left, stay): (Vec<_>, Vec<_>) = std::mem::take(&mut self.seqs)
            .into_iter()
            .zip(leaves)
            .partition(|(_, leaves)| *leaves);
        self.seqs = stay.into_iter().map(|(s, _)| s).collect();
        for (s, _) in left {
            if let Some(at) = self.keep.iter().position(|&k| k == s.id) {
                self.keep.swap_remove(at);
                if !s.failed {
                    self.kept.push(s);
                }
            }
        }
        let seqs = &self.seqs;
        self.held.retain(|&h| seqs.iter().any(|s| s.id == h));
        Ok(())
    }

    /// A fed sequence after the pass: the rest of its prompt waits, or it samples its next
    /// token. Returns whether it leaves the batch (finished, failed or unwanted).
    fn finish_feed(
        &mut self,
        feed: &Feed,
        result: Result<Vec<f32>, EngineError>,
        on_event: &mut dyn FnMut(u64, GenEvent<'_>) -> bool,
    ) -> bool {
        let engine = self.engine;
        let s = &mut self.seqs[feed.seq];
        let logits = match result {
            Ok(logits) => logits,
            Err(error) => {
                s.failed = true;
                on_event(s.id, GenEvent::Failed { error });
                return true;
            }
        };
        s.pending.drain(..feed.tokens);
        let chunk = engine.memory.prefill_chunk.max(1);
        let prompt_end = s.generated.is_empty() && s.pending.is_empty();
        if self.mark_prompts && s.generated.is_empty() && (s.cache.len.is_multiple_of(chunk) || prompt_end) {
            s.mark();
        }
        if !s.pending.is_empty() {
            if let Some(progress) = &mut self.prefill_progress {
                let total = s.request.prompt.len();
                progress(s.id, total - s.pending.len(), total);
            }
            return false; // more of the prompt to come
        }
        let id = s.id;
        match catch_unwind(AssertUnwindSafe(|| s.advance(engine, logits, on_event))) {
            Ok(Ok((Some(reason), _))) => {
                on_event(id, GenEvent::Done { reason });
                true
            }
            Ok(Ok((None, alive))) => !alive,
            Ok(Err(error)) => {
                s.failed = true;
                on_event(id, GenEvent::Failed { error });
                true
            }
            Err(panic) => {
                s.failed = true;
                let error = EngineError::SequencePanicked(panic_text(&*panic));
                on_event(id, GenEvent::Failed { error });
                true
            }
        }
    }

    /// What each sequence feeds this step: every decoding sequence its one token; prompts a
    /// chunk of `prefill_chunk` tokens (the last one shorter; when prompts are marked, a
    /// prompt's chunks end at multiples of it), in the order they joined, while the step's
    /// prompt tokens stay within one chunk (the first prompt always gets its chunk).
    fn feeds(&self) -> Vec<Feed> {
        let chunk = self.engine.memory.prefill_chunk.max(1);
        let mut prompt_tokens = 0;
        let mut feeds = Vec::with_capacity(self.seqs.len());
        for (i, s) in self.seqs.iter().enumerate() {
            if self.held.contains(&s.id) {
                continue;
            }
            if !s.prefilling() {
                feeds.push(Feed { seq: i, tokens: 1 });
                continue;
            }
            let room = if self.mark_prompts && s.cache.has_recurrent() {
                chunk - s.cache.len % chunk
            } else {
                chunk
            };
            let n = s.pending.len().min(room);
            if prompt_tokens > 0 && prompt_tokens + n > chunk {
                continue;
            }
            prompt_tokens += n;
            feeds.push(Feed { seq: i, tokens: n });
        }
        feeds
    }

    /// The logits of each feed's last position, or the error that sequence alone fails with.
    /// The outer Err is a panic inside the model.
    fn forward_isolated(
        &mut self,
        feeds: &[Feed],
    ) -> Result<Vec<Result<Vec<f32>, EngineError>>, EngineError> {
        let starts: Vec<usize> = feeds.iter().map(|f| self.seqs[f.seq].cache.len).collect();
        let save = feeds.len() > 1 && self.seqs[feeds[0].seq].cache.has_recurrent();
        if save {
            self.saved.resize_with(feeds.len(), Vec::new);
            for (f, saved) in feeds.iter().zip(&mut self.saved) {
                self.seqs[f.seq].cache.save_recurrent(saved);
            }
        }
        let error = match self.forward(feeds)? {
            Ok(logits) => return Ok(logits.into_iter().map(Ok).collect()),
            Err(e) if feeds.len() == 1 => return Ok(vec![Err(e)]),
            Err(e) => e,
        };
        tracing::warn!(
            "a step over {} sequences failed ({error}); retrying each alone",
            feeds.len()
        );
        for (k, f) in feeds.iter().enumerate() {
            let cache = &mut self.seqs[f.seq].cache;
            cache.truncate(starts[k]);
            if save {
                cache.restore_recurrent(&self.saved[k]);
            }
        }
        let mut out = Vec::with_capacity(feeds.len());
        for f in feeds {
            out.push(self.forward(std::slice::from_ref(f))?.map(|mut l| l.remove(0)));
        }
        Ok(out)
    }

    /// One forward pass over `feeds`; the outer Err is a panic inside the model.
    #[allow(clippy::type_complexity)]
    fn forward(&mut self, feeds: &[Feed]) -> Result<Result<Vec<Vec<f32>>, EngineError>, EngineError> {
        let engine = self.engine;
        let mut wanted: Vec<Option<usize>> = vec![None; self.seqs.len()];
        for f in feeds {
            wanted[f.seq] = Some(f.tokens);
        }
        let mut batch: Vec<SeqInput<'_>> = self
            .seqs
            .iter_mut()
            .zip(&wanted)
            .filter_map(|(s, w)| {
                w.map(|n| SeqInput {
                    tokens: &s.pending[..n],
                    cache: &mut s.cache,
                    all_logits: false,
                })
            })
            .collect();
        let pass = || {
            engine.faults.check(&batch)?;
            engine.model.forward(&mut batch, None).map_err(EngineError::from)
        };
        match catch_unwind(AssertUnwindSafe(pass)) {
            Ok(result) => Ok(result),
            Err(panic) => Err(EngineError::ModelPanicked(panic_text(&*panic))),
        }
    }
}

impl Engine {
    /// Positions a request's sequence may hold: its prompt and new tokens, within `--ctx-size`.
    pub fn positions(&self, request: &Request) -> usize {
        (request.prompt.len().saturating_add(request.max_new_tokens)).min(self.memory.ctx_size)
    }

    /// Checks a request against the model: a prompt of at least one token, within `--ctx-size`,
    /// of ids the model has.
    pub fn check(&self, request: &Request) -> Result<(), EngineError> {
        let max = self.memory.ctx_size;
        if request.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if request.prompt.len() > max {
            return Err(EngineError::PromptTooLong {
                prompt: request.prompt.len(),
                max,
            });
        }
        let vocab = self.model.info().vocab_size;
        if let Some(&bad) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::Model(strata_models::ModelError::TokenOutOfRange {
                id: bad,
                vocab,
            }));
        }
        Ok(())
    }

    /// Generates for every request together. `on_event(i, event)` streams request i's tokens
    /// (never [`GenEvent::Failed`]: the first failure is returned). Returns the generated ids
    /// of each request.
    pub fn generate(
        &self,
        requests: &[Request],
        mut on_event: impl FnMut(usize, GenEvent<'_>),
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        for r in requests {
            self.check(r)?;
        }
        let mut batch = Batch::new(self);
        for (i, r) in requests.iter().enumerate() {
            batch.add(i as u64, r.clone(), RequestExtras::default())?;
        }
        let mut out = vec![Vec::new(); requests.len()];
        let mut failed = None;
        while !batch.is_empty() {
            batch.step(&mut |i, e| match e {
                GenEvent::Failed { error } => {
                    failed.get_or_insert(error);
                    false
                }
                e => {
                    if let GenEvent::Token { id, .. } = &e {
                        out[i as usize].push(*id);
                    }
                    on_event(i as usize, e);
                    true
                }
            })?;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}
