//! Building blocks shared by the families: norms, rotary embeddings, attention (GQA and MLA),
//! dense MLP and the MoE layer (routing rules + expert dispatch through the store).

pub mod attention;
pub mod math;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod rope;
