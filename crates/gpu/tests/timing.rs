//! With `STRATA_PROFILE=1`, a submission's ops are timed on the GPU where the adapter writes
//! timestamps inside compute passes: the profile gets a row per kind of op, and the results keep
//! their bits. Needs an adapter, as `matmul.rs` says.

mod common;
use common::{gpu, Rng};

#[test]
fn timed_ops_land_in_the_profile_and_keep_their_bits() {
    // This binary's only test: the profile reads the variable once per process.
    std::env::set_var("STRATA_PROFILE", "1");
    let Some(g) = gpu() else { return };
    let mut rng = Rng(77);
    let (tokens, in_dim, rows) = (3, 96, 40);
    let w = rng.f32s(rows * in_dim);
    let m = g.upload_f32(&w, in_dim).unwrap();
    let x = rng.f32s(tokens * in_dim);
    let alone = g.matmul(&m, &x, tokens).unwrap();
    let before = strata_kernels::profile::snapshot();
    let xt = g.upload_tensor(&x).unwrap();
    let y = g.tensor(tokens * rows).unwrap();
    let norm = g.tensor(tokens * in_dim).unwrap();
    let ones = g.upload_tensor(&vec![1.0; in_dim]).unwrap();
    let mut r = g.recorder();
    r.matmul(&m, &xt, tokens, &y).unwrap();
    r.rms_norm(&xt, 0, &ones, &norm, 0, tokens, in_dim, 1e-6).unwrap();
    let got = r.finish(&[(&y, 0, tokens * rows)]).unwrap();
    assert_eq!(got[0], alone, "a timed product's bits");
    let rows_now = strata_kernels::profile::between(&before, &strata_kernels::profile::snapshot());
    let timed: Vec<&str> = rows_now
        .iter()
        .map(|(k, _)| k.what.as_str())
        .filter(|w| w.starts_with("GPU time: "))
        .collect();
    if g.times_ops() {
        assert!(timed.contains(&"GPU time: rms_norm"), "{timed:?}");
        assert!(
            timed.iter().any(|w| w.starts_with("GPU time: product F32 ")),
            "{timed:?}"
        );
    } else {
        eprintln!(
            "{} writes no timestamps inside passes: nothing timed",
            g.adapter()
        );
        assert!(timed.is_empty(), "{timed:?}");
    }
}
