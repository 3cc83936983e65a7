//! Per-sequence decoding state. Attention layers keep one row per cached position (GQA: keys and
//! values; MLA: the absorbed key `[c_kv | k_rope]` only, its value is the `c_kv` prefix). Linear
//! attention layers (KDA) keep a fixed-size recurrent state and the last inputs of their short
//! convolution instead, whatever the length.

#[derive(Clone, Debug, Default)]
pub struct LayerCache {
    pub k_dim: usize,
    pub v_dim: usize,
    /// (P, k_dim)
    pub k: Vec<f32>,
    /// (P, v_dim)
    pub v: Vec<f32>,
    /// Recurrent state of a linear-attention layer (KDA: (heads, Dk, Dv)), zero when fresh.
    pub recurrent: Vec<f32>,
    /// Short-convolution history of a linear-attention layer (KDA: (K-1, 3C), oldest first).
    pub conv: Vec<f32>,
    /// A copy of `k` and `v` in GPU memory (the GPU decoder's), kept in step with them.
    pub gpu: GpuKv,
}

/// Cached keys and values in GPU memory: room for `cap` positions, the first `synced` of them
/// equal to the CPU's rows.
pub struct KvMirror {
    pub k: strata_gpu::GpuTensor,
    pub v: strata_gpu::GpuTensor,
    pub cap: usize,
    pub synced: usize,
}

/// A layer cache's GPU copy. A copy shared by two caches (a cloned one) or out of step with the
/// CPU's rows is made anew from them before use; cutting the rows drops it.
#[derive(Clone, Default)]
pub struct GpuKv(pub(crate) Option<std::sync::Arc<KvMirror>>);

impl std::fmt::Debug for GpuKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(m) => write!(f, "GpuKv({} of {} positions)", m.synced, m.cap),
            None => f.write_str("GpuKv(none)"),
        }
    }
}

/// The state one layer keeps per sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerState {
    /// Rows of `k_dim` + `v_dim` values per cached position.
    Kv { k_dim: usize, v_dim: usize },
    /// A fixed `recurrent` + `conv` number of values, whatever the length.
    Recurrent { recurrent: usize, conv: usize },
}

impl LayerState {
    /// Bytes (f32) per position and per sequence.
    pub fn bytes(&self) -> (usize, usize) {
        match *self {
            LayerState::Kv { k_dim, v_dim } => ((k_dim + v_dim) * 4, 0),
            LayerState::Recurrent { recurrent, conv } => (0, (recurrent + conv) * 4),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub layers: Vec<LayerCache>,
    /// Positions already processed.
    pub len: usize,
}

impl KvCache {
    pub fn new(layers: impl IntoIterator<Item = LayerState>) -> KvCache {
        KvCache {
            layers: layers
                .into_iter()
                .map(|s| match s {
                    LayerState::Kv { k_dim, v_dim } => LayerCache {
                        k_dim,
                        v_dim,
                        ..Default::default()
                    },
                    LayerState::Recurrent { recurrent, conv } => LayerCache {
                        recurrent: vec![0.0; recurrent],
                        conv: vec![0.0; conv],
                        ..Default::default()
                    },
                })
                .collect(),
            len: 0,
        }
    }

    /// Bytes held (what `--mem` will count).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.k.len() + l.v.len() + l.recurrent.len() + l.conv.len()) * 4)
            .sum()
    }

    /// A copy of the first `n` positions (all of them for a recurrent state, which cannot be
    /// cut: None when `n` is not its length), copying no more than those.
    pub fn prefix(&self, n: usize) -> Option<KvCache> {
        if n > self.len || (self.has_recurrent() && n != self.len) {
            return None;
        }
        Some(self.copy_prefix(n))
    }

    /// A copy of the first `n` positions whose recurrent state is `saved`, what
    /// [`KvCache::save_recurrent`] gave when this cache held those `n` positions (a state kept
    /// as it was fed); None when `n` is beyond it or `saved` is not such a state's size.
    pub fn prefix_with(&self, n: usize, saved: &[f32]) -> Option<KvCache> {
        let size: usize = self.layers.iter().map(|l| l.recurrent.len() + l.conv.len()).sum();
        if n > self.len || saved.len() != size {
            return None;
        }
        let mut c = self.copy_prefix(n);
        c.restore_recurrent(saved);
        Some(c)
    }

    fn copy_prefix(&self, n: usize) -> KvCache {
        let layers = (self.layers.iter())
            .map(|l| LayerCache {
                k_dim: l.k_dim,
                v_dim: l.v_dim,
                k: l.k[..(n * l.k_dim).min(l.k.len())].to_vec(),
                v: l.v[..(n * l.v_dim).min(l.v.len())].to_vec(),
                recurrent: l.recurrent.clone(),
                conv: l.conv.clone(),
                gpu: GpuKv::default(),
            })
            .collect();
        KvCache { layers, len: n }
    }

    /// Gives back memory reserved beyond the positions held.
    pub fn shrink_to_fit(&mut self) {
        for l in &mut self.layers {
            l.k.shrink_to_fit();
            l.v.shrink_to_fit();
        }
    }

    /// Whether some layer keeps a recurrent state (which [`KvCache::truncate`] cannot rewind).
    pub fn has_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| !l.recurrent.is_empty() || !l.conv.is_empty())
    }

    /// Sets aside room for `positions` positions in all, exactly (no doubling past it), so what
    /// the sequence will hold is allocated once and counted up front.
    pub fn reserve(&mut self, positions: usize) {
        for l in &mut self.layers {
            let more = |v: &Vec<f32>, dim: usize| (positions * dim).saturating_sub(v.len());
            let (k_more, v_more) = (more(&l.k, l.k_dim), more(&l.v, l.v_dim));
            l.k.reserve_exact(k_more);
            l.v.reserve_exact(v_more);
        }
    }

    /// Copies every recurrent and convolution state into `out` (reusing its allocation).
    pub fn save_recurrent(&self, out: &mut Vec<f32>) {
        out.clear();
        for l in &self.layers {
            out.extend_from_slice(&l.recurrent);
            out.extend_from_slice(&l.conv);
        }
    }

    /// Puts back what [`KvCache::save_recurrent`] copied.
    pub fn restore_recurrent(&mut self, saved: &[f32]) {
        let mut at = 0;
        for l in &mut self.layers {
            for part in [&mut l.recurrent, &mut l.conv] {
                let n = part.len();
                part.copy_from_slice(&saved[at..at + n]);
                at += n;
            }
        }
        debug_assert_eq!(at, saved.len());
    }

    /// Drops every position at and after `len` (to rewind a sequence). A recurrent state cannot
    /// be rewound except to empty: returns false (and changes nothing) when asked to.
    pub fn truncate(&mut self, len: usize) -> bool {
        let recurrent = self.layers.iter().any(|l| !l.recurrent.is_empty());
        if recurrent && len > 0 && len < self.len {
            return false;
        }
        for l in &mut self.layers {
            l.k.truncate(len * l.k_dim);
            l.v.truncate(len * l.v_dim);
            l.gpu = GpuKv::default();
            if len == 0 {
                l.recurrent.iter_mut().for_each(|v| *v = 0.0);
                l.conv.iter_mut().for_each(|v| *v = 0.0);
            }
        }
        self.len = self.len.min(len);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_cache_does_not_reallocate_and_recurrent_state_round_trips() {
        let mut c = KvCache::new([
            LayerState::Kv { k_dim: 3, v_dim: 2 },
            LayerState::Recurrent {
                recurrent: 4,
                conv: 2,
            },
        ]);
        c.reserve(10);
        assert_eq!(c.layers[0].k.capacity(), 30);
        assert_eq!(c.layers[0].v.capacity(), 20);
        let k_ptr = c.layers[0].k.as_ptr();
        c.layers[0].k.extend_from_slice(&[1.0; 30]);
        assert_eq!(c.layers[0].k.as_ptr(), k_ptr, "reserved room reallocated");

        assert!(c.has_recurrent());
        c.layers[1].recurrent.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let mut saved = Vec::new();
        c.save_recurrent(&mut saved);
        c.layers[1].recurrent.iter_mut().for_each(|v| *v = 9.0);
        c.layers[1].conv.iter_mut().for_each(|v| *v = 9.0);
        c.restore_recurrent(&saved);
        assert_eq!(c.layers[1].recurrent, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(c.layers[1].conv, vec![0.0, 0.0]);
    }
}
