//! A conversation's decoding state kept from one turn to the next (`strata chat`): each turn's
//! prompt is the whole conversation, and the positions its cache already holds (the longest
//! common prefix of the two) are not fed again, so a turn processes only its new tokens. The
//! logits are those of feeding the whole prompt at once (the kernels and attention give a
//! token the same bits however the tokens are grouped), so greedy answers are the same as
//! `strata run` on the same conversation. A recurrent state cannot be rewound, so it resumes
//! at the latest copy of it kept as the prompt was fed ([`crate::Mark`]) within the common
//! prefix.

use crate::{Batch, Engine, EngineError, FinishReason, GenEvent, Request, RequestExtras, Resume, Snapshot};

/// The cache of a conversation, the tokens it holds and its marks.
#[derive(Default)]
pub struct Session {
    state: Option<Snapshot>,
}

/// What one turn did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// Prompt tokens taken from the cache.
    pub reused: usize,
    /// Prompt tokens fed.
    pub fed: usize,
    pub generated: Vec<u32>,
    /// None when the caller stopped it.
    pub finish: Option<FinishReason>,
}

impl Session {
    pub fn new() -> Session {
        Session::default()
    }

    /// Forgets everything (the next turn starts from an empty cache).
    pub fn reset(&mut self) {
        self.state = None;
    }

    /// Tokens the cache holds.
    pub fn len(&self) -> usize {
        self.state.as_ref().map_or(0, |s| s.tokens.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cache to continue from for `prompt` and how many of its first tokens it holds
    /// (always fewer than all: the last one is fed for its logits).
    fn resume_for(&mut self, engine: &Engine, prompt: &[u32]) -> Resume {
        let fresh = || Resume {
            cache: engine.new_cache(),
            marks: Vec::new(),
        };
        let Some(state) = self.state.take() else {
            return fresh();
        };
        let n = state.usable(prompt, prompt.len().saturating_sub(1));
        state.into_resume(n).unwrap_or_else(fresh)
    }
}

impl Engine {
    /// Generates `request` in `session`: the cached prefix of its prompt is reused, the rest fed,
    /// and what the sequence leaves in its cache (prompt and answer) kept for the next turn.
    /// `on_event` streams the tokens; returning false stops the answer there (kept as far as
    /// it went); `on_prefill(done, total)` follows a prompt fed over several steps. A failure
    /// is returned, and the session starts empty next time.
    pub fn generate_in(
        &self,
        session: &mut Session,
        request: &Request,
        mut on_event: impl FnMut(GenEvent<'_>) -> bool,
        mut on_prefill: impl FnMut(usize, usize),
    ) -> Result<Turn, EngineError> {
        self.check(request)?;
        let resume = session.resume_for(self, &request.prompt);
        let reused = resume.cache.len;
        let mut batch = Batch::new(self);
        batch.mark_prompts(true);
        batch.on_prefill(move |_, done, total| on_prefill(done, total));
        batch.add_resumed(0, request.clone(), RequestExtras::default(), resume)?;
        let mut generated = Vec::new();
        let (mut finish, mut failed) = (None, None);
        while !batch.is_empty() {
            batch.step(&mut |_, event| match event {
                GenEvent::Failed { error } => {
                    failed = Some(error);
                    false
                }
                GenEvent::Done { reason } => {
                    finish = Some(reason);
                    on_event(GenEvent::Done { reason })
                }
                event => {
                    if let GenEvent::Token { id, .. } = &event {
                        generated.push(*id);
                    }
                    on_event(event)
                }
            })?;
        }
        if let Some(error) = failed {
            return Err(error);
        }
        session.state = batch.take_kept(0);
        Ok(Turn {
            reused,
            fed: request.prompt.len() - reused,
            generated,
            finish,
        })
    }
}
