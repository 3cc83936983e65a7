//! The engine thread: continuous batching. Requests arrive on a channel and wait in a queue;
//! between steps, sequences join the batch while it has room (`--max-concurrent` sequences and
//! the decoding-state pool the memory plan reserved: a sequence holds its prompt + max_tokens
//! positions from the moment it joins) and leave when they finish, fail, or their client goes
//! away (its receiver dropped). Every step is one forward pass over all of them, so an expert
//! read from disk serves every sequence routed to it.
//!
//! A sequence's failure is its own: it gets [`Event::Error`] and the rest go on. Only a panic
//! inside the model stops the thread (its shared state may be broken); then every waiting
//! request gets the error, [`EngineHealth`] says so, and the server exits.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use strata_runtime::{Batch, Engine, FinishReason, GenEvent, Request, RequestExtras, TokenLogprobs};
use tokio::sync::{mpsc, watch};

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
    /// This sequence failed; the server goes on.
    Error(String),
}

/// The engine's end of a request's events. Events sent and not yet taken are the request's
/// backlog: past [`MAX_UNREAD`] its sequences sit out the steps (so a client that stops reading
/// stops its sequences, which its stalled connection then cancels, instead of letting them run
/// to the end into memory).
#[derive(Clone)]
pub struct EventTx {
    tx: mpsc::UnboundedSender<(usize, Event)>,
    unread: Arc<AtomicUsize>,
    /// Prompt tokens the prefix cache gave the request (the most of its choices).
    cached: Arc<AtomicUsize>,
}

/// The server's end of a request's events.
pub struct EventRx {
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    unread: Arc<AtomicUsize>,
    /// The access log's record of the request, counting its tokens as they are taken.
    usage: Option<Arc<crate::access::Usage>>,
    cached: Arc<AtomicUsize>,
}

/// Events a request's consumer may leave untaken before its sequences are held back.
pub const MAX_UNREAD: usize = 512;

/// A request's event channel.
pub fn events() -> (EventTx, EventRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    let unread = Arc::new(AtomicUsize::new(0));
    let cached = Arc::new(AtomicUsize::new(0));
    (
        EventTx {
            tx,
            unread: unread.clone(),
            cached: cached.clone(),
        },
        EventRx {
            rx,
            unread,
            usage: crate::access::current(),
            cached,
        },
    )
}

impl EventTx {
    /// Err when the consumer has gone.
    pub fn send(&self, event: (usize, Event)) -> Result<(), ()> {
        self.unread.fetch_add(1, Ordering::Relaxed);
        self.tx.send(event).map_err(|_| ())
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// A choice began with `n` prompt tokens from the prefix cache (told before its tokens).
    pub fn cached(&self, n: usize) {
        self.cached.fetch_max(n, Ordering::Relaxed);
    }

    /// Whether the consumer is behind by more than [`MAX_UNREAD`] events.
    fn behind(&self) -> bool {
        self.unread.load(Ordering::Relaxed) > MAX_UNREAD
    }
}

impl EventRx {
    /// Prompt tokens the prefix cache gave the request.
    pub fn cached(&self) -> usize {
        self.cached.load(Ordering::Relaxed)
    }

    pub async fn recv(&mut self) -> Option<(usize, Event)> {
        let event = self.rx.recv().await;
        if let Some((_, e)) = &event {
            self.unread.fetch_sub(1, Ordering::Relaxed);
            if let (Event::Token { .. }, Some(u)) = (e, &self.usage) {
                u.token();
            }
        }
        event
    }
}

/// One sequence: choice `index` of a request whose choices share one event channel.
pub struct Job {
    pub request: Request,
    pub extras: RequestExtras,
    pub index: usize,
    pub events: EventTx,
}

/// Whether the engine thread still runs; once it stops, why.
#[derive(Clone)]
pub struct EngineHealth(watch::Receiver<Option<String>>);

impl EngineHealth {
    /// Why the engine thread stopped, if it has.
    pub fn stopped(&self) -> Option<String> {
        self.0.borrow().clone()
    }

    /// Resolves when the engine thread stops, with the reason.
    pub async fn wait_stopped(mut self) -> String {
        match self.0.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "the engine thread went away".into(),
        }
    }
}

/// Reports the engine thread's end, however it ends (return or unwind).
struct StopGuard {
    tx: watch::Sender<Option<String>>,
    reason: Option<String>,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        let reason = self.reason.take().unwrap_or_else(|| {
            if std::thread::panicking() {
                "the engine thread panicked".into()
            } else {
                "the engine thread stopped".into()
            }
        });
        self.tx.send_replace(Some(reason));
    }
}

/// What the engine thread is handed.
enum Work {
    Job(Box<Job>),
    /// Answered once the prefix cache's disk writes asked for so far are done (after the step
    /// under way, whose finished sequences' states are then asked for).
    Flush(std::sync::mpsc::Sender<()>),
}

/// The handle the HTTP side holds.
#[derive(Clone)]
pub struct Scheduler {
    jobs: std::sync::mpsc::Sender<Work>,
    /// Sequences queued or running.
    pub load: Arc<AtomicUsize>,
    pub max_concurrent: usize,
    pub max_queued: usize,
    pub health: EngineHealth,
}

impl Scheduler {
    pub fn start(
        engine: Arc<Engine>,
        max_concurrent: usize,
        max_queued: usize,
        metrics: Arc<Metrics>,
        prefix_disk: Option<strata_runtime::PrefixDisk>,
    ) -> Scheduler {
        let (tx, rx) = std::sync::mpsc::channel::<Work>();
        let load = Arc::new(AtomicUsize::new(0));
        let (health_tx, health_rx) = watch::channel(None);
        let max_concurrent = max_concurrent.max(1);
        let thread_load = load.clone();
        std::thread::Builder::new()
            .name("strata-engine".into())
            .spawn(move || {
                let mut guard = StopGuard {
                    tx: health_tx,
                    reason: None,
                };
                let mut batch = Batch::new(&engine);
                batch.mark_prompts(engine.memory.prefix_cache > 0);
                let mut engine_thread = EngineThread {
                    engine: &engine,
                    health: guard.tx.clone(),
                    batch,
                    prefix: strata_runtime::PrefixCache::new(engine.memory.prefix_cache)
                        .with_disk(prefix_disk),
                    queue: VecDeque::new(),
                    running: Vec::new(),
                    reserved: 0,
                    max_concurrent,
                    load: &thread_load,
                    metrics: &metrics,
                };
                guard.reason = Some(engine_thread.run(rx));
            })
            .expect("spawn the engine thread");
        Scheduler {
            jobs: tx,
            load,
            max_concurrent,
            max_queued,
            health: EngineHealth(health_rx),
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
        if let Err(std::sync::mpsc::SendError(Work::Job(job))) = self.jobs.send(Work::Job(Box::new(job))) {
            self.load.fetch_sub(1, Ordering::SeqCst);
            let _ = (job.events).send((job.index, Event::Error("the engine thread has stopped".into())));
        }
    }

    /// Waits (at most `limit`) until the engine thread has ended its step under way and the
    /// prefix cache has written what it asked to keep on disk; false when the limit passed.
    pub fn flush(&self, limit: std::time::Duration) -> bool {
        let (done, wait) = std::sync::mpsc::channel();
        if self.jobs.send(Work::Flush(done)).is_err() {
            return true; // the engine thread has stopped: nothing is written any more
        }
        !matches!(
            wait.recv_timeout(limit),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        )
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

struct Running {
    id: u64,
    index: usize,
    events: EventTx,
    started: Instant,
    first_token: bool,
    /// Positions reserved for it in the pool.
    positions: usize,
}

struct EngineThread<'e> {
    engine: &'e Engine,
    /// Told the engine's end before its requests are (so no /health answers 200 after a
    /// request got the engine's error).
    health: watch::Sender<Option<String>>,
    batch: Batch<'e>,
    /// Decoding state of earlier requests, by the tokens it holds.
    prefix: strata_runtime::PrefixCache,
    queue: VecDeque<(Job, Instant)>,
    running: Vec<Running>,
    /// Positions the running sequences hold (at most the pool).
    reserved: usize,
    max_concurrent: usize,
    load: &'e AtomicUsize,
    metrics: &'e Metrics,
}

impl EngineThread<'_> {
    /// Steps until every sender is gone or the model panics; returns why it stopped.
    fn run(&mut self, jobs: std::sync::mpsc::Receiver<Work>) -> String {
        loop {
            // Wait for work when idle; otherwise take what has arrived.
            if self.batch.is_empty() && self.queue.is_empty() {
                match jobs.recv() {
                    Ok(work) => self.take(work),
                    Err(_) => return "the server closed".into(),
                }
            }
            while let Ok(work) = jobs.try_recv() {
                self.take(work);
            }
            self.drop_departed();
            self.admit();
            self.metrics
                .queued
                .store(self.queue.len() as u64, Ordering::Relaxed);
            self.metrics
                .running
                .store(self.running.len() as u64, Ordering::Relaxed);
            self.metrics
                .reserved_positions
                .store(self.reserved as u64, Ordering::Relaxed);
            if self.batch.is_empty() {
                continue;
            }
            for r in &self.running {
                self.batch.hold(r.id, r.events.behind());
            }
            if self.batch.all_held() {
                // Every consumer is behind: wait for them (or for new work) without spinning.
                if let Ok(work) = jobs.recv_timeout(std::time::Duration::from_millis(5)) {
                    self.take(work);
                }
                continue;
            }
            if let Err(fatal) = self.step() {
                let reason = fatal.to_string();
                tracing::error!("engine stopped: {reason}");
                self.health.send_replace(Some(reason.clone()));
                self.fail_everything(&reason, jobs);
                return reason;
            }
            self.metrics
                .running
                .store(self.running.len() as u64, Ordering::Relaxed);
            self.metrics
                .reserved_positions
                .store(self.reserved as u64, Ordering::Relaxed);
        }
    }

    fn take(&mut self, work: Work) {
        match work {
            Work::Job(job) => self.queue.push_back((*job, Instant::now())),
            Work::Flush(done) => {
                self.prefix.flush();
                if let Some(store) = &self.engine.experts {
                    let _ = store.flush_trace();
                }
                let _ = done.send(());
            }
        }
    }

    /// Frees what clients that left while queued or running held.
    fn drop_departed(&mut self) {
        let (load, metrics) = (self.load, self.metrics);
        self.queue.retain(|(job, _)| {
            let alive = !job.events.is_closed();
            if !alive {
                load.fetch_sub(1, Ordering::SeqCst);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            alive
        });
        let gone: Vec<u64> = (self.running.iter())
            .filter(|r| r.events.is_closed())
            .map(|r| r.id)
            .collect();
        for id in gone {
            self.batch.cancel(id);
            self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            self.release(id);
            self.keep_state(id);
        }
    }

    /// What sequence `id` (gone from the batch) leaves in its cache, kept for requests that begin
    /// the same way.
    fn keep_state(&mut self, id: u64) {
        if let Some(snapshot) = self.batch.take_kept(id) {
            self.prefix.insert(snapshot);
        }
    }

    /// Moves queued sequences into the batch, in order, while the batch has a place and the
    /// pool has their positions.
    fn admit(&mut self) {
        let pool = self.engine.memory.state_tokens;
        while self.batch.len() < self.max_concurrent {
            let Some((job, _)) = self.queue.front() else {
                break;
            };
            let positions = self.engine.positions(&job.request);
            if positions <= pool && self.reserved + positions > pool {
                break; // waits for running sequences to free their positions
            }
            let (job, queued_at) = self.queue.pop_front().expect("front exists");
            if positions > pool {
                // The HTTP side refuses these; nothing may wait for what never comes.
                self.load.fetch_sub(1, Ordering::SeqCst);
                let message = format!(
                    "this sequence needs {positions} positions of decoding state; the server holds {pool} in all"
                );
                let _ = job.events.send((job.index, Event::Error(message)));
                continue;
            }
            let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            let resume = self
                .prefix
                .lookup(&job.request.prompt)
                .unwrap_or_else(|| strata_runtime::Resume {
                    cache: self.engine.new_cache(),
                    marks: Vec::new(),
                });
            let reused = resume.cache.len;
            match self.batch.add_resumed(id, job.request, job.extras, resume) {
                Ok(()) => {
                    if reused > 0 {
                        self.metrics.prefix_hits.fetch_add(1, Ordering::Relaxed);
                        self.metrics
                            .prefix_tokens
                            .fetch_add(reused as u64, Ordering::Relaxed);
                    }
                    job.events.cached(reused);
                    self.reserved += positions;
                    self.running.push(Running {
                        id,
                        index: job.index,
                        events: job.events,
                        started: queued_at,
                        first_token: false,
                        positions,
                    });
                }
                Err(e) => {
                    self.load.fetch_sub(1, Ordering::SeqCst);
                    let _ = job.events.send((job.index, Event::Error(e.to_string())));
                }
            }
        }
    }

    /// Forgets a running sequence that left the batch, freeing its place and positions.
    fn release(&mut self, id: u64) {
        if let Some(i) = self.running.iter().position(|r| r.id == id) {
            let r = self.running.swap_remove(i);
            self.reserved -= r.positions;
            self.load.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// One step of the batch, each event passed to its consumer. Err: the model panicked.
    fn step(&mut self) -> Result<(), strata_runtime::EngineError> {
        let step_start = Instant::now();
        let mut left: Vec<u64> = Vec::new();
        let mut tokens = 0u64;
        let (running, metrics) = (&mut self.running, self.metrics);
        let result = self.batch.step(&mut |id, event| {
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
                    left.push(id);
                    r.events.send((r.index, Event::Done(reason)))
                }
                GenEvent::Failed { error } => {
                    tracing::warn!("a sequence failed: {error}");
                    metrics.engine_errors.fetch_add(1, Ordering::Relaxed);
                    left.push(id);
                    r.events.send((r.index, Event::Error(error.to_string())))
                }
            };
            sent.is_ok()
        });
        self.metrics.generated_tokens.fetch_add(tokens, Ordering::Relaxed);
        self.metrics
            .observe_step(step_start.elapsed().as_secs_f64(), tokens);
        result?;
        // Sequences the batch dropped: finished, failed, or their client gone.
        let gone: Vec<u64> = (self.running.iter())
            .filter(|r| !left.contains(&r.id) && r.events.is_closed())
            .map(|r| r.id)
            .collect();
        self.metrics
            .cancelled
            .fetch_add(gone.len() as u64, Ordering::Relaxed);
        for id in left.into_iter().chain(gone) {
            self.batch.cancel(id);
            self.release(id);
            self.keep_state(id);
        }
        self.metrics
            .prefix_bytes
            .store(self.prefix.bytes() as u64, Ordering::Relaxed);
        if let Some(disk) = self.prefix.disk_stats() {
            let m = self.metrics;
            m.prefix_disk_bytes.store(disk.bytes, Ordering::Relaxed);
            m.prefix_disk_hits.store(disk.hits, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The model panicked: every running, queued and arriving sequence gets the error.
    fn fail_everything(&mut self, reason: &str, jobs: std::sync::mpsc::Receiver<Work>) {
        let message = format!("the engine stopped: {reason}");
        for r in self.running.drain(..) {
            let _ = r.events.send((r.index, Event::Error(message.clone())));
        }
        for (job, _) in self.queue.drain(..) {
            let _ = job.events.send((job.index, Event::Error(message.clone())));
        }
        // Dropping the receiver makes later submissions fail at once.
        drop(jobs);
        self.load.store(0, Ordering::SeqCst);
    }
}
