//! x86-64 AVX-512 F variants of the dense (F32, BF16, F16) and INT8 row products, chosen by
//! [`crate::isa`] and property-tested against their scalar twins (`dot.rs`, `int8.rs`). Callers
//! reach them only after feature detection.
//!
//! Each is one weight row against N activations (N = 1 is the one-token product): each 32
//! weights are loaded and widened once and multiplied into every token's two accumulators of 16
//! lanes, so every token's sum runs in the same order whatever N is (batch invariance). Up to
//! eight tokens share a pass: 16 accumulators, the two weight vectors and the loads fit the 32
//! registers. Several-token products advance a block of rows a slice of inputs at a time (each
//! row's sums kept between slices: the same steps in the same order), so the slice of the
//! tokens' activations is read from the nearest cache rather than the next one down.

use std::arch::x86_64::*;

use crate::dot::bf16_to_f32;
use crate::dot::x86::prefetch_lines;

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn load_f32(p: *const f32) -> __m512 {
    _mm512_loadu_ps(p)
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn load_bf16(p: *const u16) -> __m512 {
    let h = _mm256_loadu_si256(p as *const __m256i);
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn load_f16(p: *const u16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn load_i8(p: *const i8) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)))
}

fn widen_f32(v: f32) -> f32 {
    v
}

fn widen_f16(v: u16) -> f32 {
    half::f16::from_bits(v).to_f32()
}

fn widen_i8(v: i8) -> f32 {
    v as f32
}

/// Sum of 16 lanes in a fixed order: halves added pairwise down to 8, then `tree8`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn hsum512(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    crate::dot::hsum256(_mm256_add_ps(lo, hi))
}

/// Inputs per slice of a several-token product: the slice of each token's activation (8 x 2 KiB)
/// and of a block of rows stay in the nearest cache while the rows' sums advance over it.
const SLICE: usize = 512;

/// Rows a several-token product keeps sums for at once (one block of accumulators on the stack).
const ROW_BLOCK: usize = 16;

macro_rules! kernel {
    ($steps:ident, $finish:ident, $rows:ident, $pair:ident, $tokens:ident, $group:ident, $elem:ty, $load:ident, $widen:expr) => {
        /// The 32-wide steps over `w[from..to]` (`to - from` a multiple of 32) into each token's
        /// two sums, in input order.
        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn $steps<const N: usize>(
            w: &[$elem],
            xs: &[&[f32]; N],
            from: usize,
            to: usize,
            a0: &mut [__m512; N],
            a1: &mut [__m512; N],
        ) {
            let mut i = from;
            while i < to {
                prefetch_lines(w.as_ptr(), std::mem::size_of::<$elem>() * i);
                let w0 = $load(w.as_ptr().add(i));
                let w1 = $load(w.as_ptr().add(i + 16));
                for t in 0..N {
                    let x = xs[t].as_ptr();
                    a0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x.add(i)), a0[t]);
                    a1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x.add(i + 16)), a1[t]);
                }
                i += 32;
            }
        }

        /// After the steps up to `pairs` (the last multiple of 32): one 16-wide step, the two
        /// sums added and reduced, the scalar tail, the scale.
        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn $finish<const N: usize>(
            w: &[$elem],
            scale: f32,
            xs: &[&[f32]; N],
            pairs: usize,
            mut a0: [__m512; N],
            a1: [__m512; N],
        ) -> [f32; N] {
            let n = w.len();
            let mut i = pairs;
            if i + 16 <= n {
                let w0 = $load(w.as_ptr().add(i));
                for t in 0..N {
                    a0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xs[t].as_ptr().add(i)), a0[t]);
                }
                i += 16;
            }
            let mut out = [0f32; N];
            for t in 0..N {
                let mut sum = hsum512(_mm512_add_ps(a0[t], a1[t]));
                for j in i..n {
                    sum += $widen(w[j]) * xs[t][j];
                }
                out[t] = sum * scale;
            }
            out
        }

        /// `out[t] = scale * (row . xs[t])`: the steps over the whole row, then the finish.
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn $rows<const N: usize>(w: &[$elem], scale: f32, xs: [&[f32]; N]) -> [f32; N] {
            for x in xs {
                assert_eq!(x.len(), w.len());
            }
            let pairs = w.len() / 32 * 32;
            let (mut a0, mut a1) = ([_mm512_setzero_ps(); N], [_mm512_setzero_ps(); N]);
            $steps::<N>(w, &xs, 0, pairs, &mut a0, &mut a1);
            $finish::<N>(w, scale, &xs, pairs, a0, a1)
        }

        /// One token against two rows `w[..n]` and `w[n..2n]` side by side: each row's steps,
        /// finish and scale are those of the one-row kernel with one token (the same bits), but
        /// the two rows' four sums advance together (twice the independent additions in flight)
        /// and each activation vector is loaded once for both rows.
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn $pair(w: &[$elem], scales: [f32; 2], x: &[f32]) -> [f32; 2] {
            let n = x.len();
            assert_eq!(w.len(), 2 * n);
            let (r0, r1) = w.split_at(n);
            let pairs = n / 32 * 32;
            let z = _mm512_setzero_ps();
            let (mut a0, mut a1, mut b0, mut b1) = (z, z, z, z);
            let (p, q, xp) = (r0.as_ptr(), r1.as_ptr(), x.as_ptr());
            let rb = std::mem::size_of_val(r0);
            let mut i = 0;
            while i < pairs {
                crate::dot::x86::pair_prefetch(p, q, std::mem::size_of::<$elem>() * i, rb);
                let (x0, x1) = (_mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(xp.add(i + 16)));
                a0 = _mm512_fmadd_ps($load(p.add(i)), x0, a0);
                a1 = _mm512_fmadd_ps($load(p.add(i + 16)), x1, a1);
                b0 = _mm512_fmadd_ps($load(q.add(i)), x0, b0);
                b1 = _mm512_fmadd_ps($load(q.add(i + 16)), x1, b1);
                i += 32;
            }
            let xs = [x];
            let ya = $finish::<1>(r0, scales[0], &xs, pairs, [a0], [a1]);
            let yb = $finish::<1>(r1, scales[1], &xs, pairs, [b0], [b1]);
            [ya[0], yb[0]]
        }

        /// N tokens against rows `r0..r0 + rows` (at most [`ROW_BLOCK`]): the steps advance a
        /// [`SLICE`] of inputs at a time over every row, each row's sums kept between slices
        /// (the same steps in the same order as the one-row kernel, so the same bits), then each row's
        /// finish.
        #[allow(clippy::too_many_arguments)]
        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn $group<const N: usize>(
            w: &[$elem],
            scales: Option<&[f32]>,
            in_dim: usize,
            xs: [&[f32]; N],
            r0: usize,
            rows: usize,
            out: &mut [f32],
            tokens: usize,
            t0: usize,
        ) {
            for x in xs {
                assert_eq!(x.len(), in_dim);
            }
            let pairs = in_dim / 32 * 32;
            let zero = ([_mm512_setzero_ps(); N], [_mm512_setzero_ps(); N]);
            // Only the block's rows get sums (zeroing all ROW_BLOCK would cost a one-row call more
            // than its products).
            let mut acc = [std::mem::MaybeUninit::<([__m512; N], [__m512; N])>::uninit(); ROW_BLOCK];
            for a in acc.iter_mut().take(rows) {
                a.write(zero);
            }
            let row = |r: usize| &w[(r0 + r) * in_dim..(r0 + r + 1) * in_dim];
            let mut k = 0;
            while k < pairs {
                let end = (k + SLICE).min(pairs);
                for (r, a) in acc.iter_mut().enumerate().take(rows) {
                    // SAFETY: the first `rows` entries were written above.
                    let (a0, a1) = a.assume_init_mut();
                    $steps::<N>(row(r), &xs, k, end, a0, a1);
                }
                k = end;
            }
            for (r, a) in acc.iter().enumerate().take(rows) {
                // SAFETY: as above.
                let (a0, a1) = a.assume_init();
                let s = scales.map_or(1.0, |s| s[r0 + r]);
                let o = &mut out[(r0 + r) * tokens + t0..(r0 + r) * tokens + t0 + N];
                o.copy_from_slice(&$finish::<N>(row(r), s, &xs, pairs, a0, a1));
            }
        }

        /// `out[r * T + t] = scale(r) * (row r . xs[t])` for the rows of `w` (`in_dim` wide):
        /// up to eight tokens per pass, blocks of [`ROW_BLOCK`] rows, [`SLICE`] inputs at a time.
        ///
        /// # Safety
        /// The CPU must have AVX-512 F, AVX2, FMA and F16C.
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn $tokens(
            w: &[$elem],
            scales: Option<&[f32]>,
            in_dim: usize,
            xs: &[&[f32]],
            out: &mut [f32],
        ) {
            let tokens = xs.len();
            let rows = w.len() / in_dim.max(1);
            assert_eq!(out.len(), rows * tokens);
            if tokens == 1 {
                let (x, scale) = (xs[0], |r: usize| scales.map_or(1.0, |s| s[r]));
                return crate::row_pairs(
                    out,
                    |r| {
                        $pair(
                            &w[r * in_dim..(r + 2) * in_dim],
                            [scale(r), scale(r + 1)],
                            x,
                        )
                    },
                    |r| $rows::<1>(&w[r * in_dim..(r + 1) * in_dim], scale(r), [x])[0],
                );
            }
            let mut t = 0;
            while t < tokens {
                let take = (tokens - t).min(8);
                let g = &xs[t..t + take];
                let mut r0 = 0;
                while r0 < rows {
                    let n = (rows - r0).min(ROW_BLOCK);
                    let a = (w, scales, in_dim);
                    match take {
                        1 => $group::<1>(a.0, a.1, a.2, [g[0]], r0, n, out, tokens, t),
                        2 => $group::<2>(a.0, a.1, a.2, [g[0], g[1]], r0, n, out, tokens, t),
                        3 => $group::<3>(a.0, a.1, a.2, [g[0], g[1], g[2]], r0, n, out, tokens, t),
                        4 => $group::<4>(
                            a.0,
                            a.1,
                            a.2,
                            [g[0], g[1], g[2], g[3]],
                            r0,
                            n,
                            out,
                            tokens,
                            t,
                        ),
                        5 => $group::<5>(
                            a.0,
                            a.1,
                            a.2,
                            [g[0], g[1], g[2], g[3], g[4]],
                            r0,
                            n,
                            out,
                            tokens,
                            t,
                        ),
                        6 => $group::<6>(
                            a.0,
                            a.1,
                            a.2,
                            [g[0], g[1], g[2], g[3], g[4], g[5]],
                            r0,
                            n,
                            out,
                            tokens,
                            t,
                        ),
                        7 => $group::<7>(
                            a.0,
                            a.1,
                            a.2,
                            [g[0], g[1], g[2], g[3], g[4], g[5], g[6]],
                            r0,
                            n,
                            out,
                            tokens,
                            t,
                        ),
                        _ => $group::<8>(
                            a.0,
                            a.1,
                            a.2,
                            [g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]],
                            r0,
                            n,
                            out,
                            tokens,
                            t,
                        ),
                    }
                    r0 += n;
                }
                t += take;
            }
        }
    };
}

kernel!(steps_f32, finish_f32, rows_f32, pair_f32, tokens_f32, group_f32, f32, load_f32, widen_f32);
kernel!(
    steps_bf16,
    finish_bf16,
    rows_bf16,
    pair_bf16,
    tokens_bf16,
    group_bf16,
    u16,
    load_bf16,
    bf16_to_f32
);
kernel!(steps_f16, finish_f16, rows_f16, pair_f16, tokens_f16, group_f16, u16, load_f16, widen_f16);
kernel!(steps_i8, finish_i8, rows_i8, pair_i8, tokens_i8, group_i8, i8, load_i8, widen_i8);

pub fn dot_f32_entry(w: &[f32], x: &[f32]) -> f32 {
    // SAFETY: selected only when `isa()` found AVX-512 F (with AVX2, FMA, F16C).
    unsafe { rows_f32::<1>(w, 1.0, [x])[0] }
}

pub fn dot_bf16_entry(w: &[u16], x: &[f32]) -> f32 {
    // SAFETY: as above.
    unsafe { rows_bf16::<1>(w, 1.0, [x])[0] }
}

pub fn dot_f16_entry(w: &[u16], x: &[f32]) -> f32 {
    // SAFETY: as above.
    unsafe { rows_f16::<1>(w, 1.0, [x])[0] }
}

pub fn dot_int8_entry(w: &[i8], scale: f32, x: &[f32]) -> f32 {
    // SAFETY: as above.
    unsafe { rows_i8::<1>(w, scale, [x])[0] }
}

/// 16 E4M3 bytes at `p` -> 16 f32 at 2^-8 of their value, exact for every code: the bytes
/// sign-extended to 16 bits and shifted are F16s with E4M3's digits (see `fp8::x86`), widened.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn decode_fp8_16(p: *const u8) -> __m512 {
    let v = _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const __m128i));
    let m = _mm256_set1_epi16(0xBF80u16 as i16);
    _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16::<7>(v), m))
}

/// One FP8 row against an activation that carries its block scales and the decode's 2^8
/// already (`fp8::scale_activation`): four chains of 16 lanes over 64 inputs per step (one
/// line, one prefetch), then 16-wide steps into the first, then the scalar tail. Each 16
/// weights cost one widening, one shift, one mask and one F16 conversion, half the AVX2
/// kernel's shuffles per weight.
///
/// # Safety
/// The CPU must have AVX-512 F, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub unsafe fn dot_fp8_scaled(w: &[u8], xs: &[f32]) -> f32 {
    assert_eq!(w.len(), xs.len());
    let n = w.len();
    let (wp, xp) = (w.as_ptr(), xs.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        crate::dot::x86::prefetch(wp.add(i));
        for (k, a) in acc.iter_mut().enumerate() {
            let j = i + 16 * k;
            *a = _mm512_fmadd_ps(decode_fp8_16(wp.add(j)), _mm512_loadu_ps(xp.add(j)), *a);
        }
        i += 64;
    }
    while i + 16 <= n {
        acc[0] = _mm512_fmadd_ps(decode_fp8_16(wp.add(i)), _mm512_loadu_ps(xp.add(i)), acc[0]);
        i += 16;
    }
    let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    let mut tail = 0f32;
    for j in i..n {
        tail += crate::fp8::e4m3_scaled(w[j]) * xs[j];
    }
    hsum512(sum) + tail
}
