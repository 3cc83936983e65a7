//! `--io uring`: the store's direct reads submitted through one io_uring by one thread, instead
//! of a pool of threads each blocked in `pread`. Every queued expert's runs go in as reads at once
//! (up to the ring's depth), and an expert is assembled the moment its last run completes.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{InFlight, Key, Shared, CANCELLED};
use crate::direct::{AlignedBuf, DirectFile, ALIGN};

/// Reads in the ring at most.
#[cfg(target_os = "linux")]
const DEPTH: u32 = 64;

/// The ring and the descriptors its reads name.
pub(super) struct Ring {
    #[cfg(target_os = "linux")]
    ring: io_uring::IoUring,
}

impl Ring {
    pub(super) fn new(files: &[DirectFile]) -> std::io::Result<Ring> {
        let _ = files;
        #[cfg(target_os = "linux")]
        {
            Ok(Ring {
                ring: io_uring::IoUring::new(DEPTH)?,
            })
        }
        #[cfg(not(target_os = "linux"))]
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "io_uring exists on Linux only; use --io pread",
        ))
    }
}

/// Whether this kernel lets the process set up an io_uring (it may be compiled out, or
/// forbidden by `kernel.io_uring_disabled` or a seccomp filter).
pub fn available() -> bool {
    Ring::new(&[]).is_ok()
}

/// One expert being read: a buffer per run and how far each run has come.
struct Job {
    key: Key,
    slot: Arc<InFlight>,
    buffers: Vec<AlignedBuf>,
    /// Per run: where its bytes start in its buffer (the run's offset past the aligned start),
    /// and the next byte (from the aligned start) to submit.
    skips: Vec<usize>,
    next: Vec<usize>,
    /// Reads of this job in the ring.
    in_ring: usize,
    error: Option<String>,
}

/// Reads go in as pieces of at most this many bytes, so the ring turns over (and takes newly
/// queued experts) every millisecond or so instead of once per whole expert.
const CHUNK: usize = 2 << 20;

impl Job {
    /// Bytes run r reads from its aligned start.
    fn want(&self, shared: &Shared, r: usize) -> usize {
        let run = &shared.plans[&self.key].runs[r];
        (self.skips[r] + run.len as usize).div_ceil(ALIGN) * ALIGN
    }

    fn all_submitted(&self, shared: &Shared) -> bool {
        (0..self.next.len()).all(|r| self.next[r] >= self.want(shared, r))
    }
}

impl Shared {
    /// The io_uring reader: takes queued reads, keeps the ring full, completes experts.
    #[cfg(target_os = "linux")]
    pub(super) fn uring_worker(&self, mut ring: Ring) {
        use io_uring::{opcode, types};

        let mut jobs: HashMap<u64, Job> = HashMap::new();
        let mut next_id = 0u64;
        // Runs with bytes left to submit, as (job, run).
        let mut waiting: VecDeque<(u64, usize)> = VecDeque::new();
        // Reads in the ring: token -> (job, run, offset from the aligned start, length).
        let mut reads: HashMap<u64, (u64, usize, usize, usize)> = HashMap::new();
        let mut next_token = 0u64;
        loop {
            let mut taken = Vec::new();
            {
                let mut q = self.jobs.queue.lock().expect("queue lock");
                loop {
                    if self.jobs.is_closed() && reads.is_empty() {
                        return; // nothing in the ring writes into freed buffers
                    }
                    if !q.is_empty() || !reads.is_empty() || !waiting.is_empty() {
                        break;
                    }
                    q = self.jobs.ready.wait(q).expect("queue wait");
                }
                taken.extend(q.drain(..));
            }
            for (key, slot) in taken {
                if slot.cancelled.load(Ordering::Relaxed) {
                    self.finish(key, &slot, Err(CANCELLED.to_string()));
                    continue;
                }
                let plan = &self.plans[&key];
                let mut job = Job {
                    key,
                    slot,
                    buffers: Vec::with_capacity(plan.runs.len()),
                    skips: Vec::with_capacity(plan.runs.len()),
                    next: vec![0; plan.runs.len()],
                    in_ring: 0,
                    error: None,
                };
                for run in &plan.runs {
                    if let Err(e) = self.ensure_local(key, run) {
                        job.error = Some(e.to_string());
                        break;
                    }
                    job.skips.push((run.offset % ALIGN as u64) as usize);
                    job.buffers.push(self.pool.take(run.len as usize + 2 * ALIGN));
                }
                if let Some(e) = job.error.take() {
                    self.finish(key, &job.slot, Err(e));
                    for b in job.buffers.drain(..) {
                        self.pool.give(b);
                    }
                    continue;
                }
                waiting.extend((0..plan.runs.len()).map(|r| (next_id, r)));
                jobs.insert(next_id, job);
                next_id += 1;
            }
            while reads.len() < DEPTH as usize {
                let Some((id, r)) = waiting.pop_front() else { break };
                // A job that failed is gone once its last read came back.
                let Some(job) = jobs.get_mut(&id) else { continue };
                let want = job.want(self, r);
                if job.error.is_some() || job.next[r] >= want {
                    continue;
                }
                let run = &self.plans[&job.key].runs[r];
                let off = job.next[r];
                let len = CHUNK.min(want - off);
                let buf = &mut job.buffers[r];
                assert!(buf.capacity() >= want);
                // SAFETY: the buffer holds `want` bytes and its memory stays where it is (it does
                // not move with the job) until every read into it has completed.
                let entry = opcode::Read::new(
                    types::Fd(self.files[run.shard].raw_fd()),
                    unsafe { buf.as_mut_ptr().add(off) },
                    len as u32,
                )
                .offset(run.offset - job.skips[r] as u64 + off as u64)
                .build()
                .user_data(next_token);
                // SAFETY: the entry's buffer outlives the read (see above).
                if unsafe { ring.ring.submission().push(&entry) }.is_err() {
                    waiting.push_front((id, r));
                    break;
                }
                reads.insert(next_token, (id, r, off, len));
                next_token += 1;
                job.next[r] = off + len;
                job.in_ring += 1;
                if job.next[r] < want {
                    // The rest of this run first: experts complete one after another.
                    waiting.push_front((id, r));
                }
                self.stats.read_started();
            }
            if reads.is_empty() {
                continue;
            }
            if let Err(e) = ring.ring.submit_and_wait(1) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // The ring itself failed: fail every expert it held, and keep their buffers
                // (the kernel may still write into them).
                tracing::error!("io_uring: {e}");
                for (_, job) in jobs.drain() {
                    self.finish(job.key, &job.slot, Err(format!("io_uring failed: {e}")));
                    std::mem::forget(job.buffers);
                }
                return;
            }
            let completed: Vec<(u64, i32)> = ring
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (token, res) in completed {
                self.stats.read_finished();
                let (id, r, off, len) = reads.remove(&token).expect("a read of ours");
                let job = jobs.get_mut(&id).expect("a completed read's job");
                job.in_ring -= 1;
                let run = &self.plans[&job.key].runs[r];
                let need = job.skips[r] + run.len as usize;
                let file = &self.files[run.shard];
                let what = || {
                    format!(
                        "{}: reading expert {} of layer {} ({} bytes at {})",
                        file.path().display(),
                        job.key.1,
                        job.key.0,
                        run.len,
                        run.offset
                    )
                };
                if res < 0 {
                    let msg = format!("{}: {}", what(), std::io::Error::from_raw_os_error(-res));
                    job.error.get_or_insert(msg);
                } else if (res as usize) < len && off + (res as usize) < need {
                    let msg = format!(
                        "{}: the file ends at {} bytes, before the range (truncated or replaced?)",
                        what(),
                        run.offset - job.skips[r] as u64 + (off as u64) + res as u64
                    );
                    job.error.get_or_insert(msg);
                }
                if job.in_ring > 0 || (job.error.is_none() && !job.all_submitted(self)) {
                    continue;
                }
                let mut job = jobs.remove(&id).expect("job");
                let plan = &self.plans[&job.key];
                let result = match job.error.take() {
                    Some(e) => Err(e),
                    None => {
                        for (r, buf) in job.buffers.iter_mut().enumerate() {
                            self.stats
                                .bytes_read
                                .fetch_add(plan.runs[r].len, Ordering::Relaxed);
                            // SAFETY: the run's reads wrote at least skip + len bytes.
                            unsafe { buf.set_len(job.skips[r] + plan.runs[r].len as usize) };
                        }
                        self.assemble(plan, std::mem::take(&mut job.buffers), &job.skips)
                            .map(Arc::new)
                            .map_err(|e| e.to_string())
                    }
                };
                self.finish(job.key, &job.slot, result);
                for b in job.buffers.drain(..) {
                    self.pool.give(b);
                }
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn uring_worker(&self, ring: Ring) {
        let _ = ring;
    }
}
