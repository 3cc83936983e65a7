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
            if len == 0 {
                l.recurrent.iter_mut().for_each(|v| *v = 0.0);
                l.conv.iter_mut().for_each(|v| *v = 0.0);
            }
        }
        self.len = self.len.min(len);
        true
    }
}
