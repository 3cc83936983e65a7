//! Single-token matvec throughput for every weight format at real shapes, on weights that are not
//! in cache, next to the machine's memory bandwidth measured in the same run.
//!
//! `cargo bench -p strata-kernels --bench matvec [-- FILTER]`
//!
//! Figures: GB/s of weight bytes consumed (packed data + scales), the STREAM-like read bandwidth
//! of a buffer far larger than the caches (same thread count), and their ratio. Each matrix is
//! copied until the copies fill `STRATA_BENCH_MIB` (default 768 MiB), so every weight byte comes
//! from DRAM; the kernel and the stream read alternate in 64 MiB slices (see `interleaved`).
//!
//! "compute": the compute bound, measured in the same run. Each thread multiplies its own cut of
//! the matrix (the rows that fit 256 KiB, in its L2 cache) over and over, the activation prepared
//! once (as a large matrix amortises it), so no weight byte waits on memory; "/ mem" is that
//! rate over the memory's. A format whose compute bound is near the memory's cannot hide the
//! memory's stalls and swings behind decoding, however well it prefetches.
//!
//! `STRATA_BENCH_SKEW=8`: BF16 weights 8 bytes past a 64-byte line (default 0), as a checkpoint's
//! tensors may lie.
//!
//! `-- --hot`: "GB/s" is one thread's compute bound instead of the product from memory.
//!
//! `-- --tokens N`: prompt-style products instead: each shape's `matmul` of N tokens, each
//! product on the next copy of the matrix (each weight byte comes from memory once per product,
//! then from cache for the other tokens), its time per token beside a one-token product's.

use std::time::Instant;

use strata_kernels::membw::stream_pass;
use strata_kernels::{ggml, Linear, Owner, Pod, Storage, WeightData};

/// `v` in a buffer of its own from a 64-byte boundary, or `STRATA_BENCH_SKEW` bytes past one (a
/// checkpoint's tensors may lie 8 bytes past one): a vector's own allocation starts 16 bytes past
/// one, and a tile or vector load that straddles cache lines would make the figures the
/// allocator's.
fn aligned<T: Pod>(v: Vec<T>) -> Storage<T> {
    let skew: usize = std::env::var("STRATA_BENCH_SKEW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let bytes = std::mem::size_of_val(v.as_slice());
    let mut buf = vec![0u8; bytes + 128];
    let at = buf.as_ptr().align_offset(64) + skew % 64;
    // SAFETY: T is plain data; `bytes` bytes of it are copied into a buffer that has room.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, buf[at..].as_mut_ptr(), bytes) };
    let owner: Owner = std::sync::Arc::new(buf);
    let view = owner.downcast_ref::<Vec<u8>>().expect("the buffer")[at..at + bytes].as_ptr();
    // SAFETY: the view lies in the owner's buffer, which nobody changes while it lives.
    unsafe { Storage::borrow(&owner, std::slice::from_raw_parts(view, bytes)) }.expect("aligned")
}

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

/// A count from the environment variable `name`, or `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn budget_bytes() -> usize {
    env_count("STRATA_BENCH_MIB", 768) << 20
}

fn make(format: &str, out: usize, inp: usize, rng: &mut Rand) -> Linear {
    let n = out * inp;
    let data = match format {
        "BF16" => WeightData::Bf16(aligned(
            (0..n)
                .map(|_| half::bf16::from_f32(rng.f32()).to_bits())
                .collect(),
        )),
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
        "Q8_0" => WeightData::Q8_0 {
            blocks: (0..n / 32)
                .flat_map(|_| {
                    let d = half::f16::from_f32(rng.f32() * 1e-2).to_bits().to_le_bytes();
                    let q: Vec<u8> = (0..32).map(|_| rng.next() as u8).collect();
                    d.into_iter().chain(q)
                })
                .collect(),
        },
        "F32" => WeightData::F32((0..n).map(|_| rng.f32()).collect()),
        other => {
            let ty = *ggml::ALL
                .iter()
                .find(|t| t.name() == other)
                .unwrap_or_else(|| panic!("unknown format {other}"));
            let blocks = ty.random_blocks(out * inp / ty.block(), || rng.next());
            WeightData::Ggml {
                ty,
                blocks: blocks.into(),
            }
        }
    };
    Linear::new(out, inp, data)
}

/// The formats measured: strata's own, then GGUF's block types (Q4_K_M files are mostly Q4_K and
/// Q6_K).
const FORMATS: [&str; 11] = [
    "BF16", "FP8", "INT4", "MXFP4", "INT8", "Q8_0", "Q4_K", "Q6_K", "Q5_K", "Q4_0", "IQ4_XS",
];

/// Bytes each side reads per round of the interleaved measurement.
const SLICE: usize = 64 << 20;

/// Rounds of the interleaved measurement (`STRATA_BENCH_ROUNDS`, default 48).
fn rounds() -> usize {
    env_count("STRATA_BENCH_ROUNDS", 48).max(1)
}

/// (kernel GB/s, memory GB/s) measured side by side: each round reads the next 64 MiB slice of
/// the stream buffer and multiplies through the next 64 MiB of matrix copies (both long evicted
/// from the caches since their last use), in an order that flips every round; the totals over
/// all rounds give the two rates.
/// Memory bandwidth on a shared machine swings by a third within seconds; alternating every few
/// milliseconds puts both sides under the same conditions. One round first, uncounted, warms up.
fn interleaved(stream: &[f32], mats: &[Linear], x: &[f32], y: &mut [f32]) -> (f64, f64) {
    let chunk = SLICE / 4;
    let slices = stream.len() / chunk;
    let per_round = (SLICE / mats[0].bytes()).clamp(1, mats.len());
    let (mut stream_s, mut kernel_s, mut kernel_bytes) = (0f64, 0f64, 0usize);
    let mut next = 0;
    for round in 0..=rounds() {
        let s = round % slices;
        let mut st = 0.0;
        if round % 2 == 0 {
            st = stream_pass(&stream[s * chunk..(s + 1) * chunk]);
        }
        let t = Instant::now();
        for _ in 0..per_round {
            mats[next].matvec(x, y);
            next = (next + 1) % mats.len();
        }
        std::hint::black_box(&y);
        let kt = t.elapsed().as_secs_f64();
        if round % 2 == 1 {
            st = stream_pass(&stream[s * chunk..(s + 1) * chunk]);
        }
        if round > 0 {
            kernel_s += kt;
            stream_s += st;
            kernel_bytes += per_round * mats[0].bytes();
        }
    }
    let stream_bytes = rounds() * chunk * 4;
    (
        kernel_bytes as f64 / kernel_s / 1e9,
        stream_bytes as f64 / stream_s / 1e9,
    )
}

/// Passes of each `--hot` measurement (`STRATA_BENCH_PASSES`, default 12); the best one counts.
fn passes() -> usize {
    env_count("STRATA_BENCH_PASSES", 12).max(1)
}

/// The compute bound of `format` with `inp` inputs: (GB/s of one thread, GB/s of every thread
/// at once). Each thread multiplies its own cut of the matrix, the rows that fit 256 KiB (half of
/// this machine's L2), over and over with the activation prepared once (as a large matrix
/// amortises it), so no weight byte waits on memory; the best of `passes()` counts.
fn hot_rates(format: &str, inp: usize, rng: &mut Rand) -> (f64, f64) {
    let threads = rayon::current_num_threads();
    let row_bytes = make(format, 1, inp, rng).bytes();
    let out = ((128 << 10) / row_bytes).max(4);
    let repeats = 256;
    let mats: Vec<Linear> = (0..threads).map(|_| make(format, out, inp, rng)).collect();
    let x: Vec<f32> = (0..inp).map(|_| rng.f32()).collect();
    let preps: Vec<_> = mats.iter().map(|m| m.prepare(&x)).collect();
    let run = |m: &Linear, p| {
        let mut y = vec![0f32; out];
        for _ in 0..repeats {
            m.rows_dot_prepared(0..out, &x, p, &mut y);
            std::hint::black_box(&y);
        }
    };
    let (mut one, mut all) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..passes() {
        let t = Instant::now();
        run(&mats[0], &preps[0]);
        one = one.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        rayon::broadcast(|ctx| run(&mats[ctx.index()], &preps[ctx.index()]));
        all = all.min(t.elapsed().as_secs_f64());
    }
    let bytes = (repeats * mats[0].bytes()) as f64;
    (bytes / one / 1e9, threads as f64 * bytes / all / 1e9)
}

/// Microseconds per token of `matmul` with `n` tokens, each product on the next copy of the
/// matrix (so its weights come from memory, as a large model's do), the total over
/// `passes()` x 4 products.
fn per_token_us(mats: &[Linear], n: usize, rng: &mut Rand) -> f64 {
    let (inp, out) = (mats[0].in_dim, mats[0].out_dim);
    let xs: Vec<f32> = (0..n * inp).map(|_| rng.f32()).collect();
    let mut ys = vec![0f32; n * out];
    let products = passes() * 4;
    let t = Instant::now();
    for i in 0..products {
        mats[i % mats.len()].matmul(&xs, n, &mut ys);
        std::hint::black_box(&ys);
    }
    t.elapsed().as_secs_f64() / (products * n) as f64 * 1e6
}

/// `--tokens N`: time per token of an N-token product beside a one-token product's.
fn prompt_products(filter: Option<&str>, tokens: usize, shapes: &[(&str, usize, usize)]) {
    println!(
        "matmul of {tokens} tokens vs 1 token, weights from memory (copies filling {} MiB, {} products each): time per token",
        budget_bytes() >> 20,
        passes() * 4
    );
    println!(
        "{:<7} {:<34} {:>11} {:>14} {:>14} {:>8}",
        "format", "shape (out x in)", "MiB/matrix", "1 token us", "per token us", "speedup"
    );
    let mut rng = Rand(0x0dd_ba11_5eed_0001);
    for format in FORMATS {
        for &(label, out, inp) in shapes {
            let name = format!("{format} {label}");
            if filter.is_some_and(|f| !name.contains(f)) {
                continue;
            }
            let one = make(format, out, inp, &mut rng);
            let copies = (budget_bytes() / one.bytes()).max(2);
            let mats: Vec<Linear> = (0..copies).map(|_| one.clone()).collect();
            let single = per_token_us(&mats, 1, &mut rng);
            let many = per_token_us(&mats, tokens, &mut rng);
            println!(
                "{format:<7} {:<34} {:>11.1} {single:>14.1} {many:>14.1} {:>7.2}x",
                format!("{label} {out}x{inp}"),
                one.bytes() as f64 / (1 << 20) as f64,
                single / many
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tokens: Option<usize> = args
        .iter()
        .position(|a| a == "--tokens")
        .map(|i| args.get(i + 1).and_then(|v| v.parse().ok()).expect("--tokens N"));
    let filter: Option<String> = args
        .iter()
        .enumerate()
        .find(|(i, a)| !a.starts_with('-') && (*i == 0 || args[i - 1] != "--tokens"))
        .map(|(_, a)| a.clone());
    let hot = std::env::args().any(|a| a == "--hot");
    let shapes: &[(&str, usize, usize)] = &[
        ("Kimi K2 expert gate/up", 2048, 7168),
        ("Kimi K2 expert down", 7168, 2048),
        ("DeepSeek-V3 q_b_proj", 24576, 1536),
        ("DeepSeek-V3 kv_a_proj_with_mqa", 576, 7168),
        ("DeepSeek-V3 o_proj", 7168, 16384),
        ("Kimi K3 expert w1/w3 (latent 3584)", 3072, 3584),
        ("Kimi K3 expert w2 (latent 3584)", 3584, 3072),
        ("Qwen3-30B-A3B expert gate/up", 768, 2048),
        ("Qwen3-30B-A3B expert down", 2048, 768),
        ("Qwen3-30B-A3B q_proj", 4096, 2048),
    ];
    if let Some(n) = tokens {
        return prompt_products(filter.as_deref(), n, shapes);
    }
    let threads = rayon::current_num_threads();
    let stream: Vec<f32> = (0..budget_bytes().max(512 << 20) / 4)
        .map(|i| (i % 251) as f32)
        .collect();
    if hot {
        println!(
            "threads: {threads}; hot: \"GB/s\" is one thread on a 256 KiB cut of the weights kept in its cache \
             (compute bound, not memory); \"mem GB/s\": a STREAM-like {threads}-thread read of {} MiB (best of {} each)",
            (stream.len() * 4) >> 20,
            passes()
        );
    } else {
        println!(
            "threads: {threads}; \"mem GB/s\": a STREAM-like {threads}-thread read, alternating with the kernel \
             in {} MiB slices over {} rounds (totals), so the ratio compares the two side by side; \
             \"compute\": GB/s of all {threads} threads on weights kept in their caches (the compute bound)",
            SLICE >> 20,
            rounds()
        );
    }
    println!(
        "{:<7} {:<34} {:>11} {:>9} {:>9} {:>9} {:>7} {:>11} {:>7} {:>11}",
        "format",
        "shape (out x in)",
        "MiB/matrix",
        "GB/s",
        "GFLOP/s",
        "mem GB/s",
        "of mem",
        "compute",
        "/ mem",
        "prepare us"
    );
    let mut rng = Rand(0x1234_5678_9ABC_DEF1);
    for format in FORMATS {
        for &(label, out, inp) in shapes {
            let name = format!("{format} {label}");
            if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
                continue;
            }
            let (one_core, all_cores) = hot_rates(format, inp, &mut rng);
            let (gbs, mem) = if hot {
                let mut best_stream = f64::INFINITY;
                for _ in 0..passes() {
                    best_stream = best_stream.min(stream_pass(&stream));
                }
                (one_core, (stream.len() * 4) as f64 / best_stream / 1e9)
            } else {
                let one = make(format, out, inp, &mut rng);
                let copies = (budget_bytes() / one.bytes()).max(2);
                let mats: Vec<Linear> = (0..copies).map(|_| one.clone()).collect();
                drop(one);
                let x: Vec<f32> = (0..inp).map(|_| rng.f32()).collect();
                let mut y = vec![0f32; out];
                interleaved(&stream, &mats, &x, &mut y)
            };
            let m = make(format, out, inp, &mut rng);
            let x: Vec<f32> = (0..inp).map(|_| rng.f32()).collect();
            let t = Instant::now();
            for _ in 0..16 {
                std::hint::black_box(m.prepare(&x));
            }
            let prepare_us = t.elapsed().as_secs_f64() / 16.0 * 1e6;
            let gflops = gbs * 2.0 * (out * inp) as f64 / m.bytes() as f64;
            println!(
                "{format:<7} {:<34} {:>11.1} {gbs:>9.2} {gflops:>9.2} {mem:>9.2} {:>6.0}% {all_cores:>11.2} {:>7.2} {prepare_us:>11.1}",
                format!("{label} {out}x{inp}"),
                m.bytes() as f64 / (1 << 20) as f64,
                100.0 * gbs / mem,
                all_cores / mem
            );
        }
    }
}
