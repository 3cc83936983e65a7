//! `strata serve`: the OpenAI-compatible HTTP API over one model (`crates/server`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use strata_server::{Access, ApiKey, Limits, ServeOptions};

use super::{MemArgs, ModelArg};

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    mem: MemArgs,
    /// Address to listen on (loopback unless told otherwise): an IP address or a host name
    /// (`localhost`, `0.0.0.0`, `::`).
    #[arg(long, default_value = "127.0.0.1", value_parser = parse_host)]
    host: IpAddr,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on the API routes.
    #[arg(long, env = "STRATA_API_KEY", hide_env_values = true, value_name = "KEY")]
    api_key: Option<String>,
    /// The model's name for clients; several names (`--served-model-name a b`, or the flag
    /// again) are all accepted and listed, the first in responses. Default: ORG/NAME for a
    /// hub model, else the folder's (or GGUF file's) name.
    #[arg(long, value_name = "NAME", num_args = 1..)]
    served_model_name: Vec<String>,
    /// Seconds of silence (a long prompt) after which a stream gets an SSE comment line, so
    /// proxies with idle timeouts keep it.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS", hide = true)]
    sse_keepalive: f64,
    /// Sequences decoded together at most (each choice of a request is one).
    #[arg(long, default_value_t = 16, value_name = "N")]
    max_concurrent: usize,
    /// Sequences that may wait for a place in the batch; past it, requests get 429.
    #[arg(long, default_value_t = 64, value_name = "N")]
    max_queued: usize,
    /// Largest request body accepted, e.g. 8M (413 past it).
    #[arg(long, value_name = "SIZE", value_parser = strata_runtime::parse_size, default_value = "8M")]
    max_body: usize,
    /// Let web pages from this origin (e.g. https://chat.example.com, or `*`) call the API
    /// from a browser, with CORS. Without it, browser requests from other sites are refused.
    #[arg(long, value_name = "ORIGIN")]
    allowed_origin: Vec<String>,
    /// Answer requests whose Host header names this host (beyond localhost and the address
    /// listened on), e.g. a LAN name; `*` for any. Guards a loopback server against DNS rebinding.
    #[arg(long, value_name = "NAME")]
    allowed_host: Vec<String>,
    /// Open connections at most (past it, new ones get a 503).
    #[arg(long, default_value_t = 512, value_name = "N")]
    max_connections: usize,
    /// Seconds a request's headers may take to arrive; also how long an idle kept-alive
    /// connection stays open.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    header_timeout: f64,
    /// Seconds a request's body may take to arrive (408 past it).
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    body_timeout: f64,
    /// Seconds a client may take nothing of what it is sent before its connection is closed
    /// (and its generation stopped).
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    stall_timeout: f64,
    /// Memory for decoding state kept from finished requests, so one that begins the same way
    /// (the next turn of a chat, a shared system prompt) processes only the rest: a size (e.g.
    /// 2G, taken from --mem), `auto` (as many positions as the running sequences hold, at most
    /// 1/16 of --mem) or `off`.
    #[arg(long, value_name = "SIZE|auto|off", default_value = "auto", value_parser = parse_prefix_cache)]
    prefix_cache: strata_runtime::PrefixCacheSize,
    /// Also keep the prefix cache's states on disk, in this folder: they outlast the memory
    /// tier's evictions and restarts (files are per model; broken ones are removed).
    #[arg(long, value_name = "DIR")]
    prefix_cache_dir: Option<std::path::PathBuf>,
    /// Bytes the prefix cache may take in --prefix-cache-dir (least recently used go first).
    #[arg(long, value_name = "SIZE", default_value = "10G", value_parser = strata_runtime::parse_size)]
    prefix_cache_disk: usize,
}

fn parse_prefix_cache(text: &str) -> Result<strata_runtime::PrefixCacheSize, String> {
    match text {
        "auto" => Ok(strata_runtime::PrefixCacheSize::Auto),
        "off" | "0" => Ok(strata_runtime::PrefixCacheSize::Off),
        size => strata_runtime::parse_size(size).map(strata_runtime::PrefixCacheSize::Bytes),
    }
}

fn seconds(flag: &str, s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow::anyhow!("--{flag} must be a positive number of seconds, got {s}"))
}

pub fn serve(args: ServeArgs) -> Result<()> {
    let limits = Limits {
        max_connections: args.max_connections.max(1),
        header_timeout: seconds("header-timeout", args.header_timeout)?,
        body_timeout: seconds("body-timeout", args.body_timeout)?,
        stall_timeout: seconds("stall-timeout", args.stall_timeout)?,
    };
    if args.prefix_cache_dir.is_some() && args.prefix_cache == strata_runtime::PrefixCacheSize::Off {
        anyhow::bail!("--prefix-cache-dir needs the prefix cache: drop --prefix-cache off");
    }
    let mut load = args.mem.load_options();
    load.sequences = args.max_concurrent.max(1);
    load.prefix_cache = args.prefix_cache;
    let (engine, dir) = args.model.load(&load)?;
    let mut names = args.served_model_name.clone();
    if names.is_empty() {
        names.push(default_name(args.model.spec().as_deref(), &dir));
    }
    let name = names.remove(0);
    let options = ServeOptions {
        aliases: names,
        sse_keepalive: seconds("sse-keepalive", args.sse_keepalive)?,
        api_key: args.api_key.and_then(ApiKey::new),
        max_concurrent: args.max_concurrent.max(1),
        max_queued: args.max_queued,
        body_limit: args.max_body,
        access: Access {
            hosts: args.allowed_host,
            origins: args.allowed_origin,
        },
        limits,
        prefix_disk: (args.prefix_cache_dir.map(|d| (d, args.prefix_cache_disk as u64))),
        ..ServeOptions::new(SocketAddr::new(args.host, args.port), name)
    };
    strata_server::serve_blocking(Arc::new(engine), options)
}

/// The name a model is served as by default: `ORG/NAME` of `hf://ORG/NAME[@REV]`, the last
/// part of a URL, else the folder's or file's name (the embedded model's is its own).
fn default_name(spec: Option<&str>, dir: &std::path::Path) -> String {
    let last = |s: &str| {
        s.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(s)
            .to_string()
    };
    match spec {
        Some(s) if s.starts_with("hf://") => {
            let repo = &s["hf://".len()..];
            repo.split('@')
                .next()
                .unwrap_or(repo)
                .trim_matches('/')
                .to_string()
        }
        Some(s) if s.starts_with("http://") || s.starts_with("https://") => last(s),
        Some(_) => {
            let path = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
            let file = path.file_name().map(|n| n.to_string_lossy().into_owned());
            file.map(|f| f.trim_end_matches(".gguf").to_string())
                .unwrap_or_else(|| "strata".into())
        }
        None => "qwen3-moe-tiny".into(),
    }
}

/// An IP address, or the address a host name resolves to (`localhost`), IPv4 where it has one.
fn parse_host(text: &str) -> Result<IpAddr, String> {
    if let Ok(ip) = text.parse() {
        return Ok(ip);
    }
    use std::net::ToSocketAddrs;
    let mut addrs = (text, 0).to_socket_addrs().map_err(|e| {
        format!("`{text}` is neither an IP address nor a host name this machine resolves: {e}")
    })?;
    // An IPv4 address where the name has one (what `localhost` means to most clients).
    let all: Vec<IpAddr> = addrs.by_ref().map(|a| a.ip()).collect();
    all.iter()
        .find(|ip| ip.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| format!("`{text}` resolves to no address"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn served_names_default_to_what_people_call_the_model() {
        use super::default_name;
        let dir = std::path::Path::new("/nonexistent/models/Some-Model");
        assert_eq!(
            default_name(Some("hf://Qwen/Qwen3-30B-A3B@main"), dir),
            "Qwen/Qwen3-30B-A3B"
        );
        assert_eq!(default_name(Some("hf://org/name"), dir), "org/name");
        assert_eq!(default_name(Some("https://cdn.example/models/m1/"), dir), "m1");
        assert_eq!(
            default_name(Some("/nonexistent/models/Some-Model"), dir),
            "Some-Model"
        );
        let gguf = std::path::Path::new("/nonexistent/q.gguf");
        assert_eq!(default_name(Some("/nonexistent/q.gguf"), gguf), "q");
    }

    #[test]
    fn hosts_are_addresses_or_names() {
        assert_eq!(super::parse_host("127.0.0.1"), Ok([127, 0, 0, 1].into()));
        assert_eq!(super::parse_host("::1"), Ok(std::net::Ipv6Addr::LOCALHOST.into()));
        let local = super::parse_host("localhost").unwrap();
        assert!(local.is_loopback() && local.is_ipv4(), "{local}");
        let err = super::parse_host("no such host.invalid").unwrap_err();
        assert!(err.contains("no such host.invalid"), "{err}");
    }
}
