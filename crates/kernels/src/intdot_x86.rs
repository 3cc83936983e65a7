//! The 4-bit integer dot on x86-64. AVX2: per block of 64 inputs, one 32-byte load of weights
//! and two nibble masks (then the format's table, if any); four `vpmaddwd` of q against the
//! weights moved into the high byte of each 16-bit lane, two `vpmaddubsw` of r against the
//! weight bytes, one to widen them; then one conversion and two FMAs (step + offset, the
//! weights' scales). Two blocks per step, the even one into a first accumulator per token, the
//! odd one into a second.
//!
//! With AVX-512 VNNI the same integer sums take `vpdpwssd`/`vpdpbusd` ([`Step::Vnni`]), and
//! with AVX-512 BW too ([`Step::Wide`], `intdot_avx512.rs`) the two blocks of a step share
//! 512-bit registers.
//! Every step gives the same bits (tested), so a machine's output never depends on which.
use std::arch::x86_64::*;

use super::{ActBlock, IntAct, BLOCK};

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum_epi32(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b01_00_11_10));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
}

/// Transposes the 4x4 blocks of 32-bit lanes in each 128-bit half of rows a, b, c, d.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose4(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> [__m256i; 4] {
    let (t0, t1) = (_mm256_unpacklo_epi32(a, b), _mm256_unpacklo_epi32(c, d));
    let (t2, t3) = (_mm256_unpackhi_epi32(a, b), _mm256_unpackhi_epi32(c, d));
    [
        _mm256_unpacklo_epi64(t0, t1),
        _mm256_unpackhi_epi64(t0, t1),
        _mm256_unpacklo_epi64(t2, t3),
        _mm256_unpackhi_epi64(t2, t3),
    ]
}

/// 64 i32 values of a block, in eight rows laid out as `prepare_avx2` loads them, as four
/// vectors of 16 i16 in [`super::q_slot`] order: the transposes bring inputs 4j + k of
/// rows 0-3 and of rows 4-7 together, and the saturating packs join the two in order.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn by_nibble(v: &[__m256i; 8]) -> [__m256i; 4] {
    let a = transpose4(v[0], v[1], v[2], v[3]);
    let b = transpose4(v[4], v[5], v[6], v[7]);
    [
        _mm256_packs_epi32(a[0], b[0]),
        _mm256_packs_epi32(a[1], b[1]),
        _mm256_packs_epi32(a[2], b[2]),
        _mm256_packs_epi32(a[3], b[3]),
    ]
}

/// Prepares a block per step: eight rows of 8 inputs, each row four inputs of the first
/// half (128-bit lane 0) and the four 32 further on (lane 1), so that every lane holds one
/// half and the rows transpose into [`super::q_slot`] order; vector max, multiply, round
/// and fused multiply-add as `super::split` does per input.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn prepare_avx2(x: &[f32], offset: i32, factor: f32) -> IntAct {
    let mut a = IntAct {
        blocks: vec![super::EMPTY; x.len() / BLOCK],
        pairs: Vec::new(),
        dots: Vec::new(),
    };
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for (b, out) in a.blocks.iter_mut().enumerate() {
        let p = x.as_ptr().add(b * BLOCK);
        // Row m: inputs 4m..4m + 4 in lane 0, 32 + 4m.. in lane 1.
        let mut v = [_mm256_setzero_ps(); 8];
        for (m, row) in v.iter_mut().enumerate() {
            *row = _mm256_loadu2_m128(p.add(4 * m + 32), p.add(4 * m));
        }
        let (mut m, mut bad) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for row in &v {
            m = _mm256_max_ps(m, _mm256_and_ps(*row, abs));
            // Not finite: x - x is NaN only for infinities and NaNs.
            bad = _mm256_or_ps(bad, _mm256_sub_ps(*row, *row));
        }
        let m = _mm256_max_ps(m, _mm256_permute_ps::<0b01_00_11_10>(m));
        let m = _mm256_max_ps(m, _mm256_permute_ps::<0b10_11_00_01>(m));
        let unfinite = _mm256_movemask_ps(_mm256_cmp_ps(bad, bad, _CMP_UNORD_Q));
        let (step0, inv0) = super::half_step(_mm256_cvtss_f32(m), unfinite & 0x0f == 0);
        let (step1, inv1) =
            super::half_step(_mm_cvtss_f32(_mm256_extractf128_ps(m, 1)), unfinite & 0xf0 == 0);
        let stepv = _mm256_set_m128(_mm_set1_ps(step1), _mm_set1_ps(step0));
        let invv = _mm256_set_m128(_mm_set1_ps(inv1), _mm_set1_ps(inv0));
        let inv256 = _mm256_set_m128(_mm_set1_ps(inv1 * 256.0), _mm_set1_ps(inv0 * 256.0));
        let (hi, lo) = (_mm256_set1_ps(127.5), _mm256_set1_ps(-128.5));
        let (one, wrap) = (_mm256_set1_ps(1.0), _mm256_set1_ps(256.0));
        let (mut q, mut r) = ([_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8]);
        let (mut sum_q, mut sum_r) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for k in 0..8 {
            const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            let mut qf = _mm256_round_ps::<NEAREST>(_mm256_mul_ps(v[k], invv));
            let rest = _mm256_fnmadd_ps(qf, stepv, v[k]);
            let mut rf = _mm256_round_ps::<NEAREST>(_mm256_mul_ps(rest, inv256));
            // As in `split`: r past +-128 moves q by one.
            let up = _mm256_cmp_ps::<_CMP_GT_OQ>(rf, hi);
            let down = _mm256_cmp_ps::<_CMP_LT_OQ>(rf, lo);
            qf = _mm256_sub_ps(
                _mm256_add_ps(qf, _mm256_and_ps(up, one)),
                _mm256_and_ps(down, one),
            );
            rf = _mm256_add_ps(
                _mm256_sub_ps(rf, _mm256_and_ps(up, wrap)),
                _mm256_and_ps(down, wrap),
            );
            q[k] = _mm256_cvtps_epi32(qf);
            r[k] = _mm256_cvtps_epi32(rf);
            sum_q = _mm256_add_epi32(sum_q, q[k]);
            sum_r = _mm256_add_epi32(sum_r, r[k]);
        }
        let (sq0, sr0) = (_mm256_castsi256_si128(sum_q), _mm256_castsi256_si128(sum_r));
        let (sq1, sr1) = (
            _mm256_extracti128_si256(sum_q, 1),
            _mm256_extracti128_si256(sum_r, 1),
        );
        super::set_half(out, 0, step0, hsum_epi32(sq0), hsum_epi32(sr0), offset, factor);
        super::set_half(out, 1, step1, hsum_epi32(sq1), hsum_epi32(sr1), offset, factor);
        let qs = by_nibble(&q);
        for (k, v) in qs.iter().enumerate() {
            _mm256_store_si256(out.q.as_mut_ptr().add(16 * k) as *mut __m256i, *v);
        }
        // r: byte 2j of the even vector is input 4j (k = 0), byte 2j + 1 input 4j + 2.
        let rs = by_nibble(&r);
        let low = _mm256_set1_epi16(0x00ff);
        let rp = out.r.as_mut_ptr() as *mut __m256i;
        let even = _mm256_or_si256(_mm256_and_si256(rs[0], low), _mm256_slli_epi16(rs[2], 8));
        let odd = _mm256_or_si256(_mm256_and_si256(rs[1], low), _mm256_slli_epi16(rs[3], 8));
        _mm256_store_si256(rp, even);
        _mm256_store_si256(rp.add(1), odd);
    }
    a
}

pub use super::Scales;

/// The sum over the whole blocks of `a`. `packed` holds at least 32 bytes per block (low
/// nibble = even input); `lut` maps a nibble to its unsigned byte (none: the nibble itself).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_avx2(packed: &[u8], scales: Scales, lut: Option<&[u8; 16]>, a: &IntAct) -> f32 {
    let mut out = [0f32];
    let per_row = match scales {
        Scales::Bf16Group32(s) | Scales::Bf16Wide(s, _) => s.len(),
        Scales::E8m0(s) => s.len(),
    };
    dot_rows_with(
        Step::best(),
        packed,
        a.blocks.len() * 32,
        scales,
        per_row,
        lut,
        &[a],
        &mut out,
    );
    out[0]
}

/// A run of rows times one or more tokens (`rows_of` and its VNNI and 512-bit forms).
type RowsOf = unsafe fn(*const u8, usize, *const u8, usize, u32, &[u8; 16], &[&IntAct], &mut [f32]);

/// Which form of the kernel a product takes: the same bits from each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512 VNNI (256-bit forms).
    Vnni,
    /// AVX-512 BW and VNNI, two blocks per 512-bit step.
    Wide,
}

impl Step {
    /// The widest form the kernels in use allow on this CPU.
    pub fn best() -> Step {
        if crate::isa::has_avx512_vnni_bw() {
            Step::Wide
        } else if crate::isa::has_avx512_vnni() {
            Step::Vnni
        } else {
            Step::Avx2
        }
    }
}

/// [`dot_avx2`] for a run of rows and one or more tokens, in the form `step` (the same bits in
/// each; [`Step::best`] is the CPU's): row i's packed bytes start at `i * row_bytes` and its
/// scales `i * scales_per_row` scales into `scales`; `out[i * T + t]` (T = `acts.len()`, all of
/// the same length) is row i times token t. Each weight block is unpacked once for up to four
/// tokens, and each token's sum takes exactly the steps of a one-token call (batch invariance).
/// One call for a run of rows keeps the per-row work (checks, dispatch) out of the loop.
///
/// # Safety
/// The CPU must have AVX2 and FMA; for [`Step::Vnni`] AVX-512 F, VL and VNNI; for
/// [`Step::Wide`] BW as well.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_rows_with(
    step: Step,
    packed: &[u8],
    row_bytes: usize,
    scales: Scales,
    scales_per_row: usize,
    lut: Option<&[u8; 16]>,
    acts: &[&IntAct],
    out: &mut [f32],
) {
    let (blocks, rows) = super::check_rows(packed, row_bytes, acts, out);
    let (kind, shift, sp, scale_row) = scales.raw(blocks, rows, scales_per_row);
    let p = packed.as_ptr();
    // One instance per format table (LUT) and scale kind.
    macro_rules! pick {
        ($f:ident) => {
            match (lut.is_some(), kind) {
                (false, 0) => $f::<false, 0> as RowsOf,
                (false, 1) => $f::<false, 1> as RowsOf,
                (false, _) => $f::<false, 2> as RowsOf,
                (true, 0) => $f::<true, 0> as RowsOf,
                (true, 1) => $f::<true, 1> as RowsOf,
                (true, _) => $f::<true, 2> as RowsOf,
            }
        };
    }
    let rows_of = match step {
        Step::Avx2 => pick!(rows_of),
        Step::Vnni => pick!(rows_of_vnni),
        Step::Wide => pick!(rows_of_wide),
    };
    rows_of(
        p,
        row_bytes,
        sp,
        scale_row,
        shift,
        lut.unwrap_or(&[0; 16]),
        acts,
        out,
    );
}

/// The rows-by-tokens loop over [`run`] (`rows_of`) and over [`run_vnni`] (`rows_of_vnni`).
macro_rules! rows_of {
    ($name:ident, $features:literal, $run:ident) => {
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        unsafe fn $name<const LUT: bool, const SCALE: u8>(
            packed: *const u8,
            row_bytes: usize,
            scales: *const u8,
            scale_row: usize,
            shift: u32,
            lut: &[u8; 16],
            acts: &[&IntAct],
            out: &mut [f32],
        ) {
            let tokens = acts.len();
            for (i, row_out) in out.chunks_exact_mut(tokens).enumerate() {
                let (p, s) = (packed.add(i * row_bytes), scales.add(i * scale_row));
                // The row's bytes stay in cache from one group of tokens to the next.
                let mut t = 0;
                while t < tokens {
                    let group = &acts[t..(t + 4).min(tokens)];
                    let o = &mut row_out[t..t + group.len()];
                    match group.len() {
                        1 => o.copy_from_slice(&$run::<LUT, SCALE, 1>(p, s, shift, lut, [group[0]])),
                        2 => o.copy_from_slice(&$run::<LUT, SCALE, 2>(
                            p,
                            s,
                            shift,
                            lut,
                            group.try_into().unwrap(),
                        )),
                        3 => o.copy_from_slice(&$run::<LUT, SCALE, 3>(
                            p,
                            s,
                            shift,
                            lut,
                            group.try_into().unwrap(),
                        )),
                        _ => o.copy_from_slice(&$run::<LUT, SCALE, 4>(
                            p,
                            s,
                            shift,
                            lut,
                            group.try_into().unwrap(),
                        )),
                    }
                    t += group.len();
                }
            }
        }
    };
}

rows_of!(rows_of, "avx2,fma", run);
rows_of!(rows_of_vnni, "avx2,fma,avx512f,avx512vl,avx512vnni", run_vnni);
rows_of!(
    rows_of_wide,
    "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni",
    run_wide
);

#[path = "intdot_avx512.rs"]
mod wide;
use wide::run_wide;

/// Scales of block b as 8 lanes: the first half's in lanes 0-3, the second's in 4-7.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_scales<const SCALE: u8>(scales: *const u8, shift: u32, b: usize) -> __m256 {
    match SCALE {
        0 => {
            // Two BF16 side by side: a | b << 16 in every lane; a << 16 for the first four.
            let v = _mm256_set1_epi32((scales.add(4 * b) as *const i32).read_unaligned());
            let v = _mm256_sllv_epi32(v, _mm256_setr_epi32(16, 16, 16, 16, 0, 0, 0, 0));
            _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xffff_0000u32 as i32)))
        }
        1 => {
            let g = (b * BLOCK) >> shift;
            let v = _mm256_set1_epi16((scales.add(2 * g) as *const i16).read_unaligned());
            _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xffff_0000u32 as i32)))
        }
        _ => {
            // Two E8M0 bytes: 2^(e - 127) is e << 23, except e = 0 (2^-127, a subnormal).
            let v = _mm256_set1_epi16((scales.add(2 * b) as *const i16).read_unaligned());
            let v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8));
            let v = _mm256_and_si256(_mm256_slli_epi32(v, 23), _mm256_set1_epi32(0x7f80_0000));
            _mm256_castsi256_ps(_mm256_max_epu32(v, _mm256_set1_epi32(0x0040_0000)))
        }
    }
}

/// Byte-shuffle pattern that puts byte `i` of a 128-bit lane into dword lanes 0-3 and byte
/// `j` into lanes 4-7, at byte `at` of each dword (the other bytes zero).
const fn spread(i: i8, j: i8, at: usize, width: usize) -> [i8; 32] {
    let mut m = [-1i8; 32];
    let mut d = 0;
    while d < 8 {
        let src = if d < 4 { i } else { j };
        let mut k = 0;
        while k < width {
            m[4 * d + at + k] = src + k as i8;
            k += 1;
        }
        d += 1;
    }
    m
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn shuffle(v: __m256i, pattern: &[i8; 32]) -> __m256i {
    _mm256_shuffle_epi8(v, _mm256_loadu_si256(pattern.as_ptr() as *const __m256i))
}

/// Scales of blocks b and b + 1 as [`block_scales`] gives them, from one load and one byte
/// shuffle per block.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn pair_scales<const SCALE: u8>(scales: *const u8, shift: u32, b: usize) -> (__m256, __m256) {
    match SCALE {
        0 => {
            // Four BF16; each goes to the high 16 bits of its four lanes.
            const S0: [i8; 32] = spread(0, 2, 2, 2);
            const S1: [i8; 32] = spread(4, 6, 2, 2);
            let v = _mm256_set1_epi64x((scales.add(4 * b) as *const i64).read_unaligned());
            (
                _mm256_castsi256_ps(shuffle(v, &S0)),
                _mm256_castsi256_ps(shuffle(v, &S1)),
            )
        }
        1 => (
            block_scales::<1>(scales, shift, b),
            block_scales::<1>(scales, shift, b + 1),
        ),
        _ => {
            // Four E8M0 bytes: e into the top byte (e << 24), then e << 23 = 2^(e - 127),
            // except e = 0 (2^-127, a subnormal).
            const S0: [i8; 32] = spread(0, 1, 3, 1);
            const S1: [i8; 32] = spread(2, 3, 3, 1);
            let v = _mm256_set1_epi32((scales.add(2 * b) as *const i32).read_unaligned());
            let fix = |s: __m256i| {
                _mm256_castsi256_ps(_mm256_max_epu32(
                    _mm256_srli_epi32(s, 1),
                    _mm256_set1_epi32(0x0040_0000),
                ))
            };
            (fix(shuffle(v, &S0)), fix(shuffle(v, &S1)))
        }
    }
}

/// A block's 64 weights as the products need them: `even` and `odd` (each weight's
/// unsigned byte; 16-bit lane j holds inputs 4j (low byte of `even`), 4j + 1 (of `odd`),
/// 4j + 2 and 4j + 3 (their high bytes)), and the four vectors with one weight per 16-bit
/// lane moved into the high byte, so that each weight times q counts 1/256 steps.
struct Weights {
    even: __m256i,
    odd: __m256i,
    high: [__m256i; 4],
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn unpack<const LUT: bool>(packed: *const u8, lut: __m256i) -> Weights {
    let low = _mm256_set1_epi8(0x0f);
    let v = _mm256_loadu_si256(packed as *const __m256i);
    let mut even = _mm256_and_si256(v, low);
    let mut odd = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    if LUT {
        even = _mm256_shuffle_epi8(lut, even);
        odd = _mm256_shuffle_epi8(lut, odd);
    }
    let high = _mm256_set1_epi16(0xff00u16 as i16);
    Weights {
        even,
        odd,
        high: [
            _mm256_slli_epi16(even, 8),
            _mm256_slli_epi16(odd, 8),
            _mm256_and_si256(even, high),
            _mm256_and_si256(odd, high),
        ],
    }
}

/// A block's 8 lanes before the weights' scales: step x (integer sums) + offset.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_sum(w: &Weights, blk: &ActBlock) -> __m256 {
    // Per 32-bit lane: 8 products of at most 24 x 256 x 32513, plus the rests' 8 of
    // 24 x 128, < 2^31.
    let q = blk.q.as_ptr() as *const __m256i;
    let p0 = _mm256_madd_epi16(w.high[0], _mm256_load_si256(q));
    let p1 = _mm256_madd_epi16(w.high[1], _mm256_load_si256(q.add(1)));
    let p2 = _mm256_madd_epi16(w.high[2], _mm256_load_si256(q.add(2)));
    let p3 = _mm256_madd_epi16(w.high[3], _mm256_load_si256(q.add(3)));
    let r = blk.r.as_ptr() as *const __m256i;
    let rest = _mm256_add_epi16(
        _mm256_maddubs_epi16(w.even, _mm256_load_si256(r)),
        _mm256_maddubs_epi16(w.odd, _mm256_load_si256(r.add(1))),
    );
    let units = _mm256_add_epi32(
        _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)),
        _mm256_madd_epi16(rest, _mm256_set1_epi16(1)),
    );
    _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(units),
        _mm256_load_ps(blk.step.as_ptr()),
        _mm256_load_ps(blk.offset.as_ptr()),
    )
}

/// [`block_sum`] with AVX-512 VNNI (256-bit forms): `vpdpwssd` multiplies and adds the q
/// products into the lanes in one step each, `vpdpbusd` the rests' bytes four to a lane.
/// The same integer sums (no term comes near overflow), so the same bits as `block_sum`.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
unsafe fn block_sum_vnni(w: &Weights, blk: &ActBlock) -> __m256 {
    let q = blk.q.as_ptr() as *const __m256i;
    let mut units = _mm256_setzero_si256();
    for k in 0..4 {
        units = _mm256_dpwssd_epi32(units, w.high[k], _mm256_load_si256(q.add(k)));
    }
    let r = blk.r.as_ptr() as *const __m256i;
    units = _mm256_dpbusd_epi32(units, w.even, _mm256_load_si256(r));
    units = _mm256_dpbusd_epi32(units, w.odd, _mm256_load_si256(r.add(1)));
    _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(units),
        _mm256_load_ps(blk.step.as_ptr()),
        _mm256_load_ps(blk.offset.as_ptr()),
    )
}

/// One row times N tokens: per token the same steps, in the same order, as for one.
macro_rules! run {
    ($name:ident, $features:literal, $block_sum:ident) => {
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name<const LUT: bool, const SCALE: u8, const N: usize>(
            packed: *const u8,
            scales: *const u8,
            shift: u32,
            lut: &[u8; 16],
            acts: [&IntAct; N],
        ) -> [f32; N] {
            let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(lut.as_ptr() as *const __m128i));
            // The scales are a second stream beside the weights: prefetched as many blocks ahead.
            let scale_bytes = if SCALE == 0 { 4 } else { 2 };
            let scales_ahead = scale_bytes * crate::dot::PREFETCH_AHEAD / 32;
            let blocks = acts[0].blocks.len();
            let act: [*const ActBlock; N] = std::array::from_fn(|k| acts[k].blocks.as_ptr());
            // Two blocks per step into two accumulators per token: the FMA chains never wait on
            // each other.
            let (mut t0, mut t1) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
            let mut b = 0;
            while b + 2 <= blocks {
                crate::dot::x86::prefetch(packed.wrapping_add(32 * b));
                if (scale_bytes * b).is_multiple_of(64) {
                    _mm_prefetch::<_MM_HINT_T0>(
                        scales.wrapping_add(scale_bytes * b + scales_ahead) as *const i8
                    );
                }
                let (c0, c1) = pair_scales::<SCALE>(scales, shift, b);
                let w0 = unpack::<LUT>(packed.add(32 * b), lut);
                for k in 0..N {
                    t0[k] = _mm256_fmadd_ps($block_sum(&w0, &*act[k].add(b)), c0, t0[k]);
                }
                let w1 = unpack::<LUT>(packed.add(32 * (b + 1)), lut);
                for k in 0..N {
                    t1[k] = _mm256_fmadd_ps($block_sum(&w1, &*act[k].add(b + 1)), c1, t1[k]);
                }
                b += 2;
            }
            if b < blocks {
                let w = unpack::<LUT>(packed.add(32 * b), lut);
                let c = block_scales::<SCALE>(scales, shift, b);
                for k in 0..N {
                    t0[k] = _mm256_fmadd_ps($block_sum(&w, &*act[k].add(b)), c, t0[k]);
                }
            }
            crate::dot::hsum256_n(&std::array::from_fn(|k| _mm256_add_ps(t0[k], t1[k])))
        }
    };
}

run!(run, "avx2,fma", block_sum);
run!(run_vnni, "avx2,fma,avx512f,avx512vl,avx512vnni", block_sum_vnni);
