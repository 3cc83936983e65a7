//! x86-64 AVX-512 F variants of the dense (F32, BF16, F16) and INT8 row products, chosen by
//! [`crate::isa`] and property-tested against their scalar twins (`dot.rs`, `int8.rs`). Callers
//! reach them only after feature detection.
//!
//! Each is one weight row against N activations (N = 1 is the one-token product): each 32
//! weights are loaded and widened once and multiplied into every token's two accumulators of 16
//! lanes, so every token's sum runs in the same order whatever N is (batch invariance). Up to
//! eight tokens share a pass: 16 accumulators, the two weight vectors and the loads fit the 32
//! registers.

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

macro_rules! rows_n {
    ($name:ident, $elem:ty, $load:ident, $widen:expr) => {
        /// `out[t] = scale * (row . xs[t])`, each token's sum in the one-token order.
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn $name<const N: usize>(w: &[$elem], scale: f32, xs: [&[f32]; N]) -> [f32; N] {
            let n = w.len();
            for x in xs {
                assert_eq!(x.len(), n);
            }
            let mut a0 = [_mm512_setzero_ps(); N];
            let mut a1 = [_mm512_setzero_ps(); N];
            let mut i = 0;
            while i + 32 <= n {
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
    };
}

rows_n!(rows_f32, f32, load_f32, widen_f32);
rows_n!(rows_bf16, u16, load_bf16, bf16_to_f32);
rows_n!(rows_f16, u16, load_f16, widen_f16);
rows_n!(rows_i8, i8, load_i8, widen_i8);

/// `out[r * T + t] = scale(r) * (row r . xs[t])` for the rows of `w` (`in_dim` wide), up to
/// eight tokens per pass over a row, token groups outermost.
macro_rules! tokens {
    ($name:ident, $elem:ty, $kernel:ident) => {
        /// # Safety
        /// The CPU must have AVX-512 F, AVX2, FMA and F16C.
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn $name(
            w: &[$elem],
            scales: Option<&[f32]>,
            in_dim: usize,
            xs: &[&[f32]],
            out: &mut [f32],
        ) {
            let tokens = xs.len();
            let rows = w.len() / in_dim.max(1);
            assert_eq!(out.len(), rows * tokens);
            let mut t = 0;
            while t < tokens {
                let take = (tokens - t).min(8);
                let g = &xs[t..t + take];
                for r in 0..rows {
                    let row = &w[r * in_dim..(r + 1) * in_dim];
                    let s = scales.map_or(1.0, |s| s[r]);
                    let o = &mut out[r * tokens + t..r * tokens + t + take];
                    match take {
                        1 => o.copy_from_slice(&$kernel::<1>(row, s, [g[0]])),
                        2 => o.copy_from_slice(&$kernel::<2>(row, s, [g[0], g[1]])),
                        3 => o.copy_from_slice(&$kernel::<3>(row, s, [g[0], g[1], g[2]])),
                        4 => o.copy_from_slice(&$kernel::<4>(row, s, [g[0], g[1], g[2], g[3]])),
                        5 => o.copy_from_slice(&$kernel::<5>(row, s, [g[0], g[1], g[2], g[3], g[4]])),
                        6 => o.copy_from_slice(&$kernel::<6>(row, s, [g[0], g[1], g[2], g[3], g[4], g[5]])),
                        7 => o.copy_from_slice(&$kernel::<7>(
                            row,
                            s,
                            [g[0], g[1], g[2], g[3], g[4], g[5], g[6]],
                        )),
                        _ => o.copy_from_slice(&$kernel::<8>(
                            row,
                            s,
                            [g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]],
                        )),
                    }
                }
                t += take;
            }
        }
    };
}

tokens!(tokens_f32, f32, rows_f32);
tokens!(tokens_bf16, u16, rows_bf16);
tokens!(tokens_f16, u16, rows_f16);
tokens!(tokens_i8, i8, rows_i8);

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
