//! What the kernel tests share.

/// A xorshift generator: deterministic pseudo-random cases.
pub struct Rand(pub u64);

impl Rand {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// Random cases of attention's weighted sum (head widths and row strides off the vector
/// widths): `check(dh, stride, rows, got, want)` with the SIMD result and its scalar twin's.
pub fn weighted_sum_cases(rng: &mut Rand, cases: usize, check: impl Fn(usize, usize, usize, &[f32], &[f32])) {
    for _ in 0..cases {
        let dh = 1 + rng.below(200);
        let stride = dh + rng.below(40);
        let n = rng.below(90);
        let w = rng.vec(n);
        let values = rng.vec(n.saturating_sub(1) * stride + dh);
        let (mut got, mut want) = (vec![0f32; dh], vec![1f32; dh]);
        strata_kernels::attend::weighted_sum(&w, &values, stride, &mut got);
        strata_kernels::attend::weighted_sum_reference(&w, &values, stride, &mut want);
        check(dh, stride, n, &got, &want);
    }
}
