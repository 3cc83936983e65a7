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

/// `f(i, chunk i)` for the `len`-wide chunks of `out`, on the kernels' threads (models own no
/// threads: work whose parts are independent, such as attention heads, is split here). Each
/// chunk's result is whatever `f` computes for it alone, so the split never changes a value.
pub fn for_each_chunk<T: Send>(out: &mut [T], len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    use rayon::prelude::*;
    if len == 0 {
        return;
    }
    if threads() == 1 || out.len() <= len {
        out.chunks_mut(len).enumerate().for_each(|(i, c)| f(i, c));
        return;
    }
    out.par_chunks_mut(len).enumerate().for_each(|(i, c)| f(i, c));
}

/// [`for_each_chunk`] over two slices in step: `f(i, chunk i of a, chunk i of b)` (e.g. each
/// recurrent head's state and its output).
pub fn for_each_chunk_pair<T: Send, U: Send>(
    a: &mut [T],
    a_len: usize,
    b: &mut [U],
    b_len: usize,
    f: impl Fn(usize, &mut [T], &mut [U]) + Sync,
) {
    use rayon::prelude::*;
    if a_len == 0 || b_len == 0 {
        return;
    }
    if threads() == 1 || a.len() <= a_len {
        a.chunks_mut(a_len)
            .zip(b.chunks_mut(b_len))
            .enumerate()
            .for_each(|(i, (x, y))| f(i, x, y));
        return;
    }
    a.par_chunks_mut(a_len)
        .zip(b.par_chunks_mut(b_len))
        .enumerate()
        .for_each(|(i, (x, y))| f(i, x, y));
}
