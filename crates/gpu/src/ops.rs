//! A decoder layer's work on tensors that stay in GPU memory: products, RMSNorm, adds, gated
//! activations, per-head norms with the rotary embedding, causal attention over a cache, copies.
//! A [`Recorder`] collects them and [`Recorder::finish`] runs them as one submission with one
//! wait, reading back only the tensors asked for; so a layer crosses the bus once, not once per
//! product. The kernels are in `shaders/ops.wgsl`; each has the CPU's implementation as its
//! reference (`tests/ops.rs`).

use std::sync::Arc;

use crate::matrix::{le_bytes, u32_of, GpuMatrix, RecordedKey, Tile, WeightFormat, MAX_GROUPS, RECORDED_MAX};
use crate::ops_state::{BindCache, Kernel, Pool, Pooled, OPS_PARAMS};
use crate::product::{dispatches, Dispatch, PARAMS_STRIDE};
use crate::slab::Slot;
use crate::{Gpu, GpuError};

/// Invocations per workgroup of the kernels (`WG` in the shader).
const WG: usize = 128;
/// The longest head (or RMSNorm row in `norm_rope`) the kernels hold: 1024 values.
pub const MAX_HEAD: usize = 1024;

/// f32 values in GPU memory. Its buffer goes back to its GPU's pool when neither the tensor nor
/// a recorder that uses it holds it any more, for the next tensor of its size.
pub struct GpuTensor {
    inner: Arc<Pooled>,
    len: usize,
}

impl GpuTensor {
    pub(crate) fn buf(&self) -> &wgpu::Buffer {
        self.inner.buf.as_ref().expect("held until dropped")
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The gated activation of [`Recorder::glu`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Glu {
    /// silu(g) * u.
    Silu,
    /// [beta tanh(g/beta) sigmoid(g)] * [linear_beta tanh(u/linear_beta)].
    Situ { beta: f32, linear_beta: f32 },
}

/// The rotary embedding of [`Recorder::norm_rope`]: `dim` values of each head from `offset`
/// rotated by their token's cosines and sines (`cos_sin`: per token `dim / 2` cosines, then as
/// many sines), as NeoX halves or `interleaved` pairs.
#[derive(Clone, Copy)]
pub struct Rotation<'a> {
    pub offset: usize,
    pub dim: usize,
    pub interleaved: bool,
    pub cos_sin: &'a GpuTensor,
}

/// One sequence's new tokens for [`Recorder::attend`].
#[derive(Clone, Copy, Debug)]
pub struct AttendShape {
    /// Query heads per token, and query heads per KV head.
    pub heads: usize,
    pub group: usize,
    /// Values of a query and a key head, and of a value head (an output head's width).
    pub head_dim: usize,
    pub value_dim: usize,
    /// Values per cached position (every KV head's).
    pub kv_width: usize,
    /// The sequence's first row in the queries and outputs, its new tokens, and the position
    /// of the first of them.
    pub row0: usize,
    pub tokens: usize,
    pub start_pos: usize,
    /// Only the last `window` positions are seen (a sliding window); None: all.
    pub window: Option<usize>,
    pub scale: f32,
}

/// Whether `op` is a copy or a clear (recorded between compute passes).
fn is_transfer(op: &Op) -> bool {
    matches!(op, Op::Copy { .. } | Op::Clear(_))
}

/// The profile row of an op's GPU time (`timing.rs`).
fn label(op: &Op) -> String {
    match op {
        Op::Matmul { format, tile, .. } => format!("GPU time: product {format:?} {tile}"),
        Op::Grouped { format, tile, .. } => format!("GPU time: experts' products {format:?} {tile}"),
        Op::Kernel { k, .. } => format!("GPU time: {}", k.entry()),
        Op::Copy { .. } | Op::Clear(_) => "GPU time: transfers".into(),
    }
}

/// A chunk's recorded bind groups ([`crate::matrix::Chunk::recorded`]).
type RecordedBinds = Arc<std::sync::Mutex<Vec<(RecordedKey, wgpu::BindGroup)>>>;

enum Op {
    Matmul {
        format: WeightFormat,
        tile: Tile,
        /// Each chunk's buffer and the bind groups recorded for it.
        chunks: Vec<(wgpu::Buffer, RecordedBinds)>,
        ds: Vec<Dispatch>,
        x: wgpu::Buffer,
        x_bytes: u64,
        y: wgpu::Buffer,
        y_bytes: u64,
    },
    /// The products of several experts whose matrices share one slab, one dispatch
    /// (`Recorder::matmul_experts`).
    Grouped {
        format: WeightFormat,
        tile: Tile,
        w: wgpu::Buffer,
        d: Dispatch,
        items: wgpu::Buffer,
        x: wgpu::Buffer,
        y: wgpu::Buffer,
        /// Where in `items` the GPU wrote the dispatch's size; None: `d.groups`.
        indirect: Option<u64>,
    },
    Kernel {
        k: Kernel,
        /// a (written), b, c, d; None: unused.
        bufs: [Option<wgpu::Buffer>; 4],
        params: [u32; 16],
        groups: [u32; 3],
    },
    Clear(wgpu::Buffer),
    Copy {
        src: wgpu::Buffer,
        src_off: u64,
        dst: wgpu::Buffer,
        dst_off: u64,
        bytes: u64,
    },
}

/// Work recorded for one submission ([`Gpu::recorder`]).
pub struct Recorder<'g> {
    gpu: &'g Gpu,
    ops: Vec<Op>,
    /// Every tensor an op uses, held until the work is done.
    used: Vec<Arc<Pooled>>,
    /// The slab slots of the experts whose products were recorded: held until the work is
    /// done, so no other expert is written there before it.
    slots: Vec<Arc<Slot>>,
}

pub(crate) fn shape(what: String) -> GpuError {
    GpuError::Shape(what)
}

pub(crate) fn need(t: &GpuTensor, n: usize, what: &str) -> Result<(), GpuError> {
    if t.len < n {
        return Err(shape(format!(
            "{what}: a tensor of {} values where {n} are used",
            t.len
        )));
    }
    Ok(())
}

/// A grid of `n` workgroups (at most [`MAX_GROUPS`] a line) and its line length.
pub(crate) fn grid(n: usize) -> ([u32; 3], u32) {
    let x = n.clamp(1, MAX_GROUPS);
    ([x as u32, n.div_ceil(x).max(1) as u32, 1], x as u32)
}

impl Gpu {
    /// `len` f32 values of GPU memory, their values undefined until written ([`Recorder::clear`]
    /// zeroes them): a pooled buffer of its size when there is one.
    pub fn tensor(&self, len: usize) -> Result<GpuTensor, GpuError> {
        let exact = (len.max(4) * 4).next_multiple_of(16) as u64;
        if exact > self.binding_limit {
            return Err(shape(format!(
                "a tensor of {len} values exceeds the adapter's largest binding ({} bytes)",
                self.binding_limit
            )));
        }
        u32_of(len, "tensor length")?;
        // Sizes in powers of two (from 256 bytes), so a pooled buffer fits many tensors.
        let pow2 = exact.max(256).next_power_of_two();
        let bytes = if pow2 <= self.binding_limit { pow2 } else { exact };
        // INDIRECT: a tensor may hold the sizes of dispatches the GPU laid out
        // (`ops_resident.rs`).
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::INDIRECT;
        let buf = self.pooled(bytes, usage, "tensor");
        Ok(GpuTensor {
            inner: Arc::new(Pooled {
                buf: Some(buf),
                pool: self.pool.clone(),
            }),
            len,
        })
    }

    /// A buffer of `bytes` and `usage` from the pool, or a new one.
    fn pooled(&self, bytes: u64, usage: wgpu::BufferUsages, label: &str) -> wgpu::Buffer {
        Pool::take(&self.pool, bytes, usage).unwrap_or_else(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        })
    }

    /// A tensor holding `data`.
    pub fn upload_tensor(&self, data: &[f32]) -> Result<GpuTensor, GpuError> {
        let t = self.tensor(data.len())?;
        self.write_tensor(&t, 0, data)?;
        Ok(t)
    }

    /// Writes `data` into `t` from value `at`, before any work submitted after this call.
    pub fn write_tensor(&self, t: &GpuTensor, at: usize, data: &[f32]) -> Result<(), GpuError> {
        need(t, at + data.len(), "writing a tensor")?;
        if !data.is_empty() {
            self.queue.write_buffer(t.buf(), (at * 4) as u64, &le_bytes(data));
        }
        Ok(())
    }

    /// An empty recorder.
    pub fn recorder(&self) -> Recorder<'_> {
        Recorder {
            gpu: self,
            ops: Vec::new(),
            used: Vec::new(),
            slots: Vec::new(),
        }
    }
}

impl<'g> Recorder<'g> {
    /// The GPU this records for.
    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    /// Holds the slab slots of `m`'s chunks until the recorded work is done.
    pub(crate) fn hold_slots(&mut self, m: &GpuMatrix) {
        self.slots.extend(m.chunks.iter().filter_map(|c| c.slot.clone()));
    }

    /// Holds `slots` until the recorded work is done.
    pub(crate) fn hold_slot_list(&mut self, slots: &[Arc<Slot>]) {
        self.slots.extend(slots.iter().cloned());
    }

    /// A grouped product of the experts in slab `w`; `indirect`: the byte of `items` where the
    /// GPU wrote the dispatch's size (None: `d.groups`).
    pub(crate) fn push_grouped(
        &mut self,
        (format, tile): (WeightFormat, Tile),
        (w, d): (&wgpu::Buffer, Dispatch),
        (items, indirect): (&GpuTensor, Option<u64>),
        x: &GpuTensor,
        y: &GpuTensor,
    ) {
        let (items, x, y) = (self.hold(items), self.hold(x), self.hold(y));
        self.ops.push(Op::Grouped {
            format,
            tile,
            w: w.clone(),
            d,
            items,
            x,
            y,
            indirect,
        });
    }

    /// Holds `t` until the recorded work is done; its buffer.
    pub(crate) fn hold(&mut self, t: &GpuTensor) -> wgpu::Buffer {
        self.used.push(t.inner.clone());
        t.buf().clone()
    }

    pub(crate) fn kernel(
        &mut self,
        k: Kernel,
        bufs: [Option<&GpuTensor>; 4],
        params: [u32; 16],
        groups: [u32; 3],
    ) {
        let bufs = bufs.map(|b| b.map(|t| self.hold(t)));
        self.ops.push(Op::Kernel {
            k,
            bufs,
            params,
            groups,
        });
    }

    /// `y` (T x rows) = `m` applied to `x` (T x in), each output's bits those of [`Gpu::matmul`].
    pub fn matmul(
        &mut self,
        m: &GpuMatrix,
        x: &GpuTensor,
        tokens: usize,
        y: &GpuTensor,
    ) -> Result<(), GpuError> {
        self.matmul_at(m, x, 0, tokens, y, 0)
    }

    /// [`Recorder::matmul`] of the T rows of `x` from value `x0`, written to `y` from value
    /// `y0` (an expert's rows among all the experts' of a layer).
    pub fn matmul_at(
        &mut self,
        m: &GpuMatrix,
        x: &GpuTensor,
        x0: usize,
        tokens: usize,
        y: &GpuTensor,
        y0: usize,
    ) -> Result<(), GpuError> {
        need(x, x0 + tokens * m.in_dim, "product activations")?;
        need(y, y0 + tokens * m.rows, "product outputs")?;
        if tokens == 0 {
            return Ok(());
        }
        let tile = self
            .gpu
            .forced_tile
            .unwrap_or(Tile::for_product(tokens, m.rows, m.in_dim));
        let (xb, yb) = (self.hold(x), self.hold(y));
        self.hold_slots(m);
        self.ops.push(Op::Matmul {
            format: m.format,
            tile,
            chunks: m
                .chunks
                .iter()
                .map(|c| (c.buffer.clone(), c.recorded.clone()))
                .collect(),
            ds: dispatches(m, tokens, tile, (x0, y0))?,
            x: xb,
            x_bytes: x.buf().size(),
            y: yb,
            y_bytes: y.buf().size(),
        });
        Ok(())
    }

    /// `y[y0 + r*dim ..]` = RMSNorm of `x[x0 + r*dim ..]` (rows of `dim`) with weights `w`.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &mut self,
        x: &GpuTensor,
        x0: usize,
        w: &GpuTensor,
        y: &GpuTensor,
        y0: usize,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), GpuError> {
        need(x, x0 + rows * dim, "RMSNorm input")?;
        need(y, y0 + rows * dim, "RMSNorm output")?;
        need(w, dim, "RMSNorm weights")?;
        let (groups, line) = grid(rows);
        let mut p = [0u32; 16];
        p[..5].copy_from_slice(&[rows as u32, dim as u32, eps.to_bits(), x0 as u32, y0 as u32]);
        p[15] = line;
        self.kernel(Kernel::RmsNorm, [Some(y), Some(x), Some(w), None], p, groups);
        Ok(())
    }

    /// `acc[i] += x[i % period]` for i < n: a residual (period n) or a bias on each row.
    pub fn add(&mut self, acc: &GpuTensor, n: usize, x: &GpuTensor, period: usize) -> Result<(), GpuError> {
        need(acc, n, "sum")?;
        need(x, period, "addend")?;
        if n == 0 || period == 0 {
            return Ok(());
        }
        let (groups, line) = grid(n.div_ceil(WG));
        let mut p = [0u32; 16];
        p[..2].copy_from_slice(&[n as u32, period as u32]);
        p[15] = line;
        self.kernel(Kernel::Add, [Some(acc), Some(x), None, None], p, groups);
        Ok(())
    }

    /// `gate[i] = act(gate[i], up[i])` for i < n.
    pub fn glu(&mut self, gate: &GpuTensor, up: &GpuTensor, n: usize, act: Glu) -> Result<(), GpuError> {
        need(gate, n, "gates")?;
        need(up, n, "up projections")?;
        let (groups, line) = grid(n.div_ceil(WG));
        let mut p = [0u32; 16];
        p[0] = n as u32;
        if let Glu::Situ { beta, linear_beta } = act {
            p[1..4].copy_from_slice(&[1, beta.to_bits(), linear_beta.to_bits()]);
        }
        p[15] = line;
        self.kernel(Kernel::Glu, [Some(gate), Some(up), None, None], p, groups);
        Ok(())
    }

    /// Each head of each token of `x` (T rows of `heads` x `head_dim`), in place: RMSNorm of its
    /// first `norm.1` values with weights `norm.0` (eps `norm.2`) when given, then the rotation
    /// `rope` when given.
    pub fn norm_rope(
        &mut self,
        x: &GpuTensor,
        tokens: usize,
        heads: usize,
        head_dim: usize,
        norm: Option<(&GpuTensor, usize, f32)>,
        rope: Option<Rotation<'_>>,
    ) -> Result<(), GpuError> {
        need(x, tokens * heads * head_dim, "heads")?;
        let (r0, rd) = rope.as_ref().map_or((0, 0), |r| (r.offset, r.dim));
        let nl = norm.map_or(0, |n| n.1);
        if head_dim > MAX_HEAD || r0 + rd > head_dim || !rd.is_multiple_of(2) || nl > head_dim {
            return Err(shape(format!(
                "heads of {head_dim} values normed over {nl} and rotated over {rd} from {r0} (at most {MAX_HEAD}, an even part)"
            )));
        }
        if tokens == 0 || heads == 0 {
            return Ok(());
        }
        if tokens > MAX_GROUPS || heads > MAX_GROUPS {
            return Err(shape(format!("{tokens} tokens of {heads} heads in one dispatch")));
        }
        let mut p = [0u32; 16];
        p[..3].copy_from_slice(&[heads as u32, head_dim as u32, rd as u32]);
        if let Some((w, len, eps)) = norm {
            need(w, len, "head norm weights")?;
            p[3] = len as u32;
            p[4] = eps.to_bits();
        }
        if let Some(r) = &rope {
            need(r.cos_sin, tokens * r.dim, "rotary cosines and sines")?;
            p[5] = u32::from(r.interleaved);
            p[6] = r.offset as u32;
        }
        let groups = [heads as u32, tokens as u32, 1];
        let bufs = [Some(x), norm.map(|n| n.0), rope.map(|r| r.cos_sin), None];
        self.kernel(Kernel::NormRope, bufs, p, groups);
        Ok(())
    }

    /// Row r of `x` (rows of `dim`) *= sigmoid(`gates[r]`), for `rows` rows.
    pub fn scale_sigmoid(
        &mut self,
        x: &GpuTensor,
        gates: &GpuTensor,
        rows: usize,
        dim: usize,
    ) -> Result<(), GpuError> {
        need(x, rows * dim, "gated rows")?;
        need(gates, rows, "row gates")?;
        let (groups, line) = grid(rows);
        let mut p = [0u32; 16];
        p[..2].copy_from_slice(&[rows as u32, dim as u32]);
        p[15] = line;
        self.kernel(
            Kernel::ScaleSigmoid,
            [Some(x), Some(gates), None, None],
            p,
            groups,
        );
        Ok(())
    }

    /// Zeroes `t`.
    pub fn clear(&mut self, t: &GpuTensor) {
        let buf = self.hold(t);
        self.ops.push(Op::Clear(buf));
    }

    /// `dst[dst0 .. dst0 + n] = src[src0 .. src0 + n]`.
    pub fn copy(
        &mut self,
        src: &GpuTensor,
        src0: usize,
        dst: &GpuTensor,
        dst0: usize,
        n: usize,
    ) -> Result<(), GpuError> {
        need(src, src0 + n, "copy source")?;
        need(dst, dst0 + n, "copy destination")?;
        if n > 0 {
            let (src, dst) = (self.hold(src), self.hold(dst));
            self.ops.push(Op::Copy {
                src,
                src_off: (src0 * 4) as u64,
                dst,
                dst_off: (dst0 * 4) as u64,
                bytes: (n * 4) as u64,
            });
        }
        Ok(())
    }

    /// Runs everything recorded as one submission, waits for it, and returns the values of each
    /// `(tensor, first, count)` of `reads`.
    pub fn finish(self, reads: &[(&GpuTensor, usize, usize)]) -> Result<Vec<Vec<f32>>, GpuError> {
        let g = self.gpu;
        for &(t, at, n) in reads {
            need(t, at + n, "read back")?;
        }
        let t_rec = strata_kernels::profile::enabled().then(std::time::Instant::now);
        let bytes = self.params();
        // One parameter buffer for every submission (grown when one needs more), so the bind
        // groups that name it can be kept; held for the whole submission.
        let mut binds = g.binds.lock().unwrap_or_else(|e| e.into_inner());
        let params = binds.params(&g.device, bytes.len() as u64);
        g.queue.write_buffer(&params, 0, &bytes);
        let mut enc = g.device.create_command_encoder(&Default::default());
        let n_timed = self.ops.iter().filter(|op| !is_transfer(op)).count();
        let stamps = g.stamps(n_timed);
        // Runs of dispatches share one compute pass (a pass costs more to track than its
        // dispatches); copies and clears go between passes.
        let (mut slot, mut timed) = (0u64, 0usize);
        let mut i = 0;
        while i < self.ops.len() {
            if is_transfer(&self.ops[i]) {
                self.record_transfer(&mut enc, &self.ops[i]);
                i += 1;
                continue;
            }
            let mut pass = enc.begin_compute_pass(&Default::default());
            while let Some(op) = self.ops.get(i).filter(|op| !is_transfer(op)) {
                stamps.iter().for_each(|s| s.write(&mut pass, timed, false));
                slot += self.record(&mut pass, op, &params, slot, &mut binds);
                stamps.iter().for_each(|s| s.write(&mut pass, timed, true));
                timed += 1;
                i += 1;
            }
        }
        let total: usize = reads.iter().map(|r| r.2).sum();
        let extra = stamps.as_ref().map_or(0, |s| s.floats());
        let use_s = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let staging = g.pooled(
            (((total + extra).max(4) * 4) as u64).next_power_of_two(),
            use_s,
            "read back",
        );
        let mut at = 0u64;
        for &(t, first, n) in reads {
            if n > 0 {
                enc.copy_buffer_to_buffer(t.buf(), (first * 4) as u64, &staging, at, (n * 4) as u64);
            }
            at += (n * 4) as u64;
        }
        if let Some(s) = &stamps {
            s.copy(&mut enc, &staging, at);
        }
        let t_sub = strata_kernels::profile::enabled().then(std::time::Instant::now);
        let all = g.read_back_copied(enc, &staging, total + extra);
        if let (Some(a), Some(b)) = (t_rec, t_sub) {
            strata_kernels::profile::record("GPU: recording ops", 1, b - a);
            strata_kernels::profile::record("GPU: submit, run, read back", 1, b.elapsed());
        }
        drop(binds);
        Pool::put(&g.pool, staging);
        let all = all?;
        if let Some(s) = &stamps {
            let labels: Vec<String> = self.ops.iter().filter(|op| !is_transfer(op)).map(label).collect();
            s.record(&labels, &all[total..], g.queue.get_timestamp_period());
        }
        let mut out = Vec::with_capacity(reads.len());
        let mut from = 0;
        for &(_, _, n) in reads {
            out.push(all[from..from + n].to_vec());
            from += n;
        }
        Ok(out)
    }

    /// Every op's parameter blocks, one per slot of [`PARAMS_STRIDE`] bytes.
    fn params(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut put = |bytes: &[u8]| {
            let at = out.len();
            out.resize(at + PARAMS_STRIDE as usize, 0);
            out[at..at + bytes.len()].copy_from_slice(bytes);
        };
        for op in &self.ops {
            match op {
                Op::Matmul { ds, .. } => ds.iter().for_each(|d| put(&d.params)),
                Op::Grouped { d, .. } => put(&d.params),
                Op::Kernel { params, .. } => put(&le_bytes(params.as_slice())),
                Op::Copy { .. } | Op::Clear(_) => {}
            }
        }
        if self.ops.is_empty() {
            put(&[0; 16]);
        }
        out
    }

    /// Records `op` with its parameters from `slot`; returns the slots it took.
    fn record(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        op: &Op,
        params: &wgpu::Buffer,
        slot: u64,
        kept: &mut BindCache,
    ) -> u64 {
        let g = self.gpu;
        match op {
            Op::Matmul {
                format,
                tile,
                chunks,
                ds,
                x,
                x_bytes,
                y,
                y_bytes,
            } => {
                let binds: Vec<wgpu::BindGroup> = chunks
                    .iter()
                    .map(|(w, recorded)| {
                        let key = [(x.clone(), *x_bytes), (y.clone(), *y_bytes), (params.clone(), 0)];
                        let mut held = recorded.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some((_, b)) = held.iter().find(|(k, _)| *k == key) {
                            return b.clone();
                        }
                        if held.len() >= RECORDED_MAX {
                            held.remove(0);
                        }
                        let b = g.matmul_bind_at(w, (x, (0, *x_bytes)), (y, (0, *y_bytes)), params);
                        held.push((key, b.clone()));
                        b
                    })
                    .collect();
                g.record_in(pass, *format, *tile, ds, &binds, slot);
                ds.len() as u64
            }
            Op::Grouped {
                format,
                tile,
                w,
                d,
                items,
                x,
                y,
                indirect,
            } => {
                // Kept by buffers (the parameters' is the cache's own); a slab given back
                // clears the cache.
                let key = [Some((w, 0)), Some((x, 0)), Some((y, 0)), Some((items, 0))];
                let bind = kept.get(2, key, || g.grouped_bind(w, [x, y, params, items]));
                pass.set_pipeline(g.matmul_pipeline(*format, *tile, true));
                pass.set_bind_group(0, &bind, &[(slot * PARAMS_STRIDE) as u32]);
                match indirect {
                    Some(at) => pass.dispatch_workgroups_indirect(items, *at),
                    None => pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]),
                }
                1
            }
            Op::Kernel { k, bufs, groups, .. } => {
                let o = &g.ops;
                let entries: Vec<wgpu::BindGroupEntry<'_>> = bufs
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: i as u32,
                        resource: b.as_ref().unwrap_or(&o.unused).as_entire_binding(),
                    })
                    .chain(std::iter::once(wgpu::BindGroupEntry {
                        binding: 4,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: params,
                            offset: 0,
                            size: wgpu::BufferSize::new(OPS_PARAMS),
                        }),
                    }))
                    .collect();
                let key = bufs.each_ref().map(|b| b.as_ref().map(|b| (b, 0)));
                let bind = kept.get(1, key, || {
                    g.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: None,
                        layout: &o.layout,
                        entries: &entries,
                    })
                });
                pass.set_pipeline(o.pipeline(&g.device, *k));
                pass.set_bind_group(0, &bind, &[(slot * PARAMS_STRIDE) as u32]);
                pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                1
            }
            Op::Copy { .. } | Op::Clear(_) => unreachable!("recorded between passes"),
        }
    }

    /// Records a copy or a clear.
    fn record_transfer(&self, enc: &mut wgpu::CommandEncoder, op: &Op) {
        match op {
            Op::Copy {
                src,
                src_off,
                dst,
                dst_off,
                bytes,
            } => enc.copy_buffer_to_buffer(src, *src_off, dst, *dst_off, *bytes),
            Op::Clear(buf) => enc.clear_buffer(buf, 0, None),
            Op::Matmul { .. } | Op::Grouped { .. } | Op::Kernel { .. } => {
                unreachable!("recorded in a pass")
            }
        }
    }
}
