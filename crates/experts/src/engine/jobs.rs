//! The queue the io_uring thread takes its reads from (`--io uring`; every other read runs on
//! the shared reader pool, `readers.rs`): jobs in order, a wake-up when one arrives, and a close
//! that tells the thread to stop.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

pub(crate) struct Jobs<T> {
    pub(crate) queue: Mutex<VecDeque<T>>,
    pub(crate) ready: Condvar,
    pub(crate) closed: AtomicBool,
}

impl<T> Jobs<T> {
    pub(crate) fn new() -> Jobs<T> {
        Jobs {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Queues `jobs` at the back, or ahead of everything queued when `urgent`.
    pub(crate) fn push(&self, jobs: impl IntoIterator<Item = T>, urgent: bool) {
        let mut q = self.queue.lock().expect("queue lock");
        if urgent {
            for (i, job) in jobs.into_iter().enumerate() {
                q.insert(i, job);
            }
        } else {
            q.extend(jobs);
        }
        drop(q);
        self.ready.notify_all();
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.ready.notify_all();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

/// Closes `jobs` and waits for the threads that serve it.
pub(crate) fn stop_readers<T>(jobs: &Jobs<T>, workers: &mut Vec<std::thread::JoinHandle<()>>) {
    jobs.close();
    for w in workers.drain(..) {
        let _ = w.join();
    }
}
