//! The sampler's time per token over a Qwen3-sized vocabulary (151,936 logits), for the draws a
//! server makes most: temperature 1 with no filter (what `strata bench` samples with) and
//! temperature 0.7 with top-p 0.9. The logits are a smooth spread (no peak), the hardest case for
//! the ranked prefix of top-p. `cargo bench -p strata-runtime --bench sampler`.

use std::time::Instant;

use strata_runtime::{Sampler, SamplingParams};

fn main() {
    let vocab = 151_936;
    let logits: Vec<f32> = (0..vocab).map(|i| (i as f32 * 0.731).sin() * 8.0).collect();
    let cases = [
        (
            "temperature 1",
            SamplingParams {
                temperature: 1.0,
                seed: 3,
                ..Default::default()
            },
        ),
        (
            "temperature 0.7, top-p 0.9",
            SamplingParams {
                temperature: 0.7,
                top_p: 0.9,
                seed: 3,
                ..Default::default()
            },
        ),
    ];
    for (name, params) in cases {
        let mut sampler = Sampler::new(params);
        let draws = 400;
        let mut ids = 0u64;
        let start = Instant::now();
        for _ in 0..draws {
            ids += u64::from(sampler.sample(&logits, &[], &[]));
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / draws as f64;
        // The ids' sum shows that a change kept the draws.
        println!("{name:<28} {us:8.1} us per token over {vocab} logits (ids sum {ids})");
    }
}
