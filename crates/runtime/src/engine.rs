//! Loading a model folder into a ready engine, and the single-pass queries (`logits`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_experts::{CachedStore, SpineStore};
use strata_formats::{GenerationConfig, QuantizationConfig};
use strata_models::{load_model, KvCache, LayerStore, Loading, Model, SeqInput, Trace};
use strata_tokenizer::Tokenizer;

use crate::int8_spine::Int8Sidecar;
use crate::SamplingParams;
use crate::{MemoryPlan, ModelPlan};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] strata_models::ModelError),
    #[error(transparent)]
    Format(#[from] strata_formats::FormatError),
    #[error(transparent)]
    Tokenizer(#[from] strata_tokenizer::TokenizerError),
    #[error(
        "{0}: this model folder has no tokenizer (tokenizer.json or tiktoken.model); give token ids instead"
    )]
    NoTokenizer(PathBuf),
    #[error("the prompt has {prompt} tokens; the context is {max} positions (the model's, or --ctx-size)")]
    PromptTooLong { prompt: usize, max: usize },
    #[error("{0}")]
    BadCtxSize(String),
    #[error("the model failed inside its forward pass: {0}")]
    ModelPanicked(String),
    #[error("this sequence failed: {0}")]
    SequencePanicked(String),
    #[error("{0}")]
    Injected(String),
    #[error("reading experts into the expert cache as the model loaded: {0}")]
    Preload(String),
    #[error("empty prompt: at least one token is needed")]
    EmptyPrompt,
    #[error("structured output: {0}")]
    Guide(String),
    #[error("--trace {0}")]
    Trace(String),
    #[error("{}: the {family} family cannot list its tensors from config alone; give the model folder", path.display())]
    NoInventory { path: PathBuf, family: &'static str },
    #[error(
        "--mem {} is too small for this model: its resident weights take {} ({streamed} layers streamed), decoding state for the reserved context {}, read buffers {}{}",
        gib(*mem), gib(*resident), gib(*state), gib(*buffers), hint
    )]
    MemoryTooSmall {
        mem: usize,
        resident: usize,
        state: usize,
        buffers: usize,
        streamed: usize,
        /// What else would do (`--spine-format int8`), or empty.
        hint: String,
    },
}

/// See [`Engine::state_key`].
fn state_key(dir: &Path, ckpt: &strata_formats::Checkpoint, spine: crate::SpineFormat) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(crate::int8_spine::identity(ckpt).as_bytes());
    h.update(&std::fs::read(dir.join("config.json")).unwrap_or_default());
    h.update(format!("{spine:?} {}", strata_kernels::isa::isa().name()).as_bytes());
    format!("{:016x}", h.digest())
}

fn gib(b: usize) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Everything strata may hold (weights, expert cache, decoding state, buffers). Default: 90 %
    /// of the available memory.
    pub mem: Option<usize>,
    /// Bytes of decoded routed experts to keep in RAM. Default: what `mem` leaves.
    pub expert_cache: Option<usize>,
    /// Which guesses of the next MoE layer's experts (from the current residual) are read early:
    /// none by default; `Prefetch::Batches` those of prompts and batches, which name most of a
    /// layer's experts; `Prefetch::On` also a lone token's (on random-weight checkpoints neither
    /// has saved more disk time than it cost; see docs/PERFORMANCE.md).
    pub prefetch: strata_experts::Prefetch,
    /// How expert bytes are read (direct reads; mmap only to measure what it costs).
    pub io: strata_experts::IoMode,
    /// Which cached expert makes room for a new one.
    pub eviction: strata_experts::Eviction,
    /// When the expert cache's memory is faulted in (`--fault-in`).
    pub fault_in: strata_experts::FaultIn,
    /// Non-expert weights resident, streamed per layer, or whichever fits.
    pub spine: crate::SpineMode,
    /// Resident non-expert weights as stored, or as INT8 (`--spine-format`).
    pub spine_format: crate::SpineFormat,
    /// strata's cache folder, where the INT8 spine's sidecar is kept (none: converted at every
    /// start).
    pub cache_dir: Option<PathBuf>,
    /// Positions one sequence may hold (`--ctx-size`). Default: the model's context, capped by
    /// the decoding-state share of `mem`.
    pub ctx_size: Option<usize>,
    /// Sequences decoded at once that decoding state is reserved for (the server's
    /// `--max-concurrent`; 0 counts as 1).
    pub sequences: usize,
    /// Positions the longest sequence of this run needs, when known before loading (`run`,
    /// `bench`): taken as the context when `ctx_size` is not given (the model's context at most).
    pub positions: Option<usize>,
    /// Positions of decoding state all sequences share (`--state-tokens`). Default: `sequences`
    /// contexts, within the decoding-state share of `mem`.
    pub state_tokens: Option<usize>,
    /// Prompt tokens processed per step at most (`--prefill-chunk`). Default: sized to the
    /// model's hidden dimension so one step's activations stay within the working memory.
    pub prefill_chunk: Option<usize>,
    /// Told the progress of the load's long stages (progress bars).
    pub progress: Option<crate::Progress>,
    /// Memory for the server's prefix cache (`--prefix-cache`).
    pub prefix_cache: crate::PrefixCacheSize,
    /// Where every routing decision is written (`--trace`).
    pub trace: Option<PathBuf>,
}

/// Parses a size such as `512M`, `8G`, `1.5GiB`, `30K` or `123456` (bytes); binary units.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 512M, 8G, 1048576)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("`{text}`: unknown unit `{other}` (use K, M, G or T)")),
    };
    Ok((value * mult) as usize)
}

/// The memory this process may still take: MemAvailable from /proc/meminfo, or less where its
/// memory cgroup (a container, a `systemd-run -p MemoryMax=`, a cgroup cap) leaves less.
pub fn available_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    let host = kib * 1024;
    Some(cgroup_memory_left().map_or(host, |left| left.min(host)))
}

/// Limit minus usage of this process's memory cgroup (v2 `memory.max`/`memory.current`, v1
/// `memory.limit_in_bytes`/`memory.usage_in_bytes`), when it has a limit.
fn cgroup_memory_left() -> Option<usize> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    let (limit, usage) = match cgroup_path(&own)? {
        (true, path) => {
            let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
            (read(dir.join("memory.max"))?, read(dir.join("memory.current"))?)
        }
        (false, path) => {
            let dir = std::path::Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
            (
                read(dir.join("memory.limit_in_bytes"))?,
                read(dir.join("memory.usage_in_bytes"))?,
            )
        }
    };
    memory_left(&limit, &usage)
}

/// (cgroup v2, path) of the memory cgroup in a `/proc/self/cgroup` text: v1's `N:memory:/path`
/// (or a line naming memory among its controllers) first, else v2's `0::/path`.
fn cgroup_path(text: &str) -> Option<(bool, &str)> {
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some((false, path));
        }
        if controllers.is_empty() {
            v2 = Some((true, path));
        }
    }
    v2
}

/// What a limit leaves above the usage; `None` for no limit (`max`, or v1's huge number).
fn memory_left(limit: &str, usage: &str) -> Option<usize> {
    let limit: u64 = limit.trim().parse().ok()?;
    let usage: u64 = usage.trim().parse().ok()?;
    (limit < 1 << 60).then(|| limit.saturating_sub(usage) as usize)
}

pub struct Engine {
    pub dir: PathBuf,
    pub model: Box<dyn Model>,
    pub tokenizer: Option<Tokenizer>,
    pub generation: GenerationConfig,
    /// The routed-expert store (its statistics: hits, misses, bytes read).
    pub experts: Option<Arc<CachedStore>>,
    /// The store of streamed layers, when some are.
    pub spine: Option<Arc<SpineStore>>,
    pub memory: MemoryPlan,
    /// What the expert cache was given while the model loaded (buffers faulted in, experts
    /// preloaded).
    pub warmed: strata_experts::Warmed,
    /// Ids below the model's vocabulary that its tokenizer cannot decode (the rows a checkpoint
    /// pads its embedding with): never sampled, refused in `logit_bias`.
    pub masked_ids: Vec<u32>,
    /// Faults to inject (tests).
    pub faults: crate::Faults,
    /// The INT8 spine's sidecar (`--spine-format int8`): what this load read from it and
    /// converted.
    pub int8: Option<Arc<Int8Sidecar>>,
    /// What a sequence's decoding state depends on (the checkpoint's identity, its config, the
    /// spine format and the kernels), as a hex key: states kept on disk are filed under it.
    pub state_key: String,
    /// The vocabulary for structured output, built at its first use.
    guidance: std::sync::OnceLock<Result<Arc<crate::Guidance>, String>>,
}

/// `logits` output: argmax at every position and the full logits of the last one.
#[derive(Clone, Debug)]
pub struct LogitsOutput {
    pub argmax: Vec<u32>,
    pub last_logits: Vec<f32>,
    /// (n, V), every position.
    pub all_logits: Vec<f32>,
}

impl Engine {
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Engine, EngineError> {
        Self::load_from(dir, None, options)
    }

    /// Loads a folder whose shard bytes may not all be local yet: `source` makes each range
    /// present before it is read (a remote model's cache).
    pub fn load_from(
        dir: &Path,
        source: Option<std::sync::Arc<dyn strata_formats::RangeSource>>,
        options: &LoadOptions,
    ) -> Result<Engine, EngineError> {
        Self::load_with(dir, source, options, None)
    }

    /// As [`Engine::load_from`], with the folder's tokenizer already loaded (a caller that
    /// tokenized its prompt first, to know the positions it needs).
    pub fn load_with(
        dir: &Path,
        source: Option<std::sync::Arc<dyn strata_formats::RangeSource>>,
        options: &LoadOptions,
        tokenizer: Option<Tokenizer>,
    ) -> Result<Engine, EngineError> {
        let (cfg, ckpt) = strata_formats::open_model(dir)?;
        let ckpt = ckpt
            .with_quantization(QuantizationConfig::from_config(&cfg.text_config()?)?)
            .with_source(source);
        let t_load = std::time::Instant::now();
        let plan = ModelPlan::from_dir(dir)?;
        if let Some(device) = strata_kernels::offload::device() {
            device.hold_back_for_resident(plan.non_expert_bytes);
        }
        let memory = MemoryPlan::new(&plan, options)?;
        tracing::info!("{}", crate::loading::plan_line(&memory));
        let progress = options.progress.as_ref();
        let int8 = (options.spine_format == crate::SpineFormat::Int8).then(|| {
            Arc::new(Int8Sidecar::open(
                options.cache_dir.as_deref(),
                &ckpt,
                memory.resident as u64,
            ))
        });
        let state_key = state_key(dir, &ckpt, options.spine_format);
        let ckpt = ckpt.with_int8_spine(int8.clone().map(|s| s as Arc<dyn strata_formats::Int8Spine>));
        if ckpt.source().is_some() {
            crate::loading::fetch_resident(&cfg, &ckpt, progress)?;
        }
        // The stores first, from the config; the model gets them.
        let cache = strata_experts::CacheOptions {
            budget: memory.expert_cache,
            kept_buffers: memory.in_flight,
            prefetch: options.prefetch,
            io: options.io,
            eviction: options.eviction,
            fault_in: options.fault_in,
        };
        // One pool of reader threads for both stores: the disk sees one queue.
        let threads = strata_experts::DEFAULT_IO_THREADS
            + if memory.streamed.is_empty() {
                0
            } else {
                strata_experts::SPINE_THREADS
            };
        let readers = strata_experts::Readers::start(threads);
        let experts = Arc::new(CachedStore::open(&ckpt, &plan.layout, cache, &readers)?);
        if let Some(path) = &options.trace {
            experts
                .trace_to(path)
                .map_err(|e| EngineError::Trace(format!("{}: {e}", path.display())))?;
        }
        let spine = if memory.streamed.is_empty() {
            None
        } else {
            // Streamed layers' reads count with the experts' (one disk, one set of figures).
            let stats = experts.stats.clone();
            Some(Arc::new(SpineStore::open(
                ckpt.clone(),
                options.io,
                memory.spine_ahead,
                stats,
                &readers,
            )?))
        };
        let loading = Loading {
            experts: experts.clone(),
            streamed: memory.streamed.iter().copied().collect(),
            layers: spine.clone().map(|s| s as Arc<dyn LayerStore>),
        };
        let model = crate::loading::resident(progress, &ckpt, memory.resident as u64, || {
            load_model(&cfg, &ckpt, &loading)
        })?;
        let warmed = crate::loading::finish_warming(&experts, progress)?;
        if let Some(sidecar) = &int8 {
            sidecar.finish();
        }
        let tokenizer = match tokenizer {
            Some(t) => Some(t),
            None => Self::tokenizer_of(dir)?,
        };
        let gen_path = dir.join("generation_config.json");
        let mut generation = if gen_path.exists() {
            GenerationConfig::read(&gen_path)?
        } else {
            GenerationConfig::default()
        };
        if generation.eos_token_ids.is_empty() {
            generation.eos_token_ids = cfg.opt_id_list("eos_token_id")?.unwrap_or_default();
        }
        let vocab = model.info().vocab_size as u32;
        let masked_ids = match &tokenizer {
            Some(tok) => (0..vocab).filter(|&id| !tok.can_decode(id)).collect(),
            None => Vec::new(),
        };
        tracing::info!(
            "loaded {} in {:.2} s",
            dir.display(),
            t_load.elapsed().as_secs_f64()
        );
        Ok(Engine {
            dir: dir.to_path_buf(),
            model,
            tokenizer,
            generation,
            experts: Some(experts),
            spine,
            memory,
            warmed,
            masked_ids,
            faults: crate::Faults::from_env(),
            int8,
            state_key,
            guidance: std::sync::OnceLock::new(),
        })
    }

    /// The tokenizer of a model folder, if it has one. A GGUF file whose vocabulary strata cannot
    /// rebuild yet (another vocabulary type or pre-tokenizer) still runs on token ids: the reason
    /// is logged as a warning, and text commands then say that the model has no tokenizer.
    pub fn tokenizer_of(dir: &Path) -> Result<Option<Tokenizer>, EngineError> {
        if strata_formats::gguf::is_gguf(dir) {
            let g = strata_formats::gguf::Gguf::open(dir)?;
            if !strata_tokenizer::gguf::has_tokenizer(&g) {
                return Ok(None);
            }
            return Ok(match strata_tokenizer::gguf::from_gguf(&g) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!("{e}; the model runs on token ids only (--ids)");
                    None
                }
            });
        }
        if dir.join("tokenizer.json").exists() || dir.join("tiktoken.model").exists() {
            Ok(Some(Tokenizer::from_dir(dir)?))
        } else {
            Ok(None)
        }
    }

    pub fn tokenizer(&self) -> Result<&Tokenizer, EngineError> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| EngineError::NoTokenizer(self.dir.clone()))
    }

    /// Sampling as `generation_config.json` asks for it (greedy unless `do_sample`), with a seed
    /// from the clock; callers override what their user sets.
    pub fn sampling_defaults(&self) -> SamplingParams {
        let g = &self.generation;
        let sample = g.do_sample.unwrap_or(false);
        SamplingParams {
            temperature: if sample {
                g.temperature.unwrap_or(1.0) as f32
            } else {
                0.0
            },
            top_k: if sample { g.top_k.unwrap_or(0) } else { 0 },
            top_p: if sample {
                g.top_p.unwrap_or(1.0) as f32
            } else {
                1.0
            },
            min_p: g.min_p.unwrap_or(0.0) as f32,
            repetition_penalty: g.repetition_penalty.unwrap_or(1.0) as f32,
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
            ..SamplingParams::default()
        }
    }

    /// The vocabulary for structured output (built once; an error says why this model's
    /// tokenizer cannot give it).
    pub fn guidance(&self) -> Result<Arc<crate::Guidance>, EngineError> {
        let built = self.guidance.get_or_init(|| {
            let tok = self.tokenizer.as_ref().ok_or("the model has no tokenizer")?;
            let vocab = self.model.info().vocab_size;
            let eos = *self
                .generation
                .eos_token_ids
                .first()
                .ok_or("the model names no end-of-sequence token")?;
            crate::Guidance::new(&self.dir, tok, vocab, eos).map(Arc::new)
        });
        built.clone().map_err(EngineError::Guide)
    }

    pub fn new_cache(&self) -> KvCache {
        self.model.new_cache()
    }

    /// One forward pass over `ids` from an empty cache, with every position's logits.
    pub fn logits(&self, ids: &[u32]) -> Result<LogitsOutput, EngineError> {
        self.logits_traced(ids, None)
    }

    pub fn logits_traced(&self, ids: &[u32], trace: Option<&mut Trace>) -> Result<LogitsOutput, EngineError> {
        if ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let max = self.model.info().max_positions;
        if ids.len() > max {
            return Err(EngineError::PromptTooLong {
                prompt: ids.len(),
                max,
            });
        }
        let mut cache = self.new_cache();
        let mut batch = [SeqInput {
            tokens: ids,
            cache: &mut cache,
            all_logits: true,
        }];
        let out = self
            .model
            .forward(&mut batch, trace)?
            .pop()
            .expect("one sequence");
        let vocab = self.model.info().vocab_size;
        let argmax = out.chunks_exact(vocab).map(crate::sampler::argmax).collect();
        let last_logits = out[out.len() - vocab..].to_vec();
        Ok(LogitsOutput {
            argmax,
            last_logits,
            all_logits: out,
        })
    }
}

#[cfg(test)]
mod cgroup_tests {
    #[test]
    fn the_memory_cgroup_is_found_and_its_room_read() {
        let v1 = "12:pids:/\n9:cpuset:/\n4:memory:/user/capped\n0::/";
        assert_eq!(super::cgroup_path(v1), Some((false, "/user/capped")));
        assert_eq!(
            super::cgroup_path("0::/system.slice/x.service\n"),
            Some((true, "/system.slice/x.service"))
        );
        assert_eq!(super::cgroup_path("5:cpu,memory:/a\n"), Some((false, "/a")));
        assert_eq!(super::memory_left("2147483648\n", "1073741824\n"), Some(1 << 30));
        assert_eq!(super::memory_left("max\n", "5"), None);
        assert_eq!(super::memory_left("9223372036854771712", "5"), None);
        assert_eq!(super::memory_left("100", "300"), Some(0));
    }
}
