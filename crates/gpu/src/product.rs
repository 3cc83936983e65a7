//! Running products: activations up, one dispatch per weight chunk, results back. A product
//! makes no buffers: it writes into buffers kept for the next one, its parameters at dynamic
//! offsets of one uniform buffer, and each chunk keeps its bind group while those buffers stay.

use wgpu::util::DeviceExt;

use crate::matrix::{
    entry, le_bytes, u32_of, Chunk, GpuMatrix, MatmulParams, Tile, WeightFormat, MATMUL_PARAMS, MAX_GROUPS,
};
use crate::{Gpu, GpuError};

/// Bytes between the parameter blocks of one product's chunks (at least the adapter's
/// `min_uniform_buffer_offset_alignment`, which WebGPU caps at 256).
pub(crate) const PARAMS_STRIDE: u64 = 256;
const PARAMS_BYTES: u64 = MATMUL_PARAMS as u64;

/// Buffers one product at a time works through, kept and grown for the next.
#[derive(Default)]
pub(crate) struct Scratch {
    x: Option<wgpu::Buffer>,
    y: Option<wgpu::Buffer>,
    staging: Option<wgpu::Buffer>,
    params: Option<wgpu::Buffer>,
    /// Bumped whenever `x`, `y` or `params` is made anew (the chunks' bind groups name them).
    generation: u64,
}

/// Where one product of [`Gpu::matmul_many`] goes: its tile, its activations' and outputs'
/// (offset, bytes) in the kept buffers, its first parameter slot and its dispatches.
struct Planned {
    tile: Tile,
    x: (u64, u64),
    y: (u64, u64),
    slot0: u64,
    ds: Vec<Dispatch>,
}

/// One chunk's dispatch: its parameters and workgroups.
pub(crate) struct Dispatch {
    pub(crate) params: [u8; MATMUL_PARAMS],
    pub(crate) groups: [u32; 3],
}

/// A compute shader's storage buffer binding.
pub(crate) fn storage(binding: u32, read_only: bool) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

/// The bind group layout every product pipeline shares (the uniform at a dynamic offset);
/// `grouped`: with the items of a product of several experts (binding 4).
pub(crate) fn matmul_layout(device: &wgpu::Device, grouped: bool) -> wgpu::BindGroupLayout {
    let mut entries = vec![
        storage(0, true),
        storage(1, true),
        storage(2, false),
        wgpu::BindGroupLayoutEntry {
            binding: 3,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: wgpu::BufferSize::new(PARAMS_BYTES),
            },
            count: None,
        },
    ];
    if grouped {
        entries.push(storage(4, true));
    }
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(if grouped { "grouped matmul" } else { "matmul" }),
        entries: &entries,
    })
}

impl Gpu {
    /// `ys[t * rows + r] = dot(row r, xs[t])` for the `tokens` activations in `xs` (T x in_dim),
    /// as the CPU's `Linear::matmul` lays them out. Each output's sum runs in the same order
    /// whatever `tokens` is.
    pub fn matmul(&self, m: &GpuMatrix, xs: &[f32], tokens: usize) -> Result<Vec<f32>, GpuError> {
        let tile = self
            .forced_tile
            .unwrap_or(Tile::for_product(tokens, m.rows, m.in_dim));
        self.matmul_tile(m, xs, tokens, tile)
    }

    /// [`Gpu::matmul`] through the pipeline of `tile` (every tile gives the same bits).
    pub fn matmul_tile(
        &self,
        m: &GpuMatrix,
        xs: &[f32],
        tokens: usize,
        tile: Tile,
    ) -> Result<Vec<f32>, GpuError> {
        if tokens == 0 || xs.len() != tokens * m.in_dim {
            return Err(GpuError::Shape(format!(
                "activations of {} values are not {tokens} tokens of {}",
                xs.len(),
                m.in_dim
            )));
        }
        let dispatches = dispatches(m, tokens, tile, (0, 0))?;
        let out_len = tokens * m.rows;
        let out_bytes = (out_len * 4) as u64;
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *scratch;
        let mut fresh = false;
        let use_x = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        fresh |= ensure(
            &self.device,
            &mut s.x,
            (xs.len() * 4) as u64,
            use_x,
            "activations",
        );
        let use_y = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        fresh |= ensure(&self.device, &mut s.y, out_bytes, use_y, "outputs");
        let use_p = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
        let p_bytes = PARAMS_STRIDE * dispatches.len() as u64;
        fresh |= ensure(&self.device, &mut s.params, p_bytes, use_p, "matmul params");
        let use_s = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        ensure(&self.device, &mut s.staging, out_bytes, use_s, "read back");
        s.generation += u64::from(fresh);
        let (x, y, params) = (s.x.as_ref(), s.y.as_ref(), s.params.as_ref());
        let (x, y, params) = (x.expect("made"), y.expect("made"), params.expect("made"));
        self.queue.write_buffer(x, 0, &le_bytes(xs));
        for (i, d) in dispatches.iter().enumerate() {
            self.queue
                .write_buffer(params, i as u64 * PARAMS_STRIDE, &d.params);
        }
        let binds: Vec<wgpu::BindGroup> = m
            .chunks
            .iter()
            .map(|c| {
                let mut kept = c.bind.lock().unwrap_or_else(|e| e.into_inner());
                match &*kept {
                    Some((g, b)) if *g == s.generation => b.clone(),
                    _ => {
                        let b = self.matmul_bind(&c.buffer, x, y, params);
                        *kept = Some((s.generation, b.clone()));
                        b
                    }
                }
            })
            .collect();
        let mut enc = self.device.create_command_encoder(&Default::default());
        self.record_at(&mut enc, m.format, tile, &dispatches, &binds, 0);
        self.read_back(enc, y, s.staging.as_ref().expect("made"), out_len)
    }

    /// Several products as one submission: `jobs` (matrix, activations, tokens), each through
    /// the tile its lone [`Gpu::matmul`] takes, so each output has the same bits; one wait and
    /// one read back for all. Returns each job's outputs.
    pub fn matmul_many(&self, jobs: &[(&GpuMatrix, &[f32], usize)]) -> Result<Vec<Vec<f32>>, GpuError> {
        let align = self.storage_align.max(16);
        let mut plans = Vec::with_capacity(jobs.len());
        let (mut x_end, mut y_end, mut slots) = (0u64, 0u64, 0u64);
        for &(m, xs, tokens) in jobs {
            if tokens == 0 || xs.len() != tokens * m.in_dim {
                return Err(GpuError::Shape(format!(
                    "activations of {} values are not {tokens} tokens of {}",
                    xs.len(),
                    m.in_dim
                )));
            }
            let tile = self
                .forced_tile
                .unwrap_or(Tile::for_product(tokens, m.rows, m.in_dim));
            let ds = dispatches(m, tokens, tile, (0, 0))?;
            let (x_bytes, y_bytes) = ((xs.len() * 4) as u64, (tokens * m.rows * 4) as u64);
            plans.push(Planned {
                tile,
                x: (x_end, x_bytes),
                y: (y_end, y_bytes),
                slot0: slots,
                ds,
            });
            slots += m.chunks.len() as u64;
            x_end = (x_end + x_bytes.next_multiple_of(16)).next_multiple_of(align);
            y_end = (y_end + y_bytes).next_multiple_of(align);
        }
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *scratch;
        let mut fresh = false;
        let use_x = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        fresh |= ensure(&self.device, &mut s.x, x_end, use_x, "activations");
        let use_y = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        fresh |= ensure(&self.device, &mut s.y, y_end, use_y, "outputs");
        let use_p = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
        fresh |= ensure(
            &self.device,
            &mut s.params,
            PARAMS_STRIDE * slots,
            use_p,
            "matmul params",
        );
        let use_s = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        ensure(&self.device, &mut s.staging, y_end, use_s, "read back");
        s.generation += u64::from(fresh);
        let (x, y, params) = (s.x.as_ref(), s.y.as_ref(), s.params.as_ref());
        let (x, y, params) = (x.expect("made"), y.expect("made"), params.expect("made"));
        let mut enc = self.device.create_command_encoder(&Default::default());
        for (&(m, xs, _), p) in jobs.iter().zip(&plans) {
            self.queue.write_buffer(x, p.x.0, &le_bytes(xs));
            let binds: Vec<wgpu::BindGroup> = m
                .chunks
                .iter()
                .zip(&p.ds)
                .enumerate()
                .map(|(i, (c, d))| {
                    self.queue
                        .write_buffer(params, (p.slot0 + i as u64) * PARAMS_STRIDE, &d.params);
                    // The shader reads activations as 16-byte words: the binding covers whole ones.
                    let xs_range = (p.x.0, p.x.1.next_multiple_of(16));
                    self.matmul_bind_at(&c.buffer, (x, xs_range), (y, p.y), params)
                })
                .collect();
            self.record_at(&mut enc, m.format, p.tile, &p.ds, &binds, p.slot0);
        }
        let all = self.read_back(enc, y, s.staging.as_ref().expect("made"), (y_end / 4) as usize)?;
        Ok(plans
            .iter()
            .map(|p| all[(p.y.0 / 4) as usize..((p.y.0 + p.y.1) / 4) as usize].to_vec())
            .collect())
    }

    /// Seconds per product of `m` with `tokens` activations through `tile`, averaged over
    /// `reps` products submitted together in one compute pass (weights and activations already
    /// on the GPU; no read back).
    pub fn time_matmul(
        &self,
        m: &GpuMatrix,
        tokens: usize,
        reps: usize,
        tile: Tile,
    ) -> Result<f64, GpuError> {
        // Whole 16-byte words, as the shaders read them.
        let xs: Vec<f32> = (0..(tokens * m.in_dim).next_multiple_of(4))
            .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
            .collect();
        let x = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("activations"),
            contents: &le_bytes(&xs),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let y = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("outputs"),
            size: (tokens * m.rows * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let dispatches = dispatches(m, tokens, tile, (0, 0))?;
        let params = self.params_buffer(&dispatches);
        let binds: Vec<_> = m
            .chunks
            .iter()
            .map(|c| self.matmul_bind(&c.buffer, &x, &y, &params))
            .collect();
        // All in one compute pass, as a submission's products run (`Recorder::finish`).
        let run = |n: usize| -> Result<f64, GpuError> {
            let mut enc = self.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for _ in 0..n {
                    self.record_in(&mut pass, m.format, tile, &dispatches, &binds, 0);
                }
            }
            let t = std::time::Instant::now();
            self.queue.submit([enc.finish()]);
            self.wait("timed product")?;
            Ok(t.elapsed().as_secs_f64())
        };
        run(1)?; // warm-up: pipelines, first touch
        Ok(run(reps.max(1))? / reps.max(1) as f64)
    }

    /// A uniform buffer of the dispatches' parameters, one per `PARAMS_STRIDE`.
    fn params_buffer(&self, dispatches: &[Dispatch]) -> wgpu::Buffer {
        let mut all = vec![0u8; PARAMS_STRIDE as usize * dispatches.len()];
        for (i, d) in dispatches.iter().enumerate() {
            all[i * PARAMS_STRIDE as usize..][..MATMUL_PARAMS].copy_from_slice(&d.params);
        }
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("matmul params"),
            contents: &all,
            usage: wgpu::BufferUsages::UNIFORM,
        })
    }

    /// Seconds per product of `n` products of `m` (one token, `tile`) recorded in one compute
    /// pass, each writing its own output buffer (`apart`: no product waits for the one before,
    /// as independent work may run) or all the same one (each waits, as a chain of ops does).
    pub fn time_products_apart(
        &self,
        m: &GpuMatrix,
        n: usize,
        tile: Tile,
        apart: bool,
    ) -> Result<f64, GpuError> {
        let xs: Vec<f32> = (0..m.in_dim.next_multiple_of(4))
            .map(|i| (i % 7) as f32 / 8.0)
            .collect();
        let x = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("activations"),
            contents: &le_bytes(&xs),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let outputs: Vec<wgpu::Buffer> = (0..if apart { n } else { 1 })
            .map(|_| {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("outputs"),
                    size: (m.rows * 4) as u64,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                })
            })
            .collect();
        let dispatches = dispatches(m, 1, tile, (0, 0))?;
        let params = self.params_buffer(&dispatches);
        let binds: Vec<Vec<_>> = outputs
            .iter()
            .map(|y| {
                m.chunks
                    .iter()
                    .map(|c| self.matmul_bind(&c.buffer, &x, y, &params))
                    .collect()
            })
            .collect();
        let run = || -> Result<f64, GpuError> {
            let mut enc = self.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for i in 0..n {
                    self.record_in(&mut pass, m.format, tile, &dispatches, &binds[i % binds.len()], 0);
                }
            }
            let t = std::time::Instant::now();
            self.queue.submit([enc.finish()]);
            self.wait("timed products")?;
            Ok(t.elapsed().as_secs_f64())
        };
        run()?;
        Ok(run()? / n as f64)
    }

    /// The product pipeline of `format` and `tile`, made at its first use; `grouped`: the form
    /// that reads each workgroup's expert from a table of items.
    pub(crate) fn matmul_pipeline(
        &self,
        format: WeightFormat,
        tile: Tile,
        grouped: bool,
    ) -> &wgpu::ComputePipeline {
        let i = format.index() * Tile::ALL.len() + tile.index();
        let (cell, layout) = match grouped {
            false => (&self.matmul[i], &self.matmul_pipeline_layout),
            true => (&self.grouped[i], &self.grouped_pipeline_layout),
        };
        cell.get_or_init(|| {
            let label = format!(
                "matmul {format:?} {tile}{}",
                if grouped { " grouped" } else { "" }
            );
            let source = crate::shader::matmul_source(format, tile, grouped);
            let module = crate::module(&self.device, &label, &source);
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&label),
                    layout: Some(layout),
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: Default::default(),
                    cache: None,
                })
        })
    }

    fn matmul_bind(
        &self,
        w: &wgpu::Buffer,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        params: &wgpu::Buffer,
    ) -> wgpu::BindGroup {
        // Kept buffers may have grown past one binding for a group: bind what one may hold.
        let most = self.binding_limit / 16 * 16;
        self.matmul_bind_at(
            w,
            (x, (0, x.size().min(most))),
            (y, (0, y.size().min(most))),
            params,
        )
    }

    /// A bind group whose activations and outputs are the ranges (offset, bytes) of their buffers.
    pub(crate) fn matmul_bind_at(
        &self,
        w: &wgpu::Buffer,
        (x, (x0, xn)): (&wgpu::Buffer, (u64, u64)),
        (y, (y0, yn)): (&wgpu::Buffer, (u64, u64)),
        params: &wgpu::Buffer,
    ) -> wgpu::BindGroup {
        let range = |buffer, offset, size| {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset,
                size: wgpu::BufferSize::new(size),
            })
        };
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.matmul_layout,
            entries: &[
                entry(0, w),
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: range(x, x0, xn),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: range(y, y0, yn),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: params,
                        offset: 0,
                        size: wgpu::BufferSize::new(PARAMS_BYTES),
                    }),
                },
            ],
        })
    }

    /// The bind group of a grouped product: the slab `w`, then activations, outputs,
    /// parameters and items, each bound whole (within one binding's bytes).
    pub(crate) fn grouped_bind(
        &self,
        w: &wgpu::Buffer,
        [x, y, params, items]: [&wgpu::Buffer; 4],
    ) -> wgpu::BindGroup {
        let most = self.binding_limit / 16 * 16;
        fn range(buffer: &wgpu::Buffer, size: u64) -> wgpu::BindingResource<'_> {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset: 0,
                size: wgpu::BufferSize::new(size),
            })
        }
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.grouped_layout,
            entries: &[
                entry(0, w),
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: range(x, x.size().min(most)),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: range(y, y.size().min(most)),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: range(params, PARAMS_BYTES),
                },
                wgpu::BindGroupEntry {
                    binding: 4,
                    resource: range(items, items.size().min(most)),
                },
            ],
        })
    }

    /// Records one product's dispatches (chunk i with `binds[i]`, its parameters at offset
    /// (slot0 + i) * PARAMS_STRIDE of the uniform buffer) into one compute pass.
    pub(crate) fn record_at(
        &self,
        enc: &mut wgpu::CommandEncoder,
        format: WeightFormat,
        tile: Tile,
        ds: &[Dispatch],
        binds: &[wgpu::BindGroup],
        slot0: u64,
    ) {
        let mut pass = enc.begin_compute_pass(&Default::default());
        self.record_in(&mut pass, format, tile, ds, binds, slot0);
    }

    /// [`Gpu::record_at`] into an open pass.
    pub(crate) fn record_in(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        format: WeightFormat,
        tile: Tile,
        ds: &[Dispatch],
        binds: &[wgpu::BindGroup],
        slot0: u64,
    ) {
        pass.set_pipeline(self.matmul_pipeline(format, tile, false));
        for (i, (d, bind)) in ds.iter().zip(binds).enumerate() {
            pass.set_bind_group(0, bind, &[((slot0 + i as u64) * PARAMS_STRIDE) as u32]);
            pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
        }
    }

    /// Submits `enc` with a copy of `src` into `staging` (mappable, at least `len` floats) and
    /// returns its `len` floats.
    pub(crate) fn read_back(
        &self,
        mut enc: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        staging: &wgpu::Buffer,
        len: usize,
    ) -> Result<Vec<f32>, GpuError> {
        enc.copy_buffer_to_buffer(src, 0, staging, 0, (len * 4) as u64);
        self.read_back_copied(enc, staging, len)
    }

    /// Submits `enc`, which copies `len` floats into `staging` (mappable), and returns them.
    pub(crate) fn read_back_copied(
        &self,
        enc: wgpu::CommandEncoder,
        staging: &wgpu::Buffer,
        len: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let bytes = (len.max(1) * 4) as u64;
        // The host's own share of a submission (finishing and submitting the commands), apart
        // from the GPU's run, for the profile.
        let t = strata_kernels::profile::enabled().then(std::time::Instant::now);
        self.queue.submit([enc.finish()]);
        if let Some(t) = t {
            strata_kernels::profile::record("GPU: finish and submit (host)", 1, t.elapsed());
        }
        let slice = staging.slice(..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        let read = || -> Result<Vec<f32>, GpuError> {
            self.wait("product")?;
            let fail = |reason: String| GpuError::Run {
                what: "reading results back".into(),
                reason,
            };
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(fail(e.to_string())),
                Err(_) => return Err(fail("the mapping never completed".into())),
            }
            let data = slice.get_mapped_range().map_err(|e| fail(e.to_string()))?;
            Ok(data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        };
        let out = read();
        // Mapped or not (a failed wait), the buffer leaves unmapped: it goes back to a pool, and
        // a submission that names a mapped buffer fails.
        staging.unmap();
        out
    }
}

/// Each chunk's parameters and workgroups for a product of `tokens` through `tile`, its
/// activations from value `at.0` of `x` and its outputs from value `at.1` of `y`.
pub(crate) fn dispatches(
    m: &GpuMatrix,
    tokens: usize,
    tile: Tile,
    at: (usize, usize),
) -> Result<Vec<Dispatch>, GpuError> {
    u32_of(tokens * m.rows, "outputs of one product")?;
    let groups_z = tokens.div_ceil(tile.tokens as usize);
    if groups_z > MAX_GROUPS {
        return Err(GpuError::Shape(format!("{tokens} tokens in one product")));
    }
    m.chunks
        .iter()
        .map(|c| {
            let (grid_x, grid_y) = row_grid(c.rows, tile);
            let (elem0, w0) = chunk_base(m, c)?;
            let p = MatmulParams {
                rows: c.rows as u32,
                in_dim: m.in_dim as u32,
                tokens: u32_of(tokens, "token count")?,
                out_stride: m.rows as u32,
                row0: c.row0 as u32,
                grid_x: grid_x as u32,
                elem0,
                s_off: c.s_off,
                scales: m.scales,
                x0: u32_of(at.0, "first activation")?,
                y0: u32_of(at.1, "first output")?,
                w0,
                items0: 0,
            };
            Ok(Dispatch {
                params: p.bytes(),
                groups: [grid_x as u32, grid_y as u32, groups_z as u32],
            })
        })
        .collect()
}

/// Workgroups along x and y for `rows` rows through `tile` (row block = x + y * grid_x).
pub(crate) fn row_grid(rows: usize, tile: Tile) -> (usize, usize) {
    let blocks = rows.div_ceil(tile.rows as usize);
    let grid_x = blocks.clamp(1, MAX_GROUPS);
    (grid_x, blocks.div_ceil(grid_x))
}

/// Where chunk `c` of `m` starts in its buffer, as the shader takes it: (the float formats'
/// first element, the packed formats' first byte).
pub(crate) fn chunk_base(m: &GpuMatrix, c: &Chunk) -> Result<(u32, u32), GpuError> {
    let bytes = m.format.elem_bytes() as u64;
    if !m.format.packed() {
        Ok((
            u32_of((u64::from(c.elem0) + c.base / bytes) as usize, "first weight")?,
            0,
        ))
    } else {
        Ok((c.elem0, u32_of(c.base as usize, "first weight byte")?))
    }
}

/// Makes `slot`'s buffer anew (a power of two of bytes) when it is missing or smaller than
/// `bytes`; says whether it did.
fn ensure(
    device: &wgpu::Device,
    slot: &mut Option<wgpu::Buffer>,
    bytes: u64,
    usage: wgpu::BufferUsages,
    label: &str,
) -> bool {
    if slot.as_ref().is_some_and(|b| b.size() >= bytes) {
        return false;
    }
    *slot = Some(device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes.max(16).next_power_of_two(),
        usage,
        mapped_at_creation: false,
    }));
    true
}
