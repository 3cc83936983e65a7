//! Faults injected on purpose, to test that a failing or panicking forward pass stays with its
//! request (and that a panic stops the engine cleanly), and slow passes (to interrupt an answer
//! midway in a test). Off unless set; debug builds read them from `STRATA_FAULT_FAIL_ON_TOKEN` /
//! `STRATA_FAULT_PANIC_ON_TOKEN` (a token id) and `STRATA_FAULT_PASS_DELAY_MS` at load.

use strata_models::SeqInput;

use crate::EngineError;

#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// A forward pass over a sequence that feeds this token fails (as a failed read would).
    pub fail_on_token: Option<u32>,
    /// A forward pass over a sequence that feeds this token panics.
    pub panic_on_token: Option<u32>,
    /// Every forward pass first sleeps this long.
    pub pass_delay: Option<std::time::Duration>,
}

impl Faults {
    /// What the environment asks for (debug builds only).
    pub fn from_env() -> Faults {
        if !cfg!(debug_assertions) {
            return Faults::default();
        }
        let token = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse().ok());
        Faults {
            fail_on_token: token("STRATA_FAULT_FAIL_ON_TOKEN"),
            panic_on_token: token("STRATA_FAULT_PANIC_ON_TOKEN"),
            pass_delay: token("STRATA_FAULT_PASS_DELAY_MS")
                .map(|ms| std::time::Duration::from_millis(ms.into())),
        }
    }

    /// Fails or panics as set, before the pass runs.
    pub(crate) fn check(&self, batch: &[SeqInput<'_>]) -> Result<(), EngineError> {
        if let Some(delay) = self.pass_delay {
            std::thread::sleep(delay);
        }
        let feeds = |t: Option<u32>| t.is_some_and(|t| batch.iter().any(|s| s.tokens.contains(&t)));
        if feeds(self.panic_on_token) {
            panic!("injected panic (STRATA_FAULT_PANIC_ON_TOKEN)");
        }
        if feeds(self.fail_on_token) {
            return Err(EngineError::Injected(format!(
                "injected failure on token {} (STRATA_FAULT_FAIL_ON_TOKEN)",
                self.fail_on_token.unwrap_or_default()
            )));
        }
        Ok(())
    }
}
