//! Where expert bytes live and how they move. The models ask an [`ExpertStore`] for the experts
//! their routers picked; this crate implements the store: [`CachedStore`], a RAM cache with a byte
//! budget over direct (page-cache-bypassing) reads of the checkpoint's shards. Every expert asked
//! for is returned: a smaller budget means more reads, never fewer experts.
//!
//! [`ExpertStore`]: strata_models::ExpertStore

mod cached;
pub mod direct;
mod engine;
mod plan;
pub mod replay;
mod routing_log;
mod spine;

pub use cached::{
    uring_available, CacheOptions, CachedStore, Eviction, FaultIn, Prefetch, Warmed, DEFAULT_IO_THREADS,
};
pub use direct::IoMode;
pub use engine::readers::Readers;
pub use engine::stats::StoreStats;
pub use plan::{ExpertPlan, ReadRun};
pub use routing_log::RoutingLog;
pub use spine::{SpineStore, DEFAULT_AHEAD, SPINE_THREADS};
