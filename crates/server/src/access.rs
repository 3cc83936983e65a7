//! The access log: one line per request at `info` under the target `strata::access` (on by
//! default in `strata serve`; `STRATA_LOG` or `RUST_LOG` filters it), written when the response
//! has been sent in full (a stream's last event included) or the client went away: method, path
//! (no query: nothing secret), status, the whole duration, and for generation requests the
//! prompt and completion tokens and the time to the first token. Bodies and keys are never
//! logged.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::BodyExt;

/// What a generation request did, filled in as it runs.
pub struct Usage {
    start: Instant,
    prompt: AtomicUsize,
    completion: AtomicUsize,
    first_token: OnceLock<Instant>,
}

const UNSET: usize = usize::MAX;

impl Usage {
    fn new() -> Usage {
        Usage {
            start: Instant::now(),
            prompt: AtomicUsize::new(UNSET),
            completion: AtomicUsize::new(0),
            first_token: OnceLock::new(),
        }
    }

    /// The request's prompt tokens (once per request, whatever its number of choices).
    pub fn prompt(&self, tokens: usize) {
        self.prompt.store(tokens, Ordering::Relaxed);
    }

    /// A generated token (of any choice).
    pub fn token(&self) {
        self.first_token.get_or_init(Instant::now);
        self.completion.fetch_add(1, Ordering::Relaxed);
    }

    /// " prompt P completion C ttft T s" for a generation request, else "".
    fn describe(&self) -> String {
        let prompt = self.prompt.load(Ordering::Relaxed);
        if prompt == UNSET {
            return String::new();
        }
        let ttft = self.first_token.get().map_or("-".to_string(), |t| {
            format!("{:.3} s", (*t - self.start).as_secs_f64())
        });
        format!(
            " | prompt {prompt} completion {} tokens | first token {ttft}",
            self.completion.load(Ordering::Relaxed)
        )
    }
}

tokio::task_local! {
    /// The usage record of the request whose handler runs.
    static USAGE: Arc<Usage>;
}

/// The running request's usage record (None outside a request, e.g. in unit tests).
pub fn current() -> Option<Arc<Usage>> {
    USAGE.try_with(|u| u.clone()).ok()
}

/// Writes the line when dropped: when the body has been sent or abandoned.
struct Line {
    method: axum::http::Method,
    path: String,
    status: u16,
    usage: Arc<Usage>,
}

impl Drop for Line {
    fn drop(&mut self) {
        tracing::info!(
            target: "strata::access",
            "{} {} {} {:.3} s{}",
            self.method,
            self.path,
            self.status,
            self.usage.start.elapsed().as_secs_f64(),
            self.usage.describe()
        );
    }
}

/// The middleware.
pub async fn log(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let usage = Arc::new(Usage::new());
    let response = USAGE.scope(usage.clone(), next.run(request)).await;
    let line = Line {
        method,
        path,
        status: response.status().as_u16(),
        usage,
    };
    response.map(move |body| {
        Body::new(body.map_frame(move |frame| {
            let _ = &line;
            frame
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_requests_say_their_tokens_and_others_nothing() {
        let u = Usage::new();
        assert_eq!(u.describe(), "");
        u.prompt(12);
        assert!(
            u.describe()
                .contains("prompt 12 completion 0 tokens | first token -"),
            "{}",
            u.describe()
        );
        u.token();
        u.token();
        let d = u.describe();
        assert!(
            d.contains("prompt 12 completion 2 tokens | first token 0.0"),
            "{d}"
        );
    }
}
