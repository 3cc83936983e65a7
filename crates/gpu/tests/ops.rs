//! The layer kernels (`Recorder`: RMSNorm, adds, gated activations, per-head norms with the
//! rotary embedding, causal attention, products and copies in one submission) against plain
//! CPU references, and attention's batch invariance. They need an adapter, as `matmul.rs` says.

use strata_gpu::{AttendShape, Glu, Rotation};

mod common;
use common::{gpu, Rng};

/// Every value of `got` within `tol` (relative to the largest |want|, at least 1) of `want`.
fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}: value {i}: GPU {g}, CPU {w}"
        );
    }
}

fn rms_norm_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let d = w.len();
    let mut y = x.to_vec();
    for row in y.chunks_exact_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = g * (*v * inv);
        }
    }
    y
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn norms_adds_and_activations_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(7);
    for (rows, dim) in [(1, 7), (3, 128), (5, 300), (2, 2048)] {
        let x = rng.f32s(rows * dim + 5);
        let w = rng.f32s(dim);
        let (xt, wt) = (g.upload_tensor(&x).unwrap(), g.upload_tensor(&w).unwrap());
        let y = g.tensor(rows * dim + 3).unwrap();
        let mut r = g.recorder();
        r.rms_norm(&xt, 5, &wt, &y, 3, rows, dim, 1e-6).unwrap();
        let got = r.finish(&[(&y, 3, rows * dim)]).unwrap();
        let want = rms_norm_ref(&x[5..], &w, 1e-6);
        close(&got[0], &want, 2e-6, &format!("RMSNorm {rows}x{dim}"));
    }
    for (n, period) in [(1000, 1000), (999, 37), (70000, 70000)] {
        let (a, b) = (rng.f32s(n), rng.f32s(period));
        let (at, bt) = (g.upload_tensor(&a).unwrap(), g.upload_tensor(&b).unwrap());
        let mut r = g.recorder();
        r.add(&at, n, &bt, period).unwrap();
        let got = r.finish(&[(&at, 0, n)]).unwrap();
        let want: Vec<f32> = a.iter().enumerate().map(|(i, v)| v + b[i % period]).collect();
        assert_eq!(got[0], want, "adds of {n} values, period {period}");
    }
    for act in [
        Glu::Silu,
        Glu::Situ {
            beta: 3.0,
            linear_beta: 10.0,
        },
    ] {
        let n = 5000;
        let (gate, up): (Vec<f32>, Vec<f32>) = (
            rng.f32s(n).iter().map(|v| v * 8.0).collect(),
            rng.f32s(n).iter().map(|v| v * 20.0).collect(),
        );
        let (gt, ut) = (g.upload_tensor(&gate).unwrap(), g.upload_tensor(&up).unwrap());
        let mut r = g.recorder();
        r.glu(&gt, &ut, n, act).unwrap();
        let got = r.finish(&[(&gt, 0, n)]).unwrap();
        let want: Vec<f32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| match act {
                Glu::Silu => g * sigmoid(g) * u,
                Glu::Situ { beta, linear_beta } => {
                    (beta * (g / beta).tanh() * sigmoid(g)) * (linear_beta * (u / linear_beta).tanh())
                }
            })
            .collect();
        close(&got[0], &want, 1e-5, &format!("{act:?}"));
    }
}

/// The rotation the CPU's `Rope::apply` does, for one head.
fn rotate(h: &mut [f32], cos: &[f32], sin: &[f32], interleaved: bool) {
    let half = cos.len();
    for i in 0..half {
        let (ia, ib) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
        let (a, b) = (h[ia], h[ib]);
        h[ia] = a * cos[i] - b * sin[i];
        h[ib] = b * cos[i] + a * sin[i];
    }
}

#[test]
fn head_norms_and_rotations_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(11);
    for (tokens, heads, dh, rope_dim, normed, interleaved) in [
        (1, 4, 64, 64, true, false),
        (3, 2, 128, 128, false, false),
        (5, 3, 192, 64, false, true),
        (2, 1, 576, 64, true, true),
    ] {
        let x = rng.f32s(tokens * heads * dh);
        let w = rng.f32s(dh);
        let half = rope_dim / 2;
        let table: Vec<f32> = (0..tokens)
            .flat_map(|t| {
                let angles: Vec<f32> = (0..half)
                    .map(|i| (t as f32 + 3.0) / (1.5f32).powi(i as i32))
                    .collect();
                let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
                let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
                [cos, sin].concat()
            })
            .collect();
        let (xt, wt, ct) = (
            g.upload_tensor(&x).unwrap(),
            g.upload_tensor(&w).unwrap(),
            g.upload_tensor(&table).unwrap(),
        );
        let mut r = g.recorder();
        // The norm over the whole head, the rotation of its last `rope_dim` values (its first
        // for full rotations, as GQA rotates; the tail, as MLA's keys and queries are).
        let norm = normed.then_some((&wt, dh, 1e-6f32));
        let offset = dh - rope_dim;
        let rope = Rotation {
            offset,
            dim: rope_dim,
            interleaved,
            cos_sin: &ct,
        };
        r.norm_rope(&xt, tokens, heads, dh, norm, Some(rope)).unwrap();
        let got = r.finish(&[(&xt, 0, x.len())]).unwrap();
        let mut want = x.clone();
        for (i, h) in want.chunks_exact_mut(dh).enumerate() {
            if normed {
                h.copy_from_slice(&rms_norm_ref(h, &w, 1e-6));
            }
            let t = i / heads;
            let cs = &table[t * rope_dim..(t + 1) * rope_dim];
            rotate(&mut h[offset..], &cs[..half], &cs[half..], interleaved);
        }
        close(
            &got[0],
            &want,
            3e-6,
            &format!("{tokens} tokens x {heads} heads of {dh}"),
        );
    }
}

/// Causal attention on the CPU: each query head of each new token against positions
/// `first..=own` of the caches.
fn attend_ref(q: &[f32], k: &[f32], v: &[f32], s: &AttendShape) -> Vec<f32> {
    let dh = s.head_dim;
    let mut out = vec![0f32; s.tokens * s.heads * s.value_dim];
    for i in 0..s.tokens {
        let n_pos = s.start_pos + i + 1;
        let first = s.window.map_or(0, |w| n_pos.saturating_sub(w));
        for h in 0..s.heads {
            let qh = &q[((s.row0 + i) * s.heads + h) * dh..][..dh];
            let col = (h / s.group) * dh;
            let vcol = (h / s.group) * s.value_dim;
            let scores: Vec<f32> = (first..n_pos)
                .map(|p| {
                    qh.iter()
                        .zip(&k[p * s.kv_width + col..])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * s.scale
                })
                .collect();
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = scores.iter().map(|x| (x - m).exp()).collect();
            let sum: f32 = e.iter().sum();
            let o = &mut out[(i * s.heads + h) * s.value_dim..][..s.value_dim];
            for (j, p) in (first..n_pos).enumerate() {
                for (d, od) in o.iter_mut().enumerate() {
                    *od += e[j] / sum * v[p * s.kv_width + vcol + d];
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_the_cpu_and_a_token_alone_its_batch() {
    let Some(mut g) = gpu() else { return };
    let full = g.max_binding();
    let mut rng = Rng(23);
    // (heads, group, dh, value dim, kv_width, start_pos, tokens, window): GQA groups, a KV row
    // wider than its heads, more than one chunk of positions, a sliding window, MLA's absorbed
    // form (every head on one row of [latent | rope key], its values the latent part; keys and
    // values one buffer); the tokens in blocks where one binding holds one token's splits only.
    for (case, (heads, group, dh, dv, kv_width, start_pos, tokens, window)) in [
        (4, 2, 64, 64, 128, 0, 5, None),
        (2, 1, 128, 128, 256, 300, 3, None),
        (8, 8, 32, 32, 40, 600, 2, Some(257)),
        (1, 1, 16, 16, 16, 0, 1, None),
        (4, 4, 72, 64, 72, 9, 3, None),
        (2, 1, 128, 128, 256, 300, 3, None),
    ]
    .into_iter()
    .enumerate()
    {
        g.set_max_binding(if case == 5 { 6000 } else { full });
        let positions = start_pos + tokens;
        let row0 = 2;
        let mla = dv != dh;
        let q: Vec<f32> = rng.f32s((row0 + tokens) * heads * dh);
        let k: Vec<f32> = rng.f32s(positions * kv_width).iter().map(|x| x * 3.0).collect();
        let v: Vec<f32> = if mla {
            k.clone()
        } else {
            rng.f32s(positions * kv_width)
        };
        let s = AttendShape {
            heads,
            group,
            head_dim: dh,
            value_dim: dv,
            kv_width,
            row0,
            tokens,
            start_pos,
            window,
            scale: 1.0 / (dh as f32).sqrt(),
        };
        let (qt, kt, vt) = (
            g.upload_tensor(&q).unwrap(),
            g.upload_tensor(&k).unwrap(),
            g.upload_tensor(&v).unwrap(),
        );
        let out = g.tensor((row0 + tokens) * heads * dv).unwrap();
        let mut r = g.recorder();
        let vt = if mla { &kt } else { &vt };
        r.attend(&out, &qt, &kt, vt, &s).unwrap();
        let row = heads * dv;
        let got = r.finish(&[(&out, row0 * row, tokens * row)]).unwrap();
        let want = attend_ref(&q, &k, &v, &s);
        close(&got[0], &want, 2e-5, &format!("attention {s:?}"));
        // Each token alone (its own dispatch, the cache as long as its position needs): the
        // same bits.
        for i in 0..tokens {
            let alone = AttendShape {
                row0: row0 + i,
                tokens: 1,
                start_pos: start_pos + i,
                ..s
            };
            let mut r = g.recorder();
            r.attend(&out, &qt, &kt, vt, &alone).unwrap();
            let one = r.finish(&[(&out, (row0 + i) * row, row)]).unwrap();
            assert_eq!(one[0], got[0][i * row..(i + 1) * row], "token {i} alone, {s:?}");
        }
    }
}

#[test]
fn products_copies_and_kernels_chain_in_one_submission() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(5);
    let (rows, in_dim, tokens) = (48, 40, 3);
    let w = rng.f32s(rows * in_dim);
    let m = g.upload_f32(&w, in_dim).unwrap();
    let x = rng.f32s(tokens * in_dim);
    let alone = g.matmul(&m, &x, tokens).unwrap();
    // y = W x; y += y0 (a copy of the first token's outputs, as a bias); read both.
    let xt = g.upload_tensor(&x).unwrap();
    let y = g.tensor(tokens * rows).unwrap();
    let first = g.tensor(rows).unwrap();
    let mut r = g.recorder();
    r.matmul(&m, &xt, tokens, &y).unwrap();
    r.copy(&y, 0, &first, 0, rows).unwrap();
    r.add(&y, tokens * rows, &first, rows).unwrap();
    let got = r.finish(&[(&y, 0, tokens * rows), (&first, 0, rows)]).unwrap();
    assert_eq!(got[1], alone[..rows], "the product's bits in a recorder");
    let want: Vec<f32> = alone
        .iter()
        .enumerate()
        .map(|(i, v)| v + alone[i % rows])
        .collect();
    assert_eq!(got[0], want);
    // Shapes a kernel cannot take are errors, not panics or bad reads.
    let mut r = g.recorder();
    assert!(r.add(&first, rows + 1, &y, 1).is_err());
    assert!(r.matmul(&m, &first, tokens, &y).is_err());
}

#[test]
fn routed_rows_gather_run_and_combine_like_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(31);
    let (tokens, dim, f) = (9, 300, 40);
    let x = rng.f32s(tokens * dim);
    let xt = g.upload_tensor(&x).unwrap();
    // Three experts in the order each token sums them, the second routed no token.
    let experts: [&[(usize, f32)]; 3] = [
        &[(7, 0.25), (2, -1.5), (5, 3.0)],
        &[],
        &[(2, 0.5), (0, 1.0), (8, -0.75), (7, 2.0)],
    ];
    let mats: Vec<_> = (0..3)
        .map(|_| g.upload_f32(&rng.f32s(f * dim), dim).unwrap())
        .collect();
    let mut r = g.recorder();
    let routing = r.routing(&experts, tokens).unwrap();
    let rows = routing.rows();
    assert_eq!(rows, 7);
    let xe = g.tensor(rows * dim).unwrap();
    r.gather_routed(&xt, &routing, dim, &xe).unwrap();
    // Each expert's product on its slice of the packed rows.
    let ye = g.tensor(rows * f).unwrap();
    for (i, m) in mats.iter().enumerate() {
        let (r0, n) = routing.expert(i);
        r.matmul_at(m, &xe, r0 * dim, n, &ye, r0 * f).unwrap();
    }
    let sum = g.upload_tensor(&rng.f32s(tokens * dim)).unwrap();
    r.combine(&sum, &xe, &routing, dim).unwrap();
    let gates = rng.f32s(tokens);
    let gt = g.upload_tensor(&gates).unwrap();
    let gated = g.upload_tensor(&x).unwrap();
    r.scale_sigmoid(&gated, &gt, tokens, dim).unwrap();
    let got = r
        .finish(&[
            (&xe, 0, rows * dim),
            (&ye, 0, rows * f),
            (&sum, 0, tokens * dim),
            (&gated, 0, tokens * dim),
        ])
        .unwrap();
    let row = |t: usize| x[t * dim..(t + 1) * dim].to_vec();
    let want_xe: Vec<f32> = experts
        .iter()
        .flat_map(|e| e.iter())
        .flat_map(|&(t, _)| row(t))
        .collect();
    assert_eq!(got[0], want_xe, "gathered rows");
    // A slice's product gives the bits of the same rows' product alone.
    for (i, m) in mats.iter().enumerate() {
        let (r0, n) = routing.expert(i);
        if n > 0 {
            let alone = g.matmul(m, &want_xe[r0 * dim..(r0 + n) * dim], n).unwrap();
            assert_eq!(&got[1][r0 * f..(r0 + n) * f], &alone[..], "expert {i}'s rows");
        }
    }
    // Each token's weighted rows in expert order, from zero (tokens no expert took: zero).
    let mut want_sum = vec![0f32; tokens * dim];
    for list in &experts {
        for &(t, w) in list.iter() {
            for i in 0..dim {
                want_sum[t * dim + i] += x[t * dim + i] * w;
            }
        }
    }
    close(&got[2], &want_sum, 1e-6, "combined rows");
    let want_gated: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, v)| v * sigmoid(gates[i / dim]))
        .collect();
    close(&got[3], &want_gated, 1e-6, "rows gated");
    // Rows past the batch and tensors too short are errors.
    let mut r = g.recorder();
    assert!(
        r.routing(&[&[(tokens, 1.0)]], tokens).is_err(),
        "a row past the batch"
    );
    let short = g.tensor(dim).unwrap();
    assert!(
        r.gather_routed(&short, &routing, dim, &xe).is_err(),
        "a short source"
    );
    assert!(
        r.gather_routed(&xt, &routing, dim, &short).is_err(),
        "a short destination"
    );
    assert!(r.combine(&short, &xe, &routing, dim).is_err(), "short sums");
    assert!(
        r.combine(&sum, &short, &routing, dim).is_err(),
        "short expert rows"
    );
}

#[test]
fn per_head_products_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(41);
    // An absorbed MLA query: per head 40 outputs from the first 24 of 30 inputs, the other 6
    // copied after them; a plain per-head product; and rows over ten workgroups.
    for (tokens, heads, rows, cols, xs, extra) in [
        (3, 4, 40, 24, 30, 6),
        (2, 3, 17, 33, 33, 0),
        (2, 2, 150, 40, 44, 4),
    ] {
        let ys = rows + extra;
        let m = rng.f32s(heads * rows * cols);
        let x = rng.f32s(tokens * heads * xs);
        let (mt, xt) = (g.upload_tensor(&m).unwrap(), g.upload_tensor(&x).unwrap());
        let y = g.tensor(tokens * heads * ys).unwrap();
        let mut r = g.recorder();
        r.head_matvec(&mt, &xt, &y, tokens, heads, (rows, cols), (xs, ys), extra)
            .unwrap();
        let got = r.finish(&[(&y, 0, tokens * heads * ys)]).unwrap();
        let mut want = vec![0f32; tokens * heads * ys];
        for th in 0..tokens * heads {
            let h = th % heads;
            let xr = &x[th * xs..(th + 1) * xs];
            for rr in 0..rows {
                let mr = &m[(h * rows + rr) * cols..][..cols];
                want[th * ys + rr] = mr.iter().zip(xr).map(|(a, b)| a * b).sum();
            }
            want[th * ys + rows..(th + 1) * ys].copy_from_slice(&xr[cols..cols + extra]);
        }
        close(&got[0], &want, 2e-6, &format!("per-head {rows}x{cols}"));
    }
}
