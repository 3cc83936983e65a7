//! INT4 weights in compressed-tensors `pack-quantized` layout (Kimi K2 Thinking's routed experts):
//! element j of a row sits at bits 4*(j%8) of i32 word j/8, stored as q+8 (q in -8..7); one BF16
//! scale per `group` inputs (symmetric, no zero point): `w = q * scale[j / group]`.

use std::sync::OnceLock;

use crate::dot::bf16_to_f32;
use crate::intdot::{self, IntAct};

/// The signed value of element j of a packed row.
#[inline]
pub fn int4_at(packed: &[u32], j: usize) -> i32 {
    ((packed[j / 8] >> (4 * (j % 8))) & 0xf) as i32 - 8
}

/// Scalar reference: one row (`packed` holds ceil(in/8) words, `scales` ceil(in/group) BF16).
pub fn dot_int4_reference(packed: &[u32], scales: &[u16], group: usize, x: &[f32]) -> f32 {
    let mut total = 0f32;
    for (g, xg) in x.chunks(group).enumerate() {
        let mut acc = [0f32; 8];
        let base = g * group;
        let n8 = xg.len() / 8 * 8;
        for c in (0..n8).step_by(8) {
            for l in 0..8 {
                acc[l] += int4_at(packed, base + c + l) as f32 * xg[c + l];
            }
        }
        let mut s = crate::dot::tree8(acc);
        for i in n8..xg.len() {
            s += int4_at(packed, base + i) as f32 * xg[i];
        }
        total += s * bf16_to_f32(scales[g]);
    }
    total
}

type DotInt4 = fn(&[u32], &[u16], usize, &[f32]) -> f32;

pub fn dot_int4(packed: &[u32], scales: &[u16], group: usize, x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotInt4> = OnceLock::new();
    (IMPL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if crate::dot::has_avx2_fma_f16c() {
            return x86::dot_int4_avx2_entry;
        }
        dot_int4_reference
    }))(packed, scales, group, x)
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2+FMA: one 32-bit word holds 8 consecutive inputs; a variable shift spreads its nibbles
    //! over 8 lanes.
    use std::arch::x86_64::*;

    use crate::dot::bf16_to_f32;

    pub fn dot_int4_avx2_entry(packed: &[u32], scales: &[u16], group: usize, x: &[f32]) -> f32 {
        // SAFETY: selected only when avx2 and fma were detected.
        unsafe { dot_int4_avx2(packed, scales, group, x) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_int4_avx2(packed: &[u32], scales: &[u16], group: usize, x: &[f32]) -> f32 {
        let n = x.len();
        assert!(packed.len() * 8 >= n && scales.len() * group >= n);
        let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        let mask = _mm256_set1_epi32(0xf);
        let eight = _mm256_set1_ps(8.0);
        let mut total = _mm256_setzero_ps();
        let mut tail = 0f32;
        let mut start = 0;
        let mut g = 0;
        while start < n {
            let end = (start + group).min(n);
            let mut acc = _mm256_setzero_ps();
            let mut i = start;
            // Whole words only (a group of 32 is 4 words; groups start on word boundaries when
            // group is a multiple of 8).
            while i + 8 <= end && i % 8 == 0 {
                let word = _mm256_set1_epi32(*packed.get_unchecked(i / 8) as i32);
                let q = _mm256_and_si256(_mm256_srlv_epi32(word, shifts), mask);
                let wv = _mm256_sub_ps(_mm256_cvtepi32_ps(q), eight);
                acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i)), acc);
                i += 8;
            }
            let scale = bf16_to_f32(scales[g]);
            total = _mm256_fmadd_ps(acc, _mm256_set1_ps(scale), total);
            let mut s = 0f32;
            while i < end {
                s += super::int4_at(packed, i) as f32 * x[i];
                i += 1;
            }
            tail += s * scale;
            start = end;
            g += 1;
        }
        crate::dot::hsum256(total) + tail
    }
}

/// The activation quantized for [`dot_int4_prepared`] (see [`crate::intdot`]); `None` when the group
/// is not a power-of-two multiple of 32 or the row has no whole block of 64.
pub fn prepare(x: &[f32], group: usize) -> Option<IntAct> {
    let fast = group.is_multiple_of(32) && group.is_power_of_two() && x.len() >= intdot::BLOCK;
    fast.then(|| intdot::prepare(x, 8, 1.0))
}

/// [`dot_int4_prepared`] for a run of rows of a matrix: `packed` and `scales` hold whole rows of
/// `x.len()` inputs, `out[i]` gets row `first + i`.
pub fn rows_int4_prepared(
    packed: &[u32],
    scales: &[u16],
    group: usize,
    x: &[f32],
    p: Option<&IntAct>,
    first: usize,
    out: &mut [f32],
) {
    rows_int4_tokens(packed, scales, group, &[x], &[p], first, out)
}

/// [`rows_int4_prepared`] for several tokens at once (`xs[t]` prepared as `ps[t]`):
/// `out[i * T + t]` gets row `first + i` times token t, the same value as a one-token call
/// gives. The SIMD kernel unpacks each weight block once for up to four tokens.
pub fn rows_int4_tokens(
    packed: &[u32],
    scales: &[u16],
    group: usize,
    xs: &[&[f32]],
    ps: &[Option<&IntAct>],
    first: usize,
    out: &mut [f32],
) {
    let (tokens, n, rows) = intdot::token_rows(xs, ps, first, out);
    let (words, groups) = (n.div_ceil(8), n.div_ceil(group));
    let packed = &packed[rows.start * words..rows.end * words];
    let scales = &scales[rows.start * groups..rows.end * groups];
    if intdot::simd() {
        let fast = intdot::with_acts(ps, |acts| {
            // SAFETY: u32 words are little-endian bytes on the CPUs with `intdot::simd()` (x86-64,
            // little-endian aarch64); the byte view covers the same memory.
            let bytes = unsafe { std::slice::from_raw_parts(packed.as_ptr() as *const u8, packed.len() * 4) };
            let s = if group == 32 {
                intdot::Scales::Bf16Group32(scales)
            } else {
                intdot::Scales::Bf16Wide(scales, group.trailing_zeros())
            };
            intdot::dot_rows(bytes, words * 4, s, groups, None, acts, out);
            for (t, (a, x)) in acts.iter().zip(xs).enumerate() {
                intdot::add_tails(out, tokens, t, a, n, |i, j| {
                    int4_at(&packed[i * words..], j) as f32
                        * x[j]
                        * bf16_to_f32(scales[i * groups + j / group])
                });
            }
        });
        if fast.is_some() {
            return;
        }
    }
    for (i, row_out) in out.chunks_exact_mut(tokens).enumerate() {
        let (w, s) = (
            &packed[i * words..(i + 1) * words],
            &scales[i * groups..(i + 1) * groups],
        );
        for (o, x) in row_out.iter_mut().zip(xs) {
            *o = dot_int4_reference(w, s, group, x);
        }
    }
}

/// The dot with an activation from [`prepare`]: the whole blocks in integers (24-bit activation),
/// the rest exactly as [`dot_int4_reference`].
pub fn dot_int4_prepared(packed: &[u32], scales: &[u16], group: usize, x: &[f32], p: Option<&IntAct>) -> f32 {
    let mut out = [0f32];
    rows_int4_prepared(packed, scales, group, x, p, 0, &mut out);
    out[0]
}
