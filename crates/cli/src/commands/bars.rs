//! Progress bars on standard error for the long stages of a load (fetching a remote model's
//! non-expert weights, reading the resident ones, preloading the expert cache). indicatif draws
//! them only on a terminal; each is cleared when its stage ends.

use std::sync::{Arc, Mutex};

use indicatif::{ProgressBar, ProgressStyle};

#[derive(Default)]
pub struct Bars {
    bar: Mutex<Option<ProgressBar>>,
}

impl Bars {
    /// Bars for [`strata_runtime::LoadOptions::progress`].
    pub fn progress() -> strata_runtime::Progress {
        strata_runtime::Progress(Arc::new(Bars::default()))
    }
}

impl strata_runtime::LoadProgress for Bars {
    fn start(&self, what: &str, total: u64) {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{msg} {bar:30} {binary_bytes}/{binary_total_bytes} ETA {eta}")
                .expect("progress template"),
        );
        bar.set_message(what.to_string());
        if let Some(old) = self.bar.lock().expect("bar lock").replace(bar) {
            old.finish_and_clear();
        }
    }

    fn set(&self, done: u64) {
        if let Some(bar) = &*self.bar.lock().expect("bar lock") {
            bar.set_position(done);
        }
    }

    fn finish(&self) {
        if let Some(bar) = self.bar.lock().expect("bar lock").take() {
            bar.finish_and_clear();
        }
    }
}

/// A long prompt's progress (shown once it takes more than one step), cleared when the answer
/// begins.
#[derive(Default)]
pub struct PromptBar(Option<ProgressBar>);

impl PromptBar {
    pub fn update(&mut self, done: usize, total: usize) {
        let bar = self.0.get_or_insert_with(|| {
            let bar = ProgressBar::new(total as u64);
            bar.set_style(
                ProgressStyle::with_template("prompt {bar:30} {pos}/{len} tokens {per_sec} ETA {eta}")
                    .expect("progress template"),
            );
            bar
        });
        bar.set_position(done as u64);
    }

    pub fn finish(&mut self) {
        if let Some(bar) = self.0.take() {
            bar.finish_and_clear();
        }
    }
}
