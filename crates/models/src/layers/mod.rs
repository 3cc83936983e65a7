//! Building blocks shared by the families: norms, rotary embeddings, attention (GQA, MLA and the
//! KDA linear attention), block attention residuals, dense MLP and the MoE layer (routing rules +
//! expert dispatch through the store).

pub mod attention;
pub mod attn_res;
pub mod kda;
pub mod math;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod rope;
