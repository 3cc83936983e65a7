//! A MoE layer whose every routed expert the GPU keeps in slabs ([`ResidentExperts`]): its
//! products are laid out on the GPU from the routing table the GPU made, so the layer needs no
//! round trip to the CPU. One kernel reads each expert's rows from the table and writes, for
//! every slab, the items of its grouped product (an expert, its rows, a block of tokens) and the
//! dispatch's size ([`Recorder::resident_items`]); each product then runs as one indirect
//! dispatch per slab ([`Recorder::resident_product`]). Each output keeps the bits
//! [`Recorder::matmul_experts`] gives it: the items differ only in the order the workgroups
//! take them.

use std::sync::Arc;

use crate::matrix::{u32_of, GpuMatrix, MatmulParams, ScaleLayout, Tile, WeightFormat, MAX_GROUPS};
use crate::ops::{need, GpuTensor, Recorder};
use crate::ops_moe::Routing;
use crate::ops_state::Kernel;
use crate::product::{chunk_base, row_grid, Dispatch};
use crate::slab::Slot;
use crate::{Gpu, GpuError};

/// The most slabs one of a layer's three products may span (`expert_items`' counters).
pub const MAX_RESIDENT_SLABS: usize = 64;
/// The most routed rows (tokens x picks) of a step laid out on the GPU: one slab's items are
/// one dispatch's workgroups along z.
pub const MAX_ROUTED_ROWS: usize = MAX_GROUPS;

/// One of the three products (gate, up, down) of every expert of a layer.
struct Product {
    format: WeightFormat,
    rows: usize,
    in_dim: usize,
    scales: ScaleLayout,
    /// The slabs its matrices lie in, with their scales' offset.
    slabs: Vec<(wgpu::Buffer, u32)>,
}

/// Where every routed expert of one layer lies in the slabs: its gate, up and down matrices'
/// slab and start, uploaded once.
pub struct ResidentExperts {
    products: [Product; 3],
    /// Per expert, per product: (slab index, start as the shader's `wb` takes it).
    table: GpuTensor,
    experts: usize,
    slots: Vec<Arc<Slot>>,
}

impl ResidentExperts {
    /// The experts' `[gate, up, down]` matrices, expert i's at index i of each; None where one
    /// lies outside the slabs, their shapes, formats or scales differ within a product, or a
    /// product spans more than [`MAX_RESIDENT_SLABS`] slabs.
    pub fn new(gpu: &Gpu, mats: [&[&GpuMatrix]; 3]) -> Result<Option<ResidentExperts>, GpuError> {
        let experts = mats[0].len();
        if experts == 0 || mats.iter().any(|m| m.len() != experts) {
            return Ok(None);
        }
        let mut table = vec![0u32; experts * 6];
        let mut slots = Vec::new();
        let mut products = Vec::with_capacity(3);
        for (p, ms) in mats.iter().enumerate() {
            let first = ms[0];
            let mut slabs: Vec<(wgpu::Buffer, u32)> = Vec::new();
            for (e, m) in ms.iter().enumerate() {
                let same = m.format == first.format
                    && m.rows == first.rows
                    && m.in_dim == first.in_dim
                    && m.scales == first.scales;
                let Some(slab) = m.slab().filter(|_| same) else {
                    return Ok(None);
                };
                let s_off = m.chunks[0].s_off;
                let g = match slabs.iter().position(|(b, s)| b == slab && *s == s_off) {
                    Some(g) => g,
                    None => {
                        slabs.push((slab.clone(), s_off));
                        slabs.len() - 1
                    }
                };
                if slabs.len() > MAX_RESIDENT_SLABS {
                    return Ok(None);
                }
                let (elem0, w0) = chunk_base(m, &m.chunks[0])?;
                table[6 * e + 2 * p] = g as u32;
                table[6 * e + 2 * p + 1] = if m.format.packed() { w0 } else { elem0 };
                slots.extend(m.chunks.iter().filter_map(|c| c.slot.clone()));
            }
            products.push(Product {
                format: first.format,
                rows: first.rows,
                in_dim: first.in_dim,
                scales: first.scales,
                slabs,
            });
        }
        let values: Vec<f32> = table.into_iter().map(f32::from_bits).collect();
        let products: [Product; 3] = match products.try_into() {
            Ok(p) => p,
            Err(_) => unreachable!("three products"),
        };
        Ok(Some(ResidentExperts {
            products,
            table: gpu.upload_tensor(&values)?,
            experts,
            slots,
        }))
    }

    /// Experts of the layer.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// The slabs each of the three products spans (a dispatch each).
    pub fn slabs(&self) -> [usize; 3] {
        self.products.each_ref().map(|p| p.slabs.len())
    }
}

/// The items and dispatch sizes of one step's three products ([`Recorder::resident_items`]).
pub struct ResidentItems {
    /// [each slab's dispatch size (3 words), the three products' slabs in turn, padded to a
    /// whole vec4] [each slab's items (vec4 each): `cap` a slab].
    buf: GpuTensor,
    cap: usize,
    tiles: [Tile; 3],
    /// Each product's first slab among all.
    first: [usize; 3],
    /// Vec4s before the first item.
    head: usize,
    rows: usize,
}

impl Recorder<'_> {
    /// The items of the three products of the experts `re` for the rows `routing` packs (each
    /// token's `k` picks), laid out on the GPU from its table.
    pub fn resident_items(
        &mut self,
        re: &ResidentExperts,
        routing: &Routing,
        k: usize,
    ) -> Result<ResidentItems, GpuError> {
        let tokens = routing.tokens();
        let rows = tokens * k;
        if rows == 0 || rows > MAX_ROUTED_ROWS {
            return Err(GpuError::Shape(format!(
                "{rows} routed rows for a layer laid out on the GPU (1 to {MAX_ROUTED_ROWS})"
            )));
        }
        let starts = Routing::table_len(tokens, k, re.experts) - re.experts - 1;
        need(routing.table(), starts + re.experts + 1, "routing table")?;
        let counts: Vec<usize> = re.products.iter().map(|p| p.slabs.len()).collect();
        let all: usize = counts.iter().sum();
        let head = (3 * all).div_ceil(4);
        let buf = self.gpu().tensor(4 * (head + all * rows))?;
        let tiles = re.products.each_ref().map(|p| {
            self.gpu()
                .forced_tile
                .unwrap_or(Tile::for_product(tokens.min(2), p.rows, p.in_dim))
        });
        let grids: Vec<(usize, usize)> = re
            .products
            .iter()
            .zip(tiles)
            .map(|(p, t)| row_grid(p.rows, t))
            .collect();
        let mut prm = [0u32; 16];
        prm[0] = u32_of(re.experts, "experts")?;
        prm[1] = rows as u32;
        prm[2] = u32_of(starts, "routing table")?;
        for i in 0..3 {
            prm[3 + i] = tiles[i].tokens;
            prm[6 + i] = counts[i] as u32;
            prm[10 + 2 * i] = grids[i].0 as u32;
            prm[11 + 2 * i] = grids[i].1 as u32;
        }
        prm[9] = head as u32;
        // The slabs' slots, held until the step's products have run.
        self.hold_slot_list(&re.slots);
        self.kernel(
            Kernel::ExpertItems,
            [Some(&buf), Some(routing.table()), Some(&re.table), None],
            prm,
            [1, 1, 1],
        );
        Ok(ResidentItems {
            buf,
            cap: rows,
            tiles,
            first: [0, counts[0], counts[0] + counts[1]],
            head,
            rows,
        })
    }

    /// Product `p` (0 gate, 1 up, 2 down) of every routed row: row j of `y` = the product of
    /// its expert applied to row j of `x` (rows packed as the routing table lays them out), as
    /// one dispatch a slab whose size the GPU wrote ([`Recorder::resident_items`]).
    pub fn resident_product(
        &mut self,
        re: &ResidentExperts,
        items: &ResidentItems,
        p: usize,
        x: &GpuTensor,
        y: &GpuTensor,
    ) -> Result<(), GpuError> {
        let m = re
            .products
            .get(p)
            .ok_or_else(|| GpuError::Shape(format!("product {p} of an expert's three")))?;
        need(x, items.rows * m.in_dim, "experts' activations")?;
        need(y, items.rows * m.rows, "experts' outputs")?;
        let tile = items.tiles[p];
        let (grid_x, _) = row_grid(m.rows, tile);
        for (g, (slab, s_off)) in m.slabs.iter().enumerate() {
            let at = items.first[p] + g;
            let params = MatmulParams {
                rows: u32_of(m.rows, "rows")?,
                in_dim: u32_of(m.in_dim, "inputs")?,
                tokens: 0,
                out_stride: u32_of(m.rows, "rows")?,
                row0: 0,
                grid_x: grid_x as u32,
                elem0: 0,
                s_off: *s_off,
                scales: m.scales,
                x0: 0,
                y0: 0,
                w0: 0,
                items0: u32_of(items.head + at * items.cap, "first item")?,
            };
            let d = Dispatch {
                params: params.bytes(),
                groups: [0; 3],
            };
            self.push_grouped(
                (m.format, tile),
                (slab, d),
                (&items.buf, Some((at * 12) as u64)),
                x,
                y,
            );
        }
        Ok(())
    }
}
