//! FP8 E4M3 weights with block scales (DeepSeek-V3 / Kimi K2 Instruct): `w = fp8 * scale[i/bo, j/bi]`.
//! Blocks at the right and bottom edges are partial (DeepSeek's semantics: the scale grid is
//! ceil(out/bo) x ceil(in/bi)). The dot product decodes inside the loop; nothing is dequantized
//! into a temporary.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// E4M3 (fn variant: no infinities, 0x7f/0xff are NaN) to f32, exactly.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0x0f) as i32;
    let m = (b & 0x07) as f32;
    if e == 15 && b & 0x07 == 7 {
        return f32::NAN;
    }
    let v = if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    sign * v
}

fn table() -> &'static [f32; 256] {
    static T: OnceLock<[f32; 256]> = OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|i| e4m3_to_f32(i as u8)))
}

/// Scalar reference: one row. `scales` are this row's block scales (one per `block` columns).
pub fn dot_fp8_reference(w: &[u8], scales: &[f32], block: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let t = table();
    let mut total = 0f32;
    for (b, (wb, xb)) in w.chunks(block).zip(x.chunks(block)).enumerate() {
        let mut acc = [0f32; 8];
        let n8 = wb.len() / 8 * 8;
        for c in (0..n8).step_by(8) {
            for l in 0..8 {
                acc[l] += t[wb[c + l] as usize] * xb[c + l];
            }
        }
        let mut s = crate::dot::tree8(acc);
        for i in n8..wb.len() {
            s += t[wb[i] as usize] * xb[i];
        }
        total += s * scales[b];
    }
    total
}

type DotFp8 = fn(&[u8], &[f32], usize, &[f32]) -> f32;

pub fn dot_fp8(w: &[u8], scales: &[f32], block: usize, x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotFp8> = OnceLock::new();
    (IMPL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if crate::dot::has_avx2_fma_f16c() {
            return x86::dot_fp8_avx2_entry;
        }
        dot_fp8_reference
    }))(w, scales, block, x)
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2+FMA: an E4M3 byte sign-extended and shifted into f32's bit positions is the same
    //! value times 2^-120 (normals and subnormals alike), 8 at a time with three instructions.
    use std::arch::x86_64::*;

    pub fn dot_fp8_avx2_entry(w: &[u8], scales: &[f32], block: usize, x: &[f32]) -> f32 {
        // SAFETY: selected only when avx2 and fma were detected.
        unsafe { dot_fp8_avx2(w, scales, block, x) }
    }

    /// 8 E4M3 bytes -> 8 f32 at 2^-120 of their value: sign-extended to 32 bits, shifted so the
    /// 7 magnitude bits land on f32's exponent + top mantissa bits (E4M3's exponent field is
    /// then f32's, whose bias is 120 larger), the copies of the sign above bit 26 cleared but
    /// bit 31. Exact for every code: subnormal codes become f32 subnormals of the same digits.
    /// Without a prepared activation the weights are brought back by 2^120 (exact) before they
    /// multiply, so no product lands among f32's subnormals.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn decode8<const PREPARED: bool>(p: *const u8) -> __m256 {
        let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i));
        let bits = _mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32(0x87f0_0000u32 as i32));
        let w = _mm256_castsi256_ps(bits);
        if PREPARED {
            w
        } else {
            _mm256_mul_ps(w, _mm256_set1_ps(f32::from_bits((127 + 120) << 23)))
        }
    }

    /// 32 E4M3 bytes -> four vectors of 8 f32 at 2^-120 of their value (as [`decode8`]): inputs
    /// 4j, 4j + 1, 4j + 2 and 4j + 3 of the 32 (j = 0..8), the order of `super::prepare`. A
    /// 16-bit arithmetic shift by 4 puts the high byte of each 16-bit lane on f32's exponent and
    /// top mantissa bits with its sign on bit 31, the other byte does the same after a shift
    /// left by 8, and a 32-bit shift by 16 brings each low half up; one mask then keeps sign,
    /// exponent and mantissa bits. Nine integer operations for 32 weights, no shuffles.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn decode32(p: *const u8) -> [__m256; 4] {
        let v = _mm256_loadu_si256(p as *const __m256i);
        let m = _mm256_set1_epi32(0x87f0_0000u32 as i32);
        let odd = _mm256_srai_epi16(v, 4); // input 4j + 3 in the high half, 4j + 1 in the low
        let even = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4); // 4j + 2 high, 4j low
        [
            _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(even, 16), m)),
            _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(odd, 16), m)),
            _mm256_castsi256_ps(_mm256_and_si256(even, m)),
            _mm256_castsi256_ps(_mm256_and_si256(odd, m)),
        ]
    }

    /// `super::prepare`: each whole 32 inputs as eight rows of four (rows j and j + 4 in the two
    /// 128-bit lanes of one vector), transposed within each lane, so vector k holds inputs 4j + k.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn prepare_avx2(x: &[f32]) -> Vec<f32> {
        let n = x.len();
        let whole = n / super::CHUNK * super::CHUNK;
        let mut xs = vec![0f32; n];
        let f = _mm256_set1_ps(super::X_FACTOR);
        for c in (0..whole).step_by(super::CHUNK) {
            let p = x.as_ptr().add(c);
            let r = [
                _mm256_loadu2_m128(p.add(16), p),
                _mm256_loadu2_m128(p.add(20), p.add(4)),
                _mm256_loadu2_m128(p.add(24), p.add(8)),
                _mm256_loadu2_m128(p.add(28), p.add(12)),
            ];
            let (t0, t1) = (_mm256_unpacklo_ps(r[0], r[1]), _mm256_unpacklo_ps(r[2], r[3]));
            let (t2, t3) = (_mm256_unpackhi_ps(r[0], r[1]), _mm256_unpackhi_ps(r[2], r[3]));
            let out = [
                _mm256_shuffle_ps::<0x44>(t0, t1),
                _mm256_shuffle_ps::<0xee>(t0, t1),
                _mm256_shuffle_ps::<0x44>(t2, t3),
                _mm256_shuffle_ps::<0xee>(t2, t3),
            ];
            for (k, v) in out.iter().enumerate() {
                _mm256_storeu_ps(xs.as_mut_ptr().add(c + 8 * k), _mm256_mul_ps(*v, f));
            }
        }
        for i in whole..n {
            xs[i] = x[i] * super::X_FACTOR;
        }
        xs
    }

    /// 32 weights at `wp` times their 32 inputs at `xp` into the four accumulators.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn chunk32<const PREPARED: bool>(wp: *const u8, xp: *const f32, acc: &mut [__m256; 4]) {
        if PREPARED {
            let wk = decode32(wp);
            for k in 0..4 {
                acc[k] = _mm256_fmadd_ps(wk[k], _mm256_loadu_ps(xp.add(8 * k)), acc[k]);
            }
        } else {
            for k in 0..4 {
                let wk = decode8::<PREPARED>(wp.add(8 * k));
                acc[k] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(xp.add(8 * k)), acc[k]);
            }
        }
    }

    /// One row with its block scales: each block's four chains are summed and scaled at the
    /// block's end (the path of blocks that are not a multiple of 32, and of `row_dot`).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_fp8_avx2(w: &[u8], scales: &[f32], block: usize, x: &[f32]) -> f32 {
        assert!(w.len() == x.len() && scales.len() * block >= w.len());
        let n = w.len();
        let (mut total0, mut total1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut tail = 0f32;
        let t = super::table();
        let mut start = 0;
        let mut b = 0;
        while start < n {
            let end = (start + block).min(n);
            // Four independent chains keep both FMA pipes busy.
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = start;
            // 64 bytes (one line, one prefetch) per step while they last, then 32.
            while i + 64 <= end {
                crate::dot::x86::prefetch(w.as_ptr().add(i));
                chunk32::<false>(w.as_ptr().add(i), x.as_ptr().add(i), &mut acc);
                chunk32::<false>(w.as_ptr().add(i + 32), x.as_ptr().add(i + 32), &mut acc);
                i += 64;
            }
            if i + 32 <= end {
                chunk32::<false>(w.as_ptr().add(i), x.as_ptr().add(i), &mut acc);
                i += 32;
            }
            while i + 8 <= end {
                let wk = decode8::<false>(w.as_ptr().add(i));
                acc[0] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(x.as_ptr().add(i)), acc[0]);
                i += 8;
            }
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let scale = scales[b];
            if b % 2 == 0 {
                total0 = _mm256_fmadd_ps(sum, _mm256_set1_ps(scale), total0);
            } else {
                total1 = _mm256_fmadd_ps(sum, _mm256_set1_ps(scale), total1);
            }
            let mut s = 0f32;
            while i < end {
                s += t[w[i] as usize] * x[i];
                i += 1;
            }
            tail += s * scale;
            start = end;
            b += 1;
        }
        crate::dot::hsum256(_mm256_add_ps(total0, total1)) + tail
    }

    /// `super::scale_activation` into `out` (as long as `xs`), 8 inputs per multiply.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scale_activation_avx2(xs: &[f32], scales: &[f32], block: usize, out: &mut [f32]) {
        let n = xs.len();
        assert!(out.len() == n && block > 0 && scales.len() * block >= n);
        let (x, o) = (xs.as_ptr(), out.as_mut_ptr());
        let mut start = 0;
        for s in scales.iter().take(n.div_ceil(block)) {
            let end = (start + block).min(n);
            let sv = _mm256_set1_ps(*s);
            let mut i = start;
            while i + 8 <= end {
                _mm256_storeu_ps(o.add(i), _mm256_mul_ps(_mm256_loadu_ps(x.add(i)), sv));
                i += 8;
            }
            while i < end {
                *o.add(i) = *x.add(i) * s;
                i += 1;
            }
            start = end;
        }
    }

    /// One row against an activation that carries the block scales already (`xs` from
    /// `super::scale_activation`): no step per block, one long run of eight chains (two FMAs
    /// in flight per pipe). Products come out at 2^-56 of their value (weights at 2^-120, `xs`
    /// at 2^64), brought back at the end.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_fp8_scaled_avx2(w: &[u8], xs: &[f32]) -> f32 {
        assert_eq!(w.len(), xs.len());
        let n = w.len();
        let (wp, xp) = (w.as_ptr(), xs.as_ptr());
        let mut lo = [_mm256_setzero_ps(); 4];
        let mut hi = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // 64 bytes (one line, one prefetch) per step while they last, then 32.
        while i + 64 <= n {
            crate::dot::x86::prefetch(wp.add(i));
            chunk32::<true>(wp.add(i), xp.add(i), &mut lo);
            chunk32::<true>(wp.add(i + 32), xp.add(i + 32), &mut hi);
            i += 64;
        }
        if i + 32 <= n {
            chunk32::<true>(wp.add(i), xp.add(i), &mut lo);
            i += 32;
        }
        // Past the last whole 32 of the row `xs` is in input order.
        while i + 8 <= n {
            let wk = decode8::<true>(wp.add(i));
            hi[0] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(xp.add(i)), hi[0]);
            i += 8;
        }
        let mut tail = 0f32;
        while i < n {
            tail += super::e4m3_scaled(w[i]) * xs[i];
            i += 1;
        }
        let mut sum = _mm256_setzero_ps();
        for k in 0..4 {
            sum = _mm256_add_ps(sum, _mm256_add_ps(lo[k], hi[k]));
        }
        (crate::dot::hsum256(sum) + tail) * super::UNDO
    }
}

/// Factor of the activation prepared for [`rows_fp8_prepared`]: 2^64 (exact; no f32 activation
/// comes near 2^64 of range from overflow).
const X_FACTOR: f32 = 18446744073709551616.0;

/// Inputs the prepared activation reorders together.
const CHUNK: usize = 32;

/// The activation for [`rows_fp8_prepared`]: x times 2^64, so that the kernel's decoded weights
/// (the true value times 2^-120, see `x86::dot_fp8_scaled_avx2`) multiply to products at 2^-56 of their
/// value, far from f32's subnormals. Each whole 32 inputs are stored by stride 4 (position
/// 8k + j holds input 4j + k), the order in which the kernel decodes 32 weight bytes; the last
/// partial 32 stays in order.
pub fn prepare(x: &[f32]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if crate::dot::has_avx2_fma_f16c() {
        // SAFETY: avx2 and fma were detected.
        return unsafe { x86::prepare_avx2(x) };
    }
    prepare_reference(x)
}

/// Scalar twin of [`prepare`]'s SIMD variant (the same values, bit for bit).
pub fn prepare_reference(x: &[f32]) -> Vec<f32> {
    let mut xs = Vec::with_capacity(x.len());
    for c in x.chunks(CHUNK) {
        if c.len() == CHUNK {
            xs.extend((0..CHUNK).map(|p| c[4 * (p % 8) + p / 8] * X_FACTOR));
        } else {
            xs.extend(c.iter().map(|v| v * X_FACTOR));
        }
    }
    xs
}

/// 2^56: the factor a product of a decoded weight (2^-120) and a prepared input (2^64) lacks.
const UNDO: f32 = 72057594037927936.0;

/// An E4M3 byte at 2^-120 of its value (the bits of the SIMD decode, one byte): exact.
fn e4m3_scaled(b: u8) -> f32 {
    f32::from_bits((((b as i8 as i32) << 20) as u32) & 0x87f0_0000)
}

/// The prepared activation times the scale of each input's column block, for the rows of one
/// row block (`scales`: that row block's scales, one per `block` inputs). The stride-4 order of
/// [`prepare`] stays within whole 32s, and so within blocks that are multiples of 32.
pub fn scale_activation(xs: &[f32], scales: &[f32], block: usize, out: &mut Vec<f32>) {
    out.resize(xs.len(), 0.0);
    #[cfg(target_arch = "x86_64")]
    if crate::dot::has_avx2_fma_f16c() {
        // SAFETY: avx2 was detected.
        return unsafe { x86::scale_activation_avx2(xs, scales, block, out) };
    }
    scale_activation_reference(xs, scales, block, out)
}

/// Scalar twin of [`scale_activation`]'s SIMD variant (the same values, bit for bit).
pub fn scale_activation_reference(xs: &[f32], scales: &[f32], block: usize, out: &mut [f32]) {
    for ((o, c), s) in out.chunks_mut(block).zip(xs.chunks(block)).zip(scales) {
        for (o, v) in o.iter_mut().zip(c) {
            *o = v * s;
        }
    }
}

/// Whether rows take the scaled-activation kernel: AVX2 and blocks that are whole 32s.
fn scaled_path(block: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::dot::has_avx2_fma_f16c() {
        return block.is_multiple_of(CHUNK);
    }
    let _ = block;
    false
}

/// An activation prepared for the FP8 kernels: `xs` from [`prepare`], and a number no other
/// activation has, which names the copies each thread scales from it (see [`rows_fp8_prepared`]).
pub struct Fp8Act {
    pub xs: Vec<f32>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    id: u64,
}

impl Fp8Act {
    pub fn new(x: &[f32]) -> Fp8Act {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Fp8Act {
            xs: prepare(x),
            id: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// A scaled activation a thread keeps: the id of the activation, the row block's scales it was
/// scaled by (compared by value, so a matrix freed and another allocated in its place can never
/// be served a stale copy), and the values.
#[cfg(target_arch = "x86_64")]
struct ScaledSlot {
    act: u64,
    scales: Vec<f32>,
    values: Vec<f32>,
}

/// Scaled activations a thread keeps: enough for the tokens of a prompt-style product to reuse
/// theirs across the tasks of one row block (8 x 7168 inputs: 229 KB).
#[cfg(target_arch = "x86_64")]
const SCALED_SLOTS: usize = 8;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// This thread's scaled activations, and the slot to reuse next.
    static SCALED: std::cell::RefCell<(Vec<ScaledSlot>, usize)> =
        const { std::cell::RefCell::new((Vec::new(), 0)) };
}

/// The slot holding `act` scaled by `scales` (one row block's), scaling it into a free slot, or
/// else the one after `next`, when none does.
#[cfg(target_arch = "x86_64")]
fn scaled_slot(
    slots: &mut Vec<ScaledSlot>,
    next: &mut usize,
    act: &Fp8Act,
    scales: &[f32],
    block: usize,
) -> usize {
    if let Some(found) = slots.iter().position(|k| k.act == act.id && k.scales == scales) {
        return found;
    }
    let fresh = if slots.len() < SCALED_SLOTS {
        slots.push(ScaledSlot {
            act: u64::MAX,
            scales: Vec::new(),
            values: Vec::new(),
        });
        slots.len() - 1
    } else {
        *next = (*next + 1) % SCALED_SLOTS;
        *next
    };
    let k = &mut slots[fresh];
    scale_activation(&act.xs, scales, block, &mut k.values);
    k.act = act.id;
    k.scales.clear();
    k.scales.extend_from_slice(scales);
    fresh
}

/// `out[i]` = row `r0 + i` of the (out, in) matrix `w` (`block` (bo, bi) scales in `scales`)
/// times x, with `act` made from x. The activation is scaled by the block scales of the rows'
/// row block (once per thread, row block and activation, into buffers the thread keeps for the
/// last few), so the kernel's
/// inner loop runs the whole row without a step per 128-input block: 1.5x the compute rate.
pub fn rows_fp8_prepared(
    w: &[u8],
    scales: &[f32],
    block: (usize, usize),
    x: &[f32],
    act: &Fp8Act,
    r0: usize,
    out: &mut [f32],
) {
    let n = x.len();
    let per_row = n.div_ceil(block.1);
    let row_scales = |rb: usize| &scales[rb * per_row..(rb + 1) * per_row];
    #[cfg(target_arch = "x86_64")]
    if scaled_path(block.1) {
        SCALED.with(|cell| {
            let (slots, next) = &mut *cell.borrow_mut();
            let (mut slot, mut slot_rb) = (0, usize::MAX);
            for (i, o) in out.iter_mut().enumerate() {
                let r = r0 + i;
                if r / block.0 != slot_rb {
                    slot_rb = r / block.0;
                    slot = scaled_slot(slots, next, act, row_scales(slot_rb), block.1);
                }
                // SAFETY: `scaled_path` saw avx2 and fma.
                *o = unsafe { x86::dot_fp8_scaled_avx2(&w[r * n..(r + 1) * n], &slots[slot].values) };
            }
        });
        return;
    }
    let _ = act;
    for (i, o) in out.iter_mut().enumerate() {
        let r = r0 + i;
        *o = dot_fp8(&w[r * n..(r + 1) * n], row_scales(r / block.0), block.1, x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_activation_is_the_same_with_and_without_simd() {
        for n in [0usize, 5, 31, 32, 33, 64, 100, 7168, 7170] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.731).sin() * 1e3).collect();
            let bits = |v: Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let want = prepare_reference(&x);
            assert_eq!(bits(prepare(&x)), bits(want.clone()), "n = {n}");
            // Position 8k + j of each whole 32 is input 4j + k.
            if n >= 32 {
                assert_eq!(want[8 + 2], x[4 * 2 + 1] * X_FACTOR);
            }
        }
    }

    #[test]
    fn scaled_activation_is_the_same_with_and_without_simd() {
        for (n, block) in [
            (0usize, 32),
            (7, 32),
            (100, 32),
            (130, 64),
            (7168, 128),
            (7170, 128),
        ] {
            let xs: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).cos() * 1e20).collect();
            let scales: Vec<f32> = (0..n.div_ceil(block)).map(|b| 1e-3 * (b + 1) as f32).collect();
            let mut got = Vec::new();
            scale_activation(&xs, &scales, block, &mut got);
            let mut want = vec![0f32; n];
            scale_activation_reference(&xs, &scales, block, &mut want);
            assert!(
                got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "n = {n}"
            );
            assert_eq!(got.len(), n);
            if n > block {
                assert_eq!(want[block + 1], xs[block + 1] * scales[1]);
            }
        }
    }

    #[test]
    fn decodes_known_codes() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0); // e=7, m=0
        assert_eq!(e4m3_to_f32(0x7e), 448.0); // largest finite
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3_to_f32(0xb8), -1.0);
        assert!(e4m3_to_f32(0x7f).is_nan());
    }
}
