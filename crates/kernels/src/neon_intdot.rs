//! aarch64 NEON variant of the 4-bit integer dot products (INT4 pack-quantized, MXFP4; see
//! [`crate::intdot`]): the same prepared activation and the same exact integer sums, in the
//! lanes NEON forms them, property-tested against [`crate::intdot::dot_reference`].
//!
//! Per block of 64 inputs, lane m of half h sums inputs 32h + 4m..32h + 4m + 4 and
//! 32h + 16 + 4m..32h + 16 + 4m + 4: the q products (`vmull_s16` / `vmlal_high_s16` of each
//! nibble's weights, deinterleaved by `vld2q_u8` into the q layout, against q), shifted to 1/256
//! steps, plus the rests' products (`vmull_s8` / `vmlal_s8` of the weight bytes against r,
//! pairs added by `vpadalq_s16`). Per lane at most 8 x 24 x 32513 x 256 + 8 x 24 x 128 < 2^31.
//! Then per half one conversion and the FMAs of `intdot`'s AVX2 kernel: step and offset, the
//! weights' scale into one of two totals (blocks alternate), and the eight lanes reduced in
//! `tree8` order. Each token's sum takes the same steps whatever the number of tokens.
//!
//! Where the CPU has the dot-product instructions (Armv8.4's `sdot`, optional from 8.2: every
//! Apple M-series, Graviton 2 and later), [`Step::Dotprod`] forms the same lane sums from the
//! activation as bytes in input order ([`crate::intdot::DotBytes`]: q = 256 hi + lo): per half
//! two `sdot`s each for hi, lo and r against the weights zipped into input order, lane m taking
//! the same inputs as above, then units = 256 (256 hi + lo) + r. The integers are the same, so
//! the bits are.

use std::arch::aarch64::*;
use std::sync::OnceLock;

use crate::intdot::{ActBlock, DotBytes, IntAct, Scales, BLOCK};

/// How a block's integer sums are formed (the same integers, so the same bits, either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Widening multiplies (`vmull_s16`, `vmull_s8`): every aarch64 CPU.
    Neon,
    /// `sdot`, four byte products per lane and instruction.
    Dotprod,
}

impl Step {
    /// `Dotprod` where the CPU has it, unless `STRATA_NEON_DOTPROD=0` asks for the plain step
    /// (to compare the two on one machine).
    pub fn best() -> Step {
        static BEST: OnceLock<Step> = OnceLock::new();
        *BEST.get_or_init(|| {
            if std::arch::is_aarch64_feature_detected!("dotprod")
                && std::env::var("STRATA_NEON_DOTPROD").as_deref() != Ok("0")
            {
                Step::Dotprod
            } else {
                Step::Neon
            }
        })
    }
}

/// Tokens per pass over a row's weights.
const TOKENS_PER_PASS: usize = 4;

/// A block's weights as the products need them.
struct Weights {
    /// Weight bytes of inputs 4j + k at `by_q[k][j]` (the order of q in [`ActBlock::q`]).
    by_q: [uint8x16_t; 4],
    /// Weight bytes of the even inputs (`lo[b]`: input 2b) and the odd ones (`hi[b]`: 2b + 1),
    /// 32 each as two vectors (the order of r in [`ActBlock::r`]).
    lo: [uint8x16_t; 2],
    hi: [uint8x16_t; 2],
}

#[inline(always)]
unsafe fn unpack<const LUT: bool>(p: *const u8, lut: uint8x16_t) -> Weights {
    let mask = vdupq_n_u8(0x0f);
    let map = |v: uint8x16_t| if LUT { vqtbl1q_u8(lut, v) } else { v };
    let pairs = vld2q_u8(p); // .0[j] = byte 2j, .1[j] = byte 2j + 1
    let by_q = [
        map(vandq_u8(pairs.0, mask)),
        map(vshrq_n_u8::<4>(pairs.0)),
        map(vandq_u8(pairs.1, mask)),
        map(vshrq_n_u8::<4>(pairs.1)),
    ];
    let (a, b) = (vld1q_u8(p), vld1q_u8(p.add(16)));
    Weights {
        by_q,
        lo: [map(vandq_u8(a, mask)), map(vandq_u8(b, mask))],
        hi: [map(vshrq_n_u8::<4>(a)), map(vshrq_n_u8::<4>(b))],
    }
}

/// The two halves' lanes of one block before the weights' scales: step x units + offset.
#[inline(always)]
unsafe fn block_sum(w: &Weights, blk: &ActBlock) -> [float32x4_t; 2] {
    let q = blk.q.as_ptr();
    let r = blk.r.as_ptr();
    let mut out = [vdupq_n_f32(0.0); 2];
    for h in 0..2 {
        // q part: j = 8h..8h + 8 of each nibble's 16.
        let mut qs = vdupq_n_s32(0);
        for k in 0..4 {
            let wk = vreinterpretq_s16_u16(if h == 0 {
                vmovl_u8(vget_low_u8(w.by_q[k]))
            } else {
                vmovl_high_u8(w.by_q[k])
            });
            let qk = vld1q_s16(q.add(16 * k + 8 * h));
            qs = vmlal_s16(qs, vget_low_s16(wk), vget_low_s16(qk));
            qs = vmlal_high_s16(qs, wk, qk);
        }
        // Rest part: bytes 16h..16h + 16 (inputs 32h..32h + 32).
        let (lo, hi) = (vreinterpretq_s8_u8(w.lo[h]), vreinterpretq_s8_u8(w.hi[h]));
        let (re, ro) = (vld1q_s8(r.add(16 * h)), vld1q_s8(r.add(32 + 16 * h)));
        let first = vmlal_s8(
            vmull_s8(vget_low_s8(lo), vget_low_s8(re)),
            vget_low_s8(hi),
            vget_low_s8(ro),
        );
        let second = vmlal_high_s8(vmull_high_s8(lo, re), hi, ro);
        let rest = vpadalq_s16(vpaddlq_s16(first), second);
        let units = vaddq_s32(vshlq_n_s32::<8>(qs), rest);
        out[h] = vfmaq_f32(
            vld1q_f32(blk.offset.as_ptr().add(4 * h)),
            vcvtq_f32_s32(units),
            vld1q_f32(blk.step.as_ptr().add(4 * h)),
        );
    }
    out
}

/// The scales of block b's two halves.
#[inline(always)]
unsafe fn block_scales(kind: u8, scales: *const u8, shift: u32, b: usize) -> [f32; 2] {
    let bf16 = |i: usize| f32::from_bits(((scales.add(2 * i) as *const u16).read_unaligned() as u32) << 16);
    match kind {
        0 => [bf16(2 * b), bf16(2 * b + 1)],
        1 => {
            let s = bf16((b * BLOCK) >> shift);
            [s, s]
        }
        _ => {
            // 2^(e - 127); e = 0 is 2^-127 (a subnormal), as `mxfp4::e8m0_to_f32`.
            let e8m0 = |e: u8| f32::from_bits(((e as u32) << 23).max(0x0040_0000));
            [e8m0(*scales.add(2 * b)), e8m0(*scales.add(2 * b + 1))]
        }
    }
}

/// How one step forms a block's lane sums.
trait BlockStep {
    type Weights;
    unsafe fn unpack<const LUT: bool>(p: *const u8, lut: uint8x16_t) -> Self::Weights;
    unsafe fn sum(w: &Self::Weights, act: &IntAct, b: usize) -> [float32x4_t; 2];
}

/// Widening multiplies.
struct Plain;

impl BlockStep for Plain {
    type Weights = Weights;
    #[inline(always)]
    unsafe fn unpack<const LUT: bool>(p: *const u8, lut: uint8x16_t) -> Weights {
        unpack::<LUT>(p, lut)
    }
    #[inline(always)]
    unsafe fn sum(w: &Weights, act: &IntAct, b: usize) -> [float32x4_t; 2] {
        block_sum(w, &act.blocks[b])
    }
}

/// `sdot` (every token's activation carries its [`DotBytes`]).
struct Dot;

impl BlockStep for Dot {
    type Weights = [int8x16_t; 4];
    #[inline(always)]
    unsafe fn unpack<const LUT: bool>(p: *const u8, lut: uint8x16_t) -> [int8x16_t; 4] {
        unpack_in_order::<LUT>(p, lut)
    }
    #[inline(always)]
    unsafe fn sum(w: &[int8x16_t; 4], act: &IntAct, b: usize) -> [float32x4_t; 2] {
        block_sum_dot(w, &act.dots[b], &act.blocks[b])
    }
}

/// One row times N tokens: per token the same steps, in the same order, as for one.
#[inline(always)]
unsafe fn run_with<S: BlockStep, const LUT: bool, const N: usize>(
    packed: *const u8,
    kind: u8,
    scales: *const u8,
    shift: u32,
    lut: uint8x16_t,
    acts: [&IntAct; N],
) -> [f32; N] {
    let blocks = acts[0].blocks.len();
    // totals[token][block parity][half]
    let mut totals = [[[vdupq_n_f32(0.0); 2]; 2]; N];
    for b in 0..blocks {
        let w = S::unpack::<LUT>(packed.add(32 * b), lut);
        let c = block_scales(kind, scales, shift, b);
        for t in 0..N {
            let s = S::sum(&w, acts[t], b);
            let tot = &mut totals[t][b % 2];
            tot[0] = vfmaq_f32(tot[0], s[0], vdupq_n_f32(c[0]));
            tot[1] = vfmaq_f32(tot[1], s[1], vdupq_n_f32(c[1]));
        }
    }
    std::array::from_fn(|t| reduce(totals[t]))
}

/// A token's sum from its totals (`[block parity][half]`): the two parities added, then the
/// eight lanes in `tree8` order.
#[inline(always)]
unsafe fn reduce(totals: [[float32x4_t; 2]; 2]) -> f32 {
    let [even, odd] = totals;
    let (h0, h1) = (vaddq_f32(even[0], odd[0]), vaddq_f32(even[1], odd[1]));
    // tree8 over lanes 0-3 (h0) and 4-7 (h1): ((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7)).
    let s = vaddq_f32(h0, h1);
    (vgetq_lane_f32::<0>(s) + vgetq_lane_f32::<1>(s)) + (vgetq_lane_f32::<2>(s) + vgetq_lane_f32::<3>(s))
}

/// `sdot`: lane m of `acc` plus the products of bytes 4m..4m + 4 of `a` and `b`.
#[inline(always)]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    std::arch::asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// A block's 64 weights as bytes in input order (16 per vector).
#[inline(always)]
unsafe fn unpack_in_order<const LUT: bool>(p: *const u8, lut: uint8x16_t) -> [int8x16_t; 4] {
    let mask = vdupq_n_u8(0x0f);
    let map = |v: uint8x16_t| if LUT { vqtbl1q_u8(lut, v) } else { v };
    let (a, b) = (vld1q_u8(p), vld1q_u8(p.add(16)));
    // Byte j holds input 2j in its low nibble and 2j + 1 in its high one.
    let (lo0, hi0) = (map(vandq_u8(a, mask)), map(vshrq_n_u8::<4>(a)));
    let (lo1, hi1) = (map(vandq_u8(b, mask)), map(vshrq_n_u8::<4>(b)));
    [
        vzip1q_u8(lo0, hi0),
        vzip2q_u8(lo0, hi0),
        vzip1q_u8(lo1, hi1),
        vzip2q_u8(lo1, hi1),
    ]
    .map(|v| vreinterpretq_s8_u8(v))
}

/// [`block_sum`] through `sdot`: the same lane integers, so the same result.
#[inline(always)]
unsafe fn block_sum_dot(w: &[int8x16_t; 4], d: &DotBytes, blk: &ActBlock) -> [float32x4_t; 2] {
    let mut out = [vdupq_n_f32(0.0); 2];
    for h in 0..2 {
        let (w1, w2) = (w[2 * h], w[2 * h + 1]);
        let sum = |bytes: &[i8; 64]| {
            let p = bytes.as_ptr().add(32 * h);
            sdot(sdot(vdupq_n_s32(0), w1, vld1q_s8(p)), w2, vld1q_s8(p.add(16)))
        };
        let qs = vaddq_s32(vshlq_n_s32::<8>(sum(&d.hi)), sum(&d.lo));
        let units = vaddq_s32(vshlq_n_s32::<8>(qs), sum(&d.r));
        out[h] = vfmaq_f32(
            vld1q_f32(blk.offset.as_ptr().add(4 * h)),
            vcvtq_f32_s32(units),
            vld1q_f32(blk.step.as_ptr().add(4 * h)),
        );
    }
    out
}

/// [`run_with`] in the `sdot` step.
#[target_feature(enable = "dotprod")]
unsafe fn run_dot<const LUT: bool, const N: usize>(
    packed: *const u8,
    kind: u8,
    scales: *const u8,
    shift: u32,
    lut: uint8x16_t,
    acts: [&IntAct; N],
) -> [f32; N] {
    run_with::<Dot, LUT, N>(packed, kind, scales, shift, lut, acts)
}

/// [`crate::intdot::dot_rows`] on NEON in `step` (the plain step where an activation lacks its
/// [`DotBytes`]).
///
/// # Safety
/// The CPU must have NEON (every aarch64 CPU does), and the dot-product instructions for
/// [`Step::Dotprod`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn dot_rows_with(
    step: Step,
    packed: &[u8],
    row_bytes: usize,
    scales: Scales,
    scales_per_row: usize,
    lut: Option<&[u8; 16]>,
    acts: &[&IntAct],
    out: &mut [f32],
) {
    let tokens = acts.len();
    let (blocks, rows) = crate::intdot::check_rows(packed, row_bytes, acts, out);
    let (kind, shift, sp, scale_row) = scales.raw(blocks, rows, scales_per_row);
    let table = vld1q_u8(lut.unwrap_or(&[0; 16]).as_ptr());
    let dot = step == Step::Dotprod && acts.iter().all(|a| a.dots.len() == blocks);
    for (i, row_out) in out.chunks_exact_mut(tokens).enumerate() {
        let (p, s) = (packed.as_ptr().add(i * row_bytes), sp.add(i * scale_row));
        let mut t = 0;
        while t < tokens {
            let g = &acts[t..(t + TOKENS_PER_PASS).min(tokens)];
            let o = &mut row_out[t..t + g.len()];
            macro_rules! go {
                ($n:literal) => {{
                    let a: [&IntAct; $n] = g.try_into().unwrap();
                    o.copy_from_slice(&match (dot, lut.is_some()) {
                        (true, true) => run_dot::<true, $n>(p, kind, s, shift, table, a),
                        (true, false) => run_dot::<false, $n>(p, kind, s, shift, table, a),
                        (false, true) => run_with::<Plain, true, $n>(p, kind, s, shift, table, a),
                        (false, false) => run_with::<Plain, false, $n>(p, kind, s, shift, table, a),
                    })
                }};
            }
            match g.len() {
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                _ => go!(4),
            }
            t += g.len();
        }
    }
}
