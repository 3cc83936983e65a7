//! GGUF's Q8_0: each row is blocks of 32 weights, a block 34 bytes: an F16 scale `d`, then 32
//! signed bytes `q`; weight j of the block is `d * q[j]`. The kernels decode inside the dot
//! product: per block, the 32 products in f32 lanes, then the block's sum times `d`.
//!
//! Batch invariance: a row times several tokens converts each block's bytes once for all of them
//! and gives every token's sum in exactly the steps of a one-token call.

use std::sync::OnceLock;

/// Weights per block.
pub const BLOCK: usize = 32;
/// Bytes per block: the F16 scale, then 32 signed bytes.
pub const BLOCK_BYTES: usize = 34;

fn scale(block: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32()
}

/// Bytes of a row of `in_dim` weights (`in_dim` a multiple of 32).
pub fn row_bytes(in_dim: usize) -> usize {
    in_dim / BLOCK * BLOCK_BYTES
}

/// Weight j of a row.
pub fn weight(row: &[u8], j: usize) -> f32 {
    let b = &row[j / BLOCK * BLOCK_BYTES..];
    scale(b) * b[2 + j % BLOCK] as i8 as f32
}

/// Scalar reference: one row (`row_bytes(x.len())` bytes) times x.
pub fn dot_q8_0_reference(row: &[u8], x: &[f32]) -> f32 {
    assert!(x.len().is_multiple_of(BLOCK) && row.len() >= row_bytes(x.len()));
    let mut total = 0f32;
    for (b, xs) in x.chunks_exact(BLOCK).enumerate() {
        let block = &row[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
        let mut s = 0f32;
        for (j, &xv) in xs.iter().enumerate() {
            s += block[2 + j] as i8 as f32 * xv;
        }
        total += scale(block) * s;
    }
    total
}

type RowsTokens = fn(&[u8], usize, &[&[f32]], &mut [f32]);

/// Rows of `row_bytes` bytes each times tokens `xs` (all of one length, a multiple of 32):
/// `out[i * T + t]` is row i times token t.
pub fn rows_tokens(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    static IMPL: OnceLock<RowsTokens> = OnceLock::new();
    (IMPL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if crate::isa::isa() == crate::isa::Isa::Avx512 && crate::dot::has_avx2_fma_f16c() {
            return x86::rows_tokens_avx512_entry;
        }
        #[cfg(target_arch = "x86_64")]
        if crate::dot::has_avx2_fma_f16c() && crate::isa::isa() != crate::isa::Isa::Scalar {
            return x86::rows_tokens_entry;
        }
        #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
        if crate::isa::isa() == crate::isa::Isa::Neon {
            return crate::ggml_neon::q8_0_rows_tokens;
        }
        rows_tokens_reference
    }))(rows, row_bytes, xs, out)
}

/// Scalar twin of [`rows_tokens`], row by row and token by token.
pub fn rows_tokens_reference(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let tokens = xs.len();
    for (i, o) in out.chunks_exact_mut(tokens).enumerate() {
        let row = &rows[i * row_bytes..(i + 1) * row_bytes];
        for (t, x) in xs.iter().enumerate() {
            o[t] = dot_q8_0_reference(row, x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2+FMA+F16C: per block, the scale through `vcvtph2ps`, the 32 bytes sign-extended and
    //! converted 8 at a time, four multiply-adds into the block's sum, one more for the scale.
    use std::arch::x86_64::*;

    use super::{BLOCK, BLOCK_BYTES};

    pub fn rows_tokens_entry(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
        // SAFETY: selected only when AVX2, FMA and F16C were detected.
        unsafe { rows_tokens(rows, row_bytes, xs, out) }
    }

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rows_tokens(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
        let tokens = xs.len();
        assert!(tokens > 0 && out.len().is_multiple_of(tokens));
        let n = xs[0].len();
        assert!(n.is_multiple_of(BLOCK) && xs.iter().all(|x| x.len() == n));
        assert!(row_bytes >= super::row_bytes(n) && rows.len() >= out.len() / tokens * row_bytes);
        for (i, o) in out.chunks_exact_mut(tokens).enumerate() {
            let row = rows.as_ptr().add(i * row_bytes);
            let mut t = 0;
            while t < tokens {
                let group = &xs[t..(t + 4).min(tokens)];
                let dst = &mut o[t..t + group.len()];
                match group.len() {
                    1 => dst.copy_from_slice(&row_n::<1>(row, n, [group[0]])),
                    2 => dst.copy_from_slice(&row_n::<2>(row, n, group.try_into().unwrap())),
                    3 => dst.copy_from_slice(&row_n::<3>(row, n, group.try_into().unwrap())),
                    _ => dst.copy_from_slice(&row_n::<4>(row, n, group.try_into().unwrap())),
                }
                t += group.len();
            }
        }
    }

    /// One row of `n` weights times N tokens: each block decoded once for all of them, every
    /// token's sum in the one-token steps (two accumulators, even and odd blocks).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row_n<const N: usize>(row: *const u8, n: usize, xs: [&[f32]; N]) -> [f32; N] {
        let blocks = n / BLOCK;
        let (mut t0, mut t1) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
        for b in 0..blocks {
            let p = row.add(b * BLOCK_BYTES);
            crate::dot::x86::prefetch(p);
            let d = _mm256_cvtph_ps(_mm_set1_epi16((p as *const i16).read_unaligned()));
            let q = p.add(2);
            let w: [__m256; 4] = std::array::from_fn(|k| {
                let bytes = _mm_loadl_epi64(q.add(8 * k) as *const __m128i);
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))
            });
            for t in 0..N {
                let x = xs[t].as_ptr().add(b * BLOCK);
                let mut s = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
                s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x.add(8)), s);
                s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x.add(16)), s);
                s = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x.add(24)), s);
                if b % 2 == 0 {
                    t0[t] = _mm256_fmadd_ps(s, d, t0[t]);
                } else {
                    t1[t] = _mm256_fmadd_ps(s, d, t1[t]);
                }
            }
        }
        crate::dot::hsum256_n(&std::array::from_fn(|t| _mm256_add_ps(t0[t], t1[t])))
    }

    pub fn rows_tokens_avx512_entry(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
        // SAFETY: selected only where the kernels in use are AVX-512 (F and BW detected) and
        // AVX2, FMA and F16C were detected.
        unsafe { rows_tokens_avx512(rows, row_bytes, xs, out) }
    }

    /// [`rows_tokens`] with 512-bit vectors: a block's 32 bytes converted as two vectors of 16;
    /// two rows x up to 4 tokens per pass (a last odd row: up to 8 tokens), every token's sum in
    /// the one-token steps.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, FMA and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn rows_tokens_avx512(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
        let tokens = xs.len();
        assert!(tokens > 0 && out.len().is_multiple_of(tokens));
        let n = xs[0].len();
        assert!(n.is_multiple_of(BLOCK) && xs.iter().all(|x| x.len() == n));
        assert!(row_bytes >= super::row_bytes(n) && rows.len() >= out.len() / tokens * row_bytes);
        let n_rows = out.len() / tokens;
        // With several tokens, rows in pairs, each activation vector loaded once for both (a
        // prompt's activations come from L2, and one row per pass was bound by that traffic); a
        // last odd row alone. One token (decode, bound by the weights' stream) takes one row per
        // pass. A row's bits are the same either way.
        let paired = if tokens > 1 { n_rows / 2 * 2 } else { 0 };
        for i in (0..paired).step_by(2) {
            let (ra, rb) = (
                rows.as_ptr().add(i * row_bytes),
                rows.as_ptr().add((i + 1) * row_bytes),
            );
            let (oa, ob) = out[i * tokens..(i + 2) * tokens].split_at_mut(tokens);
            let mut t = 0;
            while t < tokens {
                let group = &xs[t..(t + 4).min(tokens)];
                let m = group.len();
                let (da, db) = (&mut oa[t..t + m], &mut ob[t..t + m]);
                let put = |(a, b): (&[f32], &[f32]), da: &mut [f32], db: &mut [f32]| {
                    da.copy_from_slice(a);
                    db.copy_from_slice(b);
                };
                match m {
                    1 => {
                        let (a, b) = rows2_n512::<1>(ra, rb, n, [group[0]]);
                        put((&a, &b), da, db)
                    }
                    2 => {
                        let (a, b) = rows2_n512::<2>(ra, rb, n, group.try_into().unwrap());
                        put((&a, &b), da, db)
                    }
                    3 => {
                        let (a, b) = rows2_n512::<3>(ra, rb, n, group.try_into().unwrap());
                        put((&a, &b), da, db)
                    }
                    _ => {
                        let (a, b) = rows2_n512::<4>(ra, rb, n, group.try_into().unwrap());
                        put((&a, &b), da, db)
                    }
                }
                t += m;
            }
        }
        for (i, o) in out.chunks_exact_mut(tokens).enumerate().skip(paired) {
            let row = rows.as_ptr().add(i * row_bytes);
            let mut t = 0;
            while t < tokens {
                let group = &xs[t..(t + 8).min(tokens)];
                let dst = &mut o[t..t + group.len()];
                match group.len() {
                    1 => dst.copy_from_slice(&row_n512::<1>(row, n, [group[0]])),
                    2 => dst.copy_from_slice(&row_n512::<2>(row, n, group.try_into().unwrap())),
                    3 => dst.copy_from_slice(&row_n512::<3>(row, n, group.try_into().unwrap())),
                    4 => dst.copy_from_slice(&row_n512::<4>(row, n, group.try_into().unwrap())),
                    5 => dst.copy_from_slice(&row_n512::<5>(row, n, group.try_into().unwrap())),
                    6 => dst.copy_from_slice(&row_n512::<6>(row, n, group.try_into().unwrap())),
                    7 => dst.copy_from_slice(&row_n512::<7>(row, n, group.try_into().unwrap())),
                    _ => dst.copy_from_slice(&row_n512::<8>(row, n, group.try_into().unwrap())),
                }
                t += group.len();
            }
        }
    }

    /// Two rows times N tokens: for each row and token exactly the operations of [`row_n512`]
    /// (so the same bits), each activation vector loaded once for both rows.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn rows2_n512<const N: usize>(
        ra: *const u8,
        rb: *const u8,
        n: usize,
        xs: [&[f32]; N],
    ) -> ([f32; N], [f32; N]) {
        let blocks = n / BLOCK;
        let z = _mm512_setzero_ps();
        let (mut a0, mut a1, mut b0, mut b1) = ([z; N], [z; N], [z; N], [z; N]);
        let decode = |p: *const u8| -> (__m512, [__m512; 2]) {
            let d = _mm512_cvtph_ps(_mm256_set1_epi16((p as *const i16).read_unaligned()));
            let q = p.add(2);
            let w = std::array::from_fn(|k| {
                let bytes = _mm_loadu_si128(q.add(16 * k) as *const __m128i);
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes))
            });
            (d, w)
        };
        for b in 0..blocks {
            let (pa, pb) = (ra.add(b * BLOCK_BYTES), rb.add(b * BLOCK_BYTES));
            crate::dot::x86::prefetch(pa);
            crate::dot::x86::prefetch(pb);
            let ((da, wa), (db, wb)) = (decode(pa), decode(pb));
            for t in 0..N {
                let x = xs[t].as_ptr().add(b * BLOCK);
                let (x0, x1) = (_mm512_loadu_ps(x), _mm512_loadu_ps(x.add(16)));
                let sa = _mm512_fmadd_ps(wa[1], x1, _mm512_mul_ps(wa[0], x0));
                let sb = _mm512_fmadd_ps(wb[1], x1, _mm512_mul_ps(wb[0], x0));
                if b % 2 == 0 {
                    a0[t] = _mm512_fmadd_ps(sa, da, a0[t]);
                    b0[t] = _mm512_fmadd_ps(sb, db, b0[t]);
                } else {
                    a1[t] = _mm512_fmadd_ps(sa, da, a1[t]);
                    b1[t] = _mm512_fmadd_ps(sb, db, b1[t]);
                }
            }
        }
        (
            std::array::from_fn(|t| _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t]))),
            std::array::from_fn(|t| _mm512_reduce_add_ps(_mm512_add_ps(b0[t], b1[t]))),
        )
    }

    /// One row of `n` weights times N tokens with 512-bit vectors (two accumulators per token,
    /// even and odd blocks, as in [`row_n`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn row_n512<const N: usize>(row: *const u8, n: usize, xs: [&[f32]; N]) -> [f32; N] {
        let blocks = n / BLOCK;
        let (mut t0, mut t1) = ([_mm512_setzero_ps(); N], [_mm512_setzero_ps(); N]);
        for b in 0..blocks {
            let p = row.add(b * BLOCK_BYTES);
            crate::dot::x86::prefetch(p);
            let d = _mm512_cvtph_ps(_mm256_set1_epi16((p as *const i16).read_unaligned()));
            let q = p.add(2);
            let w: [__m512; 2] = std::array::from_fn(|k| {
                let bytes = _mm_loadu_si128(q.add(16 * k) as *const __m128i);
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes))
            });
            for t in 0..N {
                let x = xs[t].as_ptr().add(b * BLOCK);
                let s = _mm512_mul_ps(w[0], _mm512_loadu_ps(x));
                let s = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x.add(16)), s);
                if b % 2 == 0 {
                    t0[t] = _mm512_fmadd_ps(s, d, t0[t]);
                } else {
                    t1[t] = _mm512_fmadd_ps(s, d, t1[t]);
                }
            }
        }
        std::array::from_fn(|t| _mm512_reduce_add_ps(_mm512_add_ps(t0[t], t1[t])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_rows(rows: usize, n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut out = Vec::new();
        for _ in 0..rows * n / BLOCK {
            let d = half::f16::from_f32((next() % 1000) as f32 / 1e5).to_bits();
            out.extend(d.to_le_bytes());
            out.extend((0..BLOCK).map(|_| next() as u8));
        }
        out
    }

    #[test]
    fn weights_decode_as_scale_times_byte() {
        let row = random_rows(1, 64, 7);
        let d = half::f16::from_bits(u16::from_le_bytes([row[34], row[35]])).to_f32();
        assert_eq!(weight(&row, 33), d * row[37] as i8 as f32);
        let x: Vec<f32> = (0..64).map(|j| if j == 33 { 1.0 } else { 0.0 }).collect();
        assert_eq!(dot_q8_0_reference(&row, &x), weight(&row, 33));
    }

    /// The kernels this CPU can run: the scalar twin, and the AVX2 and AVX-512 ones where it has
    /// them.
    fn kernels() -> Vec<(&'static str, RowsTokens)> {
        let mut all: Vec<(&'static str, RowsTokens)> = vec![("scalar", rows_tokens_reference)];
        #[cfg(target_arch = "x86_64")]
        {
            if crate::dot::has_avx2_fma_f16c() {
                all.push(("avx2", x86::rows_tokens_entry));
            }
            if crate::isa::detected() == crate::isa::Isa::Avx512 && crate::dot::has_avx2_fma_f16c() {
                all.push(("avx512", x86::rows_tokens_avx512_entry));
            } else {
                eprintln!("no AVX-512 on this CPU: its Q8_0 kernel is tested where it exists");
            }
        }
        all
    }

    #[test]
    fn several_tokens_give_each_token_alone_bit_for_bit() {
        let (rows, n) = (5, 96);
        let w = random_rows(rows, n, 11);
        // More tokens than one pass of any kernel takes (4 or 8), and a remainder.
        let xs: Vec<Vec<f32>> = (0..19)
            .map(|t| {
                (0..n)
                    .map(|j| ((j * 7 + t * 13) % 17) as f32 / 17.0 - 0.5)
                    .collect()
            })
            .collect();
        let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
        for (name, kernel) in kernels() {
            let mut all = vec![0f32; rows * refs.len()];
            kernel(&w, row_bytes(n), &refs, &mut all);
            for (t, x) in refs.iter().enumerate() {
                let mut one = vec![0f32; rows];
                kernel(&w, row_bytes(n), &[x], &mut one);
                for i in 0..rows {
                    assert_eq!(
                        all[i * refs.len() + t].to_bits(),
                        one[i].to_bits(),
                        "{name}: row {i} token {t}"
                    );
                    let want = dot_q8_0_reference(&w[i * row_bytes(n)..], x);
                    assert!(
                        (one[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{name}: row {i}: {} vs {want}",
                        one[i]
                    );
                }
            }
        }
    }
}
