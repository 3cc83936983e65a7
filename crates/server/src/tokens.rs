//! `POST /tokenize` and `POST /detokenize`, as llama-server has them: text to the model's token
//! ids (`{"content", "add_special", "with_pieces"}` -> `{"tokens"}`) and back (`{"tokens"}` ->
//! `{"content"}`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::api::ApiResult;
use crate::stream::{blocking, json_body};
use crate::{ApiError, AppState};

fn has_tokenizer(state: &AppState) -> ApiResult<()> {
    match state.engine.tokenizer {
        Some(_) => Ok(()),
        None => Err(ApiError::bad_request(
            "This model has no tokenizer: it takes token ids only.",
        )),
    }
}

pub async fn tokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match tokenize_inner(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn tokenize_inner(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let fields = json_body(body)?;
    let content = match fields.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::field("content", "`content` must be a string")),
        None => return Err(ApiError::field("content", "`content` is required")),
    };
    let flag = |name: &str| match fields.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::field(name, format!("`{name}` must be a boolean"))),
    };
    let (add_special, with_pieces) = (flag("add_special")?, flag("with_pieces")?);
    has_tokenizer(&state)?;
    let tokens = blocking(move || -> ApiResult<Value> {
        let tok = state.engine.tokenizer.as_ref().expect("checked above");
        let ids = tok
            .encode(&content, add_special)
            .map_err(|e| ApiError::field("content", format!("could not tokenize: {e}")))?;
        Ok(if with_pieces {
            let pieces = ids.iter().map(|&id| {
                let piece = tok.decode(&[id], false).unwrap_or_default();
                json!({"id": id, "piece": piece})
            });
            Value::Array(pieces.collect())
        } else {
            json!(ids)
        })
    })
    .await??;
    Ok(axum::Json(json!({ "tokens": tokens })).into_response())
}

pub async fn detokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match detokenize_inner(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn detokenize_inner(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let fields = json_body(body)?;
    let bad = || ApiError::field("tokens", "`tokens` must be an array of token ids");
    let ids: Vec<u32> = match fields.get("tokens") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad))
            .collect::<ApiResult<_>>()?,
        _ => return Err(bad()),
    };
    has_tokenizer(&state)?;
    let vocab = state.engine.model.info().vocab_size;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::field(
            "tokens",
            format!("token id {id} is past the vocabulary ({vocab})"),
        ));
    }
    let content = blocking(move || {
        let tok = state.engine.tokenizer.as_ref().expect("checked above");
        tok.decode(&ids, false)
            .map_err(|e| ApiError::field("tokens", format!("could not detokenize: {e}")))
    })
    .await??;
    Ok(axum::Json(json!({ "content": content })).into_response())
}
