//! The kernels `isa()` picks against their scalar twins, every case on the main thread (a
//! `harness = false` target, no thread pool): under qemu-user, where guest threads hang, this is
//! how the NEON kernels are tested (`../shared/tools/aarch64-test.sh -p strata-kernels --release
//! --test neon`); natively it checks the x86 variants the same way. For random shapes (lengths off
//! the vector width, the FP8 block and the 4-bit block) each format's kernel equals its scalar
//! twin within the tolerance of a reordered f32 sum (`simd_vs_reference.rs` explains the bounds),
//! and several tokens through the rows-and-tokens kernels give each token, bit for bit, what it
//! gets alone.

use strata_kernels::{dot, fp8, ggml, int4, int8, intdot, isa, mxfp4, q8_0};

mod common;
use common::Rand;

/// A length: mostly short and off every width, sometimes a few thousand.
fn len(rng: &mut Rand) -> usize {
    match rng.below(4) {
        0 => rng.below(20),
        1 => 1 + rng.below(200),
        2 => 16 * (1 + rng.below(40)) + rng.below(16),
        _ => 1000 + rng.below(3000),
    }
}

/// 4 n eps sum|w x| (a reordered f32 sum of n products) plus a hair.
fn bound(w: &[f32], x: &[f32]) -> f64 {
    let mag: f64 = w.iter().zip(x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
    4.0 * w.len() as f64 * f64::from(f32::EPSILON) * mag + 1e-30
}

fn close(what: &str, got: f32, want: f32, tol: f64) {
    let diff = (got as f64 - want as f64).abs();
    assert!(diff <= tol, "{what}: {got} vs {want} (|diff| {diff} > {tol})");
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
    }
}

/// `rows` rows x `tokens` tokens through `together` against `alone` per token, bit for bit.
fn tokens_alone(
    what: &str,
    rows: usize,
    xs: &[Vec<f32>],
    together: impl Fn(&[&[f32]], &mut [f32]),
    alone: impl Fn(usize, &[f32]) -> f32,
) {
    let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
    let mut out = vec![0f32; rows * xs.len()];
    together(&refs, &mut out);
    let want: Vec<f32> = (0..rows)
        .flat_map(|r| xs.iter().map(move |x| (r, x)))
        .map(|(r, x)| alone(r, x))
        .collect();
    same_bits(what, &out, &want);
}

fn dense(rng: &mut Rand) {
    for case in 0..120 {
        let n = len(rng);
        let x = rng.vec(n);
        let w = rng.vec(n);
        let wb: Vec<u16> = w.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        let wh: Vec<u16> = w.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect();
        let wi: Vec<i8> = (0..n).map(|_| rng.next() as i8).collect();
        let scale = rng.f32() * 1e-2;
        let dec_b: Vec<f32> = wb.iter().map(|v| dot::bf16_to_f32(*v)).collect();
        let dec_h: Vec<f32> = wh.iter().map(|v| half::f16::from_bits(*v).to_f32()).collect();
        let dec_i: Vec<f32> = wi.iter().map(|v| *v as f32 * scale).collect();
        let what = |f: &str| format!("case {case} {f} n={n}");
        close(
            &what("f32"),
            dot::dot_f32(&w, &x),
            dot::dot_f32_reference(&w, &x),
            bound(&w, &x),
        );
        close(
            &what("bf16"),
            dot::dot_bf16(&wb, &x),
            dot::dot_bf16_reference(&wb, &x),
            bound(&dec_b, &x),
        );
        close(
            &what("f16"),
            dot::dot_f16(&wh, &x),
            dot::dot_f16_reference(&wh, &x),
            bound(&dec_h, &x),
        );
        close(
            &what("int8"),
            int8::dot_int8(&wi, scale, &x),
            int8::dot_int8_reference(&wi, scale, &x),
            bound(&dec_i, &x),
        );
    }
    // F16's edges: subnormals, the largest normal, infinities and NaN widen exactly.
    let edges: Vec<u16> = vec![0x0001, 0x03ff, 0x0400, 0x7bff, 0x8001, 0xfbff, 0x3c00, 0xbc00];
    for (i, &h) in edges.iter().enumerate() {
        let mut w = vec![0u16; 16];
        w[i] = h;
        let mut x = vec![0f32; 16];
        x[i] = 1.0;
        let want = half::f16::from_bits(h).to_f32();
        assert_eq!(
            dot::dot_f16(&w, &x).to_bits(),
            want.to_bits(),
            "f16 code {h:#06x}"
        );
    }
    for h in [0x7c00u16, 0xfc00, 0x7e00] {
        let mut w = vec![0u16; 16];
        w[3] = h;
        let got = dot::dot_f16(&w, &[1.0; 16]);
        let want = half::f16::from_bits(h).to_f32();
        assert!(
            got == want || (got.is_nan() && want.is_nan()),
            "f16 code {h:#06x}: {got}"
        );
    }
}

fn dense_tokens(rng: &mut Rand) {
    for case in 0..40 {
        let (rows, n, tokens) = (1 + rng.below(9), len(rng).max(1), 1 + rng.below(9));
        let xs: Vec<Vec<f32>> = (0..tokens).map(|_| rng.vec(n)).collect();
        let w = rng.vec(rows * n);
        let wb: Vec<u16> = w.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        let wh: Vec<u16> = w.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect();
        let wi: Vec<i8> = (0..rows * n).map(|_| rng.next() as i8).collect();
        let scales: Vec<f32> = (0..rows).map(|_| rng.f32()).collect();
        let row = |r: usize| r * n..(r + 1) * n;
        let what = |f: &str| format!("case {case} {f} {rows}x{n}, {tokens} tokens");
        tokens_alone(
            &what("f32"),
            rows,
            &xs,
            |x, o| dot::rows_f32_tokens(&w, n, x, o),
            |r, x| dot::dot_f32(&w[row(r)], x),
        );
        tokens_alone(
            &what("bf16"),
            rows,
            &xs,
            |x, o| dot::rows_bf16_tokens(&wb, n, x, o),
            |r, x| dot::dot_bf16(&wb[row(r)], x),
        );
        tokens_alone(
            &what("f16"),
            rows,
            &xs,
            |x, o| dot::rows_f16_tokens(&wh, n, x, o),
            |r, x| dot::dot_f16(&wh[row(r)], x),
        );
        tokens_alone(
            &what("int8"),
            rows,
            &xs,
            |x, o| int8::rows_int8_tokens(&wi, &scales, n, x, o),
            |r, x| int8::dot_int8(&wi[row(r)], scales[r], x),
        );
    }
}

fn fp8_rows(rng: &mut Rand) {
    for case in 0..120 {
        let n = len(rng);
        let block = [1 + rng.below(40), 16, 32, 128][rng.below(4)];
        let x = rng.vec(n);
        let w: Vec<u8> = (0..n)
            .map(|_| loop {
                let b = rng.next() as u8;
                if b & 0x7f != 0x7f {
                    break b; // NaN codes never occur in checkpoints
                }
            })
            .collect();
        let scales: Vec<f32> = (0..n.div_ceil(block)).map(|_| rng.f32() * 1e-2).collect();
        let dec: Vec<f32> = (0..n)
            .map(|j| fp8::e4m3_to_f32(w[j]) * scales[j / block])
            .collect();
        close(
            &format!("case {case} fp8 n={n} block={block}"),
            fp8::dot_fp8(&w, &scales, block, &x),
            fp8::dot_fp8_reference(&w, &scales, block, &x),
            bound(&dec, &x),
        );
    }
    // Every code but NaN decodes exactly (subnormals, both signs, the largest).
    for b in 0..=255u8 {
        if b & 0x7f == 0x7f {
            continue;
        }
        let mut w = vec![0u8; 32];
        w[5] = b;
        let mut x = vec![0f32; 32];
        x[5] = 1.0;
        let got = fp8::dot_fp8(&w, &[1.0], 32, &x);
        assert!(got == fp8::e4m3_to_f32(b), "e4m3 code {b:#04x}: {got}"); // -0 == 0
    }
}

/// One 4-bit row: weights as unsigned bytes, the scale of each 32 inputs, and the kernel's
/// scales argument.
struct Row4 {
    packed: Vec<u8>,
    values: Vec<u8>,
    half_scales: Vec<f32>,
    s16: Vec<u16>,
    e8: Vec<u8>,
    shift: u32,
    kind: usize,
}

impl Row4 {
    fn random(rng: &mut Rand, n: usize, kind: usize) -> Row4 {
        let packed: Vec<u8> = (0..n / 2).map(|_| rng.next() as u8).collect();
        let nibble = |j: usize| (packed[j / 2] >> (4 * (j % 2))) & 0xf;
        let shift = 6 + rng.below(3) as u32;
        let (mut s16, mut e8) = (Vec::new(), Vec::new());
        let (values, half_scales): (Vec<u8>, Vec<f32>) = match kind {
            0 => {
                s16 = (0..n / 32)
                    .map(|_| half::bf16::from_f32(rng.f32()).to_bits())
                    .collect();
                (
                    (0..n).map(nibble).collect(),
                    s16.iter().map(|s| dot::bf16_to_f32(*s)).collect(),
                )
            }
            1 => {
                s16 = (0..n.div_ceil(1 << shift))
                    .map(|_| half::bf16::from_f32(rng.f32()).to_bits())
                    .collect();
                let hs = (0..n / 32)
                    .map(|h| dot::bf16_to_f32(s16[(32 * h) >> shift]))
                    .collect();
                ((0..n).map(nibble).collect(), hs)
            }
            _ => {
                e8 = (0..n / 32)
                    .map(|_| match rng.below(10) {
                        0 => 0,
                        _ => 100 + rng.below(40) as u8,
                    })
                    .collect();
                let lut = mxfp4::INTDOT_LUT;
                let hs = e8.iter().map(|e| mxfp4::e8m0_to_f32(*e)).collect();
                ((0..n).map(|j| lut[nibble(j) as usize]).collect(), hs)
            }
        };
        Row4 {
            packed,
            values,
            half_scales,
            s16,
            e8,
            shift,
            kind,
        }
    }

    fn scales(&self) -> intdot::Scales<'_> {
        match self.kind {
            0 => intdot::Scales::Bf16Group32(&self.s16),
            1 => intdot::Scales::Bf16Wide(&self.s16, self.shift),
            _ => intdot::Scales::E8m0(&self.e8),
        }
    }

    fn lut(&self) -> Option<&'static [u8; 16]> {
        (self.kind == 2).then_some(&mxfp4::INTDOT_LUT)
    }

    fn per_row(&self) -> usize {
        if self.kind == 2 {
            self.e8.len()
        } else {
            self.s16.len()
        }
    }
}

/// On aarch64 with the dot-product instructions: the `sdot` step gives the plain NEON step's
/// bits for one to five tokens (the second to fifth are the first scaled).
#[cfg(target_arch = "aarch64")]
fn same_steps(row: &Row4, n: usize, x: &[f32], offset: i32, factor: f32, what: &str) {
    use strata_kernels::neon_intdot::{dot_rows_with, Step};
    if !std::arch::is_aarch64_feature_detected!("dotprod") {
        return;
    }
    let acts: Vec<intdot::IntAct> = (0..5)
        .map(|t| {
            let xt: Vec<f32> = x.iter().map(|v| v * (1.0 + t as f32 * 0.37)).collect();
            let mut a = intdot::prepare_reference(&xt, offset, factor);
            a.dot_bytes();
            a
        })
        .collect();
    for tokens in 1..=acts.len() {
        let refs: Vec<&intdot::IntAct> = acts[..tokens].iter().collect();
        let run = |step| {
            let mut out = vec![0f32; tokens];
            // SAFETY: NEON is on every aarch64 CPU; dotprod was detected above.
            unsafe {
                dot_rows_with(
                    step,
                    &row.packed,
                    n / 2,
                    row.scales(),
                    row.per_row(),
                    row.lut(),
                    &refs,
                    &mut out,
                )
            };
            out
        };
        same_bits(
            &format!("{what} sdot step, {tokens} tokens"),
            &run(Step::Dotprod),
            &run(Step::Neon),
        );
    }
}

fn four_bit(rng: &mut Rand) {
    if !intdot::simd() {
        println!("no SIMD integer kernel on this CPU: the 4-bit formats run their f32 twins");
        return;
    }
    for case in 0..150 {
        let n = intdot::BLOCK * (1 + rng.below(24));
        let row = Row4::random(rng, n, case % 3);
        let (offset, factor) = if row.kind == 2 { (12, 0.5) } else { (8, 1.0) };
        let x: Vec<f32> = rng
            .vec(n)
            .iter()
            .map(|v| v * [1.0, 1e-3, 40.0][rng.below(3)])
            .collect();
        let a = intdot::prepare(&x, offset, factor);
        let mut got = [0f32];
        intdot::dot_rows(
            &row.packed,
            n / 2,
            row.scales(),
            row.per_row(),
            row.lut(),
            &[&a],
            &mut got,
        );
        #[cfg(target_arch = "aarch64")]
        same_steps(
            &row,
            n,
            &x,
            offset,
            factor,
            &format!("case {case} kind {}", row.kind),
        );
        let want = intdot::dot_reference(&row.values, &row.half_scales, &a);
        // The same integer sums; only the order of the f32 steps differs.
        let mag: f64 = (0..n / 32)
            .map(|h| {
                let s: f64 = (32 * h..32 * h + 32)
                    .map(|j| (row.values[j] as f64 * intdot::units_at(&a, j)).abs())
                    .sum();
                (s + 12.0 * 32.0 * 32640.0)
                    * 256.0
                    * (a.step_of(32 * h) as f64 * row.half_scales[h] as f64).abs()
            })
            .sum();
        close(
            &format!("case {case} 4-bit kind {} n={n}", row.kind),
            got[0],
            want,
            1e-5 * mag + 1e-30,
        );
    }
    // Several rows and tokens: each token's bits as alone, through the formats' entry points
    // (the tail past whole blocks included).
    for case in 0..30 {
        let (rows, tokens) = (1 + rng.below(6), 1 + rng.below(9));
        let n = intdot::BLOCK * (1 + rng.below(8)) + [0, 8, 40][rng.below(3)];
        let xs: Vec<Vec<f32>> = (0..tokens).map(|_| rng.vec(n)).collect();
        let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
        let words = n.div_ceil(8);
        let packed: Vec<u32> = (0..rows * words).map(|_| rng.next() as u32).collect();
        let scales: Vec<u16> = (0..rows * n.div_ceil(32))
            .map(|_| half::bf16::from_f32(rng.f32() * 0.1).to_bits())
            .collect();
        let acts: Vec<Option<intdot::IntAct>> = xs.iter().map(|x| int4::prepare(x, 32)).collect();
        let ps: Vec<Option<&intdot::IntAct>> = acts.iter().map(|a| a.as_ref()).collect();
        let mut together = vec![0f32; rows * tokens];
        int4::rows_int4_tokens(&packed, &scales, 32, &refs, &ps, 0, &mut together);
        for t in 0..tokens {
            let mut alone = vec![0f32; rows];
            int4::rows_int4_prepared(&packed, &scales, 32, &xs[t], ps[t], 0, &mut alone);
            for r in 0..rows {
                assert_eq!(
                    together[r * tokens + t].to_bits(),
                    alone[r].to_bits(),
                    "case {case} int4 {rows}x{n}: row {r} token {t}"
                );
            }
        }
        let bytes = n.div_ceil(2);
        let mx: Vec<u8> = (0..rows * bytes).map(|_| rng.next() as u8).collect();
        let e8: Vec<u8> = (0..rows * n.div_ceil(32))
            .map(|_| 110 + rng.below(30) as u8)
            .collect();
        let acts: Vec<Option<intdot::IntAct>> = xs.iter().map(|x| mxfp4::prepare(x)).collect();
        let ps: Vec<Option<&intdot::IntAct>> = acts.iter().map(|a| a.as_ref()).collect();
        mxfp4::rows_mxfp4_tokens(&mx, &e8, &refs, &ps, 0, &mut together);
        for t in 0..tokens {
            let mut alone = vec![0f32; rows];
            mxfp4::rows_mxfp4_prepared(&mx, &e8, &xs[t], ps[t], 0, &mut alone);
            for r in 0..rows {
                assert_eq!(
                    together[r * tokens + t].to_bits(),
                    alone[r].to_bits(),
                    "case {case} mxfp4 {rows}x{n}: row {r} token {t}"
                );
            }
        }
    }
}

/// GGUF's block types and Q8_0: rows against their scalar twins within the reordered-sum bound,
/// several tokens against each token alone bit for bit.
fn gguf_blocks(rng: &mut Rand) {
    for case in 0..48 {
        let (rows, n) = (1 + rng.below(4), 256 * (1 + rng.below(4)));
        let xs: Vec<Vec<f32>> = (0..1 + rng.below(6)).map(|_| rng.vec(n)).collect();
        let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
        let ty = ggml::ALL[case % ggml::ALL.len()];
        let w = ty.random_blocks(rows * n / ty.block(), || rng.next());
        let rb = ty.row_bytes(n);
        let mut decoded = vec![0f32; n];
        for (r, row) in w.chunks_exact(rb).enumerate() {
            let mut got = [0f32];
            ggml::rows_tokens(ty, row, rb, &[refs[0]], &mut got);
            for (j, v) in decoded.iter_mut().enumerate() {
                *v = ty.weight(row, j);
            }
            let what = format!("case {case} {} {rows}x{n} row {r}", ty.name());
            close(
                &what,
                got[0],
                ggml::dot_reference(ty, row, refs[0]),
                bound(&decoded, refs[0]),
            );
        }
        tokens_alone(
            &format!("case {case} {} tokens", ty.name()),
            rows,
            &xs,
            |xs, out| ggml::rows_tokens(ty, &w, rb, xs, out),
            |r, x| {
                let mut y = [0f32];
                ggml::rows_tokens(ty, &w[r * rb..(r + 1) * rb], rb, &[x], &mut y);
                y[0]
            },
        );
        // Q8_0: the same rows as random 34-byte blocks.
        let qb = q8_0::row_bytes(n);
        let q = ggml::BlockType::Q4_0.random_blocks(rows * n / 32 * 2, || rng.next());
        let q: Vec<u8> = q.chunks_exact(36).flat_map(|c| c[..34].to_vec()).collect();
        for (r, row) in q.chunks_exact(qb).enumerate() {
            let mut got = [0f32];
            q8_0::rows_tokens(row, qb, &[refs[0]], &mut got);
            for (j, v) in decoded.iter_mut().enumerate() {
                *v = q8_0::weight(row, j);
            }
            let what = format!("case {case} Q8_0 {rows}x{n} row {r}");
            close(
                &what,
                got[0],
                q8_0::dot_q8_0_reference(row, refs[0]),
                bound(&decoded, refs[0]),
            );
        }
        tokens_alone(
            &format!("case {case} Q8_0 tokens"),
            rows,
            &xs,
            |xs, out| q8_0::rows_tokens(&q, qb, xs, out),
            |r, x| {
                let mut y = [0f32];
                q8_0::rows_tokens(&q[r * qb..(r + 1) * qb], qb, &[x], &mut y);
                y[0]
            },
        );
    }
}

/// A named group of cases.
type Case = (&'static str, fn(&mut Rand));

/// The value side of attention against its scalar twin, bit for bit, over head widths and
/// row strides off the vector widths.
fn weighted_sums(rng: &mut Rand) {
    common::weighted_sum_cases(rng, 200, |_, _, _, got, want| {
        same_bits("weighted sum", got, want)
    });
}

fn main() {
    // `cargo test -- FILTER` passes a filter; these cases are one unit.
    println!(
        "kernels in use: {} (cpu's best: {})",
        isa::isa().name(),
        isa::detected().name()
    );
    #[cfg(target_arch = "aarch64")]
    println!(
        "4-bit step: {:?} (the sdot step is checked against the plain one where the CPU has it)",
        strata_kernels::neon_intdot::Step::best()
    );
    let mut rng = Rand(0x0A64_2026_1201_0001);
    let cases: [Case; 6] = [
        ("dense and int8 rows equal their scalar twins", dense),
        ("dense and int8 tokens equal each token alone", dense_tokens),
        ("fp8 rows equal their scalar twin", fp8_rows),
        (
            "4-bit rows equal their integer twin; tokens equal each alone",
            four_bit,
        ),
        ("attention's weighted sums equal their scalar twin", weighted_sums),
        (
            "gguf block types and q8_0 rows equal their scalar twins; tokens equal each alone",
            gguf_blocks,
        ),
    ];
    for (name, case) in cases {
        case(&mut rng);
        println!("ok: {name}");
    }
}
