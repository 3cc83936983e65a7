//! Property tests: for random shapes (lengths that are not multiples of the vector width, the
//! block or the group), every SIMD kernel equals its scalar reference twin within a stated
//! tolerance, and every format's `row_dot` equals the f64 dot of its decoded row.
//!
//! Tolerance: both sides sum the same products of f32 values in different orders; the error of
//! such a sum is bounded by n * eps * sum|w_i x_i|, so we allow 4 * n * 2^-24 * sum|w x| + 1e-30.

use strata_kernels::{dot, fp8, int4, int8, mxfp4, Linear, WeightData};

struct Rand(u64);

impl Rand {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

fn bound(w: &[f32], x: &[f32]) -> f64 {
    let mag: f64 = w.iter().zip(x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
    4.0 * w.len() as f64 * f64::from(f32::EPSILON) * mag + 1e-30
}

fn exact(w: &[f32], x: &[f32]) -> f64 {
    w.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum()
}

fn assert_close(what: &str, got: f32, want: f64, tol: f64) {
    assert!(
        (got as f64 - want).abs() <= tol,
        "{what}: {got} vs {want} (|diff| {} > {tol})",
        (got as f64 - want).abs()
    );
}

/// A random weight matrix in each format, with its decoded rows for the exact check.
fn formats(rng: &mut Rand, out: usize, inp: usize) -> Vec<Linear> {
    let dense = rng.vec(out * inp);
    let bf16: Vec<u16> = dense.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
    let f16: Vec<u16> = dense.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect();
    let block = (1 + rng.below(8), 1 + rng.below(40));
    let fp8_codes: Vec<u8> = (0..out * inp)
        .map(|_| loop {
            let b = rng.next() as u8;
            if b & 0x7f != 0x7f {
                break b; // NaN codes never occur in checkpoints
            }
        })
        .collect();
    let grid = out.div_ceil(block.0) * inp.div_ceil(block.1);
    let fp8_scales: Vec<f32> = (0..grid).map(|_| rng.f32() * 1e-2).collect();
    let group = [8, 16, 32, 64][rng.below(4)];
    let int4_packed: Vec<u32> = (0..out * inp.div_ceil(8)).map(|_| rng.next() as u32).collect();
    let int4_scales: Vec<u16> = (0..out * inp.div_ceil(group))
        .map(|_| half::bf16::from_f32(rng.f32() * 0.1).to_bits())
        .collect();
    let mx_packed: Vec<u8> = (0..out * inp.div_ceil(2)).map(|_| rng.next() as u8).collect();
    let mx_scales: Vec<u8> = (0..out * inp.div_ceil(32))
        .map(|_| 110 + rng.below(30) as u8)
        .collect();
    let i8w: Vec<i8> = (0..out * inp).map(|_| rng.next() as i8).collect();
    let i8s: Vec<f32> = (0..out).map(|_| rng.f32() * 1e-2).collect();
    vec![
        Linear::new(out, inp, WeightData::F32(dense)),
        Linear::new(out, inp, WeightData::Bf16(bf16)),
        Linear::new(out, inp, WeightData::F16(f16)),
        Linear::new(
            out,
            inp,
            WeightData::Fp8 {
                w: fp8_codes,
                scales: fp8_scales,
                block,
            },
        ),
        Linear::new(
            out,
            inp,
            WeightData::Int4 {
                packed: int4_packed,
                scales: int4_scales,
                group,
            },
        ),
        Linear::new(
            out,
            inp,
            WeightData::Mxfp4 {
                packed: mx_packed,
                scales: mx_scales,
            },
        ),
        Linear::new(out, inp, WeightData::Int8 { w: i8w, scales: i8s }),
    ]
}

#[test]
fn every_format_row_dot_equals_the_exact_dot_of_its_decoded_row() {
    let mut rng = Rand(0x5EED_1234_ABCD_0001);
    for case in 0..60 {
        let out = 1 + rng.below(9);
        let inp = if case % 3 == 0 {
            64 * (1 + rng.below(6))
        } else {
            1 + rng.below(400)
        };
        let x = rng.vec(inp);
        for lin in formats(&mut rng, out, inp) {
            let mut row = vec![0f32; inp];
            // matvec goes through the prepared-activation kernels (INT4, MXFP4).
            let mut y = vec![0f32; out];
            lin.matvec(&x, &mut y);
            for (r, &yr) in y.iter().enumerate() {
                lin.decode_row(r, &mut row);
                assert_close(
                    &format!(
                        "case {case} {} ({out}x{inp}) matvec row {r}",
                        lin.data.format_name()
                    ),
                    yr,
                    exact(&row, &x),
                    2.0 * bound(&row, &x) + 1e-6 * bound(&[1.0], &[1.0]),
                );
                // Decoded rows are exact f32 products (scale x code), so the f64 dot is the truth.
                assert_close(
                    &format!("case {case} {} ({out}x{inp}) row {r}", lin.data.format_name()),
                    lin.row_dot(r, &x),
                    exact(&row, &x),
                    bound(&row, &x),
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_kernels_equal_their_scalar_twins() {
    if !(std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c"))
    {
        eprintln!("no AVX2/FMA/F16C on this CPU: only the scalar path exists here");
        return;
    }
    let mut rng = Rand(0xC0FF_EE00_1234_5678);
    for case in 0..300 {
        let n = 1 + rng.below(700);
        let x = rng.vec(n);
        let wf = rng.vec(n);
        let tol = bound(&wf, &x) + 1e-6;
        let label = |k: &str| format!("case {case}: {k} n={n}");
        assert_close(
            &label("f32"),
            dot::x86::dot_f32_avx2_entry(&wf, &x),
            dot::dot_f32_reference(&wf, &x) as f64,
            tol,
        );
        let wb: Vec<u16> = wf.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        assert_close(
            &label("bf16"),
            dot::x86::dot_bf16_avx2_entry(&wb, &x),
            dot::dot_bf16_reference(&wb, &x) as f64,
            tol,
        );
        let wh: Vec<u16> = wf.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect();
        assert_close(
            &label("f16"),
            dot::x86::dot_f16_avx2_entry(&wh, &x),
            dot::dot_f16_reference(&wh, &x) as f64,
            tol,
        );

        let block = 1 + rng.below(200);
        let codes: Vec<u8> = (0..n).map(|_| rng.next() as u8 & 0x7e).collect();
        let scales: Vec<f32> = (0..n.div_ceil(block)).map(|_| rng.f32()).collect();
        let dec: Vec<f32> = (0..n)
            .map(|j| fp8::e4m3_to_f32(codes[j]) * scales[j / block])
            .collect();
        assert_close(
            &label("fp8"),
            fp8::x86::dot_fp8_avx2_entry(&codes, &scales, block, &x),
            fp8::dot_fp8_reference(&codes, &scales, block, &x) as f64,
            2.0 * bound(&dec, &x) + 1e-6,
        );

        let group = [8, 16, 24, 32, 128][rng.below(5)];
        let packed: Vec<u32> = (0..n.div_ceil(8)).map(|_| rng.next() as u32).collect();
        let s16: Vec<u16> = (0..n.div_ceil(group))
            .map(|_| half::bf16::from_f32(rng.f32()).to_bits())
            .collect();
        let dec: Vec<f32> = (0..n)
            .map(|j| int4::int4_at(&packed, j) as f32 * dot::bf16_to_f32(s16[j / group]))
            .collect();
        assert_close(
            &label("int4"),
            int4::x86::dot_int4_avx2_entry(&packed, &s16, group, &x),
            int4::dot_int4_reference(&packed, &s16, group, &x) as f64,
            2.0 * bound(&dec, &x) + 1e-6,
        );

        let mx: Vec<u8> = (0..n.div_ceil(2)).map(|_| rng.next() as u8).collect();
        let e8: Vec<u8> = (0..n.div_ceil(32)).map(|_| 100 + rng.below(54) as u8).collect();
        let dec: Vec<f32> = (0..n)
            .map(|j| mxfp4::E2M1[mxfp4::code_at(&mx, j) as usize] * mxfp4::e8m0_to_f32(e8[j / 32]))
            .collect();
        assert_close(
            &label("mxfp4"),
            mxfp4::x86::dot_mxfp4_avx2_entry(&mx, &e8, &x),
            mxfp4::dot_mxfp4_reference(&mx, &e8, &x) as f64,
            2.0 * bound(&dec, &x) + 1e-6,
        );

        let w8: Vec<i8> = (0..n).map(|_| rng.next() as i8).collect();
        let dec: Vec<f32> = w8.iter().map(|&v| v as f32 * 0.01).collect();
        assert_close(
            &label("int8"),
            int8::x86::dot_int8_avx2_entry(&w8, 0.01, &x),
            int8::dot_int8_reference(&w8, 0.01, &x) as f64,
            2.0 * bound(&dec, &x) + 1e-6,
        );
    }
}
