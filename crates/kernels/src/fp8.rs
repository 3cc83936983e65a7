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
        #[cfg(target_arch = "aarch64")]
        if crate::isa::isa() == crate::isa::Isa::Neon {
            return crate::neon::dot_fp8;
        }
        dot_fp8_reference
    }))(w, scales, block, x)
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2+FMA+F16C: an E4M3 byte sign-extended to 16 bits and shifted is an F16 of the same
    //! digits at 2^-8 of the value, which F16C widens to f32, 8 at a time.
    use std::arch::x86_64::*;

    pub fn dot_fp8_avx2_entry(w: &[u8], scales: &[f32], block: usize, x: &[f32]) -> f32 {
        // SAFETY: selected only when avx2, fma and f16c were detected.
        unsafe { dot_fp8_avx2(w, scales, block, x) }
    }

    /// The sign to bit 15 and the 7 exponent-and-mantissa bits to bits 13..7 of sign-extended
    /// bytes: F16 bits whose exponent field is E4M3's (F16's bias is 8 larger), so the value
    /// times 2^-8, exact for every code. E4M3's subnormals land on F16 subnormals, which widen
    /// to normal f32: no product takes an f32 subnormal (each costs an Intel core a microcode
    /// assist: decoding E4M3 straight into f32's exponent, whose subnormal codes stay
    /// subnormal, ran at 6 % of the memory's rate on a Xeon).
    const F16_MASK: i16 = 0xBF80u16 as i16;

    /// 8 E4M3 bytes -> 8 f32 at 2^-8 of their value.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode8(p: *const u8) -> __m256 {
        let v = _mm_cvtepi8_epi16(_mm_loadl_epi64(p as *const __m128i));
        _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16::<7>(v), _mm_set1_epi16(F16_MASK)))
    }

    /// 32 E4M3 bytes -> four vectors of 8 f32 at 2^-8 of their value, in input order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode32(p: *const u8) -> [__m256; 4] {
        let m = _mm256_set1_epi16(F16_MASK);
        let half = |q: *const u8| {
            let v = _mm256_cvtepi8_epi16(_mm_loadu_si128(q as *const __m128i));
            _mm256_and_si256(_mm256_slli_epi16::<7>(v), m)
        };
        let (h0, h1) = (half(p), half(p.add(16)));
        [
            _mm256_cvtph_ps(_mm256_castsi256_si128(h0)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h0)),
            _mm256_cvtph_ps(_mm256_castsi256_si128(h1)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h1)),
        ]
    }

    /// `super::prepare`: x times `X_FACTOR`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn prepare_avx2(x: &[f32]) -> Vec<f32> {
        let n = x.len();
        let mut xs = vec![0f32; n];
        let f = _mm256_set1_ps(super::X_FACTOR);
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(
                xs.as_mut_ptr().add(i),
                _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), f),
            );
            i += 8;
        }
        for j in i..n {
            xs[j] = x[j] * super::X_FACTOR;
        }
        xs
    }

    /// 32 weights at `wp` times their 32 inputs at `xp` into the four accumulators.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk32(wp: *const u8, xp: *const f32, acc: &mut [__m256; 4]) {
        let wk = decode32(wp);
        for k in 0..4 {
            acc[k] = _mm256_fmadd_ps(wk[k], _mm256_loadu_ps(xp.add(8 * k)), acc[k]);
        }
    }

    /// One row with its block scales: each block's four chains are summed and scaled at the
    /// block's end, the 2^8 the decode lacks with the scale (the path of blocks that are not a
    /// multiple of 32, and of `row_dot`).
    #[target_feature(enable = "avx2,fma,f16c")]
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
                chunk32(w.as_ptr().add(i), x.as_ptr().add(i), &mut acc);
                chunk32(w.as_ptr().add(i + 32), x.as_ptr().add(i + 32), &mut acc);
                i += 64;
            }
            if i + 32 <= end {
                chunk32(w.as_ptr().add(i), x.as_ptr().add(i), &mut acc);
                i += 32;
            }
            while i + 8 <= end {
                let wk = decode8(w.as_ptr().add(i));
                acc[0] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(x.as_ptr().add(i)), acc[0]);
                i += 8;
            }
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let scale = scales[b];
            let undo = _mm256_set1_ps(scale * super::X_FACTOR);
            if b % 2 == 0 {
                total0 = _mm256_fmadd_ps(sum, undo, total0);
            } else {
                total1 = _mm256_fmadd_ps(sum, undo, total1);
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
    /// in flight per pipe). The decoded weights' 2^-8 and the activation's 2^8 cancel.
    #[target_feature(enable = "avx2,fma,f16c")]
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
            chunk32(wp.add(i), xp.add(i), &mut lo);
            chunk32(wp.add(i + 32), xp.add(i + 32), &mut hi);
            i += 64;
        }
        if i + 32 <= n {
            chunk32(wp.add(i), xp.add(i), &mut lo);
            i += 32;
        }
        while i + 8 <= n {
            let wk = decode8(wp.add(i));
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
        crate::dot::hsum256(sum) + tail
    }
}

/// Factor of the activation prepared for [`rows_fp8_prepared`]: 2^8 (exact), what the SIMD
/// decode's weights (the value times 2^-8, see `x86::F16_MASK`) lack.
const X_FACTOR: f32 = 256.0;

/// The activation for [`rows_fp8_prepared`]: x times 2^8, in input order.
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
    x.iter().map(|v| v * X_FACTOR).collect()
}

/// An E4M3 byte at 2^-8 of its value (the bits of the SIMD decode, one byte): exact.
#[cfg(target_arch = "x86_64")]
pub(crate) fn e4m3_scaled(b: u8) -> f32 {
    half::f16::from_bits(((((b as i8) as i16) << 7) as u16) & 0xBF80).to_f32()
}

/// The prepared activation times the scale of each input's column block, for the rows of one
/// row block (`scales`: that row block's scales, one per `block` inputs).
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

/// Whether rows take the scaled-activation kernel (the SIMD one; any block width, the
/// activation being in input order).
#[cfg(target_arch = "x86_64")]
fn scaled_path(block: usize) -> bool {
    let _ = block;
    #[cfg(target_arch = "x86_64")]
    if crate::dot::has_avx2_fma_f16c() {
        return true;
    }
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
            let wide = crate::isa::isa() == crate::isa::Isa::Avx512;
            for (i, o) in out.iter_mut().enumerate() {
                let r = r0 + i;
                if r / block.0 != slot_rb {
                    slot_rb = r / block.0;
                    slot = scaled_slot(slots, next, act, row_scales(slot_rb), block.1);
                }
                let (row, xs) = (&w[r * n..(r + 1) * n], &slots[slot].values);
                // SAFETY: `isa()` found AVX-512 F (with AVX2, FMA, F16C) for the first,
                // `scaled_path` saw avx2, fma and f16c for the second.
                *o = unsafe {
                    if wide {
                        crate::avx512::dot_fp8_scaled(row, xs)
                    } else {
                        x86::dot_fp8_scaled_avx2(row, xs)
                    }
                };
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
            if n >= 32 {
                assert_eq!(want[10], x[10] * X_FACTOR);
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

    /// The SIMD decode's one-byte twin is every finite code's value times 2^-8, subnormal codes
    /// included (as normal f32: no product takes an f32 subnormal).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_scaled_decode_is_exact_and_never_subnormal() {
        for b in 0..=255u8 {
            if e4m3_to_f32(b).is_nan() {
                continue;
            }
            let v = e4m3_scaled(b);
            assert_eq!(v, e4m3_to_f32(b) / 256.0, "code {b:#04x}");
            assert!(v == 0.0 || v.is_normal(), "code {b:#04x}: {v}");
        }
    }
}
