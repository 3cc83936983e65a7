//! BF16 products on Intel AMX tiles (`tdpbf16ps`), for every BF16 product of a process, where
//! the CPU and Linux allow it (`STRATA_AMX=0` turns it off). Measured on the H200 machine's Xeon
//! (AMX BF16/INT8): whole 512-token prompts 1.3-1.4x the AVX-512 kernels, decode as fast
//! (docs/PERFORMANCE.md).
//!
//! A tile product multiplies BF16 by BF16 into f32 sums, but activations are f32: each is split
//! exactly into three BF16 parts (x = hi + mid + lo, each the top 8 significant bits of what is
//! left), so every product of a weight (BF16, exact) with a part is exact in f32 and the only
//! rounding is the f32 accumulation, as in the SIMD kernels: each part's sum runs over the inputs
//! in order, and the three sums are added in a fixed order. `STRATA_AMX_PARTS=2` takes two
//! rounded parts instead (x = hi + lo within 2^-17 |x|, [`split2`]): eight tokens per tile instead
//! of five, 1.2-1.3x faster prompts, logits about 10x further from exact (1e-4 against 1e-5 on the
//! fixtures, whose tolerance is 1e-2); the same bits whatever the batch either way.
//!
//! Batch invariance: the sum of output (row n, token t) depends only on row n's weights and
//! token t's activation, through the same tile steps in the same order, whatever the number of
//! tokens, whichever column of a tile its parts land in and whichever tile its row lands in. So
//! one-token products (decode) and several-token ones (prompts, batches) give the same bits, and
//! every BF16 product of the process takes this path.
//!
//! Layout: a token's three (two) parts are three (two) columns of an activation tile (five
//! (eight) tokens per tile, laid out once per product by [`AmxAct`]), so one tile product gives
//! 16 rows x 5 (8) tokens of all their sums. A pass keeps 2 x 2 tiles of sums (32 rows x 10 (16)
//! tokens), loads two tiles of weights (16 rows of 64 bytes each, straight from the matrix with
//! its row pitch as the stride, or from a copy on whole cache lines where the matrix's rows are
//! not) and two of activations per 32 inputs, and runs four tile products on them. Prompt-sized
//! tasks take the inputs in chunks so that their activations stay in the core's caches
//! ([`rows`]).

use std::sync::OnceLock;

mod tiles;
pub use tiles::{product, rows};

/// Inputs per tile step (16 pairs of BF16 per 64-byte tile row).
pub const K_TILE: usize = 32;
/// Rows of a block of sums (one tile).
pub const ROWS: usize = 16;
/// Columns of an activation tile (16 pairs of BF16 per 64-byte row).
const COLS: usize = 16;

/// Columns per token: the parts each f32 activation is split into, 3 (exact; five tokens per
/// tile) unless `STRATA_AMX_PARTS=2` asks for two (rounded, error at most 2^-17 |x|; eight
/// tokens per tile); any other value keeps 3.
pub fn parts() -> usize {
    static PARTS: OnceLock<usize> = OnceLock::new();
    *PARTS.get_or_init(|| match std::env::var("STRATA_AMX_PARTS").as_deref() {
        Ok("2") => 2,
        _ => 3,
    })
}

/// Tokens per block of columns with `parts` columns each: 5 of three parts (15 of a tile's 16
/// columns), 8 of two.
pub fn tokens_per_block(parts: usize) -> usize {
    COLS / parts
}

/// Whether BF16 products run on AMX: `STRATA_AMX=0` does not ask for it, the kernels in use are
/// AVX-512 (see [`crate::isa`]), the CPU has AMX-TILE and AMX-BF16, and Linux granted the
/// process the tile data state.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let asked = std::env::var("STRATA_AMX").map_or(true, |v| v != "0");
        asked && crate::isa::isa() == crate::isa::Isa::Avx512 && cpu_has_amx_bf16() && request_tile_state()
    })
}

/// CPUID leaf 7: AMX-BF16 (EDX bit 22) and AMX-TILE (bit 24).
pub fn cpu_has_amx_bf16() -> bool {
    // Leaf 7 exists on every CPU with AVX-512 (the caller's condition).
    let l7 = std::arch::x86_64::__cpuid_count(7, 0);
    (l7.edx >> 22) & 1 == 1 && (l7.edx >> 24) & 1 == 1
}

/// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`),
/// process-wide; false elsewhere or when refused.
fn request_tile_state() -> bool {
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call with integer arguments.
        let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
        rc == 0
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// The three BF16 parts of x, each truncated to the top of what is left: x = hi + mid + lo
/// exactly (f32's 24 significant bits in three parts of 8).
#[inline]
pub fn split3(x: f32) -> [u16; 3] {
    let top = |v: f32| f32::from_bits(v.to_bits() & 0xffff_0000);
    let hi = top(x);
    let r1 = x - hi;
    let mid = top(r1);
    let lo = top(r1 - mid);
    [
        (hi.to_bits() >> 16) as u16,
        (mid.to_bits() >> 16) as u16,
        (lo.to_bits() >> 16) as u16,
    ]
}

/// The two BF16 parts of x, each rounded to nearest (even): hi = x rounded, lo = x - hi (exact
/// in f32) rounded, so |x - (hi + lo)| <= 2^-17 |x| (hi's remainder is at most half a BF16 step,
/// 2^-8 of x's binade; lo's rounding at most 2^-8 of that) for |x| >= 2^-107; below, lo is a
/// subnormal, which the tile products take as zero (as they do the three parts' smallest).
/// Where rounding would overflow to infinity (|x| >= 0x7f7f8000 as bits), hi is truncated
/// instead and the bound is 2^-17 |x| (1 + 2^-8); for infinities and NaNs too (their parts then
/// add up to a NaN).
#[inline]
pub fn split2(x: f32) -> [u16; 2] {
    let hi = f32::from_bits(round_bf16_bits(x.to_bits()));
    let lo = round_bf16_bits((x - hi).to_bits());
    [(hi.to_bits() >> 16) as u16, (lo >> 16) as u16]
}

/// f32 bits rounded to BF16 (nearest, ties to even), as f32 bits; truncated where the input is
/// infinite or NaN or the rounding overflows.
#[inline]
fn round_bf16_bits(b: u32) -> u32 {
    const EXP: u32 = 0x7f80_0000;
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    if b & EXP == EXP || r & EXP == EXP {
        b & 0xffff_0000
    } else {
        r
    }
}

/// Activation tiles laid out per task when an activation is laid out on the kernels' threads.
const TILES_PER_TASK: usize = 16;

/// How a block of tokens lies in an activation tile: `parts` columns per token (see [`parts`]),
/// `cols` tokens per block.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Layout {
    parts: usize,
    cols: usize,
}

impl Layout {
    /// u16s per tile row: two inputs of every part of every token of the block (up to 60 of 64
    /// bytes with three parts, the rest zero), rounded up to 16, 32 or 64 bytes, so that no tile
    /// row straddles two cache lines (such a tile load measured 6x slower: 43 cycles against 6.6
    /// on the development VM's Xeon). A lone token's rows are 16 bytes: its tiles are a quarter
    /// of a 64-byte row's, every task of a one-token product reads them, and the tile load asks
    /// for only the configured 12 (8) bytes of each row either way.
    fn row_len(self) -> usize {
        let used = 2 * self.parts * self.cols;
        [8, 16].into_iter().find(|&n| used <= n).unwrap_or(2 * COLS)
    }
}

/// Activations laid out for the tiles. Tokens go in blocks of `cols` = min(T, tokens per block)
/// (the last block may hold fewer, its other columns zero); per block and per 32 inputs one tile
/// of 16 rows, row p holding inputs 2p and 2p + 1 of each part (hi, mid, lo; or hi, lo) of each
/// token: column parts * j + q is part q of the block's token j. Inputs past the end are zero.
pub struct AmxAct {
    pub tokens: usize,
    pub in_dim: usize,
    k_tiles: usize,
    cols: usize,
    parts: usize,
    /// The tiles from `data[start]`, its first 64-byte boundary.
    data: Vec<u16>,
    start: usize,
}

impl AmxAct {
    /// From `xs` (tokens x in_dim, row-major), in [`parts`] parts, laid out on the kernels'
    /// threads when large.
    pub fn new(xs: &[f32], tokens: usize, in_dim: usize) -> AmxAct {
        AmxAct::with_parts(xs, tokens, in_dim, parts())
    }

    /// [`AmxAct::new`] with `parts` (2 or 3) parts per activation.
    pub fn with_parts(xs: &[f32], tokens: usize, in_dim: usize, parts: usize) -> AmxAct {
        assert_eq!(xs.len(), tokens * in_dim);
        assert!(parts == 2 || parts == 3);
        let k_tiles = in_dim.div_ceil(K_TILE);
        let cols = tokens.clamp(1, tokens_per_block(parts));
        let lay = Layout { parts, cols };
        let tile = ROWS * lay.row_len();
        let len = tokens.div_ceil(cols) * k_tiles * tile;
        let mut data = crate::take_u16(len + 32);
        let start = data.as_ptr().align_offset(64);
        assert!(start < 32, "a u16 buffer's first 64-byte boundary");
        let fill = |i: usize, chunk: &mut [u16]| {
            chunk.fill(0);
            for (g, t) in chunk.chunks_exact_mut(tile).enumerate() {
                let g = i * TILES_PER_TASK + g;
                fill_tile_fast(xs, tokens, in_dim, lay, g / k_tiles, g % k_tiles, t);
            }
        };
        if tokens * in_dim < 1 << 14 {
            data[start..start + len]
                .chunks_mut(TILES_PER_TASK * tile)
                .enumerate()
                .for_each(|(i, c)| fill(i, c));
        } else {
            crate::for_each_chunk(&mut data[start..start + len], TILES_PER_TASK * tile, fill);
        }
        AmxAct {
            tokens,
            in_dim,
            k_tiles,
            cols,
            parts,
            data,
            start,
        }
    }

    fn layout(&self) -> Layout {
        Layout {
            parts: self.parts,
            cols: self.cols,
        }
    }

    /// The sum of token j's parts in a row of tile sums (in part order, fixed).
    #[inline]
    fn sum(&self, row: &[f32; 16], j: usize) -> f32 {
        if self.parts == 2 {
            row[2 * j] + row[2 * j + 1]
        } else {
            (row[3 * j] + row[3 * j + 1]) + row[3 * j + 2]
        }
    }

    /// Blocks of columns (of up to [`tokens_per_block`] tokens each).
    pub fn blocks(&self) -> usize {
        self.tokens.div_ceil(self.cols)
    }

    /// Tokens per block of columns (the last block may hold fewer).
    pub fn block_tokens(&self) -> usize {
        self.cols
    }

    /// Tokens in block `b`.
    fn tokens_in(&self, b: usize) -> usize {
        (self.tokens - b * self.cols).min(self.cols)
    }

    /// Block `b`'s tile at input tile `kt`, and the tiles' row stride in bytes.
    fn tile(&self, b: usize, kt: usize) -> (*const u8, usize) {
        let row_len = self.layout().row_len();
        let p = self.data[self.start + (b * self.k_tiles + kt) * ROWS * row_len..].as_ptr() as *const u8;
        (p, 2 * row_len)
    }
}

impl Drop for AmxAct {
    fn drop(&mut self) {
        crate::give_back_u16(std::mem::take(&mut self.data));
    }
}

/// Tile `kt` of column block `b` (zeroed before): whole tiles 16 inputs at a time with AVX-512
/// where the CPU has it (always, where AMX is in use), the same bits as [`fill_tile`].
fn fill_tile_fast(xs: &[f32], tokens: usize, in_dim: usize, lay: Layout, b: usize, kt: usize, t: &mut [u16]) {
    if (kt + 1) * K_TILE <= in_dim && crate::isa::isa() == crate::isa::Isa::Avx512 {
        // SAFETY: the kernels in use are AVX-512 only where the CPU has AVX-512 F.
        return unsafe { fill_tile_avx512(xs, tokens, in_dim, lay, b, kt, t) };
    }
    fill_tile(xs, tokens, in_dim, lay, b, kt, t)
}

/// [`fill_tile`] for a whole tile (32 inputs): each part of 16 inputs at once (the same
/// operations on the bits as [`split3`] and [`split2`], so the same bits), as 8 pairs of BF16,
/// then placed into the tile's rows.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[target_feature(enable = "avx512f")]
unsafe fn fill_tile_avx512(
    xs: &[f32],
    tokens: usize,
    in_dim: usize,
    lay: Layout,
    b: usize,
    kt: usize,
    t: &mut [u16],
) {
    use std::arch::x86_64::*;
    let k0 = kt * K_TILE;
    assert!(k0 + K_TILE <= in_dim);
    let (cols, row_len) = (lay.cols, lay.row_len());
    let top = _mm512_set1_epi32(0xffff_0000u32 as i32);
    let half = |v: __m512| -> [u16; 16] {
        let mut out = [0u16; 16];
        let bits = _mm512_srli_epi32::<16>(_mm512_castps_si512(v));
        _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, _mm512_cvtepi32_epi16(bits));
        out
    };
    // `round_bf16_bits` on 16 lanes.
    let exp = _mm512_set1_epi32(0x7f80_0000);
    let round = |v: __m512| -> __m512 {
        let b = _mm512_castps_si512(v);
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
        let r = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
        let r = _mm512_and_si512(r, top);
        let special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(b, exp), exp)
            | _mm512_cmpeq_epi32_mask(_mm512_and_si512(r, exp), exp);
        _mm512_castsi512_ps(_mm512_mask_blend_epi32(special, r, _mm512_and_si512(b, top)))
    };
    for j in 0..(tokens - b * cols).min(cols) {
        let x = &xs[(b * cols + j) * in_dim + k0..][..K_TILE];
        for c in 0..K_TILE / 16 {
            let v = _mm512_loadu_ps(x[16 * c..].as_ptr());
            if lay.parts == 2 {
                let hi = round(v);
                let lo = round(_mm512_sub_ps(v, hi));
                let (h, l) = (half(hi), half(lo));
                for i in 0..8 {
                    let at = (8 * c + i) * row_len + 4 * j;
                    t[at..at + 4].copy_from_slice(&[h[2 * i], h[2 * i + 1], l[2 * i], l[2 * i + 1]]);
                }
                continue;
            }
            let hi = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), top));
            let r1 = _mm512_sub_ps(v, hi);
            let mid = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r1), top));
            let lo = _mm512_sub_ps(r1, mid);
            let (h, m, l) = (half(hi), half(mid), half(lo));
            for i in 0..8 {
                let at = (8 * c + i) * row_len + 6 * j;
                t[at..at + 6].copy_from_slice(&[
                    h[2 * i],
                    h[2 * i + 1],
                    m[2 * i],
                    m[2 * i + 1],
                    l[2 * i],
                    l[2 * i + 1],
                ]);
            }
        }
    }
}

/// Tile `kt` of column block `b` (zeroed before).
fn fill_tile(xs: &[f32], tokens: usize, in_dim: usize, lay: Layout, b: usize, kt: usize, t: &mut [u16]) {
    let k0 = kt * K_TILE;
    let width = (in_dim - k0).min(K_TILE);
    let (cols, parts, row_len) = (lay.cols, lay.parts, lay.row_len());
    for j in 0..(tokens - b * cols).min(cols) {
        let x = &xs[(b * cols + j) * in_dim + k0..][..width];
        for (k, &v) in x.iter().enumerate() {
            let at = (k / 2) * row_len + 2 * parts * j + k % 2;
            let split = if parts == 2 {
                let [h, l] = split2(v);
                [h, l, 0]
            } else {
                split3(v)
            };
            for (q, &part) in split[..parts].iter().enumerate() {
                t[at + 2 * q] = part;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next of a xorshift sequence.
    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    #[test]
    fn whole_tiles_laid_out_with_avx512_equal_the_scalar_layout() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("no AVX-512 F on this CPU: the AVX-512 layout is not tested here");
            return;
        }
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for parts in [3, 2] {
            for (tokens, in_dim) in [(1, 64), (3, 96), (5, 32), (7, 160), (12, 64), (17, 96)] {
                let xs: Vec<f32> = (0..tokens * in_dim)
                    .map(|i| {
                        next(&mut s);
                        match i % 9 {
                            0 => 0.0,
                            1 => f32::from_bits(s as u32 & 0x807f_ffff), // subnormal or zero
                            2 => f32::from_bits((s as u32 & 0x80ff_ffff) | 0x7f00_0000), // near MAX
                            3 => [f32::INFINITY, f32::NAN, -f32::MAX][(s % 3) as usize],
                            _ => f32::from_bits((s as u32 & 0x8fff_ffff) | 0x3000_0000),
                        }
                    })
                    .collect();
                let lay = Layout {
                    parts,
                    cols: tokens.clamp(1, tokens_per_block(parts)),
                };
                let tile = ROWS * lay.row_len();
                for b in 0..tokens.div_ceil(lay.cols) {
                    for kt in 0..in_dim / K_TILE {
                        let (mut want, mut got) = (vec![0u16; tile], vec![0u16; tile]);
                        fill_tile(&xs, tokens, in_dim, lay, b, kt, &mut want);
                        // SAFETY: checked above that the CPU has AVX-512 F.
                        unsafe { fill_tile_avx512(&xs, tokens, in_dim, lay, b, kt, &mut got) };
                        assert_eq!(
                            got, want,
                            "{parts} parts, {tokens} x {in_dim}: block {b}, tile {kt}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn two_rounded_bf16_parts_are_within_2_to_the_minus_17_of_the_f32() {
        let mut s = 0x6A09_E667_F3BC_C908u64;
        let part = |b: u16| f32::from_bits((b as u32) << 16);
        for i in 0..200_000 {
            next(&mut s);
            let x = match i {
                0 => 0.0,
                1 => -1.0,
                2 => f32::MAX,
                3 => -f32::MAX,
                4 => f32::MIN_POSITIVE,
                // The worst case of a truncated hi: lo's rounding at a tie.
                5 => f32::from_bits(0x7f7f_8080),
                6 => -f32::from_bits(0x7f7f_8080),
                // Every sign and exponent from 2^-107 (below, lo is subnormal) to the largest.
                _ => f32::from_bits(((s as u32) & 0x807f_ffff) | ((20 + (s >> 32) as u32 % 235) << 23)),
            };
            let [hi, lo] = split2(x).map(part);
            assert!(hi.is_finite() && lo.is_finite(), "{x:e}: {hi:e} + {lo:e}");
            let err = (x as f64 - (hi as f64 + lo as f64)).abs();
            // Where hi's rounding would overflow it is truncated: 2^-8 more.
            let slack = if x.to_bits() & 0x7fff_ffff >= 0x7f7f_8000 {
                1.0 + 2f64.powi(-8)
            } else {
                1.0
            };
            let most = (x as f64).abs() * 2f64.powi(-17) * slack;
            assert!(err <= most, "{x:e}: {hi:e} + {lo:e}, error {err:e}");
        }
        for x in [f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(part(split2(x)[0]), x);
        }
        assert!(part(split2(f32::NAN)[0]).is_nan());
        assert!(part(split2(f32::from_bits(0xffff_ffff))[0]).is_nan());
    }

    #[test]
    fn three_bf16_parts_add_up_to_the_f32_exactly() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..100_000 {
            next(&mut s);
            // Every sign and a wide range of exponents, plus the plain cases.
            let x = match i {
                0 => 0.0,
                1 => -1.0,
                2 => f32::MAX,
                3 => f32::MIN_POSITIVE,
                _ => f32::from_bits((s as u32 & 0x8fff_ffff) | 0x3000_0000),
            };
            let [hi, mid, lo] = split3(x).map(|b| f32::from_bits((b as u32) << 16));
            assert_eq!((hi + mid) + lo, x, "{x:e}: {hi:e} + {mid:e} + {lo:e}");
            assert!(mid.abs() <= hi.abs() && lo.abs() <= mid.abs().max(f32::MIN_POSITIVE));
        }
    }
}
