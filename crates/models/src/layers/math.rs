//! Elementwise math in f32, computed the way the reference computes it.

/// Elements per task of the row-wise helpers below: a prompt's rows on the kernels' threads (a
/// serial pass over 512 tokens held every other core waiting), a lone token's on the caller's.
const ELEMS_PER_TASK: usize = 1 << 14;

/// Rows of `d` per task: at least one, about [`ELEMS_PER_TASK`] elements.
fn task_len(d: usize) -> usize {
    d.max(1) * (ELEMS_PER_TASK / d.max(1)).max(1)
}

/// RMSNorm of each row of `x` (rows of `w.len()`): `w * x / sqrt(mean(x^2) + eps)`.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    debug_assert_eq!(x.len() % d, 0);
    strata_kernels::for_each_chunk(x, task_len(d), |_, rows| rms_norm_rows(rows, w, eps));
}

/// Same as [`rms_norm`] into a new buffer.
pub fn rms_normed(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    let len = task_len(w.len());
    strata_kernels::for_each_chunk(&mut y, len, |i, rows| {
        rows.copy_from_slice(&x[i * len..i * len + rows.len()]);
        rms_norm_rows(rows, w, eps);
    });
    y
}

/// [`rms_norm`] of the rows of `x` on the calling thread.
fn rms_norm_rows(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for row in x.chunks_exact_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = g * (*v * inv);
        }
    }
}

pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The gated activation of a GLU MLP: `act(gate, up)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// SwiGLU: silu(g) * u.
    Silu,
    /// SiTU-GLU (Kimi K3): [beta tanh(g/beta) sigmoid(g)] * [linear_beta tanh(u/linear_beta)].
    Situ { beta: f32, linear_beta: f32 },
}

/// Elements per task of the elementwise activations ([`glu`], [`mul_sigmoid`]): a transcendental
/// or three per element (SiTU: two tanh and an exp), so a dense layer's 33,792 gates of one
/// token are 9 tasks (1.5 ms on one core of the 16-core host), a routed expert's 3072 one (its
/// own task already).
pub(crate) const ACT_PER_TASK: usize = 4096;

/// gate <- act(gate, up), in parts on the kernels' threads (elementwise: the same values).
pub fn glu(gate: &mut [f32], up: &[f32], act: Activation) {
    strata_kernels::for_each_chunk(gate, ACT_PER_TASK, |i, part| {
        glu_part(part, &up[i * ACT_PER_TASK..], act)
    });
}

/// `x <- x * sigmoid(gates)`, elementwise, in parts on the kernels' threads (an output gate).
pub fn mul_sigmoid(x: &mut [f32], gates: &[f32]) {
    assert_eq!(x.len(), gates.len());
    strata_kernels::for_each_chunk(x, ACT_PER_TASK, |i, part| {
        for (o, g) in part.iter_mut().zip(&gates[i * ACT_PER_TASK..]) {
            *o *= sigmoid(*g);
        }
    });
}

/// [`glu`] of `gate` and the start of `up` on the calling thread.
fn glu_part(gate: &mut [f32], up: &[f32], act: Activation) {
    match act {
        Activation::Silu => {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = silu(*g) * u;
            }
        }
        Activation::Situ { beta, linear_beta } => {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = (beta * (*g / beta).tanh() * sigmoid(*g)) * (linear_beta * (u / linear_beta).tanh());
            }
        }
    }
}

/// `acc += x`, elementwise (a prompt's in parts on the kernels' threads).
pub fn add_into(acc: &mut [f32], x: &[f32]) {
    strata_kernels::for_each_chunk(acc, ELEMS_PER_TASK, |i, part| {
        let from = i * ELEMS_PER_TASK;
        for (a, v) in part.iter_mut().zip(&x[from.min(x.len())..]) {
            *a += v;
        }
    });
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    strata_kernels::dot::dot_f32(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_in_parts_equal_one_pass_over_every_element() {
        let n = 3 * ACT_PER_TASK + 123; // parts and a short last one
        let x = |i: usize, k: f32| ((i as f32 * k).sin() * 9.0) - 1.5;
        let (g, u): (Vec<f32>, Vec<f32>) = (0..n).map(|i| (x(i, 0.37), x(i, 0.11))).unzip();
        for act in [
            Activation::Silu,
            Activation::Situ {
                beta: 4.0,
                linear_beta: 25.0,
            },
        ] {
            let (mut parts, mut whole) = (g.clone(), g.clone());
            glu(&mut parts, &u, act);
            glu_part(&mut whole, &u, act);
            assert!(
                parts.iter().zip(&whole).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{act:?}"
            );
        }
        let mut gated = g.clone();
        mul_sigmoid(&mut gated, &u);
        assert!(gated
            .iter()
            .zip(g.iter().zip(&u))
            .all(|(o, (v, s))| o.to_bits() == (v * sigmoid(*s)).to_bits()));
    }
}
