//! Command-line definitions and dispatch. Each command lives in its own file.

mod bars;
mod bench;
mod bench_prepare;
mod cache;
mod chat;
mod inspect;
mod pull;
mod run;
mod serve;
mod synth;
mod tokens;
mod trace;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use crate::default_model;

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Run huge Mixture-of-Experts language models on one ordinary machine",
    long_about = "strata runs Mixture-of-Experts models whose weights are far larger than RAM by keeping the \
                  non-expert weights resident and reading only the experts each token needs.\n\n\
                  Without --model, commands use strata's small embedded demo model (trained on the King James Bible and WordNet)."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Compute threads (matrix products, attention heads). Default: one per physical core
    /// (or RAYON_NUM_THREADS when set).
    #[arg(long, short = 't', global = true, value_name = "N")]
    threads: Option<usize>,
    /// Where the model computes: cpu, auto (a discrete GPU when there is one, else the CPU), or
    /// gpu (any Vulkan or Metal adapter, software ones included). On a GPU, grouped-query and
    /// latent attention models (Qwen3-MoE, Mixtral, DeepSeek-V3, Kimi K2, dense Llama/Qwen) run
    /// each layer there, the KV cache copied there too; the others send the non-expert weights'
    /// products. Routed experts stay on the CPU unless --gpu-experts. The GPU backend is new
    /// and not yet reliably faster than the CPU kernels (docs/PERFORMANCE.md), so the default
    /// stays cpu.
    #[arg(
        long,
        global = true,
        default_value = "cpu",
        env = "STRATA_DEVICE",
        value_name = "cpu|auto|gpu"
    )]
    device: strata_gpu::Preference,
    /// GPU memory the weights may take (e.g. 16G). Default: as much as the GPU grants.
    #[arg(long, global = true, value_name = "SIZE")]
    gpu_mem: Option<String>,
    /// Routed experts' products on the GPU too: an expert is copied there at its first product
    /// while --gpu-mem has room and stays as long as the expert cache keeps it; one that finds no
    /// room is copied for each product. A layer's experts run as two submissions. Off by
    /// default: not yet faster than the CPU's experts (docs/PERFORMANCE.md).
    #[arg(long, global = true, env = "STRATA_GPU_EXPERTS")]
    gpu_experts: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text (or token ids) from a prompt, streaming it as it is produced.
    Run(run::RunArgs),
    /// Chat with the model in the terminal: turns through its chat template, each feeding only
    /// its new tokens; Ctrl-C stops an answer; /help lists the commands.
    Chat(chat::ChatArgs),
    /// Print the argmax at every position and the last position's logits, as JSON.
    Logits(tokens::LogitsArgs),
    /// Turn text or a chat conversation into token ids, as JSON.
    Tokenize(tokens::TokenizeArgs),
    /// Turn token ids into text, as JSON.
    Detokenize(tokens::DetokenizeArgs),
    /// Show a model's architecture, sizes, formats and what an uncached token must read.
    Inspect(inspect::InspectArgs),
    /// Fill the local cache of a remote model (hf://... or a URL) ahead of time.
    Pull(pull::PullArgs),
    /// See, check and trim the cache of remote models.
    Cache(cache::CacheArgs),
    /// List the cached models (revision, bytes present, last use).
    Ls(cache::LsArgs),
    /// Remove a cached model: every revision, or one (`@REV` or --revision).
    Rm(cache::RmArgs),
    /// Serve the OpenAI-compatible HTTP API (chat and text completions, streaming, tools).
    Serve(serve::ServeArgs),
    /// Measure decode speed against the disk's direct-read bandwidth and the I/O + compute bound.
    Bench(bench::BenchArgs),
    /// Replay a routing trace (`--trace FILE`) against the expert cache's policies and Belady's
    /// optimum, and score the next-layer and previous-token predictors.
    Trace(trace::TraceArgs),
    /// Write a large random checkpoint with a real model's shapes (project tool for benchmarks).
    #[command(hide = true)]
    Synth(synth::SynthArgs),
}

/// The model, shared by every command: as the first argument (`strata run MODEL`) or `--model`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ModelArg {
    /// The model, as --model gives it (`strata run Qwen/Qwen3-30B-A3B`).
    #[arg(value_name = "MODEL", conflicts_with = "model")]
    positional: Option<String>,
    /// Model: a local folder (Hugging Face layout: config.json, *.safetensors, tokenizer files),
    /// a local GGUF file (the first file of a split one), `hf://ORG/NAME[@REVISION]` (a bare
    /// `ORG/NAME[@REVISION]` that is no local path means the same), or an `http(s)://` folder
    /// URL. Remote models are read with one Range request per missing run into a local cache.
    /// Default: the embedded demo model.
    #[arg(long, short = 'm', value_name = "DIR|FILE.gguf|hf://ORG/NAME|URL")]
    model: Option<String>,
    /// Cache for remote models. Default: $XDG_CACHE_HOME/strata or ~/.cache/strata.
    #[arg(long, value_name = "DIR", global = true)]
    cache_dir: Option<PathBuf>,
    /// Make no network request: remote models come from the cache only (also HF_HUB_OFFLINE=1).
    #[arg(long, global = true)]
    offline: bool,
}

impl ModelArg {
    /// The model `spec` (as `--model` takes it).
    pub fn of(spec: String, cache_dir: Option<PathBuf>, offline: bool) -> ModelArg {
        ModelArg {
            positional: None,
            model: Some(spec),
            cache_dir,
            offline,
        }
    }

    /// The model asked for, a bare `ORG/NAME` that is no local path as `hf://ORG/NAME`; none for
    /// the embedded model.
    fn spec(&self) -> Option<String> {
        let spec = self.model.as_ref().or(self.positional.as_ref())?;
        Some(match hub_shorthand(spec) {
            Some(hf) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| eprintln!("[strata] {spec} is not a local path: taking it as {hf}"));
                hf
            }
            None => spec.clone(),
        })
    }

    pub fn remote_options(&self) -> strata_remote::RemoteOptions {
        strata_remote::RemoteOptions::new(self.cache_dir.clone(), self.offline)
    }

    /// The model's folder (for a remote model: its local mirror, small files and headers
    /// present) and, for a remote model, the source that fills the rest on demand.
    pub fn open(&self) -> Result<(PathBuf, Option<Arc<strata_remote::Mirror>>)> {
        match &self.spec() {
            Some(spec) => {
                let (dir, mirror) = strata_remote::open_location(spec, &self.remote_options())
                    .map_err(|e| anyhow::anyhow!("{e}"))
                    .with_context(|| format!("opening model {spec}"))?;
                if mirror.is_none() && !dir.is_dir() && !strata_formats::gguf::is_gguf(&dir) {
                    bail!(
                        "model {} is neither a model folder nor a GGUF file (or does not exist)",
                        dir.display()
                    );
                }
                Ok((dir, mirror))
            }
            None => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!(
                        "[strata] no model given: the embedded demo model (20M parameters, trained on the King James Bible and WordNet); give one as `strata run MODEL`"
                    )
                });
                Ok((default_model::path()?, None))
            }
        }
    }

    pub fn resolve(&self) -> Result<PathBuf> {
        Ok(self.open()?.0)
    }

    /// Loads the engine (remote models through their cache).
    pub fn load(&self, options: &strata_runtime::LoadOptions) -> Result<(strata_runtime::Engine, PathBuf)> {
        let opened = self.open()?;
        Ok((self.load_opened(opened.clone(), options, None)?, opened.0))
    }

    /// Loads what [`ModelArg::open`] opened, with its tokenizer when the caller has it.
    pub fn load_opened(
        &self,
        (dir, mirror): (PathBuf, Option<Arc<strata_remote::Mirror>>),
        options: &strata_runtime::LoadOptions,
        tokenizer: Option<strata_tokenizer::Tokenizer>,
    ) -> Result<strata_runtime::Engine> {
        let source = mirror.map(|m| m as Arc<dyn strata_formats::RangeSource>);
        let mut options = options.clone();
        if options.cache_dir.is_none() {
            options.cache_dir = Some(self.remote_options().cache_dir);
        }
        let engine = strata_runtime::Engine::load_with(&dir, source, &options, tokenizer)
            .with_context(|| format!("loading model {}", self.describe()))?;
        say_how_the_spine_is_held(&engine);
        Ok(engine)
    }

    pub fn describe(&self) -> String {
        self.spec().unwrap_or_else(|| default_model::NAME.to_string())
    }
}

/// `hf://ORG/NAME[@REVISION][:TAG]` for a bare `ORG/NAME[@REVISION][:TAG]` (one slash, a
/// repository id's characters; a GGUF quantization tag as llama.cpp's `-hf` takes it) that names
/// no local path; `None` for anything else.
fn hub_shorthand(spec: &str) -> Option<String> {
    hub_shorthand_unless(spec, |p| p.exists())
}

/// [`hub_shorthand`] with `exists` telling which paths are local.
fn hub_shorthand_unless(spec: &str, exists: impl Fn(&std::path::Path) -> bool) -> Option<String> {
    let id = |s: &str| {
        !s.is_empty()
            && !s.starts_with(['.', '-'])
            && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    let (spec, tag) = match spec.rsplit_once(':') {
        Some((rest, tag)) if id(tag) && !rest.contains(':') => (rest, Some(tag)),
        Some(_) => return None,
        None => (spec, None),
    };
    let (repo, rev) = match spec.split_once('@') {
        Some((repo, rev)) if !rev.is_empty() => (repo, Some(rev)),
        Some(_) => return None,
        None => (spec, None),
    };
    let (org, name) = repo.split_once('/')?;
    if !id(org) || !id(name) || exists(std::path::Path::new(spec)) {
        return None;
    }
    let hf = match rev {
        Some(rev) => format!("hf://{org}/{name}@{rev}"),
        None => format!("hf://{org}/{name}"),
    };
    Some(match tag {
        Some(tag) => format!("{hf}:{tag}"),
        None => hf,
    })
}

#[cfg(test)]
mod tests {
    use super::hub_shorthand;

    #[test]
    fn a_bare_repository_id_is_a_hub_model_and_paths_stay_paths() {
        let hf = |s: &str| hub_shorthand(s);
        assert_eq!(
            hf("Qwen/Qwen3-30B-A3B").as_deref(),
            Some("hf://Qwen/Qwen3-30B-A3B")
        );
        assert_eq!(
            hf("moonshotai/Kimi-K2.5@main").as_deref(),
            Some("hf://moonshotai/Kimi-K2.5@main")
        );
        assert_eq!(
            hf("unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M").as_deref(),
            Some("hf://unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M")
        );
        assert_eq!(hf("o/m@v1:UD-Q2_K_XL").as_deref(), Some("hf://o/m@v1:UD-Q2_K_XL"));
        for not in [
            "o/m:",
            "o/m:a:b",
            "C:/x",
            "model",
            "./Qwen/x",
            "/abs/path",
            "a/b/c",
            "hf://Qwen/x",
            "https://host/x",
            "org/",
            "/name",
            "org/name@",
            "../up",
            "my model/x",
        ] {
            assert_eq!(hf(not), None, "{not}");
        }
        // A local folder of that shape stays local.
        let local = super::hub_shorthand_unless("org/name", |p| p == std::path::Path::new("org/name"));
        assert_eq!(local, None);
    }
}

/// One line on stderr when the plan streams layers that INT8 would keep resident, and one on
/// what the INT8 spine took from its sidecar and converted.
fn say_how_the_spine_is_held(engine: &strata_runtime::Engine) {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let m = &engine.memory;
    if let Some(int8) = m.int8_alternative {
        eprintln!(
            "[strata] {} layers stream ({:.2} GiB read per token in all, expected); with --spine-format int8 every layer would stay resident ({:.2} GiB per token)",
            m.streamed.len(),
            gib(m.expected_read_per_token),
            gib(int8)
        );
    }
    if let Some(sidecar) = &engine.int8 {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &sidecar.stats;
        eprintln!(
            "[strata] INT8 spine: {} layers ({:.2} GiB) read from {}, {} converted ({:.2} GiB)",
            s.read_layers.load(Relaxed),
            gib(s.read_bytes.load(Relaxed)),
            sidecar
                .dir()
                .map_or_else(|| "no sidecar".to_string(), |d| d.display().to_string()),
            s.converted_layers.load(Relaxed),
            gib(s.converted_bytes.load(Relaxed)),
        );
    }
}

/// How much memory the engine may use for what.
#[derive(clap::Args, Clone, Debug)]
pub struct MemArgs {
    /// Memory strata may use in all (non-expert weights, expert cache, decoding state, read
    /// buffers), e.g. 8G. Default: 90 % of the available memory. `strata inspect --mem` shows
    /// how it is divided.
    #[arg(long, value_name = "SIZE", value_parser = strata_runtime::parse_size)]
    pub mem: Option<usize>,
    /// RAM for decoded routed experts (an LRU cache over direct disk reads), e.g. 512M. Every
    /// expert the router picks is used; a smaller cache only means more reads.
    /// Default: what --mem leaves.
    #[arg(long, value_name = "SIZE", value_parser = strata_runtime::parse_size)]
    pub expert_cache: Option<usize>,
    /// Guess each next MoE layer's experts from the current residual and read them early:
    /// `auto` for prompts and batches only (guesses naming at least half of a layer's experts,
    /// so the next layer's reads overlap this layer's compute), `on` also for a lone token's
    /// (`--prefetch` alone means on), `off` (the default until either pays on real
    /// checkpoints). `strata bench` reports how often the guesses are right and the bytes they
    /// waste.
    #[arg(long, value_enum, value_name = "auto|on|off", num_args = 0..=1, default_missing_value = "on",
          default_value_t = PrefetchArg::Off)]
    prefetch: PrefetchArg,
    /// How expert bytes are read: `pread` (direct reads that bypass the page cache, by a pool of
    /// reader threads), `uring` (the same direct reads through one io_uring, Linux) or `mmap`
    /// (demand paging, kept to measure what it costs).
    #[arg(long, value_enum, default_value_t = Io::Pread)]
    io: Io,
    /// When the expert cache's memory is faulted in, and with what: `preload` (while the model
    /// loads, by reading experts into it, every MoE layer its share, at the disk's rate: the
    /// first tokens then hit as often as later ones; a remote model's cache is faulted in empty
    /// instead, nothing is downloaded for it), `at-load` (empty, on every core while the model
    /// loads: no token waits for the kernel to zero fresh pages, but the first tokens read most
    /// of their experts) or `on-read` (as experts are first read: the quickest start, the slowest
    /// first tokens).
    #[arg(long, value_enum, default_value_t = FaultIn::Preload)]
    fault_in: FaultIn,
    /// Which cached expert makes room: `lru` (least recently used) or `lfu` (least frequently
    /// used, each use's weight halving every --lfu-half-life expert accesses).
    #[arg(long, value_enum, default_value_t = CachePolicy::Lru)]
    cache_policy: CachePolicy,
    /// Half-life of an expert use for `--cache-policy lfu`, in expert accesses.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    lfu_half_life: u64,
    /// Write every routing decision (each MoE layer's experts per token, and with --prefetch
    /// its guesses) to FILE as JSON lines, for `strata trace FILE`.
    #[arg(long, value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
    /// Non-expert weights: `auto` keeps them resident when they fit --mem and otherwise streams
    /// as many decoder layers as needed (read from disk at every token, a few layers ahead);
    /// `resident` refuses to stream; `stream` streams every decoder layer.
    #[arg(long, value_enum, default_value_t = Spine::Auto)]
    pub spine: Spine,
    /// Resident non-expert weights: `native` (as stored) or `int8` (linear layers stored dense
    /// or FP8 as INT8 with one scale per row: half of BF16, converted once and kept in the
    /// cache for the next start; accuracy in docs/INT8.md).
    #[arg(long, value_enum, default_value_t = SpineFormatArg::Native)]
    pub spine_format: SpineFormatArg,
    /// Positions (prompt + generated tokens) one sequence may hold; decoding state for them is
    /// reserved in --mem. Default: the model's context, capped by an eighth of --mem.
    #[arg(long, short = 'c', value_name = "N")]
    pub ctx_size: Option<usize>,
    /// Positions of decoding state all sequences share (`serve` admits a request when its
    /// prompt + max_tokens fit what is free). Default: one --ctx-size per sequence
    /// (--max-concurrent), within an eighth of --mem.
    #[arg(long, value_name = "N")]
    pub state_tokens: Option<usize>,
    /// Prompt tokens processed per step at most; a longer prompt is fed in chunks between other
    /// sequences' steps. Default: sized so a step's activations stay within the plan's working
    /// memory (64-512).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub prefill_chunk: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Spine {
    Auto,
    Resident,
    Stream,
}

impl Spine {
    pub fn mode(self) -> strata_runtime::SpineMode {
        match self {
            Spine::Auto => strata_runtime::SpineMode::Auto,
            Spine::Resident => strata_runtime::SpineMode::Resident,
            Spine::Stream => strata_runtime::SpineMode::Stream,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SpineFormatArg {
    Native,
    Int8,
}

impl SpineFormatArg {
    pub fn format(self) -> strata_runtime::SpineFormat {
        match self {
            SpineFormatArg::Native => strata_runtime::SpineFormat::Native,
            SpineFormatArg::Int8 => strata_runtime::SpineFormat::Int8,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CachePolicy {
    Lru,
    Lfu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultIn {
    Preload,
    AtLoad,
    OnRead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrefetchArg {
    Auto,
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Io {
    Pread,
    Uring,
    Mmap,
}

impl MemArgs {
    pub fn load_options(&self) -> strata_runtime::LoadOptions {
        strata_runtime::LoadOptions {
            mem: self.mem,
            expert_cache: self.expert_cache,
            prefetch: match self.prefetch {
                PrefetchArg::Auto => strata_experts::Prefetch::Batches,
                PrefetchArg::On => strata_experts::Prefetch::On,
                PrefetchArg::Off => strata_experts::Prefetch::Off,
            },
            eviction: match self.cache_policy {
                CachePolicy::Lru => strata_experts::Eviction::Lru,
                CachePolicy::Lfu => strata_experts::Eviction::LfuDecay {
                    half_life: self.lfu_half_life,
                },
            },
            io: match self.io {
                Io::Pread => strata_experts::IoMode::Direct,
                Io::Uring => strata_experts::IoMode::Uring,
                Io::Mmap => strata_experts::IoMode::Mmap,
            },
            fault_in: match self.fault_in {
                FaultIn::Preload => strata_experts::FaultIn::Preload,
                FaultIn::AtLoad => strata_experts::FaultIn::AtLoad,
                FaultIn::OnRead => strata_experts::FaultIn::OnRead,
            },
            spine: self.spine.mode(),
            spine_format: self.spine_format.format(),
            cache_dir: None,
            ctx_size: self.ctx_size,
            positions: None,
            state_tokens: self.state_tokens,
            sequences: 1,
            prefill_chunk: self.prefill_chunk.map(|n| n as usize),
            progress: Some(bars::Bars::progress()),
            prefix_cache: strata_runtime::PrefixCacheSize::Off,
            trace: self.trace.clone(),
        }
    }
}

/// Parses `1,2,3` (spaces allowed) into token ids.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    let ids = s
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .with_context(|| format!("--ids: `{t}` is not a token id"))
        })
        .collect::<Result<Vec<u32>>>()?;
    if ids.is_empty() {
        bail!("--ids: no token ids given");
    }
    Ok(ids)
}

/// The GPU in use, when `--device` chose one (for reports).
static GPU: std::sync::OnceLock<Arc<strata_gpu::Offload>> = std::sync::OnceLock::new();

/// The GPU the products run on, if any.
pub fn gpu() -> Option<&'static strata_gpu::Offload> {
    GPU.get().map(|g| g.as_ref())
}

/// Opens the device `--device` asks for and sends the resident weights' products there; says in
/// one line when `auto` stays on the CPU, and why.
fn setup_device(pref: strata_gpu::Preference, gpu_mem: Option<&str>, experts: bool) -> Result<()> {
    let budget = gpu_mem
        .map(strata_runtime::parse_size)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--gpu-mem: {e}"))?
        .map(|b| b as u64);
    match strata_gpu::select(pref).context("--device")? {
        strata_gpu::Selection::Cpu { why } => {
            if pref == strata_gpu::Preference::Auto {
                eprintln!("device: CPU ({why})");
            }
        }
        strata_gpu::Selection::Gpu(g) => {
            let budget_text = budget.map_or("as much as it grants".to_string(), |b| {
                format!("up to {:.2} GiB", b as f64 / (1u64 << 30) as f64)
            });
            let what = if experts {
                "every weight's products, routed experts included"
            } else {
                "the non-expert weights' products"
            };
            eprintln!(
                "device: GPU {} for {what} ({budget_text}; GGUF block types and the rest on the CPU)",
                g.adapter()
            );
            let offload = Arc::new(strata_gpu::Offload::new(*g, budget, experts));
            let _ = GPU.set(offload.clone());
            strata_kernels::offload::install(offload);
        }
    }
    Ok(())
}

pub fn dispatch(cli: Cli) -> Result<()> {
    let threads = strata_kernels::init_threads(cli.threads);
    tracing::debug!("compute threads: {threads}");
    let computes = matches!(
        cli.command,
        Command::Run(_) | Command::Chat(_) | Command::Logits(_) | Command::Serve(_) | Command::Bench(_)
    );
    if computes {
        setup_device(cli.device, cli.gpu_mem.as_deref(), cli.gpu_experts)?;
    }
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::chat(a),
        Command::Logits(a) => tokens::logits(a),
        Command::Tokenize(a) => tokens::tokenize(a),
        Command::Detokenize(a) => tokens::detokenize(a),
        Command::Inspect(a) => inspect::inspect(a),
        Command::Synth(a) => synth::synth(a),
        Command::Trace(a) => trace::trace(a),
        Command::Bench(a) => bench::bench(a),
        Command::Serve(a) => serve::serve(a),
        Command::Pull(a) => pull::pull(a),
        Command::Cache(a) => cache::cache(a),
        Command::Ls(a) => cache::ls(a),
        Command::Rm(a) => cache::rm(a),
    }
}
