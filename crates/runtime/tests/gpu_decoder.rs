//! The GPU decoder (`--device gpu` on grouped-query and latent attention families): a layer's
//! work in one submission over a GPU copy of the KV cache. A prompt in pieces gives the bits of
//! the whole, a batch each sequence's bits alone, a cut or cloned cache the bits of a fresh one,
//! whatever state the GPU copies were left in. Here the routed experts run on the GPU too
//! (`--gpu-experts`); `gpu_decoder_cpu_experts.rs` runs the same checks with them on the CPU.
//! Needs a GPU adapter, as `crates/gpu/tests` say.

const EXPERTS_ON_GPU: bool = true;
include!("gpu_decoder/checks.rs");
