//! The read buffers behind experts read from disk, recycled.

use std::sync::{Arc, Mutex};

use crate::direct::AlignedBuf;

/// Read buffers that held experts no one uses any more, kept for the next reads: a fresh buffer
/// would have the kernel fault in and zero every one of its pages again.
pub(super) struct BufferPool {
    pub(super) free: Mutex<(Vec<AlignedBuf>, usize)>,
    /// Most bytes kept free.
    pub(super) max_bytes: usize,
    /// Bytes of buffers allocated (and faulted in) because none free fitted.
    pub(super) fresh_bytes: std::sync::atomic::AtomicU64,
}

impl BufferPool {
    /// The smallest free buffer of at least `len` bytes, or a new one.
    pub(super) fn take(&self, len: usize) -> AlignedBuf {
        let mut free = self.free.lock().expect("pool lock");
        let best = (free.0.iter().enumerate())
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let buf = free.0.swap_remove(i);
                free.1 -= buf.capacity();
                buf
            }
            None => {
                drop(free);
                // Fault the new pages in now: left to the direct read, the kernel pins them one
                // by one inside it (3-4x slower reads until the cache has filled once).
                let mut buf = AlignedBuf::new(len);
                buf.touch();
                self.fresh_bytes
                    .fetch_add(buf.capacity() as u64, std::sync::atomic::Ordering::Relaxed);
                buf
            }
        }
    }

    pub(super) fn give(&self, buf: AlignedBuf) {
        let mut free = self.free.lock().expect("pool lock");
        if free.1 + buf.capacity() <= self.max_bytes {
            free.1 += buf.capacity();
            free.0.push(buf);
        }
    }
}

/// An expert's read buffers while its weights view them; back to the pool when dropped.
pub(super) struct PooledBuffers {
    pub(super) buffers: Vec<AlignedBuf>,
    pub(super) pool: Arc<BufferPool>,
}

impl Drop for PooledBuffers {
    fn drop(&mut self) {
        for b in self.buffers.drain(..) {
            self.pool.give(b);
        }
    }
}
