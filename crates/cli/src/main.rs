//! `strata`: run huge Mixture-of-Experts models on one ordinary machine.

mod alloc;
mod commands;
mod default_model;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: alloc::Allocator = alloc::Allocator;

/// Large buffers (expert reads, decoded experts) come and go every token. glibc's default raises
/// its mmap threshold after the first such free and then serves them from per-thread heaps that it
/// keeps: resident memory grows by gigabytes past what strata holds. A fixed threshold returns
/// every large buffer to the system when it is freed. Below it, each thread's heap keeps up to
/// 4 MiB free at its top (glibc's default, 128 KiB, once the threshold is fixed): a prompt's
/// per-expert buffers (a few hundred KiB each) would otherwise be returned and faulted in again
/// for every expert, the kernel threads waiting on each other in the kernel to do it.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 4 << 20);
    }
}

fn main() {
    tune_allocator();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
                .or_else(|_| tracing_subscriber::EnvFilter::try_from_env("RUST_LOG"))
                // Warnings, and `strata serve`'s line per request.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,strata::access=info")),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: none in pipes, logs and files, nor with NO_COLOR.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none(),
        )
        .init();
    let cli = commands::Cli::parse();
    if let Err(e) = commands::dispatch(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
