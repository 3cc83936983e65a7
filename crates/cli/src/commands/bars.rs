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
