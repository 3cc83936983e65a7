//! The GPU products against the CPU's scalar reference, batch invariance, and the split of large
//! weights. They need an adapter: on a machine without a GPU, Mesa's software Vulkan driver
//! (`apt-get install mesa-vulkan-drivers libvulkan1`) is one. Only where the environment says
//! there is none (`STRATA_NO_GPU=1`) do they pass without running.

use strata_gpu::{select, GpuError, Preference, Selection, Tile};
use strata_kernels::WeightData;

mod common;
#[path = "common/weights.rs"]
mod weights;
use common::{gpu, Rng};
use weights::{Weights, KINDS};

#[test]
fn products_equal_the_cpu_reference_within_reordering() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for case in 0..6 * KINDS {
        let rows = 1 + rng.below(70);
        let in_dim = 1 + rng.below(600);
        let tokens = 1 + rng.below(19);
        let w = Weights::random(case % KINDS, rows, in_dim, &mut rng);
        let xs = rng.f32s(tokens * in_dim);
        let m = w.upload(&g).unwrap();
        let ys = g.matmul(&m, &xs, tokens).unwrap();
        assert_eq!(ys.len(), rows * tokens);
        for t in 0..tokens {
            let x = &xs[t * in_dim..(t + 1) * in_dim];
            for r in 0..rows {
                let cpu = w.reference(r, x);
                let got = ys[t * rows + r];
                assert!(
                    w.within_reorder_bound(got, cpu, r, x),
                    "case {case} {}: {rows}x{in_dim}, token {t} of {tokens}, row {r}: GPU {got} CPU {cpu}",
                    w.name()
                );
            }
        }
    }
}

#[test]
fn a_token_gets_the_same_bits_alone_and_in_any_batch() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x0bad_cafe_0000_0042);
    for case in 0..2 * KINDS {
        let rows = 1 + rng.below(40);
        let in_dim = 1 + rng.below(900);
        let tokens = 2 + rng.below(30);
        let w = Weights::random(case % KINDS, rows, in_dim, &mut rng);
        let xs = rng.f32s(tokens * in_dim);
        let m = w.upload(&g).unwrap();
        let batch = g.matmul(&m, &xs, tokens).unwrap();
        for t in 0..tokens {
            let alone = g.matmul(&m, &xs[t * in_dim..(t + 1) * in_dim], 1).unwrap();
            for r in 0..rows {
                assert_eq!(
                    alone[r].to_bits(),
                    batch[t * rows + r].to_bits(),
                    "{} {rows}x{in_dim}: token {t} of {tokens}, row {r}",
                    w.name()
                );
            }
        }
    }
}

#[test]
fn weights_split_over_several_bindings_give_the_same_bits() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(0x1111_2222_3333_4444);
    // Widths off the 16-byte word, so chunks and rows start inside one too.
    let widths = [1usize, 7, 33, 257, 1030, 3, 64, 40, 12, 95, 5, 300, 31, 48];
    for (case, in_dim) in widths.into_iter().enumerate() {
        let rows = 29;
        let tokens = 3;
        let mut w = Weights::random(case % KINDS, rows, in_dim, &mut rng);
        // FP8 blocks of a few rows, so several fit one small binding.
        while matches!(w.data, WeightData::Fp8 { block, .. } if block.0 > 3) {
            w = Weights::random(case % KINDS, rows, in_dim, &mut rng);
        }
        let xs = rng.f32s(tokens * in_dim);
        let whole = w.upload(&g).unwrap();
        assert_eq!(whole.chunks(), 1);
        let want = g.matmul(&whole, &xs, tokens).unwrap();
        let full = g.max_binding();
        g.set_max_binding((4 * in_dim * 4 + 32) as u64);
        let split = w.upload(&g).unwrap();
        assert!(split.chunks() > 1, "{in_dim}: {} chunk(s)", split.chunks());
        let got = g.matmul(&split, &xs, tokens).unwrap();
        g.set_max_binding(full);
        let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "in_dim {in_dim}: split and whole products differ");
    }
}

#[test]
fn bad_shapes_are_errors_naming_the_shape() {
    let Some(g) = gpu() else { return };
    let Err(e) = g.upload_bf16(&[0u16; 10], 3) else {
        panic!("10 values taken as rows of 3")
    };
    assert!(
        matches!(e, GpuError::Shape(_)) && e.to_string().contains("rows of 3"),
        "{e}"
    );
    let m = g.upload_bf16(&[0u16; 12], 3).unwrap();
    let e = g
        .matmul(&m, &[0f32; 5], 2)
        .expect_err("5 values taken as 2 tokens of 3");
    assert!(e.to_string().contains("2 tokens of 3"), "{e}");
    // Two INT4 rows of 16 inputs take two BF16 scales of group 16, not three.
    let Err(e) = g.upload_int4(&[0u32; 4], &[0u16; 3], 16, 16) else {
        panic!("three scales taken for two rows of one group")
    };
    assert!(e.to_string().contains("Int4 scales of 6 bytes"), "{e}");
}

#[test]
fn auto_takes_a_discrete_gpu_and_never_a_software_adapter() {
    let discrete = strata_gpu::adapters().iter().any(|a| a.kind == "discrete GPU");
    match select(Preference::Auto).unwrap() {
        Selection::Gpu(g) => assert_eq!(g.adapter().kind, "discrete GPU", "auto took {}", g.adapter()),
        Selection::Cpu { why } => {
            assert!(
                !discrete,
                "auto fell back to the CPU ({why}) though a discrete GPU exists"
            );
            assert!(!why.is_empty());
        }
    }
}

#[test]
fn every_tile_gives_every_output_the_same_bits() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x7117_0000_dead_0001);
    for kind in 0..KINDS {
        let rows = 1 + rng.below(37);
        let in_dim = 1 + rng.below(700);
        let tokens = 1 + rng.below(13);
        let w = Weights::random(kind, rows, in_dim, &mut rng);
        let xs = rng.f32s(tokens * in_dim);
        let m = w.upload(&g).unwrap();
        let want = g.matmul(&m, &xs, tokens).unwrap();
        for tile in Tile::ALL {
            let got = g.matmul_tile(&m, &xs, tokens, tile).unwrap();
            let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{} {rows}x{in_dim}, {tokens} tokens: tile {tile} differs",
                w.name()
            );
        }
    }
}

#[test]
fn a_group_of_products_gives_each_the_bits_it_gets_alone() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut ws = Vec::new();
    let mut ms = Vec::new();
    for case in 0..2 * KINDS {
        let rows = if case == 3 { 40 } else { 1 + rng.below(50) };
        let in_dim = 1 + rng.below(500);
        let w = Weights::random(case % KINDS, rows, in_dim, &mut rng);
        // One matrix split over several bindings, so a group holds a product of several chunks.
        let full = g.max_binding();
        if case == 3 {
            g.set_max_binding((4 * in_dim * 4 + 64) as u64);
        }
        ms.push(w.upload(&g).unwrap());
        g.set_max_binding(full);
        if case == 3 {
            assert!(ms[3].chunks() > 1, "the split matrix fits one binding");
        }
        ws.push(w);
    }
    let xs: Vec<(Vec<f32>, usize)> = ms
        .iter()
        .map(|m| {
            let tokens = 1 + rng.below(11);
            (rng.f32s(tokens * m.in_dim()), tokens)
        })
        .collect();
    let jobs: Vec<(&strata_gpu::GpuMatrix, &[f32], usize)> = ms
        .iter()
        .zip(&xs)
        .map(|(m, (x, t))| (m, x.as_slice(), *t))
        .collect();
    let group = g.matmul_many(&jobs).unwrap();
    for ((w, (m, x, t)), got) in ws.iter().zip(&jobs).zip(&group) {
        let alone = g.matmul(m, x, *t).unwrap();
        let same = alone.len() == got.len() && alone.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{} {}x{}, {t} tokens: grouped outputs differ from its own",
            w.name(),
            m.rows(),
            m.in_dim()
        );
    }
}

/// INT4 rows of whole 32-input groups under groups of 32 or 128 (every checkpoint's) take the
/// 32-input steps: within the CPU reference's reordering bound, and bit for bit the same through
/// every tile, over split bindings and within a group of products.
#[test]
fn int4_rows_of_whole_groups_agree_through_every_path() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(0x1a74_32e3_0000_0005);
    for case in 0..8 {
        let rows = 1 + rng.below(40);
        let in_dim = 32 * (1 + rng.below(24));
        let tokens = 1 + rng.below(9);
        let w = Weights::random_variant(5, rows, in_dim, Some(case % 2), &mut rng);
        assert!(w.name().starts_with("INT4 g"), "{}", w.name());
        let xs = rng.f32s(tokens * in_dim);
        let m = w.upload(&g).unwrap();
        let want = g.matmul(&m, &xs, tokens).unwrap();
        for t in 0..tokens {
            let x = &xs[t * in_dim..(t + 1) * in_dim];
            for r in 0..rows {
                let (got, cpu) = (want[t * rows + r], w.reference(r, x));
                assert!(
                    w.within_reorder_bound(got, cpu, r, x),
                    "case {case}: {rows}x{in_dim}, token {t}, row {r}: GPU {got} CPU {cpu}"
                );
            }
        }
        for tile in Tile::ALL {
            let got = g.matmul_tile(&m, &xs, tokens, tile).unwrap();
            let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "case {case}: {rows}x{in_dim}, {tokens} tokens: tile {tile} differs"
            );
        }
        let other = rng.f32s(in_dim);
        let group = g.matmul_many(&[(&m, &xs, tokens), (&m, &other, 1)]).unwrap();
        assert!(group[0]
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        let full = g.max_binding();
        g.set_max_binding((in_dim / 2 * 3 + 64) as u64);
        let split = w.upload(&g).unwrap();
        g.set_max_binding(full);
        if rows > 3 {
            assert!(split.chunks() > 1, "{rows}x{in_dim}: {} chunk(s)", split.chunks());
        }
        let got = g.matmul(&split, &xs, tokens).unwrap();
        let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "case {case}: {rows}x{in_dim}: split and whole products differ"
        );
    }
}
