//! Weights written through the reused staging buffers (`staging.rs`): many uploads back to back,
//! with no wait between them, into buffers of their own and into expert slab slots, then every
//! product against the CPU's reference. A staging buffer written again before the GPU copied
//! its earlier contents would give some matrix another's weights.

use strata_gpu::GpuMatrix;

mod common;
#[path = "common/weights.rs"]
mod weights;
use common::{gpu, Rng};
use weights::{Weights, KINDS};

#[test]
fn uploads_back_to_back_keep_their_own_weights() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x57a9_1e55_0000_0007);
    // Over twice as many uploads as there are staging buffers, of every format, alternating
    // between own buffers and slab slots.
    let mut all: Vec<(Weights, GpuMatrix)> = Vec::new();
    for i in 0..3 * KINDS {
        let rows = 1 + rng.below(300);
        let in_dim = 1 + rng.below(900);
        let w = Weights::random(i % KINDS, rows, in_dim, &mut rng);
        let m = if i % 2 == 0 {
            w.upload(&g).unwrap()
        } else {
            g.upload_expert(&w.data, w.in_dim).unwrap().unwrap()
        };
        all.push((w, m));
    }
    // Larger than a staging buffer, so copied a staging buffer's bytes at a time: BF16 (40 MiB)
    // and INT4 (36 MiB, its scales past the first piece).
    for (kind, rows, in_dim) in [(0, 2560, 8192), (5, 4096, 16384)] {
        let big = Weights::random_variant(kind, rows, in_dim, Some(0), &mut rng);
        let m = big.upload(&g).unwrap();
        all.push((big, m));
    }
    for (i, (w, m)) in all.iter().enumerate() {
        let x = rng.f32s(w.in_dim);
        let y = g.matmul(m, &x, 1).unwrap();
        let rows = m.rows();
        assert_eq!(y.len(), rows);
        // Every row of the small ones; a spread of the large one's.
        let step = (rows / 64).max(1);
        for r in (0..rows).step_by(step) {
            let cpu = w.reference(r, &x);
            assert!(
                w.within_reorder_bound(y[r], cpu, r, &x),
                "upload {i} ({}, {rows}x{}): row {r}: GPU {} CPU {cpu}",
                w.name(),
                w.in_dim,
                y[r]
            );
        }
    }
}
