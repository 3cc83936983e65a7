//! What the expert cache is given while the model loads: the experts read into it
//! (`--fault-in preload`), or the read buffers the warmer faults in for it (`at-load`).

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

/// The experts read into the cache while the model loads: every MoE layer in turn gives its next
/// expert (ids in order), as many as `budget` holds, so each layer's share is within one expert
/// of the others'; returned in file order (shard, offset), the order the disk reads fastest.
pub(super) fn preload_keys(plans: &HashMap<Key, ExpertPlan>, budget: usize) -> Vec<Key> {
    let mut layers: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &(layer, e) in plans.keys() {
        layers.entry(layer).or_default().push(e);
    }
    for ids in layers.values_mut() {
        ids.sort_unstable();
    }
    let most = layers.values().map(Vec::len).max().unwrap_or(0);
    let mut left = budget as u64;
    let mut keys = Vec::new();
    'rounds: for rank in 0..most {
        for (&layer, ids) in &layers {
            let Some(&e) = ids.get(rank) else { continue };
            let bytes = plans[&(layer, e)].bytes;
            if bytes > left {
                break 'rounds;
            }
            left -= bytes;
            keys.push((layer, e));
        }
    }
    let place = |k: &Key| plans[k].runs.first().map(|r| (r.shard, r.offset));
    keys.sort_by_key(place);
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::ReadRun;

    /// Experts of `bytes` each, laid out layer after layer in one shard.
    fn plans(layers: &[usize], experts: usize, bytes: u64) -> HashMap<Key, ExpertPlan> {
        let spec = || strata_weights::LinearSpec {
            base: String::new(),
            out_dim: 1,
            in_dim: 1,
            format: strata_weights::LinearFormat::Dense(strata_formats::DType::F32),
            tensors: vec![],
        };
        let mut out = HashMap::new();
        for (i, &layer) in layers.iter().enumerate() {
            for e in 0..experts {
                let offset = ((i * experts + e) as u64) * bytes;
                let run = ReadRun {
                    shard: 0,
                    offset,
                    len: bytes,
                    pieces: vec![],
                };
                let plan = ExpertPlan {
                    specs: [spec(), spec(), spec()],
                    tensors: vec![],
                    runs: vec![run],
                    bytes,
                };
                out.insert((layer, e), plan);
            }
        }
        out
    }

    #[test]
    fn preloading_shares_the_budget_between_layers_and_reads_in_file_order() {
        let p = plans(&[1, 3, 5], 8, 100);
        // 10 experts' worth: layers 1 and 3 get 4 each, layer 5 gets 3 (never more than one
        // apart), lowest ids first, and the list is in file order.
        let keys = preload_keys(&p, 1_050);
        let per_layer = |l: usize| keys.iter().filter(|k| k.0 == l).count();
        assert_eq!(keys.len(), 10);
        assert_eq!([per_layer(1), per_layer(3), per_layer(5)], [4, 3, 3]);
        assert_eq!(&keys[..4], &[(1, 0), (1, 1), (1, 2), (1, 3)]);
        let offsets: Vec<u64> = keys.iter().map(|k| p[k].runs[0].offset).collect();
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
        // A budget past every expert preloads each once; one below the smallest, none.
        assert_eq!(preload_keys(&p, usize::MAX).len(), 24);
        assert!(preload_keys(&p, 99).is_empty());
    }
}
