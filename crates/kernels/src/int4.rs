//! INT4 weights in compressed-tensors `pack-quantized` layout (Kimi K2 Thinking's routed experts):
//! element j of a row sits at bits 4*(j%8) of i32 word j/8, stored as q+8 (q in -8..7); one BF16
//! scale per `group` inputs (symmetric, no zero point): `w = q * scale[j / group]`.

use std::sync::OnceLock;

use crate::dot::bf16_to_f32;

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

    /// 8 words (64 inputs) per step: nibble k of every word, masked in place and converted,
    /// multiplies the pre-scaled inputs 8i + k. Lanes 0-3 hold one group-half, lanes 4-7 the next.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_int4_prepared_avx2(
        packed: &[u32],
        scales: &[u16],
        group: usize,
        x: &[f32],
        p: &super::Int4Prepared,
    ) -> f32 {
        let n = x.len();
        let blocked = super::blocked_len(n, group);
        assert!(packed.len() * 8 >= n && scales.len() * group >= n && p.perm.len() >= blocked);
        let mut total = _mm256_setzero_ps();
        let shift = group.trailing_zeros(); // group is a power of two here: no division per block
        for b in (0..blocked).step_by(64) {
            let v = _mm256_loadu_si256(packed.as_ptr().add(b / 8) as *const __m256i);
            let xp = p.perm.as_ptr().add(b);
            let w = |k: i32| -> __m256 {
                _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xf << (4 * k))))
            };
            let top = _mm256_cvtepi32_ps(_mm256_and_si256(
                _mm256_srli_epi32(v, 4),
                _mm256_set1_epi32(0x0f00_0000),
            ));
            let mut a0 = _mm256_mul_ps(w(0), _mm256_loadu_ps(xp));
            let mut a1 = _mm256_mul_ps(w(1), _mm256_loadu_ps(xp.add(8)));
            let mut a2 = _mm256_mul_ps(w(2), _mm256_loadu_ps(xp.add(16)));
            let mut a3 = _mm256_mul_ps(w(3), _mm256_loadu_ps(xp.add(24)));
            a0 = _mm256_fmadd_ps(w(4), _mm256_loadu_ps(xp.add(32)), a0);
            a1 = _mm256_fmadd_ps(w(5), _mm256_loadu_ps(xp.add(40)), a1);
            a2 = _mm256_fmadd_ps(w(6), _mm256_loadu_ps(xp.add(48)), a2);
            a3 = _mm256_fmadd_ps(top, _mm256_loadu_ps(xp.add(56)), a3);
            let sum = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
            let sa = bf16_to_f32(*scales.get_unchecked(b >> shift));
            let sb = bf16_to_f32(*scales.get_unchecked((b + 32) >> shift));
            let sv = _mm256_set_m128(_mm_set1_ps(sb), _mm_set1_ps(sa));
            total = _mm256_fmadd_ps(sum, sv, total);
        }
        // The -8 of every blocked weight, once per group.
        let mut offset = 0f32;
        for (g, s) in p.group_sums.iter().enumerate() {
            offset += bf16_to_f32(scales[g]) * s;
        }
        let mut tail = 0f32;
        for j in blocked..n {
            tail += super::int4_at(packed, j) as f32 * x[j] * bf16_to_f32(scales[j / group]);
        }
        crate::dot::hsum256(total) - 8.0 * offset + tail
    }
}

/// An activation prepared for [`dot_int4_prepared`]: x in nibble-major order per block of 64
/// inputs (vector k holds inputs 8i + k, pre-scaled by 2^-4k so a nibble masked in place needs no
/// shift), and the sum of x over each group's blocked part (the `-8` offset is applied once per
/// group instead of once per weight).
pub struct Int4Prepared {
    pub perm: Vec<f32>,
    pub group_sums: Vec<f32>,
}

/// Blocks of 64 inputs the fast kernel covers (the rest is the scalar tail).
fn blocked_len(n: usize, group: usize) -> usize {
    if group.is_multiple_of(32) && group.is_power_of_two() {
        n / 64 * 64
    } else {
        0
    }
}

fn nibble_scale(k: usize) -> f32 {
    // Nibble k is masked in place (value n * 2^4k), except the top one, shifted down by 4 first.
    if k == 7 {
        2f32.powi(-24)
    } else {
        2f32.powi(-4 * k as i32)
    }
}

pub fn prepare(x: &[f32], group: usize) -> Int4Prepared {
    let blocked = blocked_len(x.len(), group);
    let mut perm = Vec::with_capacity(blocked);
    for b in (0..blocked).step_by(64) {
        for k in 0..8 {
            let s = nibble_scale(k);
            perm.extend((0..8).map(|i| x[b + 8 * i + k] * s));
        }
    }
    let mut group_sums = vec![0f32; x.len().div_ceil(group)];
    for (j, v) in x[..blocked].iter().enumerate() {
        group_sums[j / group] += v;
    }
    Int4Prepared { perm, group_sums }
}

/// The dot with an activation from [`prepare`]; equals [`dot_int4_reference`] up to summation order.
pub fn dot_int4_prepared(packed: &[u32], scales: &[u16], group: usize, x: &[f32], p: &Int4Prepared) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::dot::has_avx2_fma_f16c() && blocked_len(x.len(), group) > 0 {
        // SAFETY: avx2 and fma were detected.
        return unsafe { x86::dot_int4_prepared_avx2(packed, scales, group, x, p) };
    }
    let _ = p;
    dot_int4_reference(packed, scales, group, x)
}
