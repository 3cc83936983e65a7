//! `gpu_decoder.rs`'s checks with the routed experts on the CPU: the GPU decoder reads each MoE
//! layer's normed rows back and adds the experts' sum it gets.

const EXPERTS_ON_GPU: bool = false;
include!("gpu_decoder/checks.rs");
