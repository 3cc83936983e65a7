//! A fault-injecting HTTP proxy between strata and the real server: it forwards each request
//! (one per connection) and, on a schedule, answers instead with a 500, a 429 with Retry-After,
//! a truncated body, a wrong Content-Range, a 200 with the whole file instead of a 206, or a
//! stall; hostile ones too: a body longer than its range (no Content-Length, more bytes than
//! asked for) and a safetensors header length of `FF` x 8; it can also add a fixed
//! `X-Linked-Etag`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    ServerError,
    TooMany,
    Truncated,
    WrongRange,
    WholeFile,
    Stall,
    /// The right bytes, then 64 KiB more, delimited by closing the connection.
    LongBody,
    /// A read of bytes 0-7 (a safetensors header length) answered with `FF` x 8.
    HugeHeaderLength,
}

pub const ALL_FAULTS: [Fault; 6] = [
    Fault::ServerError,
    Fault::TooMany,
    Fault::Truncated,
    Fault::WrongRange,
    Fault::WholeFile,
    Fault::Stall,
];

#[derive(Clone, Debug)]
pub enum Schedule {
    /// The first request for each range gets the next fault of the list; its retries pass (so
    /// each range fails once and then succeeds, however many requests run at once).
    Alternate(Vec<Fault>),
    /// Every range request fails this way.
    Always(Fault),
    Never,
}

pub struct FaultProxy {
    pub port: u16,
    /// Every request waits this long first (to make transfers slow enough to interrupt).
    pub delay: Arc<Mutex<Duration>>,
    pub faults_sent: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

struct Request {
    head: String,
    path: String,
    range: bool,
}

fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let end = line == "\r\n";
        head.push_str(&line);
        if end {
            break;
        }
    }
    let path = head.split_whitespace().nth(1)?.to_string();
    let range = head.to_ascii_lowercase().contains("\r\nrange:");
    Some(Request { head, path, range })
}

/// Sends `head` (with `Connection: close`) to the upstream and returns the whole response.
fn forward(upstream: u16, head: &str, drop_range: bool) -> Vec<u8> {
    let mut lines: Vec<&str> = head
        .split("\r\n")
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            !(l.starts_with("connection:") || drop_range && l.starts_with("range:"))
        })
        .collect();
    while lines.last() == Some(&"") {
        lines.pop();
    }
    let req = format!("{}\r\nConnection: close\r\n\r\n", lines.join("\r\n"));
    let mut s = TcpStream::connect(("127.0.0.1", upstream)).expect("upstream");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    out
}

fn split_response(resp: &[u8]) -> (String, Vec<u8>) {
    let at = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head")
        + 4;
    (
        String::from_utf8_lossy(&resp[..at]).into_owned(),
        resp[at..].to_vec(),
    )
}

fn with_header(head: &str, name: &str, value: &str) -> String {
    let kept: Vec<&str> = head
        .trim_end_matches("\r\n\r\n")
        .split("\r\n")
        .filter(|l| {
            !l.to_ascii_lowercase()
                .starts_with(&format!("{}:", name.to_ascii_lowercase()))
        })
        .collect();
    format!("{}\r\n{name}: {value}\r\n\r\n", kept.join("\r\n"))
}

impl FaultProxy {
    pub fn start(upstream: u16, schedule: Schedule, etag: Option<String>) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let faults_sent = Arc::new(AtomicUsize::new(0));
        let counter = Arc::new(Mutex::new((0usize, std::collections::HashSet::<String>::new())));
        let (stop2, sent2) = (stop.clone(), faults_sent.clone());
        let delay = Arc::new(Mutex::new(Duration::ZERO));
        let delay2 = delay.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let (schedule, etag, counter, sent) =
                    (schedule.clone(), etag.clone(), counter.clone(), sent2.clone());
                let pause = *delay2.lock().unwrap();
                std::thread::spawn(move || {
                    let Some(req) = read_request(&mut conn) else {
                        return;
                    };
                    std::thread::sleep(pause);
                    let fault = if req.range {
                        let mut seen = counter.lock().unwrap();
                        match &schedule {
                            Schedule::Always(f) => Some(*f),
                            Schedule::Alternate(list) => {
                                let range = (req.head.lines())
                                    .find(|l| l.to_ascii_lowercase().starts_with("range:"))
                                    .unwrap_or_default();
                                if seen.1.insert(format!("{} {range}", req.path)) {
                                    seen.0 += 1;
                                    Some(list[(seen.0 - 1) % list.len()])
                                } else {
                                    None
                                }
                            }
                            Schedule::Never => None,
                        }
                    } else {
                        None
                    };
                    if fault.is_some() {
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                    let reply = match fault {
                        Some(Fault::ServerError) => {
                            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
                        }
                        Some(Fault::TooMany) => {
                            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
                        }
                        Some(Fault::Stall) => {
                            std::thread::sleep(Duration::from_secs(4));
                            return;
                        }
                        Some(Fault::WholeFile) => forward(upstream, &req.head, true),
                        Some(Fault::Truncated) => {
                            let (head, body) = split_response(&forward(upstream, &req.head, false));
                            let mut r = head.into_bytes();
                            r.extend_from_slice(&body[..body.len() / 2]);
                            r
                        }
                        Some(Fault::LongBody) => {
                            let (head, mut body) = split_response(&forward(upstream, &req.head, false));
                            let kept: Vec<&str> = (head.trim_end_matches("\r\n\r\n").split("\r\n"))
                                .filter(|l| !l.to_ascii_lowercase().starts_with("content-length:"))
                                .collect();
                            body.extend_from_slice(&[0x5a; 64 << 10]);
                            let mut r = format!("{}\r\n\r\n", kept.join("\r\n")).into_bytes();
                            r.extend_from_slice(&body);
                            r
                        }
                        Some(Fault::HugeHeaderLength) => {
                            let resp = forward(upstream, &req.head, false);
                            if !req.head.to_ascii_lowercase().contains("range: bytes=0-7\r\n") {
                                resp
                            } else {
                                let (head, _) = split_response(&resp);
                                let mut r = head.into_bytes();
                                r.extend_from_slice(&[0xff; 8]);
                                r
                            }
                        }
                        Some(Fault::WrongRange) => {
                            let (head, body) = split_response(&forward(upstream, &req.head, false));
                            let cr = head
                                .split("\r\n")
                                .find(|l| l.to_ascii_lowercase().starts_with("content-range:"))
                                .and_then(|l| l.split_once("bytes "))
                                .map(|(_, v)| v.to_string())
                                .unwrap_or_default();
                            let shifted = cr
                                .split_once('-')
                                .and_then(|(a, rest)| a.parse::<u64>().ok().map(|a| format!("{}-{rest}", a + 1)))
                                .unwrap_or(cr);
                            let mut r = with_header(&head, "Content-Range", &format!("bytes {shifted}")).into_bytes();
                            r.extend_from_slice(&body);
                            r
                        }
                        None => {
                            let resp = forward(upstream, &req.head, false);
                            match &etag {
                                Some(tag) if req.path.ends_with(".safetensors") => {
                                    let (head, body) = split_response(&resp);
                                    let mut r = with_header(&head, "X-Linked-Etag", &format!("\"{tag}\"")).into_bytes();
                                    r.extend_from_slice(&body);
                                    r
                                }
                                _ => resp,
                            }
                        }
                    };
                    let _ = conn.write_all(&reply);
                });
            }
        });
        FaultProxy {
            port,
            delay,
            faults_sent,
            stop,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A "hub" that answers every request with a redirect to the same path on another host (as the
/// Hugging Face hub sends LFS files to its CDN), recording each request's path and
/// `Authorization` header.
/// (path, Authorization header) of each request a [`Redirector`] got.
pub type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

pub struct Redirector {
    pub port: u16,
    pub seen: Seen,
}

impl Redirector {
    pub fn start(target_base: String) -> Redirector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen: Seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let Some(req) = read_request(&mut conn) else {
                    continue;
                };
                let auth = req
                    .head
                    .split("\r\n")
                    .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                    .map(|l| l.split_once(':').unwrap().1.trim().to_string());
                seen2.lock().unwrap().push((req.path.clone(), auth));
                let reply = format!(
                    "HTTP/1.1 302 Found\r\nLocation: {target_base}{}\r\nX-Repo-Commit: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    req.path,
                    super::nginx::COMMIT
                );
                let _ = conn.write_all(reply.as_bytes());
            }
        });
        Redirector { port, seen }
    }
}
