//! The hierarchical embedding store: the replacement for Merlin's HPS.
//!
//! Tiers, fastest first: a cache (GPU memory, one per GPU shared by the instances there,
//! or host memory on a CPU instance, one each; same policy: `cache.rs`), the host tier holding every row
//! loaded from disk (`host.rs`, memory-mapped), an optional Redis tier for rows beyond
//! one machine (`redis.rs`), and the table's default vector for keys found nowhere.
//! A lookup that misses the cache is filled from below and the rows are inserted into
//! the cache — before the lookup returns when the batch's hit rate is under
//! `hit_rate_threshold`, by a background thread otherwise (HPS's semantics).
//!
//! Updates go to the host tier (and Redis), then overwrite the row in every cache that
//! holds it. A cache fill that raced with an update is dropped rather than inserted, so
//! no cache keeps a superseded row (the update gate below). Visible in every tier when
//! `update` returns.
//!
//! Nothing here knows Triton; `triton_rust_engine_embedding` adapts it to the `Engine` trait.

pub mod cache;
pub mod durable;
pub mod fixture;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod host;
pub mod keys;
pub mod redis;
pub mod settings;
pub mod shard;
mod stamps;
pub mod store;
pub mod stream;
pub mod table;

mod store_config;

pub use keys::{mix64, Zipf};
pub use redis::RemoteTier;
pub use store::{EmbeddingStore, InstanceCaches, TableCounters};
pub use store_config::*;
