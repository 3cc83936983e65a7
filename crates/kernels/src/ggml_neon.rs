//! aarch64 NEON products on GGUF's block types ([`crate::ggml`]) and Q8_0: each block decoded by
//! its scalar decoder ([`crate::ggml_decode`], plain loops the compiler vectorizes for NEON) into
//! 256 f32 on the stack, then sixteen weights at a time multiplied into every token's four sums of
//! 4 lanes (up to four tokens per pass over a row, each token's sums in the same order whatever
//! their number: batch invariance), the sums added in a fixed order. Property-tested against the
//! scalar twins in `tests/neon.rs` (under emulation: `../shared/tools/aarch64-test.sh`).

use std::arch::aarch64::*;

use crate::ggml::BlockType;
use crate::ggml_decode::{self as dec, Decode};

/// Up to this many tokens share a pass over a row.
const TOKENS_PER_PASS: usize = 4;

pub fn rows_tokens_entry(ty: BlockType, rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    check(ty.block(), ty.row_bytes(xs[0].len()), rows, row_bytes, xs, out);
    // SAFETY: every aarch64 CPU has NEON; the shapes are checked.
    unsafe { crate::ggml::with_decoder!(ty, rows_tokens, rows, row_bytes, xs, out) }
}

/// Q8_0 rows ([`crate::q8_0`]) the same way.
pub fn q8_0_rows_tokens(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    check(
        dec::Q8_0::N,
        crate::q8_0::row_bytes(xs[0].len()),
        rows,
        row_bytes,
        xs,
        out,
    );
    // SAFETY: as above.
    unsafe { rows_tokens::<dec::Q8_0>(rows, row_bytes, xs, out) }
}

fn check(block: usize, need: usize, rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let tokens = xs.len();
    assert!(tokens > 0 && out.len().is_multiple_of(tokens));
    let n = xs[0].len();
    assert!(n.is_multiple_of(block) && xs.iter().all(|x| x.len() == n));
    assert!(row_bytes >= need && rows.len() >= out.len() / tokens * row_bytes);
}

/// # Safety
/// The shapes must be as [`check`] checks.
unsafe fn rows_tokens<D: Decode>(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let tokens = xs.len();
    let n = xs[0].len();
    for (i, o) in out.chunks_exact_mut(tokens).enumerate() {
        let row = &rows[i * row_bytes..i * row_bytes + n / D::N * D::BYTES];
        let mut t = 0;
        while t < tokens {
            let group = &xs[t..(t + TOKENS_PER_PASS).min(tokens)];
            let dst = &mut o[t..t + group.len()];
            match group.len() {
                1 => dst.copy_from_slice(&row_n::<D, 1>(row, [group[0]])),
                2 => dst.copy_from_slice(&row_n::<D, 2>(row, group.try_into().unwrap())),
                3 => dst.copy_from_slice(&row_n::<D, 3>(row, group.try_into().unwrap())),
                _ => dst.copy_from_slice(&row_n::<D, 4>(row, group.try_into().unwrap())),
            }
            t += group.len();
        }
    }
}

/// One row times T tokens: each block decoded once for all of them.
#[inline(always)]
unsafe fn row_n<D: Decode, const T: usize>(row: &[u8], xs: [&[f32]; T]) -> [f32; T] {
    let mut acc = [[vdupq_n_f32(0.0); 4]; T];
    let mut buf = [0f32; 256];
    for (b, block) in row.chunks_exact(D::BYTES).enumerate() {
        D::decode(block, &mut buf);
        for c in (0..D::N).step_by(16) {
            let w = buf.as_ptr().add(c);
            let w = [
                vld1q_f32(w),
                vld1q_f32(w.add(4)),
                vld1q_f32(w.add(8)),
                vld1q_f32(w.add(12)),
            ];
            for t in 0..T {
                let x = xs[t].as_ptr().add(b * D::N + c);
                for k in 0..4 {
                    acc[t][k] = vfmaq_f32(acc[t][k], w[k], vld1q_f32(x.add(4 * k)));
                }
            }
        }
    }
    std::array::from_fn(|t| {
        let [a0, a1, a2, a3] = acc[t];
        let v = vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3));
        (vgetq_lane_f32::<0>(v) + vgetq_lane_f32::<2>(v)) + (vgetq_lane_f32::<1>(v) + vgetq_lane_f32::<3>(v))
    })
}
