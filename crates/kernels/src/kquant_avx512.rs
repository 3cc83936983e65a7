//! The K-quant integer products ([`crate::kquant`]) in AVX-512 (F, BW, VL, VNNI) registers.
//!
//! Per 64 weights: their codes as 64 bytes in input order (Q4_K/Q5_K: one 32-byte load of
//! nibbles put in both halves, the high half shifted by 4; Q6_K: one 64-byte load of low
//! nibbles serves two such chunks), each token's 32-bit lanes then summing
//! `code x (256 q + r)` over inputs 4L..4L+4 with two `vpdpwssd` (the even and the odd inputs'
//! codes in the high byte of 16-bit lanes, against q) and one `vpdpbusd` (the codes as bytes,
//! against r), converted to f32 and multiplied into the token's sum by the lane's sub-block
//! scale times its step. Up to four tokens share one unpacking of the weights; each token's
//! steps are those of a one-token call, so its bits do not depend on the batch.

use std::arch::x86_64::*;

use crate::ggml::BlockType;
use crate::kquant::{token_ptrs, Chunk, KAct, SUPER_BYTES};

crate::kquant::rows_loop!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");

#[inline(always)]
unsafe fn f16_at(b: *const u8) -> f32 {
    let bits = (b as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Q4_K's and Q5_K's eight 6-bit scales and eight mins (12 bytes at `sc`) as f32.
#[inline(always)]
unsafe fn k4_scales(sc: *const u8) -> (__m256, __m256) {
    let (scales, mins) = crate::kquant::k4_scale_bytes(sc);
    (
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(scales as i64))),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mins as i64))),
    )
}

/// 32-bit lanes of `low` in the low half, of `high` in the high half.
#[inline(always)]
unsafe fn halves_epi16(low: i16, high: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(low)),
        _mm256_set1_epi16(high),
    )
}

/// Prefetches the lines of the block `ahead` bytes past `b`.
#[inline(always)]
unsafe fn prefetch_block(b: *const u8, bytes: usize) {
    let mut at = 0;
    while at < bytes {
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(crate::dot::PREFETCH_AHEAD + at) as *const i8);
        at += 64;
    }
}

/// Token sums of 64 codes `v` (bytes in input order) against one chunk of each token's
/// activation, each lane's integer sum times `scale[t]` added to `tot[t]`.
#[inline(always)]
unsafe fn chunk_into<const N: usize>(
    v: __m512i,
    chunks: &[*const Chunk; N],
    at: usize,
    idx: __m512i,
    f: &[__m512; N],
    tot: &mut [__m512; N],
) {
    let we = _mm512_slli_epi16::<8>(v);
    let wo = _mm512_and_si512(v, _mm512_set1_epi16(0xFF00u16 as i16));
    for t in 0..N {
        let c = &*chunks[t].add(at);
        let qe = _mm512_load_si512(c.qe.as_ptr() as *const _);
        let qo = _mm512_load_si512(c.qo.as_ptr() as *const _);
        let r = _mm512_load_si512(c.r.as_ptr() as *const _);
        let mut acc = _mm512_madd_epi16(we, qe);
        acc = _mm512_dpwssd_epi32(acc, wo, qo);
        acc = _mm512_dpbusd_epi32(acc, v, r);
        let scale = _mm512_permutexvar_ps(idx, f[t]);
        tot[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), scale, tot[t]);
    }
}

/// One row of `blocks` super-blocks times N tokens.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn row_n<const KIND: u8, const N: usize>(row: *const u8, blocks: usize, acts: [&KAct; N]) -> [f32; N] {
    let bytes = SUPER_BYTES[KIND as usize];
    let (chunks, steps, sums) = token_ptrs::<KIND, N>(acts);
    let mut tot = [_mm512_setzero_ps(); N];
    let mut off = [_mm512_setzero_ps(); N];
    let mut f = [_mm512_setzero_ps(); N];
    let low4 = _mm512_set1_epi8(0x0F);
    for sb in 0..blocks {
        let b = row.add(sb * bytes);
        prefetch_block(b, bytes);
        if KIND < 2 {
            let (d, dmin) = (_mm256_set1_ps(f16_at(b)), _mm256_set1_ps(f16_at(b.add(2))));
            let (sc, m) = k4_scales(b.add(4));
            let (dsc, dm) = (_mm256_mul_ps(d, sc), _mm256_mul_ps(dmin, m));
            for t in 0..N {
                let st = _mm256_loadu_ps(steps[t].add(8 * sb));
                f[t] = _mm512_zextps256_ps512(_mm256_mul_ps(dsc, st));
                let s = _mm512_zextps256_ps512(_mm256_loadu_ps(sums[t].add(8 * sb)));
                off[t] = _mm512_fmadd_ps(_mm512_zextps256_ps512(dm), s, off[t]);
            }
            let nibble_shift = halves_epi16(0, 4);
            let qs = b.add(if KIND == 0 { 16 } else { 48 });
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(16) as *const __m256i));
            for c in 0..4 {
                let packed = _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.add(32 * c) as *const __m256i));
                let mut v = _mm512_and_si512(_mm512_srlv_epi16(packed, nibble_shift), low4);
                if KIND == 1 {
                    let shift = halves_epi16(2 * c as i16, 2 * c as i16 + 1);
                    let fifth = _mm512_and_si512(_mm512_srlv_epi16(qh, shift), _mm512_set1_epi8(1));
                    v = _mm512_or_si512(v, _mm512_slli_epi16::<4>(fifth));
                }
                // Lanes 0-7: sub-block 2c, lanes 8-15: 2c + 1.
                let idx = _mm512_add_epi32(_mm512_set1_epi32(2 * c as i32), lane_blocks::<8>());
                chunk_into(v, &chunks, 4 * sb + c, idx, &f, &mut tot);
            }
        } else {
            let d = _mm512_set1_ps(f16_at(b.add(208)));
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128(b.add(192) as *const __m128i),
            ));
            let dsc = _mm512_mul_ps(d, sc);
            let pairs = lane_blocks::<2>(); // lane k: step k / 2
            for t in 0..N {
                let st = _mm512_zextps256_ps512(_mm256_loadu_ps(steps[t].add(8 * sb)));
                f[t] = _mm512_mul_ps(dsc, _mm512_permutexvar_ps(pairs, st));
                off[t] = _mm512_fmadd_ps(dsc, _mm512_loadu_ps(sums[t].add(16 * sb)), off[t]);
            }
            for h in 0..2 {
                let ql = _mm512_loadu_si512(b.add(64 * h) as *const _);
                let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i));
                for part in 0..2 {
                    let low = if part == 0 { ql } else { _mm512_srli_epi16::<4>(ql) };
                    let shift = halves_epi16(4 * part as i16, 4 * part as i16 + 2);
                    let high = _mm512_and_si512(_mm512_srlv_epi16(qh, shift), _mm512_set1_epi8(3));
                    let v = _mm512_or_si512(_mm512_and_si512(low, low4), _mm512_slli_epi16::<4>(high));
                    // Lane L: sub-block of 16 number 4c + L / 4.
                    let c = 2 * h + part;
                    let idx = _mm512_add_epi32(_mm512_set1_epi32(4 * c as i32), lane_blocks::<4>());
                    chunk_into(v, &chunks, 4 * sb + c, idx, &f, &mut tot);
                }
            }
        }
    }
    let mut sum = [_mm256_setzero_ps(); N];
    let mut offs = [_mm256_setzero_ps(); N];
    for t in 0..N {
        sum[t] = fold(tot[t]);
        offs[t] = fold(off[t]);
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

/// Lane L holds L / K.
#[inline(always)]
unsafe fn lane_blocks<const K: i32>() -> __m512i {
    _mm512_set_epi32(
        15 / K,
        14 / K,
        13 / K,
        12 / K,
        11 / K,
        10 / K,
        9 / K,
        8 / K,
        7 / K,
        6 / K,
        5 / K,
        4 / K,
        3 / K,
        2 / K,
        1 / K,
        0,
    )
}

/// The low and high 256 bits added.
#[inline(always)]
unsafe fn fold(v: __m512) -> __m256 {
    _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castsi256_ps(_mm512_extracti64x4_epi64::<1>(_mm512_castps_si512(v))),
    )
}
