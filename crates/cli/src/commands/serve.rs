//! `strata serve`: the OpenAI-compatible HTTP API over one model (`crates/server`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Result;
use strata_server::ServeOptions;

use super::{MemArgs, ModelArg};

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    mem: MemArgs,
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
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
}

pub fn serve(args: ServeArgs) -> Result<()> {
    let (engine, dir) = args.model.load(&args.mem.load_options())?;
    let name = args.served_model_name.clone().unwrap_or_else(|| {
        dir.canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "strata".into())
    });
    let options = ServeOptions {
        addr: SocketAddr::new(args.host, args.port),
        api_key: args.api_key.filter(|k| !k.is_empty()),
        served_model_name: name,
        max_concurrent: args.max_concurrent.max(1),
        max_queued: args.max_queued,
        body_limit: args.max_body,
    };
    strata_server::serve_blocking(Arc::new(engine), options)
}
