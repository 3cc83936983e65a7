//! API request bodies through the chat and completions validation (first byte picks the
//! endpoint): an Ok or an error message, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let result = if pick % 2 == 0 {
        strata_server::fuzzing::validate_chat(body)
    } else {
        strata_server::fuzzing::validate_completion(body)
    };
    if let Err(message) = result {
        assert!(!message.is_empty());
    }
});
