//! The store itself: its tables and tiers, lookups through them, updates reaching every
//! tier, and the instances' caches (`instance`) and metrics (`metrics`).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use triton_rust_core::error::{Error, Result};

use crate::cache::{CacheGeometry, CachePolicy, CacheTier};
use crate::durable::{self, UpdateLog};
#[cfg(feature = "gpu")]
use crate::gpu;
use crate::host::{self, HostTier};
use crate::redis::RemoteTier;
use crate::store_config::*;
use crate::stream;
use crate::table::{self, TableFiles};

mod attach;
mod below;
mod gather;
mod reads;
pub use reads::GatherTimes;
#[cfg(feature = "gpu")]
mod host_rows;
mod instance;
mod metrics;
#[cfg(feature = "gpu")]
mod sharded;
mod warm;

pub use instance::InstanceCaches;

/// Per-table counters, for metrics. Latencies are summed nanoseconds.
#[derive(Default)]
pub struct TableCounters {
    pub lookups: AtomicU64,
    pub keys: AtomicU64,
    pub cache_hits: AtomicU64,
    pub host_hits: AtomicU64,
    pub remote_hits: AtomicU64,
    pub remote_errors: AtomicU64,
    pub defaults: AtomicU64,
    pub cache_ns: AtomicU64,
    pub host_ns: AtomicU64,
    pub remote_ns: AtomicU64,
    pub updates: AtomicU64,
    pub updated_keys: AtomicU64,
    pub update_ns: AtomicU64,
    pub fills_dropped: AtomicU64,
    /// Updates replayed from the log at load.
    pub replayed_rows: AtomicU64,
    pub compactions: AtomicU64,
}

struct Table {
    config: TableConfig,
    /// Swapped whole by a compaction; readers hold the tier they started with.
    host: RwLock<Arc<HostTier>>,
    /// The update log; updates of this table are serialised on it.
    log: Option<Mutex<UpdateLog>>,
    counters: TableCounters,
    /// Bumped by every update; a cache fill checks it did not change under it.
    version: AtomicU64,
}

/// The model-wide part of the store: host tiers, the remote tier, the update gate, and
/// the caches of every instance (so updates reach them all).
pub struct EmbeddingStore {
    config: StoreConfig,
    tables: Vec<Table>,
    remote: Option<Arc<dyn RemoteTier>>,
    /// Updates hold it for writing; cache fills for reading (see module docs).
    gate: RwLock<()>,
    caches: Mutex<Vec<Weak<InstanceCaches>>>,
    /// The caches shared by the instances on each GPU (`attach_gpu_caches`), while any holds them.
    #[cfg(feature = "gpu")]
    gpu_shared: Mutex<Vec<(i32, Weak<InstanceCaches>, gpu::GpuInstance)>>,
    /// With `gpucache_placement: sharded`, the tables spread over the GPUs (made once).
    #[cfg(feature = "gpu")]
    sharded: Mutex<Option<Arc<sharded::ShardedTables>>>,
    /// Every table's host rows registered for the GPUs to read in place
    /// (`gpucache_miss_reads: gpu`), made on first use.
    #[cfg(feature = "gpu")]
    host_rows: Mutex<Option<Arc<host_rows::GpuHostRows>>>,
    /// Update requests refused for a missing or wrong credential.
    pub refused_updates: AtomicU64,
    /// Stops the compactor when the store goes.
    compactor: Option<Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>>,
    /// The update stream's follower (stops with the store).
    follower: Mutex<Option<stream::StreamFollower>>,
}

impl Drop for EmbeddingStore {
    fn drop(&mut self) {
        if let Some(stop) = &self.compactor {
            if let Ok(mut g) = stop.0.lock() {
                *g = true;
            }
            stop.1.notify_all();
        }
    }
}

/// Loads a table's rows from its files (or a compaction's snapshot of them).
fn load_files(
    t: &TableConfig,
    dir: &Path,
    format: Option<TableFormat>,
    rows: table::HostRows,
) -> Result<HostTier> {
    let format = format.unwrap_or(if dir.join("emb_vector").exists() {
        TableFormat::HugeCtr
    } else {
        TableFormat::Npy
    });
    let files = match format {
        TableFormat::Npy => TableFiles::open_npy(dir),
        TableFormat::HugeCtr => TableFiles::open_hugectr(dir, t.dim),
    }
    .map_err(|e| e.context(format!("table '{}'", t.name)))?;
    if files.dim != t.dim {
        return Err(Error::invalid_arg(format!(
            "table '{}': the config says dim {} but '{}' holds vectors of dim {}",
            t.name,
            t.dim,
            dir.display(),
            files.dim
        )));
    }
    let (host, dups) = HostTier::from_files(files.place(&t.name, rows))?;
    if dups > 0 {
        log::warn!("table '{}': {dups} duplicate keys; the last row of each wins", t.name);
    }
    Ok(host)
}

fn ns_since(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

impl EmbeddingStore {
    pub fn open(
        config: StoreConfig,
        remote: Option<Arc<dyn RemoteTier>>,
    ) -> Result<Arc<EmbeddingStore>> {
        if !(0.0..=1.0).contains(&config.cache_ratio) {
            return Err(Error::invalid_arg(format!(
                "gpucacheper must be in [0, 1]; got {}",
                config.cache_ratio
            )));
        }
        if config.tables.is_empty() {
            return Err(Error::invalid_arg("the embedding store needs at least one table"));
        }
        if !config.cache_ratios.is_empty() {
            if config.cache_ratios.len() != config.tables.len() {
                return Err(Error::invalid_arg(format!(
                    "gpucacheper_per_table lists {} fractions for {} tables",
                    config.cache_ratios.len(),
                    config.tables.len()
                )));
            }
            if let Some((t, r)) = config
                .cache_ratios
                .iter()
                .enumerate()
                .find(|(_, r)| !(r.is_finite() && **r > 0.0 && **r <= 1.0))
            {
                return Err(Error::invalid_arg(format!(
                    "gpucacheper_per_table: table '{}' has {r}; each fraction is above 0 and at most 1",
                    config.tables[t].name
                )));
            }
            if config.cache_allocation != CacheAllocation::PerTable {
                return Err(Error::invalid_arg(
                    "gpucacheper_per_table gives each table its own fraction, which only gpucache_allocation per_table keeps",
                ));
            }
        }
        let mut tables = Vec::with_capacity(config.tables.len());
        for t in &config.tables {
            if t.dim == 0 {
                return Err(Error::invalid_arg(format!(
                    "table '{}': dim must be positive",
                    t.name
                )));
            }
            let log_dir = config.log_dir(t);
            // A compaction's snapshot replaces the configured files.
            let base_gen = match &log_dir {
                Some(dir) => durable::manifest_gen(dir)
                    .map_err(|e| e.context(format!("table '{}'", t.name)))?,
                None => None,
            };
            let host = match (base_gen, &log_dir, &t.path) {
                (Some(g), Some(dir), _) => load_files(
                    t,
                    &durable::base_path(dir, g),
                    Some(TableFormat::Npy),
                    config.host_memory,
                )?,
                (_, _, Some(dir)) => load_files(t, dir, t.format, config.host_memory)?,
                (_, _, None) => HostTier::empty(t.dim),
            };
            let counters = TableCounters::default();
            let log = match log_dir {
                None => None,
                Some(dir) => {
                    let (log, replayed) =
                        UpdateLog::recover(&dir, t.dim, base_gen.unwrap_or(0), &mut |k, v| {
                            host.upsert(k, v)
                        })
                        .map_err(|e| e.context(format!("table '{}'", t.name)))?;
                    if replayed.records > 0 {
                        log::info!(
                            "table '{}': {} logged updates ({} rows) replayed from '{}'",
                            t.name,
                            replayed.records,
                            replayed.rows,
                            dir.display()
                        );
                    }
                    counters.replayed_rows.store(replayed.rows, Ordering::Relaxed);
                    Some(Mutex::new(log))
                }
            };
            tables.push(Table {
                config: t.clone(),
                host: RwLock::new(Arc::new(host)),
                log,
                counters,
                version: AtomicU64::new(0),
            });
        }
        if let Some(unlogged) = config
            .update_stream
            .as_ref()
            .filter(|s| !s.write_remote)
            .and_then(|_| tables.iter().find(|t| t.log.is_none()))
        {
            return Err(Error::invalid_arg(format!(
                "update_stream_write_remote is false, so the stream's rows are durable only in this node's update log, which table '{}' has not: give it table files or set update_log_dir",
                unlogged.config.name
            )));
        }
        let compactor = (config.compaction_rows > 0 && tables.iter().any(|t| t.log.is_some()))
            .then(|| Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new())));
        let store = Arc::new(EmbeddingStore {
            config,
            tables,
            remote,
            gate: RwLock::new(()),
            caches: Mutex::new(Vec::new()),
            #[cfg(feature = "gpu")]
            gpu_shared: Mutex::new(Vec::new()),
            #[cfg(feature = "gpu")]
            sharded: Mutex::new(None),
            #[cfg(feature = "gpu")]
            host_rows: Mutex::new(None),
            refused_updates: AtomicU64::new(0),
            compactor: compactor.clone(),
            follower: Mutex::new(None),
        });
        if let Some(spec) = store.config.update_stream.clone() {
            log::info!(
                "store follows update stream '{}' on {} as group '{}'",
                spec.stream,
                spec.addr,
                spec.group
            );
            *store.follower.lock() =
                Some(stream::StreamFollower::start(spec, Arc::downgrade(&store) as _)?);
        }
        if let Some(stop) = compactor {
            let weak = Arc::downgrade(&store);
            std::thread::Builder::new()
                .name("embedding-compactor".into())
                .spawn(move || compactor_loop(weak, stop))
                .map_err(|e| Error::internal(format!("cannot start the compaction thread: {e}")))?;
        }
        Ok(store)
    }

    /// Whether every table's updates can be made durable: an update log, or a Redis tier
    /// written through before the update is acknowledged.
    pub fn durable(&self) -> std::result::Result<(), String> {
        match self.tables.iter().find(|t| t.log.is_none() && self.remote.is_none()) {
            None => Ok(()),
            Some(t) => Err(t.config.name.clone()),
        }
    }

    fn host(&self, table: usize) -> Arc<HostTier> {
        self.tables[table].host.read().clone()
    }

    /// Writes a snapshot of a table as its new base and swaps it in, reclaiming the
    /// overlay. Updates continue into the next log generation meanwhile.
    pub fn compact(&self, table: usize) -> Result<()> {
        let t = self
            .tables
            .get(table)
            .ok_or_else(|| Error::invalid_arg(format!("no table {table}")))?;
        let Some(log) = &t.log else { return Ok(()) };
        let start = Instant::now();
        let (dir, gen) = {
            let mut log = log.lock();
            (log.dir().to_path_buf(), log.rotate()?)
        };
        // Everything before the rotation is in the tier; later updates are in log.<gen>
        // and replayed on top (re-applying one that is also in the snapshot is harmless).
        let (keys, rows) = self.host(table).entries();
        let base = durable::commit_base(&dir, gen, &keys, &rows, t.config.dim)?;
        let fresh = load_files(&t.config, &base, Some(TableFormat::Npy), self.config.host_memory)?;
        {
            let log = log.lock();
            log.replay(gen, &mut |k, v| fresh.upsert(k, v))?;
            *t.host.write() = Arc::new(fresh);
        }
        durable::remove_before(&dir, gen);
        t.counters.compactions.fetch_add(1, Ordering::Relaxed);
        log::info!(
            "table '{}': compacted {} rows into '{}' in {:.2} s",
            t.config.name,
            keys.len(),
            base.display(),
            start.elapsed().as_secs_f64()
        );
        Ok(())
    }

    pub fn tables(&self) -> impl Iterator<Item = &TableConfig> {
        self.tables.iter().map(|t| &t.config)
    }

    pub fn table_count(&self) -> usize {
        self.tables.len()
    }

    /// How this store's GPU caches keep their rows.
    pub fn cache_rows(&self) -> CacheRows {
        self.config.cache_rows
    }

    pub fn dim(&self, table: usize) -> usize {
        self.tables[table].config.dim
    }

    /// Every table's dim, in table order.
    pub fn dims(&self) -> Vec<usize> {
        self.tables.iter().map(|t| t.config.dim).collect()
    }

    /// Whether every table has the same dim (a batch's rows then go in one pass, as one
    /// [batch, tables, dim] tensor).
    pub fn one_dim(&self) -> bool {
        self.tables.windows(2).all(|w| w[0].config.dim == w[1].config.dim)
    }

    pub fn counters(&self, table: usize) -> &TableCounters {
        &self.tables[table].counters
    }

    pub fn host_rows(&self, table: usize) -> usize {
        self.host(table).len()
    }

    pub fn host_memory(&self, table: usize) -> host::HostMemory {
        self.host(table).memory()
    }

    /// One pooled lookup's hit in this many is stamped in this store's GPU caches
    /// (`gpucache_hit_stamp_every`).
    pub fn hit_stamp_every(&self) -> u32 {
        self.config.hit_stamp_every
    }

    /// Whether the caches hold a fixed set of keys (`gpucache_policy: pinned`): no lookup
    /// stamps or inserts.
    pub fn pinned(&self) -> bool {
        self.config.cache_eviction == CacheEviction::Pinned
    }

    /// Whether this store's GPU caches keep key indexes (`gpucache_key_index`).
    pub fn cache_index(&self) -> CacheIndex {
        self.config.cache_index
    }

    /// The keys table `t`'s GPU cache of `geo` indexes (0: none): `gpucache_key_index`'s rule
    /// for the table's rows and the cache's GPU memory.
    pub fn cache_index_rows(&self, t: usize, geo: &CacheGeometry) -> usize {
        let row = match self.config.cache_rows {
            CacheRows::F32 => 4,
            CacheRows::F16 => 2,
        };
        let bytes = geo.capacity() * (16 + geo.dim * row);
        self.config.cache_index.rows(self.host(t).dense_rows(), bytes)
    }

    /// Which key this store's full cache sets give up.
    pub fn cache_eviction(&self) -> CacheEviction {
        self.config.cache_eviction
    }

    /// The cache geometry for a table under this store's `cache_ratio`, `cache_allocation`
    /// and `cache_eviction` (LFU's sketch sized for the table's rows).
    pub fn cache_geometry(&self, table: usize) -> CacheGeometry {
        let rows: Vec<usize> = self.tables.iter().map(|t| t.host.read().len()).collect();
        let cached = if self.config.cache_ratios.is_empty() {
            // the store's allocation weighs every table's rows
            cache_rows(
                &rows,
                self.config.cache_ratio,
                self.config.cache_allocation,
                &self.config.hotness,
            )[table]
        } else {
            // a share of its own: this table's rows alone
            let ratio = self.config.table_ratio(table);
            cache_rows(&rows[table..=table], ratio, CacheAllocation::PerTable, &[])[0]
        };
        let geo = CacheGeometry::for_rows(cached, self.tables[table].config.dim);
        match self.config.cache_eviction {
            // a pinned cache never chooses a key to give up: its load fills it in LRU's order
            CacheEviction::Lru | CacheEviction::Pinned => geo,
            CacheEviction::Lfu => {
                geo.with_policy(CachePolicy::lfu_for(rows[table], geo.capacity()))
            }
        }
    }

    /// Inserts or overwrites rows while serving. Visible in the host tier, Redis and
    /// every instance's cache when this returns.
    pub fn update(&self, table: usize, keys: &[i64], vectors: &[f32]) -> Result<()> {
        self.update_with(table, keys, vectors, true)
    }

    /// [`EmbeddingStore::update`] of an entry of the update stream: written through to the
    /// Redis tier unless the stream's publisher writes it there for every node
    /// (`update_stream_write_remote: false`; the node's own log makes it durable then).
    pub fn update_from_stream(&self, table: usize, keys: &[i64], vectors: &[f32]) -> Result<()> {
        let write = self.config.update_stream.as_ref().is_none_or(|s| s.write_remote);
        self.update_with(table, keys, vectors, write)
    }

    fn update_with(
        &self,
        table: usize,
        keys: &[i64],
        vectors: &[f32],
        write_remote: bool,
    ) -> Result<()> {
        let t = self
            .tables
            .get(table)
            .ok_or_else(|| Error::invalid_arg(format!("no table {table}")))?;
        let start = Instant::now();
        if vectors.len() != keys.len() * t.config.dim {
            return Err(Error::invalid_arg(format!(
                "table '{}': {} keys of dim {} need {} values; got {}",
                t.config.name,
                keys.len(),
                t.config.dim,
                keys.len() * t.config.dim,
                vectors.len()
            )));
        }
        // Durable first: once logged, a restart replays it; only then is it applied.
        let mut log = t.log.as_ref().map(|l| l.lock());
        if let Some(log) = log.as_mut() {
            log.append(keys, vectors).map_err(|e| {
                e.context(format!("table '{}': the update was not applied", t.config.name))
            })?;
        }
        let _gate = self.gate.write();
        // (the store refuses to open without a log where a stream's rows skip the remote)
        let remote = self.remote.as_ref().filter(|_| write_remote);
        match (remote, log.is_some()) {
            // no log: the write-through to Redis is what makes it durable, so it must succeed first
            (Some(remote), false) => {
                remote.set_many(&t.config.name, t.config.dim, keys, vectors).map_err(|e| {
                    t.counters.remote_errors.fetch_add(1, Ordering::Relaxed);
                    e.context(format!(
                        "table '{}': the update could not be written to {} and was not applied",
                        t.config.name,
                        remote.name()
                    ))
                })?
            }
            (Some(remote), true) => {
                if let Err(e) = remote.set_many(&t.config.name, t.config.dim, keys, vectors) {
                    t.counters.remote_errors.fetch_add(1, Ordering::Relaxed);
                    log::warn!(
                        "table '{}': update not written to {} (it is in the update log): {e}",
                        t.config.name,
                        remote.name()
                    );
                }
            }
            (None, _) => {}
        }
        t.host.read().upsert(keys, vectors)?;
        let caches: Vec<Arc<dyn CacheTier>> = self
            .caches
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|c| c.caches.get(table).cloned())
            .collect();
        // sharded rows: every GPU's copy, also of a GPU no instance reads yet
        #[cfg(feature = "gpu")]
        let caches = match self.sharded.lock().as_ref() {
            Some(sharded) => caches.into_iter().chain(sharded.copies(table)).collect(),
            None => caches,
        };
        // a cache several instances share (sharded rows: one table for every GPU) once
        let mut refreshed: Vec<*const ()> = Vec::new();
        for cache in caches {
            let at = Arc::as_ptr(&cache) as *const ();
            if refreshed.contains(&at) {
                continue;
            }
            refreshed.push(at);
            cache.refresh(keys, vectors)?;
        }
        // Bumped last, still under the gate: a fill that read its version before this
        // point (its rows may predate the update) now fails its check; one that reads
        // the new version afterwards reads the new rows.
        t.version.fetch_add(1, Ordering::SeqCst);
        t.counters.updates.fetch_add(1, Ordering::Relaxed);
        t.counters.updated_keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
        t.counters.update_ns.fetch_add(ns_since(start), Ordering::Relaxed);
        Ok(())
    }

    /// Whether a table has enough overlay rows to be compacted.
    fn wants_compaction(&self, table: usize) -> bool {
        let t = &self.tables[table];
        t.log.is_some()
            && self.config.compaction_rows > 0
            && t.host.read().overlay_rows() >= self.config.compaction_rows
    }
}

/// Compacts tables whose overlay has grown past `compaction_rows`, until the store goes.
fn compactor_loop(
    store: Weak<EmbeddingStore>,
    stop: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
) {
    loop {
        {
            let Ok(g) = stop.0.lock() else { return };
            let Ok((g, _)) = stop.1.wait_timeout(g, std::time::Duration::from_millis(200)) else {
                return;
            };
            if *g {
                return;
            }
        }
        let Some(store) = store.upgrade() else { return };
        for table in 0..store.tables.len() {
            if store.wants_compaction(table) {
                if let Err(e) = store.compact(table) {
                    log::error!(
                        "table '{}': compaction failed (updates stay in the log): {e}",
                        store.tables[table].config.name
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

impl stream::StreamTarget for EmbeddingStore {
    fn table_named(&self, name: &str) -> Option<(usize, usize)> {
        self.tables.iter().position(|t| t.config.name == name).map(|i| (i, self.dim(i)))
    }

    fn write_rows(&self, table: usize, keys: &[i64], vectors: &[f32]) -> Result<()> {
        self.update_from_stream(table, keys, vectors)
    }
}
