//! Loading a model folder into a ready engine, and the single-pass queries (`logits`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_experts::{CachedStore, SpineStore};
use strata_formats::{Checkpoint, DType, GenerationConfig, JsonConfig, QuantizationConfig};
use strata_models::{
    family_for, layer_of, load_model, BlockBuilder, ExpertLayout, ExpertStore, KvCache, LayerStore, Loading,
    Model, SeqInput, StreamedLayer, Trace,
};
use strata_tokenizer::Tokenizer;

use crate::MemoryPlan;
use crate::SamplingParams;

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
    #[error("empty prompt: at least one token is needed")]
    EmptyPrompt,
    #[error("{}: the {family} family cannot list its tensors from config alone; give the model folder", path.display())]
    NoInventory { path: PathBuf, family: &'static str },
    #[error(
        "--mem {} is too small for this model: its resident weights take {} ({streamed} layers streamed), decoding state for the reserved context {}, read buffers {}",
        gib(*mem), gib(*resident), gib(*state), gib(*buffers)
    )]
    MemoryTooSmall {
        mem: usize,
        resident: usize,
        state: usize,
        buffers: usize,
        streamed: usize,
    },
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
    /// Guess the next MoE layer's experts from the current residual and read them early (off by
    /// default: on random-weight checkpoints the guesses cost more disk time than they save; see
    /// docs/PERFORMANCE.md).
    pub prefetch: bool,
    /// How expert bytes are read (direct reads; mmap only to measure what it costs).
    pub io: strata_experts::IoMode,
    /// Which cached expert makes room for a new one.
    pub eviction: strata_experts::Eviction,
    /// Non-expert weights resident, streamed per layer, or whichever fits.
    pub spine: crate::SpineMode,
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

/// MemAvailable from /proc/meminfo, if readable.
pub fn available_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
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
    /// Ids below the model's vocabulary that its tokenizer cannot decode (the rows a checkpoint
    /// pads its embedding with): never sampled, refused in `logit_bias`.
    pub masked_ids: Vec<u32>,
    /// Faults to inject (tests).
    pub faults: crate::Faults,
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
        let cfg = JsonConfig::read(&dir.join("config.json"))?;
        let ckpt = Checkpoint::open(dir)?
            .with_quantization(QuantizationConfig::from_config(&cfg.text_config()?)?)
            .with_source(source);
        let memory = MemoryPlan::new(&ModelPlan::from_dir(dir)?, options)?;
        let budget = memory.expert_cache;
        let store_slot: std::cell::RefCell<Option<Arc<CachedStore>>> = Default::default();
        let factory = |layout: &ExpertLayout| -> strata_models::Result<Arc<dyn ExpertStore>> {
            let store = Arc::new(CachedStore::open(
                &ckpt,
                layout,
                budget,
                memory.in_flight,
                options.prefetch,
                options.io,
                options.eviction,
            )?);
            *store_slot.borrow_mut() = Some(store.clone());
            Ok(store)
        };
        let spine_slot: std::cell::RefCell<Option<Arc<SpineStore>>> = Default::default();
        let layers = |streamed: Vec<StreamedLayer>,
                      ckpt: Checkpoint,
                      builder: BlockBuilder|
         -> strata_models::Result<Arc<dyn LayerStore>> {
            // Streamed layers' reads count with the experts' (one disk, one set of figures).
            let stats = (store_slot.borrow().as_ref()).map_or_else(Default::default, |s| s.stats.clone());
            let io = options.io;
            let ahead = memory.spine_ahead;
            let store = Arc::new(SpineStore::open(ckpt, streamed, builder, io, ahead, stats)?);
            *spine_slot.borrow_mut() = Some(store.clone());
            Ok(store)
        };
        if ckpt.source().is_some() {
            fetch_resident(&cfg, &ckpt)?;
        }
        let loading = Loading {
            experts: &factory,
            streamed: memory.streamed.iter().copied().collect(),
            layers: Some(&layers),
        };
        let model = load_model(&cfg, &ckpt, &loading)?;
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
        Ok(Engine {
            dir: dir.to_path_buf(),
            model,
            tokenizer,
            generation,
            experts: store_slot.into_inner(),
            spine: spine_slot.into_inner(),
            memory,
            masked_ids,
            faults: crate::Faults::from_env(),
        })
    }

    /// The tokenizer of a model folder, if it has one.
    pub fn tokenizer_of(dir: &Path) -> Result<Option<Tokenizer>, EngineError> {
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

/// What a model folder holds and what running it costs, from headers and config alone.
#[derive(Clone, Debug)]
pub struct ModelPlan {
    pub architecture: String,
    pub model_type: String,
    pub family: &'static str,
    pub n_layers: usize,
    pub vocab_size: usize,
    pub hidden_dim: usize,
    pub layout: ExpertLayout,
    pub max_positions: usize,
    /// Decoding state (KV cache) of one position of one sequence.
    pub state_bytes_per_token: usize,
    /// Decoding state of one sequence whatever its length (recurrent layers).
    pub state_bytes_per_sequence: usize,
    pub total_params: u64,
    pub expert_params: u64,
    pub expert_bytes: u64,
    pub non_expert_params: u64,
    pub non_expert_bytes: u64,
    /// Non-expert bytes of each decoder layer (the part that can stream).
    pub layer_bytes: Vec<u64>,
    /// Parameters of the input embedding when the head is a separate tensor (a row lookup per
    /// token, not counted as active).
    pub embedding_params: u64,
    /// (dtype, tensors, bytes)
    pub formats: Vec<(String, usize, u64)>,
}

impl ModelPlan {
    pub fn from_dir(dir: &Path) -> Result<ModelPlan, EngineError> {
        let cfg = JsonConfig::read(&dir.join("config.json"))?;
        let ckpt = Checkpoint::open(dir)?;
        let entries = ckpt.entries().map(|e| {
            (
                e.info.name.clone(),
                e.info.dtype,
                e.info.numel() as u64,
                e.info.len,
            )
        });
        Self::from_tensors(&cfg, entries)
    }

    /// The plan of a config alone (no weights): the family lists the tensors a checkpoint of
    /// this config holds, in the real checkpoints' storage formats.
    pub fn from_config(config: &Path) -> Result<ModelPlan, EngineError> {
        let cfg = JsonConfig::read(config)?;
        let family = family_for(&cfg)?;
        let inventory = family.inventory.ok_or_else(|| EngineError::NoInventory {
            path: config.to_path_buf(),
            family: family.name,
        })?;
        let entries = inventory(&cfg)?.into_iter().map(|t| {
            let numel: u64 = t.shape.iter().map(|&n| n as u64).product();
            let bytes = numel * t.dtype.size() as u64;
            (t.name, t.dtype, numel, bytes)
        });
        Self::from_tensors(&cfg, entries)
    }

    /// `tensors`: (name, dtype, elements, bytes) of every tensor.
    fn from_tensors(
        cfg: &JsonConfig,
        tensors: impl Iterator<Item = (String, DType, u64, u64)>,
    ) -> Result<ModelPlan, EngineError> {
        let family = family_for(cfg)?;
        let layout = (family.expert_layout)(cfg)?;
        let summary = (family.summary)(cfg)?;
        let mut prefixes = HashSet::new();
        for &l in &layout.moe_layers {
            for e in 0..layout.n_experts {
                for p in 0..3 {
                    prefixes.insert(layout.tensor_base(l, e, p));
                }
            }
        }
        let mut plan = ModelPlan {
            architecture: cfg.architecture().unwrap_or("?").to_string(),
            model_type: cfg.opt_str("model_type")?.unwrap_or("?").to_string(),
            family: family.name,
            n_layers: summary.n_layers,
            vocab_size: summary.vocab_size,
            hidden_dim: summary.hidden_dim,
            layout,
            max_positions: summary.max_positions,
            state_bytes_per_token: summary.state_bytes_per_token,
            state_bytes_per_sequence: summary.state_bytes_per_sequence,
            total_params: 0,
            expert_params: 0,
            expert_bytes: 0,
            non_expert_params: 0,
            non_expert_bytes: 0,
            layer_bytes: vec![0; summary.n_layers],
            embedding_params: 0,
            formats: Vec::new(),
        };
        let mut formats: std::collections::BTreeMap<String, (usize, u64)> = Default::default();
        let (mut embedding, mut separate_head) = (0, false);
        for (name, dtype, numel, len) in tensors {
            let params = logical_params(&name, dtype, numel);
            if name.ends_with("embed_tokens.weight") {
                embedding = params;
            }
            separate_head |= name.ends_with("lm_head.weight");
            let is_expert = name
                .rsplit_once('.')
                .is_some_and(|(base, _)| prefixes.contains(base));
            if is_expert {
                plan.expert_params += params;
                plan.expert_bytes += len;
            } else {
                plan.non_expert_params += params;
                plan.non_expert_bytes += len;
                if let Some(l) = layer_of(&name).filter(|&l| l < summary.n_layers) {
                    plan.layer_bytes[l] += len;
                }
            }
            let f = formats.entry(dtype.name().to_string()).or_default();
            f.0 += 1;
            f.1 += len;
        }
        plan.total_params = plan.expert_params + plan.non_expert_params;
        plan.embedding_params = if separate_head { embedding } else { 0 };
        plan.formats = formats.into_iter().map(|(k, (n, b))| (k, n, b)).collect();
        Ok(plan)
    }

    pub fn n_expert_slots(&self) -> u64 {
        (self.layout.moe_layers.len() * self.layout.n_experts) as u64
    }

    pub fn bytes_per_expert(&self) -> u64 {
        self.expert_bytes / self.n_expert_slots().max(1)
    }

    /// Parameters one token computes with: the non-expert weights (less the input embedding,
    /// a lookup) and `top_k` routed experts per MoE layer.
    pub fn active_params(&self) -> u64 {
        let per_expert = self.expert_params / self.n_expert_slots().max(1);
        self.non_expert_params - self.embedding_params
            + per_expert * (self.layout.top_k * self.layout.moe_layers.len()) as u64
    }

    /// Expert bytes one token reads when no expert is cached.
    pub fn uncached_token_bytes(&self) -> u64 {
        self.bytes_per_expert() * (self.layout.top_k * self.layout.moe_layers.len()) as u64
    }
}

/// For a checkpoint whose bytes come from a remote source: makes every non-expert tensor present
/// first, adjacent tensors merged into one range (one request per contiguous missing run rather
/// than one per tensor).
fn fetch_resident(cfg: &JsonConfig, ckpt: &Checkpoint) -> Result<(), EngineError> {
    let layout = (family_for(cfg)?.expert_layout)(cfg)?;
    let mut prefixes = HashSet::new();
    for &l in &layout.moe_layers {
        for e in 0..layout.n_experts {
            for p in 0..3 {
                prefixes.insert(layout.tensor_base(l, e, p));
            }
        }
    }
    let mut ranges: Vec<(usize, u64, u64)> = ckpt
        .entries()
        .filter(|e| {
            !e.info
                .name
                .rsplit_once('.')
                .is_some_and(|(base, _)| prefixes.contains(base))
        })
        .map(|e| (e.shard, e.info.offset, e.info.offset + e.info.len))
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(usize, u64, u64)> = Vec::new();
    for (shard, a, b) in ranges {
        match merged.last_mut() {
            Some(last) if last.0 == shard && a <= last.2 => last.2 = last.2.max(b),
            _ => merged.push((shard, a, b)),
        }
    }
    for (shard, a, b) in merged {
        ckpt.ensure(shard, a, b - a)?;
    }
    Ok(())
}

/// Elements of the unquantized matrix a tensor stands for (scales and shape tensors count 0).
fn logical_params(name: &str, dtype: DType, numel: u64) -> u64 {
    if name.ends_with("weight_scale") || name.ends_with("weight_scale_inv") || name.ends_with("weight_shape")
    {
        0
    } else if name.ends_with("weight_packed") && dtype == DType::I32 {
        numel * 8 // INT4: eight per 32-bit word
    } else if name.ends_with("weight_packed") && dtype == DType::U8 {
        numel * 2 // MXFP4: two per byte
    } else {
        numel
    }
}
