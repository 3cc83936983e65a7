//! Integer-domain products for GGUF's Q4_K, Q5_K and Q6_K (the types of Q4_K_M and Q5_K_M).
//!
//! Their weights are small unsigned codes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63) times a scale per
//! sub-block, minus a min (Q4_K, Q5_K) or 32 steps (Q6_K). So, as for the 4-bit formats
//! ([`crate::intdot`]), the activation is put once per token into integers: per 32 inputs with
//! step s, input i is s * (q + r / 256), q in 16 bits and r in 8 (24 significant bits, those of
//! an f32; the same values [`crate::intdot::prepare`] gives). The products of the codes with
//! `256 q + r` are summed exactly in integers per lane of 4 inputs, then scaled in f32 by the
//! sub-block's scale times the step; the mins (and Q6_K's 32) are taken out once per sub-block
//! against the sum of its inputs.
//!
//! Here the activation is laid out for codes in input order ([`Chunk`]: per 64 inputs, the q of
//! the even inputs, of the odd ones, and every r), which is how the K-quants' bytes unpack: a
//! code in the high byte of a 16-bit lane multiplies q (`vpdpwssd`), the code as a byte
//! multiplies r (`vpdpbusd`), and 32-bit lane L sums inputs 4L..4L+4 in both.
//!
//! Accuracy: the weights are exact; each input moves by at most 1/512 of its step (6e-8 of the
//! largest |x| among its 32). [`dot_reference`] computes the same integers in scalar code;
//! [`crate::ggml::dot_reference`] stays the f32 truth the property tests compare to.

use crate::ggml::BlockType;
use crate::intdot::{self, BLOCK};

/// 64 inputs of a prepared activation: 192 bytes, three cache lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Chunk {
    /// q of inputs 0, 2, 4, ... 62.
    pub qe: [i16; 32],
    /// q of inputs 1, 3, 5, ... 63.
    pub qo: [i16; 32],
    /// r of inputs 0..64.
    pub r: [i8; 64],
}

/// An activation prepared for the K-quant kernels (whole blocks of 256 inputs).
pub struct KAct {
    pub chunks: Vec<Chunk>,
    /// Per 32 inputs: the step over 256 (a sum of code x (256 q + r) times it is code x input).
    pub steps: Vec<f32>,
    /// Per 16 inputs: their sum as prepared ((256 q + r) summed in integers, times the step).
    pub sums16: Vec<f32>,
    /// Per 32 inputs, likewise.
    pub sums32: Vec<f32>,
}

impl KAct {
    /// Input j in 1/256 steps: 256 q + r.
    pub fn units(&self, j: usize) -> i32 {
        let c = &self.chunks[j / BLOCK];
        let i = j % BLOCK;
        let q = if i.is_multiple_of(2) {
            c.qe[i / 2]
        } else {
            c.qo[i / 2]
        };
        256 * q as i32 + c.r[i] as i32
    }
}

/// Whether `ty` has a kernel here.
pub fn handles(ty: BlockType) -> bool {
    matches!(ty, BlockType::Q4K | BlockType::Q5K | BlockType::Q6K)
}

/// Whether this CPU runs these kernels (x86-64 with AVX2, FMA and F16C among the kernels in
/// use); elsewhere the K-quants take the f32 kernels of [`crate::ggml`], as they do everywhere
/// with `STRATA_KQUANT_INT=0` (to compare the two on one machine).
pub fn simd() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if std::env::var("STRATA_KQUANT_INT").as_deref() != Ok("0") {
            return crate::dot::has_avx2_fma_f16c();
        }
        false
    })
}

/// Whether [`rows_tokens`] takes its AVX-512 kernel (F/BW/VL with VNNI; the same bits as the
/// AVX2 one).
pub fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::isa::has_avx512_vnni() && std::is_x86_feature_detected!("avx512bw");
    #[allow(unreachable_code)]
    false
}

/// Bytes per super-block of Q4_K, Q5_K and Q6_K (a SIMD kernel's `KIND` 0, 1, 2).
pub(crate) const SUPER_BYTES: [usize; 3] = [144, 176, 210];

/// Per token of a SIMD kernel's pass: its chunks, its steps, and the sums its kind subtracts
/// offsets from (per 16 inputs for Q6_K, `KIND` 2; per 32 for the others).
#[inline(always)]
pub(crate) fn token_ptrs<const KIND: u8, const N: usize>(
    acts: [&KAct; N],
) -> ([*const Chunk; N], [*const f32; N], [*const f32; N]) {
    let chunks = acts.map(|a| a.chunks.as_ptr());
    let steps = acts.map(|a| a.steps.as_ptr());
    let sums = acts.map(|a| {
        if KIND == 2 {
            a.sums16.as_ptr()
        } else {
            a.sums32.as_ptr()
        }
    });
    (chunks, steps, sums)
}

/// Q4_K's and Q5_K's eight 6-bit scales and eight mins from their 12 bytes at `sc`, as eight
/// bytes each (sub-block s in byte s): the same values as [`crate::ggml_decode::scale_min_k4`],
/// four at a time. Sub-blocks 0-3: the low six bits of bytes 0-3 (scales) and 4-7 (mins);
/// sub-blocks 4-7: the nibbles of bytes 8-11 below the top two bits of bytes 0-3 (scales) and
/// 4-7 (mins).
///
/// # Safety
/// `sc` must be valid for 12 bytes.
#[inline(always)]
pub(crate) unsafe fn k4_scale_bytes(sc: *const u8) -> (u64, u64) {
    let w0 = (sc as *const u32).read_unaligned();
    let w1 = (sc.add(4) as *const u32).read_unaligned();
    let w2 = (sc.add(8) as *const u32).read_unaligned();
    let (six, four, two) = (0x3F3F_3F3Fu32, 0x0F0F_0F0Fu32, 0x0303_0303u32);
    let scales = (w0 & six) as u64 | ((((w2 & four) | (((w0 >> 6) & two) << 4)) as u64) << 32);
    let mins = (w1 & six) as u64 | (((((w2 >> 4) & four) | (((w1 >> 6) & two) << 4)) as u64) << 32);
    (scales, mins)
}

/// The rows-by-tokens loop of a SIMD kernel file, over its `row_n::<KIND, N>` (up to four
/// tokens per pass), with the target features given: `rows_tokens` and `rows_of`.
macro_rules! rows_loop {
    ($features:literal) => {
        /// # Safety
        /// The CPU must have the features this file's kernels are built for; the shapes are as
        /// [`crate::kquant::rows_tokens`] checks them.
        pub unsafe fn rows_tokens(
            ty: BlockType,
            rows: &[u8],
            row_bytes: usize,
            acts: &[&KAct],
            out: &mut [f32],
        ) {
            match ty {
                BlockType::Q4K => rows_of::<0>(rows, row_bytes, acts, out),
                BlockType::Q5K => rows_of::<1>(rows, row_bytes, acts, out),
                BlockType::Q6K => rows_of::<2>(rows, row_bytes, acts, out),
                _ => unreachable!("not a K-quant with a kernel here"),
            }
        }

        #[target_feature(enable = $features)]
        unsafe fn rows_of<const KIND: u8>(rows: &[u8], row_bytes: usize, acts: &[&KAct], out: &mut [f32]) {
            let tokens = acts.len();
            let blocks = acts[0].steps.len() / 8;
            for (i, o) in out.chunks_exact_mut(tokens).enumerate() {
                let row = rows.as_ptr().add(i * row_bytes);
                let mut t = 0;
                while t < tokens {
                    let g = &acts[t..(t + 4).min(tokens)];
                    let dst = &mut o[t..t + g.len()];
                    match g.len() {
                        1 => dst.copy_from_slice(&row_n::<KIND, 1>(row, blocks, [g[0]])),
                        2 => dst.copy_from_slice(&row_n::<KIND, 2>(row, blocks, [g[0], g[1]])),
                        3 => dst.copy_from_slice(&row_n::<KIND, 3>(row, blocks, [g[0], g[1], g[2]])),
                        _ => dst.copy_from_slice(&row_n::<KIND, 4>(row, blocks, [g[0], g[1], g[2], g[3]])),
                    }
                    t += g.len();
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(crate) use rows_loop;

/// Prepares `x` (a multiple of 256 inputs) for the kernels of this module.
pub fn prepare(x: &[f32]) -> KAct {
    assert!(
        x.len().is_multiple_of(256),
        "K-quant rows are whole blocks of 256"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::dot::has_avx2_fma_f16c() {
        // SAFETY: AVX2 and FMA were detected.
        return lay_out(&unsafe { intdot::x86::prepare_avx2(x, 0, 1.0) });
    }
    lay_out(&intdot::prepare_reference(x, 0, 1.0))
}

/// The blocks of [`intdot`]'s preparation (offset 0, factor 1) in this module's order.
fn lay_out(a: &intdot::IntAct) -> KAct {
    let blocks = a.blocks.len();
    let mut k = KAct {
        chunks: Vec::with_capacity(blocks),
        steps: Vec::with_capacity(2 * blocks),
        sums16: Vec::with_capacity(4 * blocks),
        sums32: Vec::with_capacity(2 * blocks),
    };
    for b in &a.blocks {
        // intdot's slots: q of input 4w + k at 16 k + w, r of input 2j + e at 32 e + j.
        let mut c = Chunk {
            qe: [0; 32],
            qo: [0; 32],
            r: [0; 64],
        };
        for w in 0..16 {
            c.qe[2 * w] = b.q[w];
            c.qe[2 * w + 1] = b.q[32 + w];
            c.qo[2 * w] = b.q[16 + w];
            c.qo[2 * w + 1] = b.q[48 + w];
        }
        for j in 0..32 {
            c.r[2 * j] = b.r[j];
            c.r[2 * j + 1] = b.r[32 + j];
        }
        let mut units = [0i32; 4];
        for (m, u) in units.iter_mut().enumerate() {
            let q: i32 = (8 * m..8 * m + 8).map(|w| c.qe[w] as i32 + c.qo[w] as i32).sum();
            let r: i32 = c.r[16 * m..16 * m + 16].iter().map(|&v| v as i32).sum();
            *u = 256 * q + r;
        }
        k.chunks.push(c);
        for half in 0..2 {
            let step = b.step[4 * half];
            let (u0, u1) = (units[2 * half], units[2 * half + 1]);
            k.steps.push(step);
            k.sums16.push(u0 as f32 * step);
            k.sums16.push(u1 as f32 * step);
            k.sums32.push((u0 + u1) as f32 * step);
        }
    }
    k
}

/// Code of weight j (0..256) of a Q4_K, Q5_K or Q6_K block (unsigned: Q6_K's weight is
/// d x scale x (code - 32)).
fn code_of(ty: BlockType, b: &[u8], j: usize) -> u8 {
    match ty {
        BlockType::Q4K => (b[16 + j / 64 * 32 + j % 32] >> (4 * (j / 32 % 2))) & 0xF,
        BlockType::Q5K => {
            let low = (b[48 + j / 64 * 32 + j % 32] >> (4 * (j / 32 % 2))) & 0xF;
            low | (((b[16 + j % 32] >> (j / 32)) & 1) << 4)
        }
        BlockType::Q6K => {
            let (h, k, e) = (j / 128, j % 128 / 32, j % 32);
            let low = (b[64 * h + 32 * (k % 2) + e] >> (4 * (k / 2))) & 0xF;
            low | (((b[128 + 32 * h + e] >> (2 * k)) & 3) << 4)
        }
        _ => unreachable!("not a K-quant with a kernel here"),
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Scalar twin of the SIMD kernels: one row of `ty` (whole blocks) times a prepared
/// activation. The same integer sums (per sub-block here, per lane there), then in f32: each
/// sub-block's sum times its scale and step, and the offsets against the prepared input sums.
pub fn dot_reference(ty: BlockType, row: &[u8], a: &KAct) -> f32 {
    assert!(handles(ty));
    let (mut total, mut offsets) = (0f32, 0f32);
    let bytes = ty.block_bytes();
    for sb in 0..a.steps.len() / 8 {
        let b = &row[sb * bytes..(sb + 1) * bytes];
        let per = if ty == BlockType::Q6K { 16 } else { 32 };
        for s in 0..256 / per {
            let mut sum = 0i64;
            for e in 0..per {
                let j = s * per + e;
                sum += code_of(ty, b, j) as i64 * a.units(sb * 256 + j) as i64;
            }
            let g = sb * 8 + s * per / 32;
            let (scale, coefficient, input_sum) = match ty {
                BlockType::Q6K => {
                    let dl = f16_at(b, 208) * (b[192 + s] as i8) as f32;
                    (dl, 32.0 * dl, a.sums16[sb * 16 + s])
                }
                _ => {
                    let (sc, m) = crate::ggml_decode::scale_min_k4(&b[4..16], s);
                    (f16_at(b, 0) * sc as f32, f16_at(b, 2) * m as f32, a.sums32[g])
                }
            };
            total += scale * (sum as f32 * a.steps[g]);
            offsets += coefficient * input_sum;
        }
    }
    total - offsets
}

/// Row i (`row_bytes` apart in `rows`) times token t's prepared activation into
/// `out[i * T + t]`, T = `acts.len()`: the SIMD kernel where [`simd`] holds, else the scalar
/// twin. Every token's sum takes the steps of a one-token call.
pub fn rows_tokens(ty: BlockType, rows: &[u8], row_bytes: usize, acts: &[&KAct], out: &mut [f32]) {
    let tokens = acts.len();
    assert!(handles(ty) && tokens > 0 && out.len().is_multiple_of(tokens));
    let blocks = acts[0].steps.len() / 8;
    assert!(acts
        .iter()
        .all(|a| a.steps.len() == 8 * blocks && a.chunks.len() == 4 * blocks));
    let n_rows = out.len() / tokens;
    assert!(row_bytes >= blocks * ty.block_bytes());
    assert!(n_rows == 0 || rows.len() >= (n_rows - 1) * row_bytes + blocks * ty.block_bytes());
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: `avx512()` found AVX-512 F/BW/VL/VNNI; the shapes are checked above.
        return unsafe { crate::kquant_avx512::rows_tokens(ty, rows, row_bytes, acts, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: `simd()` found AVX2, FMA and F16C; the shapes are checked above.
        return unsafe { crate::kquant_avx2::rows_tokens(ty, rows, row_bytes, acts, out) };
    }
    for (i, o) in out.chunks_exact_mut(tokens).enumerate() {
        for (t, a) in acts.iter().enumerate() {
            o[t] = dot_reference(ty, &rows[i * row_bytes..], a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    fn activation(n: usize, seed: u64) -> Vec<f32> {
        let mut next = rand(seed);
        (0..n)
            .map(|j| {
                let v = (next() % 20_001) as f32 / 10_000.0 - 1.0;
                // Groups of very different sizes, and a group of zeros.
                if j / 32 % 5 == 3 {
                    v * 1e-3
                } else if j / 32 % 7 == 6 {
                    0.0
                } else {
                    v * (1 + j / 256) as f32
                }
            })
            .collect()
    }

    /// |true dot| error allowed: the f32 sums' rounding plus the prepared inputs' rounding
    /// (1/512 of a step, a step being max|x| / 32512 of its 32 inputs).
    fn bound(ty: BlockType, row: &[u8], x: &[f32]) -> f64 {
        let mut e = 0f64;
        for (g, xs) in x.chunks(32).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            for (k, v) in xs.iter().enumerate() {
                let w = ty.weight(row, 32 * g + k).abs() as f64;
                e += w * (amax / 32512.0 / 400.0 + 1e-6 * v.abs() as f64);
            }
        }
        e + 1e-30
    }

    #[test]
    fn the_scalar_twin_is_the_decoded_row_times_the_activation() {
        for ty in [BlockType::Q4K, BlockType::Q5K, BlockType::Q6K] {
            for (case, n) in [256usize, 512, 1024, 2048].into_iter().enumerate() {
                let row = ty.random_blocks(n / 256, rand(11 + case as u64));
                let x = activation(n, 3 + case as u64);
                let a = prepare(&x);
                assert_eq!(a.steps.len(), n / 32);
                let got = dot_reference(ty, &row, &a) as f64;
                let want: f64 = (0..n).map(|j| ty.weight(&row, j) as f64 * x[j] as f64).sum();
                let err = (got - want).abs();
                assert!(err <= bound(ty, &row, &x), "{} n {n}: {got} vs {want}", ty.name());
            }
        }
    }

    #[test]
    fn the_layout_holds_the_prepared_inputs() {
        let x = activation(512, 9);
        let a = prepare(&x);
        for (j, v) in x.iter().enumerate() {
            let got = a.units(j) as f64 * a.steps[j / 32] as f64;
            let amax = x[j / 32 * 32..j / 32 * 32 + 32]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            assert!(
                (got - *v as f64).abs() <= amax as f64 / 32512.0 / 500.0 + 1e-12,
                "input {j}"
            );
        }
        // The sums are the prepared inputs' sums.
        for g in 0..16 {
            let units: i64 = (32 * g..32 * g + 32).map(|j| a.units(j) as i64).sum();
            assert_eq!(a.sums32[g], units as f32 * a.steps[g]);
        }
    }

    #[test]
    fn the_kernel_gives_its_twin_s_sums_and_each_token_alone_the_same_bits() {
        if !simd() {
            eprintln!("no AVX2 here: the K-quants take the f32 kernels");
            return;
        }
        for ty in [BlockType::Q4K, BlockType::Q5K, BlockType::Q6K] {
            for (case, (n, rows, tokens)) in [(256, 3, 1), (512, 5, 6), (1024, 2, 4), (2304, 7, 3)]
                .into_iter()
                .enumerate()
            {
                let rb = ty.row_bytes(n) + 16 * (case % 2); // rows apart by more than their bytes too
                let mut w = vec![0u8; rows * rb];
                let blocks = ty.random_blocks(rows * n / 256, rand(21 + case as u64));
                for (i, row) in blocks.chunks_exact(ty.row_bytes(n)).enumerate() {
                    w[i * rb..i * rb + row.len()].copy_from_slice(row);
                }
                let xs: Vec<Vec<f32>> = (0..tokens).map(|t| activation(n, 40 + t as u64)).collect();
                let acts: Vec<KAct> = xs.iter().map(|x| prepare(x)).collect();
                let refs: Vec<&KAct> = acts.iter().collect();
                let mut all = vec![0f32; rows * tokens];
                rows_tokens(ty, &w, rb, &refs, &mut all);
                for (t, a) in refs.iter().enumerate() {
                    let mut one = vec![0f32; rows];
                    rows_tokens(ty, &w, rb, &[a], &mut one);
                    for i in 0..rows {
                        let name = ty.name();
                        assert_eq!(
                            all[i * tokens + t].to_bits(),
                            one[i].to_bits(),
                            "{name} row {i} token {t}"
                        );
                        let row = &w[i * rb..];
                        let twin = dot_reference(ty, row, a) as f64;
                        let want: f64 = (0..n).map(|j| ty.weight(row, j) as f64 * xs[t][j] as f64).sum();
                        let b = bound(ty, row, &xs[t]);
                        assert!(
                            (one[i] as f64 - twin).abs() <= b,
                            "{name} row {i}: {} vs twin {twin}",
                            one[i]
                        );
                        assert!(
                            (one[i] as f64 - want).abs() <= b,
                            "{name} row {i}: {} vs {want}",
                            one[i]
                        );
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_kernel_gives_the_avx512_kernel_s_bits() {
        if !avx512() {
            eprintln!("no AVX-512 VNNI/BW here: nothing to compare the AVX2 kernel with");
            return;
        }
        for ty in [BlockType::Q4K, BlockType::Q5K, BlockType::Q6K] {
            for (case, (n, rows, tokens)) in [(256, 3, 1), (768, 4, 5), (2048, 3, 2)].into_iter().enumerate()
            {
                let rb = ty.row_bytes(n);
                let w = ty.random_blocks(rows * n / 256, rand(61 + case as u64));
                let xs: Vec<Vec<f32>> = (0..tokens).map(|t| activation(n, 70 + t as u64)).collect();
                let acts: Vec<KAct> = xs.iter().map(|x| prepare(x)).collect();
                let refs: Vec<&KAct> = acts.iter().collect();
                let (mut wide, mut narrow) = (vec![0f32; rows * tokens], vec![0f32; rows * tokens]);
                // SAFETY: `avx512()` found AVX-512 F/BW/VL/VNNI (and so AVX2, FMA, F16C); the
                // shapes are whole rows and tokens.
                unsafe {
                    crate::kquant_avx512::rows_tokens(ty, &w, rb, &refs, &mut wide);
                    crate::kquant_avx2::rows_tokens(ty, &w, rb, &refs, &mut narrow);
                }
                for (i, (a, b)) in wide.iter().zip(&narrow).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{} n {n} output {i}: {a} vs {b}",
                        ty.name()
                    );
                }
            }
        }
    }
}
