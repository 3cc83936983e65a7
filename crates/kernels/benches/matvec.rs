//! Single-token matvec throughput for every weight format at real shapes, on weights that are not
//! in cache, next to the machine's memory bandwidth measured in the same run.
//!
//! `cargo bench -p strata-kernels --bench matvec [-- FILTER]`
//!
//! Figures: GB/s of weight bytes consumed (packed data + scales), the STREAM-like read bandwidth
//! of a buffer far larger than the caches (same thread count), and their ratio. Each matrix is
//! copied until the copies fill `STRATA_BENCH_MIB` (default 768 MiB), and one pass multiplies
//! through all copies, so every weight byte comes from DRAM. Best of several passes.
//!
//! `-- --hot`: the compute bound instead. Each shape is cut to the rows that fit 256 KiB (the L2
//! cache) and multiplied over and over on one thread (the activation prepared once, as a large
//! matrix amortises it), so no weight byte waits on memory: one core's decode rate per format.

use std::time::Instant;

use rayon::prelude::*;
use strata_kernels::{Linear, WeightData};

struct Rand(u64);
impl Rand {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn budget_bytes() -> usize {
    std::env::var("STRATA_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(768usize)
        << 20
}

/// One parallel read pass over a buffer far larger than the caches (the memory bandwidth bound);
/// returns its seconds. It prefetches as far ahead as the kernels do, so it is the best read the
/// kernels could hope for, not a handicapped one.
fn stream_pass(buf: &[f32]) -> f64 {
    let t = Instant::now();
    let sink = buf
        .par_chunks(1 << 16)
        .map(|c| {
            // 64 independent lanes (8 AVX registers): the adds never wait on each other, so
            // the loop runs at the speed memory delivers.
            let mut acc = [0f32; 64];
            for v in c.chunks_exact(64) {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: a prefetch is a hint; it never dereferences the address.
                unsafe {
                    use std::arch::x86_64::*;
                    let p = (v.as_ptr() as *const i8).wrapping_add(strata_kernels::dot::PREFETCH_AHEAD);
                    _mm_prefetch::<_MM_HINT_T0>(p);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128));
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(192));
                }
                for l in 0..64 {
                    acc[l] += v[l];
                }
            }
            acc.iter().sum::<f32>()
        })
        .sum::<f32>();
    std::hint::black_box(sink);
    t.elapsed().as_secs_f64()
}

fn make(format: &str, out: usize, inp: usize, rng: &mut Rand) -> Linear {
    let n = out * inp;
    let data = match format {
        "BF16" => WeightData::Bf16(
            (0..n)
                .map(|_| half::bf16::from_f32(rng.f32()).to_bits())
                .collect(),
        ),
        "FP8" => WeightData::Fp8 {
            w: (0..n).map(|_| (rng.next() as u8) & 0x7e).collect(),
            scales: (0..out.div_ceil(128) * inp.div_ceil(128))
                .map(|_| rng.f32())
                .collect(),
            block: (128, 128),
        },
        "INT4" => WeightData::Int4 {
            packed: (0..out * inp.div_ceil(8)).map(|_| rng.next() as u32).collect(),
            scales: (0..out * inp.div_ceil(32))
                .map(|_| half::bf16::from_f32(rng.f32()).to_bits())
                .collect(),
            group: 32,
        },
        "MXFP4" => WeightData::Mxfp4 {
            packed: (0..out * inp.div_ceil(2)).map(|_| rng.next() as u8).collect(),
            scales: (0..out * inp.div_ceil(32))
                .map(|_| 120 + (rng.next() % 8) as u8)
                .collect(),
        },
        "INT8" => WeightData::Int8 {
            w: (0..n).map(|_| rng.next() as i8).collect(),
            scales: (0..out).map(|_| rng.f32()).collect(),
        },
        "F32" => WeightData::F32((0..n).map(|_| rng.f32()).collect()),
        other => panic!("unknown format {other}"),
    };
    Linear::new(out, inp, data)
}

/// Passes of each measurement; the best one counts.
const PASSES: usize = 6;

fn main() {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let hot = std::env::args().any(|a| a == "--hot");
    let threads = rayon::current_num_threads();
    let stream: Vec<f32> = (0..budget_bytes().max(512 << 20) / 4)
        .map(|i| (i % 251) as f32)
        .collect();
    println!(
        "threads: {threads}; \"mem GB/s\": a STREAM-like {threads}-thread read of {} MiB, each pass right \
         before a pass of the kernel (best of {PASSES} each), so the ratio compares the two side by side",
        (stream.len() * 4) >> 20
    );
    if hot {
        println!("hot: weights cut to 256 KiB and kept in cache (compute bound, not memory)");
    }
    println!(
        "{:<7} {:<34} {:>11} {:>9} {:>9} {:>9} {:>7} {:>11}",
        "format", "shape (out x in)", "MiB/matrix", "GB/s", "GFLOP/s", "mem GB/s", "of mem", "prepare us"
    );
    let shapes: &[(&str, usize, usize)] = &[
        ("Kimi K2 expert gate/up", 2048, 7168),
        ("Kimi K2 expert down", 7168, 2048),
        ("DeepSeek-V3 q_b_proj", 24576, 1536),
        ("DeepSeek-V3 kv_a_proj_with_mqa", 576, 7168),
        ("DeepSeek-V3 o_proj", 7168, 16384),
        ("Kimi K3 expert w1/w3 (latent 3584)", 3072, 3584),
        ("Kimi K3 expert w2 (latent 3584)", 3584, 3072),
    ];
    let mut rng = Rand(0x1234_5678_9ABC_DEF1);
    for format in ["BF16", "FP8", "INT4", "MXFP4", "INT8"] {
        for &(label, out, inp) in shapes {
            let name = format!("{format} {label}");
            if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
                continue;
            }
            let (out, repeats) = if hot {
                let row_bytes = make(format, 1, inp, &mut rng).bytes();
                (((256 << 10) / row_bytes).clamp(8, out), 256)
            } else {
                (out, 1)
            };
            let one = make(format, out, inp, &mut rng);
            let copies = if hot {
                1
            } else {
                (budget_bytes() / one.bytes()).max(2)
            };
            let mats: Vec<Linear> = (0..copies).map(|_| one.clone()).collect();
            drop(one);
            let x: Vec<f32> = (0..inp).map(|_| rng.f32()).collect();
            let mut y = vec![0f32; out];
            let (mut best, mut best_stream) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..PASSES {
                best_stream = best_stream.min(stream_pass(&stream));
                let t = Instant::now();
                if hot {
                    let m = &mats[0];
                    let p = m.prepare(&x);
                    for _ in 0..repeats {
                        m.rows_dot_prepared(0..out, &x, &p, &mut y);
                        std::hint::black_box(&y);
                    }
                } else {
                    for m in &mats {
                        m.matvec(&x, &mut y);
                    }
                }
                best = best.min(t.elapsed().as_secs_f64() / repeats as f64);
                std::hint::black_box(&y);
            }
            let t = Instant::now();
            for _ in 0..16 {
                std::hint::black_box(mats[0].prepare(&x));
            }
            let prepare_us = t.elapsed().as_secs_f64() / 16.0 * 1e6;
            let bytes: usize = mats.iter().map(|m| m.bytes()).sum();
            let gbs = bytes as f64 / best / 1e9;
            let gflops = 2.0 * (out * inp * copies) as f64 / best / 1e9;
            let mem = (stream.len() * 4) as f64 / best_stream / 1e9;
            println!(
                "{format:<7} {:<34} {:>11.1} {gbs:>9.2} {gflops:>9.2} {mem:>9.2} {:>6.0}% {prepare_us:>11.1}",
                format!("{label} {out}x{inp}"),
                mats[0].bytes() as f64 / (1 << 20) as f64,
                100.0 * gbs / mem
            );
        }
    }
}
