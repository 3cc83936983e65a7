//! The GPU products against the CPU's scalar reference, batch invariance, and the split of large
//! weights. They need an adapter: on a machine without a GPU, Mesa's software Vulkan driver
//! (`apt-get install mesa-vulkan-drivers libvulkan1`) is one. Only where the environment says
//! there is none (`STRATA_NO_GPU=1`) do they pass without running.

use strata_gpu::{select, Gpu, GpuError, Preference, Selection};

fn gpu() -> Option<Gpu> {
    match select(Preference::Gpu) {
        Ok(Selection::Gpu(g)) => {
            eprintln!("GPU tests on {}", g.adapter());
            Some(*g)
        }
        Ok(Selection::Cpu { why }) => panic!("--device gpu chose the CPU: {why}"),
        Err(e) if std::env::var("STRATA_NO_GPU").is_ok_and(|v| v == "1") => {
            eprintln!("STRATA_NO_GPU=1: GPU tests not run ({e})");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn bf16s(&mut self, n: usize) -> Vec<u16> {
        (0..n).map(|_| (self.f32().to_bits() >> 16) as u16).collect()
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// A matrix in one of the GPU's formats, with the CPU's scalar reference for a row.
enum Weights {
    Bf16(Vec<u16>),
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl Weights {
    fn random(kind: usize, n: usize, rng: &mut Rng) -> Weights {
        match kind {
            0 => Weights::Bf16(rng.bf16s(n)),
            // Any finite F16 bits, subnormals included.
            1 => Weights::F16(
                (0..n)
                    .map(|_| loop {
                        let b = rng.next() as u16;
                        if b & 0x7c00 != 0x7c00 {
                            break b;
                        }
                    })
                    .collect(),
            ),
            _ => Weights::F32(rng.f32s(n)),
        }
    }
    fn upload(&self, g: &Gpu, in_dim: usize) -> Result<strata_gpu::GpuMatrix, GpuError> {
        match self {
            Weights::Bf16(w) => g.upload_bf16(w, in_dim),
            Weights::F16(w) => g.upload_f16(w, in_dim),
            Weights::F32(w) => g.upload_f32(w, in_dim),
        }
    }
    fn value(&self, i: usize) -> f32 {
        match self {
            Weights::Bf16(w) => strata_kernels::dot::bf16_to_f32(w[i]),
            Weights::F16(w) => half::f16::from_bits(w[i]).to_f32(),
            Weights::F32(w) => w[i],
        }
    }
    fn reference(&self, r: usize, in_dim: usize, x: &[f32]) -> f32 {
        let span = r * in_dim..(r + 1) * in_dim;
        match self {
            Weights::Bf16(w) => strata_kernels::dot::dot_bf16_reference(&w[span], x),
            Weights::F16(w) => strata_kernels::dot::dot_f16_reference(&w[span], x),
            Weights::F32(w) => strata_kernels::dot::dot_f32_reference(&w[span], x),
        }
    }
    fn name(&self) -> &'static str {
        match self {
            Weights::Bf16(_) => "BF16",
            Weights::F16(_) => "F16",
            Weights::F32(_) => "F32",
        }
    }
}

/// Two f32 sums of the same n products in different orders each lie within (n - 1) u sum|p| of
/// the exact sum (u = 2^-24), so they differ by at most 2 (n - 1) u sum|p|.
fn within_reorder_bound(gpu: f32, cpu: f32, w: &Weights, r: usize, x: &[f32]) -> bool {
    let n = x.len();
    let abs: f64 = (0..n)
        .map(|i| (w.value(r * n + i) as f64 * x[i] as f64).abs())
        .sum();
    let bound = 2.0 * (n.max(1) - 1) as f64 * (1.0 / (1u64 << 24) as f64) * abs;
    ((gpu as f64) - (cpu as f64)).abs() <= bound + f64::from(f32::MIN_POSITIVE)
}

#[test]
fn products_equal_the_cpu_reference_within_reordering() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for case in 0..36 {
        let rows = 1 + rng.below(70);
        let in_dim = 1 + rng.below(600);
        let tokens = 1 + rng.below(19);
        let w = Weights::random(case % 3, rows * in_dim, &mut rng);
        let xs = rng.f32s(tokens * in_dim);
        let m = w.upload(&g, in_dim).unwrap();
        let ys = g.matmul(&m, &xs, tokens).unwrap();
        assert_eq!(ys.len(), rows * tokens);
        for t in 0..tokens {
            let x = &xs[t * in_dim..(t + 1) * in_dim];
            for r in 0..rows {
                let cpu = w.reference(r, in_dim, x);
                let got = ys[t * rows + r];
                assert!(
                    within_reorder_bound(got, cpu, &w, r, x),
                    "case {case} {}: {rows}x{in_dim}, token {t} of {tokens}, row {r}: GPU {got} CPU {cpu}",
                    w.name()
                );
            }
        }
    }
}

#[test]
fn a_token_gets_the_same_bits_alone_and_in_any_batch() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x0bad_cafe_0000_0042);
    for case in 0..9 {
        let rows = 1 + rng.below(40);
        let in_dim = 1 + rng.below(900);
        let tokens = 2 + rng.below(30);
        let w = Weights::random(case % 3, rows * in_dim, &mut rng);
        let xs = rng.f32s(tokens * in_dim);
        let m = w.upload(&g, in_dim).unwrap();
        let batch = g.matmul(&m, &xs, tokens).unwrap();
        for t in 0..tokens {
            let alone = g.matmul(&m, &xs[t * in_dim..(t + 1) * in_dim], 1).unwrap();
            for r in 0..rows {
                assert_eq!(
                    alone[r].to_bits(),
                    batch[t * rows + r].to_bits(),
                    "{} {rows}x{in_dim}: token {t} of {tokens}, row {r}",
                    w.name()
                );
            }
        }
    }
}

#[test]
fn weights_split_over_several_bindings_give_the_same_bits() {
    let Some(mut g) = gpu() else { return };
    let mut rng = Rng(0x1111_2222_3333_4444);
    // Widths off the 16-byte word, so chunks and rows start inside one too.
    for (case, in_dim) in [1usize, 7, 33, 257, 1030, 3].into_iter().enumerate() {
        let rows = 29;
        let tokens = 3;
        let w = Weights::random(case % 3, rows * in_dim, &mut rng);
        let xs = rng.f32s(tokens * in_dim);
        let whole = w.upload(&g, in_dim).unwrap();
        assert_eq!(whole.chunks(), 1);
        let want = g.matmul(&whole, &xs, tokens).unwrap();
        let full = g.max_binding();
        g.set_max_binding((4 * in_dim * 4 + 32) as u64);
        let split = w.upload(&g, in_dim).unwrap();
        assert!(split.chunks() > 1, "{in_dim}: {} chunk(s)", split.chunks());
        let got = g.matmul(&split, &xs, tokens).unwrap();
        g.set_max_binding(full);
        let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "in_dim {in_dim}: split and whole products differ");
    }
}

#[test]
fn bad_shapes_are_errors_naming_the_shape() {
    let Some(g) = gpu() else { return };
    let Err(e) = g.upload_bf16(&[0u16; 10], 3) else {
        panic!("10 values taken as rows of 3")
    };
    assert!(
        matches!(e, GpuError::Shape(_)) && e.to_string().contains("rows of 3"),
        "{e}"
    );
    let m = g.upload_bf16(&[0u16; 12], 3).unwrap();
    let e = g
        .matmul(&m, &[0f32; 5], 2)
        .expect_err("5 values taken as 2 tokens of 3");
    assert!(e.to_string().contains("2 tokens of 3"), "{e}");
}

#[test]
fn auto_takes_a_discrete_gpu_and_never_a_software_adapter() {
    let discrete = strata_gpu::adapters().iter().any(|a| a.kind == "discrete GPU");
    match select(Preference::Auto).unwrap() {
        Selection::Gpu(g) => assert_eq!(g.adapter().kind, "discrete GPU", "auto took {}", g.adapter()),
        Selection::Cpu { why } => {
            assert!(
                !discrete,
                "auto fell back to the CPU ({why}) though a discrete GPU exists"
            );
            assert!(!why.is_empty());
        }
    }
}
