//! A MoE layer's routing on the GPU: each token's experts and weights from its router logits
//! ([`Recorder::route`], the CPU's `Router::route` rules), and the layer's routing table from
//! them ([`Recorder::route_table`], laid out as [`Recorder::routing`] lays the CPU's), so a layer
//! whose experts the GPU holds needs no round trip to pick them.

use crate::ops::{grid, need, GpuTensor, Recorder};
use crate::ops_moe::Routing;
use crate::ops_state::Kernel;
use crate::GpuError;

/// The most experts a router may have on the GPU (`MAX_EXPERTS` in the shader).
pub const MAX_ROUTED_EXPERTS: usize = 1024;
/// The most experts a token may pick on the GPU (`MAX_PICKS`).
pub const MAX_PICKS: usize = 32;

/// A router's rule (the CPU's `RoutingRule`).
#[derive(Clone, Copy)]
pub enum RouteRule<'a> {
    /// Softmax over every expert, the top k, their probabilities (`norm`: over their sum).
    Softmax { norm: bool },
    /// Sigmoid scores; selection on score + `bias` within the `topk_group` best of `groups`
    /// groups (a group's score: its two best biased scores); the unbiased scores as weights
    /// (`norm`: over their sum + 1e-20), times `scale`.
    SigmoidGrouped {
        bias: &'a GpuTensor,
        groups: usize,
        topk_group: usize,
        norm: bool,
        scale: f32,
    },
}

impl Recorder<'_> {
    /// `routes` (tokens x k x 2: expert id bits, weight; each token's ascending by expert) of
    /// the `tokens` rows of router `logits` (rows of `experts`).
    pub fn route(
        &mut self,
        logits: &GpuTensor,
        (tokens, experts, k): (usize, usize, usize),
        rule: RouteRule<'_>,
        routes: &GpuTensor,
    ) -> Result<(), GpuError> {
        need(logits, tokens * experts, "router logits")?;
        need(routes, tokens * k * 2, "routes")?;
        if experts > MAX_ROUTED_EXPERTS || k == 0 || k > MAX_PICKS.min(experts) {
            return Err(GpuError::Shape(format!(
                "a router picking {k} of {experts} experts (the GPU routes at most {MAX_PICKS} of {MAX_ROUTED_EXPERTS})"
            )));
        }
        if tokens == 0 {
            return Ok(());
        }
        let (groups, line) = grid(tokens);
        let mut p = [0u32; 16];
        p[..3].copy_from_slice(&[tokens as u32, experts as u32, k as u32]);
        p[15] = line;
        let bias = match rule {
            RouteRule::Softmax { norm } => {
                p[4] = u32::from(norm);
                None
            }
            RouteRule::SigmoidGrouped {
                bias,
                groups: g,
                topk_group,
                norm,
                scale,
            } => {
                need(bias, experts, "router correction bias")?;
                let g = g.max(1);
                if g > 128
                    || !experts.is_multiple_of(g)
                    || topk_group == 0
                    || topk_group > g
                    || k > topk_group * (experts / g)
                {
                    return Err(GpuError::Shape(format!(
                        "{experts} experts in {g} groups, {topk_group} kept, {k} picked"
                    )));
                }
                p[3] = 1;
                p[4] = u32::from(norm);
                p[5] = scale.to_bits();
                p[6] = g as u32;
                p[7] = topk_group as u32;
                Some(bias)
            }
        };
        self.kernel(Kernel::Route, [Some(routes), Some(logits), bias, None], p, groups);
        Ok(())
    }

    /// The routing table of `routes` ([`Recorder::route`]'s, `tokens` x `k`) over `experts`
    /// experts, in `table` ([`Routing::table_len`] values); `starts`: each expert's first packed
    /// row, where the CPU knows them (read back), for the products it records itself.
    pub fn route_table(
        &mut self,
        routes: &GpuTensor,
        (tokens, k, experts): (usize, usize, usize),
        table: GpuTensor,
        starts: Vec<usize>,
    ) -> Result<Routing, GpuError> {
        need(routes, tokens * k * 2, "routes")?;
        need(&table, Routing::table_len(tokens, k, experts), "routing table")?;
        if experts > MAX_ROUTED_EXPERTS || k > MAX_PICKS {
            return Err(GpuError::Shape(format!(
                "a table of {k} picks of {experts} experts"
            )));
        }
        let mut p = [0u32; 16];
        p[..3].copy_from_slice(&[tokens as u32, k as u32, experts as u32]);
        if tokens > 0 {
            self.kernel(
                Kernel::RouteTable,
                [Some(&table), Some(routes), None, None],
                p,
                [1, 1, 1],
            );
        }
        Ok(Routing::from_table(table, starts, tokens))
    }
}
