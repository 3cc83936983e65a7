//! Chat templates (as a model folder ships them) rendered over messages: the template source,
//! a NUL, then the messages as JSON (a default conversation when they do not parse). Errors are
//! fine; panics, hangs past the fuel and unbounded output are not. The template engine's own
//! panics are caught by `ChatTemplate` (they become errors), so libFuzzer's abort-on-any-panic
//! hook is replaced by a silent one: a panic that escapes still aborts the run (and its input
//! is saved); replay it with the plain binary to see the message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};
use strata_tokenizer::{ChatTemplate, MAX_RENDERED_BYTES};

fuzz_target!(
    init: {
        std::panic::set_hook(Box::new(|_| {}));
    },
    |data: &[u8]| {
    let (source, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(source) = std::str::from_utf8(source) else { return };
    let Ok(template) = ChatTemplate::with_fuel(source.to_string(), 200_000) else { return };
    let messages = serde_json::from_slice::<Value>(rest)
        .ok()
        .filter(Value::is_array)
        .unwrap_or_else(|| json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]));
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    let mut specials = Map::new();
    specials.insert("bos_token".into(), json!("<s>"));
    for tools in [None, Some(&tools)] {
        if let Ok(text) = template.render(&messages, tools, true, &specials, &Map::new()) {
            assert!(text.len() <= MAX_RENDERED_BYTES);
        }
    }
}
);
