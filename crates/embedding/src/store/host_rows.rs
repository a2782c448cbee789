//! Misses read by the GPU itself (`gpucache_miss_reads: gpu`): every table's rows in host
//! memory (its file's mapping, or the huge-page copy) page-locked where they are and mapped
//! into the GPUs' address space, so a batch lookup's kernel reads its misses over the bus
//! instead of sending them to host threads and their rows back. It serves the rows a table
//! was loaded with: once an update has written a table, or a compaction swapped its rows,
//! the lookups read below the cache on the host again, as without the setting.

use std::sync::Arc;

use triton_rust_core::error::{Error, Result};
use triton_rust_cuda::cache::HostRows;

use super::{EmbeddingStore, InstanceCaches};
use crate::gpu::BatchLookup;
use crate::host::HostTier;
use crate::table::VectorType;

/// Every table's registered rows, and the host tier each was registered from.
pub(crate) struct GpuHostRows {
    tiers: Vec<Arc<HostTier>>,
    rows: Vec<(Arc<HostRows>, f32)>,
}

impl EmbeddingStore {
    /// The tables' host rows registered for the GPUs (made on first use, `device`'s context
    /// bound while registering). Refused, naming the table, unless every table was loaded
    /// from files with keys `0..rows` and no Redis tier sits below (its misses go there).
    pub(crate) fn gpu_host_rows(&self, device: i32) -> Result<Arc<GpuHostRows>> {
        let mut held = self.host_rows.lock();
        if let Some(h) = held.as_ref() {
            return Ok(h.clone());
        }
        let why = |what: String| {
            Error::invalid_arg(format!("parameter 'gpucache_miss_reads' is gpu, but {what}"))
        };
        if self.remote.is_some() {
            return Err(why("a volatile_db is set: misses past the host tier go to Redis, which only host threads read".into()));
        }
        // every table checked before any is page-locked
        let mut plan = Vec::with_capacity(self.tables.len());
        for t in &self.tables {
            let tier = t.host.read().clone();
            let name = &t.config.name;
            let (bytes, ty, updated) = tier.dense_base().ok_or_else(|| {
                why(format!("table '{name}' was not loaded from files with keys 0..rows in order"))
            })?;
            if !updated.is_empty() {
                return Err(why(format!("table '{name}' has updates since it was loaded")));
            }
            let elem = match ty {
                VectorType::F16 => 2,
                VectorType::F32 => 4,
            };
            let (n, gb) = (bytes.len() / (t.config.dim * elem).max(1), bytes.len() as f64 / 1e9);
            plan.push((tier.clone(), n, elem, gb));
        }
        let (mut tiers, mut rows) = (Vec::new(), Vec::new());
        for (t, (tier, n, elem, gb)) in self.tables.iter().zip(plan) {
            let r = HostRows::register(device, tier.clone(), dense_rows, n, elem).map_err(|e| {
                let name = &t.config.name;
                why(format!(
                    "table '{name}''s {gb:.1} GB of rows could not be mapped for the GPU: {e}"
                ))
            })?;
            rows.push((Arc::new(r), t.config.default_value));
            tiers.push(tier);
        }
        log::info!(
            "gpucache_miss_reads: gpu: {} tables' rows in host memory mapped for the GPUs",
            rows.len()
        );
        let h = Arc::new(GpuHostRows { tiers, rows });
        *held = Some(h.clone());
        Ok(h)
    }

    /// Whether a lookup may read its misses from the registered rows now: every table's host
    /// tier is still the one registered and untouched by updates.
    pub(super) fn host_rows_current(&self) -> bool {
        let held = self.host_rows.lock();
        let Some(h) = held.as_ref() else { return false };
        self.tables.iter().zip(&h.tiers).all(|(t, reg)| {
            let now = t.host.read();
            Arc::ptr_eq(&now, reg) && now.untouched()
        })
    }
}

/// A dense table's rows as its file keeps them (what `gpu_host_rows` checked it has).
fn dense_rows(t: &HostTier) -> &[u8] {
    t.dense_base().map_or(&[], |(b, _, _)| b)
}

impl InstanceCaches {
    /// Has `lookup` (on GPU `device`) read its misses in place from the tables' host rows
    /// while they are the rows the tables were loaded with (see the module's docs).
    pub fn let_gpu_read_misses(&self, device: i32, lookup: &mut BatchLookup) -> Result<()> {
        let h = self.store.gpu_host_rows(device)?;
        Ok(lookup.set_host_rows(&h.rows)?)
    }

    /// Before a batch: whether its misses may be read on the GPU (when its lookup was set so).
    pub(crate) fn misses_on_gpu_now(&self) -> bool {
        self.store.host_rows_current()
    }
}
