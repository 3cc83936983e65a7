//! The engine: loads a model folder (config, checkpoint, tokenizer, generation defaults), owns the
//! expert store, and runs the generation loop over a batch of sequences with sampling, EOS and
//! stop strings. The CLI and the server drive it.

mod engine;
mod faults;
mod generate;
mod guided;
mod int8_spine;
mod loading;
mod memory;
mod model_plan;
mod prefix;
mod prefix_disk;
mod rng;
mod sampler;
mod sequence;
mod session;
mod stop;

pub use engine::{available_memory, parse_size, Engine, EngineError, LoadOptions, LogitsOutput};
pub use faults::Faults;
pub use generate::{Batch, FinishReason, GenEvent, Request, RequestExtras, TokenLogprobs};
pub use guided::{Guidance, Guide};
pub use int8_spine::{Int8Sidecar, Int8Stats};
pub use loading::{LoadProgress, Progress};
pub use memory::{MemoryPlan, SpineFormat, SpineMode, MIN_STATE_TOKENS};
pub use model_plan::ModelPlan;
pub use prefix::{Mark, PrefixCache, PrefixCacheSize, PrefixDisk, PrefixDiskStats, Resume, Snapshot};
pub use rng::Rng;
pub use sampler::{Sampler, SamplingParams};
pub use session::{Session, Turn};
pub use stop::StopMatcher;
