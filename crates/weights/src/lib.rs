//! Weights from checkpoint bytes, with the formats they are stored in: a linear layer resolved
//! against a checkpoint (names, shapes, dtypes, all checked at load) and built from its tensors'
//! bytes, as a copy or as a view of the buffers they were read into; a routed expert built the
//! same way; the INT8 conversion of the resident spine. The unsafe part of holding weights in
//! read buffers (views kept alive by their owner) lives here and in `kernels`, so model code
//! needs none, and the stores that read bytes need nothing of the models.

mod expert;
mod linear;
mod mla_split;

pub use expert::{Expert, ExpertLayout};
pub use linear::{load_linear, load_vector, resolve_linear, LinearFormat, LinearSpec};
pub use mla_split::load_kv_b;

#[cfg(test)]
mod tests {
    use strata_formats::gguf::GgmlType;
    use strata_kernels::ggml::{BlockType, ALL};

    #[test]
    fn the_gguf_reader_accepts_exactly_the_block_types_the_kernels_compute_on() {
        for t in GgmlType::KERNEL_BLOCKS {
            let ty = BlockType::from_ggml_id(t.0).unwrap_or_else(|| panic!("{t} has no kernel"));
            assert_eq!(ty.name(), t.name());
            assert_eq!(
                t.block(),
                Some((ty.block() as u64, ty.block_bytes() as u64)),
                "{t}"
            );
        }
        assert_eq!(GgmlType::KERNEL_BLOCKS.len(), ALL.len());
    }
}
