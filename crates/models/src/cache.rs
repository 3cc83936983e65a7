//! Per-sequence decoding state: one row per cached position per layer. GQA layers store keys and
//! values; MLA layers store the absorbed key `[c_kv | k_rope]` only (its value is the `c_kv` prefix).

#[derive(Clone, Debug, Default)]
pub struct LayerCache {
    pub k_dim: usize,
    pub v_dim: usize,
    /// (P, k_dim)
    pub k: Vec<f32>,
    /// (P, v_dim)
    pub v: Vec<f32>,
}

#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub layers: Vec<LayerCache>,
    /// Positions already processed.
    pub len: usize,
}

impl KvCache {
    pub fn new(dims: impl IntoIterator<Item = (usize, usize)>) -> KvCache {
        KvCache {
            layers: dims
                .into_iter()
                .map(|(k_dim, v_dim)| LayerCache {
                    k_dim,
                    v_dim,
                    ..Default::default()
                })
                .collect(),
            len: 0,
        }
    }

    /// Bytes held (what `--mem` will count).
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| (l.k.len() + l.v.len()) * 4).sum()
    }

    /// Drops every position at and after `len` (to rewind a sequence).
    pub fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            l.k.truncate(len * l.k_dim);
            l.v.truncate(len * l.v_dim);
        }
        self.len = self.len.min(len);
    }
}
