//! BF16 products on Intel AMX tiles (`tdpbf16ps`), for every BF16 product of a process, when
//! asked for (`STRATA_AMX=1`) and the CPU and Linux allow it. Off by default: measured on the H200
//! machine's Xeon (AMX BF16/INT8) it is slower than the AVX-512 kernels for one token (decode)
//! and for whole prompts, faster only for some matrices at 128 tokens (docs/PERFORMANCE.md).
//!
//! A tile product multiplies BF16 by BF16 into f32 sums, but activations are f32: each is split
//! exactly into three BF16 parts (x = hi + mid + lo, each the top 8 significant bits of what is
//! left), so every product of a weight (BF16, exact) with a part is exact in f32 and the only
//! rounding is the f32 accumulation, as in the SIMD kernels: each part's sum runs over the inputs
//! in order, and the three sums are added in a fixed order.
//!
//! Batch invariance: the sum of output (row n, token t) depends only on row n's weights and
//! token t's activation, through the same tile steps in the same order, whatever the number of
//! tokens (a lone token fills one column of a 16-column tile; the others are zero) and whichever
//! tile of the block its row lands in. So one-token products (decode) and several-token ones
//! (prompts, batches) give the same bits, and every BF16 product of the process takes this path.
//!
//! Tiles: 0-2 hold a block of 16 rows x up to 16 tokens' f32 sums with the activation's hi, mid
//! and lo parts (summed apart, then added: (hi + mid) + lo); 3 the block's weights for 32 inputs
//! (16 rows of 64 bytes, loaded straight from the matrix with its row pitch as the stride); 4-6
//! the activation's three parts for the same 32 inputs (16 rows of input pairs x the block's
//! tokens, laid out once per product by [`AmxAct`]). A block of n
//! tokens uses tiles n columns wide, so a lone token (decode) reads 6 bytes of activation per
//! input, not a 16-column tile mostly of zeros.

use std::arch::asm;
use std::sync::OnceLock;

/// Inputs per tile step (16 pairs of BF16 per 64-byte tile row).
pub const K_TILE: usize = 32;
/// Rows of a block (one tile of sums) and tokens per block of columns.
pub const ROWS: usize = 16;
pub const TOKENS: usize = 16;

/// Whether BF16 products run on AMX: `STRATA_AMX=1` asks for it, the kernels in use are
/// AVX-512 (see [`crate::isa`]), the CPU has AMX-TILE and AMX-BF16, and Linux granted the
/// process the tile data state.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let asked = std::env::var("STRATA_AMX").is_ok_and(|v| v == "1");
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

/// The tile configuration (palette 1) for blocks of `n` tokens: tiles 0-2 (sums) 16 rows of n
/// f32, 3 (weights) 16 rows of 32 BF16, 4-6 (activation parts) 16 rows of n input pairs.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
    reserved2: [u8; 16],
}

impl TileConfig {
    fn for_tokens(n: usize) -> TileConfig {
        assert!((1..=TOKENS).contains(&n));
        let c = 4 * n as u16;
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [c, c, c, 64, c, c, c, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            rows: [16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            reserved2: [0; 16],
        }
    }
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

/// Input tiles per task when an activation is laid out on the kernels' threads.
const KT_PER_TASK: usize = 8;

/// Activations laid out for the tiles. Tokens go in blocks of 16 (the last one shorter, n
/// tokens); per block and per 32 inputs three tiles (hi, mid, lo) of 16 rows, row p holding
/// inputs 2p and 2p + 1 of each of the block's n tokens (n pairs, 4n bytes); inputs past the
/// end are zero. For one token this is each part's BF16 in input order.
pub struct AmxAct {
    pub tokens: usize,
    pub in_dim: usize,
    k_tiles: usize,
    data: Vec<u16>,
}

impl AmxAct {
    /// From `xs` (tokens x in_dim, row-major); blocks of 16 or more tokens are laid out on the
    /// kernels' threads.
    pub fn new(xs: &[f32], tokens: usize, in_dim: usize) -> AmxAct {
        assert_eq!(xs.len(), tokens * in_dim);
        let k_tiles = in_dim.div_ceil(K_TILE);
        let mut data = vec![0u16; tokens * k_tiles * 3 * K_TILE];
        for (tb, block) in data.chunks_mut(TOKENS * k_tiles * 3 * K_TILE).enumerate() {
            let n = (tokens - tb * TOKENS).min(TOKENS);
            let x = &xs[tb * TOKENS * in_dim..(tb * TOKENS + n) * in_dim];
            let per_task = KT_PER_TASK * 3 * K_TILE * n;
            let fill = |i: usize, chunk: &mut [u16]| fill_tiles(x, n, in_dim, i * KT_PER_TASK, chunk);
            if n == TOKENS {
                crate::for_each_chunk(block, per_task, fill);
            } else {
                block
                    .chunks_mut(per_task)
                    .enumerate()
                    .for_each(|(i, c)| fill(i, c));
            }
        }
        AmxAct {
            tokens,
            in_dim,
            k_tiles,
            data,
        }
    }

    /// The three tiles (hi, mid, lo) of token block `tb` at input tile `kt`, and their stride.
    fn tiles(&self, tb: usize, kt: usize) -> ([*const u8; 3], usize) {
        let n = (self.tokens - tb * TOKENS).min(TOKENS);
        let tile = K_TILE * n; // u16 per tile
        let base = tb * TOKENS * self.k_tiles * 3 * K_TILE + kt * 3 * tile;
        let p = |s: usize| self.data[base + s * tile..].as_ptr() as *const u8;
        ([p(0), p(1), p(2)], 4 * n)
    }
}

/// The tiles of input tiles `kt0..` of a block of `n` tokens (`x`: n x in_dim) into `out`
/// (whole input tiles, each three tiles of 32 n).
fn fill_tiles(x: &[f32], n: usize, in_dim: usize, kt0: usize, out: &mut [u16]) {
    let tile = K_TILE * n;
    for (i, tiles) in out.chunks_mut(3 * tile).enumerate() {
        let k0 = (kt0 + i) * K_TILE;
        let width = (in_dim - k0).min(K_TILE);
        for t in 0..n {
            let xt = &x[t * in_dim + k0..t * in_dim + k0 + width];
            for (j, &v) in xt.iter().enumerate() {
                // Row j / 2, token t, element j % 2 of the pair.
                let at = (j / 2) * 2 * n + 2 * t + j % 2;
                let [hi, mid, lo] = split3(v);
                tiles[at] = hi;
                tiles[tile + at] = mid;
                tiles[2 * tile + at] = lo;
            }
        }
    }
}

/// Where a block's weights for one input tile come from: straight from the matrix (its row
/// pitch as the stride) or, at the ragged edges (fewer than 16 rows, fewer than 32 inputs
/// left), from a zero-padded copy.
struct WeightTiles<'a> {
    w: &'a [u16],
    in_dim: usize,
    rows: usize,
    r0: usize,
    pad: [u16; ROWS * K_TILE],
}

impl<'a> WeightTiles<'a> {
    fn new(w: &'a [u16], in_dim: usize, r0: usize) -> WeightTiles<'a> {
        let rows = (w.len() / in_dim - r0).min(ROWS);
        WeightTiles {
            w,
            in_dim,
            rows,
            r0,
            pad: [0; ROWS * K_TILE],
        }
    }

    /// Asks for input tile `kt` of every row of the block (a hint: nothing past the matrix).
    fn prefetch(&self, kt: usize) {
        let k0 = kt * K_TILE;
        if k0 >= self.in_dim {
            return;
        }
        for r in 0..self.rows {
            let p = self.w[(self.r0 + r) * self.in_dim + k0..].as_ptr() as *const i8;
            // SAFETY: a prefetch never faults; `p` is inside the matrix.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) };
        }
    }

    /// (pointer, stride in bytes) of input tile `kt`.
    fn tile(&mut self, kt: usize) -> (*const u8, usize) {
        let k0 = kt * K_TILE;
        if self.rows == ROWS && k0 + K_TILE <= self.in_dim {
            let p = self.w[(self.r0 * self.in_dim + k0)..].as_ptr() as *const u8;
            return (p, self.in_dim * 2);
        }
        self.pad = [0; ROWS * K_TILE];
        let width = (self.in_dim - k0).min(K_TILE);
        for r in 0..self.rows {
            let src = (self.r0 + r) * self.in_dim + k0;
            self.pad[r * K_TILE..r * K_TILE + width].copy_from_slice(&self.w[src..src + width]);
        }
        (self.pad.as_ptr() as *const u8, K_TILE * 2)
    }
}

/// How many input tiles ahead a block's weight rows are prefetched (1 KiB of each row: the
/// tile loads of a block touch 16 rows 64 bytes at a time, which the hardware prefetchers do
/// not follow as far as a sequential read).
const PREFETCH_TILES: usize = 16;

/// `out(r, t) = row r . token t` for rows `r0..r0 + rows` of `w` (`in_dim` wide) and every token
/// of `act`, written through `put(r, t, value)` (r counted from `r0`).
///
/// # Safety
/// [`enabled`] must be true.
pub unsafe fn rows(
    w: &[u16],
    in_dim: usize,
    r0: usize,
    rows: usize,
    act: &AmxAct,
    mut put: impl FnMut(usize, usize, f32),
) {
    assert!(in_dim > 0 && act.in_dim == in_dim && w.len().is_multiple_of(in_dim));
    assert!(r0 + rows <= w.len() / in_dim);
    let mut sums = [[[0f32; TOKENS]; ROWS]; 3];
    let mut configured = 0;
    for tb in 0..act.tokens.div_ceil(TOKENS) {
        let n = (act.tokens - tb * TOKENS).min(TOKENS);
        if n != configured {
            let cfg = TileConfig::for_tokens(n);
            asm!("ldtilecfg [{}]", in(reg) &cfg as *const TileConfig, options(nostack, readonly));
            configured = n;
        }
        let mut r = 0;
        while r < rows {
            let mut a = WeightTiles::new(w, in_dim, r0 + r);
            block(&mut a, act, tb, &mut sums);
            for i in 0..(rows - r).min(ROWS) {
                for j in 0..n {
                    put(
                        r + i,
                        tb * TOKENS + j,
                        (sums[0][i][j] + sums[1][i][j]) + sums[2][i][j],
                    );
                }
            }
            r += ROWS;
        }
    }
    asm!("tilerelease", options(nostack, nomem));
}

/// One block of (up to) 16 rows x one block of tokens: the products with the activation's hi,
/// mid and lo parts summed apart (three independent tile sums, so the tile products never wait
/// on each other), into `sums[part][row][token]`.
#[inline]
unsafe fn block(a: &mut WeightTiles, act: &AmxAct, tb: usize, sums: &mut [[[f32; TOKENS]; ROWS]; 3]) {
    asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        options(nostack, nomem)
    );
    for kt in 0..act.k_tiles {
        a.prefetch(kt + PREFETCH_TILES);
        let (p, sa) = a.tile(kt);
        let ([hi, mid, lo], s) = act.tiles(tb, kt);
        asm!(
            "tileloadd tmm3, [{p} + {sa}*1]",
            "tileloadd tmm4, [{hi} + {s}*1]",
            "tileloadd tmm5, [{mid} + {s}*1]",
            "tileloadd tmm6, [{lo} + {s}*1]",
            "tdpbf16ps tmm0, tmm3, tmm4",
            "tdpbf16ps tmm1, tmm3, tmm5",
            "tdpbf16ps tmm2, tmm3, tmm6",
            p = in(reg) p,
            sa = in(reg) sa,
            hi = in(reg) hi,
            mid = in(reg) mid,
            lo = in(reg) lo,
            s = in(reg) s,
            options(nostack, readonly),
        );
    }
    asm!(
        "tilestored [{o} + {s}*1], tmm0",
        "tilestored [{o} + {s}*1 + 1024], tmm1",
        "tilestored [{o} + {s}*1 + 2048], tmm2",
        o = in(reg) sums.as_mut_ptr() as *mut u8,
        s = in(reg) 64usize,
        options(nostack),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_bf16_parts_add_up_to_the_f32_exactly() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..100_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
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
