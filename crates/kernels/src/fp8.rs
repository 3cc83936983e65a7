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

    /// 16 E4M3 bytes -> two vectors of 8 f32 (times 2^-8): each byte goes to the high half of
    /// a 16-bit lane (sign at bit 15), an arithmetic shift moves the magnitude to F16's place and
    /// the mask clears the copied sign bit.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode16(p: *const u8) -> (__m256, __m256) {
        let b = _mm_loadu_si128(p as *const __m128i);
        let z = _mm_setzero_si128();
        let mask = _mm_set1_epi16(0xbf80u16 as i16);
        let lo = _mm_and_si128(_mm_srai_epi16(_mm_unpacklo_epi8(z, b), 1), mask);
        let hi = _mm_and_si128(_mm_srai_epi16(_mm_unpackhi_epi8(z, b), 1), mask);
        (_mm256_cvtph_ps(lo), _mm256_cvtph_ps(hi))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_fp8_avx2(w: &[u8], scales: &[f32], block: usize, x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len());
        assert!(scales.len() * block >= w.len());
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
            while i + 32 <= end {
                let (w0, w1) = decode16(w.as_ptr().add(i));
                let (w2, w3) = decode16(w.as_ptr().add(i + 16));
                let xp = x.as_ptr().add(i);
                acc[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp), acc[0]);
                acc[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(8)), acc[1]);
                acc[2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xp.add(16)), acc[2]);
                acc[3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xp.add(24)), acc[3]);
                i += 32;
            }
            while i + 16 <= end {
                let (w0, w1) = decode16(w.as_ptr().add(i));
                acc[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x.as_ptr().add(i)), acc[0]);
                acc[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x.as_ptr().add(i + 8)), acc[1]);
                i += 16;
            }
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let scale = scales[b];
            if b % 2 == 0 {
                total0 = _mm256_fmadd_ps(sum, _mm256_set1_ps(scale * 256.0), total0);
            } else {
                total1 = _mm256_fmadd_ps(sum, _mm256_set1_ps(scale * 256.0), total1);
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
