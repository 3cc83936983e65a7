//! The K-quant integer products ([`crate::kquant`]) in AVX2 registers, for x86-64 CPUs without
//! AVX-512 VNNI: each 64-weight chunk of the AVX-512 kernel (`kquant_avx512.rs`) as its two
//! 32-weight halves. A half's lanes sum `code x (256 q + r)` over inputs 4L..4L+4 with two
//! `vpmaddwd` (the even and the odd inputs' codes in the high byte of 16-bit lanes, against q)
//! and `vpmaddubsw` widened by a third `vpmaddwd` (the codes as bytes, against r): the same
//! integers as the 512-bit lanes. Each half keeps its own f32 sums, as the low and the high
//! 256 bits do there, and every step is that lane's there, so both kernels give the same bits
//! (tested).

use std::arch::x86_64::*;

use crate::ggml::BlockType;
use crate::kquant::{token_ptrs, Chunk, KAct, SUPER_BYTES};

crate::kquant::rows_loop!("avx2,fma,f16c");

#[inline(always)]
unsafe fn f16_at(b: *const u8) -> f32 {
    let bits = (b as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Eight bytes as f32, unsigned.
#[inline(always)]
unsafe fn u8x8(v: u64) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)))
}

/// Q4_K's and Q5_K's eight 6-bit scales and eight mins (12 bytes at `sc`) as f32, unpacked as
/// the AVX-512 kernel does.
#[inline(always)]
unsafe fn k4_scales(sc: *const u8) -> (__m256, __m256) {
    let (scales, mins) = crate::kquant::k4_scale_bytes(sc);
    (u8x8(scales), u8x8(mins))
}

/// Token sums of 32 codes `v` (bytes in input order) against half `e` of one chunk of each
/// token's activation, each lane's integer sum times its scale (lane k of `f[t]` picked by
/// `idx`) added to `tot[t][e]`.
#[inline(always)]
unsafe fn half_into<const N: usize>(
    v: __m256i,
    chunks: &[*const Chunk; N],
    at: usize,
    e: usize,
    idx: __m256i,
    f: &[__m256; N],
    tot: &mut [[__m256; 2]; N],
) {
    let we = _mm256_slli_epi16::<8>(v);
    let wo = _mm256_and_si256(v, _mm256_set1_epi16(0xFF00u16 as i16));
    let ones = _mm256_set1_epi16(1);
    for t in 0..N {
        let c = &*chunks[t].add(at);
        let qe = _mm256_load_si256(c.qe.as_ptr().add(16 * e) as *const __m256i);
        let qo = _mm256_load_si256(c.qo.as_ptr().add(16 * e) as *const __m256i);
        let r = _mm256_load_si256(c.r.as_ptr().add(32 * e) as *const __m256i);
        let by_r = _mm256_madd_epi16(_mm256_maddubs_epi16(v, r), ones);
        let acc = _mm256_add_epi32(
            _mm256_add_epi32(_mm256_madd_epi16(we, qe), _mm256_madd_epi16(wo, qo)),
            by_r,
        );
        let scale = _mm256_permutevar8x32_ps(f[t], idx);
        tot[t][e] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), scale, tot[t][e]);
    }
}

/// One row of `blocks` super-blocks times N tokens.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_n<const KIND: u8, const N: usize>(row: *const u8, blocks: usize, acts: [&KAct; N]) -> [f32; N] {
    let bytes = SUPER_BYTES[KIND as usize];
    let (chunks, steps, sums) = token_ptrs::<KIND, N>(acts);
    // Per token: sums of the chunks' low halves and high halves; offsets of sub-blocks 0-7
    // and (Q6_K) 8-15.
    let mut tot = [[_mm256_setzero_ps(); 2]; N];
    let mut off = [[_mm256_setzero_ps(); 2]; N];
    // Per token: scale x step of sub-blocks 0-7 and (Q6_K) 8-15.
    let mut f = [[_mm256_setzero_ps(); 2]; N];
    let low4 = _mm256_set1_epi8(0x0F);
    for sb in 0..blocks {
        let b = row.add(sb * bytes);
        let mut at = 0;
        while at < bytes {
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(crate::dot::PREFETCH_AHEAD + at) as *const i8);
            at += 64;
        }
        if KIND < 2 {
            let (d, dmin) = (_mm256_set1_ps(f16_at(b)), _mm256_set1_ps(f16_at(b.add(2))));
            let (sc, m) = k4_scales(b.add(4));
            let (dsc, dm) = (_mm256_mul_ps(d, sc), _mm256_mul_ps(dmin, m));
            for t in 0..N {
                f[t][0] = _mm256_mul_ps(dsc, _mm256_loadu_ps(steps[t].add(8 * sb)));
                off[t][0] = _mm256_fmadd_ps(dm, _mm256_loadu_ps(sums[t].add(8 * sb)), off[t][0]);
            }
            let qs = b.add(if KIND == 0 { 16 } else { 48 });
            let qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
            for c in 0..4 {
                let packed = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
                for e in 0..2 {
                    let mut v =
                        _mm256_and_si256(_mm256_srl_epi16(packed, _mm_cvtsi32_si128(4 * e as i32)), low4);
                    if KIND == 1 {
                        let shift = _mm_cvtsi32_si128((2 * c + e) as i32);
                        let fifth = _mm256_and_si256(_mm256_srl_epi16(qh, shift), _mm256_set1_epi8(1));
                        v = _mm256_or_si256(v, _mm256_slli_epi16::<4>(fifth));
                    }
                    let idx = _mm256_set1_epi32((2 * c + e) as i32);
                    let fs: [__m256; N] = first_of(&f);
                    half_into(v, &chunks, 4 * sb + c, e, idx, &fs, &mut tot);
                }
            }
        } else {
            let d = _mm256_set1_ps(f16_at(b.add(208)));
            let sc = _mm_loadu_si128(b.add(192) as *const __m128i);
            let dsc = [
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))),
                _mm256_mul_ps(
                    d,
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc))),
                ),
            ];
            let pairs = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
            for t in 0..N {
                let st = _mm256_loadu_ps(steps[t].add(8 * sb));
                let st_hi = _mm256_permute2f128_ps::<0x11>(st, st);
                f[t][0] = _mm256_mul_ps(dsc[0], _mm256_permutevar8x32_ps(st, pairs));
                f[t][1] = _mm256_mul_ps(dsc[1], _mm256_permutevar8x32_ps(st_hi, pairs));
                for k in 0..2 {
                    let s = _mm256_loadu_ps(sums[t].add(16 * sb + 8 * k));
                    off[t][k] = _mm256_fmadd_ps(dsc[k], s, off[t][k]);
                }
            }
            for h in 0..2 {
                let qh = _mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i);
                for part in 0..2 {
                    let c = 2 * h + part;
                    let fs: [__m256; N] = half_of(&f, c / 2);
                    for e in 0..2 {
                        let ql = _mm256_loadu_si256(b.add(64 * h + 32 * e) as *const __m256i);
                        let low =
                            _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * part as i32)), low4);
                        let shift = _mm_cvtsi32_si128(2 * (2 * part + e) as i32);
                        let high = _mm256_and_si256(_mm256_srl_epi16(qh, shift), _mm256_set1_epi8(3));
                        let v = _mm256_or_si256(low, _mm256_slli_epi16::<4>(high));
                        // Lanes 0-3: sub-block of 16 number 4c + 2e, lanes 4-7 the next.
                        let k = ((4 * c + 2 * e) % 8) as i32;
                        let idx = _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1);
                        half_into(v, &chunks, 4 * sb + c, e, idx, &fs, &mut tot);
                    }
                }
            }
        }
    }
    // As the AVX-512 kernel: its low and high 256 bits added, then the tree of eight lanes.
    let mut sum = [_mm256_setzero_ps(); N];
    let mut offs = [_mm256_setzero_ps(); N];
    for t in 0..N {
        sum[t] = _mm256_add_ps(tot[t][0], tot[t][1]);
        offs[t] = _mm256_add_ps(off[t][0], off[t][1]);
    }
    let (s, o) = (crate::dot::hsum256_n(&sum), crate::dot::hsum256_n(&offs));
    let mut r = [0f32; N];
    for t in 0..N {
        r[t] = if KIND == 2 {
            s[t] - 32.0 * o[t]
        } else {
            s[t] - o[t]
        };
    }
    r
}

/// Each token's first vector.
#[inline(always)]
fn first_of<const N: usize>(f: &[[__m256; 2]; N]) -> [__m256; N] {
    half_of(f, 0)
}

/// Each token's vector `k`.
#[inline(always)]
fn half_of<const N: usize>(f: &[[__m256; 2]; N], k: usize) -> [__m256; N] {
    let mut v = [f[0][0]; N];
    for t in 0..N {
        v[t] = f[t][k];
    }
    v
}
