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

/// Whether the AVX2 kernels may run (the CPU has AVX2, FMA and F16C, and `STRATA_ISA` does not
/// ask for the scalar twins).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma_f16c() -> bool {
    crate::isa::isa() >= crate::isa::Isa::Avx2
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

/// The variant of one-token product `isa()` picks.
macro_rules! pick {
    ($avx512:path, $avx2:path, $neon:path, $reference:path) => {{
        #[cfg(target_arch = "x86_64")]
        match crate::isa::isa() {
            crate::isa::Isa::Avx512 => return $avx512,
            crate::isa::Isa::Avx2 => return $avx2,
            _ => {}
        }
        #[cfg(target_arch = "aarch64")]
        if crate::isa::isa() == crate::isa::Isa::Neon {
            return $neon;
        }
        $reference
    }};
}
pub(crate) use pick;

pub fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotF32> = OnceLock::new();
    (IMPL.get_or_init(|| {
        pick!(
            crate::avx512::dot_f32_entry,
            x86::dot_f32_avx2_entry,
            crate::neon::dot_f32_entry,
            dot_f32_reference
        )
    }))(w, x)
}

pub fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotU16> = OnceLock::new();
    (IMPL.get_or_init(|| {
        pick!(
            crate::avx512::dot_bf16_entry,
            x86::dot_bf16_avx2_entry,
            crate::neon::dot_bf16_entry,
            dot_bf16_reference
        )
    }))(w, x)
}

pub fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotU16> = OnceLock::new();
    (IMPL.get_or_init(|| {
        pick!(
            crate::avx512::dot_f16_entry,
            x86::dot_f16_avx2_entry,
            crate::neon::dot_f16_entry,
            dot_f16_reference
        )
    }))(w, x)
}

/// `out[i * T + t] = dot(row i of w, xs[t])` for the rows of `w` (each `in_dim` wide) and the T
/// tokens of `xs`, bit for bit what each token gets alone (batch invariance): the SIMD variant
/// multiplies each weight vector into up to four tokens per load; the scalar one runs the
/// reference per token.
macro_rules! tokens_entry {
    ($name:ident, $elem:ty, $reference:ident, $simd:ident, $simd512:ident) => {
        pub fn $name(w: &[$elem], in_dim: usize, xs: &[&[f32]], out: &mut [f32]) {
            let tokens = xs.len();
            assert!(in_dim > 0 && w.len().is_multiple_of(in_dim));
            assert_eq!(out.len(), w.len() / in_dim * tokens);
            #[cfg(target_arch = "x86_64")]
            match crate::isa::isa() {
                // SAFETY: `isa()` found the features each kernel needs.
                crate::isa::Isa::Avx512 => {
                    return unsafe { crate::avx512::$simd512(w, None, in_dim, xs, out) }
                }
                // SAFETY: as above.
                crate::isa::Isa::Avx2 => return unsafe { x86::$simd(w, in_dim, xs, out) },
                _ => {}
            }
            #[cfg(target_arch = "aarch64")]
            if crate::isa::isa() == crate::isa::Isa::Neon {
                // SAFETY: every aarch64 CPU has NEON.
                return unsafe { crate::neon::$simd(w, None, in_dim, xs, out) };
            }
            for (row, o) in w.chunks_exact(in_dim).zip(out.chunks_exact_mut(tokens)) {
                for (v, x) in o.iter_mut().zip(xs) {
                    *v = $reference(row, x);
                }
            }
        }
    };
}

tokens_entry!(rows_f32_tokens, f32, dot_f32_reference, tokens_f32, tokens_f32);
tokens_entry!(
    rows_bf16_tokens,
    u16,
    dot_bf16_reference,
    tokens_bf16,
    tokens_bf16
);
tokens_entry!(rows_f16_tokens, u16, dot_f16_reference, tokens_f16, tokens_f16);

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

/// [`hsum256`] of each of N (at most 8) vectors, side by side: the same pairs added in the same
/// order (so the same bits), a few shuffles and adds for all of them instead of a store and seven
/// dependent scalar adds each. Levels, as in [`tree8`]: lane i + lane i + 4 (two tokens' halves
/// per vector), then adjacent pairs twice (`hadd`, which leaves tokens 0, 2, 4, 6 in the low
/// half and 1, 3, 5, 7 in the high one).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
pub(crate) fn hsum256_n<const N: usize>(v: &[std::arch::x86_64::__m256; N]) -> [f32; N] {
    use std::arch::x86_64::*;
    const LANE_OF: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
    assert!(N <= 8);
    let mut out = [0f32; N];
    if N == 1 {
        out[0] = hsum256(v[0]);
        return out;
    }
    let at = |t: usize| if t < N { v[t] } else { _mm256_setzero_ps() };
    #[inline]
    #[target_feature(enable = "avx")]
    fn halves(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    }
    let q0 = _mm256_hadd_ps(halves(at(0), at(1)), halves(at(2), at(3)));
    let q1 = if N > 4 {
        _mm256_hadd_ps(halves(at(4), at(5)), halves(at(6), at(7)))
    } else {
        _mm256_setzero_ps()
    };
    let mut lanes = [0f32; 8];
    // SAFETY: the store writes 8 f32 into a local array of 8.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_hadd_ps(q0, q1)) };
    for (t, o) in out.iter_mut().enumerate() {
        *o = lanes[LANE_OF[t]];
    }
    out
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

    /// [`prefetch`] for `base + offset` bytes.
    ///
    /// # Safety
    /// The CPU must have AVX2 (callers are AVX2 kernels).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn prefetch_at<T>(base: *const T, offset: usize) {
        prefetch((base as *const u8).wrapping_add(offset))
    }

    /// The prefetches of a two-row pass at byte `offset` of rows `p` and `q = p + rb` (contiguous):
    /// two lines [`PREFETCH_AHEAD`] bytes ahead of each row's position in the order the rows are
    /// read (pairs of rows one after the other), so once the distance runs past the pair's rows it
    /// asks for the next pair's two rows rather than the second row again.
    ///
    /// # Safety
    /// The CPU must have AVX2 (callers are AVX2 and AVX-512 kernels).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn pair_prefetch<T>(p: *const T, q: *const T, offset: usize, rb: usize) {
        if offset.is_multiple_of(128) {
            let ahead = offset + PREFETCH_AHEAD;
            let (a, b) = if ahead < rb {
                (
                    (p as *const u8).wrapping_add(ahead),
                    (q as *const u8).wrapping_add(ahead),
                )
            } else {
                let a = (q as *const u8).wrapping_add(ahead);
                (a, a.wrapping_add(rb))
            };
            for l in [a, b] {
                _mm_prefetch::<_MM_HINT_T0>(l as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(l.wrapping_add(64) as *const i8);
            }
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

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_f32x8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_bf16x8(p: *const u16) -> __m256 {
        let h = _mm_loadu_si128(p as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16x8(p: *const u16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    #[inline]
    fn widen_f32(v: f32) -> f32 {
        v
    }

    #[inline]
    fn widen_f16(v: u16) -> f32 {
        half::f16::from_bits(v).to_f32()
    }

    /// One weight row against N activations: `out[t]` is, bit for bit, what the row gives
    /// token t alone (N = 1 is the one-token kernel itself): each weight vector is loaded and
    /// widened once and multiplied into every token's accumulators, each token's sum in the
    /// same order whatever N is. `PAIR`: two accumulators per token over 16-wide steps (the
    /// formats whose decode is cheap), else one over 8-wide steps. Several-token products
    /// ([`dense_tokens`]) advance a block of rows a slice of inputs at a time, each row's sums
    /// kept between slices (the same steps in the same order).
    macro_rules! dense_rows {
        ($name:ident, $steps:ident, $finish:ident, $two:ident, $elem:ty, $features:literal, $load:ident, $widen:ident, $prefetch:ident, $pair:literal) => {
            /// One token against two rows `w[..n]` and `w[n..2n]` side by side: each row's
            /// steps and finish are the one-row kernel's with one token (the same bits), but
            /// the two rows' sums advance together (twice the independent additions in flight)
            /// and each activation vector is loaded once for both.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $two(w: &[$elem], x: &[f32]) -> [f32; 2] {
                let n = x.len();
                assert_eq!(w.len(), 2 * n);
                let (r0, r1) = w.split_at(n);
                let step = if $pair { 16 } else { 8 };
                let end = n / step * step;
                let z = _mm256_setzero_ps();
                let (mut a0, mut a1, mut b0, mut b1) = (z, z, z, z);
                let (p, q, xp) = (r0.as_ptr(), r1.as_ptr(), x.as_ptr());
                let rb = std::mem::size_of_val(r0);
                let mut i = 0;
                while i < end {
                    pair_prefetch(p, q, std::mem::size_of::<$elem>() * i, rb);
                    let x0 = _mm256_loadu_ps(xp.add(i));
                    a0 = _mm256_fmadd_ps($load(p.add(i)), x0, a0);
                    b0 = _mm256_fmadd_ps($load(q.add(i)), x0, b0);
                    if $pair {
                        let x1 = _mm256_loadu_ps(xp.add(i + 8));
                        a1 = _mm256_fmadd_ps($load(p.add(i + 8)), x1, a1);
                        b1 = _mm256_fmadd_ps($load(q.add(i + 8)), x1, b1);
                    }
                    i += step;
                }
                let xs = [x];
                let ya = $finish::<1>(r0, &xs, end, [a0], [a1]);
                let yb = $finish::<1>(r1, &xs, end, [b0], [b1]);
                [ya[0], yb[0]]
            }

            /// The steps over `w[from..to]` (`to - from` a multiple of the step) into each
            /// token's sums, in input order.
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $steps<const N: usize>(
                w: &[$elem],
                xs: &[&[f32]; N],
                from: usize,
                to: usize,
                a0: &mut [__m256; N],
                a1: &mut [__m256; N],
            ) {
                let mut i = from;
                while i < to {
                    $prefetch(w.as_ptr(), std::mem::size_of::<$elem>() * i);
                    let w0 = $load(w.as_ptr().add(i));
                    if $pair {
                        let w1 = $load(w.as_ptr().add(i + 8));
                        for t in 0..N {
                            let x = xs[t].as_ptr();
                            a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x.add(i)), a0[t]);
                            a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x.add(i + 8)), a1[t]);
                        }
                        i += 16;
                    } else {
                        for t in 0..N {
                            a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs[t].as_ptr().add(i)), a0[t]);
                        }
                        i += 8;
                    }
                }
            }

            /// After the steps up to `steps_end`: (PAIR) one 8-wide step, the sums reduced, the
            /// scalar tail.
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $finish<const N: usize>(
                w: &[$elem],
                xs: &[&[f32]; N],
                steps_end: usize,
                mut a0: [__m256; N],
                a1: [__m256; N],
            ) -> [f32; N] {
                let n = w.len();
                let mut i = steps_end;
                if $pair && i + 8 <= n {
                    let w0 = $load(w.as_ptr().add(i));
                    for t in 0..N {
                        a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs[t].as_ptr().add(i)), a0[t]);
                    }
                    i += 8;
                }
                let v: [__m256; N] = std::array::from_fn(|t| {
                    if $pair {
                        _mm256_add_ps(a0[t], a1[t])
                    } else {
                        a0[t]
                    }
                });
                let mut out = super::hsum256_n(&v);
                for (t, sum) in out.iter_mut().enumerate() {
                    for j in i..n {
                        *sum += $widen(w[j]) * xs[t][j];
                    }
                }
                out
            }

            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const N: usize>(w: &[$elem], xs: [&[f32]; N]) -> [f32; N] {
                for x in xs {
                    assert_eq!(x.len(), w.len());
                }
                let step = if $pair { 16 } else { 8 };
                let end = w.len() / step * step;
                let (mut a0, mut a1) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
                $steps::<N>(w, &xs, 0, end, &mut a0, &mut a1);
                $finish::<N>(w, &xs, end, a0, a1)
            }
        };
    }

    dense_rows!(
        rows_f32_n,
        steps_f32,
        finish_f32,
        two_f32,
        f32,
        "avx2,fma",
        load_f32x8,
        widen_f32,
        prefetch_at,
        true
    );
    dense_rows!(
        rows_bf16_n,
        steps_bf16,
        finish_bf16,
        two_bf16,
        u16,
        "avx2,fma",
        load_bf16x8,
        bf16_to_f32,
        prefetch_lines,
        true
    );
    dense_rows!(
        rows_f16_n,
        steps_f16,
        finish_f16,
        two_f16,
        u16,
        "avx2,fma,f16c",
        load_f16x8,
        widen_f16,
        prefetch_line,
        false
    );

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_f32_avx2(w: &[f32], x: &[f32]) -> f32 {
        rows_f32_n::<1>(w, [x])[0]
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_bf16_avx2(w: &[u16], x: &[f32]) -> f32 {
        rows_bf16_n::<1>(w, [x])[0]
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f16_avx2(w: &[u16], x: &[f32]) -> f32 {
        rows_f16_n::<1>(w, [x])[0]
    }

    /// Inputs per slice of a several-token product, and rows whose sums are kept at once.
    const SLICE: usize = 512;
    const ROW_BLOCK: usize = 16;

    /// `out[i * T + t] = dot(w row i, xs[t])` for the rows of `w` (`in_dim` wide) and the T
    /// tokens of `xs`: four tokens per pass over a row (then three, two, one), blocks of
    /// [`ROW_BLOCK`] rows advancing [`SLICE`] inputs at a time so the slice of the tokens'
    /// activations stays in the nearest cache.
    macro_rules! dense_tokens {
        ($name:ident, $group:ident, $elem:ty, $features:literal, $steps:ident, $finish:ident, $one:ident, $two:ident, $pair:literal) => {
            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn $group<const N: usize>(
                w: &[$elem],
                in_dim: usize,
                xs: [&[f32]; N],
                r0: usize,
                rows: usize,
                out: &mut [f32],
                tokens: usize,
                t0: usize,
            ) {
                for x in xs {
                    assert_eq!(x.len(), in_dim);
                }
                let step = if $pair { 16 } else { 8 };
                let end = in_dim / step * step;
                let zero = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
                // Only the block's rows get sums (zeroing all ROW_BLOCK would cost a one-row call more
                // than its products).
                let mut acc = [std::mem::MaybeUninit::<([__m256; N], [__m256; N])>::uninit(); ROW_BLOCK];
                for a in acc.iter_mut().take(rows) {
                    a.write(zero);
                }
                let row = |r: usize| &w[(r0 + r) * in_dim..(r0 + r + 1) * in_dim];
                let mut k = 0;
                while k < end {
                    let stop = (k + SLICE).min(end);
                    for (r, a) in acc.iter_mut().enumerate().take(rows) {
                        // SAFETY: the first `rows` entries were written above.
                        let (a0, a1) = a.assume_init_mut();
                        $steps::<N>(row(r), &xs, k, stop, a0, a1);
                    }
                    k = stop;
                }
                for (r, a) in acc.iter().enumerate().take(rows) {
                    // SAFETY: as above.
                    let (a0, a1) = a.assume_init();
                    let o = &mut out[(r0 + r) * tokens + t0..(r0 + r) * tokens + t0 + N];
                    o.copy_from_slice(&$finish::<N>(row(r), &xs, end, a0, a1));
                }
            }

            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name(w: &[$elem], in_dim: usize, xs: &[&[f32]], out: &mut [f32]) {
                let tokens = xs.len();
                let rows = w.len() / in_dim.max(1);
                assert_eq!(out.len(), rows * tokens);
                if tokens == 1 {
                    let x = xs[0];
                    return crate::row_pairs(
                        out,
                        |r| $two(&w[r * in_dim..(r + 2) * in_dim], x),
                        |r| $one::<1>(&w[r * in_dim..(r + 1) * in_dim], [x])[0],
                    );
                }
                let mut t = 0;
                while t < tokens {
                    let take = (tokens - t).min(4);
                    let g = &xs[t..t + take];
                    let mut r0 = 0;
                    while r0 < rows {
                        let n = (rows - r0).min(ROW_BLOCK);
                        match take {
                            1 => $group::<1>(w, in_dim, [g[0]], r0, n, out, tokens, t),
                            2 => $group::<2>(w, in_dim, [g[0], g[1]], r0, n, out, tokens, t),
                            3 => $group::<3>(w, in_dim, [g[0], g[1], g[2]], r0, n, out, tokens, t),
                            _ => $group::<4>(w, in_dim, [g[0], g[1], g[2], g[3]], r0, n, out, tokens, t),
                        }
                        r0 += n;
                    }
                    t += take;
                }
            }
        };
    }

    dense_tokens!(tokens_f32, group_f32, f32, "avx2,fma", steps_f32, finish_f32, rows_f32_n, two_f32, true);
    dense_tokens!(
        tokens_bf16,
        group_bf16,
        u16,
        "avx2,fma",
        steps_bf16,
        finish_bf16,
        rows_bf16_n,
        two_bf16,
        true
    );
    dense_tokens!(
        tokens_f16,
        group_f16,
        u16,
        "avx2,fma,f16c",
        steps_f16,
        finish_f16,
        rows_f16_n,
        two_f16,
        false
    );
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
