//! A chat completion request's own fields, validated: messages (in the shape chat templates
//! read), tools and whether tool calls are parsed, the template's keyword arguments, logprobs,
//! and the fields both endpoints share (`api::common`). No engine needed, so the fuzz target
//! runs the same code.

use serde_json::{Map, Value};
use strata_runtime::SamplingParams;

use crate::api::{self, ApiError, ApiResult, Common, Fields, Vocab};

/// Most choices one request may ask for.
pub const MAX_N: usize = 16;
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    /// Some call of the tools (enforced).
    Required,
    /// A call of this tool (enforced).
    Named(String),
}

pub struct ChatRequest {
    pub messages: Vec<Value>,
    pub tool_choice: ToolChoice,
    /// `parallel_tool_calls` (default true): several calls may be made at once.
    pub parallel: bool,
    /// `response_format`: what the answer must be.
    pub guide: Option<strata_runtime::Guide>,
    pub tools: Option<Value>,
    pub parse_tools: bool,
    pub kwargs: Map<String, Value>,
    pub logprobs: bool,
    pub top: Option<i64>,
    pub common: Common,
}

impl ChatRequest {
    pub fn parse(
        obj: &Map<String, Value>,
        defaults: SamplingParams,
        vocab: &Vocab<'_>,
    ) -> ApiResult<ChatRequest> {
        let f = Fields(obj);
        let messages = messages(obj.get("messages"))?;
        let guide = response_format(obj.get("response_format"))?;
        let (tools, parse_tools) = tools(&f)?;
        let tool_choice = match obj.get("tool_choice") {
            Some(Value::String(s)) if s == "none" => ToolChoice::None,
            Some(Value::String(s)) if s == "required" => ToolChoice::Required,
            Some(Value::Object(o)) => (o.get("function").and_then(|f| f.get("name")))
                .and_then(Value::as_str)
                .map_or(ToolChoice::Auto, |n| ToolChoice::Named(n.to_string())),
            _ => ToolChoice::Auto,
        };
        if matches!(tool_choice, ToolChoice::Required | ToolChoice::Named(_)) && tools.is_none() {
            return Err(ApiError::field(
                "tool_choice",
                "`tool_choice` asks for a tool call, and `tools` is empty",
            ));
        }
        let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
        let kwargs = template_kwargs(obj, &f)?;
        let logprobs = f.bool("logprobs")?.unwrap_or(false);
        let top = f.int("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
        if top.is_some() && !logprobs {
            return Err(ApiError::field(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ));
        }
        let common = api::common(&f, defaults, vocab, MAX_N)?;
        Ok(ChatRequest {
            messages,
            tool_choice,
            parallel,
            guide,
            tools,
            parse_tools,
            kwargs,
            logprobs,
            top,
            common,
        })
    }
}

/// `response_format`: `text` (none), `json_object` (any JSON object) or `json_schema` (a JSON
/// value matching `json_schema.schema`).
fn response_format(v: Option<&Value>) -> ApiResult<Option<strata_runtime::Guide>> {
    use strata_runtime::Guide;
    let bad = |m: &str| ApiError::field("response_format", m.to_string());
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Guide::JsonSchema(serde_json::json!({"type": "object"})))),
        Some("json_schema") => match v.get("json_schema").and_then(|j| j.get("schema")) {
            Some(schema @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(Guide::JsonSchema(schema.clone()))),
            Some(_) => Err(bad(
                "`response_format.json_schema.schema` must be a JSON schema object",
            )),
            None => Err(bad("`response_format.json_schema.schema` is required")),
        },
        _ => Err(bad(
            "`response_format.type` must be text, json_object or json_schema",
        )),
    }
}

/// `chat_template_kwargs` (never what the renderer sets) and `reasoning_effort`.
fn template_kwargs(obj: &Map<String, Value>, f: &Fields<'_>) -> ApiResult<Map<String, Value>> {
    let mut kwargs = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(v) => {
            return Err(ApiError::field(
                "chat_template_kwargs",
                format!("`chat_template_kwargs` must be an object, got {v}"),
            ))
        }
    };
    if let Some(key) = kwargs
        .keys()
        .find(|k| strata_tokenizer::RESERVED_TEMPLATE_KEYS.contains(&k.as_str()))
    {
        return Err(ApiError::field(
            "chat_template_kwargs",
            format!("`chat_template_kwargs` cannot set `{key}`: the server sets it"),
        ));
    }
    if let Some(effort) = f.str("reasoning_effort")? {
        kwargs.insert("reasoning_effort".into(), Value::String(effort.into()));
    }
    Ok(kwargs)
}

/// Text of a message's content: a string, a list of text parts, or null.
fn content_text(content: Option<&Value>, at: &str) -> ApiResult<Option<String>> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some(other), _) if other != "text" => {
                        return Err(ApiError::field(
                            &format!("{at}.content[{j}].type"),
                            format!("content parts of type `{other}` are not supported (text only)"),
                        ))
                    }
                    _ => {
                        return Err(ApiError::field(
                            &format!("{at}.content[{j}]"),
                            "a content part must be {\"type\": \"text\", \"text\": \"...\"}",
                        ))
                    }
                }
            }
            Ok(Some(text))
        }
        Some(v) => Err(ApiError::field(
            &format!("{at}.content"),
            format!("content must be a string or a list of parts, got {v}"),
        )),
    }
}

/// Validated messages in the shape chat templates read (content as a string; `developer` as
/// `system`).
fn messages(v: Option<&Value>) -> ApiResult<Vec<Value>> {
    let list = match v {
        Some(Value::Array(l)) if !l.is_empty() => l,
        Some(Value::Array(_)) => return Err(ApiError::field("messages", "`messages` must not be empty")),
        None | Some(Value::Null) => return Err(ApiError::field("messages", "`messages` is required")),
        Some(v) => {
            return Err(ApiError::field(
                "messages",
                format!("`messages` must be a list, got {v}"),
            ))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Some(obj) = m.as_object() else {
            return Err(ApiError::field(&at, "each message must be an object"));
        };
        let role = match obj.get("role").and_then(Value::as_str) {
            Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
            Some("developer") => "system",
            Some(other) => {
                return Err(ApiError::field(
                    &format!("{at}.role"),
                    format!("unknown role `{other}` (system, developer, user, assistant, tool)"),
                ))
            }
            None => return Err(ApiError::field(&format!("{at}.role"), "`role` is required")),
        };
        let content = content_text(obj.get("content"), &at)?;
        let mut msg = obj.clone();
        msg.insert("role".into(), Value::String(role.into()));
        match content {
            Some(text) => {
                msg.insert("content".into(), Value::String(text));
            }
            // Clients send `content: null` on tool-call turns; templates test and split content as
            // a string (Qwen3: `'</think>' in message.content`).
            None if role == "assistant" && obj.get("tool_calls").is_some() => {
                msg.insert("content".into(), Value::String(String::new()));
            }
            None => {
                return Err(ApiError::field(
                    &format!("{at}.content"),
                    "`content` is required for this role",
                ))
            }
        }
        if let Some(calls) = msg.get_mut("tool_calls").and_then(Value::as_array_mut) {
            // Templates read arguments as a mapping more often than as a string.
            for call in calls.iter_mut() {
                if let Some(f) = call.get_mut("function").and_then(Value::as_object_mut) {
                    if let Some(Value::String(args)) = f.get("arguments") {
                        if let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(args) {
                            f.insert("arguments".into(), parsed);
                        }
                    }
                }
            }
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

/// `tools` (a list of function declarations) and whether tool calls are parsed.
fn tools(f: &Fields<'_>) -> ApiResult<(Option<Value>, bool)> {
    let tools = match f.0.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => {
            for (i, t) in list.iter().enumerate() {
                let name = t
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str);
                if name.is_none() {
                    return Err(ApiError::field(
                        &format!("tools[{i}].function.name"),
                        "each tool needs `function.name`",
                    ));
                }
            }
            (!list.is_empty()).then(|| Value::Array(list.clone()))
        }
        Some(v) => {
            return Err(ApiError::field(
                "tools",
                format!("`tools` must be a list, got {v}"),
            ))
        }
    };
    let parse = match f.0.get("tool_choice") {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) if s == "none" => false,
        Some(Value::String(s)) if s == "auto" || s == "required" => true,
        Some(Value::Object(o)) if o.get("function").and_then(|f| f.get("name")).is_some() => true,
        Some(v) => {
            return Err(ApiError::field(
                "tool_choice",
                format!("`tool_choice` must be none, auto, required or a named function, got {v}"),
            ))
        }
    };
    let enabled = parse && tools.is_some();
    Ok((tools, enabled))
}
