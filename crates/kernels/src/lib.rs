//! The only crate with `unsafe` and SIMD. Weight storage formats ([`Linear`] and its
//! [`WeightData`]) and the kernels that compute directly on them: every op has a scalar reference
//! twin in the same module, and SIMD variants are chosen at run time, once ([`isa::isa`]).
//!
//! Matrix products are batch invariant: each output element is one dot product computed by the
//! same kernel whatever the number of tokens, so a sequence's logits never depend on its batch.

// Kernels index several arrays in lockstep; index loops read better than zipped iterators here.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod attend;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod dot;
pub mod fp8;
pub mod ggml;
pub mod ggml_decode;
#[cfg(all(target_arch = "aarch64", target_endian = "little"))]
pub mod ggml_neon;
#[cfg(target_arch = "x86_64")]
pub mod ggml_x86;
pub mod int4;
pub mod int8;
pub mod intdot;
pub mod isa;
pub mod kquant;
#[cfg(target_arch = "x86_64")]
mod kquant_avx2;
#[cfg(target_arch = "x86_64")]
mod kquant_avx512;
mod linear;
pub mod membw;
pub mod mxfp4;
#[cfg(target_arch = "aarch64")]
pub mod neon;
#[cfg(target_arch = "aarch64")]
pub mod neon_intdot;
pub mod offload;
pub mod profile;
pub mod q8_0;
pub mod storage;
mod weight_data;

pub use linear::{
    count_weight_bytes, u16_vec_from_bytes, weight_bytes_touched, Linear, Prepared, WeightData,
};
pub use storage::{Owner, Pod, Storage};

/// A one-token product's rows two at a time: `out[r..r + 2] = two(r)` for each pair, and
/// `out[r] = one(r)` for an odd last row (the kernels' two-row passes, whose rows get the bits of
/// their one-row kernel either way).
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
pub(crate) fn row_pairs(
    out: &mut [f32],
    mut two: impl FnMut(usize) -> [f32; 2],
    one: impl FnOnce(usize) -> f32,
) {
    let rows = out.len();
    let mut r = 0;
    while r + 2 <= rows {
        out[r..r + 2].copy_from_slice(&two(r));
        r += 2;
    }
    if r < rows {
        out[r] = one(r);
    }
}

/// Number of threads the kernels may use (rayon's global pool, sized by [`init_threads`]).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// Sizes the kernels' thread pool once, before any product runs: `n` threads when given, else
/// `RAYON_NUM_THREADS` when set, else one per physical core (a second hardware thread of a core
/// shares its FMA units and caches, and measured no faster on these kernels). Returns the size
/// in use (also when the pool had been started already).
pub fn init_threads(n: Option<usize>) -> usize {
    let n = n.filter(|&n| n > 0).or_else(|| {
        if std::env::var_os("RAYON_NUM_THREADS").is_some() {
            None
        } else {
            physical_cores()
        }
    });
    let mut builder = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("strata-compute-{i}"));
    if let Some(n) = n {
        builder = builder.num_threads(n);
    }
    let _ = builder.build_global();
    threads()
}

/// Distinct (package, core) pairs among the online CPUs (Linux sysfs), if readable.
pub fn physical_cores() -> Option<usize> {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    let mut cores = std::collections::HashSet::new();
    for range in online.trim().split(',') {
        let (a, b) = match range.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = range.parse::<usize>().ok()?;
                (a, a)
            }
        };
        for cpu in a..=b {
            let topo = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
            let read = |f: &str| {
                std::fs::read_to_string(format!("{topo}/{f}"))
                    .ok()
                    .map(|s| s.trim().to_string())
            };
            cores.insert((read("physical_package_id")?, read("core_id")?));
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

thread_local! {
    static SPARE_F32: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    static SPARE_U16: std::cell::Cell<Vec<u16>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Above this a thread's spare buffer is let go when given back (a long prompt's chunk).
const KEEP_SPARE_MAX: usize = 64 << 20;

/// `len` zeros in this thread's spare buffer `key` (kept from the last give-back): a fresh buffer
/// of a product's size would fault in page by page, and with many threads faulting at once they
/// wait on each other in the kernel. A call nested inside another (a kernel thread running
/// another task meanwhile) gets a fresh one.
fn take_zeroed<T: Copy + Default>(
    key: &'static std::thread::LocalKey<std::cell::Cell<Vec<T>>>,
    len: usize,
) -> Vec<T> {
    let mut v = key.take();
    v.clear();
    v.resize(len, T::default());
    v
}

/// Keeps `v` as this thread's spare `key` for the next take (unless it is large).
fn give_back<T>(key: &'static std::thread::LocalKey<std::cell::Cell<Vec<T>>>, v: Vec<T>) {
    if v.capacity() * std::mem::size_of::<T>() <= KEEP_SPARE_MAX {
        key.set(v);
    }
}

pub(crate) fn take_zeroed_f32(len: usize) -> Vec<f32> {
    take_zeroed(&SPARE_F32, len)
}

pub(crate) fn give_back_f32(v: Vec<f32>) {
    give_back(&SPARE_F32, v)
}

/// For the AMX tiles' BF16 activations (x86-64 only): this thread's spare u16 buffer at `len`
/// elements whose values are whatever they were (the caller overwrites every one, on the
/// kernels' threads: zeroing a prompt's activation tiles here, serially, held the other cores
/// waiting). Only growth past the spare's length is zeroed.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn take_u16(len: usize) -> Vec<u16> {
    let mut v = SPARE_U16.take();
    v.truncate(len);
    v.resize(len, 0);
    v
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn give_back_u16(v: Vec<u16>) {
    give_back(&SPARE_U16, v)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_slices_with_a_short_last_one() {
        let mut a = vec![0usize; 93];
        let mut b = vec![0usize; 28];
        for_each_chunk_pair(&mut a, 10, &mut b, 3, |i, x, y| {
            x.iter_mut().for_each(|v| *v = i + 1);
            y.iter_mut().for_each(|v| *v = i + 1);
        });
        assert!(a.iter().enumerate().all(|(k, &v)| v == k / 10 + 1), "{a:?}");
        // Ten chunks of each, both ending short.
        assert!(b.iter().enumerate().all(|(k, &v)| v == k / 3 + 1), "{b:?}");
        let mut c = vec![0usize; 7];
        for_each_chunk(&mut c, 3, |i, x| x.iter_mut().for_each(|v| *v = i));
        assert_eq!(c, [0, 0, 0, 1, 1, 1, 2]);
    }
}
