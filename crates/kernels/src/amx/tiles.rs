//! The tile products behind [`super::rows`]: passes of 32 rows x two column blocks, the input
//! tiles of a prompt-sized task taken [`K_CHUNK`] at a time so that the task's activations and
//! weights for one chunk stay in the core's caches while every pass uses them.

use std::arch::asm;
use std::ops::Range;

use super::{tokens_per_block, AmxAct, K_TILE, ROWS};

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

    /// Asks for input tile `kt` of every row of the block; past the end of the chunk `ks` being
    /// computed, for the same place in the chunk of the rows a pass further on (`ROWS_PER_PASS`
    /// rows down: the next pass's block), so the next pass's first tiles are on their way too. A
    /// hint: it never faults, also past the matrix.
    #[inline(always)]
    fn prefetch(&self, kt: usize, ks: &Range<usize>) {
        let (kt, r0) = if kt < ks.end {
            (kt, self.r0)
        } else {
            (kt - ks.len(), self.r0 + ROWS_PER_PASS)
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

/// Where a pass's weight tiles come from.
enum Weights<'s, 'a> {
    /// Straight from the matrix, prefetched ahead when `prefetch` (one pair of column blocks:
    /// each weight tile is used once).
    Direct {
        tiles: &'s mut [WeightTiles<'a>; 2],
        prefetch: bool,
    },
    /// From the chunk's copy (several pairs use every tile).
    Staged(&'s Staged),
}

/// One pass's weights for a chunk of input tiles, each tile's 16 rows of 32 inputs as whole
/// 64-byte lines (zero past the matrix's inputs): the matrix's own rows start wherever its
/// storage put them, and a tile load whose rows straddle cache lines is 6x slower; copied once
/// per chunk, then loaded by every pair of column blocks from the first-level cache.
#[repr(C, align(64))]
struct Staged([[u16; ROWS * K_TILE]; 2 * K_CHUNK]);

impl Staged {
    /// Copies input tiles `ks` of rows `first.0 .. first.0 + m.0` (block 0) and
    /// `first.1 .. first.1 + m.1` (block 1) of `w`, and asks for the same inputs of the rows one
    /// pass further on (into the second-level cache: the next pass copies them).
    fn fill(
        &mut self,
        w: &[u16],
        in_dim: usize,
        first: (usize, usize),
        m: (usize, usize),
        ks: &Range<usize>,
    ) {
        for (blk, (r0, rows)) in [(first.0, m.0), (first.1, m.1)].into_iter().enumerate() {
            for r in 0..rows {
                let row = &w[(r0 + r) * in_dim..][..in_dim];
                let ahead = row
                    .as_ptr()
                    .wrapping_add(ROWS_PER_PASS * in_dim + ks.start * K_TILE);
                for i in 0..ks.len().div_ceil(2) {
                    // SAFETY: a prefetch is a hint that never faults, whatever the address.
                    unsafe {
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                            ahead.wrapping_add(i * 2 * K_TILE) as *const i8,
                        )
                    };
                }
                for (i, kt) in ks.clone().enumerate() {
                    let k0 = kt * K_TILE;
                    let dst = &mut self.0[blk * K_CHUNK + i][r * K_TILE..][..K_TILE];
                    if k0 + K_TILE <= in_dim {
                        let src: &[u16; K_TILE] = row[k0..k0 + K_TILE].try_into().expect("a whole tile");
                        dst.copy_from_slice(src);
                    } else {
                        let width = in_dim - k0;
                        dst[..width].copy_from_slice(&row[k0..]);
                        dst[width..].fill(0);
                    }
                }
            }
        }
    }

    /// (pointer, stride in bytes) of block `blk`'s tile `i` of the chunk.
    fn tile(&self, blk: usize, i: usize) -> (*const u8, usize) {
        (self.0[blk * K_CHUNK + i].as_ptr() as *const u8, 2 * K_TILE)
    }
}

/// Input tiles per chunk (256 inputs): a chunk's activations for a task's column blocks (up to
/// 256 KiB for 32 blocks) stay in the core's second-level cache while its passes stream the rows'
/// weights past them, and a staged pass's weights (16 KiB) in the first-level cache while its
/// pairs load them. 8 measured better than 16 and 32 for 512 tokens on an AMX development VM
/// (Xeon family 6 model 167, one thread).
const K_CHUNK: usize = 8;

/// Pairs of column blocks from which a task's inputs go in chunks: with fewer, its activations
/// for every input fit the second-level cache anyway, and the sums' stores and loads between
/// chunks cost more than they save (measured at 32 tokens: 4 pairs, 1.0-1.3x slower chunked).
const CHUNK_PAIRS: usize = 8;

/// One tile of sums as stored (16 rows of 16 f32).
#[repr(C, align(64))]
struct Sums([[f32; 16]; ROWS]);

thread_local! {
    /// The sums of this thread's last task, kept for the next (a prompt's task holds up to
    /// 512 KiB of them).
    static SPARE_SUMS: std::cell::Cell<Vec<Sums>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Which of a pass's four tiles of sums are in use: a second column block (`two`), a second
/// row block (`rows2`).
#[derive(Clone, Copy)]
struct Shape {
    two: bool,
    rows2: bool,
}

/// A pass whose sums over every input are stored in slot `at` (4 tiles), waiting to be read out:
/// rows `rp..` (m.0 + m.1 of them), column blocks `b` and `b + 1` (n.0 and n.1 tokens).
struct Finished {
    at: usize,
    rp: usize,
    m: (usize, usize),
    b: usize,
    n: (usize, usize),
}

impl Finished {
    /// The pass's sums through `put`, token by token, each token's rows of one tile at once.
    fn put(&self, slot: &[Sums], act: &AmxAct, put: &mut impl FnMut(usize, usize, &[f32])) {
        let (m0, m1) = self.m;
        let tiles = [(0, 0, 0), (1, m0, 0), (2, 0, 1), (3, m0, 1)];
        let mut col = [0f32; ROWS];
        for (s, dr, db) in tiles {
            let (m, nt) = (
                if dr == 0 { m0 } else { m1 },
                if db == 0 { self.n.0 } else { self.n.1 },
            );
            for j in 0..nt {
                for (c, row) in col[..m].iter_mut().zip(&slot[s].0[..m]) {
                    *c = act.sum(row, j);
                }
                put(self.rp + dr, (self.b + db) * act.cols + j, &col[..m]);
            }
        }
    }
}

/// `out(r, t) = row r . token t` for rows `r0..r0 + rows` of `w` (`in_dim` wide) and the tokens
/// of column blocks `blocks` of `act`, written through `put(r, t, values)`: token t's outputs of
/// rows `r..r + values.len()` (r counted from `r0`). Passes of 32 rows x two column blocks (10 tokens, 16 with two parts): each weight
/// tile feeds two tile products, each activation tile two.
///
/// Each pass runs over every input tile, its rows' weights streaming from memory, prefetched
/// ahead, unless the pairs are many ([`CHUNK_PAIRS`]): then the input tiles go in chunks of
/// [`K_CHUNK`], per chunk every pass over every pair, the sums kept between chunks, so the chunk's
/// activations come from memory once per task, then from the core's caches. Where the weight
/// rows do not start on 64-byte lines (a checkpoint's tensors are often only 8-byte aligned) and
/// several pairs use them, each pass's chunk is first copied into whole lines ([`Staged`]): a
/// tile load whose rows straddle lines is 6x slower. Each sum runs over the input tiles in order
/// either way (stored and loaded again between chunks, exactly), so the bits never depend on the
/// chunking or the staging.
///
/// # Safety
/// [`super::enabled`] must be true.
pub unsafe fn rows(
    w: &[u16],
    in_dim: usize,
    r0: usize,
    rows: usize,
    act: &AmxAct,
    blocks: Range<usize>,
    mut put: impl FnMut(usize, usize, &[f32]),
) {
    assert!(in_dim > 0 && act.in_dim == in_dim && w.len().is_multiple_of(in_dim));
    assert!(r0 + rows <= w.len() / in_dim && blocks.end <= act.blocks());
    let pairs = blocks.len().div_ceil(2);
    let passes = rows.div_ceil(ROWS_PER_PASS);
    let k_tiles = act.k_tiles;
    // Weight rows that start off 64-byte lines are staged once per chunk where several pairs
    // load them; inputs go in chunks where the pairs are many, or staged.
    let lines = (w.as_ptr() as usize).is_multiple_of(64) && (2 * in_dim).is_multiple_of(64);
    let mut staged = (pairs > 1 && !lines).then(|| Box::new(Staged([[0; ROWS * K_TILE]; 2 * K_CHUNK])));
    let chunk = if staged.is_some() || pairs >= CHUNK_PAIRS {
        K_CHUNK.min(k_tiles)
    } else {
        k_tiles
    };
    // Unchunked, two slots in turn: one pass's sums are read out while the next one's tile
    // products run.
    let slots = if chunk < k_tiles { passes * pairs } else { 2 };
    let mut sums = SPARE_SUMS.take();
    if sums.len() < 4 * slots {
        sums.resize_with(4 * slots, || Sums([[0.0; 16]; ROWS]));
    }
    let mut configured = None;
    let mut pending: Option<Finished> = None;
    for k0 in (0..k_tiles).step_by(chunk) {
        let ks = k0..(k0 + chunk).min(k_tiles);
        for p in 0..passes {
            let rp = p * ROWS_PER_PASS;
            let m0 = (rows - rp).min(ROWS);
            let m1 = (rows - rp - m0).min(ROWS);
            let mut a = [
                WeightTiles::new(w, in_dim, r0 + rp, m0),
                WeightTiles::new(w, in_dim, r0 + rp + m0, m1),
            ];
            if let Some(staged) = staged.as_mut() {
                staged.fill(w, in_dim, (r0 + rp, r0 + rp + m0), (m0, m1), &ks);
            }
            for q in 0..pairs {
                let b = blocks.start + 2 * q;
                let two = b + 1 < blocks.end;
                let n = (act.tokens_in(b), if two { act.tokens_in(b + 1) } else { 0 });
                // Every block's tiles as wide as a whole block's (a short block's other columns
                // are zero), so that only a change of rows reconfigures: `ldtilecfg` waits for
                // every tile product in flight.
                if configured != Some((m0, m1)) {
                    let cfg = TileConfig::new((m0, m1), (act.cols, act.cols), act.parts);
                    asm!("ldtilecfg [{}]", in(reg) &cfg as *const TileConfig, options(nostack, readonly));
                    configured = Some((m0, m1));
                }
                let at = 4 * ((p * pairs + q) % slots);
                let mut from = match staged.as_deref() {
                    Some(staged) => Weights::Staged(staged),
                    None => Weights::Direct {
                        tiles: &mut a,
                        prefetch: q == 0,
                    },
                };
                let shape = Shape { two, rows2: m1 > 0 };
                pass(&mut from, act, b, shape, &ks, &sums[at..at + 4]);
                // While the tile products run: the last finished pass's sums out.
                if let Some(done) = pending.take() {
                    done.put(&sums[done.at..done.at + 4], act, &mut put);
                }
                store(shape, &mut sums[at..at + 4]);
                if ks.end == k_tiles {
                    pending = Some(Finished {
                        at,
                        rp,
                        m: (m0, m1),
                        b,
                        n,
                    });
                }
            }
        }
    }
    if let Some(done) = pending {
        done.put(&sums[done.at..done.at + 4], act, &mut put);
    }
    asm!("tilerelease", options(nostack, nomem));
    SPARE_SUMS.set(sums);
}

/// `out[(r - rows.start) * T + t] = row r . xs[t]` for the T tokens of `xs` (T x in_dim), the
/// activations laid out for this call.
///
/// # Safety
/// [`super::enabled`] must be true.
pub unsafe fn product(
    w: &[u16],
    in_dim: usize,
    rows: Range<usize>,
    xs: &[f32],
    tokens: usize,
    out: &mut [f32],
) {
    assert_eq!(out.len(), rows.len() * tokens);
    let act = AmxAct::new(xs, tokens, in_dim);
    let blocks = 0..act.blocks();
    self::rows(w, in_dim, rows.start, rows.len(), &act, blocks, |r, j, vs| {
        for (i, &v) in vs.iter().enumerate() {
            out[(r + i) * tokens + j] = v;
        }
    })
}

/// One pass over the input tiles `ks`: the sums of up to 2 row blocks (`rows2`: a second) x 2
/// column blocks (`two`: a second), started from zero at the first input tile and otherwise
/// from `sums` (as the chunk before left them; tile order as in [`TileConfig`]), left in the
/// tiles for [`store`]; the weights `from` the matrix or the chunk's copy.
#[inline]
unsafe fn pass(from: &mut Weights, act: &AmxAct, b: usize, shape: Shape, ks: &Range<usize>, sums: &[Sums]) {
    let Shape { two, rows2 } = shape;
    let [o0, o1, o2, o3] = [0, 1, 2, 3].map(|i| sums[i].0.as_ptr() as *const u8);
    // Only configured tiles may be named.
    if ks.start == 0 {
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
    } else {
        let s = 64usize;
        asm!("tileloadd tmm0, [{o} + {s}*1]", o = in(reg) o0, s = in(reg) s, options(nostack, readonly));
        if rows2 {
            asm!("tileloadd tmm1, [{o} + {s}*1]", o = in(reg) o1, s = in(reg) s, options(nostack, readonly));
        }
        if two {
            asm!("tileloadd tmm2, [{o} + {s}*1]", o = in(reg) o2, s = in(reg) s, options(nostack, readonly));
        }
        if rows2 && two {
            asm!("tileloadd tmm3, [{o} + {s}*1]", o = in(reg) o3, s = in(reg) s, options(nostack, readonly));
        }
    }
    // Whole input tiles of two row blocks x two column blocks: pointers stepped, no per-tile
    // look-ups.
    let mut rest = ks.clone();
    let whole_end = ks.end.min(act.in_dim / K_TILE);
    if rows2 && two && whole_end > ks.start {
        let ((mut p0, sa0), (mut p1, sa1), step_w) = match from {
            Weights::Direct { tiles, .. } => (tiles[0].tile(ks.start), tiles[1].tile(ks.start), 2 * K_TILE),
            Weights::Staged(staged) => (staged.tile(0, 0), staged.tile(1, 0), 2 * K_TILE * ROWS),
        };
        let pf = match from {
            Weights::Direct {
                tiles,
                prefetch: true,
            } => Some(&**tiles),
            _ => None,
        };
        let (mut x0, sx) = act.tile(b, ks.start);
        let mut x1 = act.tile(b + 1, ks.start).0;
        let step_x = sx * ROWS;
        for kt in ks.start..whole_end {
            if let Some(tiles) = pf {
                tiles[0].prefetch(kt + PREFETCH_TILES, ks);
                tiles[1].prefetch(kt + PREFETCH_TILES, ks);
            }
            four_products((p0, sa0), (p1, sa1), (x0, x1, sx));
            p0 = p0.wrapping_add(step_w);
            p1 = p1.wrapping_add(step_w);
            x0 = x0.wrapping_add(step_x);
            x1 = x1.wrapping_add(step_x);
        }
        rest = whole_end..ks.end;
    }
    for kt in rest {
        let ((p0, sa0), (p1, sa1)) = match from {
            Weights::Direct { tiles, prefetch } => {
                if *prefetch {
                    tiles[0].prefetch(kt + PREFETCH_TILES, ks);
                    tiles[1].prefetch(kt + PREFETCH_TILES, ks);
                }
                (tiles[0].tile(kt), tiles[1].tile(kt))
            }
            Weights::Staged(staged) => (staged.tile(0, kt - ks.start), staged.tile(1, kt - ks.start)),
        };
        let (x0, sx) = act.tile(b, kt);
        let x1 = if two { act.tile(b + 1, kt).0 } else { x0 };

        match (rows2, two) {
            (true, true) => four_products((p0, sa0), (p1, sa1), (x0, x1, sx)),
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
}

/// One input tile's four products: weight tiles `w0` and `w1` (address, row stride) times the
/// activation tiles at `x.0` and `x.1` (row stride `x.2`), added to sums tiles 0-3.
///
/// # Safety
/// The tiles must be configured for two row and two column blocks, the addresses readable.
#[inline(always)]
unsafe fn four_products(w0: (*const u8, usize), w1: (*const u8, usize), x: (*const u8, *const u8, usize)) {
    let ((p0, sa0), (p1, sa1), (x0, x1, sx)) = (w0, w1, x);
    asm!(
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
    );
}

/// Stores the pass's tiles of sums (those `shape` uses) into `sums`, in [`TileConfig`]'s order.
///
/// # Safety
/// The tiles must be configured as for the pass.
#[inline]
unsafe fn store(shape: Shape, sums: &mut [Sums]) {
    let Shape { two, rows2 } = shape;
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

    /// `w` copied to start `skew` bytes past a 64-byte line: (the buffer, where `w` starts in it).
    fn placed(w: &[u16], skew: usize) -> (Vec<u16>, usize) {
        let mut buf = vec![0u16; w.len() + 64];
        let line = buf.as_ptr().align_offset(64);
        let at = line + skew / 2;
        buf[at..at + w.len()].copy_from_slice(w);
        (buf, at)
    }

    #[test]
    fn chunked_and_staged_passes_give_each_token_its_lone_products_bits() {
        if !super::super::enabled() {
            eprintln!("no AMX BF16 here (or STRATA_AMX=0): the tile passes are not tested");
            return;
        }
        let mut s = 0x1F83_D9AB_FB41_BD6Bu64;
        // Several passes of rows with a partial last one, several chunks of inputs with a
        // partial last tile, odd numbers of column blocks (a lone block in the last pair), few
        // pairs and many (chunked), rows on 64-byte lines and off them (staged).
        let cases = [
            (75, 1000, 23),
            (40, 520, 12),
            (33, 1056, 90),
            (16, 64, 7),
            (48, 288, 51),
        ];
        for ((rows, in_dim, tokens), skew) in cases.into_iter().flat_map(|c| [(c, 0), (c, 8), (c, 48)]) {
            let w: Vec<u16> = (0..rows * in_dim)
                .map(|_| (((next(&mut s) >> 20) as u32 & 0x3fff) as u16 | 0x3c00) ^ (0x8000 * (s & 1) as u16))
                .collect();
            let (buf, at) = placed(&w, skew);
            let w = &buf[at..at + w.len()];
            let xs: Vec<f32> = (0..tokens * in_dim)
                .map(|_| ((next(&mut s) >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0)
                .collect();
            let mut together = vec![0f32; rows * tokens];
            // SAFETY: checked above that AMX is enabled.
            unsafe { product(w, in_dim, 0..rows, &xs, tokens, &mut together) };
            let case = format!("{rows}x{in_dim} {skew} bytes off a line, {tokens} tokens");
            for t in 0..tokens {
                let mut alone = vec![0f32; rows];
                // SAFETY: as above.
                unsafe {
                    product(
                        w,
                        in_dim,
                        0..rows,
                        &xs[t * in_dim..(t + 1) * in_dim],
                        1,
                        &mut alone,
                    )
                };
                for r in 0..rows {
                    let got = together[r * tokens + t].to_bits();
                    assert_eq!(got, alone[r].to_bits(), "{case}: row {r} token {t}");
                }
            }
            // A task's share: the rows from r0 of blocks 1..4 only.
            let r0 = rows / 3 + 1;
            let act = AmxAct::new(&xs, tokens, in_dim);
            let blocks = 1..act.blocks().min(4);
            let mut seen = 0;
            // SAFETY: as above.
            unsafe {
                rows_of(w, in_dim, r0, rows - r0, &act, blocks.clone(), |r, t, vs| {
                    for (i, v) in vs.iter().enumerate() {
                        let want = together[(r0 + r + i) * tokens + t];
                        assert_eq!(v.to_bits(), want.to_bits(), "{case}");
                        seen += 1;
                    }
                })
            };
            let cols = act.block_tokens();
            let want: usize = blocks.map(|b| (tokens - b * cols).min(cols)).sum();
            assert_eq!(seen, want * (rows - r0));
        }
    }

    /// [`rows`] under another name (the test's closure captures `together`).
    unsafe fn rows_of(
        w: &[u16],
        in_dim: usize,
        r0: usize,
        n: usize,
        act: &AmxAct,
        blocks: Range<usize>,
        put: impl FnMut(usize, usize, &[f32]),
    ) {
        rows(w, in_dim, r0, n, act, blocks, put)
    }
}
