//! aarch64 NEON variants of the dense (F32, BF16, F16), INT8 and FP8 row products, chosen by
//! [`crate::isa`] and property-tested against their scalar twins (`tests/neon.rs`, run under
//! emulation by `../shared/tools/aarch64-test.sh`). Every aarch64 CPU has NEON.
//!
//! Each dense kernel is one weight row against N activations (N = 1 is the one-token product):
//! each 16 weights are loaded and widened once and multiplied into every token's four sums of 4
//! lanes (sum k over inputs 16j + 4k..16j + 4k + 4), so every token's sum runs in the same
//! order whatever N is (batch invariance); then 4-wide steps into sum 0, the sums added in a
//! fixed order, the scalar tail. A one-token product runs two rows per pass (each row's steps
//! those of the one-row kernel: the same bits), eight sums in flight instead of four. Widening
//! is exact: BF16 and F16 by bit moves (F16 through the exponent shift that also makes its
//! subnormals exact), INT8 by integer widening.

use std::arch::aarch64::*;

use crate::dot::bf16_to_f32;

/// Up to this many tokens share a pass over a row (16 sums, the 4 weight vectors and the
/// loads fit the 32 registers).
const TOKENS_PER_PASS: usize = 4;

/// Sum of 4 lanes in a fixed order.
#[inline(always)]
unsafe fn hsum4(v: float32x4_t) -> f32 {
    (vgetq_lane_f32::<0>(v) + vgetq_lane_f32::<2>(v)) + (vgetq_lane_f32::<1>(v) + vgetq_lane_f32::<3>(v))
}

#[inline(always)]
unsafe fn load4_f32(p: *const f32) -> float32x4_t {
    vld1q_f32(p)
}

#[inline(always)]
unsafe fn load16_f32(p: *const f32) -> [float32x4_t; 4] {
    [
        vld1q_f32(p),
        vld1q_f32(p.add(4)),
        vld1q_f32(p.add(8)),
        vld1q_f32(p.add(12)),
    ]
}

#[inline(always)]
unsafe fn bf16x4(h: uint16x4_t) -> float32x4_t {
    vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
}

#[inline(always)]
unsafe fn load4_bf16(p: *const u16) -> float32x4_t {
    bf16x4(vld1_u16(p))
}

#[inline(always)]
unsafe fn load16_bf16(p: *const u16) -> [float32x4_t; 4] {
    let (a, b) = (vld1q_u16(p), vld1q_u16(p.add(8)));
    [
        bf16x4(vget_low_u16(a)),
        bf16x4(vget_high_u16(a)),
        bf16x4(vget_low_u16(b)),
        bf16x4(vget_high_u16(b)),
    ]
}

/// Four F16 to f32, exactly: the 15 magnitude bits moved into f32's exponent and mantissa and
/// scaled by 2^112 (F16's bias is 112 smaller; subnormals become normal f32 on the way), the
/// all-ones exponent (infinities, NaNs) kept all ones, the sign put back.
#[inline(always)]
unsafe fn f16x4(h: uint16x4_t) -> float32x4_t {
    let h = vmovl_u16(h);
    let mag = vandq_u32(h, vdupq_n_u32(0x7fff));
    let scaled = vmulq_f32(
        vreinterpretq_f32_u32(vshlq_n_u32::<13>(mag)),
        vdupq_n_f32(f32::from_bits(0x7780_0000)), // 2^112
    );
    let special = vcgeq_u32(mag, vdupq_n_u32(0x7c00));
    let inf_nan = vorrq_u32(vshlq_n_u32::<13>(mag), vdupq_n_u32(0x7f80_0000));
    let bits = vbslq_u32(special, inf_nan, vreinterpretq_u32_f32(scaled));
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    vreinterpretq_f32_u32(vorrq_u32(bits, sign))
}

#[inline(always)]
unsafe fn load4_f16(p: *const u16) -> float32x4_t {
    f16x4(vld1_u16(p))
}

#[inline(always)]
unsafe fn load16_f16(p: *const u16) -> [float32x4_t; 4] {
    let (a, b) = (vld1q_u16(p), vld1q_u16(p.add(8)));
    [
        f16x4(vget_low_u16(a)),
        f16x4(vget_high_u16(a)),
        f16x4(vget_low_u16(b)),
        f16x4(vget_high_u16(b)),
    ]
}

#[inline(always)]
unsafe fn i16x4_to_f32(v: int16x4_t) -> float32x4_t {
    vcvtq_f32_s32(vmovl_s16(v))
}

#[inline(always)]
unsafe fn load4_i8(p: *const i8) -> float32x4_t {
    let bytes = (p as *const i32).read_unaligned();
    let v = vreinterpret_s8_s32(vdup_n_s32(bytes));
    i16x4_to_f32(vget_low_s16(vmovl_s8(v)))
}

#[inline(always)]
unsafe fn load16_i8(p: *const i8) -> [float32x4_t; 4] {
    let v = vld1q_s8(p);
    let (lo, hi) = (vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v));
    [
        i16x4_to_f32(vget_low_s16(lo)),
        i16x4_to_f32(vget_high_s16(lo)),
        i16x4_to_f32(vget_low_s16(hi)),
        i16x4_to_f32(vget_high_s16(hi)),
    ]
}

fn widen_f32(v: f32) -> f32 {
    v
}

fn widen_f16(v: u16) -> f32 {
    half::f16::from_bits(v).to_f32()
}

fn widen_i8(v: i8) -> f32 {
    v as f32
}

macro_rules! kernel {
    ($rows:ident, $two:ident, $tokens:ident, $entry:ident, $elem:ty, $load16:ident, $load4:ident, $widen:expr) => {
        /// One token against two rows `w[..n]` and `w[n..2n]` side by side: each row's steps and
        /// finish are those of the one-row kernel with one token (the same bits), but the two
        /// rows' eight sums advance together (twice the independent additions in flight) and
        /// each activation vector is loaded once for both.
        #[inline]
        unsafe fn $two(w: &[$elem], scales: [f32; 2], x: &[f32]) -> [f32; 2] {
            let n = x.len();
            assert_eq!(w.len(), 2 * n);
            let (r0, r1) = w.split_at(n);
            let (mut a, mut b) = ([vdupq_n_f32(0.0); 4], [vdupq_n_f32(0.0); 4]);
            let mut i = 0;
            while i + 16 <= n {
                let (wa, wb) = ($load16(r0.as_ptr().add(i)), $load16(r1.as_ptr().add(i)));
                let xp = x.as_ptr().add(i);
                for k in 0..4 {
                    let xv = vld1q_f32(xp.add(4 * k));
                    a[k] = vfmaq_f32(a[k], wa[k], xv);
                    b[k] = vfmaq_f32(b[k], wb[k], xv);
                }
                i += 16;
            }
            while i + 4 <= n {
                let xv = vld1q_f32(x.as_ptr().add(i));
                a[0] = vfmaq_f32(a[0], $load4(r0.as_ptr().add(i)), xv);
                b[0] = vfmaq_f32(b[0], $load4(r1.as_ptr().add(i)), xv);
                i += 4;
            }
            let mut out = [0f32; 2];
            for (k, (acc, row)) in [(a, r0), (b, r1)].into_iter().enumerate() {
                let mut sum = hsum4(vaddq_f32(
                    vaddq_f32(acc[0], acc[1]),
                    vaddq_f32(acc[2], acc[3]),
                ));
                for j in i..n {
                    sum += $widen(row[j]) * x[j];
                }
                out[k] = sum * scales[k];
            }
            out
        }

        /// `out[t] = scale * (row . xs[t])`, each token's sum in the one-token order.
        #[inline]
        unsafe fn $rows<const N: usize>(w: &[$elem], scale: f32, xs: [&[f32]; N]) -> [f32; N] {
            let n = w.len();
            for x in xs {
                assert_eq!(x.len(), n);
            }
            let mut acc = [[vdupq_n_f32(0.0); 4]; N];
            let mut i = 0;
            while i + 16 <= n {
                let wv = $load16(w.as_ptr().add(i));
                for t in 0..N {
                    let x = xs[t].as_ptr().add(i);
                    for k in 0..4 {
                        acc[t][k] = vfmaq_f32(acc[t][k], wv[k], vld1q_f32(x.add(4 * k)));
                    }
                }
                i += 16;
            }
            while i + 4 <= n {
                let wv = $load4(w.as_ptr().add(i));
                for t in 0..N {
                    acc[t][0] = vfmaq_f32(acc[t][0], wv, vld1q_f32(xs[t].as_ptr().add(i)));
                }
                i += 4;
            }
            let mut out = [0f32; N];
            for t in 0..N {
                let a = &acc[t];
                let mut sum = hsum4(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
                for j in i..n {
                    sum += $widen(w[j]) * xs[t][j];
                }
                out[t] = sum * scale;
            }
            out
        }

        /// `out[r * T + t] = scale(r) * (row r . xs[t])` for the rows of `w` (`in_dim` wide):
        /// up to [`TOKENS_PER_PASS`] tokens per pass over a row.
        ///
        /// # Safety
        /// The CPU must have NEON (every aarch64 CPU does).
        pub unsafe fn $tokens(
            w: &[$elem],
            scales: Option<&[f32]>,
            in_dim: usize,
            xs: &[&[f32]],
            out: &mut [f32],
        ) {
            let tokens = xs.len();
            let rows = w.len() / in_dim.max(1);
            assert_eq!(out.len(), rows * tokens);
            if tokens == 1 {
                let (x, scale) = (xs[0], |r: usize| scales.map_or(1.0, |s| s[r]));
                return crate::row_pairs(
                    out,
                    |r| {
                        $two(
                            &w[r * in_dim..(r + 2) * in_dim],
                            [scale(r), scale(r + 1)],
                            x,
                        )
                    },
                    |r| $rows::<1>(&w[r * in_dim..(r + 1) * in_dim], scale(r), [x])[0],
                );
            }
            for r in 0..rows {
                let row = &w[r * in_dim..(r + 1) * in_dim];
                let s = scales.map_or(1.0, |s| s[r]);
                let mut t = 0;
                while t < tokens {
                    let g = &xs[t..(t + TOKENS_PER_PASS).min(tokens)];
                    let o = &mut out[r * tokens + t..r * tokens + t + g.len()];
                    match g.len() {
                        1 => o.copy_from_slice(&$rows::<1>(row, s, [g[0]])),
                        2 => o.copy_from_slice(&$rows::<2>(row, s, [g[0], g[1]])),
                        3 => o.copy_from_slice(&$rows::<3>(row, s, [g[0], g[1], g[2]])),
                        _ => o.copy_from_slice(&$rows::<4>(row, s, [g[0], g[1], g[2], g[3]])),
                    }
                    t += g.len();
                }
            }
        }

        /// The one-token product (what `isa()` picks on aarch64).
        pub fn $entry(w: &[$elem], scale: f32, x: &[f32]) -> f32 {
            // SAFETY: NEON is part of every aarch64 CPU.
            unsafe { $rows::<1>(w, scale, [x])[0] }
        }
    };
}

kernel!(
    rows_f32,
    two_f32,
    tokens_f32,
    dot_f32_scaled,
    f32,
    load16_f32,
    load4_f32,
    widen_f32
);
kernel!(
    rows_bf16,
    two_bf16,
    tokens_bf16,
    dot_bf16_scaled,
    u16,
    load16_bf16,
    load4_bf16,
    bf16_to_f32
);
kernel!(
    rows_f16,
    two_f16,
    tokens_f16,
    dot_f16_scaled,
    u16,
    load16_f16,
    load4_f16,
    widen_f16
);
kernel!(
    rows_i8,
    two_i8,
    tokens_i8,
    dot_int8_entry,
    i8,
    load16_i8,
    load4_i8,
    widen_i8
);

pub fn dot_f32_entry(w: &[f32], x: &[f32]) -> f32 {
    dot_f32_scaled(w, 1.0, x)
}

pub fn dot_bf16_entry(w: &[u16], x: &[f32]) -> f32 {
    dot_bf16_scaled(w, 1.0, x)
}

pub fn dot_f16_entry(w: &[u16], x: &[f32]) -> f32 {
    dot_f16_scaled(w, 1.0, x)
}

/// Four E4M3 codes (the low bytes of 32-bit lanes) to f32, exactly: normal codes by moving
/// their exponent and mantissa into f32's (bias 120 apart), subnormal ones (exponent 0) as
/// mantissa x 2^-9, the sign put back. (0x7f and 0xff decode as 480, as the x86 kernels do;
/// checkpoints hold no NaN weights.)
#[inline(always)]
unsafe fn e4m3x4(b: uint32x4_t) -> float32x4_t {
    let mag = vandq_u32(b, vdupq_n_u32(0x7f));
    let normal = vaddq_u32(vshlq_n_u32::<20>(mag), vdupq_n_u32(120 << 23));
    let sub = vmulq_f32(
        vcvtq_f32_u32(vandq_u32(b, vdupq_n_u32(0x07))),
        vdupq_n_f32(1.0 / 512.0),
    );
    let is_sub = vceqq_u32(vandq_u32(b, vdupq_n_u32(0x78)), vdupq_n_u32(0));
    let bits = vbslq_u32(is_sub, vreinterpretq_u32_f32(sub), normal);
    let sign = vshlq_n_u32::<24>(vandq_u32(b, vdupq_n_u32(0x80)));
    vreinterpretq_f32_u32(vorrq_u32(bits, sign))
}

/// 16 E4M3 bytes to four vectors of 4 f32, in input order.
#[inline(always)]
unsafe fn load16_e4m3(p: *const u8) -> [float32x4_t; 4] {
    let v = vld1q_u8(p);
    let (lo, hi) = (vmovl_u8(vget_low_u8(v)), vmovl_high_u8(v));
    [
        e4m3x4(vmovl_u16(vget_low_u16(lo))),
        e4m3x4(vmovl_u16(vget_high_u16(lo))),
        e4m3x4(vmovl_u16(vget_low_u16(hi))),
        e4m3x4(vmovl_u16(vget_high_u16(hi))),
    ]
}

/// One FP8 row (`scales`: one per `block` inputs): per block four sums over 16-wide steps, then
/// 4-wide steps, the block's sum times its scale into one of two totals (blocks alternate), the
/// scalar tail of each block apart.
pub fn dot_fp8(w: &[u8], scales: &[f32], block: usize, x: &[f32]) -> f32 {
    assert!(w.len() == x.len() && block > 0 && scales.len() * block >= w.len());
    let n = w.len();
    let mut totals = [0f32; 2];
    let mut tail = 0f32;
    // SAFETY: NEON is part of every aarch64 CPU; every load stays inside `w` and `x`.
    unsafe {
        let (mut start, mut b) = (0, 0);
        while start < n {
            let end = (start + block).min(n);
            let mut acc = [vdupq_n_f32(0.0); 4];
            let mut i = start;
            while i + 16 <= end {
                let wv = load16_e4m3(w.as_ptr().add(i));
                for k in 0..4 {
                    acc[k] = vfmaq_f32(acc[k], wv[k], vld1q_f32(x.as_ptr().add(i + 4 * k)));
                }
                i += 16;
            }
            let sum = hsum4(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
            totals[b % 2] += sum * scales[b];
            let mut s = 0f32;
            while i < end {
                s += crate::fp8::e4m3_to_f32(w[i]) * x[i];
                i += 1;
            }
            tail += s * scales[b];
            start = end;
            b += 1;
        }
    }
    (totals[0] + totals[1]) + tail
}

/// [`crate::attend::weighted_sum_reference`] (the same bits): eight 4-lane sums at a time (32
/// outputs), then one, then the scalar tail; one multiply and one add per term (no `vfma`).
///
/// # Safety
/// `values` must hold `w.len()` rows of `stride` from its start, each `out.len()` long.
pub unsafe fn weighted_sum(w: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
    let (n, v) = (out.len(), values.as_ptr());
    let mut d = 0;
    while d + 32 <= n {
        let mut acc = [vdupq_n_f32(0.0); 8];
        for (p, &a) in w.iter().enumerate() {
            let (a, row) = (vdupq_n_f32(a), v.add(p * stride + d));
            for (k, s) in acc.iter_mut().enumerate() {
                *s = vaddq_f32(*s, vmulq_f32(a, vld1q_f32(row.add(4 * k))));
            }
        }
        for (k, s) in acc.iter().enumerate() {
            vst1q_f32(out.as_mut_ptr().add(d + 4 * k), *s);
        }
        d += 32;
    }
    while d + 4 <= n {
        let mut s = vdupq_n_f32(0.0);
        for (p, &a) in w.iter().enumerate() {
            s = vaddq_f32(s, vmulq_f32(vdupq_n_f32(a), vld1q_f32(v.add(p * stride + d))));
        }
        vst1q_f32(out.as_mut_ptr().add(d), s);
        d += 4;
    }
    for (d, o) in out.iter_mut().enumerate().skip(d) {
        let mut acc = 0f32;
        for (p, a) in w.iter().enumerate() {
            acc += a * *v.add(p * stride + d);
        }
        *o = acc;
    }
}
