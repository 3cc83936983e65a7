//! `Content-Range` values: parsed only into ranges a client can have asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some((a, b, total)) = strata_remote::parse_content_range(text) {
            assert!(a <= b && b < total, "{text:?} -> {a}-{b}/{total}");
        }
    }
});
