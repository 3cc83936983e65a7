//! The server's prefix cache: decoding state of finished sequences (and, for models with a
//! recurrent state, of each prompt as it was fed) kept by the tokens it holds, within a byte
//! budget, so a request that starts with a cached prefix (the same conversation one turn later,
//! a shared system prompt) feeds only the rest. A copy is taken: entries stay for other
//! requests. Attention caches are cut to the common prefix; a recurrent state cannot be cut, so
//! it is reused only when the request extends everything it holds. The logits are those of
//! feeding the whole prompt (the kernels give a token the same bits however tokens are
//! grouped), so outputs are the same with or without it.

use strata_models::KvCache;

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

struct Entry {
    tokens: Vec<u32>,
    cache: KvCache,
    bytes: usize,
    used: u64,
}

#[derive(Default)]
pub struct PrefixCache {
    budget: usize,
    entries: Vec<Entry>,
    held: usize,
    clock: u64,
}

impl PrefixCache {
    pub fn new(budget: usize) -> PrefixCache {
        PrefixCache {
            budget,
            ..Default::default()
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.held
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The longest cached prefix of `prompt` (fewer tokens than all of it: the last is fed for
    /// its logits): a copy of that state and how many tokens it holds.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(KvCache, usize)> {
        let most = prompt.len().checked_sub(1)?;
        let (at, n) = (self.entries.iter().enumerate())
            .filter_map(|(i, e)| {
                let common = e.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
                let n = common.min(most);
                // A recurrent state holds all its tokens or nothing.
                let usable = !e.cache.has_recurrent() || n == e.tokens.len();
                (usable && n > 0).then_some((i, n))
            })
            .max_by_key(|&(i, n)| (n, self.entries[i].used))?;
        self.clock += 1;
        let e = &mut self.entries[at];
        e.used = self.clock;
        let cache = e.cache.prefix(n).expect("a usable prefix");
        Some((cache, n))
    }

    /// Keeps `cache`, which holds `tokens`, dropping the least recently used entries beyond the
    /// budget and the entries it makes useless (an attention cache whose tokens begin the new
    /// one's).
    pub fn insert(&mut self, tokens: Vec<u32>, mut cache: KvCache) {
        if tokens.is_empty() || cache.len != tokens.len() {
            return;
        }
        cache.shrink_to_fit();
        let bytes = cache.bytes();
        if bytes > self.budget {
            return;
        }
        let recurrent = cache.has_recurrent();
        self.clock += 1;
        // An attention cache that begins a kept one adds nothing (that one is cut to it).
        let clock = self.clock;
        if let Some(e) = (self.entries.iter_mut())
            .find(|e| !recurrent && !e.cache.has_recurrent() && e.tokens.starts_with(&tokens))
        {
            e.used = clock;
            return;
        }
        let held = &mut self.held;
        self.entries.retain(|e| {
            let same = e.tokens == tokens;
            let covered = !recurrent && !e.cache.has_recurrent() && tokens.starts_with(&e.tokens);
            if same || covered {
                *held -= e.bytes;
            }
            !(same || covered)
        });
        self.held += bytes;
        self.entries.push(Entry {
            tokens,
            cache,
            bytes,
            used: self.clock,
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
mod tests {
    use super::*;
    use strata_models::LayerState;

    /// A cache holding `tokens`, each position's values its token (so a copy can be checked).
    fn cache(tokens: &[u32], recurrent: bool) -> KvCache {
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
        c
    }

    #[test]
    fn the_longest_prefix_is_found_cut_and_copied() {
        let mut p = PrefixCache::new(1 << 20);
        p.insert(vec![1, 2, 3, 4], cache(&[1, 2, 3, 4], false));
        p.insert(vec![1, 2, 9], cache(&[1, 2, 9], false));
        let (c, n) = p.lookup(&[1, 2, 3, 7, 8]).unwrap();
        assert_eq!((n, c.len), (3, 3));
        assert_eq!(c.layers[0].v, [1.0, 2.0, 3.0]);
        // The entry stays whole for the next request; the last prompt token is always fed.
        assert_eq!(p.lookup(&[1, 2, 3, 4]).unwrap().1, 3);
        assert_eq!(p.lookup(&[1, 2, 3, 4, 5]).unwrap().1, 4);
        assert!(p.lookup(&[5, 6]).is_none());
        assert!(p.lookup(&[1]).is_none());
        assert!(p.lookup(&[]).is_none());
    }

    #[test]
    fn a_recurrent_state_is_taken_only_whole() {
        let mut p = PrefixCache::new(1 << 20);
        p.insert(vec![1, 2, 3], cache(&[1, 2, 3], true));
        assert!(p.lookup(&[1, 2, 4, 5]).is_none(), "would need cutting");
        assert!(p.lookup(&[1, 2, 3]).is_none(), "all but the last token only");
        let (c, n) = p.lookup(&[1, 2, 3, 4]).unwrap();
        assert_eq!((n, c.layers[1].recurrent[0]), (3, 3.0));
        // A longer recurrent state does not replace a shorter one: each is whole for its own.
        p.insert(vec![1, 2, 3, 4, 5], cache(&[1, 2, 3, 4, 5], true));
        assert_eq!(p.len(), 2);
        assert_eq!(p.lookup(&[1, 2, 3, 9]).unwrap().1, 3);
    }

    #[test]
    fn entries_stay_within_the_budget_least_recently_used_first() {
        let one = cache(&[1, 2, 3, 4], false).bytes();
        let mut p = PrefixCache::new(2 * one);
        p.insert(vec![1, 2, 3, 4], cache(&[1, 2, 3, 4], false));
        p.insert(vec![5, 6, 7, 8], cache(&[5, 6, 7, 8], false));
        p.lookup(&[1, 2, 3, 4, 0]).unwrap(); // 1.. used last
        p.insert(vec![9, 9, 9, 9], cache(&[9, 9, 9, 9], false));
        assert_eq!(p.bytes(), 2 * one);
        assert!(
            p.lookup(&[5, 6, 7, 8, 0]).is_none(),
            "the least recently used went"
        );
        assert!(p.lookup(&[1, 2, 3, 4, 0]).is_some());
        // An attention cache whose tokens begin a new one's is replaced by it, and one that
        // begins a kept one is not kept.
        let mut p = PrefixCache::new(4 * one);
        p.insert(vec![1, 2, 3, 4], cache(&[1, 2, 3, 4], false));
        p.insert(vec![9, 9, 9, 9], cache(&[9, 9, 9, 9], false));
        p.insert(vec![1, 2, 3, 4, 5], cache(&[1, 2, 3, 4, 5], false));
        assert_eq!(p.len(), 2);
        let before = p.bytes();
        p.insert(vec![1, 2, 3], cache(&[1, 2, 3], false));
        assert_eq!((p.len(), p.bytes()), (2, before));
        // Too large for the budget: not kept.
        let mut small = PrefixCache::new(one - 1);
        small.insert(vec![1, 2, 3, 4], cache(&[1, 2, 3, 4], false));
        assert!(small.is_empty());
    }
}
