//! Running a model straight from Hugging Face (`hf://ORG/NAME[@REV]`) or any HTTP server that
//! honours `Range`: small files are fetched whole, shard headers by range, and each expert (or
//! any tensor) the first time it is read, with one `Range` request per contiguous missing run,
//! into a crash-safe local cache that later runs (and `--offline`) read like a local folder.

mod gguf_pick;
mod http;
pub mod hub;
mod journal;
mod location;
pub mod maintain;
mod mirror;

pub use http::{parse_content_range, FetchError, Http, RetryPolicy};
pub use journal::{decode_records, Journal, Run};
pub use location::{default_cache_dir, Location, Pick, RemoteOptions, LISTING_FILE};
pub use mirror::{open_location, Mirror, ABSENT_FILE, META_SUFFIX, RUNS_SUFFIX, SMALL_FILES, USED_FILE};
