//! `strata serve`: an OpenAI-compatible HTTP API over one loaded model, on axum/tokio.
//!
//! Requests are validated and rendered on the async side (`chat.rs`, `completions.rs`), then
//! each choice becomes a sequence for the engine thread (`scheduler.rs`), which decodes every
//! running sequence together, step by step (continuous batching). Events come back per request
//! on one channel; a client that goes away drops it, and its sequences leave the batch at the
//! next step. Errors are always in OpenAI's shape (`api.rs`).
//!
//! Before a handler, every request passes `guard.rs` (Host/Origin, CORS, API key, a JSON body
//! within its limits); connections are accepted and timed by `listen.rs`. If the engine thread
//! stops, `/health` answers 503 and the server exits with an error.

mod access;
mod api;
mod chat;
mod chat_request;
mod completions;
#[doc(hidden)]
pub mod fuzzing;
mod guard;
mod listen;
mod messages;
mod metrics;
pub mod parse;
mod scheduler;
mod stream;
mod tokens;
mod tool_guide;
mod web;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use strata_runtime::Engine;

pub use api::ApiError;
pub use guard::{Access, ApiKey};
pub use listen::Limits;
use metrics::Metrics;
use scheduler::Scheduler;

/// Largest request body accepted (413 past it).
pub const DEFAULT_BODY_LIMIT: usize = 8 << 20;

/// `system_fingerprint`: what answers (the server's version).
pub const FINGERPRINT: &str = concat!("strata-", env!("CARGO_PKG_VERSION"));

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    pub api_key: Option<ApiKey>,
    /// The model's name in responses and `/v1/models`.
    pub served_model_name: String,
    /// Other names requests may give it (also listed).
    pub aliases: Vec<String>,
    /// Silence after which a stream gets a comment line (a long prompt).
    pub sse_keepalive: std::time::Duration,
    /// Sequences decoded together at most.
    pub max_concurrent: usize,
    /// Sequences that may wait for a place in the batch (429 past it).
    pub max_queued: usize,
    pub body_limit: usize,
    /// Host names and browser origins answered beyond loopback's.
    pub access: Access,
    /// Connections, timeouts.
    pub limits: Limits,
    /// The prefix cache's disk tier (`--prefix-cache-dir`): its folder and byte budget.
    pub prefix_disk: Option<(std::path::PathBuf, u64)>,
}

impl ServeOptions {
    /// Whether requests may call the model `name`.
    pub fn serves(&self, name: &str) -> bool {
        name == self.served_model_name || self.aliases.iter().any(|a| a == name)
    }

    /// Loopback defaults for a model served as `name` on `addr`.
    pub fn new(addr: SocketAddr, name: impl Into<String>) -> ServeOptions {
        ServeOptions {
            addr,
            api_key: None,
            served_model_name: name.into(),
            aliases: Vec::new(),
            sse_keepalive: std::time::Duration::from_secs(10),
            max_concurrent: 16,
            max_queued: 64,
            body_limit: DEFAULT_BODY_LIMIT,
            access: Access::default(),
            limits: Limits::default(),
            prefix_disk: None,
        }
    }
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

/// The routes over a loaded engine (the engine thread starts here), the engine's health, and
/// the scheduler (a stop waits for its disk writes). Err: the prefix cache's folder cannot be
/// used.
pub fn router(
    engine: Arc<Engine>,
    options: ServeOptions,
) -> anyhow::Result<(Router, scheduler::EngineHealth, Scheduler)> {
    let metrics = Arc::new(Metrics::default());
    let prefix_disk = match &options.prefix_disk {
        Some((dir, bytes)) => {
            let template = engine.new_cache();
            let disk = strata_runtime::PrefixDisk::open(dir, &engine.state_key, *bytes, &template)
                .map_err(|e| anyhow::anyhow!("--prefix-cache-dir: {e}"))?;
            let s = disk.stats();
            eprintln!(
                "[strata] prefix cache on disk: {} ({} states, {:.1} MiB of {:.1} GiB)",
                dir.join(&engine.state_key).display(),
                s.entries,
                s.bytes as f64 / (1u64 << 20) as f64,
                *bytes as f64 / (1u64 << 30) as f64
            );
            Some(disk)
        }
        None => None,
    };
    let scheduler = Scheduler::start(
        engine.clone(),
        options.max_concurrent,
        options.max_queued,
        metrics.clone(),
        prefix_disk,
    );
    let body_limit = options.body_limit;
    let engine_health = scheduler.health.clone();
    let flush_with = scheduler.clone();
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
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard::auth));
    let app = Router::new()
        .merge(api)
        .route("/", get(web::index))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), guard::body))
        .layer(middleware::from_fn_with_state(state.clone(), guard::access))
        .layer(middleware::from_fn(access::log))
        .with_state(state);
    Ok((app, engine_health, flush_with))
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

/// Serves until Ctrl-C or SIGTERM (Ok) or until the engine thread stops (Err, with its reason).
pub async fn serve(engine: Arc<Engine>, options: ServeOptions) -> anyhow::Result<()> {
    let addr = options.addr;
    if !addr.ip().is_loopback() && options.api_key.is_none() {
        eprintln!(
            "[strata] warning: listening on {addr}, beyond this machine, with no API key: anyone who can reach it can use it (set --api-key or STRATA_API_KEY)"
        );
    }
    let limits = options.limits.clone();
    let (app, health, scheduler) = router(engine, options)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    eprintln!("[strata] serving on http://{}", listener.local_addr()?);
    let engine_stopped = health.clone().wait_stopped();
    let stopped = std::sync::Mutex::new(None);
    listen::serve(listener, app, limits, async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminated() => {}
            reason = engine_stopped => {
                eprintln!("[strata] the engine stopped ({reason}); shutting down");
                *stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
            }
        }
    })
    .await?;
    // The states being written when the stop came (a conversation's last turn).
    let limit = std::time::Duration::from_secs(30);
    if !tokio::task::spawn_blocking(move || scheduler.flush(limit))
        .await
        .unwrap_or(true)
    {
        eprintln!("[strata] the prefix cache's disk writes did not end within 30 s; stopping without them");
    }
    let reason = stopped.into_inner().unwrap_or_else(|e| e.into_inner());
    match reason {
        Some(reason) => anyhow::bail!("the engine stopped: {reason}"),
        None => Ok(()),
    }
}

/// Resolves at SIGTERM (a service manager's or container's stop), never where there is none.
async fn terminated() {
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        term.recv().await;
        return;
    }
    std::future::pending::<()>().await
}

fn model_card(state: &AppState, name: &str) -> serde_json::Value {
    json!({
        "id": name,
        "object": "model",
        "created": state.created,
        "owned_by": "strata",
    })
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let o = &state.options;
    let names = std::iter::once(&o.served_model_name).chain(&o.aliases);
    let data: Vec<_> = names.map(|n| model_card(&state, n)).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn model(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    if state.options.serves(&name) {
        axum::Json(model_card(&state, &name)).into_response()
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

/// Ready once the model is loaded, which is before the listener opens; 503 once the engine
/// thread has stopped.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    if let Some(reason) = state.scheduler.health.stopped() {
        let body = json!({
            "status": "error",
            "model": state.options.served_model_name,
            "error": format!("the engine stopped: {reason}"),
        });
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
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
