//! Routing traces (`strata run --trace FILE`) replayed against the expert cache's policies, to
//! choose them by measurement: what each policy would have hit at a given capacity, beside
//! Belady's optimum (evict the expert whose next use is furthest away, which no online policy
//! beats), and how well the next layer's guessed experts and the previous token's experts
//! predict the experts a layer asks for.
//!
//! The policies are the cache's own ([`Eviction`]): LRU by last use; LFU whose every use weighs
//! one and halves every `half_life` accesses, the oldest use breaking ties. The cache holds
//! experts of one size, so a capacity is a number of experts.

use std::collections::HashMap;

use crate::Eviction;

/// What a replay counts as one expert: (layer, expert).
pub type Key = (usize, usize);

/// A trace's requests, in the order the store saw them: each group is one layer's experts for
/// one step (the union of what its tokens picked), with how many tokens picked them.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    pub groups: Vec<Group>,
    /// Guessed experts of a layer (`--prefetch`), each followed in `groups` by that layer's real
    /// request: (index of the next group of that layer, the guess).
    pub guesses: Vec<(usize, Vec<usize>)>,
}

#[derive(Clone, Debug)]
pub struct Group {
    pub layer: usize,
    /// Each token's experts.
    pub tokens: Vec<Vec<usize>>,
}

impl Group {
    /// The experts the layer asks the store for, ascending.
    pub fn union(&self) -> Vec<usize> {
        let mut all: Vec<usize> = self.tokens.iter().flatten().copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

impl Requests {
    /// Every layer step's expert accesses, in order.
    pub fn accesses(&self) -> Vec<Vec<Key>> {
        (self.groups.iter())
            .map(|g| g.union().into_iter().map(|e| (g.layer, e)).collect())
            .collect()
    }
}

/// A policy to replay: one of the cache's, or the optimum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    Cache(Eviction),
    Belady,
}

/// Hits of `policy` over `steps` (each layer step's experts) with room for `capacity` experts
/// (the cache starts empty), as the cache meets them: a step looks every expert up first (each
/// lookup a tick of the clock), then inserts its misses (another tick each, the victim chosen
/// as of it).
pub fn hits(policy: Policy, capacity: usize, steps: &[Vec<Key>]) -> usize {
    if capacity == 0 {
        return 0;
    }
    let flat: Vec<Key> = steps.iter().flatten().copied().collect();
    let next_use = next_uses(&flat);
    let mut held: HashMap<Key, Held> = HashMap::new();
    let (mut hits, mut clock, mut at) = (0, 0u64, 0);
    for step in steps {
        let mut missed = Vec::new();
        for &key in step {
            clock += 1;
            let next = next_use[at];
            at += 1;
            match held.get_mut(&key) {
                Some(e) => {
                    hits += 1;
                    if let Policy::Cache(Eviction::LfuDecay { half_life }) = policy {
                        e.1 = decayed(e.1, clock - e.0, half_life) + 1.0;
                    }
                    *e = (clock, e.1, next);
                }
                None => missed.push((key, next)),
            }
        }
        for (key, next) in missed {
            if held.len() == capacity {
                let victim = victim(policy, &held, clock);
                held.remove(&victim);
            }
            clock += 1;
            held.insert(key, (clock, 1.0, next));
        }
    }
    hits
}

fn decayed(score: f64, since: u64, half_life: u64) -> f64 {
    score * 0.5f64.powf(since as f64 / half_life.max(1) as f64)
}

/// A held expert: (last tick, LFU score as of it, index of its next use).
type Held = (u64, f64, usize);

fn victim(policy: Policy, held: &HashMap<Key, Held>, tick: u64) -> Key {
    let pick = |score: &dyn Fn(&Held) -> (f64, u64)| {
        (held.iter())
            .min_by(|a, b| {
                let (sa, sb) = (score(a.1), score(b.1));
                sa.0.total_cmp(&sb.0).then(sa.1.cmp(&sb.1)).then(a.0.cmp(b.0))
            })
            .map(|(k, _)| *k)
            .expect("a full cache holds something")
    };
    match policy {
        Policy::Cache(Eviction::Lru) => pick(&|e| (0.0, e.0)),
        Policy::Cache(Eviction::LfuDecay { half_life }) => {
            pick(&|e| (decayed(e.1, tick - e.0, half_life), e.0))
        }
        // Furthest next use first: the smallest negated distance.
        Policy::Belady => pick(&|e| (-(e.2 as f64), e.0)),
    }
}

/// For each access, the index of the next access of the same key (usize::MAX: none).
fn next_uses(accesses: &[Key]) -> Vec<usize> {
    let mut next = vec![usize::MAX; accesses.len()];
    let mut seen: HashMap<Key, usize> = HashMap::new();
    for (i, key) in accesses.iter().enumerate().rev() {
        if let Some(&j) = seen.get(key) {
            next[i] = j;
        }
        seen.insert(*key, i);
    }
    next
}

/// How well a predictor's sets cover the sets that followed: (recall, precision, pairs), summed
/// over the pairs (predicted, actual).
pub fn coverage<'a>(pairs: impl Iterator<Item = (&'a [usize], &'a [usize])>) -> (f64, f64, usize) {
    let (mut found, mut wanted, mut guessed, mut n) = (0usize, 0usize, 0usize, 0usize);
    for (predicted, actual) in pairs {
        found += actual.iter().filter(|e| predicted.contains(e)).count();
        wanted += actual.len();
        guessed += predicted.len();
        n += 1;
    }
    let share = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    (share(found, wanted), share(found, guessed), n)
}

impl Requests {
    /// The next-layer guesses against the requests they guessed.
    pub fn guess_coverage(&self) -> (f64, f64, usize) {
        let unions: Vec<Vec<usize>> = self.groups.iter().map(Group::union).collect();
        coverage(
            (self.guesses.iter())
                .filter(|(at, _)| *at < unions.len())
                .map(|(at, guess)| (guess.as_slice(), unions[*at].as_slice())),
        )
    }

    /// One token's experts against the previous token's at the same layer (one-token groups:
    /// decode steps).
    pub fn previous_token_coverage(&self) -> (f64, f64, usize) {
        let mut last: HashMap<usize, &[usize]> = HashMap::new();
        let mut pairs = Vec::new();
        for g in self.groups.iter().filter(|g| g.tokens.len() == 1) {
            let now = g.tokens[0].as_slice();
            if let Some(prev) = last.insert(g.layer, now) {
                pairs.push((prev, now));
            }
        }
        coverage(pairs.into_iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step per access.
    fn keys(ids: &[usize]) -> Vec<Vec<Key>> {
        ids.iter().map(|&e| vec![(0, e)]).collect()
    }

    #[test]
    fn each_policy_evicts_what_it_should() {
        // 1 2 3 1 4 1 2: with room for 2.
        let a = keys(&[1, 2, 3, 1, 4, 1, 2]);
        // LRU: 1 2 (miss miss) 3 evicts 1, 1 evicts 2, 4 evicts 3, 1 hit, 2 evicts 4: one hit.
        assert_eq!(hits(Policy::Cache(Eviction::Lru), 2, &a), 1);
        // Belady: 3 evicts 2 (next used last), 1 hit, 4 evicts 3, 1 hit, 2 misses: two hits.
        assert_eq!(hits(Policy::Belady, 2, &a), 2);
        // LFU keeps the twice-used 1 against a once-used newcomer.
        let lfu = Policy::Cache(Eviction::LfuDecay { half_life: 1000 });
        assert_eq!(hits(lfu, 2, &keys(&[1, 1, 2, 3, 1])), 2);
        // Room for everything: every repeat hits; none: nothing does.
        assert_eq!(hits(Policy::Cache(Eviction::Lru), 10, &a), 3);
        assert_eq!(hits(Policy::Belady, 0, &a), 0);
    }

    #[test]
    fn belady_is_never_beaten_on_random_traces() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut draw = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n) as usize
        };
        for _ in 0..20 {
            let a: Vec<Vec<Key>> = (0..100)
                .map(|_| {
                    let mut step: Vec<Key> = (0..3).map(|_| (draw(3), draw(12))).collect();
                    step.sort_unstable();
                    step.dedup();
                    step
                })
                .collect();
            for cap in [1, 4, 9, 20] {
                let best = hits(Policy::Belady, cap, &a);
                for p in [Eviction::Lru, Eviction::LfuDecay { half_life: 64 }] {
                    assert!(hits(Policy::Cache(p), cap, &a) <= best, "{p:?} at {cap}");
                }
            }
        }
    }

    #[test]
    fn predictors_are_scored_against_what_followed() {
        let r = Requests {
            groups: vec![
                Group {
                    layer: 1,
                    tokens: vec![vec![1, 2]],
                },
                Group {
                    layer: 1,
                    tokens: vec![vec![2, 3]],
                },
            ],
            guesses: vec![(0, vec![1, 5]), (1, vec![2, 3, 4, 6])],
        };
        let (recall, precision, n) = r.guess_coverage();
        assert_eq!((recall, precision, n), (3.0 / 4.0, 3.0 / 6.0, 2));
        let (recall, _, n) = r.previous_token_coverage();
        assert_eq!((recall, n), (0.5, 1));
    }
}
