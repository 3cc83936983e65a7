//! `cargo bench -p strata-gpu --bench gpu_matvec`: products on the GPU next to the GPU memory's
//! own read rate measured in the same run (a pass over a 1 GiB buffer). Shapes from real
//! checkpoints; "of mem" is weight bytes per second over that rate. For each format and token
//! count it times every tile (`strata_gpu::Tile`) that fits the count and marks the one products
//! take by default; then the round trip of one small product (activations up, results back).
//!
//! `-- --tokens 1,8,64 --formats bf16,int4,mxfp4,fp8,int8 --shapes 2` (the first two shapes).

use std::time::Instant;

use strata_gpu::{select, Gpu, GpuMatrix, Preference, Selection, Tile};

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).map(|s| s.as_str())
}

/// A matrix of `format` with arbitrary (finite) weights.
fn matrix(g: &Gpu, format: &str, rows: usize, in_dim: usize) -> GpuMatrix {
    let n = rows * in_dim;
    let hash = |i: usize| (i.wrapping_mul(2654435761) >> 13) as u32;
    let m = match format {
        "bf16" => g.upload_bf16(
            &(0..n).map(|i| hash(i) as u16 & 0xbfff).collect::<Vec<_>>(),
            in_dim,
        ),
        "int8" => g.upload_int8(
            &(0..n).map(|i| hash(i) as i8).collect::<Vec<_>>(),
            &vec![0.01; rows],
            in_dim,
        ),
        "fp8" => {
            let blocks = rows.div_ceil(128) * in_dim.div_ceil(128);
            let w: Vec<u8> = (0..n).map(|i| hash(i) as u8 & 0x77).collect();
            g.upload_fp8(&w, &vec![0.01; blocks], (128, 128), in_dim)
        }
        "int4" => g.upload_int4(
            &(0..rows * in_dim.div_ceil(8)).map(hash).collect::<Vec<_>>(),
            &vec![0x3c00; rows * in_dim.div_ceil(32)],
            32,
            in_dim,
        ),
        "mxfp4" => g.upload_mxfp4(
            &(0..rows * in_dim.div_ceil(2))
                .map(|i| hash(i) as u8)
                .collect::<Vec<_>>(),
            &vec![120; rows * in_dim.div_ceil(32)],
            in_dim,
        ),
        other => panic!("unknown format {other}: bf16, int8, fp8, int4 or mxfp4"),
    };
    m.expect("upload")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let list = |name: &str, default: &str| -> Vec<String> {
        arg(&args, name)
            .unwrap_or(default)
            .split(',')
            .map(str::to_string)
            .collect()
    };
    let tokens: Vec<usize> = list("--tokens", "1")
        .iter()
        .map(|t| t.parse().expect("--tokens N,M"))
        .collect();
    let formats = list("--formats", "bf16");
    let g = match select(Preference::Gpu) {
        Ok(Selection::Gpu(g)) => *g,
        Ok(Selection::Cpu { why }) => panic!("no GPU: {why}"),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!(
        "adapter {}; largest binding {} MiB",
        g.adapter(),
        g.max_binding() >> 20
    );
    let shapes: &[(&str, usize, usize)] = &[
        ("Kimi K2 expert gate/up", 2048, 7168),
        ("Kimi K2 expert down", 7168, 2048),
        ("DeepSeek-V3 q_b_proj", 24576, 1536),
        ("DeepSeek-V3 o_proj", 7168, 16384),
        ("Qwen3 LM head", 151936, 2048),
        ("Kimi K2 q_a_proj", 1536, 7168),
        ("Kimi K2 kv_a_proj", 576, 7168),
        ("Kimi K2 LM head", 163840, 7168),
    ];
    let n_shapes = arg(&args, "--shapes").map_or(shapes.len(), |v| v.parse().expect("--shapes N"));
    let mem = g.read_rate(1 << 30, 5).expect("read rate");
    println!("GPU memory read: {:.1} GB/s (1 GiB, best of 5)", mem / 1e9);
    println!(
        "{:<24} {:>6} {:>8} {:>6} {:>5} {:>11} {:>9} {:>7}",
        "shape", "format", "MiB", "tokens", "tile", "us/product", "GB/s", "of mem"
    );
    for format in &formats {
        for &(name, rows, in_dim) in &shapes[..n_shapes.min(shapes.len())] {
            let m = matrix(&g, format, rows, in_dim);
            let mib = m.bytes() as f64 / (1 << 20) as f64;
            for &t in &tokens {
                let default = Tile::for_product(t, rows, in_dim);
                for tile in Tile::ALL
                    .iter()
                    .filter(|tile| tile.tokens as usize <= t || **tile == default)
                {
                    // About 0.2 s of products per figure.
                    let once = g.time_matmul(&m, t, 1, *tile).expect("timed product");
                    let reps = (0.2 / once).clamp(2.0, 50.0) as usize;
                    let s = g.time_matmul(&m, t, reps, *tile).expect("timed product");
                    let rate = m.bytes() as f64 / s;
                    let mark = if *tile == default { " (default)" } else { "" };
                    println!(
                        "{name:<24} {format:>6} {mib:>8.1} {t:>6} {tile:>5} {:>11.1} {:>9.1} {:>6.0} %{mark}",
                        s * 1e6,
                        rate / 1e9,
                        100.0 * rate / mem
                    );
                }
            }
        }
    }
    // The floor under every product: a 64x64 one, many in one compute pass.
    let m = matrix(&g, "bf16", 64, 64);
    let s = g.time_matmul(&m, 1, 500, Tile::ALL[0]).expect("timed product");
    println!(
        "a 64x64 product among 500 in one compute pass: {:.1} us each",
        s * 1e6
    );
    for (what, apart) in [("the same output", false), ("its own output", true)] {
        let s = g
            .time_products_apart(&m, 500, Tile::ALL[0], apart)
            .expect("timed products");
        println!(
            "a 64x64 product among 500 in one compute pass, each to {what}: {:.1} us each",
            s * 1e6
        );
    }
    // One small product's round trip: activations written, the product, results read back.
    let xs = vec![0.5f32; 64];
    g.matmul(&m, &xs, 1).expect("product");
    let n = 200;
    let t = Instant::now();
    for _ in 0..n {
        g.matmul(&m, &xs, 1).expect("product");
    }
    println!(
        "round trip of a 64x64 product: {:.1} us (mean of {n})",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
