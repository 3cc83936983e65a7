//! Named intermediates of a forward pass, recorded on request so runs can be diffed against the
//! reference (hidden states after each layer, routing decisions of each MoE layer).

#[derive(Clone, Debug, Default)]
pub struct RoutingRecord {
    pub layer: usize,
    /// Per token: selected expert ids, sorted ascending.
    pub experts: Vec<Vec<usize>>,
    /// Per token: final weights in the order of `experts` (scaling included).
    pub weights: Vec<Vec<f32>>,
    /// Per token: router logits over all experts.
    pub router_logits: Vec<Vec<f32>>,
}

#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// (name, (T, D) values): `embed`, `layer{i}`, `final_norm`.
    pub hidden: Vec<(String, Vec<f32>)>,
    pub routing: Vec<RoutingRecord>,
}

impl Trace {
    pub fn hidden(&self, name: &str) -> Option<&[f32]> {
        self.hidden
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}
