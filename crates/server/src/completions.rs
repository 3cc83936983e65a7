//! `POST /v1/completions`: raw text (or token id) prompts, `n` choices per prompt, integer
//! `logprobs` in the completions format; streamed as SSE chunks or returned whole.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use strata_runtime::{Request, RequestExtras, TokenLogprobs};
use strata_tokenizer::Tokenizer;

use crate::api::{self, ApiError, ApiResult, Fields};
use crate::scheduler::Event;
use crate::stream::{self, blocking, check_model, json_body, next_event, submit, token_text, usage};
use crate::AppState;

const MAX_CHOICES: usize = 16;
const MAX_LOGPROBS: i64 = 20;

pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    match complete(state.clone(), body).await {
        Ok(r) => r,
        Err(e) => {
            state.metrics.requests_failed.fetch_add(1, Ordering::Relaxed);
            e.into_response()
        }
    }
}

fn ids(v: &[Value]) -> Option<Vec<u32>> {
    v.iter()
        .map(|x| x.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as u32))
        .collect()
}

/// The prompts of a request: a string, a list of strings, a list of ids, or a list of id lists.
pub(crate) fn prompts(v: Option<&Value>, tok: Option<&Tokenizer>) -> ApiResult<Vec<Vec<u32>>> {
    let encode = |text: &str| -> ApiResult<Vec<u32>> {
        let tok =
            tok.ok_or_else(|| ApiError::field("prompt", "this model has no tokenizer: give token ids"))?;
        tok.encode(text, true)
            .map_err(|e| ApiError::field("prompt", format!("the prompt could not be tokenized: {e}")))
    };
    let bad = || {
        ApiError::field(
            "prompt",
            "`prompt` must be a string, a list of strings, or token ids",
        )
    };
    let out = match v {
        None | Some(Value::Null) => return Err(ApiError::field("prompt", "`prompt` is required")),
        Some(Value::String(s)) => vec![encode(s)?],
        Some(Value::Array(items)) if items.is_empty() => return Err(bad()),
        Some(Value::Array(items)) => match &items[0] {
            Value::String(_) => items
                .iter()
                .map(|i| i.as_str().ok_or_else(bad).and_then(encode))
                .collect::<ApiResult<_>>()?,
            Value::Number(_) => vec![ids(items).ok_or_else(bad)?],
            Value::Array(_) => items
                .iter()
                .map(|i| i.as_array().and_then(|a| ids(a)).ok_or_else(bad))
                .collect::<ApiResult<_>>()?,
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    };
    if out.iter().any(|p| p.is_empty()) {
        return Err(ApiError::field("prompt", "a prompt must have at least one token"));
    }
    Ok(out)
}

/// The request's fields besides the prompt: (integer `logprobs`, what both endpoints share).
pub(crate) fn fields(
    obj: &Map<String, Value>,
    defaults: strata_runtime::SamplingParams,
    vocab: &api::Vocab<'_>,
) -> ApiResult<(Option<i64>, api::Common)> {
    let f = Fields(obj);
    if f.bool("echo")?.unwrap_or(false) {
        return Err(ApiError::field("echo", "`echo` is not supported"));
    }
    if f.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::field("suffix", "`suffix` is not supported"));
    }
    let logprobs = f.int("logprobs", 0, MAX_LOGPROBS)?;
    Ok((logprobs, api::common(&f, defaults, vocab, MAX_CHOICES)?))
}

/// The prompts against the choice limit and the vocabulary.
pub(crate) fn check_prompts(prompts: &[Vec<u32>], n: usize, vocab: usize) -> ApiResult<()> {
    if prompts.len().saturating_mul(n) > MAX_CHOICES {
        return Err(ApiError::field(
            "n",
            format!("at most {MAX_CHOICES} choices per request (prompts x n)"),
        ));
    }
    if let Some(&bad) = prompts.iter().flatten().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::field(
            "prompt",
            format!("token id {bad} is not below the vocabulary size {vocab}"),
        ));
    }
    Ok(())
}

/// Completions-format logprobs of one choice's tokens.
fn logprobs_json(tok: Option<&Tokenizer>, ids: &[u32], lps: &[TokenLogprobs], offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(ids.len());
    let mut at = offset;
    let mut tokens = Vec::with_capacity(ids.len());
    for &id in ids {
        let (t, _) = token_text(tok, id);
        text_offset.push(at);
        at += t.len();
        tokens.push(t);
    }
    let top: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut m = Map::new();
            for &(t, l) in &lp.top {
                m.insert(token_text(tok, t).0, json!(l));
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": tokens,
        "token_logprobs": lps.iter().map(|lp| lp.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

async fn complete(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let obj = json_body(body)?;
    check_model(&state, &obj)?;
    let engine = &state.engine;
    let tok = engine.tokenizer.as_ref();
    let (logprobs, common) = fields(&obj, engine.sampling_defaults(), &stream::vocab(&state))?;
    let prompts = {
        let (state, prompt) = (state.clone(), obj.get("prompt").cloned());
        blocking(move || prompts(prompt.as_ref(), state.engine.tokenizer.as_ref())).await??
    };
    check_prompts(&prompts, common.n, engine.model.info().vocab_size)?;
    let context = engine.memory.ctx_size;
    let mut requests = Vec::new();
    let mut prompt_tokens = 0;
    for p in &prompts {
        let room = api::token_budget(common.max_tokens, p.len(), context)?;
        // OpenAI's default for completions is 16 tokens.
        let budget = if common.max_tokens.is_some() {
            room
        } else {
            room.min(16)
        };
        prompt_tokens += p.len();
        for j in 0..common.n {
            let mut sampling = common.sampling.clone();
            sampling.seed = sampling.seed.wrapping_add(j as u64);
            requests.push(Request {
                prompt: p.clone(),
                max_new_tokens: budget,
                sampling,
                stop: common.stop.clone(),
                ignore_eos: common.ignore_eos,
            });
        }
    }
    let n = requests.len();
    let longest = requests.iter().map(|r| r.max_new_tokens).max().unwrap_or(0);
    api::check_logprob_size(common.stream, logprobs.map(|k| k as usize), longest, n)?;
    let extras = RequestExtras {
        logprobs: logprobs.map(|k| k as usize),
        keep_special: false,
        guide: None,
    };
    let rx = submit(&state, requests, extras)?;
    state
        .metrics
        .prompt_tokens
        .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
    let id = stream::request_id("cmpl");
    let created = crate::now();
    let model = state.options.served_model_name.clone();
    if common.stream {
        let include_usage = common.include_usage;
        let want_lp = logprobs.is_some();
        let state = state.clone();
        let mut rx = rx;
        return Ok(stream::sse(state.options.sse_keepalive, move |sink| async move {
            let tok = state.engine.tokenizer.as_ref();
            let chunk = |i: usize, text: &str, lp: Value, finish: Value| {
                json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "system_fingerprint": crate::FINGERPRINT,
                    "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}],
                    "usage": null,
                })
            };
            let mut offsets = vec![0usize; n];
            let (mut done, mut completion_tokens) = (0, 0);
            while done < n {
                let Some((i, event)) = next_event(&sink, &mut rx).await else {
                    return;
                };
                let sent = match event {
                    Event::Token {
                        id: t,
                        text,
                        logprobs,
                    } => {
                        completion_tokens += 1;
                        let lp = match (want_lp, logprobs) {
                            (true, Some(lp)) => {
                                let v = logprobs_json(tok, &[t], std::slice::from_ref(&lp), offsets[i]);
                                offsets[i] += token_text(tok, t).0.len();
                                v
                            }
                            _ => Value::Null,
                        };
                        if text.is_empty() && lp.is_null() {
                            continue;
                        }
                        sink.json(&chunk(i, &text, lp, Value::Null)).await
                    }
                    Event::Done(reason) => {
                        done += 1;
                        sink.json(&chunk(i, "", Value::Null, json!(reason.as_str())))
                            .await
                    }
                    Event::Error(e) => {
                        let err = stream::engine_error(e);
                        let _ = sink
                            .json(&json!({"error": {"message": err.message, "type": err.kind, "param": null, "code": null}}))
                            .await;
                        sink.done().await;
                        return;
                    }
                };
                if !sent {
                    return;
                }
            }
            if include_usage {
                let last = json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "system_fingerprint": crate::FINGERPRINT, "choices": [],
                    "usage": usage(prompt_tokens, completion_tokens, rx.cached()),
                });
                if !sink.json(&last).await {
                    return;
                }
            }
            sink.done().await;
        }));
    }
    let mut rx = rx;
    let choices = stream::collect(&mut rx, n).await?;
    let completion_tokens: usize = choices.iter().map(|c| c.ids.len()).sum();
    let out: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = logprobs.map(|_| logprobs_json(tok, &c.ids, &c.logprobs, 0));
            json!({
                "index": i,
                "text": c.text,
                "logprobs": lp,
                "finish_reason": c.finish.map_or("stop", |r| r.as_str()),
            })
        })
        .collect();
    Ok(axum::Json(json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "usage": usage(prompt_tokens, completion_tokens, rx.cached()),
        "system_fingerprint": crate::FINGERPRINT,
    }))
    .into_response())
}
