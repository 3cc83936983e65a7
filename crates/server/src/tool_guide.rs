//! `tool_choice` `required` or a named function, enforced: a Lark grammar (llguidance's dialect)
//! of the family's tool-call syntax (Hermes `<tool_call>` JSON for Qwen3 and templates without
//! markers, DeepSeek-V3's and Kimi K2's marker tokens), each call naming one of the allowed tools
//! with arguments that match that tool's JSON schema; one call, or up to [`MAX_CALLS`] unless
//! `parallel_tool_calls` is false. The output parser then reads the calls as always.

use serde_json::{json, Value};
use strata_runtime::Guide;
use strata_tokenizer::Tokenizer;

use crate::api::{ApiError, ApiResult};
use crate::parse::ToolFormat;

/// Calls one answer may make at most (so a weak model cannot call without end).
pub const MAX_CALLS: usize = 8;

/// A Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string")
}

/// A marker: its token where the tokenizer has one (`<[id]>`), else its text.
fn marker(tok: &Tokenizer, text: &str) -> String {
    match tok.token_to_id(text) {
        Some(id) => format!("<[{id}]>"),
        None => lit(text),
    }
}

/// (name, parameters schema) of each allowed tool.
fn allowed(tools: &[Value], only: Option<&str>) -> ApiResult<Vec<(String, Value)>> {
    let all: Vec<(String, Value)> = tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            let name = f.get("name")?.as_str()?.to_string();
            let params = f.get("parameters").cloned().unwrap_or(json!({"type": "object"}));
            Some((name, params))
        })
        .collect();
    match only {
        None => Ok(all),
        Some(n) => {
            let one: Vec<_> = all.into_iter().filter(|(name, _)| name == n).collect();
            if one.is_empty() {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("`tool_choice` names `{n}`, which is not in `tools`"),
                ));
            }
            Ok(one)
        }
    }
}

/// The JSON-schema rule of a value, compact.
fn json_rule(schema: &Value) -> String {
    let mut s = schema.clone();
    if let Value::Object(o) = &mut s {
        o.entry("x-guidance")
            .or_insert(json!({"whitespace_flexible": false}));
    }
    format!("%json {s}")
}

/// The grammar a tool call must follow for `format`.
pub fn guide(
    format: ToolFormat,
    tok: &Tokenizer,
    tools: &[Value],
    only: Option<&str>,
    parallel: bool,
) -> ApiResult<Guide> {
    let tools = allowed(tools, only)?;
    let repeat = if parallel {
        format!("{{1,{MAX_CALLS}}}")
    } else {
        String::new()
    };
    let mut rules = Vec::new();
    let start = match format {
        ToolFormat::Hermes => {
            let bodies: Vec<Value> = (tools.iter())
                .map(|(name, params)| {
                    json!({
                        "type": "object",
                        "properties": {"name": {"const": name}, "arguments": params},
                        "required": ["name", "arguments"],
                        "additionalProperties": false,
                    })
                })
                .collect();
            rules.push(format!("body: {}", json_rule(&json!({"anyOf": bodies}))));
            let (open, close) = (marker(tok, "<tool_call>"), marker(tok, "</tool_call>"));
            rules.push(format!("call: {open} \"\\n\" body \"\\n\" {close}"));
            if parallel {
                format!("start: call (\"\\n\" call){{0,{}}}", MAX_CALLS - 1)
            } else {
                "start: call".to_string()
            }
        }
        ToolFormat::DeepSeek => sectioned(
            &mut rules,
            &tools,
            |i, name| {
                format!(
                    "call{i}: {} \"function\" {} {} \"\\n```json\\n\" args{i} \"\\n```\" {}",
                    marker(tok, "<｜tool▁call▁begin｜>"),
                    marker(tok, "<｜tool▁sep｜>"),
                    lit(name),
                    marker(tok, "<｜tool▁call▁end｜>"),
                )
            },
            [
                marker(tok, "<｜tool▁calls▁begin｜>"),
                marker(tok, "<｜tool▁calls▁end｜>"),
            ],
            &repeat,
        ),
        ToolFormat::Kimi => sectioned(
            &mut rules,
            &tools,
            |i, name| {
                format!(
                    "call{i}: {} {} /[0-9]/ {} args{i} {}",
                    marker(tok, "<|tool_call_begin|>"),
                    lit(&format!("functions.{name}:")),
                    marker(tok, "<|tool_call_argument_begin|>"),
                    marker(tok, "<|tool_call_end|>"),
                )
            },
            [
                marker(tok, "<|tool_calls_section_begin|>"),
                marker(tok, "<|tool_calls_section_end|>"),
            ],
            &repeat,
        ),
    };
    Ok(Guide::Lark(
        std::iter::once(start).chain(rules).collect::<Vec<_>>().join("\n"),
    ))
}

/// DeepSeek-V3's and Kimi K2's shape: a section's begin marker, calls (`call_of(i, name)`, the
/// arguments as rule `args{i}`), its end marker. Returns the start rule.
fn sectioned(
    rules: &mut Vec<String>,
    tools: &[(String, Value)],
    call_of: impl Fn(usize, &str) -> String,
    [begin, end]: [String; 2],
    repeat: &str,
) -> String {
    for (i, (name, params)) in tools.iter().enumerate() {
        rules.push(call_of(i, name));
        rules.push(format!("args{i}: {}", json_rule(params)));
    }
    let calls: Vec<String> = (0..tools.len()).map(|i| format!("call{i}")).collect();
    rules.push(format!("call: {}", calls.join(" | ")));
    format!("start: {begin} call{repeat} {end}")
}
