//! The 4-bit integer dot ([`super`]) two blocks at a time in 512-bit AVX-512 (F, BW, VL, VNNI)
//! registers: block b in the low 256 bits, b + 1 in the high. The weights of both come with one
//! 64-byte load, and the activation from its paired copy ([`ActPair`]: each vector of both
//! blocks in one aligned load), so a step needs no shuffle to join halves. Each 32-bit lane does
//! exactly what the same lane does in the 256-bit kernel (`run_vnni`): the low half is its
//! accumulator of even blocks, the high half that of odd blocks, each in order, and an odd last
//! block goes to the low half in 256 bits as there; then the two halves' sum. So the bits are
//! the same (tested against the AVX2 step). An activation without its paired copy takes the
//! 256-bit kernel.

use std::arch::x86_64::*;

use super::{block_scales, block_sum_vnni, pair_scales, run_vnni, unpack};
use crate::intdot::{ActBlock, ActPair, IntAct};

/// Two 256-bit halves as one 512-bit vector (low, high).
#[inline]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn join_ps(lo: __m256, hi: __m256) -> __m512 {
    let v = _mm512_castsi256_si512(_mm256_castps_si256(lo));
    _mm512_castsi512_ps(_mm512_inserti64x4::<1>(v, _mm256_castps_si256(hi)))
}

/// Two blocks' weights as `unpack` gives one block's (block b low, b + 1 high).
struct Weights2 {
    even: __m512i,
    odd: __m512i,
    high: [__m512i; 4],
}

#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn unpack2<const LUT: bool>(packed: *const u8, lut: __m512i) -> Weights2 {
    let v = _mm512_loadu_si512(packed as *const _);
    let low = _mm512_set1_epi8(0x0f);
    let mut even = _mm512_and_si512(v, low);
    let mut odd = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
    if LUT {
        even = _mm512_shuffle_epi8(lut, even);
        odd = _mm512_shuffle_epi8(lut, odd);
    }
    let high = _mm512_set1_epi16(0xff00u16 as i16);
    Weights2 {
        even,
        odd,
        high: [
            _mm512_slli_epi16::<8>(even),
            _mm512_slli_epi16::<8>(odd),
            _mm512_and_si512(even, high),
            _mm512_and_si512(odd, high),
        ],
    }
}

/// `block_sum_vnni` of a pair of blocks in one step.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
unsafe fn pair_sum(w: &Weights2, p: &ActPair) -> __m512 {
    let load = |v: *const u8| _mm512_load_si512(v as *const _);
    let mut units = _mm512_setzero_si512();
    for k in 0..4 {
        units = _mm512_dpwssd_epi32(units, w.high[k], load(p.q[k].as_ptr() as *const u8));
    }
    units = _mm512_dpbusd_epi32(units, w.even, load(p.r[0].as_ptr() as *const u8));
    units = _mm512_dpbusd_epi32(units, w.odd, load(p.r[1].as_ptr() as *const u8));
    _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(units),
        _mm512_load_ps(p.step.as_ptr()),
        _mm512_load_ps(p.offset.as_ptr()),
    )
}

/// One row times N tokens, as `run_vnni` (same bits), two blocks per step.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn run_wide<const LUT: bool, const SCALE: u8, const N: usize>(
    packed: *const u8,
    scales: *const u8,
    shift: u32,
    lut: &[u8; 16],
    acts: [&IntAct; N],
) -> [f32; N] {
    let blocks = acts[0].blocks.len();
    if acts.iter().any(|a| a.pairs.len() != blocks / 2) {
        return run_vnni::<LUT, SCALE, N>(packed, scales, shift, lut, acts);
    }
    let lut = _mm_loadu_si128(lut.as_ptr() as *const __m128i);
    let (lut1, lut2) = (_mm256_broadcastsi128_si256(lut), _mm512_broadcast_i32x4(lut));
    // The scales are a second stream beside the weights: prefetched as many blocks ahead.
    let scale_bytes = if SCALE == 0 { 4 } else { 2 };
    let scales_ahead = scale_bytes * crate::dot::PREFETCH_AHEAD / 32;
    let pairs: [*const ActPair; N] = std::array::from_fn(|k| acts[k].pairs.as_ptr());
    let mut t = [_mm512_setzero_ps(); N];
    let mut b = 0;
    while b + 2 <= blocks {
        crate::dot::x86::prefetch(packed.wrapping_add(32 * b));
        if (scale_bytes * b).is_multiple_of(64) {
            _mm_prefetch::<_MM_HINT_T0>(scales.wrapping_add(scale_bytes * b + scales_ahead) as *const i8);
        }
        let (c0, c1) = pair_scales::<SCALE>(scales, shift, b);
        let c = join_ps(c0, c1);
        let w = unpack2::<LUT>(packed.add(32 * b), lut2);
        for k in 0..N {
            t[k] = _mm512_fmadd_ps(pair_sum(&w, &*pairs[k].add(b / 2)), c, t[k]);
        }
        b += 2;
    }
    let mut even: [__m256; N] = std::array::from_fn(|k| _mm512_castps512_ps256(t[k]));
    let odd: [__m256; N] = std::array::from_fn(|k| {
        _mm256_castsi256_ps(_mm512_extracti64x4_epi64::<1>(_mm512_castps_si512(t[k])))
    });
    if b < blocks {
        let w = unpack::<LUT>(packed.add(32 * b), lut1);
        let c = block_scales::<SCALE>(scales, shift, b);
        for k in 0..N {
            let blk: &ActBlock = &acts[k].blocks[b];
            even[k] = _mm256_fmadd_ps(block_sum_vnni(&w, blk), c, even[k]);
        }
    }
    crate::dot::hsum256_n(&std::array::from_fn(|k| _mm256_add_ps(even[k], odd[k])))
}
