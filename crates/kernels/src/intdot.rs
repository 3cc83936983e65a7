//! Integer-domain dot products for the 4-bit formats (INT4 pack-quantized, MXFP4).
//!
//! Their weights are small integers once mapped to unsigned bytes (INT4: the stored nibble q + 8;
//! MXFP4: twice the E2M1 value plus 12), so instead of converting every weight to f32 the
//! activation is put once per token into integers and the products are summed exactly with
//! `vpmaddubsw`, 32 at a time. Per 32 inputs with step s = max|x| / 32512, each input becomes
//! s * (q + r / 256): q = round(x / s) in 16 bits and r the rounded rest in 8 more, i.e. 24
//! significant bits, as many as an f32 has, held as three signed bytes (q = 256 qh + ql, and r):
//! the signed operands of `vpmaddubsw`. The weights' constant offset is taken out once per 32
//! inputs from the sum of the activation.
//!
//! Accuracy: the weights are exact; each input moves by at most 1/512 of its step (6e-8 of the
//! largest |x| among its 32), the size of f32 rounding. A 16-bit activation alone
//! (2e-5) measured too coarse: Kimi K3's routing weights, amplified by AttnRes, left their 1e-4
//! tolerance. The scalar twins compute the same integers; [`crate::int4::dot_int4_reference`]
//! and [`crate::mxfp4::dot_mxfp4_reference`] stay the f32 truth the property tests compare to.

/// Largest |q| before rounding (q may still move by one, see `split`): keeps qh within i8.
pub const QMAX: f32 = 32512.0;

/// Inputs per block: 32 packed bytes of weights, two 32-input halves.
pub const BLOCK: usize = 64;

/// An activation prepared for [`x86::dot_avx2`], whole blocks of 64 inputs only.
pub struct IntAct {
    /// Per block, 192 bytes, 32 each: qh of the even inputs, qh of the odd ones, then ql and r
    /// likewise (byte k is input 2k or 2k + 1, the order of the nibbles in the weights' bytes).
    pub digits: Vec<i8>,
    /// Per block, 8 lanes: the step of the first half (lanes 0-3) and of the second (4-7), times
    /// the format's factor, over 256 (the kernel's sums count 1/256 steps).
    pub step: Vec<f32>,
    /// Per block, 8 lanes: minus the format's weight offset times the half's activation sum, in
    /// lanes 0 and 4 (the other lanes are 0).
    pub offset: Vec<f32>,
    pub blocks: usize,
}

/// Byte of input i (0..64) of a block within each 32-byte digit vector pair: even inputs first.
pub const fn digit_slot(i: usize) -> usize {
    32 * (i % 2) + i / 2
}

/// Input j of a prepared activation in units of its step: 256 qh + ql + r / 256.
pub fn units_at(a: &IntAct, j: usize) -> f64 {
    let d = &a.digits[j / BLOCK * 192..];
    let k = digit_slot(j % BLOCK);
    256.0 * d[k] as f64 + d[64 + k] as f64 + d[128 + k] as f64 / 256.0
}

/// q as two signed bytes, q = 256 qh + ql, ql in -128..=127.
fn digits_of(q: i32) -> (i8, i8) {
    let ql = ((q + 128) & 255) - 128;
    (((q - ql) >> 8) as i8, ql as i8)
}

/// Below this largest |x| a half counts as zero (its inverse step would overflow; such inputs add
/// less than 1e-30 x sum|w| to a dot).
const TINY: f32 = 1e-30;

/// (step, 1 / step) of a half whose largest |x| is `amax`; NaN when an input is not finite.
fn half_step(amax: f32, finite: bool) -> (f32, f32) {
    if !finite || !amax.is_finite() {
        (f32::NAN, 0.0) // the dot is NaN, as the f32 product would be
    } else if amax < TINY {
        (0.0, 0.0)
    } else {
        (amax / QMAX, QMAX / amax)
    }
}

/// One input: (q, r) for step `step` and inverse `inv`. The rest x - q * step is exact (one
/// fused multiply-add), then rounded to 1/256 of a step. x * inv carries f32 rounding, so q may
/// miss the nearest step by a hair and r land on +-128.x: q then moves by one and r by 256.
#[inline]
fn split(x: f32, step: f32, inv: f32) -> (i32, i32) {
    let mut q = (x * inv).round_ties_even();
    let rest = (-q).mul_add(step, x);
    let mut r = (rest * (inv * 256.0)).round_ties_even();
    if r > 127.5 {
        (q, r) = (q + 1.0, r - 256.0);
    } else if r < -128.5 {
        (q, r) = (q - 1.0, r + 256.0);
    }
    (q as i32, r as i32)
}

/// Appends a half's 4 step lanes and 4 offset lanes.
fn push_half(a: &mut IntAct, step: f32, sum_q: i32, sum_r: i32, offset: i32, factor: f32) {
    let units = sum_q as f32 + sum_r as f32 / 256.0;
    a.step.extend([step * factor / 256.0; 4]);
    a.offset
        .extend([-(offset as f32) * units * step * factor, 0.0, 0.0, 0.0]);
}

fn empty(blocks: usize) -> IntAct {
    IntAct {
        digits: vec![0i8; blocks * 192],
        step: Vec::with_capacity(blocks * 8),
        offset: Vec::with_capacity(blocks * 8),
        blocks,
    }
}

/// Prepares the whole blocks of x. `offset` is the constant the weights' unsigned bytes carry
/// (INT4: 8, MXFP4: 12), `factor` what one unit of those bytes is worth (INT4: 1, MXFP4: 1/2).
pub fn prepare(x: &[f32], offset: i32, factor: f32) -> IntAct {
    #[cfg(target_arch = "x86_64")]
    if crate::dot::has_avx2_fma_f16c() {
        // SAFETY: avx2 and fma were detected.
        return unsafe { x86::prepare_avx2(x, offset, factor) };
    }
    prepare_reference(x, offset, factor)
}

/// Scalar twin of [`x86::prepare_avx2`] (the same values, bit for bit).
pub fn prepare_reference(x: &[f32], offset: i32, factor: f32) -> IntAct {
    let mut a = empty(x.len() / BLOCK);
    for b in 0..a.blocks {
        for half in 0..2 {
            let xs = &x[b * BLOCK + 32 * half..b * BLOCK + 32 * (half + 1)];
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let (step, inv) = half_step(amax, xs.iter().all(|v| v.is_finite()));
            let (mut sum_q, mut sum_r) = (0i32, 0i32);
            for (i, v) in xs.iter().enumerate() {
                let (q, r) = split(*v, step, inv);
                sum_q += q;
                sum_r += r;
                let (qh, ql) = digits_of(q);
                let k = b * 192 + digit_slot(32 * half + i);
                (a.digits[k], a.digits[k + 64], a.digits[k + 128]) = (qh, ql, r as i8);
            }
            push_half(&mut a, step, sum_q, sum_r, offset, factor);
        }
    }
    a
}

/// Scalar twin of [`x86::dot_avx2`]: `values[j]` is weight j as its unsigned byte (offset
/// included) and `half_scales[h]` the scale of inputs 32h..32h+32. Sums each half in integers,
/// as the SIMD kernel does, then scales it.
pub fn dot_reference(values: &[u8], half_scales: &[f32], a: &IntAct) -> f32 {
    let mut total = 0f32;
    for h in 0..a.blocks * 2 {
        let (b, base) = (h / 2, 32 * (h % 2));
        let mut sum = 0i64; // in 1/256 steps
        for i in base..base + 32 {
            let w = values[b * BLOCK + i] as i64;
            let k = b * 192 + digit_slot(i);
            let (qh, ql, r) = (
                a.digits[k] as i64,
                a.digits[k + 64] as i64,
                a.digits[k + 128] as i64,
            );
            sum += w * (65536 * qh + 256 * ql + r);
        }
        let lanes = b * 8 + (h % 2) * 4;
        total += (sum as f32 * a.step[lanes] + a.offset[lanes]) * half_scales[h];
    }
    total
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2: per block of 64 inputs, one 32-byte load of weights and two nibble masks; six
    //! `vpmaddubsw` (even and odd nibbles against qh, ql and r), three `vpmaddwd` to join the
    //! digits in i32; then one conversion and two FMAs (step + offset, the weights' scales).
    use std::arch::x86_64::*;

    use super::{IntAct, BLOCK};

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum_epi32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
    }

    /// 64 i32 values of a block (8 vectors, inputs in order) to i8 in [`super::digit_slot`]
    /// order, as two vectors [evens, odds]: narrowing packs (which interleave 128-bit lanes,
    /// undone by a qword permute), a byte shuffle that splits even and odd inputs within each
    /// lane, and lane selects.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn arrange(v: [__m256i; 8]) -> [__m256i; 2] {
        const ORDER: i32 = 0b11_01_10_00; // qwords 0, 2, 1, 3
                                          // Within each lane: the 8 even bytes, then the 8 odd ones.
        let bytes = _mm256_setr_epi8(
            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9,
            11, 13, 15,
        );
        // 32 inputs from four vectors of 8: [evens | odds].
        let split8 = |a: __m256i, b: __m256i, c: __m256i, d: __m256i| {
            let lo = _mm256_permute4x64_epi64::<ORDER>(_mm256_packs_epi32(a, b));
            let hi = _mm256_permute4x64_epi64::<ORDER>(_mm256_packs_epi32(c, d));
            let n = _mm256_permute4x64_epi64::<ORDER>(_mm256_packs_epi16(lo, hi));
            _mm256_permute4x64_epi64::<ORDER>(_mm256_shuffle_epi8(n, bytes))
        };
        let d0 = split8(v[0], v[1], v[2], v[3]);
        let d1 = split8(v[4], v[5], v[6], v[7]);
        [
            _mm256_permute2x128_si256::<0x20>(d0, d1),
            _mm256_permute2x128_si256::<0x31>(d0, d1),
        ]
    }

    /// Prepares 32 inputs per half with vector max, multiply, round and fused multiply-add; the
    /// digits are then placed in [`super::digit_slot`] order.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn prepare_avx2(x: &[f32], offset: i32, factor: f32) -> IntAct {
        let mut a = super::empty(x.len() / BLOCK);
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        for b in 0..a.blocks {
            let mut q = [_mm256_setzero_si256(); 8];
            let mut r = [_mm256_setzero_si256(); 8];
            for half in 0..2 {
                let p = x.as_ptr().add(b * BLOCK + 32 * half);
                let v = [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ];
                let m = _mm256_max_ps(
                    _mm256_max_ps(_mm256_and_ps(v[0], abs), _mm256_and_ps(v[1], abs)),
                    _mm256_max_ps(_mm256_and_ps(v[2], abs), _mm256_and_ps(v[3], abs)),
                );
                // Not finite: x - x is NaN only for infinities and NaNs.
                let bad = _mm256_or_ps(
                    _mm256_or_ps(_mm256_sub_ps(v[0], v[0]), _mm256_sub_ps(v[1], v[1])),
                    _mm256_or_ps(_mm256_sub_ps(v[2], v[2]), _mm256_sub_ps(v[3], v[3])),
                );
                let finite = _mm256_movemask_ps(_mm256_cmp_ps(bad, bad, _CMP_UNORD_Q)) == 0;
                let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
                let (step, inv) = super::half_step(amax, finite);
                let (stepv, invv, inv256) = (
                    _mm256_set1_ps(step),
                    _mm256_set1_ps(inv),
                    _mm256_set1_ps(inv * 256.0),
                );
                let (hi, lo) = (_mm256_set1_ps(127.5), _mm256_set1_ps(-128.5));
                let (one, wrap) = (_mm256_set1_ps(1.0), _mm256_set1_ps(256.0));
                let (mut sum_q, mut sum_r) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for k in 0..4 {
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
                    q[4 * half + k] = _mm256_cvtps_epi32(qf);
                    r[4 * half + k] = _mm256_cvtps_epi32(rf);
                    sum_q = _mm256_add_epi32(sum_q, q[4 * half + k]);
                    sum_r = _mm256_add_epi32(sum_r, r[4 * half + k]);
                }
                super::push_half(&mut a, step, hsum_epi32(sum_q), hsum_epi32(sum_r), offset, factor);
            }
            // q = 256 qh + ql, ql in -128..=127 (as `super::digits_of`).
            let (c128, c255) = (_mm256_set1_epi32(128), _mm256_set1_epi32(255));
            let ql = q.map(|v| _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(v, c128), c255), c128));
            let qh: [__m256i; 8] =
                std::array::from_fn(|k| _mm256_srai_epi32(_mm256_sub_epi32(q[k], ql[k]), 8));
            let d = a.digits.as_mut_ptr().add(b * 192) as *mut __m256i;
            for (k, v) in [arrange(qh), arrange(ql), arrange(r)]
                .iter()
                .flatten()
                .enumerate()
            {
                _mm256_storeu_si256(d.add(k), *v);
            }
        }
        a
    }

    /// How the weights' scales are stored.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Scales<'a> {
        /// One BF16 per 32 inputs (INT4 group 32).
        Bf16Group32(&'a [u16]),
        /// One BF16 per `1 << shift` inputs, shift >= 6 (a block never straddles two groups).
        Bf16Wide(&'a [u16], u32),
        /// One E8M0 byte per 32 inputs (MXFP4).
        E8m0(&'a [u8]),
    }

    impl Scales<'_> {
        /// (kind, shift, pointer), after checking that every block of `blocks` has its scales.
        fn raw(self, blocks: usize) -> (u8, u32, *const u8) {
            match self {
                Scales::Bf16Group32(s) => {
                    assert!(s.len() >= blocks * 2);
                    (0, 0, s.as_ptr() as *const u8)
                }
                Scales::Bf16Wide(s, shift) => {
                    assert!(shift >= 6 && (blocks == 0 || s.len() > ((blocks - 1) * BLOCK) >> shift));
                    (1, shift, s.as_ptr() as *const u8)
                }
                Scales::E8m0(s) => {
                    assert!(s.len() >= blocks * 2);
                    (2, 0, s.as_ptr())
                }
            }
        }
    }

    /// The sum over the whole blocks of `a`. `packed` holds at least 32 bytes per block (low
    /// nibble = even input); `lut` maps a nibble to its unsigned byte (none: the nibble itself).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_avx2(packed: &[u8], scales: Scales, lut: Option<&[u8; 16]>, a: &IntAct) -> f32 {
        let blocks = a.blocks;
        assert!(a.digits.len() >= blocks * 192);
        assert!(a.step.len() >= blocks * 8 && a.offset.len() >= blocks * 8);
        assert!(packed.len() >= blocks * 32);
        let (kind, shift, sp) = scales.raw(blocks);
        let p = packed.as_ptr();
        match (lut, kind) {
            (None, 0) => run::<false, 0>(p, sp, shift, &[0; 16], a),
            (None, 1) => run::<false, 1>(p, sp, shift, &[0; 16], a),
            (None, _) => run::<false, 2>(p, sp, shift, &[0; 16], a),
            (Some(l), 0) => run::<true, 0>(p, sp, shift, l, a),
            (Some(l), 1) => run::<true, 1>(p, sp, shift, l, a),
            (Some(l), _) => run::<true, 2>(p, sp, shift, l, a),
        }
    }

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

    /// Block b's 8 lanes before the weights' scales: step x (integer sums) + offset.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_sum<const LUT: bool>(packed: *const u8, lut: __m256i, a: &IntAct, b: usize) -> __m256 {
        let low = _mm256_set1_epi8(0x0f);
        let v = _mm256_loadu_si256(packed.add(32 * b) as *const __m256i);
        let mut even = _mm256_and_si256(v, low);
        let mut odd = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if LUT {
            even = _mm256_shuffle_epi8(lut, even);
            odd = _mm256_shuffle_epi8(lut, odd);
        }
        // Per i16 lane, four products of a digit; per i32 lane, eight: at most 8 x 24 x
        // (65536 x 127 + 256 x 128 + 128) < 2^31 once joined in 1/256 steps.
        let d = a.digits.as_ptr().add(192 * b) as *const __m256i;
        let m = |k: usize| {
            _mm256_add_epi16(
                _mm256_maddubs_epi16(even, _mm256_loadu_si256(d.add(k))),
                _mm256_maddubs_epi16(odd, _mm256_loadu_si256(d.add(k + 1))),
            )
        };
        let (hi, lo, rest) = (m(0), m(2), m(4));
        let q = _mm256_add_epi32(
            _mm256_madd_epi16(hi, _mm256_set1_epi16(256)),
            _mm256_madd_epi16(lo, _mm256_set1_epi16(1)),
        );
        let units = _mm256_cvtepi32_ps(_mm256_add_epi32(
            _mm256_slli_epi32(q, 8),
            _mm256_madd_epi16(rest, _mm256_set1_epi16(1)),
        ));
        _mm256_fmadd_ps(
            units,
            _mm256_loadu_ps(a.step.as_ptr().add(8 * b)),
            _mm256_loadu_ps(a.offset.as_ptr().add(8 * b)),
        )
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn run<const LUT: bool, const SCALE: u8>(
        packed: *const u8,
        scales: *const u8,
        shift: u32,
        lut: &[u8; 16],
        a: &IntAct,
    ) -> f32 {
        let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(lut.as_ptr() as *const __m128i));
        // Two blocks per step into two accumulators: the FMA chains never wait on each other.
        let (mut t0, mut t1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut b = 0;
        while b + 2 <= a.blocks {
            crate::dot::x86::prefetch(packed.wrapping_add(32 * b));
            let s0 = block_sum::<LUT>(packed, lut, a, b);
            let s1 = block_sum::<LUT>(packed, lut, a, b + 1);
            t0 = _mm256_fmadd_ps(s0, block_scales::<SCALE>(scales, shift, b), t0);
            t1 = _mm256_fmadd_ps(s1, block_scales::<SCALE>(scales, shift, b + 1), t1);
            b += 2;
        }
        if b < a.blocks {
            let s0 = block_sum::<LUT>(packed, lut, a, b);
            t0 = _mm256_fmadd_ps(s0, block_scales::<SCALE>(scales, shift, b), t0);
        }
        crate::dot::hsum256(_mm256_add_ps(t0, t1))
    }
}
