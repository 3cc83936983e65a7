//! The server's prefix cache: decoding state of finished sequences kept by the tokens it holds,
//! within a byte budget, so a request that starts with a cached prefix (the same conversation
//! one turn later, a shared system prompt) feeds only the rest. A copy is taken: entries stay
//! for other requests. Attention caches are cut to the common prefix. A recurrent state cannot
//! be cut, so a sequence with one keeps copies of it as its prompt is fed ([`Mark`]s: at every
//! multiple of the prefill chunk and where the prompt ends), and a request resumes at the
//! latest mark (or the end) within what it shares. The logits are those of feeding the whole
//! prompt (the kernels give a token the same bits however tokens are grouped), so outputs are
//! the same with or without it. Entries may also be kept on disk ([`PrefixDisk`]), across
//! restarts.

use std::sync::Arc;

use strata_models::KvCache;

pub use crate::prefix_disk::{PrefixDisk, PrefixDiskStats};

/// How much memory the prefix cache may take (`--prefix-cache`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefixCacheSize {
    /// None (`run`, `chat`, `bench`: one sequence at a time needs none).
    #[default]
    Off,
    /// As many positions as the decoding-state pool, at most 1/16 of `--mem`.
    Auto,
    Bytes(usize),
}

/// A sequence's recurrent state after its first `at` tokens ([`KvCache::save_recurrent`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub at: usize,
    pub state: Vec<f32>,
}

/// Decoding state after `tokens`, and for a recurrent state its marks (at most its length).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub tokens: Vec<u32>,
    pub cache: KvCache,
    pub marks: Vec<Mark>,
}

/// Where a sequence resumes: its cache holds the first `cache.len` tokens of its prompt, and the
/// marks it inherits (kept with it when it leaves).
#[derive(Clone, Debug)]
pub struct Resume {
    pub cache: KvCache,
    pub marks: Vec<Mark>,
}

impl Snapshot {
    pub fn bytes(&self) -> usize {
        self.cache.bytes() + self.marks.iter().map(|m| m.state.len() * 4).sum::<usize>()
    }

    fn recurrent(&self) -> bool {
        self.cache.has_recurrent()
    }

    /// How many of `prompt`'s first `most` tokens this state can resume.
    pub(crate) fn usable(&self, prompt: &[u32], most: usize) -> usize {
        let marks = self.marks.iter().map(|m| m.at);
        usable(&self.tokens, marks, self.recurrent(), prompt, most)
    }

    /// The state after its first `n` tokens (`n` from [`Snapshot::usable`]), with the marks up
    /// to it, and one at `n` for a recurrent state (so what resumes here can stand for this).
    pub(crate) fn resume(&self, n: usize) -> Option<Resume> {
        let mut marks: Vec<Mark> = self.marks.iter().filter(|m| m.at <= n).cloned().collect();
        if !self.recurrent() {
            return Some(Resume {
                cache: self.cache.prefix(n)?,
                marks,
            });
        }
        let cache = if n == self.cache.len {
            self.cache.clone()
        } else {
            let mark = marks.iter().find(|m| m.at == n)?;
            self.cache.prefix_with(n, &mark.state)?
        };
        if !marks.iter().any(|m| m.at == n) {
            let mut state = Vec::new();
            cache.save_recurrent(&mut state);
            marks.push(Mark { at: n, state });
        }
        Some(Resume { cache, marks })
    }

    /// [`Snapshot::resume`] without a copy where none is needed (an attention cache is cut in
    /// place, a whole recurrent state moved).
    pub(crate) fn into_resume(mut self, n: usize) -> Option<Resume> {
        if n == 0 {
            return None;
        }
        if self.recurrent() && n != self.cache.len {
            return self.resume(n);
        }
        if !self.cache.truncate(n) {
            return None;
        }
        self.marks.retain(|m| m.at <= n);
        if self.recurrent() && !self.marks.iter().any(|m| m.at == n) {
            let mut state = Vec::new();
            self.cache.save_recurrent(&mut state);
            self.marks.push(Mark { at: n, state });
        }
        Some(Resume {
            cache: self.cache,
            marks: self.marks,
        })
    }

    fn points(&self) -> Vec<usize> {
        let mut p: Vec<usize> = self.marks.iter().map(|m| m.at).collect();
        p.push(self.tokens.len());
        p
    }

    /// Whether every prefix `other` can resume, this can too (so `other` adds nothing).
    fn covers(&self, other: &Snapshot) -> bool {
        covers(
            &self.tokens,
            &self.points(),
            &other.tokens,
            &other.points(),
            self.recurrent(),
        )
    }
}

/// Whether a state holding `tokens` that can resume at `points` (its marks and its length)
/// can resume every prefix that one holding `other` at `other_points` can.
pub(crate) fn covers(
    tokens: &[u32],
    points: &[usize],
    other: &[u32],
    other_points: &[usize],
    recurrent: bool,
) -> bool {
    tokens.starts_with(other) && (!recurrent || other_points.iter().all(|p| points.contains(p)))
}

/// How many of `prompt`'s first `most` tokens a state holding `tokens` can resume: all it shares
/// for attention caches; for a recurrent state, all of it or its latest mark within that.
pub(crate) fn usable(
    tokens: &[u32],
    marks: impl Iterator<Item = usize>,
    recurrent: bool,
    prompt: &[u32],
    most: usize,
) -> usize {
    let common = tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    let n = common.min(most);
    if !recurrent || n == tokens.len() {
        return n;
    }
    marks.filter(|&at| at <= n).max().unwrap_or(0)
}

struct Entry {
    snapshot: Arc<Snapshot>,
    bytes: usize,
    used: u64,
}

#[derive(Default)]
pub struct PrefixCache {
    budget: usize,
    entries: Vec<Entry>,
    held: usize,
    clock: u64,
    disk: Option<PrefixDisk>,
}

impl PrefixCache {
    pub fn new(budget: usize) -> PrefixCache {
        PrefixCache {
            budget,
            ..Default::default()
        }
    }

    /// With a second tier on disk: every entry kept is also written there, and a request whose
    /// longest prefix is there reads it back.
    pub fn with_disk(mut self, disk: Option<PrefixDisk>) -> PrefixCache {
        self.disk = disk;
        self
    }

    /// Waits until what was asked to be kept on disk is written.
    pub fn flush(&self) {
        if let Some(d) = &self.disk {
            d.flush();
        }
    }

    /// Bytes held in memory.
    pub fn bytes(&self) -> usize {
        self.held
    }

    /// The disk tier's figures, when there is one.
    pub fn disk_stats(&self) -> Option<PrefixDiskStats> {
        self.disk.as_ref().map(|d| d.stats())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The longest cached prefix of `prompt` (fewer tokens than all of it: the last is fed for
    /// its logits), in memory or on disk: a copy of that state.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<Resume> {
        let most = prompt.len().checked_sub(1)?;
        let ram = (self.entries.iter().enumerate())
            .map(|(i, e)| (i, e.snapshot.usable(prompt, most)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.entries[i].used));
        let beat = ram.map_or(0, |(_, n)| n);
        if let Some((snapshot, n)) = self.disk.as_mut().and_then(|d| d.lookup(prompt, most, beat)) {
            let resume = snapshot.resume(n);
            self.remember(Arc::new(snapshot));
            if resume.is_some() {
                return resume;
            }
        }
        let (at, n) = ram?;
        self.clock += 1;
        let e = &mut self.entries[at];
        e.used = self.clock;
        e.snapshot.resume(n)
    }

    /// Keeps `snapshot` (and writes it to disk when there is a disk tier), dropping the least
    /// recently used entries beyond the budget and the entries it makes useless.
    pub fn insert(&mut self, mut snapshot: Snapshot) {
        let cache = &snapshot.cache;
        if snapshot.tokens.is_empty() || cache.len != snapshot.tokens.len() {
            return;
        }
        if snapshot.marks.iter().any(|m| m.at > cache.len) {
            return;
        }
        snapshot.cache.shrink_to_fit();
        let snapshot = Arc::new(snapshot);
        if let Some(disk) = &mut self.disk {
            disk.insert(&snapshot);
        }
        self.remember(snapshot);
    }

    /// Keeps `snapshot` in memory.
    fn remember(&mut self, snapshot: Arc<Snapshot>) {
        let bytes = snapshot.bytes();
        if bytes > self.budget {
            return;
        }
        self.clock += 1;
        let clock = self.clock;
        if let Some(e) = (self.entries.iter_mut()).find(|e| e.snapshot.covers(&snapshot)) {
            e.used = clock;
            return;
        }
        let held = &mut self.held;
        self.entries.retain(|e| {
            let covered = snapshot.covers(&e.snapshot);
            if covered {
                *held -= e.bytes;
            }
            !covered
        });
        self.held += bytes;
        self.entries.push(Entry {
            snapshot,
            bytes,
            used: clock,
        });
        while self.held > self.budget {
            let oldest = (self.entries.iter().enumerate())
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i)
                .expect("over budget with entries");
            let e = self.entries.swap_remove(oldest);
            self.held -= e.bytes;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use strata_models::LayerState;

    /// A snapshot holding `tokens`, each position's values its token (so a copy can be
    /// checked); a recurrent one's state is its length, with marks at `marks`.
    pub(crate) fn snap(tokens: &[u32], recurrent: bool, marks: &[usize]) -> Snapshot {
        let mut layers = vec![LayerState::Kv { k_dim: 2, v_dim: 1 }];
        if recurrent {
            layers.push(LayerState::Recurrent {
                recurrent: 3,
                conv: 1,
            });
        }
        let mut c = KvCache::new(layers);
        for &t in tokens {
            c.layers[0].k.extend([t as f32, t as f32]);
            c.layers[0].v.push(t as f32);
        }
        if recurrent {
            c.layers[1].recurrent.fill(tokens.len() as f32);
        }
        c.len = tokens.len();
        let marks = marks
            .iter()
            .map(|&at| Mark {
                at,
                state: vec![at as f32; 4],
            })
            .collect();
        Snapshot {
            tokens: tokens.to_vec(),
            cache: c,
            marks,
        }
    }

    fn reused(p: &mut PrefixCache, prompt: &[u32]) -> Option<usize> {
        p.lookup(prompt).map(|r| r.cache.len)
    }

    #[test]
    fn the_longest_prefix_is_found_cut_and_copied() {
        let mut p = PrefixCache::new(1 << 20);
        p.insert(snap(&[1, 2, 3, 4], false, &[]));
        p.insert(snap(&[1, 2, 9], false, &[]));
        let r = p.lookup(&[1, 2, 3, 7, 8]).unwrap();
        assert_eq!(r.cache.len, 3);
        assert_eq!(r.cache.layers[0].v, [1.0, 2.0, 3.0]);
        // The entry stays whole for the next request; the last prompt token is always fed.
        assert_eq!(reused(&mut p, &[1, 2, 3, 4]), Some(3));
        assert_eq!(reused(&mut p, &[1, 2, 3, 4, 5]), Some(4));
        assert_eq!(reused(&mut p, &[5, 6]), None);
        assert_eq!(reused(&mut p, &[1]), None);
        assert_eq!(reused(&mut p, &[]), None);
    }

    #[test]
    fn a_recurrent_state_resumes_whole_or_at_a_mark() {
        let mut p = PrefixCache::new(1 << 20);
        p.insert(snap(&[1, 2, 3, 4, 5, 6], true, &[2, 4]));
        assert_eq!(reused(&mut p, &[1, 2, 3, 9]), Some(2), "the latest mark within");
        let r = p.lookup(&[1, 2, 3, 4, 5, 9]).unwrap();
        assert_eq!(r.cache.len, 4);
        assert_eq!(r.cache.layers[0].v, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(r.cache.layers[1].recurrent, [4.0; 3], "the mark's state");
        assert_eq!(r.cache.layers[1].conv, [4.0]);
        assert_eq!(r.marks.iter().map(|m| m.at).collect::<Vec<_>>(), [2, 4]);
        let r = p.lookup(&[1, 2, 3, 4, 5, 6, 7]).unwrap();
        assert_eq!((r.cache.len, r.cache.layers[1].recurrent[0]), (6, 6.0));
        // Resuming the whole state marks it, so what continues from it stands for it.
        assert_eq!(r.marks.iter().map(|m| m.at).collect::<Vec<_>>(), [2, 4, 6]);
        assert_eq!(reused(&mut p, &[1, 9]), None, "before the first mark");
        assert_eq!(
            reused(&mut p, &[1, 2, 3, 4, 5, 6]),
            Some(4),
            "all but the last token only"
        );
    }

    #[test]
    fn an_entry_another_covers_is_dropped() {
        let mut p = PrefixCache::new(1 << 20);
        p.insert(snap(&[1, 2, 3], true, &[2]));
        // Longer, but without a point at 3: both stay.
        p.insert(snap(&[1, 2, 3, 4, 5], true, &[2]));
        assert_eq!(p.len(), 2);
        assert_eq!(reused(&mut p, &[1, 2, 3, 9]), Some(3));
        // With points at 2 and 3 it stands for the first.
        p.insert(snap(&[1, 2, 3, 4, 5, 6], true, &[2, 3, 5]));
        assert_eq!(p.len(), 1);
        assert_eq!(reused(&mut p, &[1, 2, 3, 9]), Some(3));
        assert_eq!(reused(&mut p, &[1, 2, 3, 4, 5, 9]), Some(5));
    }

    #[test]
    fn entries_stay_within_the_budget_least_recently_used_first() {
        let one = snap(&[1, 2, 3, 4], false, &[]).bytes();
        let mut p = PrefixCache::new(2 * one);
        p.insert(snap(&[1, 2, 3, 4], false, &[]));
        p.insert(snap(&[5, 6, 7, 8], false, &[]));
        p.lookup(&[1, 2, 3, 4, 0]).unwrap(); // 1.. used last
        p.insert(snap(&[9, 9, 9, 9], false, &[]));
        assert_eq!(p.bytes(), 2 * one);
        assert_eq!(
            reused(&mut p, &[5, 6, 7, 8, 0]),
            None,
            "the least recently used went"
        );
        assert!(p.lookup(&[1, 2, 3, 4, 0]).is_some());
        // An attention cache whose tokens begin a new one's is replaced by it, and one that
        // begins a kept one is not kept.
        let mut p = PrefixCache::new(4 * one);
        p.insert(snap(&[1, 2, 3, 4], false, &[]));
        p.insert(snap(&[9, 9, 9, 9], false, &[]));
        p.insert(snap(&[1, 2, 3, 4, 5], false, &[]));
        assert_eq!(p.len(), 2);
        let before = p.bytes();
        p.insert(snap(&[1, 2, 3], false, &[]));
        assert_eq!((p.len(), p.bytes()), (2, before));
        // Too large for the budget: not kept.
        let mut small = PrefixCache::new(one - 1);
        small.insert(snap(&[1, 2, 3, 4], false, &[]));
        assert!(small.is_empty());
    }
}
