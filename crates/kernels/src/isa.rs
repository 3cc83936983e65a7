//! Which SIMD kernels run: the best the CPU has, chosen once. `STRATA_ISA=avx512|avx2|neon|scalar`
//! asks for a lesser one (to compare variants side by side on one machine); a request for one
//! the CPU lacks falls back to the best it has. Every product of a process uses the same choice,
//! so a sequence's sums never depend on which kernel a batch size picked.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// The scalar reference twins.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F (with AVX2 + FMA + F16C) for the dense and INT8 formats, VNNI for the
    /// 4-bit ones where the CPU has it; FP8 keeps its AVX2 kernel.
    Avx512,
    /// aarch64 Advanced SIMD (NEON), which every aarch64 CPU has: the dense, INT8, FP8 and
    /// 4-bit kernels of `neon.rs` and `neon_intdot.rs`.
    Neon,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }
}

/// The best the CPU has.
pub fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c");
        if avx2 && std::is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if avx2 {
            return Isa::Avx2;
        }
    }
    #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
    if std::arch::is_aarch64_feature_detected!("neon") {
        return Isa::Neon;
    }
    Isa::Scalar
}

/// The kernels in use (see the module's note on `STRATA_ISA`).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = detected();
        let asked = match std::env::var("STRATA_ISA").ok().as_deref() {
            Some("scalar") => Isa::Scalar,
            Some("avx2") if best != Isa::Neon => Isa::Avx2,
            _ => best,
        };
        // The x86 variants are ordered; NEON is the only choice besides scalar on aarch64.
        asked.min(best)
    })
}

/// Whether the 4-bit kernels take their AVX-512 VNNI step (the same sums in fewer
/// instructions): the kernels in use are AVX-512 and the CPU has VNNI and VL.
pub fn has_avx512_vnni() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if isa() == Isa::Avx512 {
            return std::is_x86_feature_detected!("avx512vnni") && std::is_x86_feature_detected!("avx512vl");
        }
        false
    })
}

/// Whether the 4-bit kernels take their 512-bit AVX-512 step (two blocks per step, the same
/// bits): [`has_avx512_vnni`] and the CPU has AVX-512 BW, unless `STRATA_INTDOT_512=0` asks for
/// the 256-bit step (to compare the two on one machine).
pub fn has_avx512_vnni_bw() -> bool {
    static WIDE: OnceLock<bool> = OnceLock::new();
    *WIDE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if has_avx512_vnni() && std::env::var("STRATA_INTDOT_512").as_deref() != Ok("0") {
            return std::is_x86_feature_detected!("avx512bw");
        }
        false
    })
}
