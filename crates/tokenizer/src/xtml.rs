//! XTML, Kimi K3's chat format (`encoding_k3.py` in the checkpoint; spec §9). Four structural
//! special tokens wrap plain-text tags:
//!
//! ```text
//! <|open|>message role="user"<|sep|>TEXT<|close|>message<|sep|><|end_of_msg|>
//! <|open|>message role="assistant"<|sep|><|open|>think<|sep|>REASONING<|close|>think<|sep|>
//!     <|open|>response<|sep|>TEXT<|close|>response<|sep|>[tools]<|close|>message<|sep|><|end_of_msg|>
//! generation prompt: <|open|>message role="assistant"<|sep|><|open|>think<|sep|>
//! ```
//!
//! A conversation renders to segments, each encoded on its own: the structural tokens as
//! specials, everything else as ordinary text (special-token text inside a message stays text).
//! A tag's attributes are separate segments (`message`, ` role`, `="`, `user`, `"`), as the
//! shipped renderer emits them; values escape `&` and `"`. Tool declarations go into a system
//! message (`# Tools` + JSON); tool calls render as `<|open|>tools<|sep|>` with one
//! `<|open|>call tool=".." index=".."<|sep|>` per call and one `<|open|>argument key=".."
//! type=".."<|sep|>` per argument. The exact tool layout is marked uncertain in the spec.

use serde_json::{Map, Value};

use crate::{Result, TokenizerError};

pub const OPEN: &str = "<|open|>";
pub const CLOSE: &str = "<|close|>";
pub const SEP: &str = "<|sep|>";
pub const END_OF_MSG: &str = "<|end_of_msg|>";

/// A piece of the rendered conversation: ordinary text, or one special token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    Text(String),
    Special(&'static str),
}

#[derive(Default)]
struct Writer {
    segments: Vec<Segment>,
}

fn escape(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;")
}

impl Writer {
    fn text(&mut self, s: &str) {
        if !s.is_empty() {
            self.segments.push(Segment::Text(s.to_string()));
        }
    }

    fn open(&mut self, tag: &str, attrs: &[(&str, &str)]) {
        self.segments.push(Segment::Special(OPEN));
        self.text(tag);
        for (k, v) in attrs {
            self.text(&format!(" {k}"));
            self.text("=\"");
            self.text(&escape(v));
            self.text("\"");
        }
        self.segments.push(Segment::Special(SEP));
    }

    fn close(&mut self, tag: &str) {
        self.segments.push(Segment::Special(CLOSE));
        self.text(tag);
        self.segments.push(Segment::Special(SEP));
    }

    fn element(&mut self, tag: &str, attrs: &[(&str, &str)], body: &str) {
        self.open(tag, attrs);
        self.text(body);
        self.close(tag);
    }
}

fn bad(reason: impl Into<String>) -> TokenizerError {
    TokenizerError::Template(reason.into())
}

/// A message's text: a string, or a list of `{type: text, text}` parts joined.
fn content_text(message: &Value, index: usize) -> Result<String> {
    match message.get("content") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p {
                Value::String(s) => Ok(s.as_str()),
                _ => p.get("text").and_then(Value::as_str).ok_or_else(|| {
                    bad(format!(
                        "messages[{index}].content: only text parts are supported"
                    ))
                }),
            })
            .collect::<Result<Vec<_>>>()
            .map(|v| v.concat()),
        Some(other) => Err(bad(format!(
            "messages[{index}].content: expected a string or a list of parts, found {other}"
        ))),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn tool_calls(w: &mut Writer, calls: &[Value], index: usize) -> Result<()> {
    w.open("tools", &[]);
    for (i, call) in calls.iter().enumerate() {
        let f = call.get("function").unwrap_or(call);
        let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
            bad(format!(
                "messages[{index}].tool_calls[{i}]: function name missing"
            ))
        })?;
        let args: Value = match f.get("arguments") {
            Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                bad(format!(
                    "messages[{index}].tool_calls[{i}].arguments: not JSON: {e}"
                ))
            })?,
            Some(v) => v.clone(),
            None => Value::Object(Map::new()),
        };
        let n = (i + 1).to_string();
        w.open("call", &[("tool", name), ("index", &n)]);
        if let Value::Object(map) = &args {
            for (key, value) in map {
                let body = match value {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                w.element("argument", &[("key", key), ("type", json_type(value))], &body);
            }
        }
        w.close("call");
    }
    w.close("tools");
    Ok(())
}

/// Renders a conversation. `kwargs`: `thinking` (default true) chooses whether assistant turns
/// and the generation prompt open a `think` element.
pub fn render(
    messages: &Value,
    tools: Option<&Value>,
    add_generation_prompt: bool,
    kwargs: &Map<String, Value>,
) -> Result<Vec<Segment>> {
    let list = messages
        .as_array()
        .ok_or_else(|| bad("messages must be a list"))?;
    let thinking = kwargs.get("thinking").and_then(Value::as_bool).unwrap_or(true);
    let mut w = Writer::default();
    if let Some(tools) = tools.filter(|t| t.as_array().is_some_and(|a| !a.is_empty())) {
        let decl = serde_json::to_string(tools).map_err(|e| bad(e.to_string()))?;
        w.open("message", &[("role", "system"), ("type", "tools")]);
        w.text(&format!("# Tools\n{decl}"));
        w.close("message");
        w.segments.push(Segment::Special(END_OF_MSG));
    }
    for (i, m) in list.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("messages[{i}].role is missing")))?;
        let text = content_text(m, i)?;
        match role {
            "assistant" => {
                w.open("message", &[("role", role)]);
                if thinking {
                    let reasoning = m.get("reasoning_content").and_then(Value::as_str).unwrap_or("");
                    w.element("think", &[], reasoning);
                }
                w.element("response", &[], &text);
                if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
                    if !calls.is_empty() {
                        tool_calls(&mut w, calls, i)?;
                    }
                }
            }
            "tool" => {
                let mut attrs = vec![("role", role)];
                if let Some(id) = m.get("tool_call_id").and_then(Value::as_str) {
                    attrs.push(("tool_call_id", id));
                }
                w.open("message", &attrs);
                w.text(&text);
            }
            "system" | "developer" | "user" => {
                w.open("message", &[("role", role)]);
                w.text(&text);
            }
            other => return Err(bad(format!("messages[{i}].role `{other}` is not known"))),
        }
        w.close("message");
        w.segments.push(Segment::Special(END_OF_MSG));
    }
    if add_generation_prompt {
        w.open("message", &[("role", "assistant")]);
        w.open(if thinking { "think" } else { "response" }, &[]);
    }
    Ok(w.segments)
}

/// The rendered conversation as one string (for display).
pub fn to_text(segments: &[Segment]) -> String {
    segments
        .iter()
        .map(|s| match s {
            Segment::Text(t) => t.as_str(),
            Segment::Special(s) => s,
        })
        .collect()
}
