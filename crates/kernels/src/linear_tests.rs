//! Tests of `linear.rs`: batch invariance of the several-token products and their task split.
use super::*;

/// An `out` x `inp` BF16 weight of fixed values in [-1, 1).
fn bf16_linear(out: usize, inp: usize) -> Linear {
    let w: Vec<u16> = (0..out * inp)
        .map(|i| half::bf16::from_f32(((i * 7919) % 1000) as f32 / 500.0 - 1.0).to_bits())
        .collect();
    Linear::new(out, inp, WeightData::Bf16(w.into()))
}

/// `tokens` activations of `inp` fixed values in [-0.5, 0.5).
fn activations(tokens: usize, inp: usize) -> Vec<f32> {
    (0..tokens * inp)
        .map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5)
        .collect()
}

#[test]
fn matmul_equals_per_token_matvec_bit_for_bit() {
    let (out, inp) = (300, 700);
    let lin = bf16_linear(out, inp);
    let xs = activations(3, inp);
    let mut ys = vec![0f32; 3 * out];
    lin.matmul(&xs, 3, &mut ys);
    for t in 0..3 {
        let mut y = vec![0f32; out];
        lin.matvec(&xs[t * inp..(t + 1) * inp], &mut y);
        assert_eq!(&ys[t * out..(t + 1) * out], &y[..], "token {t}");
    }
}

#[test]
fn products_split_into_row_and_token_blocks_keep_each_tokens_bits() {
    let (out, inp, n_tokens) = (77, 300, 21);
    let lin = bf16_linear(out, inp);
    let xs = activations(n_tokens, inp);
    let prepared: Vec<Prepared> = xs.chunks_exact(inp).map(|x| lin.prepare(x)).collect();
    let mut alone = vec![0f32; n_tokens * out];
    for t in 0..n_tokens {
        lin.matvec(&xs[t * inp..(t + 1) * inp], &mut alone[t * out..(t + 1) * out]);
    }
    for (rows, tokens) in [(16, 8), (32, 5), (64, 21), (128, 1)] {
        let mut ys = vec![f32::NAN; n_tokens * out];
        lin.matmul_tiled(&xs, n_tokens, &prepared, false, Tile { rows, tokens }, &mut ys);
        assert_eq!(ys, alone, "tiles of {rows} rows x {tokens} tokens");
    }
}

#[test]
fn tiles_fit_the_cache_and_leave_every_thread_work() {
    for (out, inp, tokens, threads) in [
        (4096, 2048, 512, 16),
        (768, 2048, 32, 16),
        (2048, 768, 32, 2),
        (7168, 7168, 512, 16),
        (16, 64, 3, 1),
        (151_936, 2048, 1, 16),
    ] {
        let t = tiles(out, inp, tokens, inp * 2, threads);
        assert!(t.rows >= ROWS_PER_TASK && t.rows.is_power_of_two(), "{t:?}");
        assert!(t.tokens >= 1 && t.tokens <= tokens, "{t:?}");
        let count = out.div_ceil(t.rows) * tokens.div_ceil(t.tokens);
        assert!(
            t.rows * inp * 2 <= TILE_WEIGHT_BYTES || t.rows == ROWS_PER_TASK,
            "{t:?}"
        );
        assert!(t.tokens * inp * 4 <= TILE_ACT_BYTES || t.tokens <= 8, "{t:?}");
        assert!(
            count >= 4 * threads || t.rows == ROWS_PER_TASK,
            "{out}x{inp}, {tokens}: {t:?}"
        );
        assert!(count >= threads || t.tokens <= 8, "{out}x{inp}, {tokens}: {t:?}");
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn amx_tasks_cover_the_product_and_share_it_out() {
    const PASS: usize = 2 * crate::amx::ROWS;
    for (out, blocks, threads) in [
        (768, 7, 16),
        (768, 1, 16),
        (2048, 103, 16),
        (4096, 103, 2),
        (576, 103, 16),
        (16, 3, 1),
        (151_936, 1, 16),
    ] {
        let (rows, per) = amx_task(out, blocks, threads);
        let case = format!("{out} rows, {blocks} blocks, {threads} threads: {rows} x {per}");
        assert!(
            rows.is_multiple_of(crate::amx::ROWS) && rows <= 8 * PASS,
            "{case}"
        );
        assert!(per.is_multiple_of(2) && per <= 32, "{case}");
        // Every thread gets work unless the tasks are as small as they go.
        let tasks = out.div_ceil(rows) * blocks.div_ceil(per);
        assert!(
            tasks >= 2 * threads || rows == crate::amx::ROWS || per == 2,
            "{case}"
        );
    }
}

#[test]
fn products_inside_the_kernels_tasks_keep_each_tokens_bits() {
    let (out, inp, n_tokens) = (200, 300, 40);
    let lin = bf16_linear(out, inp);
    let xs = activations(n_tokens, inp);
    let mut alone = vec![0f32; n_tokens * out];
    lin.matmul(&xs, n_tokens, &mut alone);
    // Each product inside a task of the kernels' threads, as a batch's experts run.
    let mut nested = vec![Vec::new(); 4];
    crate::for_each_chunk(&mut nested, 1, |i, ys| {
        let tokens = n_tokens - 3 * i;
        let mut y = vec![f32::NAN; tokens * out];
        lin.matmul(&xs[3 * i * inp..], tokens, &mut y);
        ys[0] = y;
    });
    for (i, y) in nested.iter().enumerate() {
        assert_eq!(y[..], alone[3 * i * out..], "the product from token {}", 3 * i);
    }
}
