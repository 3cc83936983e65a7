//! The memory's read bandwidth, the bound of every product on weights not in cache: a parallel
//! read of a buffer far larger than the caches, on the kernels' threads.

use rayon::prelude::*;
use std::time::Instant;

/// One parallel read pass over `buf`; returns its seconds. The fastest plain read measured on
/// the AVX2 development machine: 256-bit loads OR-ed into four accumulators, 256 KiB per task,
/// no software prefetch (the hardware prefetcher alone streamed 10-14 % faster than with
/// prefetches, and than an f32-add loop, which the BF16 kernel outran).
pub fn stream_pass(buf: &[f32]) -> f64 {
    let t = Instant::now();
    let sink = buf.par_chunks(1 << 16).map(read_chunk).reduce(|| 0, |a, b| a | b);
    std::hint::black_box(sink);
    t.elapsed().as_secs_f64()
}

/// The best of `passes` read passes over a fresh buffer of `bytes` (faulted in first), in bytes
/// per second.
pub fn read_bandwidth(bytes: usize, passes: usize) -> f64 {
    let buf: Vec<f32> = (0..bytes / 4).into_par_iter().map(|i| i as f32).collect();
    let best = (0..passes.max(1))
        .map(|_| stream_pass(&buf))
        .fold(f64::INFINITY, f64::min);
    buf.len() as f64 * 4.0 / best
}

/// The OR of every bit in `c` (so the reads cannot be optimised away).
pub fn read_chunk(c: &[f32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: avx2 was detected.
        return unsafe { read_chunk_avx2(c) };
    }
    c.iter().fold(0, |a, v| a | v.to_bits())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_chunk_avx2(c: &[f32]) -> u32 {
    use std::arch::x86_64::*;
    let (p, n) = (c.as_ptr() as *const __m256i, c.len() / 8);
    let mut acc = [_mm256_setzero_si256(); 4];
    let mut i = 0;
    while i + 4 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_or_si256(*a, _mm256_loadu_si256(p.add(i + k)));
        }
        i += 4;
    }
    let a = _mm256_or_si256(_mm256_or_si256(acc[0], acc[1]), _mm256_or_si256(acc[2], acc[3]));
    let mut lanes = [0u32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, a);
    let mut or = lanes.iter().fold(0, |o, l| o | l);
    for v in &c[i * 8..] {
        or |= v.to_bits();
    }
    or
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_read_sees_every_bit() {
        let mut v = vec![0f32; 1000];
        assert_eq!(super::read_chunk(&v), 0);
        v[999] = f32::from_bits(1 << 5);
        v[3] = f32::from_bits(1 << 9);
        assert_eq!(super::read_chunk(&v), (1 << 5) | (1 << 9));
        assert!(super::read_bandwidth(1 << 20, 2) > 0.0);
    }
}
