//! Integer-domain dot products for the 4-bit formats (INT4 pack-quantized, MXFP4).
//!
//! Their weights are small integers once mapped to unsigned bytes (INT4: the stored nibble q + 8;
//! MXFP4: twice the E2M1 value plus 12), so instead of converting every weight to f32 the
//! activation is put once per token into integers and the products are summed exactly in
//! integer SIMD. Per 32 inputs with step s = max|x| / 32512, each input becomes
//! s * (q + r / 256): q = round(x / s) in 16 bits and r the rounded rest in 8 more, i.e. 24
//! significant bits, as many as an f32 has. The kernel multiplies q by the weights with
//! `vpmaddwd` (16 x 16 bits, the weight in the high byte so the product counts 1/256 steps) and r
//! with `vpmaddubsw` (the unsigned weight bytes against signed r). The weights' constant offset
//! is taken out once per 32 inputs from the sum of the activation.
//!
//! Accuracy: the weights are exact; each input moves by at most 1/512 of its step (6e-8 of the
//! largest |x| among its 32), the size of f32 rounding. A 16-bit activation alone
//! (2e-5) measured too coarse: Kimi K3's routing weights, amplified by AttnRes, left their 1e-4
//! tolerance. The scalar twins compute the same integers; [`crate::int4::dot_int4_reference`]
//! and [`crate::mxfp4::dot_mxfp4_reference`] stay the f32 truth the property tests compare to.

/// Largest |q| before rounding (q may still move by one, see `split`): keeps q within i16.
pub const QMAX: f32 = 32512.0;

/// Inputs per block: 32 packed bytes of weights, two 32-input halves.
pub const BLOCK: usize = 64;

/// One block of a prepared activation: 256 bytes, four cache lines, read in order.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct ActBlock {
    /// q of input i at [`q_slot`]`(i)`: four vectors of 16, vector k holding inputs 4j + k
    /// (the order of the nibbles in the weights' 16-bit lanes).
    pub q: [i16; 64],
    /// r of input i at [`r_slot`]`(i)`: the even inputs, then the odd ones (the order of the
    /// nibbles in the weights' bytes).
    pub r: [i8; 64],
    /// The step of the first half (lanes 0-3) and of the second (4-7), times the format's
    /// factor, over 256 (the kernel's sums count 1/256 steps).
    pub step: [f32; 8],
    /// Minus the format's weight offset times the half's activation sum, in lanes 0 and 4 (the
    /// other lanes are 0).
    pub offset: [f32; 8],
}

const EMPTY: ActBlock = ActBlock {
    q: [0; 64],
    r: [0; 64],
    step: [0.0; 8],
    offset: [0.0; 8],
};

/// Blocks 2j and 2j + 1 of a prepared activation side by side, for the 512-bit step
/// (`x86::Step::Wide`): each 64-byte row holds one of [`ActBlock`]'s 32-byte vectors of block 2j
/// in its low half and the same vector of block 2j + 1 in its high half, so the step loads each
/// with one aligned load.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct ActPair {
    pub q: [[i16; 32]; 4],
    pub r: [[i8; 64]; 2],
    pub step: [f32; 16],
    pub offset: [f32; 16],
}

impl ActPair {
    fn of(b0: &ActBlock, b1: &ActBlock) -> ActPair {
        let mut p = ActPair {
            q: [[0; 32]; 4],
            r: [[0; 64]; 2],
            step: [0.0; 16],
            offset: [0.0; 16],
        };
        for (half, b) in [b0, b1].into_iter().enumerate() {
            for k in 0..4 {
                p.q[k][16 * half..16 * half + 16].copy_from_slice(&b.q[16 * k..16 * k + 16]);
            }
            for k in 0..2 {
                p.r[k][32 * half..32 * half + 32].copy_from_slice(&b.r[32 * k..32 * k + 32]);
            }
            p.step[8 * half..8 * half + 8].copy_from_slice(&b.step);
            p.offset[8 * half..8 * half + 8].copy_from_slice(&b.offset);
        }
        p
    }
}

/// One block of a prepared activation as bytes in input order, for the aarch64 dot-product
/// step (`neon_intdot::Step::Dotprod`): q = 256 hi + lo with both halves signed bytes
/// (hi = (q + 128) >> 8, lo = q - 256 hi), and r, input i at index i of each.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct DotBytes {
    pub hi: [i8; 64],
    pub lo: [i8; 64],
    pub r: [i8; 64],
}

impl DotBytes {
    fn of(b: &ActBlock) -> DotBytes {
        let mut d = DotBytes {
            hi: [0; 64],
            lo: [0; 64],
            r: [0; 64],
        };
        for i in 0..BLOCK {
            let q = b.q[q_slot(i)] as i32;
            // |q| <= 32513, so hi is within -127..=127 and lo within -128..=127.
            let hi = (q + 128) >> 8;
            d.hi[i] = hi as i8;
            d.lo[i] = (q - 256 * hi) as i8;
            d.r[i] = b.r[r_slot(i)];
        }
        d
    }
}

/// An activation prepared for [`x86::dot_avx2`], whole blocks of 64 inputs only.
pub struct IntAct {
    pub blocks: Vec<ActBlock>,
    /// Whole pairs of `blocks` as the 512-bit step reads them (empty where it is not in use:
    /// a kernel given none takes its 256-bit step).
    pub pairs: Vec<ActPair>,
    /// `blocks` as the aarch64 dot-product step reads them (empty where it is not in use: a
    /// kernel given none takes the plain NEON step).
    pub dots: Vec<DotBytes>,
}

impl IntAct {
    /// The prepared blocks as bytes (two preparations are the same when these are).
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: ActBlock is plain data without padding (256 bytes of integers and floats).
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr() as *const u8, self.blocks.len() * 256) }
    }

    /// Fills [`IntAct::pairs`] from the blocks (for the 512-bit step).
    pub fn pair_up(&mut self) {
        self.pairs = (self.blocks.chunks_exact(2))
            .map(|b| ActPair::of(&b[0], &b[1]))
            .collect();
    }

    /// Fills [`IntAct::dots`] from the blocks (for the aarch64 dot-product step).
    pub fn dot_bytes(&mut self) {
        self.dots = self.blocks.iter().map(DotBytes::of).collect();
    }

    /// The step lane of input j (its half's step x factor / 256).
    pub fn step_of(&self, j: usize) -> f32 {
        self.blocks[j / BLOCK].step[(j % BLOCK) / 32 * 4]
    }
}

/// Index of input i (0..64) of a block in [`ActBlock::q`].
pub const fn q_slot(i: usize) -> usize {
    16 * (i % 4) + i / 4
}

/// Index of input i (0..64) of a block in [`ActBlock::r`].
pub const fn r_slot(i: usize) -> usize {
    32 * (i % 2) + i / 2
}

/// Input j of a prepared activation in units of its step: q + r / 256.
pub fn units_at(a: &IntAct, j: usize) -> f64 {
    let b = &a.blocks[j / BLOCK];
    let i = j % BLOCK;
    b.q[q_slot(i)] as f64 + b.r[r_slot(i)] as f64 / 256.0
}

/// Below this largest |x| a half counts as zero (its inverse step would overflow; such inputs add
/// less than 1e-30 x sum|w| to a dot).
const TINY: f32 = 1e-30;

/// (step, 1 / step) of a half whose largest |x| is `amax`; NaN when an input is not finite.
fn half_step(amax: f32, finite: bool) -> (f32, f32) {
    if !finite || !amax.is_finite() {
        (f32::NAN, 0.0) // the dot is NaN, as the f32 product would be
    } else if amax < TINY {
        (0.0, 0.0)
    } else {
        (amax / QMAX, QMAX / amax)
    }
}

/// One input: (q, r) for step `step` and inverse `inv`. The rest x - q * step is exact (one
/// fused multiply-add), then rounded to 1/256 of a step. x * inv carries f32 rounding, so q may
/// miss the nearest step by a hair and r land on +-128.x: q then moves by one and r by 256.
#[inline]
fn split(x: f32, step: f32, inv: f32) -> (i32, i32) {
    let mut q = (x * inv).round_ties_even();
    let rest = (-q).mul_add(step, x);
    let mut r = (rest * (inv * 256.0)).round_ties_even();
    if r > 127.5 {
        (q, r) = (q + 1.0, r - 256.0);
    } else if r < -128.5 {
        (q, r) = (q - 1.0, r + 256.0);
    }
    (q as i32, r as i32)
}

/// Sets a half's 4 step lanes and its offset lane.
fn set_half(b: &mut ActBlock, half: usize, step: f32, sum_q: i32, sum_r: i32, offset: i32, factor: f32) {
    let units = sum_q as f32 + sum_r as f32 / 256.0;
    b.step[4 * half..4 * half + 4].fill(step * factor / 256.0);
    b.offset[4 * half] = -(offset as f32) * units * step * factor;
}

/// Prepares the whole blocks of x. `offset` is the constant the weights' unsigned bytes carry
/// (INT4: 8, MXFP4: 12), `factor` what one unit of those bytes is worth (INT4: 1, MXFP4: 1/2).
pub fn prepare(x: &[f32], offset: i32, factor: f32) -> IntAct {
    #[cfg(target_arch = "x86_64")]
    if crate::dot::has_avx2_fma_f16c() {
        // SAFETY: avx2 and fma were detected.
        let mut a = unsafe { x86::prepare_avx2(x, offset, factor) };
        if x86::Step::best() == x86::Step::Wide {
            a.pair_up();
        }
        return a;
    }
    #[allow(unused_mut)]
    let mut a = prepare_reference(x, offset, factor);
    #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
    if crate::neon_intdot::Step::best() == crate::neon_intdot::Step::Dotprod {
        a.dot_bytes();
    }
    a
}

/// Scalar twin of [`x86::prepare_avx2`] (the same values, bit for bit).
pub fn prepare_reference(x: &[f32], offset: i32, factor: f32) -> IntAct {
    let mut a = IntAct {
        blocks: vec![EMPTY; x.len() / BLOCK],
        pairs: Vec::new(),
        dots: Vec::new(),
    };
    for (b, block) in a.blocks.iter_mut().enumerate() {
        for half in 0..2 {
            let xs = &x[b * BLOCK + 32 * half..b * BLOCK + 32 * (half + 1)];
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let (step, inv) = half_step(amax, xs.iter().all(|v| v.is_finite()));
            let (mut sum_q, mut sum_r) = (0i32, 0i32);
            for (i, v) in xs.iter().enumerate() {
                let (q, r) = split(*v, step, inv);
                sum_q += q;
                sum_r += r;
                block.q[q_slot(32 * half + i)] = q as i16;
                block.r[r_slot(32 * half + i)] = r as i8;
            }
            set_half(block, half, step, sum_q, sum_r, offset, factor);
        }
    }
    a
}

/// Checks a call for several tokens (`xs[t]` prepared as `ps[t]`, `out` rows x tokens) and
/// gives (tokens, inputs, the rows it covers from `first`).
pub fn token_rows(
    xs: &[&[f32]],
    ps: &[Option<&IntAct>],
    first: usize,
    out: &[f32],
) -> (usize, usize, std::ops::Range<usize>) {
    let tokens = xs.len();
    assert!(tokens > 0 && ps.len() == tokens && out.len().is_multiple_of(tokens));
    assert!(xs.iter().all(|x| x.len() == xs[0].len()));
    (tokens, xs[0].len(), first..first + out.len() / tokens)
}

/// Runs `f` on every token's prepared activation when all tokens have one (one token needs no
/// allocation: that is the decode path).
pub fn with_acts<R>(ps: &[Option<&IntAct>], f: impl FnOnce(&[&IntAct]) -> R) -> Option<R> {
    if let [Some(a)] = ps {
        return Some(f(&[*a]));
    }
    let acts: Option<Vec<&IntAct>> = ps.iter().copied().collect();
    acts.map(|a| f(&a))
}

/// Adds to each row's sum over the whole blocks of `a` its inputs past them (`blocks * 64..n`),
/// for token `t` of `tokens` (`out[i * tokens + t]` is row i's): `term(row, j)` is input j's
/// product; summed apart, then added, as a one-row call does.
pub fn add_tails(
    out: &mut [f32],
    tokens: usize,
    t: usize,
    a: &IntAct,
    n: usize,
    term: impl Fn(usize, usize) -> f32,
) {
    let blocked = a.blocks.len() * BLOCK;
    assert!(blocked <= n);
    if blocked < n {
        for (i, o) in out.iter_mut().skip(t).step_by(tokens).enumerate() {
            *o += (blocked..n).map(|j| term(i, j)).fold(0f32, |s, t| s + t);
        }
    }
}

/// Scalar twin of [`x86::dot_avx2`]: `values[j]` is weight j as its unsigned byte (offset
/// included) and `half_scales[h]` the scale of inputs 32h..32h+32. Sums each half in integers,
/// as the SIMD kernel does, then scales it.
pub fn dot_reference(values: &[u8], half_scales: &[f32], a: &IntAct) -> f32 {
    let mut total = 0f32;
    for h in 0..a.blocks.len() * 2 {
        let (block, base) = (&a.blocks[h / 2], 32 * (h % 2));
        let mut sum = 0i64; // in 1/256 steps
        for i in base..base + 32 {
            let w = values[h / 2 * BLOCK + i] as i64;
            let (q, r) = (block.q[q_slot(i)] as i64, block.r[r_slot(i)] as i64);
            sum += w * (256 * q + r);
        }
        let lane = (h % 2) * 4;
        total += (sum as f32 * block.step[lane] + block.offset[lane]) * half_scales[h];
    }
    total
}

/// How the weights' scales are stored.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scales<'a> {
    /// One BF16 per 32 inputs (INT4 group 32).
    Bf16Group32(&'a [u16]),
    /// One BF16 per `1 << shift` inputs, shift >= 6 (a block never straddles two groups).
    Bf16Wide(&'a [u16], u32),
    /// One E8M0 byte per 32 inputs (MXFP4).
    E8m0(&'a [u8]),
}

impl Scales<'_> {
    /// (kind, shift, pointer, bytes per row), after checking that every block of `blocks` in
    /// each of `rows` rows, `per_row` scales apart, has its scales.
    pub(crate) fn raw(self, blocks: usize, rows: usize, per_row: usize) -> (u8, u32, *const u8, usize) {
        let (kind, shift, len, size, p) = match self {
            Scales::Bf16Group32(s) => (0, 0, s.len(), 2, s.as_ptr() as *const u8),
            Scales::Bf16Wide(s, shift) => (1, shift, s.len(), 2, s.as_ptr() as *const u8),
            Scales::E8m0(s) => (2, 0, s.len(), 1, s.as_ptr()),
        };
        // Scales of one row's whole blocks.
        let need = match kind {
            1 => {
                assert!(shift >= 6);
                if blocks == 0 {
                    0
                } else {
                    (((blocks - 1) * BLOCK) >> shift) + 1
                }
            }
            _ => blocks * 2,
        };
        assert!(rows == 0 || (per_row >= need && len >= (rows - 1) * per_row + need));
        (kind, shift, p, per_row * size)
    }
}

/// Checks a rows-by-tokens call of the SIMD kernels (every token's activation has the same
/// blocks, every row's packed bytes are there) and gives (blocks, rows).
pub(crate) fn check_rows(packed: &[u8], row_bytes: usize, acts: &[&IntAct], out: &[f32]) -> (usize, usize) {
    let tokens = acts.len();
    assert!(tokens > 0 && out.len().is_multiple_of(tokens));
    let (blocks, rows) = (acts[0].blocks.len(), out.len() / tokens);
    assert!(acts.iter().all(|a| a.blocks.len() == blocks));
    assert!(row_bytes >= blocks * 32 && (rows == 0 || packed.len() >= (rows - 1) * row_bytes + blocks * 32));
    (blocks, rows)
}

/// Whether [`dot_rows`] has a SIMD kernel on this CPU (else the callers take the f32 twins).
pub fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::dot::has_avx2_fma_f16c();
    #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
    return crate::isa::isa() == crate::isa::Isa::Neon;
    #[allow(unreachable_code)]
    false
}

/// The SIMD kernel of the CPU ([`x86::dot_rows_with`] or [`crate::neon_intdot::dot_rows_with`] in its best step): row
/// i's packed bytes at `i * row_bytes`, its scales `i * scales_per_row` into `scales`,
/// `out[i * T + t]` row i times token t (T = `acts.len()`), each token's sum in the steps of a
/// one-token call. Panics when [`simd`] is false.
pub fn dot_rows(
    packed: &[u8],
    row_bytes: usize,
    scales: Scales,
    scales_per_row: usize,
    lut: Option<&[u8; 16]>,
    acts: &[&IntAct],
    out: &mut [f32],
) {
    assert!(simd(), "no SIMD integer kernel on this CPU");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `simd()` found AVX2 and FMA.
    unsafe {
        x86::dot_rows_with(
            x86::Step::best(),
            packed,
            row_bytes,
            scales,
            scales_per_row,
            lut,
            acts,
            out,
        )
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `simd()` found NEON (every aarch64 CPU has it); `best` checks for dotprod.
    unsafe {
        crate::neon_intdot::dot_rows_with(
            crate::neon_intdot::Step::best(),
            packed,
            row_bytes,
            scales,
            scales_per_row,
            lut,
            acts,
            out,
        )
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "intdot_x86.rs"]
pub mod x86;
