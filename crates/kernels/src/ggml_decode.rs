//! The block layouts of GGUF's quantized weight types and their decoding to f32, one block at a
//! time. Each decoder computes every weight with the same f32 operations, in the same order, as
//! ggml's reference dequantization (`(d * sc) * q - (dmin * m)` and the like), so a decoded block
//! equals what `gguf`'s own `dequantize` gives bit for bit. The loops are plain so that, inlined
//! into a SIMD-enabled kernel, the compiler vectorizes them; the values do not depend on it (no
//! fused multiply-adds).
//!
//! Layouts (bytes, in order): `d`/`dmin`/`m` are F16, `q*` packed codes, `sc` sub-block scales.
//! - Q4_0 (32 weights, 18 B): d, 16 B of nibbles (weights 0-15 low, 16-31 high); d * (q - 8).
//! - Q4_1 (32, 20): d, m, nibbles; d * q + m.
//! - Q5_0 (32, 22): d, 4 B of fifth bits (bit j: weight j), nibbles; d * (q - 16).
//! - Q5_1 (32, 24): d, m, fifth bits, nibbles; d * q + m.
//! - IQ4_NL (32, 18): d, nibbles indexing a fixed table of 16 values; d * table[q].
//! - MXFP4 (32, 17): an E8M0 exponent, nibbles of E2M1 codes; 2^(e-128) * (2 * e2m1).
//! - Q2_K (256, 84): 16 B of scales (low nibble: scale, high: min, per 16 weights), 64 B of
//!   2-bit codes, d, dmin; (d * sc) * q - (dmin * m).
//! - Q3_K (256, 110): 32 B of high bits, 64 B of 2-bit codes, 12 B of 6-bit scales, d;
//!   (d * (sc - 32)) * (q - 4 * !hbit).
//! - Q4_K (256, 144): d, dmin, 12 B of 6-bit scales and mins (per 32 weights), 128 B nibbles;
//!   (d * sc) * q - (dmin * m).
//! - Q5_K (256, 176): as Q4_K, with 32 B of fifth bits before the nibbles.
//! - Q6_K (256, 210): 128 B low nibbles, 64 B 2-bit high parts, 16 signed scales (per 16), d;
//!   (d * sc) * (q - 32).
//! - IQ4_XS (256, 136): d, 2 B of scales' high bits, 4 B of their low nibbles (per 32), 128 B
//!   nibbles indexing IQ4_NL's table; (d * (sc - 32)) * table[q].

/// IQ4_NL's and IQ4_XS's 16 values.
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// MXFP4's E2M1 values, doubled (so they are integers): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives.
pub const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// One block type's layout and decoder.
pub trait Decode {
    /// Weights per block.
    const N: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// Writes the block's `N` weights into `out[..N]`.
    fn decode(b: &[u8], out: &mut [f32]);
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// ggml's E8M0 exponent as half its scale, 2^(e-128) (e = 0 and 1 as subnormals).
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((e as u32 - 1) << 23)
    }
}

pub struct Q4_0;
impl Decode for Q4_0 {
    const N: usize = 32;
    const BYTES: usize = 18;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, qs) = (f16_at(b, 0), &b[2..18]);
        for j in 0..16 {
            out[j] = d * ((qs[j] & 0xF) as i32 - 8) as f32;
            out[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
        }
    }
}

/// Q8_0 (its own kernels are in [`crate::q8_0`]; this decoder serves the NEON product):
/// d, then 32 signed bytes; d * q.
pub struct Q8_0;
impl Decode for Q8_0 {
    const N: usize = 32;
    const BYTES: usize = 34;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        for j in 0..32 {
            out[j] = d * (b[2 + j] as i8) as f32;
        }
    }
}

pub struct Q4_1;
impl Decode for Q4_1 {
    const N: usize = 32;
    const BYTES: usize = 20;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, m, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..20]);
        for j in 0..16 {
            out[j] = d * (qs[j] & 0xF) as f32 + m;
            out[j + 16] = d * (qs[j] >> 4) as f32 + m;
        }
    }
}

/// Q5 codes j and j + 16 (j < 16): the nibbles and bits j and j + 16 of `qh` as fifth bits.
#[inline(always)]
fn five_bits(qh: u32, qs: &[u8], j: usize) -> (i32, i32) {
    let lo = (qs[j] & 0xF) as u32 | (((qh >> j) & 1) << 4);
    let hi = (qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
    (lo as i32, hi as i32)
}

pub struct Q5_0;
impl Decode for Q5_0 {
    const N: usize = 32;
    const BYTES: usize = 22;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, qh, qs) = (
            f16_at(b, 0),
            u32::from_le_bytes([b[2], b[3], b[4], b[5]]),
            &b[6..22],
        );
        for j in 0..16 {
            let (lo, hi) = five_bits(qh, qs, j);
            out[j] = d * (lo - 16) as f32;
            out[j + 16] = d * (hi - 16) as f32;
        }
    }
}

pub struct Q5_1;
impl Decode for Q5_1 {
    const N: usize = 32;
    const BYTES: usize = 24;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let (qh, qs) = (u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &b[8..24]);
        for j in 0..16 {
            let (lo, hi) = five_bits(qh, qs, j);
            out[j] = d * lo as f32 + m;
            out[j + 16] = d * hi as f32 + m;
        }
    }
}

pub struct Iq4Nl;
impl Decode for Iq4Nl {
    const N: usize = 32;
    const BYTES: usize = 18;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, qs) = (f16_at(b, 0), &b[2..18]);
        for j in 0..16 {
            out[j] = d * IQ4_VALUES[(qs[j] & 0xF) as usize] as f32;
            out[j + 16] = d * IQ4_VALUES[(qs[j] >> 4) as usize] as f32;
        }
    }
}

pub struct Mxfp4;
impl Decode for Mxfp4 {
    const N: usize = 32;
    const BYTES: usize = 17;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, qs) = (e8m0_half(b[0]), &b[1..17]);
        for j in 0..16 {
            out[j] = d * E2M1_DOUBLED[(qs[j] & 0xF) as usize] as f32;
            out[j + 16] = d * E2M1_DOUBLED[(qs[j] >> 4) as usize] as f32;
        }
    }
}

pub struct Q2K;
impl Decode for Q2K {
    const N: usize = 256;
    const BYTES: usize = 84;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (sc, qs) = (&b[0..16], &b[16..80]);
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        // Weights 128 h + 32 k + e: bits 2k of byte 32 h + e; sub-blocks of 16 weights.
        for h in 0..2 {
            for k in 0..4 {
                for half in 0..2 {
                    let s = h * 8 + k * 2 + half;
                    let dl = d * (sc[s] & 0xF) as f32;
                    let ml = dmin * (sc[s] >> 4) as f32;
                    let bytes = &qs[h * 32 + half * 16..h * 32 + half * 16 + 16];
                    let o = &mut out[s * 16..s * 16 + 16];
                    for e in 0..16 {
                        o[e] = dl * ((bytes[e] >> (2 * k)) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

pub struct Q3K;
impl Decode for Q3K {
    const N: usize = 256;
    const BYTES: usize = 110;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
        let d = f16_at(b, 108);
        // Weight p = 128 h + 32 k + e: bits 2k of byte 32 h + e of the codes, bit p / 32 of
        // high-bit byte e; sub-blocks of 16 weights.
        for h in 0..2 {
            for k in 0..4 {
                let hb = h * 4 + k;
                for half in 0..2 {
                    let s = hb * 2 + half;
                    let low = (sc[s % 8] >> (4 * (s / 8))) & 0xF;
                    let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
                    let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
                    let (bytes, hm) = (&qs[h * 32 + half * 16..][..16], &hmask[half * 16..][..16]);
                    let o = &mut out[s * 16..s * 16 + 16];
                    for e in 0..16 {
                        let hbit = ((hm[e] >> hb) & 1) as i32;
                        let q = ((bytes[e] >> (2 * k)) & 3) as i32 - 4 * (1 - hbit);
                        o[e] = dl * q as f32;
                    }
                }
            }
        }
    }
}

/// Q4_K's and Q5_K's 6-bit scale and min of sub-block `s` (of 8) from their 12 bytes.
#[inline(always)]
pub fn scale_min_k4(sc: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (sc[s] & 63, sc[s + 4] & 63)
    } else {
        (
            (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4),
            (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4),
        )
    }
}

pub struct Q4K;
impl Decode for Q4K {
    const N: usize = 256;
    const BYTES: usize = 144;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, dmin, sc, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..16], &b[16..144]);
        for s in 0..8 {
            let (scale, min) = scale_min_k4(sc, s);
            let (dl, ml) = (d * scale as f32, dmin * min as f32);
            let bytes = &qs[(s / 2) * 32..(s / 2) * 32 + 32];
            for e in 0..32 {
                let q = (bytes[e] >> (4 * (s % 2))) & 0xF;
                out[s * 32 + e] = dl * q as f32 - ml;
            }
        }
    }
}

pub struct Q5K;
impl Decode for Q5K {
    const N: usize = 256;
    const BYTES: usize = 176;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, dmin, sc) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
        let (qh, qs) = (&b[16..48], &b[48..176]);
        for s in 0..8 {
            let (scale, min) = scale_min_k4(sc, s);
            let (dl, ml) = (d * scale as f32, dmin * min as f32);
            let bytes = &qs[(s / 2) * 32..(s / 2) * 32 + 32];
            for e in 0..32 {
                let q = ((bytes[e] >> (4 * (s % 2))) & 0xF) | (((qh[e] >> s) & 1) << 4);
                out[s * 32 + e] = dl * q as f32 - ml;
            }
        }
    }
}

pub struct Q6K;
impl Decode for Q6K {
    const N: usize = 256;
    const BYTES: usize = 210;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
        let d = f16_at(b, 208);
        // Weight 128 h + 32 k + e: nibble k / 2 of low byte 64 h + 32 (k % 2) + e, bits 2k of
        // high byte 32 h + e; sub-blocks of 16 weights.
        for h in 0..2 {
            for k in 0..4 {
                let low_bytes = &ql[h * 64 + 32 * (k % 2)..][..32];
                let high_bytes = &qh[h * 32..][..32];
                let base = h * 128 + k * 32;
                let (dl0, dl1) = (
                    d * (sc[base / 16] as i8) as f32,
                    d * (sc[base / 16 + 1] as i8) as f32,
                );
                for e in 0..32 {
                    let low = (low_bytes[e] >> (4 * (k / 2))) & 0xF;
                    let high = (high_bytes[e] >> (2 * k)) & 3;
                    let dl = if e < 16 { dl0 } else { dl1 };
                    out[base + e] = dl * ((low | (high << 4)) as i32 - 32) as f32;
                }
            }
        }
    }
}

pub struct Iq4Xs;
impl Decode for Iq4Xs {
    const N: usize = 256;
    const BYTES: usize = 136;
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        let scales_h = u16::from_le_bytes([b[2], b[3]]);
        let (scales_l, qs) = (&b[4..8], &b[8..136]);
        for s in 0..8 {
            let low = (scales_l[s / 2] >> (4 * (s % 2))) & 0xF;
            let high = ((scales_h >> (2 * s)) & 3) as u8;
            let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
            let bytes = &qs[s * 16..s * 16 + 16];
            for j in 0..16 {
                out[s * 32 + j] = dl * IQ4_VALUES[(bytes[j] & 0xF) as usize] as f32;
                out[s * 32 + j + 16] = dl * IQ4_VALUES[(bytes[j] >> 4) as usize] as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: f32) -> [u8; 2] {
        half::f16::from_f32(v).to_bits().to_le_bytes()
    }

    #[test]
    fn q4_0_is_scale_times_nibble_minus_eight() {
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16_bytes(0.5));
        b[2] = 0x3A; // weight 0: 0xA, weight 16: 0x3
        let mut out = [0f32; 32];
        Q4_0::decode(&b, &mut out);
        assert_eq!((out[0], out[16], out[1]), (1.0, -2.5, -4.0));
    }

    #[test]
    fn q5_0_takes_the_fifth_bit_of_weight_j_from_bit_j() {
        let mut b = vec![0u8; 22];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        b[2..6].copy_from_slice(&(1u32 << 17).to_le_bytes());
        b[6 + 1] = 0x20; // weight 1: 0, weight 17: 2
        let mut out = [0f32; 32];
        Q5_0::decode(&b, &mut out);
        assert_eq!((out[1], out[17]), (-16.0, 2.0));
    }

    #[test]
    fn q4_k_unpacks_the_six_bit_scales_of_the_upper_sub_blocks() {
        let mut b = vec![0u8; 144];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        b[2..4].copy_from_slice(&f16_bytes(1.0));
        // Sub-block 5: scale low nibble in byte 9 (of the scales), high bits in byte 1's top.
        let sc = &mut b[4..16];
        sc[9] = 0x2 | (0x3 << 4); // scale low 2, min low 3
        sc[1] = 0b01 << 6; // scale high 1 -> scale 0x12
        sc[5] = 0b10 << 6; // min high 2 -> min 0x23
                           // Sub-block 5 is the high nibbles of bytes 64..96 of the codes.
        b[16 + 64] = 0x70;
        let mut out = [0f32; 256];
        Q4K::decode(&b, &mut out);
        assert_eq!(out[5 * 32], 18.0 * 7.0 - 35.0);
    }

    #[test]
    fn the_q8_0_decoder_gives_q8_0_s_weights() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16_bytes(0.25));
        b[2 + 5] = (-7i8) as u8;
        let mut out = [0f32; 32];
        Q8_0::decode(&b, &mut out);
        assert_eq!(out[5], crate::q8_0::weight(&b, 5));
        assert_eq!(out[5], -1.75);
    }

    #[test]
    fn mxfp4_halves_match_the_e8m0_scale() {
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(130), 4.0);
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
    }
}
