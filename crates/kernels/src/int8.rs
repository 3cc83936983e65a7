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

/// Quantizes one row to INT8 with one scale: `scale = max|x| / 127`, `q = round(x / scale)`, so
/// every weight is within half a step (`scale / 2`) of its value and the row's largest keeps
/// its magnitude exactly; an all-zero row gets scale 0 (and zeros). Non-finite weights are an
/// error (no scale can hold them).
pub fn quantize_row(x: &[f32], q: &mut [i8]) -> Result<f32, String> {
    debug_assert_eq!(x.len(), q.len());
    let mut max = 0f32;
    for &v in x {
        if !v.is_finite() {
            return Err(format!("a weight is {v}: INT8 cannot hold it"));
        }
        max = max.max(v.abs());
    }
    if max == 0.0 {
        q.fill(0);
        return Ok(0.0);
    }
    let scale = max / 127.0;
    let inv = 127.0 / max;
    for (o, &v) in q.iter_mut().zip(x) {
        *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    Ok(scale)
}

type DotInt8 = fn(&[i8], f32, &[f32]) -> f32;

pub fn dot_int8(w: &[i8], scale: f32, x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotInt8> = OnceLock::new();
    (IMPL.get_or_init(|| {
        crate::dot::pick!(
            crate::avx512::dot_int8_entry,
            x86::dot_int8_avx2_entry,
            crate::neon::dot_int8_entry,
            dot_int8_reference
        )
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
        rows_int8_n::<1>(w, scale, [x])[0]
    }

    /// One row against N activations, each token's sum in the one-token order (N = 1 is the
    /// one-token kernel): each 16 weights are widened once for every token.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_int8_n<const N: usize>(w: &[i8], scale: f32, xs: [&[f32]; N]) -> [f32; N] {
        let n = w.len();
        for x in xs {
            assert_eq!(x.len(), n);
        }
        let (mut a0, mut a1) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
        let mut i = 0;
        while i + 16 <= n {
            crate::dot::x86::prefetch_line(w.as_ptr(), i);
            let b = _mm_loadu_si128(w.as_ptr().add(i) as *const __m128i);
            let w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
            let w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
            for t in 0..N {
                let x = xs[t].as_ptr();
                a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x.add(i)), a0[t]);
                a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x.add(i + 8)), a1[t]);
            }
            i += 16;
        }
        let v: [__m256; N] = std::array::from_fn(|t| _mm256_add_ps(a0[t], a1[t]));
        let mut out = crate::dot::hsum256_n(&v);
        for (t, s) in out.iter_mut().enumerate() {
            for j in i..n {
                *s += w[j] as f32 * xs[t][j];
            }
            *s *= scale;
        }
        out
    }

    /// One token against two rows side by side (`w` both rows, `scales` theirs): each row's
    /// steps and sums those of [`rows_int8_n`] with one token (the same bits), the two rows'
    /// additions in flight together and each activation vector loaded once for both.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_int8_two(w: &[i8], scales: [f32; 2], x: &[f32]) -> [f32; 2] {
        let n = x.len();
        assert_eq!(w.len(), 2 * n);
        let (r0, r1) = w.split_at(n);
        let (p, q, xp) = (r0.as_ptr(), r1.as_ptr(), x.as_ptr());
        let widen = |b: __m128i| {
            (
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))),
            )
        };
        let z = _mm256_setzero_ps();
        let (mut a0, mut a1, mut b0, mut b1) = (z, z, z, z);
        let mut i = 0;
        while i + 16 <= n {
            crate::dot::x86::pair_prefetch(p, q, i, n);
            let (x0, x1) = (_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(xp.add(i + 8)));
            let (v0, v1) = widen(_mm_loadu_si128(p.add(i) as *const __m128i));
            a0 = _mm256_fmadd_ps(v0, x0, a0);
            a1 = _mm256_fmadd_ps(v1, x1, a1);
            let (u0, u1) = widen(_mm_loadu_si128(q.add(i) as *const __m128i));
            b0 = _mm256_fmadd_ps(u0, x0, b0);
            b1 = _mm256_fmadd_ps(u1, x1, b1);
            i += 16;
        }
        let mut out = crate::dot::hsum256_n(&[_mm256_add_ps(a0, a1), _mm256_add_ps(b0, b1)]);
        for (k, (row, s)) in [r0, r1].into_iter().zip(&mut out).enumerate() {
            for j in i..n {
                *s += row[j] as f32 * x[j];
            }
            *s *= scales[k];
        }
        out
    }

    /// [`super::rows_int8_tokens`] with up to four tokens per pass over a row (one token: two
    /// rows per pass).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tokens_int8(
        w: &[i8],
        scales: &[f32],
        in_dim: usize,
        xs: &[&[f32]],
        out: &mut [f32],
    ) {
        let tokens = xs.len();
        if tokens == 1 {
            let x = xs[0];
            return crate::row_pairs(
                out,
                |r| rows_int8_two(&w[r * in_dim..(r + 2) * in_dim], [scales[r], scales[r + 1]], x),
                |r| rows_int8_n::<1>(&w[r * in_dim..(r + 1) * in_dim], scales[r], [x])[0],
            );
        }
        let mut t = 0;
        while t < tokens {
            let left = tokens - t;
            for (r, &scale) in scales.iter().enumerate() {
                let row = &w[r * in_dim..(r + 1) * in_dim];
                let o = &mut out[r * tokens + t..];
                match left {
                    1 => o[..1].copy_from_slice(&rows_int8_n::<1>(row, scale, [xs[t]])),
                    2 => o[..2].copy_from_slice(&rows_int8_n::<2>(row, scale, [xs[t], xs[t + 1]])),
                    3 => o[..3].copy_from_slice(&rows_int8_n::<3>(row, scale, [xs[t], xs[t + 1], xs[t + 2]])),
                    _ => o[..4].copy_from_slice(&rows_int8_n::<4>(
                        row,
                        scale,
                        [xs[t], xs[t + 1], xs[t + 2], xs[t + 3]],
                    )),
                }
            }
            t += left.min(4);
        }
    }
}

/// `out[i * T + t] = dot_int8(row i, scales[i], xs[t])` for the rows of `w` (`in_dim` wide)
/// and the T tokens of `xs`, bit for bit what each token gets alone.
pub fn rows_int8_tokens(w: &[i8], scales: &[f32], in_dim: usize, xs: &[&[f32]], out: &mut [f32]) {
    let tokens = xs.len();
    assert!(w.len() == scales.len() * in_dim && out.len() == scales.len() * tokens);
    #[cfg(target_arch = "x86_64")]
    match crate::isa::isa() {
        // SAFETY: `isa()` found the features each kernel needs (the one-token kernel's choice).
        crate::isa::Isa::Avx512 => {
            return unsafe { crate::avx512::tokens_i8(w, Some(scales), in_dim, xs, out) }
        }
        // SAFETY: as above.
        crate::isa::Isa::Avx2 => return unsafe { x86::tokens_int8(w, scales, in_dim, xs, out) },
        _ => {}
    }
    #[cfg(target_arch = "aarch64")]
    if crate::isa::isa() == crate::isa::Isa::Neon {
        // SAFETY: every aarch64 CPU has NEON.
        return unsafe { crate::neon::tokens_i8(w, Some(scales), in_dim, xs, out) };
    }
    for (r, &scale) in scales.iter().enumerate() {
        for (t, x) in xs.iter().enumerate() {
            out[r * tokens + t] = dot_int8_reference(&w[r * in_dim..(r + 1) * in_dim], scale, x);
        }
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

    #[test]
    fn quantized_rows_are_within_half_a_step() {
        let x: Vec<f32> = (0..1000)
            .map(|i| ((i as f32) * 0.37).sin() * (1.0 + i as f32 / 100.0))
            .collect();
        let mut q = vec![0i8; x.len()];
        let scale = quantize_row(&x, &mut q).unwrap();
        let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(scale, max / 127.0);
        for (v, &qi) in x.iter().zip(&q) {
            assert!(
                (v - qi as f32 * scale).abs() <= scale / 2.0 * 1.0001,
                "{v} -> {qi}"
            );
        }
        assert!(q.iter().any(|&v| v.abs() == 127));
        let mut z = vec![1i8; 4];
        assert_eq!(quantize_row(&[0.0; 4], &mut z).unwrap(), 0.0);
        assert_eq!(z, vec![0; 4]);
        assert!(quantize_row(&[1.0, f32::NAN], &mut [0; 2]).is_err());
    }

    #[test]
    fn a_bf16_linear_converts_row_by_row_and_4_bit_ones_do_not() {
        use crate::{Linear, WeightData};
        let (out, inp) = (37, 70);
        let w: Vec<u16> = (0..out * inp)
            .map(|i| {
                half::bf16::from_f32(((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1 + i % 5) as f32).to_bits()
            })
            .collect();
        let lin = Linear::new(out, inp, WeightData::Bf16(w.into()));
        let q = lin.to_int8().unwrap().unwrap();
        assert!(matches!(q.data, WeightData::Int8 { .. }));
        assert_eq!(q.bytes(), out * inp + out * 4);
        let (mut a, mut b) = (vec![0f32; inp], vec![0f32; inp]);
        for r in 0..out {
            lin.decode_row(r, &mut a);
            q.decode_row(r, &mut b);
            let step = a.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= step / 2.0 * 1.001, "row {r}: {x} vs {y}");
            }
        }
        let int4 = Linear::new(
            1,
            32,
            WeightData::Int4 {
                packed: vec![0u32; 4].into(),
                scales: vec![0u16; 1].into(),
                group: 32,
            },
        );
        assert!(int4.to_int8().is_none());
    }
}
