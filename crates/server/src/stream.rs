//! What both completion endpoints share: reading the JSON body, handing the choices to the
//! engine thread, collecting them, and Server-Sent Events.

use std::convert::Infallible;
use std::future::Future;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use strata_runtime::{FinishReason, Request, RequestExtras, TokenLogprobs};
use tokio::sync::mpsc;

use crate::api::{ApiError, ApiResult, Vocab};
use crate::scheduler::{Event, Job};
use crate::AppState;

/// The request body as a JSON object (400 for bad JSON or UTF-8, 413 past the size limit).
pub fn json_body(body: Result<Bytes, BytesRejection>) -> ApiResult<Map<String, Value>> {
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "The request body is larger than this server accepts.",
            )
            .with_code("request_too_large")
        } else {
            ApiError::bad_request(format!("Could not read the request body: {e}"))
        }
    })?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| ApiError::bad_request(format!("The request body is not valid UTF-8: {e}")))?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ApiError::bad_request(format!(
            "The request body must be a JSON object, got {}",
            match other {
                Value::Array(_) => "an array",
                Value::String(_) => "a string",
                _ => "a scalar",
            }
        ))),
        Err(e) => Err(
            ApiError::bad_request(format!("The request body is not valid JSON: {e}"))
                .with_code("invalid_json"),
        ),
    }
}

/// Checks `model` against the served name.
pub fn check_model(state: &AppState, fields: &Map<String, Value>) -> ApiResult<()> {
    match fields.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if state.options.serves(m) => Ok(()),
        Some(Value::String(m)) => Err(crate::unknown_model(m)),
        Some(v) => Err(ApiError::field(
            "model",
            format!("`model` must be a string, got {v}"),
        )),
    }
}

/// Hands every choice to the engine (429 when the queue is full; 400 when the choices together
/// need more decoding state than the server holds, so could never run). Choice i gets
/// `requests[i]`.
pub fn submit(
    state: &AppState,
    requests: Vec<Request>,
    extras: RequestExtras,
) -> ApiResult<crate::scheduler::EventRx> {
    let engine = &state.engine;
    let needed: usize = requests.iter().map(|r| engine.positions(r)).sum();
    let pool = engine.memory.state_tokens;
    if needed > pool {
        let each = requests.first().map_or(0, |r| engine.positions(r));
        return Err(ApiError::field(
            "max_tokens",
            format!(
                "This request needs {needed} positions of decoding state ({} choice(s) x {each} prompt + completion tokens); the server holds {pool} for all requests together (--mem, --ctx-size, --max-concurrent). Ask for fewer max_tokens or choices.",
                requests.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    if !state.scheduler.try_reserve(requests.len()) {
        return Err(ApiError {
            retry_after: Some(1),
            code: Some("rate_limit_exceeded"),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "The server is busy ({} sequences running or queued at most); retry shortly.",
                    state.scheduler.max_concurrent + state.scheduler.max_queued
                ),
            )
        });
    }
    if let (Some(usage), Some(r)) = (crate::access::current(), requests.first()) {
        usage.prompt(r.prompt.len());
    }
    let (tx, rx) = crate::scheduler::events();
    for (index, request) in requests.into_iter().enumerate() {
        state.scheduler.submit(Job {
            request,
            extras: extras.clone(),
            index,
            events: tx.clone(),
        });
    }
    Ok(rx)
}

/// One finished choice.
#[derive(Default)]
pub struct Choice {
    pub ids: Vec<u32>,
    pub text: String,
    pub logprobs: Vec<TokenLogprobs>,
    pub finish: Option<FinishReason>,
}

pub fn engine_error(message: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        format!("The engine failed on this request: {message}"),
    )
}

/// Waits for every choice to finish.
pub async fn collect(rx: &mut crate::scheduler::EventRx, n: usize) -> ApiResult<Vec<Choice>> {
    let mut choices: Vec<Choice> = (0..n).map(|_| Choice::default()).collect();
    let mut done = 0;
    while done < n {
        let Some((i, event)) = rx.recv().await else {
            return Err(engine_error("the engine stopped".into()));
        };
        let c = &mut choices[i];
        match event {
            Event::Token { id, text, logprobs } => {
                c.ids.push(id);
                c.text.push_str(&text);
                c.logprobs.extend(logprobs);
            }
            Event::Done(reason) => {
                c.finish = Some(reason);
                done += 1;
            }
            Event::Error(e) => return Err(engine_error(e)),
        }
    }
    Ok(choices)
}

/// Where an SSE producer writes; sends fail once the client is gone.
pub struct SseSink {
    tx: mpsc::Sender<Bytes>,
    /// How long the stream may be silent before a comment line keeps it alive.
    keepalive: std::time::Duration,
}

impl SseSink {
    pub async fn json(&self, v: &Value) -> bool {
        self.tx.send(Bytes::from(format!("data: {v}\n\n"))).await.is_ok()
    }

    /// A named event (`event: NAME`), as Anthropic's streams have them.
    pub async fn event(&self, name: &str, v: &Value) -> bool {
        self.tx
            .send(Bytes::from(format!("event: {name}\ndata: {v}\n\n")))
            .await
            .is_ok()
    }

    pub async fn done(&self) {
        let _ = self.tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    }

    /// Resolves when the client has gone away.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// An SSE response whose events `produce` writes, with a comment line after every `keepalive`
/// of silence (a long prompt: proxies with idle timeouts keep the stream). When the client
/// disconnects, the body is dropped, the sink reports it, and the producer returns, dropping
/// the engine's channel.
pub fn sse<F, Fut>(keepalive: std::time::Duration, produce: F) -> Response
where
    F: FnOnce(SseSink) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(produce(SseSink { tx, keepalive }));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<Bytes, Infallible>(b), rx))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// The next engine event, or None when the client went away first.
pub async fn next_event(sink: &SseSink, rx: &mut crate::scheduler::EventRx) -> Option<(usize, Event)> {
    loop {
        tokio::select! {
            e = rx.recv() => return e,
            _ = sink.closed() => return None,
            _ = tokio::time::sleep(sink.keepalive) => {
                if sink.tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                    return None;
                }
            }
        }
    }
}

/// A token's text and bytes as the logprobs fields show them.
pub fn token_text(tok: Option<&strata_tokenizer::Tokenizer>, id: u32) -> (String, Vec<u8>) {
    let text = tok
        .and_then(|t| t.decode(&[id], false).ok())
        .unwrap_or_else(|| format!("<{id}>"));
    let bytes = text.as_bytes().to_vec();
    (text, bytes)
}

/// `usage`, with the prompt tokens the prefix cache gave (`cached`).
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    serde_json::json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// A request id: prefix + 24 hex digits, unique within the process.
pub fn request_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("{prefix}-{:016x}{:08x}", t, n as u32)
}

/// The vocabulary requests are checked against.
pub fn vocab(state: &AppState) -> Vocab<'_> {
    Vocab {
        size: state.engine.model.info().vocab_size,
        masked: &state.engine.masked_ids,
    }
}

/// Runs CPU-heavy request work (template rendering, tokenization) off the async runtime's
/// threads, a few at a time, so slow requests never hold up `/health` or the streams.
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> ApiResult<T> {
    static SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);
    let _slot = SLOTS
        .acquire()
        .await
        .map_err(|_| engine_error("the request workers are closed".into()))?;
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| engine_error(format!("preparing the request failed: {e}")))
}
