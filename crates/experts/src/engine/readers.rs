//! One pool of reader threads for every store of a model: the expert cache's reads and the
//! streamed layers' reads share it, so the disk sees one queue. Reads needed now (a layer's
//! missing experts, the streamed layer about to run) go before reads ahead (guessed experts,
//! the next streamed layers), each lane in order.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

/// A read to run on a reader thread (it reports its own result).
pub(crate) type Task = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Lanes {
    now: VecDeque<Task>,
    ahead: VecDeque<Task>,
    closed: bool,
}

#[derive(Default)]
struct Queue {
    lanes: Mutex<Lanes>,
    ready: Condvar,
}

impl Queue {
    fn next(&self) -> Option<Task> {
        let mut lanes = self.lanes.lock().expect("reader queue lock");
        loop {
            if lanes.closed {
                return None;
            }
            if let Some(task) = lanes.now.pop_front().or_else(|| lanes.ahead.pop_front()) {
                return Some(task);
            }
            lanes = self.ready.wait(lanes).expect("reader queue wait");
        }
    }
}

pub struct Readers {
    queue: Arc<Queue>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Readers {
    /// Starts `n` reader threads (`strata-io-{i}`).
    pub fn start(n: usize) -> Arc<Readers> {
        let queue = Arc::new(Queue::default());
        let threads = (0..n.max(1))
            .map(|i| {
                let queue = queue.clone();
                std::thread::Builder::new()
                    .name(format!("strata-io-{i}"))
                    .spawn(move || {
                        while let Some(task) = queue.next() {
                            task();
                        }
                    })
                    .expect("spawning a reader thread")
            })
            .collect();
        Arc::new(Readers { queue, threads })
    }

    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Queues `tasks` in the lane of reads needed now, or of reads ahead.
    pub(crate) fn run(&self, tasks: impl IntoIterator<Item = Task>, now: bool) {
        let mut lanes = self.queue.lanes.lock().expect("reader queue lock");
        if now {
            lanes.now.extend(tasks);
        } else {
            lanes.ahead.extend(tasks);
        }
        drop(lanes);
        self.queue.ready.notify_all();
    }
}

impl Drop for Readers {
    /// Stops the threads (reads still queued are dropped: nobody is left to wait for them).
    fn drop(&mut self) {
        self.queue.lanes.lock().expect("reader queue lock").closed = true;
        self.queue.ready.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn reads_needed_now_go_first_and_each_lane_keeps_its_order() {
        let readers = Readers::start(1);
        let (tx, rx) = channel();
        let (gate_tx, gate_rx) = channel::<()>();
        // Hold the one thread until everything is queued.
        readers.run([Box::new(move || gate_rx.recv().unwrap()) as Task], true);
        for (lane, now) in [("ahead", false), ("now", true)] {
            for i in 0..3 {
                let tx = tx.clone();
                readers.run(
                    [Box::new(move || tx.send(format!("{lane}{i}")).unwrap()) as Task],
                    now,
                );
            }
        }
        gate_tx.send(()).unwrap();
        let order: Vec<String> = (0..6).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(order, ["now0", "now1", "now2", "ahead0", "ahead1", "ahead2"]);
        drop(readers); // joins
    }
}
