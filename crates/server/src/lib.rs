//! `strata serve`: an OpenAI-compatible HTTP API over one loaded model, on axum/tokio.
//!
//! Requests are validated and rendered on the async side (`chat.rs`, `completions.rs`), then
//! each choice becomes a sequence for the engine thread (`scheduler.rs`), which decodes every
//! running sequence together, step by step (continuous batching). Events come back per request
//! on one channel; a client that goes away drops it, and its sequences leave the batch at the
//! next step. Errors are always in OpenAI's shape (`api.rs`).

mod api;
mod chat;
mod completions;
mod metrics;
pub mod parse;
mod scheduler;
mod stream;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use strata_runtime::Engine;

pub use api::ApiError;
use metrics::Metrics;
use scheduler::Scheduler;

/// Largest request body accepted (413 past it).
pub const DEFAULT_BODY_LIMIT: usize = 8 << 20;

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    pub api_key: Option<String>,
    pub served_model_name: String,
    /// Sequences decoded together at most.
    pub max_concurrent: usize,
    /// Sequences that may wait for a place in the batch (429 past it).
    pub max_queued: usize,
    pub body_limit: usize,
}

pub struct AppState {
    pub engine: Arc<Engine>,
    pub options: ServeOptions,
    pub(crate) scheduler: Scheduler,
    pub(crate) metrics: Arc<Metrics>,
    pub created: u64,
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The routes over a loaded engine (the engine thread starts here).
pub fn router(engine: Arc<Engine>, options: ServeOptions) -> Router {
    let metrics = Arc::new(Metrics::default());
    let scheduler = Scheduler::start(
        engine.clone(),
        options.max_concurrent,
        options.max_queued,
        metrics.clone(),
    );
    let body_limit = options.body_limit;
    let state = Arc::new(AppState {
        engine,
        options,
        scheduler,
        metrics,
        created: now(),
    });
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{model}", get(model))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// Serves until Ctrl-C, on a runtime of its own.
pub fn serve_blocking(engine: Arc<Engine>, options: ServeOptions) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("strata-http")
        .build()?
        .block_on(serve(engine, options))
}

/// Serves until Ctrl-C.
pub async fn serve(engine: Arc<Engine>, options: ServeOptions) -> anyhow::Result<()> {
    let addr = options.addr;
    let app = router(engine, options);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    eprintln!("[strata] serving on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

async fn auth(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.options.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError {
                code: Some("invalid_api_key"),
                ..ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_request_error",
                    "Incorrect or missing API key: send `Authorization: Bearer KEY`.",
                )
            }
            .into_response();
        }
    }
    next.run(request).await
}

fn model_card(state: &AppState) -> serde_json::Value {
    json!({
        "id": state.options.served_model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "strata",
    })
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_card(&state)]})).into_response()
}

async fn model(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    if name == state.options.served_model_name {
        axum::Json(model_card(&state)).into_response()
    } else {
        unknown_model(&name).into_response()
    }
}

pub(crate) fn unknown_model(name: &str) -> ApiError {
    ApiError {
        param: Some("model".into()),
        code: Some("model_not_found"),
        ..ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{name}` does not exist."),
        )
    }
}

/// Ready once the model is loaded, which is before the listener opens.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "status": "ok",
        "model": state.options.served_model_name,
        "running": state.metrics.running.load(Ordering::Relaxed),
        "queued": state.metrics.queued.load(Ordering::Relaxed),
    }))
    .into_response()
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(&state.engine),
    )
        .into_response()
}

async fn not_found(request: Request) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("No route for {} {}", request.method(), request.uri().path()),
    )
    .with_code("not_found")
    .into_response()
}
