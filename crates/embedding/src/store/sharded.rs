//! Sharded rows (`gpucache_placement: sharded`): every table resident in the memory of one of
//! the host's GPUs, placed by the plan of `crate::shard`, and the same tables given to every
//! GPU's instances; the tables with the most lookups a byte (the smallest, one-hot), within
//! `gpucache_sharded_replicate` of each GPU's room, are copied to every GPU, and each GPU's
//! instances get their own GPU's copy. A GPU's lookup reads the tables it lacks from its
//! peers' memory: its kernel takes each table's row pointers, and peer access lets it follow
//! those that point at another GPU. A table's updates go through the queue of each GPU that
//! holds a copy.
//!
//! Whole tables only: a table too large for any one GPU's free memory is refused (cutting it
//! into row ranges is planned by `crate::shard` but not built).

use std::sync::Arc;

use triton_rust_core::error::{Error, Result};

use super::EmbeddingStore;
use crate::cache::CacheTier;
use crate::gpu;
use crate::shard::{check_devices, ShardPlan, TableSize};
use crate::store_config::CacheRows;

/// A share of each GPU's free memory the plan leaves for everything else (the network, its
/// CUDA graphs, the batches' buffers).
const KEEP_FREE: f64 = 0.15;

/// The bytes of rows the plan may place on a GPU with `free` bytes free: all but the share
/// kept free, and at most `most` where `gpucache_sharded_memory_gb` sets it (`most` 0: no cap).
fn room_of(free: u64, most: u64) -> u64 {
    let room = (free as f64 * (1.0 - KEEP_FREE)) as u64;
    if most > 0 {
        room.min(most)
    } else {
        room
    }
}

/// The store's tables, each resident on the GPU the plan gave it, or on every GPU.
pub(crate) struct ShardedTables {
    /// For each GPU of `gpus`, the tables its instances read: each table's rows on the GPU
    /// that holds them (the same for every GPU), or this GPU's copy of a replicated table.
    caches: Vec<Vec<Arc<dyn CacheTier>>>,
    /// The GPUs the rows span.
    pub(crate) gpus: Vec<i32>,
    /// Each GPU's instance the tables there were made with (their queues carry the updates).
    _owners: Vec<gpu::GpuInstance>,
}

impl ShardedTables {
    /// The tables an instance on GPU `device` reads.
    pub(crate) fn caches_for(&self, device: i32) -> Result<&[Arc<dyn CacheTier>]> {
        let g = self.gpus.iter().position(|&g| g == device).ok_or_else(|| {
            Error::internal(format!("GPU {device} is not one of the sharded rows' {:?}", self.gpus))
        })?;
        Ok(&self.caches[g])
    }

    /// Every copy of table `t`'s rows, once each (an update writes them all).
    pub(crate) fn copies(&self, t: usize) -> Vec<Arc<dyn CacheTier>> {
        let mut out: Vec<Arc<dyn CacheTier>> = Vec::new();
        for c in self.caches.iter().filter_map(|g| g.get(t)) {
            if !out.iter().any(|o| Arc::ptr_eq(o, c)) {
                out.push(c.clone());
            }
        }
        out
    }
}

impl EmbeddingStore {
    /// The sharded tables, made on first use over every GPU the process sees; `device`: the
    /// GPU of the instance that asks. Callers hold the update gate for reading.
    pub(crate) fn sharded_tables(&self, device: i32) -> Result<Arc<ShardedTables>> {
        let mut held = self.sharded.lock();
        if let Some(s) = held.as_ref() {
            return Ok(s.clone());
        }
        let visible = triton_rust_cuda::gpu_count()?;
        let gpus: Vec<i32> = (0..visible).collect();
        check_devices(&gpus).map_err(|e| e.context("gpucache_placement sharded"))?;
        if !gpus.contains(&device) {
            return Err(Error::internal(format!(
                "an instance on GPU {device}, which the process does not see"
            )));
        }
        let mut sizes = Vec::with_capacity(self.tables.len());
        for (t, table) in self.tables.iter().enumerate() {
            let rows = self.host(t).dense_rows().ok_or_else(|| {
                Error::invalid_arg(format!(
                    "gpucache_placement sharded keeps every table resident on a GPU, which needs keys 0..rows in order; table '{}' has other keys",
                    table.config.name
                ))
            })?;
            let width = match self.config.cache_rows {
                CacheRows::F32 => 4,
                CacheRows::F16 => 2,
            };
            sizes.push(TableSize {
                rows: rows as u64,
                row_bytes: (table.config.dim * width) as u64,
                lookups: self.config.hotness.get(t).map_or(1, |&h| h as u64),
            });
        }
        triton_rust_cuda::enable_peer_access(&gpus)
            .map_err(|e| Error::unavailable(format!("gpucache_placement sharded: {e}")))?;
        let mut room = Vec::with_capacity(gpus.len());
        for &g in &gpus {
            room.push((g, room_of(triton_rust_cuda::free_memory(g)?, self.config.sharded_memory)));
        }
        let least = room.iter().map(|g| g.1).min().unwrap_or(0);
        let replicate = (least as f64 * self.config.replicate_share) as u64;
        let plan = ShardPlan::new(&sizes, &room, replicate).map_err(|e| {
            e.context(format!(
                "gpucache_placement sharded over GPUs {gpus:?} (free memory {room:?})"
            ))
        })?;
        for (t, table) in self.tables.iter().enumerate() {
            if !plan.replicated(t) && plan.shards(t).len() > 1 {
                return Err(Error::unsupported(format!(
                    "table '{}' ({} bytes) fits no one GPU's free memory; cutting a table into row ranges over GPUs is not built (gpucache_placement sharded places whole tables)",
                    table.config.name,
                    sizes[t].rows * sizes[t].row_bytes
                )));
            }
        }
        let owners = gpus
            .iter()
            .map(|&g| gpu::GpuInstance::new(g, self.config.cache_rows))
            .collect::<Result<Vec<_>>>()?;
        let mut caches: Vec<Vec<Arc<dyn CacheTier>>> = vec![Vec::new(); gpus.len()];
        for t in 0..self.tables.len() {
            if plan.replicated(t) {
                for (g, owner) in owners.iter().enumerate() {
                    caches[g].push(owner.new_resident(&self.host(t), self.cache_geometry(t))?);
                }
                continue;
            }
            let g = plan.shards(t).first().map_or(gpus[0], |s| s.gpu);
            let owner = &owners[gpus.iter().position(|&x| x == g).unwrap_or(0)];
            let rows = owner.new_resident(&self.host(t), self.cache_geometry(t))?;
            for held in caches.iter_mut() {
                held.push(rows.clone());
            }
        }
        let names = |of: &dyn Fn(usize) -> bool| {
            let names: Vec<&str> = (0..self.tables.len())
                .filter(|&t| of(t))
                .map(|t| self.tables[t].config.name.as_str())
                .collect();
            format!("{} tables: {}", names.len(), names.join(","))
        };
        for &g in &gpus {
            log::info!(
                "sharded rows: GPU {g} holds {:.1} GB, {}",
                plan.bytes_on(g, &sizes) as f64 / 1e9,
                names(
                    &|t| !plan.replicated(t) && plan.shards(t).first().is_some_and(|s| s.gpu == g)
                )
            );
        }
        log::info!("sharded rows: copied to every GPU, {}", names(&|t| plan.replicated(t)));
        let s = Arc::new(ShardedTables { caches, gpus, _owners: owners });
        *held = Some(s.clone());
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::room_of;

    #[test]
    fn room_keeps_a_share_free_and_takes_the_cap() {
        assert_eq!(room_of(100_000, 0), 85_000);
        assert_eq!(room_of(100_000, 50_000), 50_000, "the cap below the room");
        assert_eq!(room_of(100_000, 90_000), 85_000, "a cap above the room leaves it");
    }
}
