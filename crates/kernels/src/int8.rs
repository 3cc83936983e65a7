//! INT8 weights with one scale per output row: `w = q * scale[r]` (a common way to shrink the
//! resident non-expert weights).

use std::sync::OnceLock;

/// Scalar reference: one row.
pub fn dot_int8_reference(w: &[i8], scale: f32, x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut acc = [0f32; 8];
    let n8 = w.len() / 8 * 8;
    for c in (0..n8).step_by(8) {
        for l in 0..8 {
            acc[l] += w[c + l] as f32 * x[c + l];
        }
    }
    let mut s = crate::dot::tree8(acc);
    for i in n8..w.len() {
        s += w[i] as f32 * x[i];
    }
    s * scale
}

type DotInt8 = fn(&[i8], f32, &[f32]) -> f32;

pub fn dot_int8(w: &[i8], scale: f32, x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotInt8> = OnceLock::new();
    (IMPL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if crate::dot::has_avx2_fma_f16c() {
            return x86::dot_int8_avx2_entry;
        }
        dot_int8_reference
    }))(w, scale, x)
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2+FMA: sign-extend 8 bytes to 8 lanes, convert, multiply-add.
    use std::arch::x86_64::*;

    pub fn dot_int8_avx2_entry(w: &[i8], scale: f32, x: &[f32]) -> f32 {
        // SAFETY: selected only when avx2 and fma were detected.
        unsafe { dot_int8_avx2(w, scale, x) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_int8_avx2(w: &[i8], scale: f32, x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len());
        let n = w.len();
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            crate::dot::x86::prefetch_line(w.as_ptr(), i);
            let b = _mm_loadu_si128(w.as_ptr().add(i) as *const __m128i);
            let w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
            let w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
            a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x.as_ptr().add(i)), a0);
            a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x.as_ptr().add(i + 8)), a1);
            i += 16;
        }
        let mut s = crate::dot::hsum256(_mm256_add_ps(a0, a1));
        while i < n {
            s += w[i] as f32 * x[i];
            i += 1;
        }
        s * scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_hand_computed_values() {
        let w: Vec<i8> = vec![-128, -1, 0, 1, 127, 64, -64, 2, 3];
        let x = vec![1.0f32; 9];
        let sum: i32 = w.iter().map(|&v| v as i32).sum();
        assert_eq!(dot_int8_reference(&w, 0.5, &x), sum as f32 * 0.5);
        assert_eq!(dot_int8(&w, 0.5, &x), sum as f32 * 0.5);
        let mut one_hot = vec![0f32; 9];
        one_hot[0] = 1.0;
        assert_eq!(dot_int8(&w, 2f32.powi(-20), &one_hot), -128.0 * 2f32.powi(-20));
    }
}
