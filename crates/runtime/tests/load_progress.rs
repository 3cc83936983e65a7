//! A load tells its progress: the resident weights as a stage whose last figure is every byte
//! it read, then the expert cache's preload up to its total.

use std::sync::{Arc, Mutex};

use strata_runtime::{Engine, LoadOptions, LoadProgress, Progress};
use strata_testkit::fixture;

/// A stage as told: what, total, the figures, finished.
type Stage = (String, u64, Vec<u64>, bool);

/// The stages in order.
#[derive(Default)]
struct Record(Mutex<Vec<Stage>>);

impl LoadProgress for Record {
    fn start(&self, what: &str, total: u64) {
        self.0
            .lock()
            .unwrap()
            .push((what.to_string(), total, Vec::new(), false));
    }
    fn set(&self, done: u64) {
        self.0.lock().unwrap().last_mut().expect("a stage").2.push(done);
    }
    fn finish(&self) {
        self.0.lock().unwrap().last_mut().expect("a stage").3 = true;
    }
}

#[test]
fn a_load_tells_each_stage_from_start_to_finish() {
    let record = Arc::new(Record::default());
    let options = LoadOptions {
        progress: Some(Progress(record.clone())),
        ..Default::default()
    };
    Engine::load(&fixture("qwen3-moe-tiny"), &options).unwrap();
    let stages = record.0.lock().unwrap().clone();
    let names: Vec<&str> = stages.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(
        names,
        ["loading the non-expert weights", "reading experts into the cache"],
        "{stages:?}"
    );
    for (name, total, figures, finished) in &stages {
        assert!(*finished, "{name}");
        assert!(*total > 0, "{name}");
        let last = *figures.last().expect("a figure");
        assert!(figures.windows(2).all(|w| w[0] <= w[1]), "{name}: {figures:?}");
        assert!(last > 0, "{name}");
        if name.starts_with("reading experts") {
            assert_eq!(last, *total, "{name}");
        }
    }
}
