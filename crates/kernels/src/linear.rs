//! A linear layer's weight `W (out, in)` in its stored format, and the products with it:
//! `matvec`: W (out,in) @ x (in,) -> y (out,), and `matmul`: for T tokens, X (T,in) -> Y (T,out).
//! Model code calls these whatever the format; the format is a property of the storage.

use rayon::prelude::*;

use crate::{dot, fp8, ggml, int4, int8, intdot, kquant, mxfp4, q8_0};

use crate::weight_data::packed_row;
pub use crate::weight_data::{u16_vec_from_bytes, WeightData};

/// An activation rearranged once for the fast kernels of a format (shared by every row).
pub enum Prepared {
    None,
    Fp8(fp8::Fp8Act),
    Int4(Option<intdot::IntAct>),
    Mxfp4(Option<intdot::IntAct>),
    /// Q4_K, Q5_K, Q6_K where [`kquant::simd`] holds.
    KQuant(kquant::KAct),
}

#[derive(Clone, Debug)]
pub struct Linear {
    pub out_dim: usize,
    pub in_dim: usize,
    pub data: WeightData,
    /// Its copy on the installed device ([`crate::offload`]), if any.
    pub(crate) device: crate::offload::DeviceCopy,
}

/// 16 f32 on a 64-byte boundary (one cache line).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

impl Line {
    /// `xs` into `lines` (resized, reusing what they hold), the last line's rest zero.
    fn fill(lines: &mut Vec<Line>, xs: &[f32]) {
        lines.resize(xs.len().div_ceil(16), Line([0.0; 16]));
        for (l, c) in lines.iter_mut().zip(xs.chunks(16)) {
            l.0[..c.len()].copy_from_slice(c);
            l.0[c.len()..].fill(0.0);
        }
    }

    /// The lines as one run of f32 (their padding included; callers slice what they copied).
    fn as_f32s(lines: &[Line]) -> &[f32] {
        // SAFETY: `Line` is 16 f32 with no padding (`repr(C)`, 64 bytes), so the lines are
        // 16 * len contiguous, initialised f32.
        unsafe { std::slice::from_raw_parts(lines.as_ptr() as *const f32, lines.len() * 16) }
    }
}

/// The output of a several-token product, written by the tasks of its row blocks (each its own
/// rows; see `Linear::matmul`).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: the tasks holding it write disjoint elements of a buffer that outlives them.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

thread_local! {
    /// Each thread's aligned copy of a several-token product's activations, kept for the next.
    static LINES: std::cell::RefCell<Vec<Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Above this a thread's kept copy is let go after its product (a long prompt's chunk).
const KEEP_LINES_MAX: usize = 64 << 20;

/// Weight bytes read by matrix products so far (each product counts its matrix once, whatever
/// its number of tokens): what a token touches, for `strata bench --compute-only`.
static WEIGHT_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Weight bytes every `matmul` so far has read (see [`Linear::matmul`]).
pub fn weight_bytes_touched() -> u64 {
    WEIGHT_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Adds `bytes` read by products that code outside these kernels ran (the GPU decoder's
/// resident layers) to [`weight_bytes_touched`].
pub fn count_weight_bytes(bytes: u64) {
    WEIGHT_BYTES.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// Below this many multiply-adds a product runs on the calling thread (thread hand-off costs more).
const PARALLEL_MIN_WORK: usize = 1 << 17;
const ROWS_PER_TASK: usize = 16;

/// A task's block of a several-token product: `rows` x `tokens`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tile {
    rows: usize,
    tokens: usize,
}

/// The weight bytes a several-token task keeps in a core's private cache (L2) while every token
/// group of the task passes over them: each weight row comes from memory once per task.
const TILE_WEIGHT_BYTES: usize = 256 << 10;

/// Above this many bytes of activations a product's tokens split into blocks (a share of the
/// shared cache): every row block reads its tokens' activations from there.
const TILE_ACT_BYTES: usize = 8 << 20;

/// How a several-token product of `out` rows, `in_dim` inputs (`row_bytes` of weights per row)
/// and `tokens` tokens splits into tasks. A task reads its rows' weights from memory once and
/// its tokens' activations from the shared cache once, so the more rows per task, the fewer
/// bytes that cache serves per multiply-add: rows (a power of two from [`ROWS_PER_TASK`]) up to
/// [`TILE_WEIGHT_BYTES`] of weights, all tokens up to [`TILE_ACT_BYTES`], then fewer rows until
/// there are four tasks per thread, then fewer tokens (multiples of 8) until every thread has
/// one. Any split gives the same bits: every output is one row's kernel over one token.
fn tiles(out: usize, in_dim: usize, tokens: usize, row_bytes: usize, threads: usize) -> Tile {
    let act_bytes = (in_dim * 4).max(1);
    let mut t = Tile {
        rows: ROWS_PER_TASK,
        tokens,
    };
    while t.rows < out && 2 * t.rows * row_bytes <= TILE_WEIGHT_BYTES {
        t.rows *= 2;
    }
    if tokens * act_bytes > TILE_ACT_BYTES {
        t.tokens = (TILE_ACT_BYTES / act_bytes / 8 * 8).max(8);
    }
    let count = |t: &Tile| out.div_ceil(t.rows) * tokens.div_ceil(t.tokens);
    while count(&t) < 4 * threads && t.rows > ROWS_PER_TASK {
        t.rows /= 2;
    }
    while count(&t) < threads && t.tokens > 8 {
        t.tokens = (t.tokens / 2).div_ceil(8) * 8;
    }
    t
}

impl Linear {
    /// Panics when the buffers do not fit the shape (loaders check with
    /// [`WeightData::check_shape`] first and report the tensor at fault).
    pub fn new(out_dim: usize, in_dim: usize, data: WeightData) -> Linear {
        if let Err(e) = data.check_shape(out_dim, in_dim) {
            panic!("Linear::new: {e}");
        }
        Linear {
            out_dim,
            in_dim,
            data,
            device: Default::default(),
        }
    }

    pub fn from_f32(out_dim: usize, in_dim: usize, w: Vec<f32>) -> Linear {
        Linear::new(out_dim, in_dim, WeightData::F32(w.into()))
    }

    /// Bytes the weight occupies in memory (what a cache budgets for).
    pub fn bytes(&self) -> usize {
        match &self.data {
            WeightData::F32(v) => v.len() * 4,
            WeightData::Bf16(v) | WeightData::F16(v) => v.len() * 2,
            WeightData::Fp8 { w, scales, .. } => w.len() + scales.len() * 4,
            WeightData::Int4 { packed, scales, .. } => packed.len() * 4 + scales.len() * 2,
            WeightData::Mxfp4 { packed, scales } => packed.len() + scales.len(),
            WeightData::Int8 { w, scales } => w.len() + scales.len() * 4,
            WeightData::Q8_0 { blocks } | WeightData::Ggml { blocks, .. } => blocks.len(),
        }
    }

    /// y[r] = W[r,:] . x
    #[inline]
    pub fn row_dot(&self, r: usize, x: &[f32]) -> f32 {
        let n = self.in_dim;
        let (a, b) = (r * n, (r + 1) * n);
        match &self.data {
            WeightData::F32(w) => dot::dot_f32(&w[a..b], x),
            WeightData::Bf16(w) => {
                if let Some(w) = self.amx_bf16() {
                    let mut y = [0f32];
                    amx_product(w, n, r..r + 1, x, 1, &mut y);
                    return y[0];
                }
                dot::dot_bf16(&w[a..b], x)
            }
            WeightData::F16(w) => dot::dot_f16(&w[a..b], x),
            WeightData::Fp8 { w, scales, block } => {
                let per_row = n.div_ceil(block.1);
                let s = (r / block.0) * per_row;
                fp8::dot_fp8(&w[a..b], &scales[s..s + per_row], block.1, x)
            }
            WeightData::Int4 {
                packed,
                scales,
                group,
            } => {
                let (p, s) = packed_row(packed, scales, n.div_ceil(8), n.div_ceil(*group), r);
                int4::dot_int4(p, s, *group, x)
            }
            WeightData::Mxfp4 { packed, scales } => {
                let (p, s) = packed_row(packed, scales, n.div_ceil(2), n.div_ceil(mxfp4::GROUP), r);
                mxfp4::dot_mxfp4(p, s, x)
            }
            WeightData::Int8 { w, scales } => int8::dot_int8(&w[a..b], scales[r], x),
            WeightData::Q8_0 { blocks } => {
                let rb = q8_0::row_bytes(n);
                let mut y = [0f32];
                q8_0::rows_tokens(&blocks[r * rb..(r + 1) * rb], rb, &[x], &mut y);
                y[0]
            }
            WeightData::Ggml { ty, blocks } => {
                let rb = ty.row_bytes(n);
                let mut y = [0f32];
                ggml::rows_tokens(*ty, &blocks[r * rb..(r + 1) * rb], rb, &[x], &mut y);
                y[0]
            }
        }
    }

    /// Rearranges x for this format's fast kernel (once per activation, shared by all rows).
    pub fn prepare(&self, x: &[f32]) -> Prepared {
        match &self.data {
            WeightData::Int4 { group, .. } => Prepared::Int4(int4::prepare(x, *group)),
            WeightData::Mxfp4 { .. } => Prepared::Mxfp4(mxfp4::prepare(x)),
            WeightData::Fp8 { .. } => Prepared::Fp8(fp8::Fp8Act::new(x)),
            WeightData::Ggml { ty, .. } if kquant::handles(*ty) && kquant::simd() => {
                Prepared::KQuant(kquant::prepare(x))
            }
            _ => Prepared::None,
        }
    }

    /// `row_dot` with an activation from [`Linear::prepare`] (what `matmul` uses).
    #[inline]
    pub fn row_dot_prepared(&self, r: usize, x: &[f32], p: &Prepared) -> f32 {
        let n = self.in_dim;
        match (&self.data, p) {
            (
                WeightData::Int4 {
                    packed,
                    scales,
                    group,
                },
                Prepared::Int4(p),
            ) => {
                let (w, s) = packed_row(packed, scales, n.div_ceil(8), n.div_ceil(*group), r);
                int4::dot_int4_prepared(w, s, *group, x, p.as_ref())
            }
            (WeightData::Fp8 { w, scales, block }, Prepared::Fp8(act)) => {
                let mut y = [0f32];
                fp8::rows_fp8_prepared(w, scales, *block, x, act, r, &mut y);
                y[0]
            }
            (WeightData::Mxfp4 { packed, scales }, Prepared::Mxfp4(p)) => {
                let (w, s) = packed_row(packed, scales, n.div_ceil(2), n.div_ceil(mxfp4::GROUP), r);
                mxfp4::dot_mxfp4_prepared(w, s, x, p.as_ref())
            }
            (WeightData::Ggml { ty, blocks }, Prepared::KQuant(a)) => {
                let rb = ty.row_bytes(n);
                let mut y = [0f32];
                kquant::rows_tokens(*ty, &blocks[r * rb..(r + 1) * rb], rb, &[a], &mut y);
                y[0]
            }
            _ => self.row_dot(r, x),
        }
    }

    /// `out[i] = row_dot_prepared(rows.start + i, x, p)`. The dense formats and INT8 take their
    /// rows-and-tokens kernels with one token (with SIMD: two rows per pass, each row's bits those
    /// of the one-row kernel); the others go row after row.
    pub fn rows_dot_prepared(&self, rows: std::ops::Range<usize>, x: &[f32], p: &Prepared, out: &mut [f32]) {
        assert_eq!(out.len(), rows.len());
        assert!(rows.end <= self.out_dim && x.len() == self.in_dim);
        if let Some(w) = self.amx_bf16() {
            return amx_product(w, self.in_dim, rows, x, 1, out);
        }
        let span = rows.start * self.in_dim..rows.end * self.in_dim;
        match (&self.data, p) {
            (
                WeightData::Int4 {
                    packed,
                    scales,
                    group,
                },
                Prepared::Int4(p),
            ) => return int4::rows_int4_prepared(packed, scales, *group, x, p.as_ref(), rows.start, out),
            (WeightData::Mxfp4 { packed, scales }, Prepared::Mxfp4(p)) => {
                return mxfp4::rows_mxfp4_prepared(packed, scales, x, p.as_ref(), rows.start, out)
            }
            (WeightData::Fp8 { w, scales, block }, Prepared::Fp8(act)) => {
                return fp8::rows_fp8_prepared(w, scales, *block, x, act, rows.start, out)
            }
            (WeightData::Q8_0 { blocks }, _) => {
                let rb = q8_0::row_bytes(self.in_dim);
                return q8_0::rows_tokens(&blocks[rows.start * rb..rows.end * rb], rb, &[x], out);
            }
            (WeightData::Ggml { ty, blocks }, Prepared::KQuant(a)) => {
                let rb = ty.row_bytes(self.in_dim);
                return kquant::rows_tokens(*ty, &blocks[rows.start * rb..rows.end * rb], rb, &[a], out);
            }
            (WeightData::F32(w), _) => return dot::rows_f32_tokens(&w[span], self.in_dim, &[x], out),
            (WeightData::Bf16(w), _) => return dot::rows_bf16_tokens(&w[span], self.in_dim, &[x], out),
            (WeightData::F16(w), _) => return dot::rows_f16_tokens(&w[span], self.in_dim, &[x], out),
            (WeightData::Int8 { w, scales }, _) => {
                let s = &scales[rows.clone()];
                return int8::rows_int8_tokens(&w[span], s, self.in_dim, &[x], out);
            }
            (WeightData::Ggml { ty, blocks }, _) => {
                let rb = ty.row_bytes(self.in_dim);
                return ggml::rows_tokens(*ty, &blocks[rows.start * rb..rows.end * rb], rb, &[x], out);
            }
            _ => {}
        }
        for (o, r) in out.iter_mut().zip(rows) {
            *o = self.row_dot_prepared(r, x, p);
        }
    }

    /// `out[i * T + t] = row_dot_prepared(rows.start + i, x_t, prepared[t])` for the T tokens of
    /// `xs` (T, in), the same values bit for bit. The 4-bit and the dense formats decode each
    /// weight once for several tokens; the others take the tokens one after the other.
    pub fn rows_dot_prepared_tokens(
        &self,
        rows: std::ops::Range<usize>,
        xs: &[f32],
        prepared: &[Prepared],
        out: &mut [f32],
    ) {
        let tokens = prepared.len();
        assert!(xs.len() == tokens * self.in_dim && out.len() == rows.len() * tokens);
        if let Some(w) = self.amx_bf16() {
            return amx_product(w, self.in_dim, rows, xs, tokens, out);
        }
        let x_of: Vec<&[f32]> = xs.chunks_exact(self.in_dim).collect();
        let n = self.in_dim;
        let span = rows.start * n..rows.end * n;
        let int_acts = |want_int4: bool| -> Option<Vec<Option<&intdot::IntAct>>> {
            prepared
                .iter()
                .map(|p| match (p, want_int4) {
                    (Prepared::Int4(a), true) | (Prepared::Mxfp4(a), false) => Some(a.as_ref()),
                    _ => None,
                })
                .collect()
        };
        match &self.data {
            WeightData::Int4 {
                packed,
                scales,
                group,
            } => {
                if let Some(ps) = int_acts(true) {
                    return int4::rows_int4_tokens(packed, scales, *group, &x_of, &ps, rows.start, out);
                }
            }
            WeightData::Mxfp4 { packed, scales } => {
                if let Some(ps) = int_acts(false) {
                    return mxfp4::rows_mxfp4_tokens(packed, scales, &x_of, &ps, rows.start, out);
                }
            }
            WeightData::F32(w) => return dot::rows_f32_tokens(&w[span], n, &x_of, out),
            WeightData::Bf16(w) => return dot::rows_bf16_tokens(&w[span], n, &x_of, out),
            WeightData::F16(w) => return dot::rows_f16_tokens(&w[span], n, &x_of, out),
            WeightData::Int8 { w, scales } => {
                return int8::rows_int8_tokens(&w[span], &scales[rows.clone()], n, &x_of, out)
            }
            WeightData::Q8_0 { blocks } => {
                let rb = q8_0::row_bytes(n);
                return q8_0::rows_tokens(&blocks[rows.start * rb..rows.end * rb], rb, &x_of, out);
            }
            WeightData::Ggml { ty, blocks } => {
                let rb = ty.row_bytes(n);
                let rows_of = &blocks[rows.start * rb..rows.end * rb];
                let acts: Option<Vec<&kquant::KAct>> = prepared
                    .iter()
                    .map(|p| match p {
                        Prepared::KQuant(a) => Some(a),
                        _ => None,
                    })
                    .collect();
                if let Some(acts) = acts {
                    return kquant::rows_tokens(*ty, rows_of, rb, &acts, out);
                }
                return ggml::rows_tokens(*ty, rows_of, rb, &x_of, out);
            }
            _ => {}
        }
        let mut y = vec![0f32; rows.len()];
        for (t, (x, p)) in x_of.iter().zip(prepared).enumerate() {
            self.rows_dot_prepared(rows.clone(), x, p, &mut y);
            for (i, v) in y.iter().enumerate() {
                out[i * tokens + t] = *v;
            }
        }
    }

    /// W (out,in) @ x (in,) -> y (out,)
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        self.matmul(x, 1, y);
    }

    /// X (T,in) -> Y (T,out), Y[t] = W @ X[t]; each element is one `row_dot`, whatever T is.
    pub fn matmul(&self, xs: &[f32], n_tokens: usize, ys: &mut [f32]) {
        assert_eq!(xs.len(), n_tokens * self.in_dim, "matmul input is not (T, in)");
        assert_eq!(ys.len(), n_tokens * self.out_dim, "matmul output is not (T, out)");
        self.count_bytes();
        let t0 = crate::profile::enabled().then(std::time::Instant::now);
        if !self.matmul_on_device(xs, n_tokens, ys) {
            self.matmul_cpu(xs, n_tokens, ys);
        }
        if let Some(t0) = t0 {
            let format = self.data.format_name();
            crate::profile::product(format, self.out_dim, self.in_dim, n_tokens, self.bytes(), t0);
        }
    }

    /// Adds this weight's bytes to those products have touched ([`weight_bytes_touched`]).
    pub(crate) fn count_bytes(&self) {
        WEIGHT_BYTES.fetch_add(self.bytes() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// [`Linear::matmul`] on the CPU, whatever device is installed.
    pub(crate) fn matmul_cpu(&self, xs: &[f32], n_tokens: usize, ys: &mut [f32]) {
        let n = self.in_dim;
        if let Some(w) = self.amx_bf16() {
            return self.matmul_amx(w, xs, n_tokens, ys);
        }
        let prepared: Vec<Prepared> = xs.chunks_exact(n).map(|x| self.prepare(x)).collect();
        let work = self.out_dim * self.in_dim * n_tokens;
        let serial = work < PARALLEL_MIN_WORK || crate::threads() == 1;
        if n_tokens == 1 {
            if serial {
                self.rows_dot_prepared(0..self.out_dim, xs, &prepared[0], ys);
                return;
            }
            // Row blocks in parallel; with one token the output rows are contiguous already.
            ys.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(b, out)| {
                let r0 = b * ROWS_PER_TASK;
                self.rows_dot_prepared(r0..r0 + out.len(), xs, &prepared[0], out);
            });
            return;
        }
        // Several tokens: each block of rows computes its rows for every token, so each weight
        // row is read once per product (on one thread too). The dense kernels load each
        // activation vector once per row: on a 64-byte boundary (a copy, once per product) none
        // of those loads straddles two cache lines.
        let dense = matches!(
            self.data,
            WeightData::F32(_) | WeightData::Bf16(_) | WeightData::F16(_) | WeightData::Int8 { .. }
        );
        if !dense || (xs.as_ptr() as usize).is_multiple_of(64) {
            return self.matmul_tokens(xs, n_tokens, &prepared, serial, ys);
        }
        // The thread's copy from the last product is reused (a fresh buffer of this size would
        // fault in page by page on this thread while the others wait), unless this thread is
        // inside a product already (a kernel thread running another task meanwhile).
        LINES.with(|kept| {
            let (mut held, mut fresh) = (kept.try_borrow_mut(), Vec::new());
            let lines = held.as_deref_mut().unwrap_or(&mut fresh);
            Line::fill(lines, xs);
            self.matmul_tokens(&Line::as_f32s(lines)[..xs.len()], n_tokens, &prepared, serial, ys);
            if lines.len() * 64 > KEEP_LINES_MAX {
                *lines = Vec::new();
            }
        })
    }

    /// The several-token part of [`Linear::matmul`] on activations as they are: tasks of a block
    /// of rows x a block of tokens ([`tiles`]), each computing into a buffer of its own (a few
    /// KiB) and then writing its part of every token's output (no (out, T) copy of the product).
    fn matmul_tokens(
        &self,
        xs: &[f32],
        n_tokens: usize,
        prepared: &[Prepared],
        serial: bool,
        ys: &mut [f32],
    ) {
        let threads = if serial { 1 } else { crate::threads() };
        let tile = tiles(
            self.out_dim,
            self.in_dim,
            n_tokens,
            self.bytes() / self.out_dim.max(1),
            threads,
        );
        self.matmul_tiled(xs, n_tokens, prepared, serial, tile, ys)
    }

    /// [`Linear::matmul_tokens`] with tasks of `tile`.
    fn matmul_tiled(
        &self,
        xs: &[f32],
        n_tokens: usize,
        prepared: &[Prepared],
        serial: bool,
        tile: Tile,
        ys: &mut [f32],
    ) {
        let (out_dim, n) = (self.out_dim, self.in_dim);
        let row_blocks = out_dim.div_ceil(tile.rows);
        let ys_at = OutPtr(ys.as_mut_ptr());
        let task = |b: usize| {
            let (rb, tb) = (b % row_blocks, b / row_blocks);
            let rows = rb * tile.rows..((rb + 1) * tile.rows).min(out_dim);
            let toks = tb * tile.tokens..((tb + 1) * tile.tokens).min(n_tokens);
            let m = toks.len();
            let mut local = crate::take_zeroed_f32(rows.len() * m); // (rows, m)
            self.rows_dot_prepared_tokens(
                rows.clone(),
                &xs[toks.start * n..toks.end * n],
                &prepared[toks.clone()],
                &mut local,
            );
            for (i, row) in local.chunks_exact(m).enumerate() {
                for (t, v) in toks.clone().zip(row) {
                    // SAFETY: t < n_tokens and rows.start + i < out_dim index inside `ys`
                    // (T x out_dim, checked above); tasks own disjoint (row, token) blocks, so no
                    // two write one element, and `ys` outlives the tasks.
                    unsafe { *ys_at.get().add(t * out_dim + rows.start + i) = *v };
                }
            }
            crate::give_back_f32(local);
        };
        let tasks = row_blocks * n_tokens.div_ceil(tile.tokens);
        if serial {
            (0..tasks).for_each(task);
        } else {
            (0..tasks).into_par_iter().for_each(task);
        }
    }

    /// The BF16 weights when every BF16 product of the process runs on AMX tiles
    /// ([`crate::amx::enabled`]; batch invariance needs all of them there).
    fn amx_bf16(&self) -> Option<&[u16]> {
        match &self.data {
            #[cfg(target_arch = "x86_64")]
            WeightData::Bf16(w) if crate::amx::enabled() => Some(w),
            _ => None,
        }
    }

    /// [`Linear::matmul`] on AMX tiles: the activations laid out once, tasks of a block of rows x
    /// a range of token blocks ([`amx_task`]) on the kernels' threads, each writing its outputs in
    /// place.
    fn matmul_amx(&self, w: &[u16], xs: &[f32], n_tokens: usize, ys: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            let (n, out_dim) = (self.in_dim, self.out_dim);
            let act = crate::amx::AmxAct::new(xs, n_tokens, n);
            let serial = out_dim * n * n_tokens < PARALLEL_MIN_WORK || crate::threads() == 1;
            let threads = if serial { 1 } else { crate::threads() };
            let blocks = act.blocks();
            let (rows_per_task, per_task) = amx_task(out_dim, blocks, threads);
            let row_tasks = out_dim.div_ceil(rows_per_task);
            let col_tasks = blocks.div_ceil(per_task);
            let ys_at = OutPtr(ys.as_mut_ptr());
            let task = |i: usize| {
                let (r0, c) = ((i % row_tasks) * rows_per_task, i / row_tasks);
                let rows = (out_dim - r0).min(rows_per_task);
                let bs = c * per_task..((c + 1) * per_task).min(blocks);
                // SAFETY: `amx_bf16` saw `amx::enabled()`. t < n_tokens and rows r0 + r .. r0 + r +
                // vs.len() <= out_dim index inside `ys` (T x out_dim, checked by `matmul`); `vs`
                // is the kernel's own buffer; tasks own disjoint (row, token)
                // blocks, so no two write one element, and `ys` outlives the tasks.
                unsafe {
                    crate::amx::rows(w, n, r0, rows, &act, bs, |r, t, vs| {
                        let at = ys_at.get().add(t * out_dim + r0 + r);
                        match <&[f32; crate::amx::ROWS]>::try_from(vs) {
                            // A whole tile's rows: moved as one block, not through `memcpy`.
                            Ok(whole) => (at as *mut [f32; crate::amx::ROWS]).write_unaligned(*whole),
                            Err(_) => std::ptr::copy_nonoverlapping(vs.as_ptr(), at, vs.len()),
                        }
                    })
                }
            };
            let tasks = row_tasks * col_tasks;
            if serial {
                (0..tasks).for_each(task);
            } else {
                (0..tasks).into_par_iter().for_each(task);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!(
            "AMX on {} weights {w:p} {xs:p} {n_tokens} {}",
            self.out_dim,
            ys.len()
        );
    }

    /// W[rows] (n, in) @ x (in,) -> y (n,): a block of rows, e.g. one head of a fused projection.
    pub fn matvec_rows(&self, rows: std::ops::Range<usize>, x: &[f32], y: &mut [f32]) {
        assert_eq!(y.len(), rows.len());
        if let Some(w) = self.amx_bf16() {
            return amx_product(w, self.in_dim, rows, x, 1, y);
        }
        for (o, r) in y.iter_mut().zip(rows) {
            *o = self.row_dot(r, x);
        }
    }

    /// W[rows]^T (in, n) @ q (n,) -> y (in,): y = sum_r q[r] * W[r,:], rows taken in order.
    pub fn matvec_rows_transposed(&self, rows: std::ops::Range<usize>, q: &[f32], y: &mut [f32]) {
        assert_eq!(q.len(), rows.len());
        assert_eq!(y.len(), self.in_dim);
        y.iter_mut().for_each(|v| *v = 0.0);
        let mut row = vec![0f32; self.in_dim];
        for (&a, r) in q.iter().zip(rows) {
            self.decode_row(r, &mut row);
            for (o, w) in y.iter_mut().zip(&row) {
                *o += a * w;
            }
        }
    }

    /// Row r widened to f32 into `out` (in,).
    pub fn decode_row(&self, r: usize, out: &mut [f32]) {
        self.data.decode_row(self.in_dim, r, out)
    }

    /// The weight as INT8 with one scale per output row (`int8::quantize_row` on each decoded
    /// row), for dense and FP8 weights; None for the formats already 8 bits or fewer per weight
    /// (INT8, INT4, MXFP4): nothing to gain.
    pub fn to_int8(&self) -> Option<Result<Linear, String>> {
        if matches!(
            self.data,
            WeightData::Int8 { .. }
                | WeightData::Int4 { .. }
                | WeightData::Mxfp4 { .. }
                | WeightData::Q8_0 { .. }
                | WeightData::Ggml { .. }
        ) {
            return None;
        }
        let n = self.in_dim;
        let mut w = vec![0i8; self.out_dim * n];
        let mut scales = vec![0f32; self.out_dim];
        let rows: Result<(), String> = w
            .par_chunks_mut(n.max(1))
            .zip(scales.par_iter_mut())
            .enumerate()
            .try_for_each_init(
                || vec![0f32; n],
                |row, (r, (q, s))| {
                    self.decode_row(r, row);
                    *s = int8::quantize_row(row, q).map_err(|e| format!("row {r}: {e}"))?;
                    Ok(())
                },
            );
        Some(rows.map(|()| {
            Linear::new(
                self.out_dim,
                self.in_dim,
                WeightData::Int8 {
                    w: w.into(),
                    scales: scales.into(),
                },
            )
        }))
    }

    /// One row as f32 (embedding lookups).
    pub fn row_f32(&self, r: usize) -> Vec<f32> {
        let mut out = vec![0f32; self.in_dim];
        self.decode_row(r, &mut out);
        out
    }
}

/// (rows, column blocks) per task of [`Linear::matmul_amx`] for `out_dim` rows, `blocks` blocks of
/// tokens and `threads` threads.
///
/// One pair of blocks (a lone token, a few): passes of 32 rows, or of 16 where 32 would leave
/// fewer than four tasks per thread (a small matrix's lone token). More: up to 256 rows x 32
/// blocks (160 tokens, 256 with two parts), whose activations and sums for a chunk of inputs stay
/// in the core's cache while the rows stream past (see [`crate::amx::rows`]); fewer rows until
/// every thread has four tasks, then fewer blocks until it has two (splitting the tokens reads
/// the weights once more per split).
#[cfg(target_arch = "x86_64")]
fn amx_task(out_dim: usize, blocks: usize, threads: usize) -> (usize, usize) {
    const PASS: usize = 2 * crate::amx::ROWS;
    if blocks <= 2 {
        let rows = if out_dim.div_ceil(PASS) >= 4 * threads {
            PASS
        } else {
            crate::amx::ROWS
        };
        return (rows, 2);
    }
    let (mut rows, mut per) = (8 * PASS, 32);
    let tasks = |rows: usize, per: usize| out_dim.div_ceil(rows) * blocks.div_ceil(per);
    while rows > crate::amx::ROWS && tasks(rows, per) < 4 * threads {
        rows /= 2;
    }
    while per > 2 && tasks(rows, per) < 2 * threads {
        per /= 2;
    }
    (rows, per)
}

/// `out[(r - rows.start) * T + t] = row r . xs[t]` on AMX tiles ([`crate::amx::product`]).
fn amx_product(
    w: &[u16],
    in_dim: usize,
    rows: std::ops::Range<usize>,
    xs: &[f32],
    tokens: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: callers saw `amx::enabled()` (`Linear::amx_bf16`).
    unsafe {
        crate::amx::product(w, in_dim, rows, xs, tokens, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("AMX for {w:p} {in_dim} {rows:?} {xs:p} {tokens} {}", out.len());
}

#[cfg(test)]
#[path = "linear_tests.rs"]
mod tests;
