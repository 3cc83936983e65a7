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
    /// The model name clients use (default: the model folder's name).
    #[arg(long, value_name = "NAME")]
    served_model_name: Option<String>,
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
    let mut load = args.mem.load_options();
    load.sequences = args.max_concurrent.max(1);
    load.prefix_cache = args.prefix_cache;
    let (engine, dir) = args.model.load(&load)?;
    let name = args.served_model_name.clone().unwrap_or_else(|| {
        dir.canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "strata".into())
    });
    let options = ServeOptions {
        api_key: args.api_key.and_then(ApiKey::new),
        max_concurrent: args.max_concurrent.max(1),
        max_queued: args.max_queued,
        body_limit: args.max_body,
        access: Access {
            hosts: args.allowed_host,
            origins: args.allowed_origin,
        },
        limits,
        ..ServeOptions::new(SocketAddr::new(args.host, args.port), name)
    };
    strata_server::serve_blocking(Arc::new(engine), options)
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
    fn hosts_are_addresses_or_names() {
        assert_eq!(super::parse_host("127.0.0.1"), Ok([127, 0, 0, 1].into()));
        assert_eq!(super::parse_host("::1"), Ok(std::net::Ipv6Addr::LOCALHOST.into()));
        let local = super::parse_host("localhost").unwrap();
        assert!(local.is_loopback() && local.is_ipv4(), "{local}");
        let err = super::parse_host("no such host.invalid").unwrap_err();
        assert!(err.contains("no such host.invalid"), "{err}");
    }
}
