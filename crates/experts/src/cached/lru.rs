//! The expert cache's bookkeeping: which expert a full cache drops for a new one (LRU, or LFU
//! whose uses fade with a half-life).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use strata_weights::Expert;

use super::Key;

/// Which cached expert makes room for a new one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Eviction {
    /// The least recently used.
    #[default]
    Lru,
    /// The least frequently used, with each use's weight halving every `half_life` accesses (so
    /// experts popular long ago fade out).
    LfuDecay { half_life: u64 },
}

pub(super) struct Entry {
    pub(super) expert: Arc<Expert>,
    pub(super) bytes: usize,
    pub(super) tick: u64,
    /// LFU score as of `tick`.
    pub(super) score: f64,
}

#[derive(Default)]
pub(super) struct Lru {
    pub(super) map: HashMap<Key, Entry>,
    /// tick -> key, oldest first.
    pub(super) order: BTreeMap<u64, Key>,
    pub(super) bytes: usize,
    pub(super) tick: u64,
}

impl Lru {
    pub(super) fn decayed(score: f64, since: u64, half_life: u64) -> f64 {
        score * 0.5f64.powf(since as f64 / half_life.max(1) as f64)
    }

    /// The key to evict under `policy`.
    pub(super) fn victim(&self, policy: Eviction) -> Option<Key> {
        match policy {
            Eviction::Lru => self.order.first_key_value().map(|(_, k)| *k),
            Eviction::LfuDecay { half_life } => self
                .map
                .iter()
                .map(|(k, e)| (Self::decayed(e.score, self.tick - e.tick, half_life), e.tick, *k))
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                .map(|(_, _, k)| k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use strata_kernels::Linear;
    use strata_weights::Expert;

    fn tiny_expert() -> Arc<Expert> {
        let l = || Linear::from_f32(1, 1, vec![0.0]);
        Arc::new(Expert {
            gate: l(),
            up: l(),
            down: l(),
        })
    }

    /// Inserts keys 0..n at ticks 1..=n with the given LFU scores.
    fn cache(scores: &[f64]) -> Lru {
        let mut lru = Lru::default();
        for (i, &score) in scores.iter().enumerate() {
            lru.tick += 1;
            let tick = lru.tick;
            lru.order.insert(tick, (0, i));
            lru.map.insert(
                (0, i),
                Entry {
                    expert: tiny_expert(),
                    bytes: 1,
                    tick,
                    score,
                },
            );
        }
        lru
    }

    #[test]
    fn lru_evicts_the_oldest_and_lfu_the_least_used() {
        let lru = cache(&[5.0, 1.0, 3.0]);
        assert_eq!(lru.victim(Eviction::Lru), Some((0, 0)));
        assert_eq!(
            lru.victim(Eviction::LfuDecay { half_life: 1_000_000 }),
            Some((0, 1))
        );
    }

    #[test]
    fn lfu_scores_decay_with_age() {
        // Expert 0 was used a lot long ago; expert 1 a little, recently.
        let mut lru = cache(&[8.0, 2.0]);
        lru.map.get_mut(&(0, 0)).unwrap().tick = 0;
        lru.tick = 40;
        lru.map.get_mut(&(0, 1)).unwrap().tick = 40;
        // Half-life 10: 8 x 2^-4 = 0.5 < 2, so the old favourite goes first.
        assert_eq!(lru.victim(Eviction::LfuDecay { half_life: 10 }), Some((0, 0)));
        // Half-life 1000: it still counts almost 8, so the recent one goes.
        assert_eq!(lru.victim(Eviction::LfuDecay { half_life: 1000 }), Some((0, 1)));
    }
}
