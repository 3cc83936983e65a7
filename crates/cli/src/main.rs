//! `strata`: run huge Mixture-of-Experts models on one ordinary machine.

mod commands;
mod default_model;

use clap::Parser;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = commands::Cli::parse();
    if let Err(e) = commands::dispatch(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
