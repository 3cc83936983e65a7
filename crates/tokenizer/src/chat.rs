//! Chat templates from `tokenizer_config.json` (or `chat_template.jinja`), rendered by minijinja
//! with the environment transformers gives Jinja: trim_blocks, lstrip_blocks, loop controls,
//! `raise_exception`, `strftime_now`, `namespace`, Python string/dict methods, and a `tojson`
//! that writes what Python's `json.dumps` writes.
//!
//! A template comes with the model files, so it is untrusted code: a render runs on a fuel
//! budget (instructions; minijinja's own limits bound recursion and repeated strings), its
//! output is cut off past a size, a value too large to print or serialize is an error before it
//! is walked (a repeated sequence, `5 ** 11 * messages`, is lazy: printing it would iterate
//! without fuel), every function it can call returns errors instead of panicking, and the
//! caller's keyword arguments cannot replace what the renderer sets.

use std::path::Path;

use minijinja::value::{Kwargs, Value as JValue, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value};

use crate::pyjson::python_json_dumps;
use crate::{Result, TokenizerError};

const TEMPLATE_NAME: &str = "chat";

/// Instructions one render may run (a chat of a few thousand messages takes well under a
/// tenth of it).
pub const TEMPLATE_FUEL: u64 = 50_000_000;
/// Bytes one render may write.
pub const MAX_RENDERED_BYTES: usize = 32 << 20;
/// Items (elements, keys and values, nested ones counted) a value may hold to be printed or
/// serialized: a chat's messages and tools are far fewer.
const MAX_PRINTED_ITEMS: usize = 1 << 20;
/// Variables the renderer sets that keyword arguments (`chat_template_kwargs`) cannot replace.
pub const RESERVED_TEMPLATE_KEYS: &[&str] = &[
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "additional_special_tokens",
];

pub struct ChatTemplate {
    env: Environment<'static>,
    pub source: String,
}

fn raise_exception(message: String) -> std::result::Result<JValue, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: a format chrono cannot parse is an error, never a panic.
fn strftime_now(format: String) -> std::result::Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    use std::fmt::Write;
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    let bad = || {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: bad format `{format}`"),
        )
    };
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(bad());
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.into_iter())
    )
    .map_err(|_| bad())?;
    Ok(out)
}

/// Runs the template engine so that a panic inside it (a bug the template found in the
/// engine) is an error of this template, not of the caller.
fn guarded<T>(run: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).map_err(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        TokenizerError::Template(format!("the template engine failed on this template: {why}"))
    })
}

/// An error and its causes on one line. Not minijinja's alternate (`{:#}`) form: its source
/// excerpt can panic on a malformed template's spans.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// An `io::Write` into a string that fails past `limit` bytes.
struct Capped {
    out: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            self.overflowed = true;
            return Err(std::io::Error::other(format!(
                "the rendered prompt is larger than {} MiB",
                self.limit >> 20
            )));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An error when `value` holds more than [`MAX_PRINTED_ITEMS`] items; counted from lengths
/// first, so a huge lazy sequence is refused without being iterated.
fn check_printable(value: &JValue) -> std::result::Result<(), Error> {
    fn exceeds(v: &JValue, budget: &mut usize) -> bool {
        if !matches!(v.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::Iterable) {
            return false;
        }
        if v.len().is_some_and(|n| n > *budget) {
            return true;
        }
        let Ok(items) = v.try_iter() else { return false };
        for item in items {
            if *budget == 0 {
                return true;
            }
            *budget -= 1;
            let child = if v.kind() == ValueKind::Map {
                v.get_item(&item).unwrap_or_default()
            } else {
                item
            };
            if exceeds(&child, budget) {
                return true;
            }
        }
        false
    }
    let mut budget = MAX_PRINTED_ITEMS;
    if exceeds(value, &mut budget) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("a value of more than {MAX_PRINTED_ITEMS} items is too large to print"),
        ));
    }
    Ok(())
}

fn tojson(value: JValue, kwargs: Kwargs) -> std::result::Result<JValue, Error> {
    check_printable(&value)?;
    let indent: Option<usize> = kwargs.get("indent")?;
    // Other json.dumps options (ensure_ascii, sort_keys, separators) are accepted and ignored.
    for key in ["ensure_ascii", "sort_keys", "separators"] {
        let _: Option<JValue> = kwargs.get(key)?;
    }
    kwargs.assert_all_used()?;
    Ok(JValue::from_safe_string(python_json_dumps(&value, indent)?))
}

impl ChatTemplate {
    pub fn new(source: String) -> Result<ChatTemplate> {
        Self::with_fuel(source, TEMPLATE_FUEL)
    }

    /// A template whose renders may run `fuel` instructions (the fuzz target runs many small
    /// budgets; models get [`TEMPLATE_FUEL`]).
    pub fn with_fuel(source: String, fuel: u64) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_fuel(Some(fuel));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.set_formatter(|out, state, value| {
            check_printable(value)?;
            minijinja::escape_formatter(out, state, value)
        });
        let compiled = guarded(|| env.add_template_owned(TEMPLATE_NAME, source.clone()))?;
        compiled.map_err(|e| TokenizerError::Template(format!("does not compile: {}", describe(&e))))?;
        Ok(ChatTemplate { env, source })
    }

    /// The template of a folder: `chat_template.jinja`, else `chat_template` in the config (a
    /// string, or a list of named templates of which `default` is taken).
    pub fn from_dir(dir: &Path, config: &Value) -> Result<Option<ChatTemplate>> {
        let file = dir.join("chat_template.jinja");
        if file.exists() {
            let source = std::fs::read_to_string(&file).map_err(|e| TokenizerError::file(&file, e))?;
            return Ok(Some(ChatTemplate::new(source)?));
        }
        let source = match config.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .or(list.first())
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_string),
            _ => None,
        };
        source.map(ChatTemplate::new).transpose()
    }

    /// Renders `messages` (a JSON list of message objects). `special_tokens` and `kwargs` become
    /// template variables (kwargs win); `tools` is passed as `tools` (none when absent), as
    /// transformers does. Message keys whose value is null are kept (OpenAI clients send
    /// `content: null` on tool-call turns).
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        special_tokens: &Map<String, Value>,
        kwargs: &Map<String, Value>,
    ) -> Result<String> {
        if let Some(key) = kwargs
            .keys()
            .find(|k| RESERVED_TEMPLATE_KEYS.contains(&k.as_str()))
        {
            return Err(TokenizerError::Template(format!(
                "keyword arguments cannot set `{key}`"
            )));
        }
        let mut ctx = special_tokens.clone();
        for (k, v) in kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("tools".into(), tools.cloned().unwrap_or(Value::Null));
        ctx.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt));
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        let mut out = Capped {
            out: Vec::new(),
            limit: MAX_RENDERED_BYTES,
            overflowed: false,
        };
        let rendered = guarded(|| template.render_captured_to(JValue::from_serialize(&ctx), &mut out))?;
        if out.overflowed {
            return Err(TokenizerError::Template(format!(
                "the rendered prompt is larger than {} MiB",
                MAX_RENDERED_BYTES >> 20
            )));
        }
        rendered.map_err(|e| TokenizerError::Template(describe(&e)))?;
        String::from_utf8(out.out)
            .map_err(|e| TokenizerError::Template(format!("the output is not UTF-8: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, kwargs: serde_json::Value) -> Result<String> {
        let t = ChatTemplate::new(source.to_string())?;
        let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
        let kwargs = kwargs.as_object().cloned().unwrap_or_default();
        t.render(&messages, None, true, &Map::new(), &kwargs)
    }

    /// Found by the fuzz target: a lazily repeated sequence (10^12 items) printed or
    /// serialized is an error at once, not an iteration without fuel; small ones still print.
    #[test]
    fn a_huge_repeated_sequence_is_an_error_not_a_hang() {
        for source in [
            "{{5\n\n**11\n\n*messages*11111.}}",
            "{{ [5 ** 11 * messages] }}",
            "{{ (5 ** 11 * messages) | tojson }}",
        ] {
            let e = render(source, serde_json::json!({})).unwrap_err();
            assert!(e.to_string().contains("too large to print"), "{source}: {e}");
        }
        assert_eq!(
            render("{{ 2 * [1, 2] }}", serde_json::json!({})).unwrap(),
            "[1, 2, 1, 2]"
        );
    }

    /// Found by the fuzz target: a malformed `for` whose error span ends before it starts.
    #[test]
    fn a_template_whose_error_span_is_backwards_is_an_error() {
        let e = render(
            "{%- for  in messages -%}{{- '<|im_start|>'  + '<|im_%nd|>' + '\\n' -}}{%- endfor -%}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("chat template"), "{e}");
    }

    /// Found by the fuzz target: a negative-step slice that minijinja's own arithmetic
    /// overflows on (a panic in debug builds): an error, or a render, never a panic.
    #[test]
    fn a_template_that_trips_the_engine_is_an_error() {
        let r = render(
            "{% for m in messages[:5:-1] %}{{ m.role }}{% endfor %}",
            serde_json::json!({}),
        );
        if let Err(e) = r {
            assert!(e.to_string().contains("template"), "{e}");
        }
    }

    #[test]
    fn hostile_templates_fail_cleanly() {
        // An endless loop runs out of fuel.
        let e = render(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("fuel"), "{e}");
        // Output past the cap.
        let e = render(
            "{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        // A bad strftime format is an error; a good one renders.
        let e = render("{{ strftime_now('%Q') }}", serde_json::json!({})).unwrap_err();
        assert!(e.to_string().contains("strftime_now"), "{e}");
        let year = render("{{ strftime_now('%Y') }}", serde_json::json!({})).unwrap();
        assert_eq!(year.len(), 4, "{year}");
        // Keyword arguments cannot replace what the renderer sets.
        for key in RESERVED_TEMPLATE_KEYS {
            let e = render("{{ messages }}", serde_json::json!({ *key: "x" })).unwrap_err();
            assert!(e.to_string().contains(key), "{e}");
        }
        assert_eq!(
            render(
                "{{ greeting }} {{ messages[0].content }}",
                serde_json::json!({"greeting": "yo"})
            )
            .unwrap(),
            "yo hi"
        );
    }
}
