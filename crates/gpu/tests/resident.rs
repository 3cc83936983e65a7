//! A layer's routed experts all kept in slabs (`ResidentExperts`): the items of its gate, up and
//! down products laid out on the GPU from a routing table the GPU made, each product run as one
//! indirect dispatch per slab. Every output has the bits `matmul_experts` gives it from routes
//! the CPU knows, for every format, experts over two slabs, experts with no rows and with
//! several blocks of rows; and a layer with one expert outside the slabs is refused.

use strata_gpu::{Gpu, GpuMatrix, Recorder, ResidentExperts, Routing};

mod common;
#[path = "common/weights.rs"]
mod weights;
use common::{gpu, Rng};
use weights::{Weights, KINDS};

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// `tokens` tokens' routes, `k` distinct experts of `n` each, ascending: the GPU's layout
/// ((expert id bits, weight) pairs), and each expert's rows in the packed order (expert after
/// expert, each expert's tokens ascending).
fn routes(tokens: usize, k: usize, n: usize, rng: &mut Rng) -> (Vec<f32>, Vec<(usize, usize)>) {
    let mut values = Vec::new();
    let mut count = vec![0usize; n];
    for _ in 0..tokens {
        let mut picks: Vec<usize> = Vec::new();
        while picks.len() < k {
            // Skewed towards the first experts, so some take several blocks of rows.
            let e = if rng.below(2) == 0 {
                rng.below(3.min(n))
            } else {
                rng.below(n)
            };
            if !picks.contains(&e) {
                picks.push(e);
            }
        }
        picks.sort_unstable();
        for e in picks {
            count[e] += 1;
            values.extend([f32::from_bits(e as u32), rng.f32()]);
        }
    }
    let mut spans = Vec::new();
    let mut at = 0;
    for c in count {
        spans.push((at, c));
        at += c;
    }
    (values, spans)
}

/// Product `p` of every expert through the resident layout and through `matmul_experts`.
fn both(
    g: &Gpu,
    res: &ResidentExperts,
    mats: &[Vec<GpuMatrix>; 3],
    (tokens, k): (usize, usize),
    rng: &mut Rng,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let n = mats[0].len();
    let (values, spans) = routes(tokens, k, n, rng);
    let rows = tokens * k;
    let mut out = Vec::new();
    for (p, ms) in mats.iter().enumerate() {
        let (out_dim, in_dim) = (ms[0].rows(), ms[0].in_dim());
        let x = g.upload_tensor(&rng.f32s(rows * in_dim)).unwrap();
        let y = g.tensor(rows * out_dim).unwrap();
        let r = g.upload_tensor(&values).unwrap();
        let table = g.tensor(Routing::table_len(tokens, k, n)).unwrap();
        let mut rec: Recorder<'_> = g.recorder();
        let routing = rec.route_table(&r, (tokens, k, n), table, vec![0, rows]).unwrap();
        let items = rec.resident_items(res, &routing, k).unwrap();
        rec.resident_product(res, &items, p, &x, &y).unwrap();
        let got = rec.finish(&[(&y, 0, rows * out_dim)]).unwrap().remove(0);
        let want_y = g.tensor(rows * out_dim).unwrap();
        let refs: Vec<&GpuMatrix> = ms.iter().collect();
        let mut rec = g.recorder();
        rec.matmul_experts(&refs, &spans, &x, &want_y).unwrap();
        let want = rec.finish(&[(&want_y, 0, rows * out_dim)]).unwrap().remove(0);
        out.push((got, want));
    }
    out
}

#[test]
fn products_laid_out_on_the_gpu_give_the_bits_of_those_laid_out_by_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x5eed_0000_4e5e_0001);
    // Every format with a few experts (one slab), then enough small experts that each product
    // spans two slabs (a slab holds at most 1024 matrices; square ones, so the three products
    // share them).
    let cases = (0..KINDS)
        .map(|kind| (kind, 9, false))
        .chain([(0, 400, true), (5, 400, true)]);
    for (kind, most, small) in cases {
        let (d, f) = match small {
            false => (1 + rng.below(300), 1 + rng.below(90)),
            true => (8, 8),
        };
        let variant = Some(rng.below(4));
        let n = most + rng.below(12);
        let shapes = [(f, d), (f, d), (d, f)];
        let ws: Vec<[Weights; 3]> = (0..n)
            .map(|_| shapes.map(|(r, c)| Weights::random_variant(kind, r, c, variant, &mut rng)))
            .collect();
        // Expert by expert, as a layer's experts are kept.
        let mut mats: [Vec<GpuMatrix>; 3] = Default::default();
        for w in &ws {
            for (p, m) in mats.iter_mut().enumerate() {
                m.push(g.upload_expert(&w[p].data, w[p].in_dim).unwrap().unwrap());
            }
        }
        let refs: [Vec<&GpuMatrix>; 3] = std::array::from_fn(|p| mats[p].iter().collect());
        let res = ResidentExperts::new(&g, [&refs[0], &refs[1], &refs[2]])
            .unwrap()
            .expect("every expert in a slab");
        if small {
            assert!(res.slabs().iter().all(|&s| s >= 2), "{:?}: one slab", res.slabs());
        }
        for (tokens, k) in [(1, 2.min(n)), (3, 4), (37, 3)] {
            for (p, (got, want)) in both(&g, &res, &mats, (tokens, k), &mut rng).iter().enumerate() {
                assert!(
                    same_bits(got, want),
                    "{} {f}x{d}, {n} experts, {tokens} tokens x {k}: product {p} differs",
                    ws[0][0].name()
                );
            }
        }
    }
}

#[test]
fn a_layer_with_an_expert_outside_the_slabs_is_not_resident() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x5eed_0000_4e5e_0002);
    let ws: Vec<Weights> = (0..4)
        .map(|_| Weights::random_variant(0, 16, 32, Some(0), &mut rng))
        .collect();
    let mut ms: Vec<GpuMatrix> = ws
        .iter()
        .map(|w| g.upload_expert(&w.data, w.in_dim).unwrap().unwrap())
        .collect();
    ms[2] = ws[2].upload(&g).unwrap();
    let refs: Vec<&GpuMatrix> = ms.iter().collect();
    let made = ResidentExperts::new(&g, [&refs, &refs, &refs]).unwrap();
    assert!(
        made.is_none(),
        "a layer with an expert outside the slabs was made resident"
    );
}
