//! GPU time by kind of op for the profile (`STRATA_PROFILE=1`, on adapters that write timestamps
//! inside compute passes): each op a submission runs in a pass sits between two timestamps, read
//! back with the submission's results, and its time is added to the row "GPU time: <kind>"
//! (`product <format> <tile>`, or a layer kernel's name). Without the feature nothing is timed.

use std::time::Duration;

use crate::Gpu;

/// Timestamps for up to `count / 2` ops of one submission.
pub(crate) struct Stamps {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    count: u32,
}

/// The query slots a set holds at most.
const MAX_STAMPS: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// The features that timing needs.
pub(crate) fn features() -> wgpu::Features {
    wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
}

impl Gpu {
    /// Slots for `ops` ops when the profile is on and the adapter can time them; the ops past
    /// what one query set holds go untimed.
    pub(crate) fn stamps(&self, ops: usize) -> Option<Stamps> {
        if !self.timestamps || ops == 0 || !strata_kernels::profile::enabled() {
            return None;
        }
        let count = u32::try_from(2 * ops).unwrap_or(MAX_STAMPS).min(MAX_STAMPS);
        let set = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("op times"),
            ty: wgpu::QueryType::Timestamp,
            count,
        });
        let resolved = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("op times"),
            size: u64::from(count) * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Some(Stamps { set, resolved, count })
    }
}

impl Stamps {
    /// Writes op `k`'s first (`end` false) or second timestamp, when it has slots.
    pub(crate) fn write(&self, pass: &mut wgpu::ComputePass<'_>, k: usize, end: bool) {
        let slot = 2 * k + usize::from(end);
        if slot < self.count as usize {
            pass.write_timestamp(&self.set, slot as u32);
        }
    }

    /// Floats of read-back room the timestamps take.
    pub(crate) fn floats(&self) -> usize {
        2 * self.count as usize
    }

    /// Resolves every timestamp and copies them into `staging` from byte `at`.
    pub(crate) fn copy(&self, enc: &mut wgpu::CommandEncoder, staging: &wgpu::Buffer, at: u64) {
        enc.resolve_query_set(&self.set, 0..self.count, &self.resolved, 0);
        enc.copy_buffer_to_buffer(&self.resolved, 0, staging, at, u64::from(self.count) * 8);
    }

    /// Adds each timed op's span to its row: `labels[k]` for op k, `read` the floats
    /// [`Stamps::copy`] wrote, `period` nanoseconds a tick.
    pub(crate) fn record(&self, labels: &[String], read: &[f32], period: f32) {
        let tick = |i: usize| {
            let (lo, hi) = (read[2 * i].to_bits(), read[2 * i + 1].to_bits());
            u64::from(lo) | (u64::from(hi) << 32)
        };
        for (k, label) in labels.iter().enumerate().take(self.count as usize / 2) {
            let ticks = tick(2 * k + 1).saturating_sub(tick(2 * k));
            let ns = (ticks as f64 * f64::from(period)) as u64;
            strata_kernels::profile::record(label, 1, Duration::from_nanos(ns));
        }
    }
}
