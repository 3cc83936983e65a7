//! FP8 E4M3 weights with block scales (DeepSeek-V3 / Kimi K2 Instruct): `w = fp8 * scale[i/bo, j/bi]`.
//! Blocks at the right and bottom edges are partial (DeepSeek's semantics: the scale grid is
//! ceil(out/bo) x ceil(in/bi)). The dot product decodes inside the loop; nothing is dequantized
//! into a temporary.

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
    //! AVX2+FMA+F16C: an E4M3 byte moved into F16 bit positions is the same value times 2^-8
    //! (normals and subnormals alike), so `cvtph` decodes 8 at a time and the 2^8 joins the scale.
    use std::arch::x86_64::*;

    pub fn dot_fp8_avx2_entry(w: &[u8], scales: &[f32], block: usize, x: &[f32]) -> f32 {
        // SAFETY: selected only when avx2, fma and f16c were detected.
        unsafe { dot_fp8_avx2(w, scales, block, x) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode8(p: *const u8) -> __m256 {
        let b = _mm_cvtepu8_epi16(_mm_loadl_epi64(p as *const __m128i));
        let sign = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
        let mag = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7);
        _mm256_cvtph_ps(_mm_or_si128(sign, mag))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_fp8_avx2(w: &[u8], scales: &[f32], block: usize, x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len());
        let n = w.len();
        let mut total = _mm256_setzero_ps();
        let mut tail = 0f32;
        let t = super::table();
        let mut start = 0;
        let mut b = 0;
        while start < n {
            let end = (start + block).min(n);
            let mut acc = _mm256_setzero_ps();
            let mut i = start;
            while i + 8 <= end {
                acc = _mm256_fmadd_ps(
                    decode8(w.as_ptr().add(i)),
                    _mm256_loadu_ps(x.as_ptr().add(i)),
                    acc,
                );
                i += 8;
            }
            let scale = scales[b];
            total = _mm256_fmadd_ps(acc, _mm256_set1_ps(scale * 256.0), total);
            let mut s = 0f32;
            while i < end {
                s += t[w[i] as usize] * x[i];
                i += 1;
            }
            tail += s * scale;
            start = end;
            b += 1;
        }
        crate::dot::hsum256(total) + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
