//! Property tests: for random shapes (lengths that are not multiples of the vector width, the
//! block or the group), every SIMD kernel equals its scalar reference twin within a stated
//! tolerance, and every format's `row_dot` equals the f64 dot of its decoded row.
//!
//! Tolerance: both sides sum the same products of f32 values in different orders; the error of
//! such a sum is bounded by n * eps * sum|w_i x_i|, so we allow 4 * n * 2^-24 * sum|w x| + 1e-30.
//! The 4-bit formats' matrix products put the activation into integers, q + r / 256 steps per
//! input with step = max|x of its 32| / 32639 (`strata_kernels::intdot`): each input moves by at
//! most 1/512 of its step, so they may differ from the exact dot by a further
//! sum_j |w_j| * step_j / 512.

// Most checks here are of x86 variants; on other CPUs (aarch64: `tests/neon.rs`) some imports rest.
#![cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]

use strata_kernels::{dot, fp8, ggml, int4, int8, intdot, kquant, mxfp4, Linear, WeightData};

mod common;
use common::Rand;

fn bound(w: &[f32], x: &[f32]) -> f64 {
    let mag: f64 = w.iter().zip(x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
    4.0 * w.len() as f64 * f64::from(f32::EPSILON) * mag + 1e-30
}

/// The most the integer activation of the 4-bit kernels can move a dot of row w with x.
fn intdot_bound(w: &[f32], x: &[f32]) -> f64 {
    let blocked = x.len() / intdot::BLOCK * intdot::BLOCK;
    let mut total = 0f64;
    for (h, xs) in x[..blocked].chunks_exact(32).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let wsum: f64 = w[32 * h..32 * h + 32].iter().map(|v| v.abs() as f64).sum();
        total += wsum * amax / intdot::QMAX as f64 / 512.0;
    }
    total * 1.001
}

/// What AMX's two rounded BF16 parts per activation (`STRATA_AMX_PARTS=2`) can move a BF16
/// product by: each activation by at most 2^-17 of itself (`amx::split2`).
fn amx_bound(lin: &Linear, w: &[f32], x: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if matches!(lin.data, WeightData::Bf16(_))
        && strata_kernels::amx::enabled()
        && strata_kernels::amx::parts() == 2
    {
        let mag: f64 = w.iter().zip(x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
        return mag * 2f64.powi(-17);
    }
    let _ = (lin, w, x);
    0.0
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
    // Column blocks of whole 32s (as real checkpoints' 128) take the scaled-activation kernel.
    let block = (1 + rng.below(8), [1 + rng.below(40), 32, 64, 128][rng.below(4)]);
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
    // GGUF Q8_0 where rows are whole blocks of 32: an F16 scale, then 32 signed bytes.
    let q8_0: Vec<u8> = (0..out * inp / 32)
        .flat_map(|_| {
            let d = half::f16::from_f32(rng.f32() * 1e-2).to_bits().to_le_bytes();
            let q: Vec<u8> = (0..32).map(|_| rng.next() as u8).collect();
            d.into_iter().chain(q)
        })
        .collect();
    let mut all = vec![
        Linear::new(out, inp, WeightData::F32(dense.into())),
        Linear::new(out, inp, WeightData::Bf16(bf16.into())),
        Linear::new(out, inp, WeightData::F16(f16.into())),
        Linear::new(
            out,
            inp,
            WeightData::Fp8 {
                w: fp8_codes.into(),
                scales: fp8_scales.into(),
                block,
            },
        ),
        Linear::new(
            out,
            inp,
            WeightData::Int4 {
                packed: int4_packed.into(),
                scales: int4_scales.into(),
                group,
            },
        ),
        Linear::new(
            out,
            inp,
            WeightData::Mxfp4 {
                packed: mx_packed.into(),
                scales: mx_scales.into(),
            },
        ),
        Linear::new(
            out,
            inp,
            WeightData::Int8 {
                w: i8w.into(),
                scales: i8s.into(),
            },
        ),
    ];
    if inp.is_multiple_of(32) {
        all.push(Linear::new(out, inp, WeightData::Q8_0 { blocks: q8_0.into() }));
    }
    // GGUF's other block types where rows are whole blocks.
    for ty in ggml::ALL.into_iter().filter(|t| inp.is_multiple_of(t.block())) {
        let blocks = ty.random_blocks(out * inp / ty.block(), || rng.next());
        all.push(Linear::new(
            out,
            inp,
            WeightData::Ggml {
                ty,
                blocks: blocks.into(),
            },
        ));
    }
    all
}

#[test]
fn every_format_row_dot_equals_the_exact_dot_of_its_decoded_row() {
    let mut rng = Rand(0x5EED_1234_ABCD_0001);
    for case in 0..60 {
        let out = 1 + rng.below(9);
        let inp = if case % 3 == 0 {
            64 * (1 + rng.below(6))
        } else if case % 5 == 1 {
            256 * (1 + rng.below(3))
        } else {
            1 + rng.below(400)
        };
        let x = rng.vec(inp);
        for lin in formats(&mut rng, out, inp) {
            let mut row = vec![0f32; inp];
            // matvec goes through the prepared-activation kernels (INT4, MXFP4).
            let mut y = vec![0f32; out];
            lin.matvec(&x, &mut y);
            let p = lin.prepare(&x);
            for (r, &yr) in y.iter().enumerate() {
                // A run of rows in one call is the same as each row on its own, bit for bit.
                assert_eq!(
                    yr.to_bits(),
                    lin.row_dot_prepared(r, &x, &p).to_bits(),
                    "case {case} {} ({out}x{inp}) row {r}",
                    lin.data.format_name()
                );
                lin.decode_row(r, &mut row);
                let quantized = match lin.data {
                    WeightData::Int4 { .. } | WeightData::Mxfp4 { .. } => intdot_bound(&row, &x),
                    WeightData::Ggml { ty, .. } if kquant::handles(ty) && kquant::simd() => {
                        intdot_bound(&row, &x)
                    }
                    _ => amx_bound(&lin, &row, &x),
                };
                assert_close(
                    &format!(
                        "case {case} {} ({out}x{inp}) matvec row {r}",
                        lin.data.format_name()
                    ),
                    yr,
                    exact(&row, &x),
                    2.0 * bound(&row, &x) + quantized + 1e-6 * bound(&[1.0], &[1.0]),
                );
                // Decoded rows are exact f32 products (scale x code), so the f64 dot is the truth.
                assert_close(
                    &format!("case {case} {} ({out}x{inp}) row {r}", lin.data.format_name()),
                    lin.row_dot(r, &x),
                    exact(&row, &x),
                    bound(&row, &x) + amx_bound(&lin, &row, &x),
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

        // Real checkpoints use blocks of 128: multiples of 32 take the prepared kernel's
        // reordered path, other sizes the plain one.
        let block = [1 + rng.below(200), 32, 64, 128][rng.below(4)];
        let (codes, scales, dec) = fp8_row(&mut rng, n, block);
        assert_close(
            &label("fp8"),
            fp8::x86::dot_fp8_avx2_entry(&codes, &scales, block, &x),
            fp8::dot_fp8_reference(&codes, &scales, block, &x) as f64,
            2.0 * bound(&dec, &x) + 1e-6,
        );
        assert_close(
            &label("fp8 prepared"),
            {
                let mut y = [0f32];
                let act = fp8::Fp8Act::new(&x);
                fp8::rows_fp8_prepared(&codes, &scales, (1, block), &x, &act, 0, &mut y);
                y[0]
            },
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

/// An activation with the cases quantization must get right: whole halves of zeros, tiny values
/// (flushed below 1e-30), exact ties for rounding, and ordinary values.
/// An FP8 row of `n` codes (every code of either sign but the two NaNs), its scales per `block`
/// inputs, and its decoded values.
fn fp8_row(rng: &mut Rand, n: usize, block: usize) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let codes: Vec<u8> = (0..n)
        .map(|_| match rng.next() as u8 {
            c if c & 0x7f == 0x7f => c & 0xfe,
            c => c,
        })
        .collect();
    let scales: Vec<f32> = (0..n.div_ceil(block)).map(|_| rng.f32()).collect();
    let dec = (0..n)
        .map(|j| fp8::e4m3_to_f32(codes[j]) * scales[j / block])
        .collect();
    (codes, scales, dec)
}

fn activation(rng: &mut Rand, n: usize) -> Vec<f32> {
    let mut x = rng.vec(n);
    for (h, xs) in x.chunks_mut(32).enumerate() {
        match (h + rng.below(7)) % 7 {
            0 => xs.iter_mut().for_each(|v| *v = 0.0),
            1 => xs.iter_mut().for_each(|v| *v *= 1e-32),
            2 => xs
                .iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v = (i as f32 - 16.0) * 0.5),
            3 => xs.iter_mut().for_each(|v| *v *= 1e4),
            _ => {}
        }
    }
    x
}

#[test]
fn intdot_activation_is_the_same_with_and_without_simd() {
    let mut rng = Rand(0x0916_2026_0000_0001);
    for case in 0..200 {
        let n = rng.below(1000);
        let x = activation(&mut rng, n);
        let (offset, factor) = [(8, 1.0), (12, 0.5)][case % 2];
        let (a, b) = (
            intdot::prepare(&x, offset, factor),
            intdot::prepare_reference(&x, offset, factor),
        );
        assert_eq!(a.blocks.len(), n / intdot::BLOCK);
        // Digits, steps and offsets, bit for bit.
        assert!(a.as_bytes() == b.as_bytes(), "case {case} n={n}");
        // Each value is within 1/512 of a step of its input (in f64: no rounding of ours; the
        // slack is the f32 rounding of rest / step).
        for (j, xj) in x[..a.blocks.len() * intdot::BLOCK].iter().enumerate() {
            // Step lanes hold step x factor / 256.
            let step = (a.step_of(j) / factor) as f64 * 256.0;
            let got = intdot::units_at(&a, j) * step;
            let tol = step * 0.501 / 256.0 + 1e-30;
            assert!(
                (got - *xj as f64).abs() <= tol,
                "case {case} input {j}: {got} vs {}",
                xj
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn intdot_kernel_equals_its_scalar_twin() {
    use intdot::x86::Scales;
    if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
        eprintln!("no AVX2/FMA on this CPU: only the scalar path exists here");
        return;
    }
    let mut rng = Rand(0x0916_2026_0000_0002);
    for case in 0..300 {
        let n = intdot::BLOCK * (1 + rng.below(20));
        let x = activation(&mut rng, n);
        let packed: Vec<u8> = (0..n / 2).map(|_| rng.next() as u8).collect();
        let nibble = |j: usize| (packed[j / 2] >> (4 * (j % 2))) & 0xf;
        let (values, half_scales, got, a): (Vec<u8>, Vec<f32>, f32, intdot::IntAct) = match case % 3 {
            0 => {
                let a = intdot::prepare(&x, 8, 1.0);
                let s16: Vec<u16> = (0..n / 32)
                    .map(|_| half::bf16::from_f32(rng.f32()).to_bits())
                    .collect();
                // SAFETY: avx2 and fma were detected.
                let got = unsafe { intdot::x86::dot_avx2(&packed, Scales::Bf16Group32(&s16), None, &a) };
                let hs = s16.iter().map(|s| dot::bf16_to_f32(*s)).collect();
                ((0..n).map(nibble).collect(), hs, got, a)
            }
            1 => {
                let a = intdot::prepare(&x, 8, 1.0);
                let shift = 6 + rng.below(3) as u32;
                let s16: Vec<u16> = (0..n.div_ceil(1 << shift))
                    .map(|_| half::bf16::from_f32(rng.f32()).to_bits())
                    .collect();
                // SAFETY: avx2 and fma were detected.
                let got = unsafe { intdot::x86::dot_avx2(&packed, Scales::Bf16Wide(&s16, shift), None, &a) };
                let hs = (0..n / 32)
                    .map(|h| dot::bf16_to_f32(s16[(32 * h) >> shift]))
                    .collect();
                ((0..n).map(nibble).collect(), hs, got, a)
            }
            _ => {
                let a = intdot::prepare(&x, 12, 0.5);
                // Every exponent byte but NaN's 255, the edges 0 (2^-127) and 254 (2^127) included.
                let e8: Vec<u8> = (0..n / 32)
                    .map(|_| match rng.below(10) {
                        0 => 0,
                        1 => 254,
                        _ => 100 + rng.below(54) as u8,
                    })
                    .collect();
                let lut = mxfp4::INTDOT_LUT;
                // SAFETY: avx2 and fma were detected.
                let got = unsafe { intdot::x86::dot_avx2(&packed, Scales::E8m0(&e8), Some(&lut), &a) };
                let hs = e8.iter().map(|e| mxfp4::e8m0_to_f32(*e)).collect();
                ((0..n).map(|j| lut[nibble(j) as usize]).collect(), hs, got, a)
            }
        };
        let want = intdot::dot_reference(&values, &half_scales, &a);
        // The same integer sums; only the order of the f32 steps differs (and 2^127 scales may
        // overflow alike).
        let mag: f64 = (0..n / 32)
            .map(|h| {
                let s: f64 = (32 * h..32 * h + 32)
                    .map(|j| (values[j] as f64 * intdot::units_at(&a, j)).abs())
                    .sum();
                // Step lanes count 1/256 steps.
                (s + 12.0 * 32.0 * 32640.0) * 256.0 * (a.step_of(32 * h) as f64 * half_scales[h] as f64).abs()
            })
            .sum();
        // Near f32's range (2^127 scales on large sums) either side may overflow first.
        if mag < 1e37 {
            assert_close(
                &format!("case {case} n={n}"),
                got,
                want as f64,
                1e-5 * mag + 1e-30,
            );
        }
    }
}

/// One FP8 activation multiplied with two matrices, rows interleaved: each thread's scaled copy
/// of the activation belongs to one matrix's row block, never to the other's.
#[test]
fn one_fp8_activation_serves_two_matrices() {
    let mut rng = Rand(0xF8F8_0000_2026_1130);
    let (out, inp): (usize, usize) = (8, 256);
    let make = |rng: &mut Rand| {
        let w: Vec<u8> = (0..out * inp).map(|_| rng.next() as u8 & 0x7e).collect();
        let scales: Vec<f32> = (0..out.div_ceil(4) * inp.div_ceil(128))
            .map(|_| rng.f32())
            .collect();
        Linear::new(
            out,
            inp,
            WeightData::Fp8 {
                w: w.into(),
                scales: scales.into(),
                block: (4, 128),
            },
        )
    };
    let (a, b) = (make(&mut rng), make(&mut rng));
    let x = rng.vec(inp);
    let p = a.prepare(&x);
    let mut row = vec![0f32; inp];
    for r in 0..out {
        for m in [&a, &b] {
            let mut y = [0f32];
            m.rows_dot_prepared(r..r + 1, &x, &p, &mut y);
            m.decode_row(r, &mut row);
            assert_close(
                &format!("row {r}"),
                y[0],
                exact(&row, &x),
                2.0 * bound(&row, &x) + 1e-6,
            );
        }
    }
}

/// Several tokens through one matrix give each token, bit for bit, what it gets alone (batch
/// invariance), in every format: the rows-and-tokens call (which the 4-bit kernels run for up
/// to four tokens per pass over a row) and `matmul` against one-token products.
#[test]
fn several_tokens_equal_each_token_alone_in_every_format() {
    let mut rng = Rand(0x0704_34E5_2026_1130);
    for case in 0..24 {
        let out = 1 + rng.below(40);
        let inp = [64, 100, 128, 130, 257, 700][rng.below(6)];
        // Mostly a few tokens; every sixth case more than one block of tokens of the tiled
        // dense kernels (48).
        let tokens = if case % 6 == 5 {
            40 + rng.below(70)
        } else {
            1 + rng.below(9)
        };
        let xs = rng.vec(tokens * inp);
        for lin in formats(&mut rng, out, inp) {
            let name = format!(
                "case {case} {} ({out}x{inp}, {tokens} tokens)",
                lin.data.format_name()
            );
            let prepared: Vec<_> = xs.chunks_exact(inp).map(|x| lin.prepare(x)).collect();
            let mut together = vec![0f32; out * tokens];
            lin.rows_dot_prepared_tokens(0..out, &xs, &prepared, &mut together);
            let mut product = vec![0f32; out * tokens];
            lin.matmul(&xs, tokens, &mut product);
            for (t, x) in xs.chunks_exact(inp).enumerate() {
                let mut alone = vec![0f32; out];
                lin.rows_dot_prepared(0..out, x, &prepared[t], &mut alone);
                let mut single = vec![0f32; out];
                lin.matvec(x, &mut single);
                for r in 0..out {
                    assert_eq!(
                        together[r * tokens + t].to_bits(),
                        alone[r].to_bits(),
                        "{name}: row {r} token {t}"
                    );
                    assert_eq!(
                        product[t * out + r].to_bits(),
                        single[r].to_bits(),
                        "{name}: matmul row {r} token {t}"
                    );
                }
            }
        }
    }
}

/// Unless `STRATA_AMX=0`, where the CPU has AMX-BF16 (and the kernels in use are AVX-512), every
/// BF16 product runs on its tiles: the other tests here then check those products (accuracy
/// against the exact dot, batch invariance).
#[cfg(target_arch = "x86_64")]
#[test]
fn amx_runs_the_bf16_products_where_the_cpu_has_it() {
    use strata_kernels::{amx, isa};
    let asked = std::env::var("STRATA_AMX").map_or(true, |v| v != "0");
    let cpu = isa::isa() == isa::Isa::Avx512 && amx::cpu_has_amx_bf16();
    eprintln!(
        "AMX BF16: the CPU has it: {cpu}; asked: {asked}; in use: {}",
        amx::enabled()
    );
    assert_eq!(amx::enabled(), cpu && asked, "Linux refused the tile state?");
}

/// The kernels in use are the best the CPU has (unless `STRATA_ISA` asks for less); the run's
/// log says which, so a pasted run shows what it tested.
#[test]
fn the_best_kernels_the_cpu_has_are_in_use() {
    let (used, best) = (strata_kernels::isa::isa(), strata_kernels::isa::detected());
    eprintln!(
        "kernels in use: {} (the CPU's best: {})",
        used.name(),
        best.name()
    );
    if std::env::var("STRATA_ISA").is_err() {
        assert_eq!(used, best);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_kernels_equal_their_scalar_twins() {
    use strata_kernels::avx512;
    if strata_kernels::isa::detected() < strata_kernels::isa::Isa::Avx512 {
        eprintln!("no AVX-512 F on this CPU: its kernels are tested where it exists");
        return;
    }
    let mut rng = Rand(0x5120_0000_2026_1201);
    for case in 0..400 {
        let n = 1 + rng.below(1100);
        let x = rng.vec(n);
        let wf = rng.vec(n);
        let tol = bound(&wf, &x) + 1e-6;
        let label = |k: &str| format!("case {case}: {k} n={n}");
        assert_close(
            &label("f32"),
            avx512::dot_f32_entry(&wf, &x),
            dot::dot_f32_reference(&wf, &x) as f64,
            tol,
        );
        let wb: Vec<u16> = wf.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        assert_close(
            &label("bf16"),
            avx512::dot_bf16_entry(&wb, &x),
            dot::dot_bf16_reference(&wb, &x) as f64,
            tol,
        );
        let wh: Vec<u16> = wf.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect();
        assert_close(
            &label("f16"),
            avx512::dot_f16_entry(&wh, &x),
            dot::dot_f16_reference(&wh, &x) as f64,
            tol,
        );
        let wq: Vec<i8> = wf.iter().map(|v| (v * 127.0).round() as i8).collect();
        let scale = 0.01 + rng.f32().abs();
        let wq_f: Vec<f32> = wq.iter().map(|&q| q as f32 * scale).collect();
        assert_close(
            &label("int8"),
            avx512::dot_int8_entry(&wq, scale, &x),
            int8::dot_int8_reference(&wq, scale, &x) as f64,
            bound(&wq_f, &x) + 1e-6,
        );
        // FP8 against an activation scaled by its block scales (what `rows_fp8_prepared` runs),
        // blocks of any width.
        let block = [1 + rng.below(200), 128][rng.below(2)];
        let (codes, scales, dec) = fp8_row(&mut rng, n, block);
        let mut xs = Vec::new();
        fp8::scale_activation(&fp8::prepare(&x), &scales, block, &mut xs);
        assert_close(
            &label("fp8"),
            // SAFETY: AVX-512 F (with AVX2, FMA, F16C: `isa`) was detected above.
            unsafe { avx512::dot_fp8_scaled(&codes, &xs) },
            fp8::dot_fp8_reference(&codes, &scales, block, &x) as f64,
            2.0 * bound(&dec, &x) + 1e-6,
        );
    }
}

/// A one-token product of the dense formats and INT8 runs two rows per pass (AVX-512 and AVX2):
/// each row gets the bits of the one-row kernel in use (odd row counts, widths off the steps).
#[cfg(target_arch = "x86_64")]
#[test]
fn two_row_pass_gives_each_row_the_one_row_bits() {
    use strata_kernels::avx512;
    use strata_kernels::isa::{isa, Isa};
    type Rows = fn(&[f32], &[u16], &[u16], &[i8], f32, &[f32]) -> [f32; 4];
    let one_row: Rows = match isa() {
        Isa::Avx512 => |wf, wb, wh, wq, s, x| {
            [
                avx512::dot_f32_entry(wf, x),
                avx512::dot_bf16_entry(wb, x),
                avx512::dot_f16_entry(wh, x),
                avx512::dot_int8_entry(wq, s, x),
            ]
        },
        Isa::Avx2 => |wf, wb, wh, wq, s, x| {
            [
                dot::x86::dot_f32_avx2_entry(wf, x),
                dot::x86::dot_bf16_avx2_entry(wb, x),
                dot::x86::dot_f16_avx2_entry(wh, x),
                int8::x86::dot_int8_avx2_entry(wq, s, x),
            ]
        },
        _ => {
            eprintln!("no x86 SIMD kernels in use: the two-row pass is tested where they are");
            return;
        }
    };
    let mut rng = Rand(0x2a0f_0000_2026_1205);
    for case in 0..60 {
        let (rows, n) = (1 + rng.below(9), 1 + rng.below(1100));
        let x = rng.vec(n);
        let wf = rng.vec(rows * n);
        let wb: Vec<u16> = wf.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        let wh: Vec<u16> = wf.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect();
        let wq: Vec<i8> = wf.iter().map(|v| (v * 127.0).round() as i8).collect();
        let scales: Vec<f32> = (0..rows).map(|_| 0.01 + rng.f32().abs()).collect();
        let mut got = [
            vec![0f32; rows],
            vec![0f32; rows],
            vec![0f32; rows],
            vec![0f32; rows],
        ];
        dot::rows_f32_tokens(&wf, n, &[&x], &mut got[0]);
        dot::rows_bf16_tokens(&wb, n, &[&x], &mut got[1]);
        dot::rows_f16_tokens(&wh, n, &[&x], &mut got[2]);
        int8::rows_int8_tokens(&wq, &scales, n, &[&x], &mut got[3]);
        for r in 0..rows {
            let span = r * n..(r + 1) * n;
            let want = one_row(
                &wf[span.clone()],
                &wb[span.clone()],
                &wh[span.clone()],
                &wq[span],
                scales[r],
                &x,
            );
            for (k, name) in ["f32", "bf16", "f16", "int8"].iter().enumerate() {
                assert_eq!(
                    got[k][r].to_bits(),
                    want[k].to_bits(),
                    "case {case}: {name} row {r} of {rows}, n={n}"
                );
            }
        }
    }
}

/// The 4-bit kernels' AVX-512 VNNI steps (256-bit, and 512-bit with two blocks per step) sum
/// the same integers as their AVX2 one in the same order: the same bits, for one token and for
/// several, odd and even block counts, every scale kind (so a VNNI machine's output equals an
/// AVX2 machine's).
#[cfg(target_arch = "x86_64")]
#[test]
fn the_vnni_step_gives_the_avx2_bits() {
    use intdot::x86::{Scales, Step};
    eprintln!(
        "4-bit steps: VNNI {}, 512-bit {}",
        strata_kernels::isa::has_avx512_vnni(),
        strata_kernels::isa::has_avx512_vnni_bw()
    );
    if !strata_kernels::isa::has_avx512_vnni() {
        eprintln!("no AVX-512 VNNI in use on this CPU: its step is tested where it exists");
        return;
    }
    let mut rng = Rand(0x0DEF_2026_1201_0004);
    for case in 0..300 {
        // One token (decode) in half the cases.
        let rows = 1 + rng.below(11);
        let tokens = if case % 2 == 0 { 1 } else { 1 + rng.below(6) };
        let n = intdot::BLOCK * (1 + rng.below(16));
        let acts: Vec<intdot::IntAct> = (0..tokens)
            .map(|_| {
                let x = activation(&mut rng, n);
                intdot::prepare(&x, 8, 1.0)
            })
            .collect();
        let refs: Vec<&intdot::IntAct> = acts.iter().collect();
        let packed: Vec<u8> = (0..rows * n / 2).map(|_| rng.next() as u8).collect();
        let s16: Vec<u16> = (0..rows * n / 32)
            .map(|_| half::bf16::from_f32(rng.f32()).to_bits())
            .collect();
        let e8: Vec<u8> = (0..rows * n / 32).map(|_| 100 + rng.below(54) as u8).collect();
        let lut = mxfp4::INTDOT_LUT;
        let (scales, per_row, lut) = match case % 3 {
            0 => (Scales::Bf16Group32(&s16), n / 32, None),
            1 => (Scales::Bf16Wide(&s16, 6), n / 32, None),
            _ => (Scales::E8m0(&e8), n / 32, Some(&lut)),
        };
        let run = |step: Step| {
            let mut out = vec![0f32; rows * tokens];
            // SAFETY: VNNI (and so AVX2 and FMA) is in use on this CPU, and BW for `Wide`.
            unsafe {
                intdot::x86::dot_rows_with(step, &packed, n / 2, scales, per_row, lut, &refs, &mut out)
            };
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let avx2 = run(Step::Avx2);
        let what = format!("case {case}: {rows} rows, {tokens} tokens, n={n}");
        assert_eq!(run(Step::Vnni), avx2, "{what}");
        if strata_kernels::isa::has_avx512_vnni_bw() {
            // `prepare` pairs the blocks up for the 512-bit step (without, it takes 256 bits).
            assert!(acts.iter().all(|a| a.pairs.len() == a.blocks.len() / 2), "{what}");
            assert_eq!(run(Step::Wide), avx2, "{what}: the 512-bit step");
        }
    }
}

#[test]
fn attention_weighted_sums_equal_their_scalar_twin_bit_for_bit() {
    let mut rng = Rand(0xA77E_2026_1202_0001);
    common::weighted_sum_cases(&mut rng, 300, |dh, stride, n, got, want| {
        for (d, (g, r)) in got.iter().zip(want).enumerate() {
            assert_eq!(
                g.to_bits(),
                r.to_bits(),
                "dh {dh}, stride {stride}, {n} rows: output {d}"
            );
        }
    });
}
