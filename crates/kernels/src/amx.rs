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
//! tokens), loads two tiles of
//! weights (16 rows of 64 bytes each, straight from the matrix with its row pitch as the stride)
//! and two of activations per 32 inputs, and runs four tile products on them.

use std::arch::asm;
use std::sync::OnceLock;

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
    /// u16s per tile row (two inputs of every part of every token).
    fn row_len(self) -> usize {
        2 * self.parts * self.cols
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
    data: Vec<u16>,
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
        let mut data = crate::take_u16(tokens.div_ceil(cols) * k_tiles * tile);
        let fill = |i: usize, chunk: &mut [u16]| {
            chunk.fill(0);
            for (g, t) in chunk.chunks_exact_mut(tile).enumerate() {
                let g = i * TILES_PER_TASK + g;
                fill_tile_fast(xs, tokens, in_dim, lay, g / k_tiles, g % k_tiles, t);
            }
        };
        if tokens * in_dim < 1 << 14 {
            data.chunks_mut(TILES_PER_TASK * tile)
                .enumerate()
                .for_each(|(i, c)| fill(i, c));
        } else {
            crate::for_each_chunk(&mut data, TILES_PER_TASK * tile, fill);
        }
        AmxAct {
            tokens,
            in_dim,
            k_tiles,
            cols,
            parts,
            data,
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
        let p = self.data[(b * self.k_tiles + kt) * ROWS * row_len..].as_ptr() as *const u8;
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

/// The tile configuration (palette 1) for a pass of `m` = (m0, m1) rows and `n` = (n0, n1)
/// tokens (a 0 leaves that tile out): tiles 0-3 the sums of (rows 0, tokens 0), (rows 1,
/// tokens 0), (rows 0, tokens 1), (rows 1, tokens 1); 4 and 5 the two row blocks' weights for
/// 32 inputs; 6 and 7 the two token blocks' activation parts for the same inputs.
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
    fn new(m: (usize, usize), n: (usize, usize), parts: usize) -> TileConfig {
        let most = tokens_per_block(parts);
        assert!(m.0 > 0 && m.0 <= ROWS && m.1 <= ROWS && n.0 > 0 && n.0 <= most && n.1 <= most);
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
            reserved2: [0; 16],
        };
        let cols = |n: usize| (4 * parts * n) as u16;
        let mut set = |tile: usize, rows: usize, colsb: u16| {
            if rows > 0 && colsb > 0 {
                c.rows[tile] = rows as u8;
                c.colsb[tile] = colsb;
            }
        };
        set(0, m.0, cols(n.0));
        set(1, m.1, cols(n.0));
        set(2, m.0, cols(n.1));
        set(3, m.1, cols(n.1));
        set(4, m.0, 64);
        set(5, m.1, 64);
        set(6, ROWS, cols(n.0));
        set(7, ROWS, cols(n.1));
        c
    }
}

/// Where a block's weights for one input tile come from: straight from the matrix (its row
/// pitch as the stride) or, past the last whole 32 inputs, from a zero-padded copy.
struct WeightTiles<'a> {
    w: &'a [u16],
    in_dim: usize,
    r0: usize,
    rows: usize,
    pad: [u16; ROWS * K_TILE],
}

impl<'a> WeightTiles<'a> {
    fn new(w: &'a [u16], in_dim: usize, r0: usize, rows: usize) -> WeightTiles<'a> {
        WeightTiles {
            w,
            in_dim,
            r0,
            rows,
            pad: [0; ROWS * K_TILE],
        }
    }

    /// Asks for input tile `kt` of every row of the block; past the last tile, for tile
    /// `kt - k_tiles` of the rows a pass further on (`ROWS_PER_PASS` rows down: the next pass's
    /// block), so the next pass's first tiles are on their way too. A hint: it never faults,
    /// also past the matrix.
    fn prefetch(&self, kt: usize) {
        let k_tiles = self.in_dim.div_ceil(K_TILE);
        let (kt, r0) = if kt < k_tiles {
            (kt, self.r0)
        } else {
            (kt - k_tiles, self.r0 + ROWS_PER_PASS)
        };
        let k0 = kt * K_TILE;
        if k0 >= self.in_dim {
            return;
        }
        let first = self.w.as_ptr().wrapping_add(r0 * self.in_dim + k0) as *const i8;
        for r in 0..self.rows {
            let p = first.wrapping_add(2 * r * self.in_dim);
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) };
        }
    }

    /// (pointer, stride in bytes) of input tile `kt`.
    fn tile(&mut self, kt: usize) -> (*const u8, usize) {
        let k0 = kt * K_TILE;
        if self.rows == 0 || k0 + K_TILE <= self.in_dim {
            let p = self.w[(self.r0 * self.in_dim + k0).min(self.w.len())..].as_ptr() as *const u8;
            return (p, self.in_dim * 2);
        }
        self.pad = [0; ROWS * K_TILE];
        let width = self.in_dim - k0;
        for r in 0..self.rows {
            let src = (self.r0 + r) * self.in_dim + k0;
            self.pad[r * K_TILE..r * K_TILE + width].copy_from_slice(&self.w[src..src + width]);
        }
        (self.pad.as_ptr() as *const u8, K_TILE * 2)
    }
}

/// How many input tiles ahead a block's weight rows are prefetched (512 bytes of each row: the
/// tile loads of a block touch 16 rows 64 bytes at a time, which the hardware prefetchers do
/// not follow as far as a sequential read; 8 measured better than 16, 32 and 64 for one token
/// on the H200 machine's Xeon).
const PREFETCH_TILES: usize = 8;

/// Rows a pass covers (two blocks of [`ROWS`]).
const ROWS_PER_PASS: usize = 2 * ROWS;

/// One tile of sums as stored (16 rows of 16 f32).
#[repr(C, align(64))]
struct Sums([[f32; 16]; ROWS]);

/// `out(r, t) = row r . token t` for rows `r0..r0 + rows` of `w` (`in_dim` wide) and the tokens
/// of column blocks `blocks` of `act`, written through `put(r, t, value)` (r counted from
/// `r0`). Passes of 32 rows x two column blocks (10 tokens, 16 with two parts): each weight
/// tile feeds two tile products, each activation tile two; the rows' weights come from memory on
/// the first pass and from the core's cache on the next ones.
///
/// # Safety
/// [`enabled`] must be true.
pub unsafe fn rows(
    w: &[u16],
    in_dim: usize,
    r0: usize,
    rows: usize,
    act: &AmxAct,
    blocks: std::ops::Range<usize>,
    mut put: impl FnMut(usize, usize, f32),
) {
    assert!(in_dim > 0 && act.in_dim == in_dim && w.len().is_multiple_of(in_dim));
    assert!(r0 + rows <= w.len() / in_dim && blocks.end <= act.blocks());
    let mut sums = [
        Sums([[0.0; 16]; ROWS]),
        Sums([[0.0; 16]; ROWS]),
        Sums([[0.0; 16]; ROWS]),
        Sums([[0.0; 16]; ROWS]),
    ];
    let mut configured = None;
    let mut rp = 0;
    while rp < rows {
        let m0 = (rows - rp).min(ROWS);
        let m1 = (rows - rp - m0).min(ROWS);
        let mut a = [
            WeightTiles::new(w, in_dim, r0 + rp, m0),
            WeightTiles::new(w, in_dim, r0 + rp + m0, m1),
        ];
        let mut b = blocks.start;
        while b < blocks.end {
            let two = b + 1 < blocks.end;
            let n = (act.tokens_in(b), if two { act.tokens_in(b + 1) } else { 0 });
            if configured != Some(((m0, m1), n)) {
                let cfg = TileConfig::new((m0, m1), n, act.parts);
                asm!("ldtilecfg [{}]", in(reg) &cfg as *const TileConfig, options(nostack, readonly));
                configured = Some(((m0, m1), n));
            }
            pass(&mut a, act, b, two, b == blocks.start, &mut sums);
            let tiles = [(0, 0, 0), (1, m0, 0), (2, 0, 1), (3, m0, 1)];
            for (s, dr, db) in tiles {
                let (m, nt) = (if dr == 0 { m0 } else { m1 }, if db == 0 { n.0 } else { n.1 });
                for i in 0..m {
                    let row = &sums[s].0[i];
                    for j in 0..nt {
                        put(rp + dr + i, (b + db) * act.cols + j, act.sum(row, j));
                    }
                }
            }
            b += 2;
        }
        rp += m0 + m1;
    }
    asm!("tilerelease", options(nostack, nomem));
}

/// `out[(r - rows.start) * T + t] = row r . xs[t]` for the T tokens of `xs` (T x in_dim), the
/// activations laid out for this call.
///
/// # Safety
/// [`enabled`] must be true.
pub unsafe fn product(
    w: &[u16],
    in_dim: usize,
    rows: std::ops::Range<usize>,
    xs: &[f32],
    tokens: usize,
    out: &mut [f32],
) {
    assert_eq!(out.len(), rows.len() * tokens);
    let act = AmxAct::new(xs, tokens, in_dim);
    let blocks = 0..act.blocks();
    self::rows(w, in_dim, rows.start, rows.len(), &act, blocks, |r, j, v| {
        out[r * tokens + j] = v
    })
}

/// One pass over every input tile: the sums of up to 2 row blocks x 2 column blocks (`two`: a
/// second column block), stored into `sums` (tile order as in [`TileConfig`]); `prefetch` on
/// the first pass over these rows.
#[inline]
unsafe fn pass(
    a: &mut [WeightTiles; 2],
    act: &AmxAct,
    b: usize,
    two: bool,
    prefetch: bool,
    sums: &mut [Sums; 4],
) {
    let rows2 = a[1].rows > 0;
    // Only configured tiles may be named.
    asm!("tilezero tmm0", options(nostack, nomem));
    if rows2 {
        asm!("tilezero tmm1", options(nostack, nomem));
    }
    if two {
        asm!("tilezero tmm2", options(nostack, nomem));
    }
    if rows2 && two {
        asm!("tilezero tmm3", options(nostack, nomem));
    }
    for kt in 0..act.k_tiles {
        if prefetch {
            a[0].prefetch(kt + PREFETCH_TILES);
            a[1].prefetch(kt + PREFETCH_TILES);
        }
        let (p0, sa0) = a[0].tile(kt);
        let (p1, sa1) = a[1].tile(kt);
        let (x0, sx) = act.tile(b, kt);
        let x1 = if two { act.tile(b + 1, kt).0 } else { x0 };
        match (rows2, two) {
            (true, true) => asm!(
                "tileloadd tmm4, [{p0} + {sa0}*1]",
                "tileloadd tmm5, [{p1} + {sa1}*1]",
                "tileloadd tmm6, [{x0} + {sx}*1]",
                "tileloadd tmm7, [{x1} + {sx}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm6",
                "tdpbf16ps tmm2, tmm4, tmm7",
                "tdpbf16ps tmm3, tmm5, tmm7",
                p0 = in(reg) p0, sa0 = in(reg) sa0, p1 = in(reg) p1, sa1 = in(reg) sa1,
                x0 = in(reg) x0, x1 = in(reg) x1, sx = in(reg) sx,
                options(nostack, readonly),
            ),
            (true, false) => asm!(
                "tileloadd tmm4, [{p0} + {sa0}*1]",
                "tileloadd tmm5, [{p1} + {sa1}*1]",
                "tileloadd tmm6, [{x0} + {sx}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm6",
                p0 = in(reg) p0, sa0 = in(reg) sa0, p1 = in(reg) p1, sa1 = in(reg) sa1,
                x0 = in(reg) x0, sx = in(reg) sx,
                options(nostack, readonly),
            ),
            (false, true) => asm!(
                "tileloadd tmm4, [{p0} + {sa0}*1]",
                "tileloadd tmm6, [{x0} + {sx}*1]",
                "tileloadd tmm7, [{x1} + {sx}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm2, tmm4, tmm7",
                p0 = in(reg) p0, sa0 = in(reg) sa0,
                x0 = in(reg) x0, x1 = in(reg) x1, sx = in(reg) sx,
                options(nostack, readonly),
            ),
            (false, false) => asm!(
                "tileloadd tmm4, [{p0} + {sa0}*1]",
                "tileloadd tmm6, [{x0} + {sx}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                p0 = in(reg) p0, sa0 = in(reg) sa0,
                x0 = in(reg) x0, sx = in(reg) sx,
                options(nostack, readonly),
            ),
        }
    }
    let [o0, o1, o2, o3] = [0, 1, 2, 3].map(|i| sums[i].0.as_mut_ptr() as *mut u8);
    asm!("tilestored [{o} + {s}*1], tmm0", o = in(reg) o0, s = in(reg) 64usize, options(nostack));
    if rows2 {
        asm!("tilestored [{o} + {s}*1], tmm1", o = in(reg) o1, s = in(reg) 64usize, options(nostack));
    }
    if two {
        asm!("tilestored [{o} + {s}*1], tmm2", o = in(reg) o2, s = in(reg) 64usize, options(nostack));
    }
    if rows2 && two {
        asm!("tilestored [{o} + {s}*1], tmm3", o = in(reg) o3, s = in(reg) 64usize, options(nostack));
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
