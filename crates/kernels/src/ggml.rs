//! GGUF's quantized block types other than Q8_0 (which has its own kernel, [`crate::q8_0`]):
//! the legacy 32-weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) and the 256-weight
//! super-blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS). A row is whole blocks; their layouts and
//! decoders are in [`crate::ggml_decode`].
//!
//! The products decode inside the dot product: each block into 256 f32 on the stack, then its
//! multiply-adds with every token's slice of the activation before the next block. Batch
//! invariance: a block is decoded once for all the tokens of a call, and every token's sum takes
//! exactly the steps of a one-token call.

use std::sync::OnceLock;

use crate::ggml_decode::{self as dec, Decode};

/// A GGUF block type these kernels compute on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Iq4Nl,
    Mxfp4,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq4Xs,
}

/// Every type, in ggml's order of ids.
pub const ALL: [BlockType; 12] = [
    BlockType::Q4_0,
    BlockType::Q4_1,
    BlockType::Q5_0,
    BlockType::Q5_1,
    BlockType::Q2K,
    BlockType::Q3K,
    BlockType::Q4K,
    BlockType::Q5K,
    BlockType::Q6K,
    BlockType::Iq4Nl,
    BlockType::Iq4Xs,
    BlockType::Mxfp4,
];

/// Calls `$f::<Decoder>($args)` for the decoder of block type `$ty`.
macro_rules! with_decoder {
    ($ty:expr, $f:ident, $($arg:expr),*) => {
        match $ty {
            BlockType::Q4_0 => $f::<dec::Q4_0>($($arg),*),
            BlockType::Q4_1 => $f::<dec::Q4_1>($($arg),*),
            BlockType::Q5_0 => $f::<dec::Q5_0>($($arg),*),
            BlockType::Q5_1 => $f::<dec::Q5_1>($($arg),*),
            BlockType::Iq4Nl => $f::<dec::Iq4Nl>($($arg),*),
            BlockType::Mxfp4 => $f::<dec::Mxfp4>($($arg),*),
            BlockType::Q2K => $f::<dec::Q2K>($($arg),*),
            BlockType::Q3K => $f::<dec::Q3K>($($arg),*),
            BlockType::Q4K => $f::<dec::Q4K>($($arg),*),
            BlockType::Q5K => $f::<dec::Q5K>($($arg),*),
            BlockType::Q6K => $f::<dec::Q6K>($($arg),*),
            BlockType::Iq4Xs => $f::<dec::Iq4Xs>($($arg),*),
        }
    };
}

pub(crate) use with_decoder;

fn layout<D: Decode>() -> (usize, usize) {
    (D::N, D::BYTES)
}

impl BlockType {
    /// The type of a ggml type id, if it is one of these.
    pub fn from_ggml_id(id: u32) -> Option<BlockType> {
        Some(match id {
            2 => BlockType::Q4_0,
            3 => BlockType::Q4_1,
            6 => BlockType::Q5_0,
            7 => BlockType::Q5_1,
            10 => BlockType::Q2K,
            11 => BlockType::Q3K,
            12 => BlockType::Q4K,
            13 => BlockType::Q5K,
            14 => BlockType::Q6K,
            20 => BlockType::Iq4Nl,
            23 => BlockType::Iq4Xs,
            39 => BlockType::Mxfp4,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            BlockType::Q4_0 => "Q4_0",
            BlockType::Q4_1 => "Q4_1",
            BlockType::Q5_0 => "Q5_0",
            BlockType::Q5_1 => "Q5_1",
            BlockType::Iq4Nl => "IQ4_NL",
            BlockType::Mxfp4 => "MXFP4",
            BlockType::Q2K => "Q2_K",
            BlockType::Q3K => "Q3_K",
            BlockType::Q4K => "Q4_K",
            BlockType::Q5K => "Q5_K",
            BlockType::Q6K => "Q6_K",
            BlockType::Iq4Xs => "IQ4_XS",
        }
    }

    /// Weights per block (32 or 256).
    pub fn block(self) -> usize {
        with_decoder!(self, layout,).0
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        with_decoder!(self, layout,).1
    }

    /// Bytes of a row of `in_dim` weights (a multiple of [`BlockType::block`]).
    pub fn row_bytes(self, in_dim: usize) -> usize {
        in_dim / self.block() * self.block_bytes()
    }

    /// Decodes one block (`block_bytes` bytes) into `out[..block()]`.
    pub fn decode(self, block: &[u8], out: &mut [f32]) {
        assert!(block.len() >= self.block_bytes() && out.len() >= self.block());
        with_decoder!(self, decode_block, block, out)
    }

    /// Byte offsets of the block's F16 fields (its scales and mins): what a generator of test
    /// blocks sets to finite values (the other bytes may be anything).
    pub fn f16_fields(self) -> &'static [usize] {
        match self {
            BlockType::Q4_0 | BlockType::Q5_0 | BlockType::Iq4Nl | BlockType::Iq4Xs => &[0],
            BlockType::Q4_1 | BlockType::Q5_1 | BlockType::Q4K | BlockType::Q5K => &[0, 2],
            BlockType::Q2K => &[80, 82],
            BlockType::Q3K => &[108],
            BlockType::Q6K => &[208],
            BlockType::Mxfp4 => &[],
        }
    }

    /// `count` blocks of random codes for tests and benchmarks, from the random words `next`
    /// gives: every byte random but the F16 fields (finite scales below 0.01) and MXFP4's
    /// exponent (scales near 1/64).
    pub fn random_blocks(self, count: usize, mut next: impl FnMut() -> u64) -> Vec<u8> {
        let mut out: Vec<u8> = (0..count * self.block_bytes()).map(|_| next() as u8).collect();
        for block in out.chunks_exact_mut(self.block_bytes()) {
            for &at in self.f16_fields() {
                let d = (next() % 10_000) as f32 * 1e-6;
                block[at..at + 2].copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
            }
            if self == BlockType::Mxfp4 {
                block[0] = 118 + (next() % 8) as u8;
            }
        }
        out
    }

    /// Weight j of a row.
    pub fn weight(self, row: &[u8], j: usize) -> f32 {
        let (k, bytes) = (self.block(), self.block_bytes());
        let mut buf = [0f32; 256];
        self.decode(&row[j / k * bytes..(j / k + 1) * bytes], &mut buf);
        buf[j % k]
    }
}

fn decode_block<D: Decode>(block: &[u8], out: &mut [f32]) {
    D::decode(block, out)
}

/// Scalar reference: one row of type `ty` (`ty.row_bytes(x.len())` bytes) times x, block by
/// block, weight by weight.
pub fn dot_reference(ty: BlockType, row: &[u8], x: &[f32]) -> f32 {
    let (k, bytes) = (ty.block(), ty.block_bytes());
    assert!(x.len().is_multiple_of(k) && row.len() >= ty.row_bytes(x.len()));
    let mut buf = [0f32; 256];
    let mut total = 0f32;
    for (b, xs) in x.chunks_exact(k).enumerate() {
        ty.decode(&row[b * bytes..(b + 1) * bytes], &mut buf);
        for (w, xv) in buf.iter().zip(xs) {
            total += w * xv;
        }
    }
    total
}

type RowsTokens = fn(BlockType, &[u8], usize, &[&[f32]], &mut [f32]);

/// Rows of type `ty`, `row_bytes` bytes each, times tokens `xs` (all of one length, a multiple
/// of the block): `out[i * T + t]` is row i times token t.
pub fn rows_tokens(ty: BlockType, rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    static IMPL: OnceLock<RowsTokens> = OnceLock::new();
    (IMPL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if crate::dot::has_avx2_fma_f16c() {
            return crate::ggml_x86::rows_tokens_entry;
        }
        #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
        if crate::isa::isa() == crate::isa::Isa::Neon {
            return crate::ggml_neon::rows_tokens_entry;
        }
        rows_tokens_reference
    }))(ty, rows, row_bytes, xs, out)
}

/// Scalar twin of [`rows_tokens`], row by row and token by token.
pub fn rows_tokens_reference(ty: BlockType, rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let tokens = xs.len();
    for (i, o) in out.chunks_exact_mut(tokens).enumerate() {
        let row = &rows[i * row_bytes..(i + 1) * row_bytes];
        for (t, x) in xs.iter().enumerate() {
            o[t] = dot_reference(ty, row, x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_rows(ty: BlockType, rows: usize, n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        ty.random_blocks(rows * n / ty.block(), || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        })
    }

    #[test]
    fn ids_and_layouts_are_ggml_s() {
        let want = [
            (2, 32, 18),
            (3, 32, 20),
            (6, 32, 22),
            (7, 32, 24),
            (10, 256, 84),
            (11, 256, 110),
            (12, 256, 144),
            (13, 256, 176),
            (14, 256, 210),
            (20, 32, 18),
            (23, 256, 136),
            (39, 32, 17),
        ];
        for (ty, (id, k, bytes)) in ALL.iter().zip(want) {
            assert_eq!(BlockType::from_ggml_id(id), Some(*ty));
            assert_eq!((ty.block(), ty.block_bytes()), (k, bytes), "{}", ty.name());
        }
        assert_eq!(BlockType::from_ggml_id(8), None, "Q8_0 has its own kernel");
    }

    #[test]
    fn several_tokens_give_each_token_alone_bit_for_bit_and_the_reference() {
        for ty in ALL {
            let (rows, n) = (3, 2 * 256);
            let w = random_rows(ty, rows, n, 5 + ty.block_bytes() as u64);
            let xs: Vec<Vec<f32>> = (0..6)
                .map(|t| {
                    (0..n)
                        .map(|j| ((j * 7 + t * 13) % 17) as f32 / 17.0 - 0.5)
                        .collect()
                })
                .collect();
            let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
            let rb = ty.row_bytes(n);
            let mut all = vec![0f32; rows * refs.len()];
            rows_tokens(ty, &w, rb, &refs, &mut all);
            for (t, x) in refs.iter().enumerate() {
                let mut one = vec![0f32; rows];
                rows_tokens(ty, &w, rb, &[x], &mut one);
                for i in 0..rows {
                    let name = ty.name();
                    assert_eq!(
                        all[i * refs.len() + t].to_bits(),
                        one[i].to_bits(),
                        "{name} row {i} token {t}"
                    );
                    let want = dot_reference(ty, &w[i * rb..], x);
                    let scale: f32 = (0..n).map(|j| (ty.weight(&w[i * rb..], j) * x[j]).abs()).sum();
                    assert!(
                        (one[i] - want).abs() <= 1e-5 * (1.0 + scale),
                        "{name} row {i}: {} vs {want}",
                        one[i]
                    );
                }
            }
        }
    }
}
