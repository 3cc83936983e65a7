//! Dot products of an f32 activation with one weight row in its stored format. Each has a scalar
//! `*_reference` twin; the public function picks the fastest variant the CPU supports, once.

use std::sync::OnceLock;

type DotF32 = fn(&[f32], &[f32]) -> f32;
type DotU16 = fn(&[u16], &[f32]) -> f32;

/// Scalar reference: f32 weights.
pub fn dot_f32_reference(w: &[f32], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut acc = [0f32; 8];
    let chunks = w.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += w[c * 8 + l] * x[c * 8 + l];
        }
    }
    let mut sum = tree8(acc);
    for i in chunks * 8..w.len() {
        sum += w[i] * x[i];
    }
    sum
}

/// Scalar reference: BF16 weights (the top 16 bits of an f32).
pub fn dot_bf16_reference(w: &[u16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut acc = [0f32; 8];
    let chunks = w.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += bf16_to_f32(w[c * 8 + l]) * x[c * 8 + l];
        }
    }
    let mut sum = tree8(acc);
    for i in chunks * 8..w.len() {
        sum += bf16_to_f32(w[i]) * x[i];
    }
    sum
}

/// Scalar reference: F16 weights.
pub fn dot_f16_reference(w: &[u16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut acc = [0f32; 8];
    let chunks = w.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += half::f16::from_bits(w[c * 8 + l]).to_f32() * x[c * 8 + l];
        }
    }
    let mut sum = tree8(acc);
    for i in chunks * 8..w.len() {
        sum += half::f16::from_bits(w[i]).to_f32() * x[i];
    }
    sum
}

#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Whether the AVX2 kernels can run (they use AVX2, FMA and F16C).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma_f16c() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c")
}

/// How far ahead of the bytes being multiplied the SIMD kernels prefetch a row's weights. With
/// the hardware prefetcher alone the kernels that spend time decoding read weights from memory
/// about 14 % slower (a plain read without decoding does not need it); 1-8 KiB ahead measured
/// alike within this machine's noise (2 KiB chosen: well inside a row of real shapes).
pub const PREFETCH_AHEAD: usize = 2048;

/// Pairwise sum of 8 lanes in a fixed order (shared by the scalar and SIMD variants).
#[inline]
pub(crate) fn tree8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

pub fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotF32> = OnceLock::new();
    (IMPL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return x86::dot_f32_avx2_entry;
        }
        dot_f32_reference
    }))(w, x)
}

pub fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotU16> = OnceLock::new();
    (IMPL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return x86::dot_bf16_avx2_entry;
        }
        dot_bf16_reference
    }))(w, x)
}

pub fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotU16> = OnceLock::new();
    (IMPL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
        {
            return x86::dot_f16_avx2_entry;
        }
        dot_f16_reference
    }))(w, x)
}

/// Horizontal sum of an AVX register, in the same order as [`tree8`].
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
pub(crate) fn hsum256(v: std::arch::x86_64::__m256) -> f32 {
    let mut lanes = [0f32; 8];
    // SAFETY: the store writes 8 f32 into a local array of 8.
    unsafe { std::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), v) };
    tree8(lanes)
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2+FMA variants. Callers reach them only after feature detection.
    use std::arch::x86_64::*;

    use super::bf16_to_f32;

    use super::PREFETCH_AHEAD;

    /// Asks for the cache line `PREFETCH_AHEAD` bytes after `p` (a hint: never faults, even past
    /// the end of the weights).
    ///
    /// # Safety
    /// The CPU must have AVX2 (callers are AVX2 kernels).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn prefetch<T>(p: *const T) {
        _mm_prefetch::<_MM_HINT_T0>((p as *const i8).wrapping_add(PREFETCH_AHEAD))
    }

    /// [`prefetch`] for `base + offset` bytes, once per 64-byte line: loops that step through
    /// less than a line call it every step, and a repeated prefetch of the same line still
    /// costs a load slot.
    ///
    /// # Safety
    /// The CPU must have AVX2 (callers are AVX2 kernels).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn prefetch_line<T>(base: *const T, offset: usize) {
        if offset.is_multiple_of(64) {
            prefetch((base as *const u8).wrapping_add(offset))
        }
    }

    /// [`prefetch`] for the two 64-byte lines at `base + offset`, when `offset` is a multiple of
    /// 128. For the BF16 kernel, two adjacent lines asked for together every 128 bytes measured
    /// 89-97 % of a plain read from memory, one line every 64 bytes 76-84 % (paired runs, 2
    /// threads; the distance, 1-8 KiB, mattered less). The kernels that decode more per byte
    /// (FP8, INT4, MXFP4) measured 2-6 % slower with pairs, and keep one line per step.
    ///
    /// # Safety
    /// The CPU must have AVX2 (callers are AVX2 kernels).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn prefetch_lines<T>(base: *const T, offset: usize) {
        if offset.is_multiple_of(128) {
            let p = (base as *const u8).wrapping_add(offset);
            prefetch(p);
            prefetch(p.wrapping_add(64));
        }
    }

    pub fn dot_f32_avx2_entry(w: &[f32], x: &[f32]) -> f32 {
        // SAFETY: selected only when avx2 and fma were detected.
        unsafe { dot_f32_avx2(w, x) }
    }
    pub fn dot_bf16_avx2_entry(w: &[u16], x: &[f32]) -> f32 {
        // SAFETY: selected only when avx2 and fma were detected.
        unsafe { dot_bf16_avx2(w, x) }
    }
    pub fn dot_f16_avx2_entry(w: &[u16], x: &[f32]) -> f32 {
        // SAFETY: selected only when avx2, fma and f16c were detected.
        unsafe { dot_f16_avx2(w, x) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_f32_avx2(w: &[f32], x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len());
        let n = w.len();
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            prefetch(w.as_ptr().add(i));
            a0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(w.as_ptr().add(i)),
                _mm256_loadu_ps(x.as_ptr().add(i)),
                a0,
            );
            a1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(w.as_ptr().add(i + 8)),
                _mm256_loadu_ps(x.as_ptr().add(i + 8)),
                a1,
            );
            i += 16;
        }
        while i + 8 <= n {
            a0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(w.as_ptr().add(i)),
                _mm256_loadu_ps(x.as_ptr().add(i)),
                a0,
            );
            i += 8;
        }
        let mut sum = super::hsum256(_mm256_add_ps(a0, a1));
        while i < n {
            sum += w[i] * x[i];
            i += 1;
        }
        sum
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_bf16x8(p: *const u16) -> __m256 {
        let h = _mm_loadu_si128(p as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_bf16_avx2(w: &[u16], x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len());
        let n = w.len();
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            prefetch_lines(w.as_ptr(), 2 * i);
            a0 = _mm256_fmadd_ps(
                load_bf16x8(w.as_ptr().add(i)),
                _mm256_loadu_ps(x.as_ptr().add(i)),
                a0,
            );
            a1 = _mm256_fmadd_ps(
                load_bf16x8(w.as_ptr().add(i + 8)),
                _mm256_loadu_ps(x.as_ptr().add(i + 8)),
                a1,
            );
            i += 16;
        }
        while i + 8 <= n {
            a0 = _mm256_fmadd_ps(
                load_bf16x8(w.as_ptr().add(i)),
                _mm256_loadu_ps(x.as_ptr().add(i)),
                a0,
            );
            i += 8;
        }
        let mut sum = super::hsum256(_mm256_add_ps(a0, a1));
        while i < n {
            sum += bf16_to_f32(w[i]) * x[i];
            i += 1;
        }
        sum
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f16_avx2(w: &[u16], x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len());
        let n = w.len();
        let mut a0 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            prefetch_line(w.as_ptr(), 2 * i);
            let h = _mm_loadu_si128(w.as_ptr().add(i) as *const __m128i);
            a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(x.as_ptr().add(i)), a0);
            i += 8;
        }
        let mut sum = super::hsum256(a0);
        while i < n {
            sum += half::f16::from_bits(w[i]).to_f32() * x[i];
            i += 1;
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 23) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn close(a: f32, b: f32, n: usize) -> bool {
        // Reordered f32 sums of n terms of magnitude <= 1 differ by a few ulps per term.
        (a - b).abs() <= 1e-6 * n as f32 + 1e-6
    }

    #[test]
    fn simd_variants_match_scalar_reference_on_odd_lengths() {
        for n in [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 257, 1000] {
            let x = values(n, 1 + n as u64);
            let wf = values(n, 1000 + n as u64);
            let wb: Vec<u16> = wf.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
            let wh: Vec<u16> = wf.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect();
            assert!(
                close(dot_f32(&wf, &x), dot_f32_reference(&wf, &x), n),
                "f32 n={n}"
            );
            assert!(
                close(dot_bf16(&wb, &x), dot_bf16_reference(&wb, &x), n),
                "bf16 n={n}"
            );
            assert!(
                close(dot_f16(&wh, &x), dot_f16_reference(&wh, &x), n),
                "f16 n={n}"
            );
            let exact: f64 = wb
                .iter()
                .zip(&x)
                .map(|(w, x)| bf16_to_f32(*w) as f64 * *x as f64)
                .sum();
            assert!(
                close(dot_bf16_reference(&wb, &x), exact as f32, n),
                "bf16 vs f64 n={n}"
            );
        }
    }
}
