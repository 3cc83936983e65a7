//! The queue reader threads take their work from: jobs in order, a wake-up when one arrives, and
//! a close that tells every thread to stop; and the starting and stopping of those threads.

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

    /// The next job, waiting for one; `None` once closed.
    pub(crate) fn next(&self) -> Option<T> {
        let mut q = self.queue.lock().expect("queue lock");
        loop {
            if self.is_closed() {
                return None;
            }
            if let Some(job) = q.pop_front() {
                return Some(job);
            }
            q = self.ready.wait(q).expect("queue wait");
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

/// Starts `n` threads named `{name}-{i}`, each running `work` (which returns when the queue it
/// serves is closed).
pub(crate) fn spawn_readers(
    name: &str,
    n: usize,
    work: impl Fn() + Clone + Send + 'static,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let work = work.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(work)
                .expect("spawning a reader thread")
        })
        .collect()
}

/// Closes `jobs` and waits for the threads that serve it.
pub(crate) fn stop_readers<T>(jobs: &Jobs<T>, workers: &mut Vec<std::thread::JoinHandle<()>>) {
    jobs.close();
    for w in workers.drain(..) {
        let _ = w.join();
    }
}
