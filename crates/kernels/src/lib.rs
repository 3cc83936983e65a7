//! The only crate with `unsafe` and SIMD. Weight storage formats ([`Linear`] and its
//! [`WeightData`]) and the kernels that compute directly on them: every op has a scalar reference
//! twin in the same module, and SIMD variants are chosen at run time, once ([`isa::isa`]).
//!
//! Matrix products are batch invariant: each output element is one dot product computed by the
//! same kernel whatever the number of tokens, so a sequence's logits never depend on its batch.

// Kernels index several arrays in lockstep; index loops read better than zipped iterators here.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod dot;
pub mod fp8;
pub mod int4;
pub mod int8;
pub mod intdot;
pub mod isa;
mod linear;
pub mod membw;
pub mod mxfp4;
pub mod storage;

pub use linear::{u16_vec_from_bytes, weight_bytes_touched, Linear, Prepared, WeightData};
pub use storage::{Owner, Pod, Storage};

/// Number of threads the kernels may use (rayon's global pool, sized to the machine).
pub fn threads() -> usize {
    rayon::current_num_threads()
}
