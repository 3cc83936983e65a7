//! `cargo bench -p strata-gpu --bench gpu_matvec`: BF16 products on the GPU next to the GPU
//! memory's own read rate measured in the same run (a pass over a buffer as large as the
//! matrices). Shapes from real checkpoints; "of mem" is weight bytes per second over that rate.
//! `-- --tokens N` times N-token products too.

use strata_gpu::{select, Preference, Selection};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let tokens: usize = args
        .iter()
        .position(|a| a == "--tokens")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
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
        ("Qwen3 LM head (151936 x 2048)", 151936, 2048),
    ];
    let mem = g.read_rate(1 << 30, 5).expect("read rate");
    println!("GPU memory read: {:.1} GB/s (1 GiB, best of 5)", mem / 1e9);
    println!(
        "{:<32} {:>9} {:>7} {:>10} {:>9} {:>7}",
        "shape", "MiB", "tokens", "us/product", "GB/s", "of mem"
    );
    for &(name, rows, in_dim) in shapes {
        let w: Vec<u16> = (0..rows * in_dim)
            .map(|i| ((i * 2654435761) >> 13) as u16 & 0xbfff)
            .collect();
        let m = g.upload_bf16(&w, in_dim).expect("upload");
        for t in [1, tokens] {
            let s = g.time_matmul(&m, t, 20).expect("timed product");
            let rate = m.bytes() as f64 / s;
            println!(
                "{name:<32} {:>9.1} {t:>7} {:>10.1} {:>9.1} {:>6.0} %",
                m.bytes() as f64 / (1 << 20) as f64,
                s * 1e6,
                rate / 1e9,
                100.0 * rate / mem
            );
            if tokens == 1 {
                break;
            }
        }
    }
}
