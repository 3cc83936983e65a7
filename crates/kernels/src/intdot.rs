//! Integer-domain dot products for the 4-bit formats (INT4 pack-quantized, MXFP4).
//!
//! Their weights are small integers once mapped to unsigned bytes (INT4: the stored nibble q + 8;
//! MXFP4: twice the E2M1 value plus 12), so instead of converting every weight to f32 the
//! activation is put once per token into integers and the products are summed exactly in
//! integer SIMD. Per 32 inputs with step s = max|x| / 32512, each input becomes
//! s * (q + r / 256): q = round(x / s) in 16 bits and r the rounded rest in 8 more, i.e. 24
//! significant bits, as many as an f32 has. The kernel multiplies q by the weights with
//! `vpmaddwd` (16 x 16 bits, the weight in the high byte so the product counts 1/256 steps) and r
//! with `vpmaddubsw` (the unsigned weight bytes against signed r). The weights' constant offset
//! is taken out once per 32 inputs from the sum of the activation.
//!
//! Accuracy: the weights are exact; each input moves by at most 1/512 of its step (6e-8 of the
//! largest |x| among its 32), the size of f32 rounding. A 16-bit activation alone
//! (2e-5) measured too coarse: Kimi K3's routing weights, amplified by AttnRes, left their 1e-4
//! tolerance. The scalar twins compute the same integers; [`crate::int4::dot_int4_reference`]
//! and [`crate::mxfp4::dot_mxfp4_reference`] stay the f32 truth the property tests compare to.

/// Largest |q| before rounding (q may still move by one, see `split`): keeps q within i16.
pub const QMAX: f32 = 32512.0;

/// Inputs per block: 32 packed bytes of weights, two 32-input halves.
pub const BLOCK: usize = 64;

/// One block of a prepared activation: 256 bytes, four cache lines, read in order.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct ActBlock {
    /// q of input i at [`q_slot`]`(i)`: four vectors of 16, vector k holding inputs 4j + k
    /// (the order of the nibbles in the weights' 16-bit lanes).
    pub q: [i16; 64],
    /// r of input i at [`r_slot`]`(i)`: the even inputs, then the odd ones (the order of the
    /// nibbles in the weights' bytes).
    pub r: [i8; 64],
    /// The step of the first half (lanes 0-3) and of the second (4-7), times the format's
    /// factor, over 256 (the kernel's sums count 1/256 steps).
    pub step: [f32; 8],
    /// Minus the format's weight offset times the half's activation sum, in lanes 0 and 4 (the
    /// other lanes are 0).
    pub offset: [f32; 8],
}

const EMPTY: ActBlock = ActBlock {
    q: [0; 64],
    r: [0; 64],
    step: [0.0; 8],
    offset: [0.0; 8],
};

/// An activation prepared for [`x86::dot_avx2`], whole blocks of 64 inputs only.
pub struct IntAct {
    pub blocks: Vec<ActBlock>,
}

impl IntAct {
    /// The prepared blocks as bytes (two preparations are the same when these are).
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: ActBlock is plain data without padding (256 bytes of integers and floats).
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr() as *const u8, self.blocks.len() * 256) }
    }

    /// The step lane of input j (its half's step x factor / 256).
    pub fn step_of(&self, j: usize) -> f32 {
        self.blocks[j / BLOCK].step[(j % BLOCK) / 32 * 4]
    }
}

/// Index of input i (0..64) of a block in [`ActBlock::q`].
pub const fn q_slot(i: usize) -> usize {
    16 * (i % 4) + i / 4
}

/// Index of input i (0..64) of a block in [`ActBlock::r`].
pub const fn r_slot(i: usize) -> usize {
    32 * (i % 2) + i / 2
}

/// Input j of a prepared activation in units of its step: q + r / 256.
pub fn units_at(a: &IntAct, j: usize) -> f64 {
    let b = &a.blocks[j / BLOCK];
    let i = j % BLOCK;
    b.q[q_slot(i)] as f64 + b.r[r_slot(i)] as f64 / 256.0
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

/// Sets a half's 4 step lanes and its offset lane.
fn set_half(b: &mut ActBlock, half: usize, step: f32, sum_q: i32, sum_r: i32, offset: i32, factor: f32) {
    let units = sum_q as f32 + sum_r as f32 / 256.0;
    b.step[4 * half..4 * half + 4].fill(step * factor / 256.0);
    b.offset[4 * half] = -(offset as f32) * units * step * factor;
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
    let mut a = IntAct {
        blocks: vec![EMPTY; x.len() / BLOCK],
    };
    for (b, block) in a.blocks.iter_mut().enumerate() {
        for half in 0..2 {
            let xs = &x[b * BLOCK + 32 * half..b * BLOCK + 32 * (half + 1)];
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let (step, inv) = half_step(amax, xs.iter().all(|v| v.is_finite()));
            let (mut sum_q, mut sum_r) = (0i32, 0i32);
            for (i, v) in xs.iter().enumerate() {
                let (q, r) = split(*v, step, inv);
                sum_q += q;
                sum_r += r;
                block.q[q_slot(32 * half + i)] = q as i16;
                block.r[r_slot(32 * half + i)] = r as i8;
            }
            set_half(block, half, step, sum_q, sum_r, offset, factor);
        }
    }
    a
}

/// Checks a call for several tokens (`xs[t]` prepared as `ps[t]`, `out` rows x tokens) and
/// gives (tokens, inputs, the rows it covers from `first`).
pub fn token_rows(
    xs: &[&[f32]],
    ps: &[Option<&IntAct>],
    first: usize,
    out: &[f32],
) -> (usize, usize, std::ops::Range<usize>) {
    let tokens = xs.len();
    assert!(tokens > 0 && ps.len() == tokens && out.len().is_multiple_of(tokens));
    assert!(xs.iter().all(|x| x.len() == xs[0].len()));
    (tokens, xs[0].len(), first..first + out.len() / tokens)
}

/// Runs `f` on every token's prepared activation when all tokens have one (one token needs no
/// allocation: that is the decode path).
pub fn with_acts<R>(ps: &[Option<&IntAct>], f: impl FnOnce(&[&IntAct]) -> R) -> Option<R> {
    if let [Some(a)] = ps {
        return Some(f(&[*a]));
    }
    let acts: Option<Vec<&IntAct>> = ps.iter().copied().collect();
    acts.map(|a| f(&a))
}

/// Adds to each row's sum over the whole blocks of `a` its inputs past them (`blocks * 64..n`),
/// for token `t` of `tokens` (`out[i * tokens + t]` is row i's): `term(row, j)` is input j's
/// product; summed apart, then added, as a one-row call does.
pub fn add_tails(
    out: &mut [f32],
    tokens: usize,
    t: usize,
    a: &IntAct,
    n: usize,
    term: impl Fn(usize, usize) -> f32,
) {
    let blocked = a.blocks.len() * BLOCK;
    assert!(blocked <= n);
    if blocked < n {
        for (i, o) in out.iter_mut().skip(t).step_by(tokens).enumerate() {
            *o += (blocked..n).map(|j| term(i, j)).fold(0f32, |s, t| s + t);
        }
    }
}

/// Scalar twin of [`x86::dot_avx2`]: `values[j]` is weight j as its unsigned byte (offset
/// included) and `half_scales[h]` the scale of inputs 32h..32h+32. Sums each half in integers,
/// as the SIMD kernel does, then scales it.
pub fn dot_reference(values: &[u8], half_scales: &[f32], a: &IntAct) -> f32 {
    let mut total = 0f32;
    for h in 0..a.blocks.len() * 2 {
        let (block, base) = (&a.blocks[h / 2], 32 * (h % 2));
        let mut sum = 0i64; // in 1/256 steps
        for i in base..base + 32 {
            let w = values[h / 2 * BLOCK + i] as i64;
            let (q, r) = (block.q[q_slot(i)] as i64, block.r[r_slot(i)] as i64);
            sum += w * (256 * q + r);
        }
        let lane = (h % 2) * 4;
        total += (sum as f32 * block.step[lane] + block.offset[lane]) * half_scales[h];
    }
    total
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
    /// (kind, shift, pointer, bytes per row), after checking that every block of `blocks` in
    /// each of `rows` rows, `per_row` scales apart, has its scales.
    pub(crate) fn raw(self, blocks: usize, rows: usize, per_row: usize) -> (u8, u32, *const u8, usize) {
        let (kind, shift, len, size, p) = match self {
            Scales::Bf16Group32(s) => (0, 0, s.len(), 2, s.as_ptr() as *const u8),
            Scales::Bf16Wide(s, shift) => (1, shift, s.len(), 2, s.as_ptr() as *const u8),
            Scales::E8m0(s) => (2, 0, s.len(), 1, s.as_ptr()),
        };
        // Scales of one row's whole blocks.
        let need = match kind {
            1 => {
                assert!(shift >= 6);
                if blocks == 0 {
                    0
                } else {
                    (((blocks - 1) * BLOCK) >> shift) + 1
                }
            }
            _ => blocks * 2,
        };
        assert!(rows == 0 || (per_row >= need && len >= (rows - 1) * per_row + need));
        (kind, shift, p, per_row * size)
    }
}

/// Checks a rows-by-tokens call of the SIMD kernels (every token's activation has the same
/// blocks, every row's packed bytes are there) and gives (blocks, rows).
pub(crate) fn check_rows(packed: &[u8], row_bytes: usize, acts: &[&IntAct], out: &[f32]) -> (usize, usize) {
    let tokens = acts.len();
    assert!(tokens > 0 && out.len().is_multiple_of(tokens));
    let (blocks, rows) = (acts[0].blocks.len(), out.len() / tokens);
    assert!(acts.iter().all(|a| a.blocks.len() == blocks));
    assert!(row_bytes >= blocks * 32 && (rows == 0 || packed.len() >= (rows - 1) * row_bytes + blocks * 32));
    (blocks, rows)
}

/// Whether [`dot_rows`] has a SIMD kernel on this CPU (else the callers take the f32 twins).
pub fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::dot::has_avx2_fma_f16c();
    #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
    return crate::isa::isa() == crate::isa::Isa::Neon;
    #[allow(unreachable_code)]
    false
}

/// The SIMD kernel of the CPU ([`x86::dot_rows_avx2`] or [`crate::neon_intdot::dot_rows`]): row
/// i's packed bytes at `i * row_bytes`, its scales `i * scales_per_row` into `scales`,
/// `out[i * T + t]` row i times token t (T = `acts.len()`), each token's sum in the steps of a
/// one-token call. Panics when [`simd`] is false.
pub fn dot_rows(
    packed: &[u8],
    row_bytes: usize,
    scales: Scales,
    scales_per_row: usize,
    lut: Option<&[u8; 16]>,
    acts: &[&IntAct],
    out: &mut [f32],
) {
    assert!(simd(), "no SIMD integer kernel on this CPU");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `simd()` found AVX2 and FMA.
    unsafe {
        x86::dot_rows_avx2(packed, row_bytes, scales, scales_per_row, lut, acts, out)
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `simd()` found NEON (every aarch64 CPU has it).
    unsafe {
        crate::neon_intdot::dot_rows(packed, row_bytes, scales, scales_per_row, lut, acts, out)
    }
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2: per block of 64 inputs, one 32-byte load of weights and two nibble masks (then the
    //! format's table, if any); four `vpmaddwd` of q against the weights moved into the high
    //! byte of each 16-bit lane, two `vpmaddubsw` of r against the weight bytes, one to widen
    //! them; then one conversion and two FMAs (step + offset, the weights' scales).
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
        dot_rows_avx2(packed, a.blocks.len() * 32, scales, per_row, lut, &[a], &mut out);
        out[0]
    }

    /// [`dot_avx2`] for a run of rows and one or more tokens: row i's packed bytes start at
    /// `i * row_bytes` and its scales `i * scales_per_row` scales into `scales`; `out[i * T + t]`
    /// (T = `acts.len()`, all of the same length) is row i times token t. Each weight block is
    /// unpacked once for up to four tokens, and each token's sum takes exactly the steps of a
    /// one-token call (batch invariance). One call for a run of rows keeps the per-row work
    /// (checks, dispatch) out of the loop.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_rows_avx2(
        packed: &[u8],
        row_bytes: usize,
        scales: Scales,
        scales_per_row: usize,
        lut: Option<&[u8; 16]>,
        acts: &[&IntAct],
        out: &mut [f32],
    ) {
        let vnni = crate::isa::has_avx512_vnni();
        dot_rows_with(vnni, packed, row_bytes, scales, scales_per_row, lut, acts, out)
    }

    /// [`dot_rows_avx2`] with its VNNI step (`vnni`) or without: the same bits either way.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA, and with `vnni` AVX-512 F, VL and VNNI.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_rows_with(
        vnni: bool,
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
        let rows_of = match (vnni, lut.is_some(), kind) {
            (false, false, 0) => rows_of::<false, 0>,
            (false, false, 1) => rows_of::<false, 1>,
            (false, false, _) => rows_of::<false, 2>,
            (false, true, 0) => rows_of::<true, 0>,
            (false, true, 1) => rows_of::<true, 1>,
            (false, true, _) => rows_of::<true, 2>,
            (true, false, 0) => rows_of_vnni::<false, 0>,
            (true, false, 1) => rows_of_vnni::<false, 1>,
            (true, false, _) => rows_of_vnni::<false, 2>,
            (true, true, 0) => rows_of_vnni::<true, 0>,
            (true, true, 1) => rows_of_vnni::<true, 1>,
            (true, true, _) => rows_of_vnni::<true, 2>,
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
}
