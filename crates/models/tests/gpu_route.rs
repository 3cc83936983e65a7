//! Routing on the GPU against the CPU's `Router::route` (both rules: softmax top-k, and sigmoid
//! scores with a correction bias and group limits), and the routing table it builds against the
//! one `Recorder::routing` uploads from the CPU's routes. Needs an adapter (Mesa's software
//! Vulkan driver is one); only `STRATA_NO_GPU=1` lets it pass without running.

use std::collections::BTreeMap;

use strata_gpu::{select, Gpu, Preference, Routing, Selection};
use strata_kernels::Linear;
use strata_models::layers::moe::{Route, Router, RoutingRule};

fn gpu() -> Option<Gpu> {
    match select(Preference::Gpu) {
        Ok(Selection::Gpu(g)) => Some(*g),
        Ok(Selection::Cpu { why }) => panic!("--device gpu chose the CPU: {why}"),
        Err(e) if std::env::var("STRATA_NO_GPU").is_ok_and(|v| v == "1") => {
            eprintln!("STRATA_NO_GPU=1: GPU tests not run ({e})");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The GPU's routes of `logits` (tokens x experts) and its routing table, read back.
fn on_gpu(g: &Gpu, router: &Router, logits: &[f32], tokens: usize) -> (Vec<Route>, Vec<u32>) {
    let (n, k) = (router.weight.out_dim, router.top_k);
    let lt = g.upload_tensor(logits).unwrap();
    let bias = match &router.rule {
        RoutingRule::SigmoidGrouped { correction_bias, .. } => {
            Some(g.upload_tensor(correction_bias).unwrap())
        }
        RoutingRule::SoftmaxTopK { .. } => None,
    };
    let rule = router.gpu_rule(bias.as_ref()).expect("a rule the GPU takes");
    let routes = g.tensor(tokens * k * 2).unwrap();
    let table = g.tensor(Routing::table_len(tokens, k, n)).unwrap();
    let mut rec = g.recorder();
    rec.route(&lt, (tokens, n, k), rule, &routes).unwrap();
    let routing = rec
        .route_table(&routes, (tokens, k, n), table, Vec::new())
        .unwrap();
    let len = Routing::table_len(tokens, k, n);
    let got = rec
        .finish(&[(&routes, 0, tokens * k * 2), (routing.table(), 0, len)])
        .unwrap();
    let routes = got[0]
        .chunks_exact(2 * k)
        .map(|r| Route {
            experts: r.chunks_exact(2).map(|p| p[0].to_bits() as usize).collect(),
            weights: r.chunks_exact(2).map(|p| p[1]).collect(),
        })
        .collect();
    (routes, got[1].iter().map(|v| v.to_bits()).collect())
}

/// The table `Recorder::routing` uploads for `routes` (without the experts' starts), and each
/// expert's first packed row with the end.
fn cpu_table(g: &Gpu, routes: &[Route], n: usize) -> (Vec<u32>, Vec<u32>) {
    let mut assigned: BTreeMap<usize, Vec<(usize, f32)>> = BTreeMap::new();
    for (t, r) in routes.iter().enumerate() {
        for (&e, &w) in r.experts.iter().zip(&r.weights) {
            assigned.entry(e).or_default().push((t, w));
        }
    }
    let lists: Vec<&[(usize, f32)]> = assigned.values().map(|v| v.as_slice()).collect();
    let mut rec = g.recorder();
    let routing = rec.routing(&lists, routes.len()).unwrap();
    let p: usize = routes.iter().map(|r| r.experts.len()).sum();
    let len = 3 * p + routes.len() + 1;
    let got = rec.finish(&[(routing.table(), 0, len)]).unwrap();
    let mut starts = vec![0u32; n + 1];
    for e in 0..n {
        starts[e + 1] = starts[e] + assigned.get(&e).map_or(0, |v| v.len() as u32);
    }
    (got[0].iter().map(|v| v.to_bits()).collect(), starts)
}

fn router(n: usize, k: usize, rule: RoutingRule) -> Router {
    Router {
        weight: Linear::from_f32(n, 1, vec![0.0; n]),
        top_k: k,
        rule,
    }
}

#[test]
fn gpu_routes_and_tables_match_the_cpu_rules() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut cases = Vec::new();
    for (n, k, norm) in [(8, 2, false), (128, 8, true), (60, 4, true), (1000, 16, false)] {
        cases.push(router(n, k, RoutingRule::SoftmaxTopK { norm_topk_prob: norm }));
    }
    for (n, k, groups, topk_group, norm) in [
        (256, 8, 8, 4, true),
        (64, 6, 1, 1, true),
        (384, 8, 1, 1, false),
        (96, 4, 12, 3, true),
    ] {
        let correction_bias = (0..n).map(|_| rng.f32() / 8.0).collect();
        cases.push(router(
            n,
            k,
            RoutingRule::SigmoidGrouped {
                correction_bias,
                n_group: groups,
                topk_group,
                norm_topk_prob: norm,
                routed_scaling_factor: 2.5,
            },
        ));
    }
    for r in &cases {
        let n = r.weight.out_dim;
        for tokens in [1, 3, 70] {
            let mut logits: Vec<f32> = (0..tokens * n).map(|_| rng.f32() * 4.0).collect();
            // Equal logits: ties go to the lower expert.
            logits[1] = logits[0];
            let want: Vec<Route> = logits.chunks_exact(n).map(|l| r.route(l)).collect();
            let (got, table) = on_gpu(&g, r, &logits, tokens);
            for (t, (a, b)) in want.iter().zip(&got).enumerate() {
                assert_eq!(
                    a.experts, b.experts,
                    "{n} experts, top {}: token {t}'s picks",
                    r.top_k
                );
                for (x, y) in a.weights.iter().zip(&b.weights) {
                    assert!(
                        (x - y).abs() <= 1e-6 * (1.0 + x.abs()),
                        "token {t}: weight {y} against the CPU's {x}"
                    );
                }
            }
            // The table of the GPU's routes, as the CPU lays it out; then the experts' starts.
            let (cpu, starts) = cpu_table(&g, &got, n);
            assert_eq!(
                table[..cpu.len()],
                cpu[..],
                "{n} experts, {tokens} tokens: routing table"
            );
            assert_eq!(
                table[cpu.len()..],
                starts[..],
                "{n} experts, {tokens} tokens: experts' starts"
            );
        }
    }
}
