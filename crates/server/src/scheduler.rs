//! The engine thread: continuous batching. Requests arrive on a channel and wait in a queue;
//! between steps, sequences join the batch while it has room (`--max-concurrent`) and leave when
//! they finish or their client goes away (its receiver dropped). Every step is one forward pass
//! over all of them, so an expert read from disk serves every sequence routed to it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use strata_runtime::{Batch, Engine, FinishReason, GenEvent, Request, RequestExtras, TokenLogprobs};
use tokio::sync::mpsc;

use crate::metrics::Metrics;

/// What a sequence's consumer receives.
#[derive(Debug)]
pub enum Event {
    Token {
        id: u32,
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    Done(FinishReason),
    /// The engine failed on this sequence's batch; the server goes on.
    Error(String),
}

/// One sequence: choice `index` of a request whose choices share one event channel.
pub struct Job {
    pub request: Request,
    pub extras: RequestExtras,
    pub index: usize,
    pub events: mpsc::UnboundedSender<(usize, Event)>,
}

/// The handle the HTTP side holds.
#[derive(Clone)]
pub struct Scheduler {
    jobs: std::sync::mpsc::Sender<Job>,
    /// Sequences queued or running.
    pub load: Arc<AtomicUsize>,
    pub max_concurrent: usize,
    pub max_queued: usize,
}

impl Scheduler {
    pub fn start(
        engine: Arc<Engine>,
        max_concurrent: usize,
        max_queued: usize,
        metrics: Arc<Metrics>,
    ) -> Scheduler {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let load = Arc::new(AtomicUsize::new(0));
        let thread_load = load.clone();
        std::thread::Builder::new()
            .name("strata-engine".into())
            .spawn(move || run(&engine, rx, max_concurrent.max(1), &thread_load, &metrics))
            .expect("spawn the engine thread");
        Scheduler {
            jobs: tx,
            load,
            max_concurrent: max_concurrent.max(1),
            max_queued,
        }
    }

    /// Reserves room for `n` sequences; false when the queue is full (the caller answers 429).
    pub fn try_reserve(&self, n: usize) -> bool {
        let limit = self.max_concurrent + self.max_queued;
        self.load
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
                (l + n <= limit).then_some(l + n)
            })
            .is_ok()
    }

    /// Hands a reserved sequence to the engine.
    pub fn submit(&self, job: Job) {
        if let Err(e) = self.jobs.send(job) {
            self.load.fetch_sub(1, Ordering::SeqCst);
            let _ =
                e.0.events
                    .send((e.0.index, Event::Error("the engine thread has stopped".into())));
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

struct Running {
    id: u64,
    index: usize,
    events: mpsc::UnboundedSender<(usize, Event)>,
    started: Instant,
    first_token: bool,
}

fn run(
    engine: &Engine,
    jobs: std::sync::mpsc::Receiver<Job>,
    max_concurrent: usize,
    load: &AtomicUsize,
    metrics: &Metrics,
) {
    let mut batch = Batch::new(engine);
    let mut queue: VecDeque<(Job, Instant)> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    loop {
        // Wait for work when idle; otherwise take what has arrived.
        if batch.is_empty() && queue.is_empty() {
            match jobs.recv() {
                Ok(job) => queue.push_back((job, Instant::now())),
                Err(_) => return,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            queue.push_back((job, Instant::now()));
        }
        // Clients that left while queued or running.
        queue.retain(|(job, _)| {
            let alive = !job.events.is_closed();
            if !alive {
                load.fetch_sub(1, Ordering::SeqCst);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            alive
        });
        running.retain(|r| {
            let alive = !r.events.is_closed();
            if !alive {
                batch.cancel(r.id);
                load.fetch_sub(1, Ordering::SeqCst);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            alive
        });
        while batch.len() < max_concurrent {
            let Some((job, queued_at)) = queue.pop_front() else {
                break;
            };
            let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            match batch.add(id, job.request, job.extras) {
                Ok(()) => running.push(Running {
                    id,
                    index: job.index,
                    events: job.events,
                    started: queued_at,
                    first_token: false,
                }),
                Err(e) => {
                    load.fetch_sub(1, Ordering::SeqCst);
                    let _ = job.events.send((job.index, Event::Error(e.to_string())));
                }
            }
        }
        metrics.queued.store(queue.len() as u64, Ordering::Relaxed);
        metrics.running.store(running.len() as u64, Ordering::Relaxed);
        if batch.is_empty() {
            continue;
        }
        let step_start = Instant::now();
        let mut finished: Vec<u64> = Vec::new();
        let mut tokens = 0u64;
        let result = batch.step(&mut |id, event| {
            let Some(r) = running.iter_mut().find(|r| r.id == id) else {
                return false;
            };
            let sent = match event {
                GenEvent::Token {
                    id: tok,
                    text,
                    logprobs,
                } => {
                    tokens += 1;
                    if !r.first_token {
                        r.first_token = true;
                        metrics.observe_ttft(r.started.elapsed().as_secs_f64());
                    }
                    r.events.send((
                        r.index,
                        Event::Token {
                            id: tok,
                            text: text.to_string(),
                            logprobs: logprobs.cloned(),
                        },
                    ))
                }
                GenEvent::Done { reason } => {
                    finished.push(id);
                    r.events.send((r.index, Event::Done(reason)))
                }
            };
            sent.is_ok()
        });
        metrics.generated_tokens.fetch_add(tokens, Ordering::Relaxed);
        metrics.observe_step(step_start.elapsed().as_secs_f64(), tokens);
        match result {
            Ok(()) => {
                // Sequences the batch dropped (finished or their client gone).
                running.retain(|r| {
                    let done = finished.contains(&r.id);
                    let gone = !done && r.events.is_closed();
                    if gone {
                        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                    }
                    if done || gone {
                        load.fetch_sub(1, Ordering::SeqCst);
                    }
                    !(done || gone)
                });
            }
            Err(e) => {
                tracing::error!("engine step failed: {e}");
                metrics.engine_errors.fetch_add(1, Ordering::Relaxed);
                for r in running.drain(..) {
                    load.fetch_sub(1, Ordering::SeqCst);
                    let _ = r.events.send((r.index, Event::Error(e.to_string())));
                }
            }
        }
        metrics.running.store(running.len() as u64, Ordering::Relaxed);
    }
}
