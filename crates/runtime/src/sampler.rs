//! Next-token choice: logit bias, repetition / presence / frequency penalties, then temperature,
//! top-k, top-p and min-p filtering, then a seeded draw. Temperature 0 is greedy (argmax, lowest
//! id on ties).

use rayon::prelude::*;

use crate::Rng;

/// Candidates whose weights a core computes and sums at a time. Fixed, so a seed's draws do not
/// depend on the number of cores.
const BLOCK: usize = 8192;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off. Divides positive logits and multiplies negative ones of tokens already seen.
    pub repetition_penalty: f32,
    /// OpenAI's: subtracted once from the logit of every token generated so far (0 = off).
    pub presence_penalty: f32,
    /// OpenAI's: subtracted per occurrence in the generated tokens (0 = off).
    pub frequency_penalty: f32,
    /// Added to the logits of these tokens before anything else.
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
    /// Kept between tokens (a vocabulary's worth each): no fresh mapping per token.
    scratch: Scratch,
}

#[derive(Default)]
struct Scratch {
    logits: Vec<f32>,
    cand: Vec<(u32, f32)>,
    weights: Vec<f64>,
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = Rng::new(params.seed);
        Sampler {
            params,
            rng,
            scratch: Scratch::default(),
        }
    }

    /// Picks the next token from `logits` (V,), given the ids seen so far (prompt + generated)
    /// and, of those, the generated ones.
    pub fn sample(&mut self, logits: &[f32], seen: &[u32], generated: &[u32]) -> u32 {
        let p = &self.params;
        let Scratch {
            logits: kept,
            cand,
            weights,
        } = &mut self.scratch;
        kept.clear();
        kept.extend_from_slice(logits);
        let logits = kept;
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let mut counts = std::collections::HashMap::new();
            for &id in generated {
                *counts.entry(id).or_insert(0u32) += 1;
            }
            for (id, n) in counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
        if p.repetition_penalty != 1.0 {
            let mut done = vec![false; logits.len()];
            for &id in seen {
                let i = id as usize;
                if i < logits.len() && !done[i] {
                    done[i] = true;
                    let l = &mut logits[i];
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.temperature <= 0.0 {
            return argmax(logits);
        }
        let t = p.temperature;
        if (p.top_k == 0 || p.top_k >= logits.len()) && p.top_p >= 1.0 && p.min_p <= 0.0 {
            // No filter: one draw over the logits themselves in id order, each weight computed
            // once and each block of them summed on every core (a vocabulary's exponentials are
            // most of a token's sampling time); non-finite logits weigh nothing.
            if !logits.iter().any(|l| l.is_finite()) {
                return argmax(logits);
            }
            let max = logits
                .par_chunks(BLOCK)
                .map(|c| {
                    c.iter()
                        .filter(|l| l.is_finite())
                        .map(|&l| l / t)
                        .fold(f32::NEG_INFINITY, f32::max)
                })
                .reduce(|| f32::NEG_INFINITY, f32::max);
            weights.clear();
            weights.resize(logits.len(), 0.0);
            let totals = weigh(weights, logits, |l| match l.is_finite() {
                true => ((l / t - max) as f64).exp(),
                false => 0.0,
            });
            let total: f64 = totals.iter().sum();
            return draw(self.rng.next_f64() * total, weights, &totals, |i| i as u32);
        }
        // Candidates in id order; only as many as the filters need are ever put in order
        // (highest logit first, ties: lower id first): a vocabulary of 150k sorted at every
        // token cost more than the model's last layers.
        cand.clear();
        cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l / p.temperature)),
        );
        if cand.is_empty() {
            return argmax(logits);
        }
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_rank);
            cand.truncate(p.top_k);
        }
        let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let weight = |l: f32| ((l - max) as f64).exp();
        weights.clear();
        weights.resize(cand.len(), 0.0);
        let totals = weigh(weights, cand, |c| weight(c.1));
        let total: f64 = totals.iter().sum();
        if p.top_p >= 1.0 && p.min_p <= 0.0 {
            // Top-k alone needs no order: one draw over the weights in id order.
            return draw(self.rng.next_f64() * total, weights, &totals, |i| cand[i].0);
        }
        let (top_p, floor) = (p.top_p as f64 * total, p.min_p as f64);
        // The ranked prefix, grown until it holds top_p of the mass and reaches below the
        // min_p floor (or holds everything).
        let mut ranked = 0;
        let mut keep = None;
        let (mut acc, mut want) = (0.0f64, 64);
        while keep.is_none() {
            let end = want.min(cand.len());
            if end < cand.len() {
                cand[ranked..].select_nth_unstable_by(end - ranked - 1, by_rank);
            }
            // A total order (ties by id), so an unstable sort on every core gives the one order.
            cand[ranked..end].par_sort_unstable_by(by_rank);
            // From here on `weights` follows the ranked order, each computed once on every core.
            (weights[ranked..end].par_iter_mut())
                .zip(cand[ranked..end].par_iter())
                .for_each(|(w, c)| *w = weight(c.1));
            let first = weights[0];
            for (i, &q) in weights.iter().enumerate().take(end).skip(ranked) {
                if p.min_p > 0.0 && q < first * floor {
                    keep = Some(i.max(1));
                    break;
                }
                acc += q;
                if p.top_p < 1.0 && acc >= top_p {
                    keep = Some(i + 1);
                    break;
                }
            }
            ranked = end;
            if end == cand.len() {
                keep = keep.or(Some(end));
            }
            want *= 4;
        }
        let keep = keep.expect("set above");
        let total: f64 = weights[..keep].iter().sum();
        let mut r = self.rng.next_f64() * total;
        for (&(id, _), &q) in cand[..keep].iter().zip(&weights[..keep]) {
            if r < q {
                return id;
            }
            r -= q;
        }
        cand[keep - 1].0
    }
}

/// Each item's weight into `weights` (as long as `items`), block by block on every core; the
/// sum of each block, in order.
fn weigh<T: Sync>(weights: &mut [f64], items: &[T], weight: impl Fn(&T) -> f64 + Sync) -> Vec<f64> {
    weights
        .par_chunks_mut(BLOCK)
        .zip(items.par_chunks(BLOCK))
        .map(|(w, items)| {
            for (w, item) in w.iter_mut().zip(items) {
                *w = weight(item);
            }
            w.iter().sum::<f64>()
        })
        .collect()
}

/// The candidate at `r` (in [0, total)) of the weights laid end to end in id order (`id`: the
/// candidate of weight i): the block whose running sum passes `r`, then the candidate within it
/// (its last with any weight when rounding runs past).
fn draw(mut r: f64, weights: &[f64], totals: &[f64], id: impl Fn(usize) -> u32) -> u32 {
    for (b, &t) in totals.iter().enumerate() {
        if r >= t && b + 1 < totals.len() {
            r -= t;
            continue;
        }
        let at = b * BLOCK;
        let end = (at + BLOCK).min(weights.len());
        for (i, &q) in weights.iter().enumerate().take(end).skip(at) {
            if r < q {
                return id(i);
            }
            r -= q;
        }
        let last = (at..end).rev().find(|&i| weights[i] > 0.0).unwrap_or(end - 1);
        return id(last);
    }
    id(weights.len() - 1)
}

/// Candidate order: highest logit first, ties broken by the lower id (a total order, so any
/// partial ranking agrees with a full sort).
fn by_rank(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax_and_penalty_applies() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 2.0, 1.0], &[], &[]), 1);
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 4.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&[0.1, 2.0, 1.0], &[1], &[]), 2);
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(0, 10.0)],
            ..Default::default()
        });
        assert_eq!(s.sample(&[0.1, 2.0, 1.0], &[], &[]), 0);
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 0.6,
            presence_penalty: 0.1,
            ..Default::default()
        });
        // 2.0 - 0.1 - 2 x 0.6 = 0.7 < 1.0
        assert_eq!(s.sample(&[0.1, 2.0, 1.0], &[1, 1], &[1, 1]), 2);
    }

    #[test]
    fn same_seed_same_draws_and_filters_hold() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 5,
            seed: 42,
            ..Default::default()
        };
        let draw = |p: SamplingParams| {
            let mut s = Sampler::new(p);
            (0..100).map(|_| s.sample(&logits, &[], &[])).collect::<Vec<_>>()
        };
        let a = draw(params.clone());
        assert_eq!(a, draw(params.clone()));
        let mut top5: Vec<u32> = (0..50).collect();
        top5.sort_by(|&x, &y| logits[y as usize].total_cmp(&logits[x as usize]));
        assert!(a.iter().all(|t| top5[..5].contains(t)), "top-k leaked");
        assert!(
            a.iter().collect::<std::collections::HashSet<_>>().len() > 1,
            "no randomness"
        );
        let tight = draw(SamplingParams {
            top_p: 1e-6,
            ..params.clone()
        });
        assert!(tight.iter().all(|&t| t == top5[0]));
        let min_p = draw(SamplingParams { min_p: 1.0, ..params });
        assert!(min_p.iter().all(|&t| t == top5[0]));
    }

    /// On a vocabulary large enough that the ranked prefix grows several times (64, 256, ...),
    /// top-p and min-p keep exactly the set a full sort keeps: every draw lies inside it, and
    /// draws reach deep into it; with no filter every token can be drawn.
    #[test]
    fn partial_ranking_keeps_what_a_full_sort_keeps() {
        let v = 5000;
        let logits: Vec<f32> = (0..v)
            .map(|i| ((i as f32 * 0.7131).sin() * 3.0).exp().ln())
            .collect();
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let max = logits[order[0]];
        let w: Vec<f64> = order.iter().map(|&i| ((logits[i] - max) as f64).exp()).collect();
        let total: f64 = w.iter().sum();
        for top_p in [0.3f32, 0.9, 0.99] {
            let mut acc = 0.0;
            let cut = w
                .iter()
                .position(|q| {
                    acc += q / total;
                    acc >= top_p as f64
                })
                .unwrap()
                + 1;
            let kept: std::collections::HashSet<u32> = order[..cut].iter().map(|&i| i as u32).collect();
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.0,
                top_p,
                seed: 7,
                ..Default::default()
            });
            let draws: Vec<u32> = (0..2000).map(|_| s.sample(&logits, &[], &[])).collect();
            assert!(
                draws.iter().all(|t| kept.contains(t)),
                "top_p {top_p}: a draw outside the {cut} kept"
            );
            let deepest = draws
                .iter()
                .map(|t| order.iter().position(|&i| i as u32 == *t).unwrap())
                .max()
                .unwrap();
            assert!(
                deepest > cut / 2,
                "top_p {top_p}: draws reach rank {deepest} of {cut}"
            );
        }
        let floor = 0.2f64;
        let cut = w.iter().take_while(|&&q| q >= floor).count();
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            min_p: floor as f32,
            seed: 8,
            ..Default::default()
        });
        for _ in 0..2000 {
            let t = s.sample(&logits, &[], &[]) as usize;
            assert!(order[..cut].contains(&t), "min_p: token {t} is below the floor");
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            seed: 9,
            ..Default::default()
        });
        let seen: std::collections::HashSet<u32> = (0..20000).map(|_| s.sample(&logits, &[], &[])).collect();
        assert!(
            seen.len() > v / 2,
            "no filter: only {} distinct tokens",
            seen.len()
        );
    }

    /// The buffers kept between tokens start over at each token: after a large vocabulary, a
    /// small one's draws see only its own logits, and the next large draw is the one a sampler
    /// that never saw the large vocabulary makes at the same point of its seed.
    #[test]
    fn kept_buffers_start_over_at_each_token() {
        let large: Vec<f32> = (0..5000).map(|i| (i as f32 * 0.11).cos() * 3.0).collect();
        let small = [-100.0f32, -100.0, 50.0];
        for top_p in [1.0, 0.5] {
            let params = SamplingParams {
                temperature: 1.0,
                top_p,
                seed: 5,
                ..Default::default()
            };
            let mut used = Sampler::new(params.clone());
            used.sample(&large, &[], &[]);
            for _ in 0..50 {
                assert_eq!(used.sample(&small, &[], &[]), 2, "top_p {top_p}");
            }
            // Every draw takes one number from the seed's sequence: 51 draws on another
            // vocabulary put a fresh sampler at the same point.
            let mut twin = Sampler::new(params);
            for _ in 0..51 {
                twin.sample(&large[..7], &[], &[]);
            }
            assert_eq!(
                used.sample(&large, &[], &[]),
                twin.sample(&large, &[], &[]),
                "top_p {top_p}: the same seed position, the same draw"
            );
        }
    }

    #[test]
    fn a_draw_by_blocks_is_the_draw_over_all_weights() {
        // Whole-number weights, so every sum is exact and the two scans must agree everywhere,
        // block edges and the last candidate included.
        let n = 3 * BLOCK + 5;
        let weights: Vec<f64> = (0..n).map(|i| ((i * 7919) % 5) as f64).collect();
        let totals: Vec<f64> = weights.chunks(BLOCK).map(|c| c.iter().sum()).collect();
        let total: f64 = weights.iter().sum();
        let sequential = |mut r: f64| {
            for (i, &q) in weights.iter().enumerate() {
                if r < q {
                    return i as u32;
                }
                r -= q;
            }
            (0..n).rev().find(|&i| weights[i] > 0.0).unwrap() as u32
        };
        for r in (0..4000)
            .map(|i| i as f64 * total / 4000.0)
            .chain([0.0, total - 0.5, total, total + 3.0])
        {
            assert_eq!(draw(r, &weights, &totals, |i| i as u32), sequential(r), "r = {r}");
        }
        for b in 1..totals.len() {
            let edge: f64 = totals[..b].iter().sum();
            for r in [edge - 0.5, edge, edge + 0.5] {
                assert_eq!(
                    draw(r, &weights, &totals, |i| i as u32),
                    sequential(r),
                    "block edge r = {r}"
                );
            }
        }
    }
}
