//! The GPU cache tier: the policy of `cache.rs` (same layout, same LRU at batch
//! granularity or LFU with the same sketch, same counters) over slots in GPU memory. The device side — slots,
//! kernels, the rows buffer a GPU instance looks up into — is the CUDA crate's
//! (`triton_rust_cuda::cache`); this module decides what runs there. Built with the
//! `gpu` feature; `group_by_set`, the host logic of an insert, is unit-tested on CPUs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use triton_rust_core::error::{Error, Result};
pub use triton_rust_cuda::cache::{
    BagLayout, BatchKeys, BatchLookup, DeviceRows, FetchedRows, KeyLayout, KeyUpload, PoolSpec,
    Pooler, ResidentPool, RowFormat,
};
use triton_rust_cuda::cache::{CacheSlots, InsertPlan, Queue, WAYS as DEVICE_WAYS};

use crate::cache::{CacheCounters, CacheGeometry, CachePolicy, CacheTier, EMPTY_KEY, WAYS};
use crate::host::HostTier;
use crate::store_config::CacheRows;
use crate::table::VectorType;

const _: () = assert!(WAYS == DEVICE_WAYS, "the kernels assume one warp per set");

/// Groups insert keys by set: (order of key indices, start offset per group, set per group).
/// Keys keep their order within a set, as the CPU cache applies them.
pub fn group_by_set(geo: &CacheGeometry, keys: &[i64]) -> (Vec<i32>, Vec<i32>, Vec<i64>) {
    let mut idx: Vec<(usize, usize)> =
        keys.iter().enumerate().map(|(i, &k)| (geo.set_of(k), i)).collect();
    idx.sort_by_key(|&(s, i)| (s, i));
    let order: Vec<i32> = idx.iter().map(|&(_, i)| i as i32).collect();
    let mut starts = Vec::new();
    let mut sets = Vec::new();
    for (pos, &(s, _)) in idx.iter().enumerate() {
        if sets.last() != Some(&(s as i64)) {
            starts.push(pos as i32);
            sets.push(s as i64);
        }
    }
    starts.push(idx.len() as i32);
    (order, starts, sets)
}

pub struct GpuCache {
    slots: CacheSlots,
    geo: CacheGeometry,
    clock: Arc<AtomicU64>,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// The GPU side of a set of caches: the queue all their slot work goes through (so a fill
/// never overlaps a lookup), the clock their LRU stamps come from (one clock, so a batch that
/// looks up every table at once stamps them all alike) and how they keep their rows. One
/// instance's own, or shared (a clone) by every instance of a store on one GPU
/// ([`crate::EmbeddingStore::attach_gpu_caches`]): their lookups and fills then queue in one
/// order, and each instance keeps its own buffers and its own stream for the rest of its
/// lookups ([`BatchLookup`]).
#[derive(Clone)]
pub struct GpuInstance {
    queue: Queue,
    clock: Arc<AtomicU64>,
    /// How its caches keep their rows.
    rows: RowFormat,
    /// The pooled lookups stamp one hit in this many (`set_hit_stamp_every`).
    stamp_every: u32,
}

impl GpuInstance {
    /// Caches on GPU `device` that keep their rows as `rows` says.
    pub fn new(device: i32, rows: CacheRows) -> Result<GpuInstance> {
        let rows = match rows {
            CacheRows::F32 => RowFormat::F32,
            CacheRows::F16 => RowFormat::F16,
        };
        let (queue, clock) = (Queue::new(device)?, Arc::new(AtomicU64::new(1)));
        Ok(GpuInstance { queue, clock, rows, stamp_every: 1 })
    }

    /// A cache for one table of this instance; keys `0..index_rows` with a key index
    /// (`CacheSlots::new`; 0: none, every probe reads its set's tags).
    pub fn new_cache(&self, geo: CacheGeometry, index_rows: usize) -> Result<Arc<dyn CacheTier>> {
        let clock = self.clock.clone();
        let mut cache = GpuCache::with_queue(&self.queue, geo, clock, self.rows, index_rows)?;
        cache.slots.set_hit_stamp_every(self.stamp_every)?;
        Ok(Arc::new(cache))
    }

    /// The caches made after this stamp one pooled lookup's hit in `every`
    /// (`gpucache_hit_stamp_every`; `CacheSlots::set_hit_stamp_every`).
    pub fn set_hit_stamp_every(&mut self, every: u32) {
        self.stamp_every = every;
    }

    /// A resident table of this instance: every row of `host` (a dense table, keys
    /// `0..rows`) copied to the GPU and looked up by row number. The caller holds updates
    /// back until the table is registered for them.
    pub fn new_resident(&self, host: &HostTier, geo: CacheGeometry) -> Result<Arc<dyn CacheTier>> {
        let (bytes, stored, updated) = host
            .dense_base()
            .ok_or_else(|| Error::internal("a resident table needs keys 0..rows in order"))?;
        let dim = geo.dim;
        let nrows = bytes.len() / (dim * stored.size()).max(1);
        let slots = CacheSlots::resident(&self.queue, nrows, dim, self.rows)?;
        match (stored, self.rows) {
            (VectorType::F32, RowFormat::F32) | (VectorType::F16, RowFormat::F16) => {
                slots.upload_rows(0, bytes)?
            }
            // converted a million rows at a time, on every core (fp16 <-> fp32 both
            // round-trip exactly where the cache's format can hold the value; fp32 -> fp16
            // rounds to nearest even, as the GPU's fills do)
            _ => {
                use rayon::prelude::*;
                let per = 1 << 20;
                let row_bytes = dim * stored.size();
                let (mut f, mut h) = (Vec::<f32>::new(), Vec::<u16>::new());
                for (i, part) in bytes.chunks(per * row_bytes).enumerate() {
                    let n = part.len() / row_bytes;
                    f.resize(n * dim, 0.0);
                    f.par_chunks_mut(dim * 4096).zip(part.par_chunks(row_bytes * 4096)).for_each(
                        |(dst, src)| {
                            for (s, d) in src.chunks_exact(row_bytes).zip(dst.chunks_exact_mut(dim))
                            {
                                crate::table::decode_row(stored, s, d);
                            }
                        },
                    );
                    match self.rows {
                        RowFormat::F32 => slots.upload_rows(i * per, bytemuck::cast_slice(&f))?,
                        RowFormat::F16 => {
                            h.resize(n * dim, 0);
                            h.par_chunks_mut(1 << 16).zip(f.par_chunks(1 << 16)).for_each(
                                |(dst, src)| {
                                    for (o, v) in dst.iter_mut().zip(src) {
                                        // the cache's rows are little-endian, as this host
                                        *o = half::f16::from_f32(*v).to_bits().to_le();
                                    }
                                },
                            );
                            slots.upload_rows(i * per, bytemuck::cast_slice(&h))?
                        }
                    }
                }
            }
        }
        let cache = GpuCache {
            slots,
            geo,
            clock: self.clock.clone(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        };
        // rows updated since the table was loaded: their current rows
        if !updated.is_empty() {
            let mut rows = vec![0f32; updated.len() * dim];
            for (k, row) in updated.iter().zip(rows.chunks_exact_mut(dim)) {
                host.get(*k, row);
            }
            cache.write(&updated, &rows, false)?;
        }
        Ok(Arc::new(cache))
    }

    /// The next lookup epoch.
    /// The GPU its caches are on.
    pub fn device(&self) -> i32 {
        self.queue.device()
    }

    pub fn next_epoch(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// The whole-batch lookup over `caches` (one per table, each this instance's), its
    /// rows written as `format`.
    pub fn batch_lookup(
        &self,
        caches: &[Option<&GpuCache>],
        dim: usize,
        format: RowFormat,
    ) -> Result<BatchLookup> {
        let slots: Vec<Option<&CacheSlots>> = caches.iter().map(|c| c.map(|c| &c.slots)).collect();
        Ok(BatchLookup::new(&self.queue, &slots, dim, format)?)
    }

    /// A pooler of looked-up rows on this instance's GPU (pooled lookups).
    pub fn pooler(&self) -> Result<Pooler> {
        Ok(Pooler::new(&self.queue)?)
    }

    /// The one-kernel pooled lookup over `caches` when every one is a resident table (see
    /// [`ResidentPool`]), its rows written as `format`; `None` otherwise.
    pub fn resident_pool(
        &self,
        caches: &[Option<&GpuCache>],
        format: RowFormat,
    ) -> Result<Option<ResidentPool>> {
        let Some(slots) = caches.iter().map(|c| c.map(|c| &c.slots)).collect::<Option<Vec<_>>>()
        else {
            return Ok(None);
        };
        Ok(ResidentPool::new(&self.queue, &slots, format)?)
    }
}

/// Creates a GPU cache of fp32 rows on device `id` with its own queue and clock (tests, tools).
pub fn new_cache(id: i32, geo: CacheGeometry) -> Result<Arc<dyn CacheTier>> {
    GpuInstance::new(id, CacheRows::F32)?.new_cache(geo, 0)
}

impl GpuCache {
    /// A cache with its own queue and clock, its rows kept as `rows` (tools that measure
    /// one table's cache).
    pub fn new(device: i32, geo: CacheGeometry, rows: RowFormat) -> Result<GpuCache> {
        GpuCache::with_queue(&Queue::new(device)?, geo, Arc::new(AtomicU64::new(1)), rows, 0)
    }

    fn with_queue(
        queue: &Queue,
        geo: CacheGeometry,
        clock: Arc<AtomicU64>,
        rows: RowFormat,
        index_rows: usize,
    ) -> Result<GpuCache> {
        let sketch = match geo.policy {
            CachePolicy::Lru => 0,
            CachePolicy::Lfu { width } => width,
        };
        let slots = CacheSlots::new(queue, geo.sets, geo.dim, EMPTY_KEY, rows, sketch, index_rows)?;
        Ok(GpuCache { slots, geo, clock, hits: AtomicU64::new(0), misses: AtomicU64::new(0) })
    }

    /// Counts a whole-batch lookup's hits and misses against this table.
    pub fn count_batch(&self, keys: usize, missed: usize) {
        self.hits.fetch_add((keys - missed) as u64, Ordering::Relaxed);
        self.misses.fetch_add(missed as u64, Ordering::Relaxed);
    }

    /// The device side, for measuring the kernels alone.
    pub fn slots(&self) -> &CacheSlots {
        &self.slots
    }

    /// The next lookup epoch (a lookup stamps the slots it hits with it).
    pub fn next_epoch(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    fn count(&self, hit: &[u8]) -> Vec<usize> {
        let missed: Vec<usize> = (0..hit.len()).filter(|&i| hit[i] == 0).collect();
        self.hits.fetch_add((hit.len() - missed.len()) as u64, Ordering::Relaxed);
        self.misses.fetch_add(missed.len() as u64, Ordering::Relaxed);
        missed
    }

    /// Looks host `keys` up into a device buffer: row i at `offset + i * stride` floats.
    /// Returns the indices that missed (their rows are left as they were).
    pub fn lookup_into(
        &self,
        keys: &[i64],
        rows: &mut DeviceRows,
        offset: usize,
        stride: usize,
    ) -> Result<Vec<usize>> {
        let epoch = self.clock.fetch_add(1, Ordering::Relaxed);
        let hit = self.slots.lookup_into(keys, epoch, rows, offset, stride)?;
        Ok(self.count(&hit))
    }

    fn write(&self, keys: &[i64], vectors: &[f32], only_if_present: bool) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        if vectors.len() != keys.len() * self.geo.dim {
            return Err(Error::internal("gpu cache: vectors do not match keys"));
        }
        if self.slots.resident_rows().is_some() {
            // row = key: no sets to group by
            let plan = InsertPlan { order: &[], group_start: &[], group_set: &[] };
            return Ok(self.slots.write(keys, vectors, &plan, 0, only_if_present)?);
        }
        let (order, group_start, group_set) = group_by_set(&self.geo, keys);
        let epoch = self.clock.fetch_add(1, Ordering::Relaxed);
        let plan = InsertPlan { order: &order, group_start: &group_start, group_set: &group_set };
        Ok(self.slots.write(keys, vectors, &plan, epoch, only_if_present)?)
    }
}

impl CacheTier for GpuCache {
    fn geometry(&self) -> CacheGeometry {
        self.geo
    }

    fn lookup(&self, keys: &[i64], out: &mut [f32]) -> Result<Vec<usize>> {
        let epoch = self.clock.fetch_add(1, Ordering::Relaxed);
        let hit = self.slots.lookup_to_host(keys, epoch, out)?;
        Ok(self.count(&hit))
    }

    fn insert(&self, keys: &[i64], vectors: &[f32]) -> Result<()> {
        self.write(keys, vectors, false)
    }

    fn refresh(&self, keys: &[i64], vectors: &[f32]) -> Result<()> {
        self.write(keys, vectors, true)
    }

    fn held_keys(&self) -> Result<Vec<i64>> {
        Ok(self.slots.held_keys(EMPTY_KEY)?)
    }

    fn keeps_every_row(&self) -> bool {
        self.slots.resident_rows().is_some()
    }

    fn counters(&self) -> CacheCounters {
        let (insertions, evictions) = self.slots.counters().unwrap_or((0, 0));
        CacheCounters::new(
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
            insertions,
            evictions,
        )
    }

    fn name(&self) -> &'static str {
        if self.slots.resident_rows().is_some() {
            "gpu_resident"
        } else {
            "gpu_cache"
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_are_grouped_by_set_in_order() {
        let geo = CacheGeometry { sets: 7, ..CacheGeometry::for_rows(1, 1) };
        let keys: Vec<i64> = (0..100).map(|i| i * 13 - 40).collect();
        let (order, starts, sets) = group_by_set(&geo, &keys);
        assert_eq!(order.len(), keys.len());
        assert_eq!(*starts.last().unwrap() as usize, keys.len());
        assert_eq!(starts.len(), sets.len() + 1);
        for g in 0..sets.len() {
            let members = &order[starts[g] as usize..starts[g + 1] as usize];
            assert!(members.windows(2).all(|w| w[0] < w[1]), "keys keep their order within a set");
            assert!(members.iter().all(|&i| geo.set_of(keys[i as usize]) as i64 == sets[g]));
        }
        let mut seen = order.clone();
        seen.sort();
        assert_eq!(seen, (0..100).collect::<Vec<i32>>());
    }

    #[test]
    fn no_gpu_is_a_clear_error() {
        if std::path::Path::new("/dev/nvidia0").exists() {
            return; // this check is for machines without a GPU
        }
        let e = new_cache(0, CacheGeometry::for_rows(1, 4)).err().expect("no GPU here");
        assert!(e.message().contains("CUDA") || e.message().contains("cuda"), "{e}");
    }
}
