//! `POST /v1/messages` (Anthropic's Messages API) and `POST /v1/messages/count_tokens`, for
//! clients written for Claude. A request is put into the chat endpoint's shape (system, text,
//! `tool_use` and `tool_result` blocks, tools, `tool_choice`, `stop_sequences`, `thinking`) and
//! goes the same way (template, engine, output parser), so its greedy text is the OpenAI
//! endpoint's; the answer is content blocks (`thinking`, `text`, `tool_use`) with a
//! `stop_reason`, streamed as Anthropic's events (`message_start`, `content_block_start`,
//! `..._delta`, `..._stop`, `message_delta`, `message_stop`). Errors have Anthropic's shape.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::api::ApiResult;
use crate::parse::{Piece, ToolCall};
use crate::scheduler::{Event, EventRx};
use crate::stream::{self, json_body, next_event, SseSink};
use crate::{ApiError, AppState};

/// An error in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`).
fn error(e: ApiError) -> Response {
    let kind = match e.status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        s if s.is_server_error() => "api_error",
        _ => "invalid_request_error",
    };
    let message = match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    let body = json!({"type": "error", "error": {"type": kind, "message": message}});
    (e.status, axum::Json(body)).into_response()
}

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::field(field, message)
}

/// The text of a string or of an array of `text` blocks.
fn text_of(v: &Value, field: &str) -> ApiResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    _ => return Err(bad(field, format!("`{field}` takes text blocks only"))),
                }
            }
            Ok(text)
        }
        _ => Err(bad(
            field,
            format!("`{field}` must be a string or an array of text blocks"),
        )),
    }
}

/// One Anthropic message as chat-template messages (a user turn's tool results first, as
/// `tool` messages answering the calls before them).
fn message(i: usize, m: &Value, out: &mut Vec<Value>) -> ApiResult<()> {
    let field = format!("messages[{i}]");
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        _ => return Err(bad(&field, format!("`{field}.role` must be user or assistant"))),
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        _ => {
            return Err(bad(
                &field,
                format!("`{field}.content` must be a string or an array of blocks"),
            ))
        }
    };
    let (mut text, mut calls) = (String::new(), Vec::new());
    for b in blocks {
        match (b.get("type").and_then(Value::as_str), role) {
            (Some("text"), _) => text.push_str(&text_of(&Value::Array(vec![b.clone()]), &field)?),
            (Some("tool_use"), "assistant") => {
                let (id, name) = (
                    b.get("id").and_then(Value::as_str),
                    b.get("name").and_then(Value::as_str),
                );
                let (Some(id), Some(name)) = (id, name) else {
                    return Err(bad(
                        &field,
                        format!("`{field}`: a tool_use block needs an id and a name"),
                    ));
                };
                let input = b.get("input").cloned().unwrap_or(json!({}));
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}));
            }
            (Some("tool_result"), "user") => {
                let Some(id) = b.get("tool_use_id").and_then(Value::as_str) else {
                    return Err(bad(
                        &field,
                        format!("`{field}`: a tool_result block needs a tool_use_id"),
                    ));
                };
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &field)?,
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            (Some("thinking" | "redacted_thinking"), "assistant") => {}
            (t, _) => {
                let t = t.unwrap_or("(none)");
                return Err(bad(
                    &field,
                    format!("`{field}`: {role} content blocks of type `{t}` are not supported"),
                ));
            }
        }
    }
    if role == "assistant" {
        // As OpenAI's clients send a call without text: no content.
        let content = if text.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            Value::String(text)
        };
        let mut msg = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        out.push(msg);
    } else if !text.is_empty() {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

/// The request in the chat endpoint's shape.
fn to_chat(obj: &Map<String, Value>, need_max_tokens: bool) -> ApiResult<Map<String, Value>> {
    let mut out = Map::new();
    for k in ["model", "max_tokens", "temperature", "top_p", "top_k", "stream"] {
        if let Some(v) = obj.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    if need_max_tokens && !out.contains_key("max_tokens") {
        return Err(bad("max_tokens", "`max_tokens` is required"));
    }
    if let Some(s) = obj.get("stop_sequences") {
        out.insert("stop".into(), s.clone());
    }
    let mut msgs = Vec::new();
    match obj.get("system") {
        None | Some(Value::Null) => {}
        Some(s) => msgs.push(json!({"role": "system", "content": text_of(s, "system")?})),
    }
    let Some(Value::Array(list)) = obj.get("messages") else {
        return Err(bad("messages", "`messages` must be an array"));
    };
    for (i, m) in list.iter().enumerate() {
        message(i, m, &mut msgs)?;
    }
    out.insert("messages".into(), Value::Array(msgs));
    if let Some(tools) = obj.get("tools") {
        let Value::Array(tools) = tools else {
            return Err(bad("tools", "`tools` must be an array"));
        };
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                let name = t
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("tools", "a tool needs a name"))?;
                // In the order OpenAI's clients send (templates print tools as JSON).
                let mut function = Map::new();
                function.insert("name".into(), json!(name));
                if let Some(d) = t.get("description") {
                    function.insert("description".into(), d.clone());
                }
                let schema = t
                    .get("input_schema")
                    .cloned()
                    .unwrap_or(json!({"type": "object"}));
                function.insert("parameters".into(), schema);
                Ok(json!({"type": "function", "function": function}))
            })
            .collect::<ApiResult<_>>()?;
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = obj.get("tool_choice") {
        let name = choice.get("name").and_then(Value::as_str);
        let mapped = match (choice.get("type").and_then(Value::as_str), name) {
            (Some("auto"), _) => json!("auto"),
            (Some("any"), _) => json!("required"),
            (Some("none"), _) => json!("none"),
            (Some("tool"), Some(n)) => json!({"type": "function", "function": {"name": n}}),
            _ => {
                return Err(bad(
                    "tool_choice",
                    "`tool_choice` must be auto, any, none or a named tool",
                ))
            }
        };
        out.insert("tool_choice".into(), mapped);
    }
    if let Some(t) = obj
        .get("thinking")
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
    {
        let on = t == "enabled";
        out.insert("chat_template_kwargs".into(), json!({"enable_thinking": on}));
    }
    Ok(out)
}

pub async fn messages(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    state
        .metrics
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match answer(state.clone(), body).await {
        Ok(r) => r,
        Err(e) => {
            state
                .metrics
                .requests_failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            error(e)
        }
    }
}

async fn answer(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let obj = json_body(body)?;
    let chat = to_chat(&obj, true)?;
    let (plan, mut rx) = crate::chat::prepare(&state, &chat).await?;
    let id = stream::request_id("msg");
    if plan.stream {
        return Ok(stream_messages(state, plan, rx, id));
    }
    let choices = stream::collect(&mut rx, 1).await?;
    let c = &choices[0];
    let (text, thinking, calls) = crate::parse::parse_all(&mut plan.parser(), &[&c.text]);
    let mut content = Vec::new();
    if !thinking.is_empty() {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !text.is_empty() || (thinking.is_empty() && calls.is_empty()) {
        content.push(json!({"type": "text", "text": text}));
    }
    for (k, call) in calls.iter().enumerate() {
        content.push(tool_use(call, k, &id));
    }
    let stop = stop_reason(c.finish, !calls.is_empty());
    Ok(axum::Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": state.options.served_model_name,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage(plan.prompt_len, c.ids.len(), rx.cached()),
    }))
    .into_response())
}

/// Anthropic's usage: prompt tokens read from the prefix cache apart from the rest.
fn usage(prompt: usize, output: usize, cached: usize) -> Value {
    json!({
        "input_tokens": prompt - cached.min(prompt),
        "output_tokens": output,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    })
}

fn stop_reason(finish: Option<strata_runtime::FinishReason>, tool_calls: bool) -> &'static str {
    match (tool_calls, finish) {
        (true, _) => "tool_use",
        (false, Some(strata_runtime::FinishReason::Length)) => "max_tokens",
        _ => "end_turn",
    }
}

fn tool_use(call: &ToolCall, k: usize, id: &str) -> Value {
    // A call whose arguments are not a JSON object (a model's slip) keeps them as text.
    let input = match serde_json::from_str::<Value>(&call.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"arguments": call.arguments}),
    };
    json!({
        "type": "tool_use",
        "id": call.id.clone().unwrap_or_else(|| format!("toolu_{}_{k}", &id[4..])),
        "name": call.name,
        "input": input,
    })
}

/// The blocks of a streamed answer as they open and close.
struct Blocks<'s> {
    sink: &'s SseSink,
    /// The open block: its index and whether it is thinking.
    open: Option<(usize, bool)>,
    next: usize,
}

impl Blocks<'_> {
    async fn close(&mut self) -> bool {
        match self.open.take() {
            Some((i, _)) => {
                (self.sink)
                    .event(
                        "content_block_stop",
                        &json!({"type": "content_block_stop", "index": i}),
                    )
                    .await
            }
            None => true,
        }
    }

    /// Writes a piece, opening a block of its kind when the open one is of the other.
    async fn piece(&mut self, p: &Piece) -> bool {
        let (thinking, text) = match p {
            Piece::Reasoning(s) => (true, s),
            Piece::Content(s) => (false, s),
        };
        if self.open.is_some_and(|(_, t)| t != thinking) && !self.close().await {
            return false;
        }
        if self.open.is_none() {
            let i = self.next;
            self.next += 1;
            self.open = Some((i, thinking));
            let block = if thinking {
                json!({"type": "thinking", "thinking": "", "signature": ""})
            } else {
                json!({"type": "text", "text": ""})
            };
            let start = json!({"type": "content_block_start", "index": i, "content_block": block});
            if !self.sink.event("content_block_start", &start).await {
                return false;
            }
        }
        let i = self.next - 1;
        let delta = if thinking {
            json!({"type": "thinking_delta", "thinking": text})
        } else {
            json!({"type": "text_delta", "text": text})
        };
        let ev = json!({"type": "content_block_delta", "index": i, "delta": delta});
        self.sink.event("content_block_delta", &ev).await
    }

    async fn tool(&mut self, call: &ToolCall, k: usize, id: &str) -> bool {
        if !self.close().await {
            return false;
        }
        let i = self.next;
        self.next += 1;
        let mut block = tool_use(call, k, id);
        let input = std::mem::replace(&mut block["input"], json!({}));
        let events = [
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": i, "content_block": block}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            ),
        ];
        for (name, ev) in events {
            if !self.sink.event(name, &ev).await {
                return false;
            }
        }
        true
    }
}

fn stream_messages(state: Arc<AppState>, plan: crate::chat::Plan, mut rx: EventRx, id: String) -> Response {
    stream::sse(state.options.sse_keepalive, move |sink| async move {
        let mut parser = plan.parser();
        let mut blocks = Blocks {
            sink: &sink,
            open: None,
            next: 0,
        };
        let (mut started, mut tokens) = (false, 0);
        loop {
            let Some((_, event)) = next_event(&sink, &mut rx).await else {
                return; // client gone: dropping `rx` cancels the sequence
            };
            if !started {
                // After the first event: the prefix cache's share is known.
                started = true;
                let mut u = usage(plan.prompt_len, 0, rx.cached());
                u["output_tokens"] = json!(1);
                let message = json!({
                    "id": id, "type": "message", "role": "assistant",
                    "model": state.options.served_model_name, "content": [],
                    "stop_reason": null, "stop_sequence": null, "usage": u,
                });
                if !sink
                    .event(
                        "message_start",
                        &json!({"type": "message_start", "message": message}),
                    )
                    .await
                {
                    return;
                }
            }
            match event {
                Event::Token { text, .. } => {
                    tokens += 1;
                    for p in parser.push(&text) {
                        if !blocks.piece(&p).await {
                            return;
                        }
                    }
                }
                Event::Done(reason) => {
                    let (rest, calls) = parser.finish();
                    for p in &rest {
                        if !blocks.piece(p).await {
                            return;
                        }
                    }
                    if blocks.next == 0
                        && calls.is_empty()
                        && !blocks.piece(&Piece::Content(String::new())).await
                    {
                        return;
                    }
                    if !blocks.close().await {
                        return;
                    }
                    for (k, call) in calls.iter().enumerate() {
                        if !blocks.tool(call, k, &id).await {
                            return;
                        }
                    }
                    let delta = json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": stop_reason(Some(reason), !calls.is_empty()), "stop_sequence": null},
                        "usage": {"output_tokens": tokens},
                    });
                    if sink.event("message_delta", &delta).await {
                        let _ = sink.event("message_stop", &json!({"type": "message_stop"})).await;
                    }
                    return;
                }
                Event::Error(e) => {
                    let err = json!({"type": "error", "error": {"type": "api_error", "message": format!("The engine failed on this request: {e}")}});
                    let _ = sink.event("error", &err).await;
                    return;
                }
            }
        }
    })
}

pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match count(state, body).await {
        Ok(r) => r,
        Err(e) => error(e),
    }
}

async fn count(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let obj = json_body(body)?;
    let mut chat = to_chat(&obj, false)?;
    chat.insert("max_tokens".into(), json!(1));
    let prompt = crate::chat::render(&state, &chat).await?;
    Ok(axum::Json(json!({"input_tokens": prompt.len()})).into_response())
}
