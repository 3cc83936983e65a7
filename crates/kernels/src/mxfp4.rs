//! MXFP4 weights (compressed-tensors `mxfp4-pack-quantized`, Kimi K3's routed experts): two E2M1
//! codes per byte, low nibble = even column; code bit 3 = sign, bits 0-2 index
//! {0, 0.5, 1, 1.5, 2, 3, 4, 6}; one E8M0 scale byte per 32 inputs, value 2^(byte - 127).

use std::sync::OnceLock;

use crate::intdot::{self, IntAct};

pub const GROUP: usize = 32;

/// The 16 E2M1 code values.
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// E8M0 scale byte to f32: 2^(byte - 127), exact for 0..=254 (byte 0 is the subnormal 2^-127).
pub fn e8m0_to_f32(byte: u8) -> f32 {
    match byte {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        b => f32::from_bits((b as u32) << 23),
    }
}

/// The code of element j of a packed row.
#[inline]
pub fn code_at(packed: &[u8], j: usize) -> u8 {
    let b = packed[j / 2];
    if j.is_multiple_of(2) {
        b & 0xf
    } else {
        b >> 4
    }
}

/// Scalar reference: one row (`packed` holds ceil(in/2) bytes, `scales` ceil(in/32) bytes).
pub fn dot_mxfp4_reference(packed: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    let mut total = 0f32;
    for (g, xg) in x.chunks(GROUP).enumerate() {
        let mut acc = [0f32; 8];
        let base = g * GROUP;
        let n8 = xg.len() / 8 * 8;
        for c in (0..n8).step_by(8) {
            for l in 0..8 {
                acc[l] += E2M1[code_at(packed, base + c + l) as usize] * xg[c + l];
            }
        }
        let mut s = crate::dot::tree8(acc);
        for i in n8..xg.len() {
            s += E2M1[code_at(packed, base + i) as usize] * xg[i];
        }
        total += s * e8m0_to_f32(scales[g]);
    }
    total
}

type DotMxfp4 = fn(&[u8], &[u8], &[f32]) -> f32;

pub fn dot_mxfp4(packed: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    static IMPL: OnceLock<DotMxfp4> = OnceLock::new();
    (IMPL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if crate::dot::has_avx2_fma_f16c() {
            return x86::dot_mxfp4_avx2_entry;
        }
        dot_mxfp4_reference
    }))(packed, scales, x)
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2+FMA: 16 bytes hold one group of 32 codes; `pshufb` maps codes to 2x their value as
    //! int8 (all E2M1 values times 2 are integers), and the 1/2 joins the group's scale.
    use std::arch::x86_64::*;

    pub fn dot_mxfp4_avx2_entry(packed: &[u8], scales: &[u8], x: &[f32]) -> f32 {
        // SAFETY: selected only when avx2 and fma were detected.
        unsafe { dot_mxfp4_avx2(packed, scales, x) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mul8(codes2x: __m128i, x: *const f32) -> __m256 {
        _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes2x)),
            _mm256_loadu_ps(x),
        )
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_mxfp4_avx2(packed: &[u8], scales: &[u8], x: &[f32]) -> f32 {
        let n = x.len();
        assert!(packed.len() * 2 >= n && scales.len() * super::GROUP >= n);
        let lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
        let low = _mm_set1_epi8(0x0f);
        let mut total = _mm256_setzero_ps();
        let whole = n / super::GROUP;
        for g in 0..whole {
            let bytes = _mm_loadu_si128(packed.as_ptr().add(g * 16) as *const __m128i);
            let lo = _mm_shuffle_epi8(lut, _mm_and_si128(bytes, low));
            let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
            // Element order: byte k gives columns 2k (low) and 2k+1 (high).
            let v0 = _mm_unpacklo_epi8(lo, hi); // columns 0..16
            let v1 = _mm_unpackhi_epi8(lo, hi); // columns 16..32
            let xp = x.as_ptr().add(g * super::GROUP);
            // Four independent products, then one dependent FMA per group.
            let p0 = mul8(v0, xp);
            let p1 = mul8(_mm_srli_si128(v0, 8), xp.add(8));
            let p2 = mul8(v1, xp.add(16));
            let p3 = mul8(_mm_srli_si128(v1, 8), xp.add(24));
            let sum = _mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3));
            let scale = super::e8m0_to_f32(scales[g]) * 0.5;
            total = _mm256_fmadd_ps(sum, _mm256_set1_ps(scale), total);
        }
        let mut tail = 0f32;
        if whole * super::GROUP < n {
            let g = whole;
            let mut s = 0f32;
            for i in g * super::GROUP..n {
                s += super::E2M1[super::code_at(packed, i) as usize] * x[i];
            }
            tail = s * super::e8m0_to_f32(scales[g]);
        }
        crate::dot::hsum256(total) + tail
    }
}

/// Each code as an unsigned byte for the integer kernel: twice its value plus 12 (0..=24).
pub const INTDOT_LUT: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

/// The activation quantized for [`dot_mxfp4_prepared`] (see [`crate::intdot`]); `None` when the row
/// has no whole block of 64.
pub fn prepare(x: &[f32]) -> Option<IntAct> {
    (x.len() >= intdot::BLOCK).then(|| intdot::prepare(x, 12, 0.5))
}

/// [`dot_mxfp4_prepared`] for a run of rows of a matrix: `packed` and `scales` hold whole rows of
/// `x.len()` inputs, `out[i]` gets row `first + i`.
pub fn rows_mxfp4_prepared(
    packed: &[u8],
    scales: &[u8],
    x: &[f32],
    p: Option<&IntAct>,
    first: usize,
    out: &mut [f32],
) {
    rows_mxfp4_tokens(packed, scales, &[x], &[p], first, out)
}

/// [`rows_mxfp4_prepared`] for several tokens at once (`xs[t]` prepared as `ps[t]`):
/// `out[i * T + t]` gets row `first + i` times token t, the same value as a one-token call
/// gives. The SIMD kernel unpacks each weight block once for up to four tokens.
pub fn rows_mxfp4_tokens(
    packed: &[u8],
    scales: &[u8],
    xs: &[&[f32]],
    ps: &[Option<&IntAct>],
    first: usize,
    out: &mut [f32],
) {
    let (tokens, n, rows) = intdot::token_rows(xs, ps, first, out);
    let (bytes, groups) = (n.div_ceil(2), n.div_ceil(GROUP));
    let packed = &packed[rows.start * bytes..rows.end * bytes];
    let scales = &scales[rows.start * groups..rows.end * groups];
    if intdot::simd() {
        let fast = intdot::with_acts(ps, |acts| {
            let s = intdot::Scales::E8m0(scales);
            intdot::dot_rows(packed, bytes, s, groups, Some(&INTDOT_LUT), acts, out);
            for (t, (a, x)) in acts.iter().zip(xs).enumerate() {
                intdot::add_tails(out, tokens, t, a, n, |i, j| {
                    E2M1[code_at(&packed[i * bytes..], j) as usize]
                        * x[j]
                        * e8m0_to_f32(scales[i * groups + j / GROUP])
                });
            }
        });
        if fast.is_some() {
            return;
        }
    }
    for (i, row_out) in out.chunks_exact_mut(tokens).enumerate() {
        let (w, s) = (
            &packed[i * bytes..(i + 1) * bytes],
            &scales[i * groups..(i + 1) * groups],
        );
        for (o, x) in row_out.iter_mut().zip(xs) {
            *o = dot_mxfp4_reference(w, s, x);
        }
    }
}

/// The dot with an activation from [`prepare`]: the whole blocks in integers (24-bit activation),
/// the rest exactly as [`dot_mxfp4_reference`].
pub fn dot_mxfp4_prepared(packed: &[u8], scales: &[u8], x: &[f32], p: Option<&IntAct>) -> f32 {
    let mut out = [0f32];
    rows_mxfp4_prepared(packed, scales, x, p, 0, &mut out);
    out[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_e2m1_code_decodes_to_its_hand_computed_value() {
        // code -> (sign, magnitude index): bit 3 is the sign, bits 0-2 index the magnitudes.
        let magnitudes = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for code in 0u8..16 {
            let want = if code & 8 != 0 {
                -magnitudes[(code & 7) as usize]
            } else {
                magnitudes[code as usize]
            };
            // A row of 32 equal codes against x = 1 with scale 2^0 sums to 32 x value.
            let packed = vec![code | (code << 4); 16];
            let x = vec![1.0f32; 32];
            assert_eq!(
                dot_mxfp4_reference(&packed, &[127], &x),
                32.0 * want,
                "code {code:#x}"
            );
            assert_eq!(
                dot_mxfp4(&packed, &[127], &x),
                32.0 * want,
                "code {code:#x} (simd)"
            );
        }
    }

    #[test]
    fn scale_edges_decode_exactly() {
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(0), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32(1), 2f32.powi(-126));
        assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
        assert_eq!(e8m0_to_f32(128), 2.0);
        assert!(e8m0_to_f32(255).is_nan());
        // 0.5 x 2^-127 x 1 is representable (2^-128, subnormal): the product is exact.
        let packed = [0x01u8; 16]; // even columns 0.5, odd columns 0
        let mut x = vec![0f32; 32];
        x[0] = 1.0;
        assert_eq!(dot_mxfp4_reference(&packed, &[0], &x), 2f32.powi(-128));
        x[0] = 2f32.powi(-100);
        assert_eq!(dot_mxfp4(&packed, &[254], &x), 2f32.powi(26));
    }

    #[test]
    fn prepared_kernel_keeps_the_scale_edges() {
        // One block; x = 1 at column 0 only, so the 16-bit activation holds it exactly and only
        // f32 rounding of the step remains.
        let mut x = vec![0f32; 64];
        x[0] = 1.0;
        let packed = vec![0x02u8; 32]; // even columns 1.0, odd columns 0
        let p = prepare(&x);
        for (e, want) in [
            (0u8, 2f64.powi(-127)),
            (1, 2f64.powi(-126)),
            (127, 1.0),
            (254, 2f64.powi(127)),
        ] {
            let got = dot_mxfp4_prepared(&packed, &[e, e], &x, p.as_ref()) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * want,
                "scale byte {e}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn low_nibble_is_the_even_column() {
        let mut packed = vec![0u8; 16];
        packed[0] = 0x72; // column 0 = code 2 (1.0), column 1 = code 7 (6.0)
        let mut x = vec![0f32; 32];
        x[0] = 1.0;
        assert_eq!(dot_mxfp4(&packed, &[127], &x), 1.0);
        x[0] = 0.0;
        x[1] = 1.0;
        assert_eq!(dot_mxfp4(&packed, &[127], &x), 6.0);
    }
}
