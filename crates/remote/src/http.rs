//! HTTP for model files: whole small files and `Range` reads, every response checked (status 206,
//! `Content-Range` start/end/total, body length), retried with exponential backoff and jitter on
//! 5xx, 429 (honouring `Retry-After`), timeouts, resets and short or wrong bodies, then a clear
//! error naming the URL and range. Redirects are followed by hand: the token goes only to the
//! endpoint's own host, and a redirect target is remembered until it expires.
//!
//! Bodies are never trusted for their size: a range body is read in chunks of at most
//! [`CHUNK`] bytes straight to its sink (the cache file), and one byte more than asked for is an
//! error; a whole file is read up to [`MAX_WHOLE_FILE`] bytes. Each read of the body has its
//! own timeout, so a slow link is slow, not failed, as long as bytes keep coming.

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::blocking::{Client, Response};
use reqwest::header::{
    HeaderMap, AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, ETAG, LAST_MODIFIED, LOCATION, RANGE,
    RETRY_AFTER,
};
use reqwest::StatusCode;

/// Bytes a body is read in (to the sink) at most.
pub const CHUNK: usize = 1 << 20;
/// Whole files (configs, tokenizers, index) larger than this are refused.
pub const MAX_WHOLE_FILE: u64 = 256 << 20;

/// Where a range body goes: `(offset in the file, bytes)`, in order from the range's start (a
/// retry starts over from it). An Err (a full disk, say) ends the fetch at once, unretried.
pub type Sink<'a> = &'a mut dyn FnMut(u64, &[u8]) -> Result<(), String>;

/// How hard to try.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
    pub timeout: Duration,
}

impl RetryPolicy {
    /// Defaults, overridable by `STRATA_HTTP_ATTEMPTS`, `STRATA_HTTP_BACKOFF_MS` and
    /// `STRATA_HTTP_TIMEOUT_S`.
    pub fn from_env() -> RetryPolicy {
        let num = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
        RetryPolicy {
            attempts: num("STRATA_HTTP_ATTEMPTS", 6) as u32,
            backoff: Duration::from_millis(num("STRATA_HTTP_BACKOFF_MS", 250)),
            max_backoff: Duration::from_secs(30),
            timeout: Duration::from_secs(num("STRATA_HTTP_TIMEOUT_S", 60)),
        }
    }
}

/// A failed fetch: `not_found` ones are not retried and may be expected (optional files).
#[derive(Debug)]
pub struct FetchError {
    pub not_found: bool,
    pub message: String,
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

pub struct Fetched {
    /// A whole file's bytes (empty for range reads: they went to their sink).
    pub body: Vec<u8>,
    /// Headers of the first response of the redirect chain and of the last, merged (the first
    /// wins: `X-Repo-Commit` and `X-Linked-Etag` come on the resolve response).
    pub headers: HeaderMap,
    /// For range reads: the file's total size from `Content-Range`.
    pub total: Option<u64>,
    /// The final response's `ETag`, else its `Last-Modified`: what changes when the file does.
    pub validator: Option<String>,
}

/// The final response's validator of the file's version.
fn validator(final_headers: &HeaderMap) -> Option<String> {
    let etag = final_headers.get(ETAG).and_then(|v| v.to_str().ok());
    let modified = final_headers.get(LAST_MODIFIED).and_then(|v| v.to_str().ok());
    etag.map(|e| format!("etag {}", e.trim_start_matches("W/")))
        .or_else(|| modified.map(|m| format!("last-modified {m}")))
}

/// What an attempt does with the body.
enum Body<'a> {
    Whole,
    Range { offset: u64, len: u64, sink: Sink<'a> },
}

pub struct Http {
    client: Client,
    token: Option<String>,
    /// The only host the token is sent to.
    token_host: Option<String>,
    policy: RetryPolicy,
    /// url -> (redirect target, valid until)
    redirects: Mutex<HashMap<String, (String, Instant)>>,
    /// Range requests that returned data (one per contiguous missing run).
    pub range_requests: AtomicU64,
    /// Every request sent, retries and redirects included.
    pub attempts: AtomicU64,
    pub bytes: AtomicU64,
}

fn host_of(url: &str) -> Option<String> {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
}

/// How long a redirect target stays valid: its `Expires`/`X-Amz-Expires` query, else 10 min.
fn redirect_lifetime(target: &str) -> Duration {
    let Ok(url) = reqwest::Url::parse(target) else {
        return Duration::from_secs(600);
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for (k, v) in url.query_pairs() {
        let Ok(n) = v.parse::<u64>() else { continue };
        match k.as_ref() {
            "Expires" if n > now => return Duration::from_secs((n - now).saturating_sub(30)),
            "X-Amz-Expires" => return Duration::from_secs(n.saturating_sub(30)),
            _ => {}
        }
    }
    Duration::from_secs(600)
}

/// A response's `Content-Range`.
fn content_range(h: &HeaderMap) -> Option<(u64, u64, u64)> {
    parse_content_range(h.get(CONTENT_RANGE)?.to_str().ok()?)
}

/// `bytes a-b/total` -> (a, b, total), with a <= b < total (anything else is not a range
/// this client can have asked for).
pub fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let (a, b, total): (u64, u64, u64) = (
        a.trim().parse().ok()?,
        b.trim().parse().ok()?,
        total.trim().parse().ok()?,
    );
    (a <= b && b < total).then_some((a, b, total))
}

enum Attempt {
    Done(Fetched),
    Retry { why: String, after: Option<Duration> },
    Fail(FetchError),
}

impl Http {
    pub fn new(
        token: Option<String>,
        token_host: Option<String>,
        policy: RetryPolicy,
    ) -> Result<Http, String> {
        let client = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(policy.timeout)
            .connect_timeout(Duration::from_secs(15))
            .user_agent(concat!("strata/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Http {
            client,
            token,
            token_host,
            policy,
            redirects: Mutex::new(HashMap::new()),
            range_requests: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        })
    }

    /// One request, redirects followed. Returns the final response and the merged headers.
    fn send(&self, url: &str, range: Option<(u64, u64)>) -> Result<(Response, HeaderMap), String> {
        let cached = {
            let map = self.redirects.lock().expect("redirect cache");
            map.get(url)
                .filter(|(_, until)| Instant::now() < *until)
                .map(|(t, _)| t.clone())
        };
        let mut target = cached.unwrap_or_else(|| url.to_string());
        let mut first_headers: Option<HeaderMap> = None;
        for _ in 0..10 {
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let mut req = self.client.get(&target);
            if let Some((a, b)) = range {
                req = req.header(RANGE, format!("bytes={a}-{b}"));
            }
            if let (Some(token), Some(host)) = (&self.token, &self.token_host) {
                if host_of(&target).as_deref() == Some(host.as_str()) {
                    req = req.header(AUTHORIZATION, format!("Bearer {token}"));
                }
            }
            let resp = req.send().map_err(|e| format!("{e}"))?;
            let status = resp.status();
            let headers = resp.headers().clone();
            if status.is_redirection() {
                let loc = headers
                    .get(LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| format!("redirect {status} without a Location"))?;
                let next = reqwest::Url::parse(&target)
                    .and_then(|base| base.join(loc))
                    .map_err(|e| format!("bad redirect Location `{loc}`: {e}"))?
                    .to_string();
                if first_headers.is_none() {
                    first_headers = Some(headers);
                }
                self.redirects.lock().expect("redirect cache").insert(
                    url.to_string(),
                    (next.clone(), Instant::now() + redirect_lifetime(&next)),
                );
                target = next;
                continue;
            }
            let mut merged = first_headers.unwrap_or_default();
            for (k, v) in headers.iter() {
                if !merged.contains_key(k) {
                    merged.insert(k.clone(), v.clone());
                }
            }
            // A range response's Content-Range is the final one's.
            if let Some(cr) = headers.get(CONTENT_RANGE) {
                merged.insert(CONTENT_RANGE, cr.clone());
            }
            if status == StatusCode::FORBIDDEN || status == StatusCode::GONE {
                // An expired signed redirect: forget it so the next attempt resolves again.
                self.redirects.lock().expect("redirect cache").remove(url);
            }
            return Ok((resp, merged));
        }
        Err("more than 10 redirects".into())
    }

    fn attempt(&self, url: &str, body: &mut Body<'_>) -> Attempt {
        let range = match body {
            Body::Range { offset, len, .. } => Some((*offset, *offset + *len - 1)),
            Body::Whole => None,
        };
        let (mut resp, headers) = match self.send(url, range) {
            Ok(r) => r,
            Err(e) => return Attempt::Retry { why: e, after: None },
        };
        let status = resp.status();
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let version = validator(resp.headers());
        let declared = resp
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        match (status.as_u16(), body) {
            (206, Body::Range { offset, len, sink }) => {
                let (a, b) = (*offset, *offset + *len - 1);
                let total = match content_range(&headers) {
                    Some((s, e, total)) if s == a && e == b && declared.is_none_or(|n| n == *len) => total,
                    Some((s, e, total)) => {
                        return Attempt::Retry {
                            why: format!(
                            "answered bytes {s}-{e}/{total} (Content-Length {declared:?}) for bytes {a}-{b}"
                        ),
                            after: None,
                        }
                    }
                    None => {
                        return Attempt::Retry {
                            why: "206 without a valid Content-Range".into(),
                            after: None,
                        }
                    }
                };
                match read_range(&mut resp, a, *len, sink) {
                    Ok(()) => Attempt::Done(Fetched {
                        body: Vec::new(),
                        headers,
                        total: Some(total),
                        validator: version,
                    }),
                    Err(ReadError::Server(why)) => Attempt::Retry { why, after: None },
                    Err(ReadError::Sink(message)) => Attempt::Fail(FetchError {
                        not_found: false,
                        message,
                    }),
                }
            }
            (200, Body::Range { .. }) => Attempt::Retry {
                why: "200 instead of 206 (the server ignored Range)".into(),
                after: None,
            },
            (200, Body::Whole) => {
                if declared.is_some_and(|n| n > MAX_WHOLE_FILE) {
                    return Attempt::Fail(FetchError {
                        not_found: false,
                        message: format!(
                            "the file is {} bytes, more than the {MAX_WHOLE_FILE} a whole-file read takes",
                            declared.unwrap_or_default()
                        ),
                    });
                }
                let mut bytes = Vec::new();
                if let Err(e) = (&mut resp).take(MAX_WHOLE_FILE + 1).read_to_end(&mut bytes) {
                    return Attempt::Retry {
                        why: format!("reading the body: {e}"),
                        after: None,
                    };
                }
                if bytes.len() as u64 > MAX_WHOLE_FILE {
                    return Attempt::Fail(FetchError {
                        not_found: false,
                        message: format!(
                            "the body is longer than the {MAX_WHOLE_FILE} bytes a whole-file read takes"
                        ),
                    });
                }
                match declared {
                    Some(n) if n != bytes.len() as u64 => Attempt::Retry {
                        why: format!("Content-Length {n} but {} bytes arrived", bytes.len()),
                        after: None,
                    },
                    _ => Attempt::Done(Fetched {
                        body: bytes,
                        headers,
                        total: None,
                        validator: version,
                    }),
                }
            }
            (401 | 403, _) => Attempt::Fail(FetchError {
                not_found: false,
                message: format!(
                    "{status}: access denied (gated or private? set HF_TOKEN){}",
                    if self.token.is_some() {
                        ""
                    } else {
                        "; no token was sent"
                    }
                ),
            }),
            (404, _) => Attempt::Fail(FetchError {
                not_found: true,
                message: "404 not found".into(),
            }),
            (416, _) => Attempt::Fail(FetchError {
                not_found: false,
                message: "416: the range is past the end of the file (did it change on the server?)".into(),
            }),
            (429 | 500..=599, _) => Attempt::Retry {
                why: format!("{status}"),
                after: retry_after,
            },
            _ => Attempt::Fail(FetchError {
                not_found: false,
                message: format!("unexpected {status}"),
            }),
        }
    }

    fn with_retries(&self, url: &str, mut body: Body<'_>) -> Result<Fetched, FetchError> {
        let what = match &body {
            Body::Range { offset, len, .. } => format!("{url} (bytes {offset}-{})", offset + len - 1),
            Body::Whole => url.to_string(),
        };
        let mut delay = self.policy.backoff;
        let mut last = String::new();
        for attempt in 1..=self.policy.attempts.max(1) {
            match self.attempt(url, &mut body) {
                Attempt::Done(f) => {
                    let n = match &body {
                        Body::Range { len, .. } => *len,
                        Body::Whole => f.body.len() as u64,
                    };
                    self.bytes.fetch_add(n, Ordering::Relaxed);
                    return Ok(f);
                }
                Attempt::Fail(mut e) => {
                    e.message = format!("{what}: {}", e.message);
                    return Err(e);
                }
                Attempt::Retry { why, after } => {
                    tracing::warn!("{what}: {why} (attempt {attempt} of {})", self.policy.attempts);
                    last = why;
                    if attempt < self.policy.attempts {
                        // Exponential backoff with full jitter; Retry-After when the server gives one.
                        let jitter = rand_unit();
                        let wait = after.unwrap_or_else(|| delay.mul_f64(0.5 + jitter));
                        std::thread::sleep(wait.min(self.policy.max_backoff));
                        delay = (delay * 2).min(self.policy.max_backoff);
                    }
                }
            }
        }
        Err(FetchError {
            not_found: false,
            message: format!("{what}: {last} (gave up after {} attempts)", self.policy.attempts),
        })
    }

    /// A whole file (at most [`MAX_WHOLE_FILE`] bytes).
    pub fn get(&self, url: &str) -> Result<Fetched, FetchError> {
        self.with_retries(url, Body::Whole)
    }

    /// Bytes [offset, offset + len) of a file, checked, streamed to `sink` in chunks.
    pub fn get_range(&self, url: &str, offset: u64, len: u64, sink: Sink<'_>) -> Result<Fetched, FetchError> {
        if len == 0 {
            return Err(FetchError {
                not_found: false,
                message: format!("{url}: an empty range at {offset}"),
            });
        }
        let f = self.with_retries(url, Body::Range { offset, len, sink })?;
        self.range_requests.fetch_add(1, Ordering::Relaxed);
        Ok(f)
    }

    /// Bytes [offset, offset + len) of a file into memory (small reads: a header).
    pub fn get_range_bytes(
        &self,
        url: &str,
        offset: u64,
        len: u64,
    ) -> Result<(Fetched, Vec<u8>), FetchError> {
        let mut bytes = vec![0u8; len as usize];
        let f = self.get_range(url, offset, len, &mut |at, chunk| {
            let i = (at - offset) as usize;
            bytes[i..i + chunk.len()].copy_from_slice(chunk);
            Ok(())
        })?;
        Ok((f, bytes))
    }
}

enum ReadError {
    /// The server's fault (short, long or broken body): retried.
    Server(String),
    /// The sink's (the cache's): not retried.
    Sink(String),
}

/// Reads exactly `len` bytes of a range body starting at file offset `offset` into `sink`, in
/// chunks; a body that goes on past them is an error (at most one chunk more is read).
fn read_range(resp: &mut Response, offset: u64, len: u64, sink: Sink<'_>) -> Result<(), ReadError> {
    let mut buf = vec![0u8; (len as usize).saturating_add(1).min(CHUNK)];
    let mut got = 0u64;
    loop {
        let n = resp
            .read(&mut buf)
            .map_err(|e| ReadError::Server(format!("reading the body after {got} of {len} bytes: {e}")))?;
        if n == 0 {
            break;
        }
        if got + n as u64 > len {
            return Err(ReadError::Server(format!(
                "the body is longer than the {len} bytes of its range"
            )));
        }
        sink(offset + got, &buf[..n]).map_err(ReadError::Sink)?;
        got += n as u64;
        if got == len {
            // One more read: the body must end here.
            let extra = resp
                .read(&mut buf[..1])
                .map_err(|e| ReadError::Server(format!("reading the body: {e}")))?;
            if extra > 0 {
                return Err(ReadError::Server(format!(
                    "the body is longer than the {len} bytes of its range"
                )));
            }
            return Ok(());
        }
    }
    Err(ReadError::Server(format!(
        "the body ended after {got} of {len} bytes"
    )))
}

/// A number in [0, 1) from the clock and a counter (jitter needs no quality).
fn rand_unit() -> f64 {
    static N: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let mut x = N.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ t;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    (x >> 11) as f64 / (1u64 << 53) as f64
}
