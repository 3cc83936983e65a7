//! The value side of attention: a head's output as the attention weights times the cached value
//! rows. Each output element is summed over the positions in order from zero, one multiply and one
//! add per term (never a fused multiply-add), so every SIMD variant gives its scalar twin's bits
//! and a token's output never depends on how heads or tokens were split over threads.

/// `out[d] = sum over p of w[p] * values[p * stride + d]` for `d < out.len()`, positions in order.
/// Scalar twin of the SIMD variants (the same bits).
pub fn weighted_sum_reference(w: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
    check(w, values, stride, out);
    for (d, o) in out.iter_mut().enumerate() {
        let mut acc = 0f32;
        for (p, a) in w.iter().enumerate() {
            acc += a * values[p * stride + d];
        }
        *o = acc;
    }
}

fn check(w: &[f32], values: &[f32], stride: usize, out: &[f32]) {
    assert!(
        w.is_empty() || values.len() >= (w.len() - 1) * stride + out.len(),
        "{} values cannot hold {} rows of stride {stride}",
        values.len(),
        w.len()
    );
}

/// [`weighted_sum_reference`] on the CPU's SIMD (AVX-512, AVX2 or NEON), else the reference
/// itself.
pub fn weighted_sum(w: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
    check(w, values, stride, out);
    #[cfg(target_arch = "x86_64")]
    if crate::isa::isa() == crate::isa::Isa::Avx512 {
        // SAFETY: `isa()` found AVX-512 F; `check` bounds every row read.
        return unsafe { x86::weighted_sum_avx512(w, values, stride, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::isa::isa() >= crate::isa::Isa::Avx2 {
        // SAFETY: `isa()` found AVX2; `check` bounds every row read.
        return unsafe { x86::weighted_sum_avx2(w, values, stride, out) };
    }
    #[cfg(target_arch = "aarch64")]
    if crate::isa::isa() == crate::isa::Isa::Neon {
        // SAFETY: every aarch64 CPU has NEON; `check` bounds every row read.
        return unsafe { crate::neon::weighted_sum(w, values, stride, out) };
    }
    weighted_sum_reference(w, values, stride, out)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Eight 16-lane sums at a time (128 outputs: a whole head of 128 in one pass over the
    /// positions), then one, then the AVX2 variant for the rest.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weighted_sum_avx512(w: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
        let (n, v) = (out.len(), values.as_ptr());
        let mut d = 0;
        while d + 128 <= n {
            let mut acc = [_mm512_setzero_ps(); 8];
            for (p, &a) in w.iter().enumerate() {
                let (a, row) = (_mm512_set1_ps(a), v.add(p * stride + d));
                for (k, s) in acc.iter_mut().enumerate() {
                    *s = _mm512_add_ps(*s, _mm512_mul_ps(a, _mm512_loadu_ps(row.add(16 * k))));
                }
            }
            for (k, s) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(d + 16 * k), *s);
            }
            d += 128;
        }
        while d + 16 <= n {
            let mut s = _mm512_setzero_ps();
            for (p, &a) in w.iter().enumerate() {
                let x = _mm512_loadu_ps(v.add(p * stride + d));
                s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(a), x));
            }
            _mm512_storeu_ps(out.as_mut_ptr().add(d), s);
            d += 16;
        }
        if d < n {
            // The columns from d: the same rows, `d` further on.
            weighted_sum_avx2(w, values.get(d..).unwrap_or(&[]), stride, &mut out[d..]);
        }
    }

    /// Eight 8-lane sums at a time (64 outputs), then one, then the scalar tail.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn weighted_sum_avx2(w: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
        let (n, v) = (out.len(), values.as_ptr());
        let mut d = 0;
        while d + 64 <= n {
            let mut acc = [_mm256_setzero_ps(); 8];
            for (p, &a) in w.iter().enumerate() {
                let (a, row) = (_mm256_set1_ps(a), v.add(p * stride + d));
                for (k, s) in acc.iter_mut().enumerate() {
                    *s = _mm256_add_ps(*s, _mm256_mul_ps(a, _mm256_loadu_ps(row.add(8 * k))));
                }
            }
            for (k, s) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(d + 8 * k), *s);
            }
            d += 64;
        }
        while d + 8 <= n {
            let mut s = _mm256_setzero_ps();
            for (p, &a) in w.iter().enumerate() {
                let x = _mm256_loadu_ps(v.add(p * stride + d));
                s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(a), x));
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(d), s);
            d += 8;
        }
        for (d, o) in out.iter_mut().enumerate().skip(d) {
            let mut acc = 0f32;
            for (p, a) in w.iter().enumerate() {
                acc += a * *v.add(p * stride + d);
            }
            *o = acc;
        }
    }
}
