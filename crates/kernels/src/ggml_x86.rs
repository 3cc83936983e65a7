//! AVX2+FMA+F16C products on GGUF's block types ([`crate::ggml`]): each block decoded sixteen
//! weights at a time into registers, where up to four tokens' accumulators take their
//! multiply-adds. All but Q2_K and Q3_K have decoders written with intrinsics: codes unpacked
//! 16 or 32 at a time in bytes (table values through `pshufb`), widened to f32 and scaled by
//! exactly the operations of their scalar twins in [`crate::ggml_decode`] (the same f32 values
//! bit for bit: multiply, then subtract; no fused steps). The others use their scalar decoders,
//! inlined here and vectorized by the compiler.

use std::arch::x86_64::*;

use crate::ggml::BlockType;
use crate::ggml_decode::{self as dec, scale_min_k4, Decode, E2M1_DOUBLED, IQ4_VALUES};

/// A block type's decoder for this file's product.
pub trait DecodeX86: Decode {
    /// Gives the block at `b` (`BYTES` bytes) to `f` sixteen weights at a time, in order:
    /// `f(i, lo, hi)` with weights 16 i .. 16 i + 8 in `lo` and the next eight in `hi`.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `b` must be valid for the block.
    unsafe fn each16(b: *const u8, f: impl FnMut(usize, __m256, __m256));
}

macro_rules! scalar_decoder {
    ($($t:ty),*) => {$(
        impl DecodeX86 for $t {
            #[inline(always)]
            unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
                let mut buf = [0f32; 256];
                Self::decode(std::slice::from_raw_parts(b, Self::BYTES), &mut buf);
                for i in 0..Self::N / 16 {
                    f(i, _mm256_loadu_ps(buf.as_ptr().add(16 * i)), _mm256_loadu_ps(buf.as_ptr().add(16 * i + 8)));
                }
            }
        }
    )*};
}
scalar_decoder!(dec::Q2K, dec::Q3K);

#[inline(always)]
unsafe fn f16_at(b: *const u8) -> f32 {
    let bits = (b as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// 16 unsigned byte codes as f32 times `dl` minus `ml` (the scalar twins' order).
#[inline(always)]
unsafe fn u8x16(v: __m128i, dl: __m256, ml: __m256) -> (__m256, __m256) {
    let a = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    let b = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)));
    (
        _mm256_sub_ps(_mm256_mul_ps(dl, a), ml),
        _mm256_sub_ps(_mm256_mul_ps(dl, b), ml),
    )
}

/// 16 signed byte values as f32 times `dl`.
#[inline(always)]
unsafe fn i8x16(v: __m128i, dl: __m256) -> (__m256, __m256) {
    let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    let b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v)));
    (_mm256_mul_ps(dl, a), _mm256_mul_ps(dl, b))
}

/// 16 packed bytes as 32 nibble codes (weights 0-15 low, 16-31 high), each through `table`
/// (16 signed bytes), times `d`: weights 16 k .. 16 k + 16 to `f(first + k, ..)`.
#[inline(always)]
unsafe fn nibbles_through(
    qs: *const u8,
    table: __m128i,
    d: __m256,
    first: usize,
    f: &mut impl FnMut(usize, __m256, __m256),
) {
    let v = _mm_loadu_si128(qs as *const __m128i);
    let mask = _mm_set1_epi8(0x0F);
    let (a, b) = i8x16(_mm_shuffle_epi8(table, _mm_and_si128(v, mask)), d);
    f(first, a, b);
    let (a, b) = i8x16(
        _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(v), mask)),
        d,
    );
    f(first + 1, a, b);
}

#[inline(always)]
unsafe fn table_of(values: &[i8; 16]) -> __m128i {
    _mm_loadu_si128(values.as_ptr() as *const __m128i)
}

impl DecodeX86 for dec::Q4_0 {
    #[inline(always)]
    unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
        // The codes minus 8 as a table: entry q is q - 8.
        const MINUS_8: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];
        nibbles_through(b.add(2), table_of(&MINUS_8), _mm256_set1_ps(f16_at(b)), 0, &mut f)
    }
}

/// 16 packed bytes as 32 unsigned nibble codes (weights 0-15 low, 16-31 high), each with
/// `fifth` (16 bytes of 0 or 0x10 per weight, for weights 0-15 then 16-31 in `fifth.0/.1`)
/// added, times `d`, plus `m`: `f(0, ..)` and `f(1, ..)`. Without fifth bits, zeros.
#[inline(always)]
unsafe fn nibbles_scaled(
    qs: *const u8,
    fifth: (__m128i, __m128i),
    d: __m256,
    m: __m256,
    f: &mut impl FnMut(usize, __m256, __m256),
) {
    let v = _mm_loadu_si128(qs as *const __m128i);
    let mask = _mm_set1_epi8(0x0F);
    let neg_m = _mm256_xor_ps(m, _mm256_set1_ps(-0.0)); // -m exactly, signed zeros too
    let lo = _mm_or_si128(_mm_and_si128(v, mask), fifth.0);
    let hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16::<4>(v), mask), fifth.1);
    // x - (-m) is x + m exactly, the scalar twins' `d * q + m`.
    let (a, b) = u8x16(lo, d, neg_m);
    f(0, a, b);
    let (a, b) = u8x16(hi, d, neg_m);
    f(1, a, b);
}

/// Q5's 32 fifth bits (bit j: weight j) as bytes of 0 or 0x10: weights 0-15, then 16-31.
#[inline(always)]
unsafe fn fifth_bits(qh: u32) -> (__m128i, __m128i) {
    let all = _mm_set1_epi32(qh as i32);
    let bits = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    let spread = |sel: __m128i| {
        let b = _mm_and_si128(_mm_shuffle_epi8(all, sel), bits);
        _mm_and_si128(_mm_cmpeq_epi8(b, bits), _mm_set1_epi8(0x10))
    };
    (
        spread(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)),
        spread(_mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)),
    )
}

impl DecodeX86 for dec::Q4_1 {
    #[inline(always)]
    unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
        let (d, m) = (_mm256_set1_ps(f16_at(b)), _mm256_set1_ps(f16_at(b.add(2))));
        let none = (_mm_setzero_si128(), _mm_setzero_si128());
        nibbles_scaled(b.add(4), none, d, m, &mut f)
    }
}

impl DecodeX86 for dec::Q5_0 {
    #[inline(always)]
    unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
        // The codes minus 16 as signed bytes first, as the scalar twin's `d * (q - 16)`.
        let d = _mm256_set1_ps(f16_at(b));
        let (lo5, hi5) = fifth_bits((b.add(2) as *const u32).read_unaligned());
        let v = _mm_loadu_si128(b.add(6) as *const __m128i);
        let (mask, sixteen) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(16));
        let lo = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(v, mask), lo5), sixteen);
        let hi = _mm_sub_epi8(
            _mm_or_si128(_mm_and_si128(_mm_srli_epi16::<4>(v), mask), hi5),
            sixteen,
        );
        let (x, y) = i8x16(lo, d);
        f(0, x, y);
        let (x, y) = i8x16(hi, d);
        f(1, x, y);
    }
}

impl DecodeX86 for dec::Q5_1 {
    #[inline(always)]
    unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
        let (d, m) = (_mm256_set1_ps(f16_at(b)), _mm256_set1_ps(f16_at(b.add(2))));
        let fifth = fifth_bits((b.add(4) as *const u32).read_unaligned());
        nibbles_scaled(b.add(8), fifth, d, m, &mut f)
    }
}

impl DecodeX86 for dec::Iq4Nl {
    #[inline(always)]
    unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
        nibbles_through(
            b.add(2),
            table_of(&IQ4_VALUES),
            _mm256_set1_ps(f16_at(b)),
            0,
            &mut f,
        )
    }
}

impl DecodeX86 for dec::Mxfp4 {
    #[inline(always)]
    unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
        let d = _mm256_set1_ps(dec::e8m0_half(*b));
        nibbles_through(b.add(1), table_of(&E2M1_DOUBLED), d, 0, &mut f)
    }
}

impl DecodeX86 for dec::Iq4Xs {
    #[inline(always)]
    unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
        let d = f16_at(b);
        let scales_h = (b.add(2) as *const u16).read_unaligned();
        let (scales_l, qs) = (b.add(4), b.add(8));
        let table = table_of(&IQ4_VALUES);
        for s in 0..8 {
            let low = (*scales_l.add(s / 2) >> (4 * (s % 2))) & 0xF;
            let high = ((scales_h >> (2 * s)) & 3) as u8;
            let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
            nibbles_through(qs.add(16 * s), table, _mm256_set1_ps(dl), 2 * s, &mut f);
        }
    }
}

/// Q4_K's and Q5_K's sub-block `s` (32 codes 0..31 in `q`) with its scale and min.
#[inline(always)]
unsafe fn k4_sub_block(
    q: __m256i,
    sc: &[u8],
    s: usize,
    d: f32,
    dmin: f32,
    f: &mut impl FnMut(usize, __m256, __m256),
) {
    let (scale, min) = scale_min_k4(sc, s);
    let (dl, ml) = (
        _mm256_set1_ps(d * scale as f32),
        _mm256_set1_ps(dmin * min as f32),
    );
    let (a, b) = u8x16(_mm256_castsi256_si128(q), dl, ml);
    f(2 * s, a, b);
    let (a, b) = u8x16(_mm256_extracti128_si256::<1>(q), dl, ml);
    f(2 * s + 1, a, b);
}

impl DecodeX86 for dec::Q4K {
    #[inline(always)]
    unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
        let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
        let sc = std::slice::from_raw_parts(b.add(4), 12);
        let mask = _mm256_set1_epi8(0x0F);
        for c in 0..4 {
            let v = _mm256_loadu_si256(b.add(16 + 32 * c) as *const __m256i);
            k4_sub_block(_mm256_and_si256(v, mask), sc, 2 * c, d, dmin, &mut f);
            k4_sub_block(
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                sc,
                2 * c + 1,
                d,
                dmin,
                &mut f,
            );
        }
    }
}

impl DecodeX86 for dec::Q5K {
    #[inline(always)]
    unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
        let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
        let sc = std::slice::from_raw_parts(b.add(4), 12);
        let qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
        let (mask, one) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(1));
        let fifth = |s: usize| {
            _mm256_slli_epi16::<4>(_mm256_and_si256(
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s as i32)),
                one,
            ))
        };
        for c in 0..4 {
            let v = _mm256_loadu_si256(b.add(48 + 32 * c) as *const __m256i);
            let lo = _mm256_or_si256(_mm256_and_si256(v, mask), fifth(2 * c));
            k4_sub_block(lo, sc, 2 * c, d, dmin, &mut f);
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                fifth(2 * c + 1),
            );
            k4_sub_block(hi, sc, 2 * c + 1, d, dmin, &mut f);
        }
    }
}

/// Q6_K's 32 weights 128 h + 32 K + e: low nibbles `K / 2` of `low_bytes`, bits 2K of
/// `high_bytes`, minus 32, then the scales of their two sub-blocks of 16.
#[inline(always)]
unsafe fn q6k_part<const K: i32>(
    low_bytes: __m256i,
    high_bytes: __m256i,
    h: usize,
    d: f32,
    sc: *const i8,
    f: &mut impl FnMut(usize, __m256, __m256),
) {
    let (mask, three, off) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3), _mm256_set1_epi8(32));
    let low = if K >= 2 {
        _mm256_srli_epi16::<4>(low_bytes)
    } else {
        low_bytes
    };
    let low = _mm256_and_si256(low, mask);
    let high = match K {
        0 => high_bytes,
        1 => _mm256_srli_epi16::<2>(high_bytes),
        2 => _mm256_srli_epi16::<4>(high_bytes),
        _ => _mm256_srli_epi16::<6>(high_bytes),
    };
    let high = _mm256_slli_epi16::<4>(_mm256_and_si256(high, three));
    let q = _mm256_sub_epi8(_mm256_or_si256(low, high), off);
    let s = 8 * h + 2 * K as usize; // the first of its two sub-blocks of 16
    let (dl0, dl1) = (d * *sc.add(s) as f32, d * *sc.add(s + 1) as f32);
    let (a, b) = i8x16(_mm256_castsi256_si128(q), _mm256_set1_ps(dl0));
    f(s, a, b);
    let (a, b) = i8x16(_mm256_extracti128_si256::<1>(q), _mm256_set1_ps(dl1));
    f(s + 1, a, b);
}

impl DecodeX86 for dec::Q6K {
    #[inline(always)]
    unsafe fn each16(b: *const u8, mut f: impl FnMut(usize, __m256, __m256)) {
        let d = f16_at(b.add(208));
        let sc = b.add(192) as *const i8;
        for h in 0..2 {
            let high = _mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i);
            let low0 = _mm256_loadu_si256(b.add(64 * h) as *const __m256i);
            let low1 = _mm256_loadu_si256(b.add(64 * h + 32) as *const __m256i);
            q6k_part::<0>(low0, high, h, d, sc, &mut f);
            q6k_part::<1>(low1, high, h, d, sc, &mut f);
            q6k_part::<2>(low0, high, h, d, sc, &mut f);
            q6k_part::<3>(low1, high, h, d, sc, &mut f);
        }
    }
}

pub fn rows_tokens_entry(ty: BlockType, rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let tokens = xs.len();
    assert!(tokens > 0 && out.len().is_multiple_of(tokens));
    let n = xs[0].len();
    assert!(n.is_multiple_of(ty.block()) && xs.iter().all(|x| x.len() == n));
    assert!(row_bytes >= ty.row_bytes(n) && rows.len() >= out.len() / tokens * row_bytes);
    // SAFETY: selected only when AVX2, FMA and F16C were detected; the shapes are checked.
    unsafe { crate::ggml::with_decoder!(ty, rows_tokens, rows, row_bytes, xs, out) }
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C; the shapes are as [`rows_tokens_entry`] checks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_tokens<D: DecodeX86>(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let tokens = xs.len();
    let n = xs[0].len();
    for (i, o) in out.chunks_exact_mut(tokens).enumerate() {
        let row = rows.as_ptr().add(i * row_bytes);
        let mut t = 0;
        while t < tokens {
            let group = &xs[t..(t + 4).min(tokens)];
            let dst = &mut o[t..t + group.len()];
            match group.len() {
                1 => dst.copy_from_slice(&row_n::<D, 1>(row, n, [group[0]])),
                2 => dst.copy_from_slice(&row_n::<D, 2>(row, n, group.try_into().unwrap())),
                3 => dst.copy_from_slice(&row_n::<D, 3>(row, n, group.try_into().unwrap())),
                _ => dst.copy_from_slice(&row_n::<D, 4>(row, n, group.try_into().unwrap())),
            }
            t += group.len();
        }
    }
}

/// One row of `n` weights times T tokens: each block decoded once for all of them, sixteen
/// weights at a time into registers, every token's sum in the one-token steps (two
/// accumulators: each sixteen's first eight and last eight).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_n<D: DecodeX86, const T: usize>(row: *const u8, n: usize, xs: [&[f32]; T]) -> [f32; T] {
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..n / D::N {
        let block = row.add(b * D::BYTES);
        crate::dot::x86::prefetch(block);
        let base = b * D::N;
        D::each16(block, |i, lo, hi| {
            for t in 0..T {
                let x = xs[t].as_ptr().add(base + 16 * i);
                acc[t][0] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), acc[t][0]);
                acc[t][1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x.add(8)), acc[t][1]);
            }
        });
    }
    crate::dot::hsum256_n(&std::array::from_fn(|t| _mm256_add_ps(acc[t][0], acc[t][1])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::ALL;

    #[test]
    fn each_decoder_gives_its_scalar_twin_s_values_bit_for_bit() {
        if !crate::dot::has_avx2_fma_f16c() {
            eprintln!("no AVX2/FMA/F16C on this CPU");
            return;
        }
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for ty in ALL {
            let blocks = ty.random_blocks(64, || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s
            });
            for block in blocks.chunks_exact(ty.block_bytes()) {
                let (mut want, mut got) = ([0f32; 256], [0f32; 256]);
                ty.decode(block, &mut want);
                // SAFETY: AVX2/FMA/F16C checked above; the block and buffer are whole.
                unsafe { crate::ggml::with_decoder!(ty, decode_one, block, &mut got) };
                for j in 0..ty.block() {
                    assert_eq!(got[j].to_bits(), want[j].to_bits(), "{} weight {j}", ty.name());
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_one<D: DecodeX86>(block: &[u8], out: &mut [f32; 256]) {
        let at = out.as_mut_ptr();
        D::each16(block.as_ptr(), |i, lo, hi| {
            _mm256_storeu_ps(at.add(16 * i), lo);
            _mm256_storeu_ps(at.add(16 * i + 8), hi);
        })
    }
}
