//! A safetensors file's header (length prefix + JSON): an error or a header whose every tensor
//! lies inside the data section, never a panic or a wrapped range.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz.safetensors");
    if let Ok(h) = strata_formats::parse_header_bytes(path, data) {
        assert_eq!(h.file_len, data.len() as u64);
        for t in &h.tensors {
            assert!(t.offset >= h.data_start, "{} starts in the header", t.name);
            assert!(
                t.offset.checked_add(t.len).is_some_and(|e| e <= h.file_len),
                "{} past the end",
                t.name
            );
            assert_eq!(t.len, t.numel() as u64 * t.dtype.size() as u64, "{} size", t.name);
        }
    }
});
