//! OpenAI's error shape and the request fields chat and text completions share, validated one by
//! one: a known field with a bad value is a 400 naming it; unknown fields are ignored.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use strata_runtime::SamplingParams;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub retry_after: Option<u64>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// A 400 about one request field.
    pub fn field(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            code: Some("invalid_value"),
            ..ApiError::bad_request(message)
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }});
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

/// Typed access to a request object's fields, each error naming the field.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    pub fn bool(&self, key: &str) -> ApiResult<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::field(
                key,
                format!("`{key}` must be a boolean, got {v}"),
            )),
        }
    }

    pub fn str(&self, key: &str) -> ApiResult<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::field(key, format!("`{key}` must be a string, got {v}"))),
        }
    }

    /// A number within `range` (inclusive).
    pub fn number(&self, key: &str, min: f64, max: f64) -> ApiResult<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let v = n.as_f64().unwrap_or(f64::NAN);
                if v >= min && v <= max {
                    Ok(Some(v))
                } else {
                    Err(ApiError::field(
                        key,
                        format!("`{key}` must be between {min} and {max}, got {v}"),
                    ))
                }
            }
            Some(v) => Err(ApiError::field(key, format!("`{key}` must be a number, got {v}"))),
        }
    }

    /// An integer within `range` (inclusive).
    pub fn int(&self, key: &str, min: i64, max: i64) -> ApiResult<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => match n.as_i64() {
                Some(v) if v >= min && v <= max => Ok(Some(v)),
                _ => Err(ApiError::field(
                    key,
                    format!("`{key}` must be between {min} and {max}, got {n}"),
                )),
            },
            Some(v) => Err(ApiError::field(
                key,
                format!("`{key}` must be an integer, got {v}"),
            )),
        }
    }
}

/// Sampling, stops and limits common to both endpoints.
pub struct Common {
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
}

/// Stop strings longer than this (bytes) are refused.
pub const MAX_STOP_BYTES: usize = 1024;
/// `logit_bias` entries at most.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// The model a request is checked against: its vocabulary, and the ids in it that its
/// tokenizer cannot decode (sorted; never sampled, so never biased either).
pub struct Vocab<'a> {
    pub size: usize,
    pub masked: &'a [u32],
}

pub fn common(
    f: &Fields<'_>,
    defaults: SamplingParams,
    vocab: &Vocab<'_>,
    max_n: usize,
) -> ApiResult<Common> {
    let mut s = defaults;
    if let Some(t) = f.number("temperature", 0.0, 2.0)? {
        s.temperature = t as f32;
    }
    if let Some(p) = f.number("top_p", 0.0, 1.0)? {
        if p <= 0.0 {
            return Err(ApiError::field("top_p", "`top_p` must be in (0, 1]"));
        }
        s.top_p = p as f32;
    }
    if let Some(k) = f.int("top_k", -1, i64::from(u32::MAX))? {
        s.top_k = k.max(0) as usize;
    }
    if let Some(p) = f.number("min_p", 0.0, 1.0)? {
        s.min_p = p as f32;
    }
    if let Some(p) = f.number("repetition_penalty", 0.0, 100.0)? {
        if p <= 0.0 {
            return Err(ApiError::field(
                "repetition_penalty",
                "`repetition_penalty` must be > 0",
            ));
        }
        s.repetition_penalty = p as f32;
    }
    if let Some(p) = f.number("presence_penalty", -2.0, 2.0)? {
        s.presence_penalty = p as f32;
    }
    if let Some(p) = f.number("frequency_penalty", -2.0, 2.0)? {
        s.frequency_penalty = p as f32;
    }
    let seed = f.int("seed", i64::MIN, i64::MAX)?;
    if let Some(seed) = seed {
        s.seed = seed as u64;
    }
    match f.get("logit_bias") {
        None => {}
        Some(Value::Object(map)) if map.len() > MAX_LOGIT_BIAS => {
            return Err(ApiError::field(
                "logit_bias",
                format!(
                    "`logit_bias` has {} entries; at most {MAX_LOGIT_BIAS} are accepted",
                    map.len()
                ),
            ))
        }
        Some(Value::Object(map)) => {
            let size = vocab.size;
            for (k, v) in map {
                let id: u32 = k
                    .parse()
                    .ok()
                    .filter(|&id: &u32| (id as usize) < size)
                    .ok_or_else(|| {
                        ApiError::field(
                            "logit_bias",
                            format!("logit_bias key `{k}` is not a token id below {size}"),
                        )
                    })?;
                if vocab.masked.binary_search(&id).is_ok() {
                    return Err(ApiError::field(
                        "logit_bias",
                        format!(
                            "logit_bias key `{k}` is not a token of this model's tokenizer (the model's vocabulary is padded past it): it is never sampled"
                        ),
                    ));
                }
                let b = v
                    .as_f64()
                    .filter(|b| (-100.0..=100.0).contains(b))
                    .ok_or_else(|| {
                        ApiError::field(
                            "logit_bias",
                            format!("logit_bias[{k}] must be a number in [-100, 100]"),
                        )
                    })?;
                s.logit_bias.push((id, b as f32));
            }
        }
        Some(v) => {
            return Err(ApiError::field(
                "logit_bias",
                format!("`logit_bias` must be an object, got {v}"),
            ))
        }
    }
    let stop: Vec<String> = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if items.len() <= 4 => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::field("stop", "`stop` entries must be strings"))
            })
            .collect::<ApiResult<_>>()?,
        Some(Value::Array(_)) => return Err(ApiError::field("stop", "`stop` takes at most 4 strings")),
        Some(v) => {
            return Err(ApiError::field(
                "stop",
                format!("`stop` must be a string or a list, got {v}"),
            ))
        }
    };
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::field(
            "stop",
            format!(
                "a stop string of {} bytes is longer than the {MAX_STOP_BYTES} accepted",
                long.len()
            ),
        ));
    }
    let max_tokens = match f.int("max_completion_tokens", 1, i64::MAX)? {
        Some(n) => Some(n as usize),
        None => f.int("max_tokens", 1, i64::MAX)?.map(|n| n as usize),
    };
    let n = f.int("n", 1, max_n as i64)?.unwrap_or(1) as usize;
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o).bool("include_usage")?.unwrap_or(false),
        Some(v) => {
            return Err(ApiError::field(
                "stream_options",
                format!("`stream_options` must be an object, got {v}"),
            ))
        }
    };
    f.str("user")?;
    Ok(Common {
        sampling: s,
        max_tokens,
        stop,
        n,
        stream: f.bool("stream")?.unwrap_or(false),
        include_usage,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
    })
}

/// The tokens a request may generate: what it asked for, within the context left after its
/// prompt (a request that cannot fit is a 400 with the numbers). `context` is the server's
/// `--ctx-size`.
pub fn token_budget(asked: Option<usize>, prompt: usize, context: usize) -> ApiResult<usize> {
    if prompt >= context {
        return Err(ApiError::bad_request(format!(
            "This server's maximum context length is {context} tokens (--ctx-size), and the prompt has {prompt} tokens."
        ))
        .with_code("context_length_exceeded"));
    }
    let room = context - prompt;
    match asked {
        Some(n) if n > room => Err(ApiError {
            param: Some("max_tokens".into()),
            ..ApiError::bad_request(format!(
                "This server's maximum context length is {context} tokens (--ctx-size). You asked for {prompt} prompt tokens and {n} completion tokens ({} in all).",
                prompt + n
            ))
            .with_code("context_length_exceeded")
        }),
        Some(n) => Ok(n),
        None => Ok(room),
    }
}

/// Most log-probability entries (sampled + top alternatives, over all choices) one response
/// that is not streamed may carry.
pub const MAX_LOGPROB_ENTRIES: usize = 1 << 18;

/// Refuses a non-streamed response whose log-probabilities would be huge (stream it instead).
pub fn check_logprob_size(stream: bool, top: Option<usize>, tokens: usize, choices: usize) -> ApiResult<()> {
    let Some(top) = top else { return Ok(()) };
    let entries = tokens.saturating_mul(top + 1).saturating_mul(choices);
    if stream || entries <= MAX_LOGPROB_ENTRIES {
        return Ok(());
    }
    Err(ApiError::field(
        "max_tokens",
        format!(
            "log-probabilities of {choices} choice(s) x {tokens} tokens x {} entries ({entries}) exceed the {MAX_LOGPROB_ENTRIES} a response carries; set a smaller max_tokens or top_logprobs, or stream",
            top + 1
        ),
    ))
}
