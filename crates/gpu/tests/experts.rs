//! Products of several routed experts as one dispatch (`Recorder::matmul_experts`), their
//! matrices in slots of the expert slabs: each output has the bits the expert's own product
//! gives, for every format, for experts with no rows, one row or several blocks of rows, for an
//! expert outside the slabs among them, and for a slot given back and taken by another expert.

use strata_gpu::{Gpu, GpuMatrix};

mod common;
#[path = "common/weights.rs"]
mod weights;
use common::{gpu, Rng};
use weights::{Weights, KINDS};

/// Expert i's outputs through one recorded `matmul_experts` over rows packed expert after
/// expert (`counts[i]` rows each), and through its own product.
fn grouped_and_alone(g: &Gpu, ms: &[&GpuMatrix], counts: &[usize], rng: &mut Rng) -> (Vec<f32>, Vec<f32>) {
    let (out, ind) = (ms[0].rows(), ms[0].in_dim());
    let mut rows = Vec::new();
    let mut at = 0;
    for &n in counts {
        rows.push((at, n));
        at += n;
    }
    let xs = rng.f32s(at.max(1) * ind);
    let x = g.upload_tensor(&xs).unwrap();
    let y = g.tensor(at.max(1) * out).unwrap();
    let mut rec = g.recorder();
    rec.matmul_experts(ms, &rows, &x, &y).unwrap();
    let got = rec.finish(&[(&y, 0, at * out)]).unwrap().remove(0);
    let mut alone = Vec::new();
    for (m, &(r0, n)) in ms.iter().zip(&rows) {
        if n > 0 {
            alone.extend(g.matmul(m, &xs[r0 * ind..(r0 + n) * ind], n).unwrap());
        }
    }
    (got, alone)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn experts_in_one_dispatch_give_each_output_its_own_products_bits() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x5eed_0000_e4e4_0001);
    for kind in 0..KINDS {
        for case in 0..2 {
            let rows = 1 + rng.below(70);
            let in_dim = 1 + rng.below(600);
            let variant = Some(rng.below(4));
            let n = 3 + rng.below(6);
            let ws: Vec<Weights> = (0..n)
                .map(|_| Weights::random_variant(kind, rows, in_dim, variant, &mut rng))
                .collect();
            let ms: Vec<GpuMatrix> = ws
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    // The second expert of the second case lies outside the slabs.
                    if case == 1 && i == 1 {
                        return w.upload(&g).unwrap();
                    }
                    let m = g.upload_expert(&w.data, w.in_dim).unwrap().unwrap();
                    assert!(m.in_slab(), "{} {rows}x{in_dim}: not in a slab", w.name());
                    m
                })
                .collect();
            let refs: Vec<&GpuMatrix> = ms.iter().collect();
            // No rows, one row, and up to three blocks of four.
            let counts: Vec<usize> = (0..n)
                .map(|i| match (case, i) {
                    (0, _) => 1,
                    (_, 0) => 0,
                    _ => rng.below(12),
                })
                .collect();
            let (got, alone) = grouped_and_alone(&g, &refs, &counts, &mut rng);
            assert!(
                same_bits(&got, &alone),
                "{} {rows}x{in_dim}, rows {counts:?}: grouped outputs differ from their own products",
                ws[0].name()
            );
        }
    }
}

#[test]
fn a_slot_given_back_holds_the_next_expert() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x5eed_0000_e4e4_0002);
    let (rows, in_dim) = (24, 200);
    let ws: Vec<Weights> = (0..4)
        .map(|_| Weights::random_variant(5, rows, in_dim, Some(0), &mut rng))
        .collect();
    let up = |w: &Weights| g.upload_expert(&w.data, w.in_dim).unwrap().unwrap();
    let mut ms: Vec<GpuMatrix> = ws[..3].iter().map(up).collect();
    let counts = [2, 5, 1];
    let before = {
        let refs: Vec<&GpuMatrix> = ms.iter().collect();
        grouped_and_alone(&g, &refs, &counts, &mut rng)
    };
    assert!(same_bits(&before.0, &before.1));
    // The middle expert goes; the fourth takes a slot (its own, or the one given back).
    ms.remove(1);
    ms.insert(1, up(&ws[3]));
    let refs: Vec<&GpuMatrix> = ms.iter().collect();
    let (got, alone) = grouped_and_alone(&g, &refs, &counts, &mut rng);
    assert!(
        same_bits(&got, &alone),
        "an expert in a slot given back gives other bits"
    );
    // And its outputs are the fourth expert's, against the CPU reference.
    let xs = rng.f32s(in_dim);
    let y = g.matmul(&ms[1], &xs, 1).unwrap();
    for (r, v) in y.iter().enumerate() {
        let want = ws[3].reference(r, &xs);
        assert!(
            (v - want).abs() <= 1e-3 * (1.0 + want.abs()),
            "row {r}: {v} against the fourth expert's {want}"
        );
    }
}

#[test]
fn experts_leave_the_budget_the_non_expert_weights_need() {
    use strata_kernels::offload::Device;
    use strata_kernels::Linear;
    let Some(g) = gpu() else { return };
    let (rows, in_dim) = (64, 256);
    let bytes = (rows * in_dim * 4) as u64;
    // Room for four matrices; the model's non-expert weights are said to need two.
    let off = strata_gpu::Offload::new(g, Some(4 * bytes), true);
    off.hold_back_for_resident(2 * bytes);
    let matrix = |seed: u32| {
        Linear::from_f32(
            rows,
            in_dim,
            (0..rows * in_dim).map(|i| (i as u32 ^ seed) as f32).collect(),
        )
    };
    let experts: Vec<Linear> = (0..4).map(|i| matrix(i).routed_expert()).collect();
    // The copies are held (a copy dropped gives its room back).
    let kept: Vec<_> = experts.iter().map(|e| off.upload(e, true)).collect();
    let some: Vec<bool> = kept.iter().map(Option::is_some).collect();
    assert_eq!(
        some,
        [true, true, false, false],
        "experts past the budget less the non-expert weights"
    );
    // An expert without room is still copied for its product.
    assert!(
        off.upload(&experts[3], false).is_some(),
        "no copy for one product"
    );
    // The non-expert weights find their room.
    let dense: Vec<Linear> = (10..12).map(matrix).collect();
    let copies: Vec<_> = dense.iter().map(|d| off.upload(d, true)).collect();
    assert!(
        copies.iter().all(Option::is_some),
        "a non-expert weight found no room"
    );
    assert_eq!(off.resident_bytes(), 4 * bytes);
}
