//! What the GPU tests share: the adapter (or a clear failure) and a small random source.

#![allow(dead_code)]

use strata_gpu::{select, Gpu, Preference, Selection};

/// The best adapter there is; None only where the environment says there is none
/// (`STRATA_NO_GPU=1`).
pub fn gpu() -> Option<Gpu> {
    match select(Preference::Gpu) {
        Ok(Selection::Gpu(g)) => {
            eprintln!("GPU tests on {}", g.adapter());
            Some(*g)
        }
        Ok(Selection::Cpu { why }) => panic!("--device gpu chose the CPU: {why}"),
        Err(e) if std::env::var("STRATA_NO_GPU").is_ok_and(|v| v == "1") => {
            eprintln!("STRATA_NO_GPU=1: GPU tests not run ({e})");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn bf16s(&mut self, n: usize) -> Vec<u16> {
        (0..n).map(|_| (self.f32().to_bits() >> 16) as u16).collect()
    }
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}
