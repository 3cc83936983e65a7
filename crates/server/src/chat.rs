//! `POST /v1/chat/completions`: messages rendered with the model's chat template (tools,
//! `chat_template_kwargs` and `reasoning_effort` passed to it), one sequence per choice, the
//! output split into content, `reasoning_content` and `tool_calls`; streamed as SSE chunks or
//! returned whole.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use strata_runtime::{Request, RequestExtras, TokenLogprobs};
use strata_tokenizer::Tokenizer;

use crate::api::{self, ApiError, ApiResult};
use crate::chat_request::{ChatRequest, ToolChoice};
use crate::parse::{OutputParser, Piece, ThinkStyle, ToolCall, ToolFormat, XTML_STRUCTURE};
use crate::scheduler::Event;
use crate::stream::{self, blocking, check_model, json_body, next_event, submit, token_text, usage};
use crate::AppState;

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    match chat(state.clone(), body).await {
        Ok(r) => r,
        Err(e) => {
            state.metrics.requests_failed.fetch_add(1, Ordering::Relaxed);
            e.into_response()
        }
    }
}

/// Special-token texts to drop from content (the parser's own markers stay), and XTML's
/// structure around the answer.
fn strip_list(tok: &Tokenizer, think: ThinkStyle) -> Vec<String> {
    let markers = ["<think>", "</think>", "<tool_call>", "</tool_call>"];
    let mut ids: Vec<u32> = tok.special_ids().into_iter().collect();
    ids.sort_unstable();
    let mut out: Vec<String> = ids
        .into_iter()
        .filter_map(|id| tok.decode(&[id], false).ok())
        .filter(|t| !t.is_empty() && !markers.contains(&t.as_str()))
        .collect();
    if think == ThinkStyle::Xtml {
        out.extend(XTML_STRUCTURE.iter().map(|s| s.to_string()));
    }
    out
}

/// Kimi K3's XTML (no Jinja template, XTML's structural tokens) or `<think>` tags.
fn think_style(tok: &Tokenizer) -> ThinkStyle {
    if tok.chat_template().is_none()
        && tok.token_to_id("<|open|>").is_some()
        && tok.token_to_id("<|sep|>").is_some()
    {
        ThinkStyle::Xtml
    } else {
        ThinkStyle::Tags
    }
}

fn logprob_entry(tok: Option<&Tokenizer>, id: u32, lp: &TokenLogprobs) -> Value {
    let (text, bytes) = token_text(tok, id);
    json!({
        "token": text,
        "logprob": lp.logprob,
        "bytes": bytes,
        "top_logprobs": lp.top.iter().map(|&(t, l)| {
            let (text, bytes) = token_text(tok, t);
            json!({"token": text, "logprob": l, "bytes": bytes})
        }).collect::<Vec<_>>(),
    })
}

fn tool_call_json(call: &ToolCall, k: usize, id_prefix: &str) -> Value {
    json!({
        "id": call.id.clone().unwrap_or_else(|| format!("call_{id_prefix}_{k}")),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

pub(crate) struct Plan {
    pub think: ThinkStyle,
    pub prompt_len: usize,
    pub n: usize,
    pub stream: bool,
    include_usage: bool,
    logprobs: bool,
    pub tool_format: Option<ToolFormat>,
    pub in_reasoning: bool,
    pub strip: Vec<String>,
}

impl Plan {
    /// A parser of one choice's output into content, reasoning and tool calls.
    pub fn parser(&self) -> OutputParser {
        OutputParser::with_style(
            self.tool_format,
            self.think,
            self.in_reasoning,
            self.strip.clone(),
        )
    }
}

async fn chat(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let obj: Map<String, Value> = json_body(body)?;
    let (plan, rx) = prepare(&state, &obj).await?;
    if plan.stream {
        return Ok(stream_chat(state.clone(), plan, rx));
    }
    respond(&state, plan, rx).await
}

/// A chat request (OpenAI's fields) checked, rendered through the template and handed to the
/// engine.
pub(crate) async fn prepare(
    state: &Arc<AppState>,
    obj: &Map<String, Value>,
) -> ApiResult<(Plan, crate::scheduler::EventRx)> {
    check_model(state, obj)?;
    let engine = &state.engine;
    let tok = engine.tokenizer.as_ref().ok_or_else(|| {
        ApiError::bad_request("This model has no tokenizer; use /v1/completions with token ids.")
    })?;
    let ChatRequest {
        messages: msgs,
        tool_choice,
        parallel,
        guide,
        tools,
        parse_tools,
        kwargs,
        logprobs,
        top,
        common,
    } = ChatRequest::parse(obj, engine.sampling_defaults(), &stream::vocab(state))?;
    let (prompt, rendered) = render_messages(state, msgs, tools.clone(), kwargs).await?;
    let context = engine.memory.ctx_size;
    let budget = api::token_budget(common.max_tokens, prompt.len(), context)?;
    let top_entries = logprobs.then_some(top.unwrap_or(0) as usize);
    api::check_logprob_size(common.stream, top_entries, budget, common.n)?;
    let requests: Vec<Request> = (0..common.n)
        .map(|i| {
            let mut sampling = common.sampling.clone();
            sampling.seed = sampling.seed.wrapping_add(i as u64);
            Request {
                prompt: prompt.clone(),
                max_new_tokens: budget,
                sampling,
                stop: common.stop.clone(),
                ignore_eos: common.ignore_eos,
            }
        })
        .collect();
    let guide = match (&tool_choice, guide) {
        (ToolChoice::Required | ToolChoice::Named(_), Some(_)) => {
            return Err(ApiError::field(
                "response_format",
                "`response_format` and a `tool_choice` that asks for a call cannot both be enforced",
            ))
        }
        (ToolChoice::Required | ToolChoice::Named(_), None) => {
            let only = match &tool_choice {
                ToolChoice::Named(n) => Some(n.as_str()),
                _ => None,
            };
            let list = tools
                .as_ref()
                .and_then(Value::as_array)
                .map_or(&[][..], |v| v.as_slice());
            Some(crate::tool_guide::guide(
                ToolFormat::detect(tok),
                tok,
                list,
                only,
                parallel,
            )?)
        }
        (_, g) => g,
    };
    if let Some(g) = &guide {
        // Compiled here first, so a schema it cannot take is this request's 400.
        let (state, g) = (state.clone(), g.clone());
        blocking(move || {
            state.engine.guidance().and_then(|v| {
                v.matcher(&g)
                    .map(|_| ())
                    .map_err(strata_runtime::EngineError::Guide)
            })
        })
        .await?
        .map_err(|e| ApiError::field("response_format", e.to_string()))?;
    }
    let extras = RequestExtras {
        logprobs: logprobs.then_some(top.unwrap_or(0) as usize),
        keep_special: true,
        guide,
    };
    let rx = submit(state, requests, extras)?;
    state
        .metrics
        .prompt_tokens
        .fetch_add(prompt.len() as u64, Ordering::Relaxed);
    let think = think_style(tok);
    let plan = Plan {
        think,
        prompt_len: prompt.len(),
        n: common.n,
        stream: common.stream,
        include_usage: common.include_usage,
        logprobs,
        tool_format: parse_tools.then(|| ToolFormat::detect(tok)),
        in_reasoning: think.prompt_opens_reasoning(&rendered),
        strip: strip_list(tok, think),
    };
    Ok((plan, rx))
}

/// The chat template over `msgs` (on a blocking thread): the prompt's ids and text.
async fn render_messages(
    state: &Arc<AppState>,
    msgs: Vec<Value>,
    tools: Option<Value>,
    kwargs: Map<String, Value>,
) -> ApiResult<(Vec<u32>, String)> {
    let state = state.clone();
    blocking(move || {
        let tok = state.engine.tokenizer.as_ref().expect("the caller checked it");
        tok.encode_chat(&Value::Array(msgs), tools.as_ref(), true, &kwargs)
    })
    .await?
    .map_err(|e| ApiError::bad_request(format!("The chat template could not render these messages: {e}")))
}

/// The prompt a chat request (OpenAI's fields) renders to, without running it.
pub(crate) async fn render(state: &Arc<AppState>, obj: &Map<String, Value>) -> ApiResult<Vec<u32>> {
    check_model(state, obj)?;
    let engine = &state.engine;
    if engine.tokenizer.is_none() {
        return Err(ApiError::bad_request("This model has no tokenizer."));
    }
    let r = ChatRequest::parse(obj, engine.sampling_defaults(), &stream::vocab(state))?;
    Ok(render_messages(state, r.messages, r.tools, r.kwargs).await?.0)
}

/// The whole answer of a request that is not streamed.
async fn respond(state: &AppState, plan: Plan, mut rx: crate::scheduler::EventRx) -> ApiResult<Response> {
    let tok = state.engine.tokenizer.as_ref().expect("prepare checked it");
    let choices = stream::collect(&mut rx, plan.n).await?;
    let id = stream::request_id("chatcmpl");
    let mut completion_tokens = 0;
    let mut out = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        completion_tokens += c.ids.len();
        let (content, reasoning, calls) = crate::parse::parse_all(&mut plan.parser(), &[&c.text]);
        let mut message = json!({"role": "assistant", "content": content});
        if !reasoning.is_empty() {
            // Both names clients read: `reasoning_content` (DeepSeek, OpenRouter) and `reasoning`
            // (vLLM).
            message["reasoning"] = Value::String(reasoning.clone());
            message["reasoning_content"] = Value::String(reasoning);
        }
        let finish = if calls.is_empty() {
            c.finish.map_or("stop", |r| r.as_str())
        } else {
            if content.is_empty() {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = calls
                .iter()
                .enumerate()
                .map(|(k, call)| tool_call_json(call, k, &format!("{}_{i}", &id[9..])))
                .collect();
            "tool_calls"
        };
        let logprobs = plan.logprobs.then(|| {
            json!({"content": c.ids.iter().zip(&c.logprobs).map(|(&t, lp)| logprob_entry(Some(tok), t, lp)).collect::<Vec<_>>()})
        });
        out.push(json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish}));
    }
    Ok(axum::Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": crate::now(),
        "model": state.options.served_model_name,
        "choices": out,
        "usage": usage(plan.prompt_len, completion_tokens, rx.cached()),
        "system_fingerprint": crate::FINGERPRINT,
    }))
    .into_response())
}

fn stream_chat(state: Arc<AppState>, plan: Plan, mut rx: crate::scheduler::EventRx) -> Response {
    stream::sse(state.options.sse_keepalive, move |sink| async move {
        let id = stream::request_id("chatcmpl");
        let created = crate::now();
        let model = state.options.served_model_name.clone();
        let tok = state.engine.tokenizer.as_ref();
        let chunk = |i: usize, delta: Value, logprobs: Value, finish: Value| {
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": crate::FINGERPRINT,
                "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                "usage": null,
            })
        };
        let piece_delta = |p: &Piece| match p {
            Piece::Content(s) => json!({"content": s}),
            Piece::Reasoning(s) => json!({"reasoning_content": s, "reasoning": s}),
        };
        let mut parsers: Vec<OutputParser> = (0..plan.n).map(|_| plan.parser()).collect();
        for i in 0..plan.n {
            if !sink
                .json(&chunk(
                    i,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    Value::Null,
                ))
                .await
            {
                return;
            }
        }
        let (mut done, mut completion_tokens) = (0, 0);
        while done < plan.n {
            let Some((i, event)) = next_event(&sink, &mut rx).await else {
                return; // client gone: dropping `rx` cancels the sequences
            };
            match event {
                Event::Token {
                    id: t,
                    text,
                    logprobs,
                } => {
                    completion_tokens += 1;
                    let pieces = parsers[i].push(&text);
                    let lp = match (&logprobs, plan.logprobs) {
                        (Some(lp), true) => json!({"content": [logprob_entry(tok, t, lp)]}),
                        _ => Value::Null,
                    };
                    if pieces.is_empty() && !lp.is_null() {
                        if !sink
                            .json(&chunk(i, json!({"content": ""}), lp, Value::Null))
                            .await
                        {
                            return;
                        }
                        continue;
                    }
                    for (k, p) in pieces.iter().enumerate() {
                        let lp = if k == 0 { lp.clone() } else { Value::Null };
                        if !sink.json(&chunk(i, piece_delta(p), lp, Value::Null)).await {
                            return;
                        }
                    }
                }
                Event::Done(reason) => {
                    done += 1;
                    let (pieces, calls) = parsers[i].finish();
                    for p in &pieces {
                        if !sink
                            .json(&chunk(i, piece_delta(p), Value::Null, Value::Null))
                            .await
                        {
                            return;
                        }
                    }
                    for (k, call) in calls.iter().enumerate() {
                        let mut head = tool_call_json(call, k, &format!("{}_{i}", &id[9..]));
                        head["index"] = json!(k);
                        let args = std::mem::take(&mut head["function"]["arguments"]);
                        head["function"]["arguments"] = json!("");
                        let delta = json!({"tool_calls": [head]});
                        let more = json!({"tool_calls": [{"index": k, "function": {"arguments": args}}]});
                        for d in [delta, more] {
                            if !sink.json(&chunk(i, d, Value::Null, Value::Null)).await {
                                return;
                            }
                        }
                    }
                    let finish = if calls.is_empty() {
                        reason.as_str()
                    } else {
                        "tool_calls"
                    };
                    if !sink.json(&chunk(i, json!({}), Value::Null, json!(finish))).await {
                        return;
                    }
                }
                Event::Error(e) => {
                    let err = stream::engine_error(e);
                    let _ = sink
                        .json(&json!({"error": {"message": err.message, "type": err.kind, "param": null, "code": null}}))
                        .await;
                    sink.done().await;
                    return;
                }
            }
        }
        if plan.include_usage {
            let last = json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": crate::FINGERPRINT, "choices": [],
                "usage": usage(plan.prompt_len, completion_tokens, rx.cached()),
            });
            if !sink.json(&last).await {
                return;
            }
        }
        sink.done().await;
    })
}
