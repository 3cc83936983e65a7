//! Which read buffers the warmer faults in for the expert cache (`--fault-in at-load`).

use std::collections::{BTreeMap, HashMap};

use super::Key;
use crate::plan::ExpertPlan;

/// The buffers the warmer makes: of each run length the experts' reads use, as many as the
/// experts `budget` holds (at most all of them) and `reads` experts being read need, in
/// proportion to how many runs of that length all experts have (so any mix of experts fits).
pub(super) fn warm_lengths(plans: &HashMap<Key, ExpertPlan>, budget: usize, reads: usize) -> Vec<usize> {
    let Some(largest) = plans.values().map(|p| p.bytes).max() else {
        return Vec::new();
    };
    let mut runs: BTreeMap<usize, usize> = BTreeMap::new();
    for p in plans.values() {
        for r in &p.runs {
            *runs.entry(r.len as usize + 2 * crate::direct::ALIGN).or_default() += 1;
        }
    }
    let experts = plans.len();
    let cached = (budget as u64 / largest.max(1)).min(experts as u64) as usize;
    let wanted = (cached + reads).min(experts);
    // Largest first, interleaved lengths: a stop part way leaves a useful mix.
    let counts: Vec<(usize, usize)> = (runs.into_iter().rev())
        .map(|(len, n)| (len, (n * wanted).div_ceil(experts)))
        .collect();
    let most = counts.iter().map(|c| c.1).max().unwrap_or(0);
    (0..most)
        .flat_map(|i| counts.iter().filter(move |c| c.1 > i).map(|c| c.0))
        .collect()
}
