//! The GPU embedding cache's device side: its slots (keys, stamps, rows) in device
//! memory and the NVRTC kernels that read and write them. The policy (geometry,
//! epochs, counters of hits and misses, grouping inserts by set) belongs to the store
//! (`triton_rust_embedding::gpu`); this module only runs what it is told on the GPU.
//!
//! A table's lookup (`cache_lookup`) is one warp per key: the 32 lanes read the set's 32
//! keys at once, a ballot finds the way, and the warp copies the row (float4 when
//! `dim % 4 == 0`). A whole batch's lookup (`batch_lookup*`, `BatchLookup`) takes four keys
//! a warp, eight lanes each: a lane reads four of the set's keys (32 bytes), one ballot and
//! one shuffle find the way, and the eight lanes copy the row; a warp so keeps four keys'
//! reads in flight, and the lookup holds a quarter of the warps the network's kernels
//! beside it would otherwise wait for. Empty slots hold `EMPTY_KEY`, so a lookup reads only
//! the set's 32 keys (256 bytes of tags for a row of `dim × 4`), never the stamps. One warp
//! handles one set's inserts in order, so two inserts never race for a victim. All of a
//! cache's calls go through one stream (the instances sharing a cache share it), so a lookup
//! and an insert never overlap.
//!
//! Files: `slots.rs` (one table's slots, its lookups and inserts), `rows.rs` (the rows
//! buffer a GPU instance looks up into), `batch.rs`, `batch_args.rs` and `batch_host.rs` (a whole batch over
//! every table, and its arguments), `pool.rs` (a pooled lookup's bags reduced to one row each), `bench.rs` (feature `bench`: what only
//! the benchmarks use).

mod batch;
mod batch_args;
#[cfg(feature = "bench")]
mod bench;
mod pool;
mod rows;
mod slots;

pub use crate::copy::Queue;
pub use crate::pinned::HostRows;
pub use batch::{BatchLookup, KernelTimes, PoolSpec};
pub use batch_args::{
    BatchKeys, BatchTimes, FetchMisses, FetchedRows, KeyLayout, KeyUpload, RowFormat,
};
#[cfg(feature = "bench")]
pub use bench::DeviceKeys;
pub use pool::{BagLayout, Pooler, ResidentPool};
pub use rows::DeviceRows;
#[cfg(test)]
pub(crate) use slots::DESC;
pub use slots::{CacheSlots, InsertPlan, WAYS};
