//! The hierarchical embedding store: the replacement for Merlin's HPS.
//!
//! Tiers, fastest first: a cache per instance (GPU memory on a GPU instance, host
//! memory on a CPU one, same policy: `cache.rs`), the host tier holding every row
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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use triton_rust_core::error::{Error, Result};

pub mod cache;
pub mod durable;
pub mod fixture;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod host;
pub mod redis;
pub mod settings;
pub mod stream;
pub mod table;

use cache::{CacheGeometry, CacheTier};
use durable::UpdateLog;
use host::HostTier;
use table::TableFiles;

/// murmur3's 64-bit finalizer: the key hash used by every tier (and the GPU kernel).
pub fn mix64(key: i64) -> u64 {
    let mut k = key as u64;
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51afd7ed558ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ceb9fe1a85ec53);
    k ^= k >> 33;
    k
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFormat {
    /// `keys.npy` + `vectors.npy` (ours).
    Npy,
    /// HugeCTR/HPS `key` + `emb_vector`.
    HugeCtr,
}

#[derive(Debug, Clone)]
pub struct TableConfig {
    pub name: String,
    pub dim: usize,
    /// Directory holding the table's files; `None` for a table filled only by updates/Redis.
    pub path: Option<PathBuf>,
    pub format: Option<TableFormat>,
    pub default_value: f32,
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub tables: Vec<TableConfig>,
    /// Fraction of the rows the cache holds (HPS `gpucacheper`), per table or of the
    /// whole store as `cache_allocation` says.
    pub cache_ratio: f64,
    pub cache_allocation: CacheAllocation,
    /// HPS `hit_rate_threshold`: below it, misses are inserted before the lookup returns.
    pub hit_rate_threshold: f64,
    /// Where the update logs of tables without files live (`<dir>/<table>/`); tables with
    /// files keep theirs in `<table files>/updates/`.
    pub update_log_dir: Option<PathBuf>,
    /// Rows written by updates after which a table is compacted (0: never).
    pub compaction_rows: usize,
    /// A Redis Stream of updates this store follows.
    pub update_stream: Option<stream::StreamSpec>,
    /// Where the host tier keeps rows loaded from files (`host_memory`).
    pub host_memory: table::HostRows,
}

/// How `cache_ratio` becomes each table's cache size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheAllocation {
    /// `cache_ratio` of every table's rows (HPS's meaning of `gpucacheper`).
    #[default]
    PerTable,
    /// `cache_ratio` of the store's rows in all, shared out by water-filling: every table
    /// gets `min(WHOLE_ROOM × rows, level)` slots with the level set so the total is the
    /// budget. Small tables (which a per-table share leaves thrashing in a few sets) are
    /// cached whole, with room to spare, for a sliver of the budget; the large ones share
    /// the rest equally.
    Store,
}

impl CacheAllocation {
    pub fn parse(s: &str) -> Result<CacheAllocation> {
        match s.trim() {
            "" | "per_table" => Ok(CacheAllocation::PerTable),
            "store" => Ok(CacheAllocation::Store),
            other => Err(Error::invalid_arg(format!(
                "gpucache_allocation must be per_table or store; got '{other}'"
            ))),
        }
    }
}

/// Slots per row of a table the store-wide allocation caches whole. Keys land in sets by
/// hash, so a table of exactly as many rows as slots overfills a set for every few that
/// are short: ~7% of its keys find no way in their set and miss on every lookup, however
/// hot. A small table's keys are all hot (on the H100 Criteo run, tables of 100 to 6,000
/// rows made most of the misses); at half load a set overflows about once in 10^4.
pub const WHOLE_ROOM: usize = 2;

/// Cache slots per table for tables of `rows` rows under `ratio` and `allocation`.
pub fn cache_rows(rows: &[usize], ratio: f64, allocation: CacheAllocation) -> Vec<usize> {
    match allocation {
        CacheAllocation::PerTable => {
            rows.iter().map(|&r| (r as f64 * ratio).ceil() as usize).collect()
        }
        CacheAllocation::Store => {
            let mut budget = (rows.iter().sum::<usize>() as f64 * ratio).floor() as usize;
            let mut order: Vec<usize> = (0..rows.len()).collect();
            order.sort_by_key(|&t| rows[t]);
            let mut out = vec![0; rows.len()];
            for (k, &t) in order.iter().enumerate() {
                // the level if every table from here on got an equal share of what is left
                let level = budget / (rows.len() - k);
                out[t] = (WHOLE_ROOM * rows[t]).min(level);
                budget -= out[t];
            }
            out
        }
    }
}

impl StoreConfig {
    /// The directory of a table's update log, if it has one.
    pub fn log_dir(&self, table: &TableConfig) -> Option<PathBuf> {
        match (&self.update_log_dir, &table.path) {
            (Some(dir), _) => Some(dir.join(&table.name)),
            (None, Some(files)) => Some(files.join("updates")),
            (None, None) => None,
        }
    }
}

/// Rows that live outside this machine (Redis). Misses are `found[i] = false`.
pub trait RemoteTier: Send + Sync {
    fn get_many(
        &self,
        table: &str,
        dim: usize,
        keys: &[i64],
        out: &mut [f32],
        found: &mut [bool],
    ) -> Result<()>;
    fn set_many(&self, table: &str, dim: usize, keys: &[i64], vectors: &[f32]) -> Result<()>;
    fn name(&self) -> &'static str;
}

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
        let compactor = (config.compaction_rows > 0 && tables.iter().any(|t| t.log.is_some()))
            .then(|| Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new())));
        let store = Arc::new(EmbeddingStore {
            config,
            tables,
            remote,
            gate: RwLock::new(()),
            caches: Mutex::new(Vec::new()),
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
                Some(stream::StreamFollower::start(spec, Arc::downgrade(&store))?);
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

    pub fn dim(&self, table: usize) -> usize {
        self.tables[table].config.dim
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

    /// The cache geometry for a table under this store's `cache_ratio` and `cache_allocation`.
    pub fn cache_geometry(&self, table: usize) -> CacheGeometry {
        let rows: Vec<usize> = self.tables.iter().map(|t| t.host.read().len()).collect();
        let cached = cache_rows(&rows, self.config.cache_ratio, self.config.cache_allocation);
        CacheGeometry::for_rows(cached[table], self.tables[table].config.dim)
    }

    /// Creates one instance's caches with `make` (CPU or GPU) and registers them for updates.
    pub fn attach_caches(
        self: &Arc<Self>,
        make: &dyn Fn(CacheGeometry) -> Result<Arc<dyn CacheTier>>,
    ) -> Result<Arc<InstanceCaches>> {
        let caches = if self.config.cache_ratio > 0.0 {
            (0..self.tables.len())
                .map(|t| make(self.cache_geometry(t)))
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let inst = Arc::new(InstanceCaches::new(self.clone(), caches));
        let mut reg = self.caches.lock();
        reg.retain(|w| w.strong_count() > 0);
        reg.push(Arc::downgrade(&inst));
        Ok(inst)
    }

    /// A view of the store with no caches (lookups go straight to the host tier).
    pub fn attach_caches_none(self: &Arc<Self>) -> Arc<InstanceCaches> {
        Arc::new(InstanceCaches::new(self.clone(), Vec::new()))
    }

    /// Reads rows below the cache: host, then remote, then the default vector.
    /// Returns which keys were found (defaults are not worth caching).
    fn fetch_below_cache(&self, table: usize, keys: &[i64], out: &mut [f32]) -> Vec<bool> {
        let t = &self.tables[table];
        let dim = t.config.dim;
        let mut found = vec![false; keys.len()];
        let t0 = Instant::now();
        self.host(table).get_many(keys, out, &mut found);
        t.counters.host_ns.fetch_add(ns_since(t0), Ordering::Relaxed);
        let host_hits = found.iter().filter(|&&f| f).count();
        t.counters.host_hits.fetch_add(host_hits as u64, Ordering::Relaxed);
        let mut missing: Vec<usize> = (0..keys.len()).filter(|&i| !found[i]).collect();
        if let (Some(remote), false) = (&self.remote, missing.is_empty()) {
            let mkeys: Vec<i64> = missing.iter().map(|&i| keys[i]).collect();
            let mut mout = vec![0f32; mkeys.len() * dim];
            let mut mfound = vec![false; mkeys.len()];
            let t0 = Instant::now();
            match remote.get_many(&t.config.name, dim, &mkeys, &mut mout, &mut mfound) {
                Ok(()) => {
                    let mut still = Vec::new();
                    for (j, &i) in missing.iter().enumerate() {
                        if mfound[j] {
                            found[i] = true;
                            out[i * dim..(i + 1) * dim]
                                .copy_from_slice(&mout[j * dim..(j + 1) * dim]);
                        } else {
                            still.push(i);
                        }
                    }
                    t.counters
                        .remote_hits
                        .fetch_add((missing.len() - still.len()) as u64, Ordering::Relaxed);
                    missing = still;
                }
                Err(e) => {
                    let n = t.counters.remote_errors.fetch_add(1, Ordering::Relaxed);
                    if n % 1000 == 0 {
                        log::warn!(
                            "table '{}': {} unreachable, serving default vectors: {e}",
                            t.config.name,
                            remote.name()
                        );
                    }
                }
            }
            t.counters.remote_ns.fetch_add(ns_since(t0), Ordering::Relaxed);
        }
        for &i in &missing {
            out[i * dim..(i + 1) * dim].fill(t.config.default_value);
            t.counters.defaults.fetch_add(1, Ordering::Relaxed);
            found[i] = false;
        }
        found
    }

    /// Inserts or overwrites rows while serving. Visible in the host tier, Redis and
    /// every instance's cache when this returns.
    pub fn update(&self, table: usize, keys: &[i64], vectors: &[f32]) -> Result<()> {
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
        match (&self.remote, log.is_some()) {
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
        let caches: Vec<Arc<InstanceCaches>> =
            self.caches.lock().iter().filter_map(Weak::upgrade).collect();
        for c in caches {
            if let Some(cache) = c.caches.get(table) {
                cache.refresh(keys, vectors)?;
            }
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

impl triton_rust_core::telemetry::MetricsSource for EmbeddingStore {
    fn samples(&self) -> Vec<triton_rust_core::telemetry::MetricSample> {
        use triton_rust_core::telemetry::{MetricKind::*, MetricSample};
        let caches: Vec<Arc<InstanceCaches>> =
            self.caches.lock().iter().filter_map(Weak::upgrade).collect();
        let mut out = Vec::new();
        for (i, t) in self.tables.iter().enumerate() {
            let c = &t.counters;
            let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
            let table = || vec![("table", t.config.name.clone())];
            let tier =
                |tier: &str| vec![("table", t.config.name.clone()), ("tier", tier.to_string())];
            let mut push = |family, help, kind, labels, value| {
                out.push(MetricSample { family, help, kind, labels, value })
            };
            push(
                "rust_embedding_lookup_keys_total",
                "Keys looked up in the embedding store",
                Counter,
                table(),
                get(&c.keys),
            );
            push(
                "rust_embedding_lookups_total",
                "Lookup calls to the embedding store",
                Counter,
                table(),
                get(&c.lookups),
            );
            for (name, hits, ns) in [
                ("cache", &c.cache_hits, &c.cache_ns),
                ("host", &c.host_hits, &c.host_ns),
                ("redis", &c.remote_hits, &c.remote_ns),
            ] {
                push(
                    "rust_embedding_hits_total",
                    "Keys answered by each tier of the embedding store",
                    Counter,
                    tier(name),
                    get(hits),
                );
                push(
                    "rust_embedding_tier_seconds_total",
                    "Time spent in each tier of the embedding store",
                    Counter,
                    tier(name),
                    get(ns) / 1e9,
                );
            }
            push(
                "rust_embedding_hits_total",
                "Keys answered by each tier of the embedding store",
                Counter,
                tier("default"),
                get(&c.defaults),
            );
            let keys = get(&c.keys);
            push(
                "rust_embedding_cache_hit_rate",
                "Cache hits / keys looked up since load",
                Gauge,
                table(),
                if keys > 0.0 { get(&c.cache_hits) / keys } else { 0.0 },
            );
            let (mut evictions, mut occupied) = (0u64, 0u64);
            for inst in &caches {
                if let Some(cache) = inst.cache(i) {
                    let cc = cache.counters();
                    evictions += cc.evictions;
                    occupied += cc.occupied;
                }
            }
            push(
                "rust_embedding_cache_evictions_total",
                "Rows evicted from the embedding caches",
                Counter,
                table(),
                evictions as f64,
            );
            push(
                "rust_embedding_cache_rows",
                "Rows held by the embedding caches (all instances)",
                Gauge,
                table(),
                occupied as f64,
            );
            push(
                "rust_embedding_updates_total",
                "Update calls applied to the embedding store",
                Counter,
                table(),
                get(&c.updates),
            );
            push(
                "rust_embedding_updated_keys_total",
                "Rows written by updates",
                Counter,
                table(),
                get(&c.updated_keys),
            );
            push(
                "rust_embedding_update_lag_seconds_total",
                "Time from an update's arrival until it is visible in every tier, summed",
                Counter,
                table(),
                get(&c.update_ns) / 1e9,
            );
            push("rust_embedding_redis_errors_total", "Lookups and updates that could not reach the Redis tier (down, or backing off after a failure)", Counter, table(), get(&c.remote_errors));
            push(
                "rust_embedding_cache_fills_dropped_total",
                "Cache fills skipped (queue full or raced with an update)",
                Counter,
                table(),
                get(&c.fills_dropped),
            );
            push(
                "rust_embedding_replayed_rows",
                "Rows replayed from the update log when the table was loaded",
                Gauge,
                table(),
                get(&c.replayed_rows),
            );
            push(
                "rust_embedding_compactions_total",
                "Compactions of the update log into new table files",
                Counter,
                table(),
                get(&c.compactions),
            );
            push("rust_embedding_overlay_rows", "Rows written by updates since the table's last compaction (host memory beyond the files)", Gauge, table(), t.host.read().overlay_rows() as f64);
        }
        if let Some(f) = self.follower.lock().as_ref() {
            let c = &f.counters;
            let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
            let mut push = |family, help, kind, value| {
                out.push(MetricSample { family, help, kind, labels: Vec::new(), value })
            };
            push(
                "rust_embedding_stream_applied_total",
                "Update stream entries applied (durably) and acknowledged",
                Counter,
                get(&c.applied_entries),
            );
            push(
                "rust_embedding_stream_applied_rows_total",
                "Rows written by update stream entries",
                Counter,
                get(&c.applied_rows),
            );
            push(
                "rust_embedding_stream_rejected_total",
                "Update stream entries skipped as malformed",
                Counter,
                get(&c.rejected_entries),
            );
            push(
                "rust_embedding_stream_errors_total",
                "Failures reaching the update stream (reconnected after a back-off)",
                Counter,
                get(&c.errors),
            );
            if c.measured.load(Ordering::Relaxed) {
                push(
                    "rust_embedding_stream_lag",
                    "Update stream entries not yet delivered to this node",
                    Gauge,
                    get(&c.lag),
                );
                push(
                    "rust_embedding_stream_pending",
                    "Update stream entries delivered and not yet acknowledged",
                    Gauge,
                    get(&c.pending),
                );
            }
            push(
                "rust_embedding_stream_connected",
                "1 while the update stream is reachable",
                Gauge,
                c.connected.load(Ordering::Relaxed) as u8 as f64,
            );
        }
        out.push(MetricSample {
            family: "rust_embedding_updates_refused_total",
            help: "Update requests refused for a missing or wrong credential",
            kind: Counter,
            labels: Vec::new(),
            value: self.refused_updates.load(Ordering::Relaxed) as f64,
        });
        out
    }
}

struct Fill {
    table: usize,
    version: u64,
    keys: Vec<i64>,
    vectors: Vec<f32>,
}

enum Job {
    Fill(Fill),
    Barrier(mpsc::SyncSender<()>),
}

/// One instance's view of the store: its caches (one per table) and its background filler.
pub struct InstanceCaches {
    store: Arc<EmbeddingStore>,
    caches: Vec<Arc<dyn CacheTier>>,
    filler: Mutex<Option<mpsc::SyncSender<Job>>>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl InstanceCaches {
    fn new(store: Arc<EmbeddingStore>, caches: Vec<Arc<dyn CacheTier>>) -> InstanceCaches {
        let (tx, rx) = mpsc::sync_channel::<Job>(256);
        let (s, c) = (store.clone(), caches.clone());
        let worker = std::thread::Builder::new()
            .name("embedding-fill".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        Job::Fill(fill) => {
                            if let Err(e) = fill_cache(&s, &c, fill) {
                                log::error!("embedding cache fill failed: {e}");
                            }
                        }
                        Job::Barrier(ack) => {
                            let _ = ack.send(());
                        }
                    }
                }
            })
            .ok();
        InstanceCaches {
            store,
            caches,
            filler: Mutex::new(worker.as_ref().map(|_| tx)),
            worker: Mutex::new(worker),
        }
    }

    pub fn store(&self) -> &Arc<EmbeddingStore> {
        &self.store
    }

    pub fn cache(&self, table: usize) -> Option<&Arc<dyn CacheTier>> {
        self.caches.get(table)
    }

    /// Looks up `keys` of one table into `out` (`keys.len() * dim` floats).
    pub fn lookup(&self, table: usize, keys: &[i64], out: &mut [f32]) -> Result<()> {
        let store = &self.store;
        let t = store
            .tables
            .get(table)
            .ok_or_else(|| Error::invalid_arg(format!("no table {table}")))?;
        let dim = t.config.dim;
        if out.len() != keys.len() * dim {
            return Err(Error::internal(format!(
                "lookup: {} keys of dim {dim} need {} floats",
                keys.len(),
                keys.len() * dim
            )));
        }
        t.counters.lookups.fetch_add(1, Ordering::Relaxed);
        t.counters.keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
        let Some(cache) = self.caches.get(table) else {
            store.fetch_below_cache(table, keys, out);
            return Ok(());
        };
        let version = t.version.load(Ordering::SeqCst);
        let t0 = Instant::now();
        let missed = cache.lookup(keys, out)?;
        t.counters.cache_ns.fetch_add(ns_since(t0), Ordering::Relaxed);
        t.counters.cache_hits.fetch_add((keys.len() - missed.len()) as u64, Ordering::Relaxed);
        if missed.is_empty() {
            return Ok(());
        }
        let mkeys: Vec<i64> = missed.iter().map(|&i| keys[i]).collect();
        let mut mout = vec![0f32; mkeys.len() * dim];
        let found = store.fetch_below_cache(table, &mkeys, &mut mout);
        for (j, &i) in missed.iter().enumerate() {
            out[i * dim..(i + 1) * dim].copy_from_slice(&mout[j * dim..(j + 1) * dim]);
        }
        self.fill_after_miss(table, version, keys.len(), &mkeys, &mout, &found)
    }

    /// Looks `keys` of one table up straight into GPU memory: row i lands at
    /// `offset + i * stride` floats of `rows`. Hits come from the GPU cache; misses
    /// are fetched below it and copied in. The GPU instance's output path, so an
    /// ensemble's dense step receives the embeddings without a trip through the host.
    #[cfg(feature = "gpu")]
    pub fn lookup_device(
        &self,
        table: usize,
        keys: &[i64],
        rows: &mut gpu::DeviceRows,
        offset: usize,
        stride: usize,
    ) -> Result<()> {
        let store = &self.store;
        let t = store
            .tables
            .get(table)
            .ok_or_else(|| Error::invalid_arg(format!("no table {table}")))?;
        let dim = t.config.dim;
        t.counters.lookups.fetch_add(1, Ordering::Relaxed);
        t.counters.keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
        let version = t.version.load(Ordering::SeqCst);
        let cache = self.caches.get(table).and_then(|c| c.as_any().downcast_ref::<gpu::GpuCache>());
        let missed = match cache {
            Some(g) => {
                let t0 = Instant::now();
                let missed = g.lookup_into(keys, rows, offset, stride)?;
                t.counters.cache_ns.fetch_add(ns_since(t0), Ordering::Relaxed);
                t.counters
                    .cache_hits
                    .fetch_add((keys.len() - missed.len()) as u64, Ordering::Relaxed);
                missed
            }
            None => (0..keys.len()).collect(),
        };
        if missed.is_empty() {
            return Ok(());
        }
        let mkeys: Vec<i64> = missed.iter().map(|&i| keys[i]).collect();
        let mut mout = vec![0f32; mkeys.len() * dim];
        let found = store.fetch_below_cache(table, &mkeys, &mut mout);
        rows.scatter(&mout, &missed, dim, offset, stride)?;
        if cache.is_some() {
            self.fill_after_miss(table, version, keys.len(), &mkeys, &mout, &found)?;
        }
        Ok(())
    }

    /// The whole-batch GPU lookup over this instance's caches (every table of dim `dim`),
    /// its rows written as `format`.
    #[cfg(feature = "gpu")]
    pub fn batch_lookup(
        &self,
        gpu: &gpu::GpuInstance,
        format: gpu::RowFormat,
    ) -> Result<gpu::BatchLookup> {
        let store = &self.store;
        let dim = store.dim(0);
        if (0..store.table_count()).any(|t| store.dim(t) != dim) {
            return Err(Error::unsupported(
                "the whole-batch GPU lookup needs every table to have the same dim",
            ));
        }
        let caches: Vec<Option<&gpu::GpuCache>> = (0..store.table_count())
            .map(|t| self.caches.get(t).and_then(|c| c.as_any().downcast_ref::<gpu::GpuCache>()))
            .collect();
        gpu.batch_lookup(&caches, dim, format)
    }

    /// Looks a whole batch up on the GPU, every table at once (see
    /// `triton_rust_cuda::cache::BatchLookup`): row i of `keys` lands at `i * dim` floats
    /// of `lookup`'s rows. Misses are read below the cache grouped by table, on several
    /// threads when there are many, straight into the page-locked buffer that goes to the
    /// GPU. Those rows then fill the caches on the GPU itself, by a kernel queued after
    /// the rows are in place and never waited for: no copy back, no per-table call, no
    /// wait on the request's path (the CPU path's `hit_rate_threshold` choice between a
    /// fill now and a background fill has nothing left to choose here). A fill is
    /// skipped when an update ran during the lookup (its rows may be stale).
    #[cfg(feature = "gpu")]
    ///
    /// `keys` on the host or already in GPU memory (`BatchKeys`). `into`: the rows go there
    /// (GPU memory with room for them all) instead of `lookup`'s own buffer.
    pub fn lookup_batch_device(
        &self,
        keys: gpu::BatchKeys<'_>,
        layout: gpu::KeyLayout<'_>,
        gpu: &gpu::GpuInstance,
        lookup: &mut gpu::BatchLookup,
        into: Option<&mut triton_rust_cuda::DeviceViewMut<'_>>,
    ) -> Result<()> {
        let store = &self.store;
        let tables = store.tables.len();
        let dim = lookup.dim();
        let counts: Vec<usize> = match layout {
            gpu::KeyLayout::Interleaved => vec![keys.len() / tables.max(1); tables],
            gpu::KeyLayout::Blocked(c) => c.to_vec(),
        };
        let starts: Vec<usize> = counts
            .iter()
            .scan(0, |at, &c| {
                let s = *at;
                *at += c;
                Some(s)
            })
            .collect();
        let table_of = |i: usize| -> usize {
            match layout {
                gpu::KeyLayout::Interleaved => i % tables,
                gpu::KeyLayout::Blocked(_) => starts.partition_point(|&s| s <= i) - 1,
            }
        };
        let versions: Vec<u64> =
            store.tables.iter().map(|t| t.version.load(Ordering::SeqCst)).collect();
        for (t, &c) in counts.iter().enumerate() {
            if c > 0 {
                store.tables[t].counters.lookups.fetch_add(1, Ordering::Relaxed);
                store.tables[t].counters.keys.fetch_add(c as u64, Ordering::Relaxed);
            }
        }
        let t0 = Instant::now();
        let mut missed_per_table = vec![0usize; tables];
        let mut fetch_ns = 0u64;
        let mut fetch = |missed: &mut [i32],
                         missed_keys: &mut [i64],
                         rows: &mut [f32],
                         found: &mut [u8]|
         -> Result<()> {
            // group the misses by table (a counting sort), so each table is read in one call
            let of: Vec<u32> = missed.iter().map(|&i| table_of(i as usize) as u32).collect();
            for &t in &of {
                missed_per_table[t as usize] += 1;
            }
            let mut at: Vec<usize> = missed_per_table
                .iter()
                .scan(0, |a, &c| {
                    let s = *a;
                    *a += c;
                    Some(s)
                })
                .collect();
            let groups: Vec<(usize, std::ops::Range<usize>)> = missed_per_table
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(t, &c)| (t, at[t]..at[t] + c))
                .collect();
            let mut sorted = vec![0i32; missed.len()];
            let mut mkeys = vec![0i64; missed.len()];
            for ((&i, &k), &t) in missed.iter().zip(missed_keys.iter()).zip(&of) {
                sorted[at[t as usize]] = i;
                mkeys[at[t as usize]] = k;
                at[t as usize] += 1;
            }
            missed.copy_from_slice(&sorted);
            missed_keys.copy_from_slice(&mkeys);
            let tf = Instant::now();
            let f = fetch_parallel(store, &groups, &mkeys, rows, dim);
            fetch_ns = ns_since(tf);
            for (dst, src) in found.iter_mut().zip(f) {
                *dst = src as u8;
            }
            Ok(())
        };
        let epoch = gpu.next_epoch();
        let times = lookup.run_keys::<Error>(keys, layout, epoch, &mut fetch, into)?;
        // the cache tier's time: the whole pass less the wall time of the reads below it
        // (those are counted per table by the host tier, summed over its threads)
        let elapsed = ns_since(t0).saturating_sub(fetch_ns);
        let total = keys.len().max(1) as u64;
        for (t, &c) in counts.iter().enumerate() {
            let tc = &store.tables[t].counters;
            tc.cache_ns.fetch_add(elapsed * c as u64 / total, Ordering::Relaxed);
            if let Some(g) =
                self.caches.get(t).and_then(|c| c.as_any().downcast_ref::<gpu::GpuCache>())
            {
                tc.cache_hits.fetch_add((c - missed_per_table[t]) as u64, Ordering::Relaxed);
                g.count_batch(c, missed_per_table[t]);
            }
        }
        if self.caches.is_empty() {
            return Ok(());
        }
        // Under the update gate: an update's cache refresh is queued either before this
        // fill (and then its version bump is seen here) or after it (and overwrites it).
        let _gate = store.gate.read();
        if store.tables.iter().zip(&versions).any(|(t, &v)| t.version.load(Ordering::SeqCst) != v) {
            for (t, &m) in missed_per_table.iter().enumerate() {
                if m > 0 {
                    store.tables[t].counters.fills_dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            return Ok(());
        }
        let tf = Instant::now();
        lookup.fill_last(gpu.next_epoch())?;
        if log::log_enabled!(log::Level::Debug) {
            // the tables with the most misses, to tell cold keys from sets too full to keep them
            let mut worst: Vec<(usize, usize)> =
                missed_per_table.iter().copied().enumerate().filter(|&(_, m)| m > 0).collect();
            worst.sort_by_key(|&(t, m)| (std::cmp::Reverse(m), t));
            let worst: Vec<String> = worst
                .iter()
                .take(4)
                .map(|(t, m)| format!("{} {m}", store.tables[*t].config.name))
                .collect();
            log::debug!(
                "timing: batch lookup: keys {}, misses {}, lookup {} us, below cache {} us, scatter {} us, fill queued {} us (most misses: {})",
                times.keys,
                times.misses,
                times.lookup_us,
                times.fetch_us,
                times.scatter_us,
                tf.elapsed().as_micros(),
                worst.join(", ")
            );
        }
        Ok(())
    }

    /// Inserts rows found below the cache: now if the batch's hit rate was under the
    /// threshold, else through the background filler.
    fn fill_after_miss(
        &self,
        table: usize,
        version: u64,
        total: usize,
        mkeys: &[i64],
        mout: &[f32],
        found: &[bool],
    ) -> Result<()> {
        let store = &self.store;
        let t = &store.tables[table];
        let dim = t.config.dim;
        let hit_rate = 1.0 - mkeys.len() as f64 / total as f64;
        let (mut fkeys, mut fvecs) =
            (Vec::with_capacity(mkeys.len()), Vec::with_capacity(mout.len()));
        for (j, &k) in mkeys.iter().enumerate() {
            if found[j] {
                fkeys.push(k);
                fvecs.extend_from_slice(&mout[j * dim..(j + 1) * dim]);
            }
        }
        if fkeys.is_empty() {
            return Ok(());
        }
        let fill = Fill { table, version, keys: fkeys, vectors: fvecs };
        if hit_rate < store.config.hit_rate_threshold {
            fill_cache(store, &self.caches, fill)
        } else {
            let sent = self
                .filler
                .lock()
                .as_ref()
                .map(|tx| tx.try_send(Job::Fill(fill)).is_ok())
                .unwrap_or(false);
            if !sent {
                t.counters.fills_dropped.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
    }

    /// Waits until the background filler has inserted everything queued so far (tests, benchmarks).
    pub fn flush(&self) {
        let (ack_tx, ack_rx) = mpsc::sync_channel::<()>(1);
        let sent = self
            .filler
            .lock()
            .as_ref()
            .map(|tx| tx.send(Job::Barrier(ack_tx)).is_ok())
            .unwrap_or(false);
        if sent {
            let _ = ack_rx.recv();
        }
    }
}

impl Drop for InstanceCaches {
    fn drop(&mut self) {
        self.filler.lock().take(); // closes the channel; the worker drains and exits
        if let Some(w) = self.worker.lock().take() {
            let _ = w.join();
        }
    }
}

/// Reads the missed rows of several tables below the cache into `rows` (`groups` say
/// which part of `keys` is which table's, in order and together covering `keys`), split
/// over up to 16 runs of at least 1024 keys each, on the process's worker pool (rayon:
/// starting that many threads per batch costs ~0.5 ms on a 2-CPU VM,
/// `triton_rust_cuda`'s `examples/pool_vs_spawn.rs`);
/// every run takes an equal share of the keys, cut where the tables change. Reading rows
/// scattered over tens of GB is bound by memory latency, not bandwidth, so more readers help.
#[cfg(feature = "gpu")]
fn fetch_parallel(
    store: &EmbeddingStore,
    groups: &[(usize, std::ops::Range<usize>)],
    keys: &[i64],
    rows: &mut [f32],
    dim: usize,
) -> Vec<bool> {
    use rayon::prelude::*;
    const PER_RUN: usize = 1024;
    let n = keys.len();
    let runs = rayon::current_num_threads().clamp(1, 16).min(n.div_ceil(PER_RUN)).max(1);
    let per = n.div_ceil(runs).max(1);
    let read = |at: usize, rows: &mut [f32], found: &mut [bool]| {
        let range = at..at + found.len();
        for (t, g) in groups {
            let (s, e) = (g.start.max(range.start), g.end.min(range.end));
            if s < e {
                let f = store.fetch_below_cache(
                    *t,
                    &keys[s..e],
                    &mut rows[(s - at) * dim..(e - at) * dim],
                );
                found[s - at..e - at].copy_from_slice(&f);
            }
        }
    };
    let mut found = vec![false; n];
    if runs == 1 {
        read(0, &mut rows[..n * dim], &mut found);
    } else {
        rows[..n * dim]
            .par_chunks_mut(per * dim)
            .zip(found.par_chunks_mut(per))
            .enumerate()
            .for_each(|(k, (r, f))| read(k * per, r, f));
    }
    found
}

fn fill_cache(store: &EmbeddingStore, caches: &[Arc<dyn CacheTier>], fill: Fill) -> Result<()> {
    let (Some(t), Some(cache)) = (store.tables.get(fill.table), caches.get(fill.table)) else {
        return Ok(());
    };
    let _gate = store.gate.read();
    if t.version.load(Ordering::SeqCst) != fill.version {
        // An update ran since these rows were read: they may be stale. Skip; the next
        // miss fills the fresh rows.
        t.counters.fills_dropped.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    cache.insert(&fill.keys, &fill.vectors)
}

/// Draws keys from a Zipf distribution over `0..n` (rank 0 most frequent): the skew of
/// real recommender traffic, for tests and benchmarks.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, exponent: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|r| {
                acc += 1.0 / (r as f64).powf(exponent);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }
    /// Maps a uniform sample in [0, 1) to a rank.
    pub fn rank(&self, u: f64) -> usize {
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::cache::HostCache;
    use super::table::{write_table, VectorType};
    use super::*;
    use rand::{Rng, SeedableRng};

    fn row(key: i64, version: u32, dim: usize) -> Vec<f32> {
        (0..dim).map(|j| key as f32 * 100.0 + version as f32 + j as f32 * 1e-3).collect()
    }

    fn make_store(
        name: &str,
        rows: usize,
        dim: usize,
        ratio: f64,
        threshold: f64,
    ) -> (Arc<EmbeddingStore>, PathBuf) {
        let dir = std::env::temp_dir().join(format!("trt-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let keys: Vec<i64> = (0..rows as i64).collect();
        let vecs: Vec<f32> = keys.iter().flat_map(|&k| row(k, 0, dim)).collect();
        write_table(&dir.join("t0"), &keys, bytemuck::cast_slice(&vecs), dim, VectorType::F32)
            .unwrap();
        let cfg = StoreConfig {
            tables: vec![
                TableConfig {
                    name: "t0".into(),
                    dim,
                    path: Some(dir.join("t0")),
                    format: None,
                    default_value: 0.0,
                },
                TableConfig {
                    name: "empty".into(),
                    dim: 2,
                    path: None,
                    format: None,
                    default_value: -1.0,
                },
            ],
            cache_ratio: ratio,
            cache_allocation: CacheAllocation::PerTable,
            hit_rate_threshold: threshold,
            update_log_dir: None,
            compaction_rows: 0,
            update_stream: None,
            host_memory: Default::default(),
        };
        (EmbeddingStore::open(cfg, None).unwrap(), dir)
    }

    fn cpu(geo: CacheGeometry) -> Result<Arc<dyn CacheTier>> {
        Ok(Arc::new(HostCache::new(geo)))
    }

    #[cfg(feature = "gpu")]
    #[test]
    fn parallel_reads_below_the_cache_equal_one_reader() {
        // t0 has dim 2 like the empty table, so one batch covers both
        let (store, dir) = make_store("parallel", 3000, 2, 0.1, 1.1);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (n0, n1) = (4100usize, 1500usize);
        let keys: Vec<i64> =
            (0..n0).map(|_| rng.gen_range(0..3100)).chain((0..n1).map(|i| i as i64)).collect();
        let groups = [(0usize, 0..n0), (1usize, n0..n0 + n1)];
        let mut rows = vec![7f32; keys.len() * 2];
        let found = fetch_parallel(&store, &groups, &keys, &mut rows, 2);
        let mut want = vec![7f32; keys.len() * 2];
        let mut want_found = store.fetch_below_cache(0, &keys[..n0], &mut want[..n0 * 2]);
        want_found.extend(store.fetch_below_cache(1, &keys[n0..], &mut want[n0 * 2..]));
        assert_eq!(found, want_found);
        assert_eq!(rows, want);
        assert!(
            found[..n0].iter().any(|f| !f) && found[..n0].iter().any(|&f| f),
            "keys past the table are not found"
        );
        assert_eq!(&rows[n0 * 2..n0 * 2 + 2], &[-1.0, -1.0], "the empty table's default vector");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn lookups_go_through_the_tiers() {
        let (store, dir) = make_store("tiers", 1000, 4, 0.1, 1.1);
        let inst = store.attach_caches(&cpu).unwrap();
        let keys = [5i64, 999, 5000, 5];
        let mut out = vec![0f32; 16];
        inst.lookup(0, &keys, &mut out).unwrap();
        assert_eq!(out[..4], row(5, 0, 4)[..]);
        assert_eq!(out[4..8], row(999, 0, 4)[..]);
        assert_eq!(out[8..12], [0.0; 4], "unknown key gets the default vector");
        // threshold 1.1 > any hit rate: fills are synchronous, so the second lookup hits
        inst.lookup(0, &keys, &mut out).unwrap();
        let c = store.counters(0);
        assert_eq!(c.keys.load(Ordering::Relaxed), 8);
        assert!(
            c.cache_hits.load(Ordering::Relaxed) >= 3,
            "{}",
            c.cache_hits.load(Ordering::Relaxed)
        );
        assert_eq!(c.defaults.load(Ordering::Relaxed), 2);
        let mut two = [0f32; 2];
        inst.lookup(1, &[3], &mut two).unwrap();
        assert_eq!(two, [-1.0, -1.0]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn updates_reach_every_instance_cache() {
        let (store, dir) = make_store("upd", 100, 4, 1.0, 1.1);
        let a = store.attach_caches(&cpu).unwrap();
        let b = store.attach_caches(&cpu).unwrap();
        let mut out = vec![0f32; 4];
        a.lookup(0, &[7], &mut out).unwrap();
        b.lookup(0, &[7], &mut out).unwrap();
        store.update(0, &[7, 1000], &[row(7, 3, 4), row(1000, 1, 4)].concat()).unwrap();
        for inst in [&a, &b] {
            inst.lookup(0, &[7], &mut out).unwrap();
            assert_eq!(out, row(7, 3, 4));
            inst.lookup(0, &[1000], &mut out).unwrap();
            assert_eq!(out, row(1000, 1, 4), "a new key is served after the update");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn async_fills_land_after_flush() {
        let (store, dir) = make_store("async", 1000, 4, 0.5, 0.0);
        let inst = store.attach_caches(&cpu).unwrap();
        let keys: Vec<i64> = (0..50).collect();
        let mut out = vec![0f32; 200];
        inst.lookup(0, &keys, &mut out).unwrap();
        inst.flush();
        let before = store.counters(0).cache_hits.load(Ordering::Relaxed);
        inst.lookup(0, &keys, &mut out).unwrap();
        assert_eq!(store.counters(0).cache_hits.load(Ordering::Relaxed) - before, 50);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Readers on two instances and writers updating random keys, through the whole store:
    /// every row returned is a whole row of its key and never older than what was
    /// committed before the lookup began (a fill racing an update must not leave a
    /// superseded row in a cache).
    #[test]
    fn concurrent_lookups_and_updates_through_the_store() {
        use std::sync::atomic::AtomicU32;
        const ROWS: usize = 400;
        const DIM: usize = 8;
        let (store, dir) = make_store("conc", ROWS, DIM, 0.25, 0.5);
        let insts = [store.attach_caches(&cpu).unwrap(), store.attach_caches(&cpu).unwrap()];
        let committed: Arc<Vec<AtomicU32>> =
            Arc::new((0..ROWS).map(|_| AtomicU32::new(0)).collect());
        let key_locks: Arc<Vec<parking_lot::Mutex<()>>> =
            Arc::new((0..ROWS).map(|_| parking_lot::Mutex::new(())).collect());
        let zipf = Arc::new(Zipf::new(ROWS, 1.1));
        let mut handles = Vec::new();
        for t in 0..6u64 {
            let (store, inst, committed, key_locks, zipf) = (
                store.clone(),
                insts[t as usize % 2].clone(),
                committed.clone(),
                key_locks.clone(),
                zipf.clone(),
            );
            handles.push(std::thread::spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
                let mut checked = 0usize;
                for _ in 0..2000 {
                    if t == 0 || t == 1 {
                        let k = zipf.rank(rng.gen());
                        let _g = key_locks[k].lock();
                        let v = committed[k].load(Ordering::SeqCst) + 1;
                        store.update(0, &[k as i64], &row(k as i64, v, DIM)).unwrap();
                        committed[k].store(v, Ordering::SeqCst);
                    } else {
                        let keys: Vec<i64> = (0..16).map(|_| zipf.rank(rng.gen()) as i64).collect();
                        let floors: Vec<u32> = keys
                            .iter()
                            .map(|&k| committed[k as usize].load(Ordering::SeqCst))
                            .collect();
                        let mut out = vec![0f32; keys.len() * DIM];
                        inst.lookup(0, &keys, &mut out).unwrap();
                        for (i, &k) in keys.iter().enumerate() {
                            let got = &out[i * DIM..(i + 1) * DIM];
                            let v = (got[0] - k as f32 * 100.0).round();
                            assert!(
                                v >= floors[i] as f32,
                                "stale row for key {k}: version {v} < {}",
                                floors[i]
                            );
                            assert_eq!(
                                got,
                                &row(k, v as u32, DIM)[..],
                                "wrong or torn row for key {k}"
                            );
                            checked += 1;
                        }
                    }
                }
                checked
            }));
        }
        let checked: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(checked > 10_000);
        let c = store.counters(0);
        assert!(c.cache_hits.load(Ordering::Relaxed) > 0);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn zipf_hit_rate_is_reported() {
        let (store, dir) = make_store("zipf", 20_000, 4, 0.05, 1.1);
        let inst = store.attach_caches(&cpu).unwrap();
        let zipf = Zipf::new(20_000, 1.05);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut out = vec![0f32; 256 * 4];
        for _ in 0..200 {
            let keys: Vec<i64> = (0..256).map(|_| zipf.rank(rng.gen()) as i64).collect();
            inst.lookup(0, &keys, &mut out).unwrap();
        }
        let c = store.counters(0);
        let rate =
            c.cache_hits.load(Ordering::Relaxed) as f64 / c.keys.load(Ordering::Relaxed) as f64;
        println!("Zipf(1.05) over 20000 keys, cache 5% of rows: hit rate {rate:.3}");
        // the 1000 hottest of 20000 Zipf(1.05) keys carry well over half the traffic
        assert!(rate > 0.5 && rate < 1.0, "hit rate {rate}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_store_wide_cache_share_caches_small_tables_whole() {
        let rows = [3, 1_000, 40_000, 1_000_000, 1_000_000];
        let per = cache_rows(&rows, 0.1, CacheAllocation::PerTable);
        assert_eq!(per, [1, 100, 4_000, 100_000, 100_000]);
        let store = cache_rows(&rows, 0.1, CacheAllocation::Store);
        let budget = (rows.iter().sum::<usize>() as f64 * 0.1).floor() as usize;
        assert!(store.iter().sum::<usize>() <= budget, "never above the budget: {store:?}");
        assert!(budget - store.iter().sum::<usize>() < rows.len(), "the budget is used: {store:?}");
        assert_eq!(&store[..2], &[2 * 3, 2 * 1_000], "small tables whole, at half load");
        assert!(
            store[2] > rows[2] && store[2] < 2 * rows[2],
            "whole, at what load the budget leaves: {store:?}"
        );
        assert!(store[3].abs_diff(store[4]) <= 1, "large tables share the rest equally: {store:?}");
        assert_eq!(CacheAllocation::parse("store").unwrap(), CacheAllocation::Store);
        assert!(CacheAllocation::parse("most")
            .unwrap_err()
            .message()
            .contains("per_table or store"));
    }

    #[test]
    fn config_errors_name_the_table() {
        let dir = std::env::temp_dir().join(format!("trt-store-bad-{}", std::process::id()));
        write_table(&dir, &[1, 2], bytemuck::cast_slice(&[0f32; 6]), 3, VectorType::F32).unwrap();
        let cfg = |dim| StoreConfig {
            tables: vec![TableConfig {
                name: "users".into(),
                dim,
                path: Some(dir.clone()),
                format: None,
                default_value: 0.0,
            }],
            cache_ratio: 0.1,
            cache_allocation: CacheAllocation::PerTable,
            hit_rate_threshold: 0.9,
            update_log_dir: None,
            compaction_rows: 0,
            update_stream: None,
            host_memory: Default::default(),
        };
        let e = EmbeddingStore::open(cfg(4), None).err().unwrap();
        assert!(e.message().contains("'users'") && e.message().contains("dim 3"), "{e}");
        assert!(EmbeddingStore::open(cfg(3), None).is_ok());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn acknowledged_updates_survive_a_reopen_and_a_compaction() {
        let (store, dir) = make_store("durable", 100, 4, 0.0, 0.9);
        let cfg = store.config.clone();
        let read = |store: &Arc<EmbeddingStore>, keys: &[i64]| {
            let mut out = vec![0f32; keys.len() * 4];
            store.attach_caches_none().lookup(0, keys, &mut out).unwrap();
            out
        };
        store.update(0, &[1, 500], &[row(1, 1, 4), row(500, 1, 4)].concat()).unwrap();
        assert!(
            store.durable().is_err(),
            "the table with no files and no update_log_dir has no log"
        );
        drop(store);
        // a restart: the files still hold version 0, the log version 1
        let store = EmbeddingStore::open(cfg.clone(), None).unwrap();
        assert_eq!(
            read(&store, &[1, 500, 2]),
            [row(1, 1, 4), row(500, 1, 4), row(2, 0, 4)].concat()
        );
        assert_eq!(store.counters(0).replayed_rows.load(Ordering::Relaxed), 2);
        store.compact(0).unwrap();
        assert_eq!(store.host(0).overlay_rows(), 0, "the compaction reclaims the overlay");
        assert_eq!(store.host_rows(0), 101);
        assert_eq!(
            read(&store, &[1, 500, 2]),
            [row(1, 1, 4), row(500, 1, 4), row(2, 0, 4)].concat()
        );
        store.update(0, &[2], &row(2, 2, 4)).unwrap();
        drop(store);
        // a restart after the compaction: the snapshot, then the newer log
        let store = EmbeddingStore::open(cfg, None).unwrap();
        assert_eq!(
            read(&store, &[1, 500, 2]),
            [row(1, 1, 4), row(500, 1, 4), row(2, 2, 4)].concat()
        );
        assert_eq!(
            store.counters(0).replayed_rows.load(Ordering::Relaxed),
            1,
            "only what came after the snapshot"
        );
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_compactor_keeps_the_overlay_bounded() {
        let (store, dir) = make_store("compactor", 50, 2, 0.0, 0.9);
        let mut cfg = store.config.clone();
        drop(store);
        cfg.compaction_rows = 100;
        let store = EmbeddingStore::open(cfg, None).unwrap();
        for round in 0..20i64 {
            let keys: Vec<i64> = (0..50).collect();
            let vals: Vec<f32> = keys.iter().flat_map(|&k| row(k, round as u32, 2)).collect();
            store.update(0, &keys, &vals).unwrap();
        }
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        // the compactor resets the overlay, then counts the compaction: wait for both
        let done = |s: &EmbeddingStore| {
            s.host(0).overlay_rows() < 100 && s.counters(0).compactions.load(Ordering::Relaxed) > 0
        };
        while !done(&store) && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(store.counters(0).compactions.load(Ordering::Relaxed) > 0);
        assert!(
            store.host(0).overlay_rows() < 100 + 50,
            "overlay {}",
            store.host(0).overlay_rows()
        );
        let mut out = vec![0f32; 2];
        store.attach_caches_none().lookup(0, &[7], &mut out).unwrap();
        assert_eq!(out, row(7, 19, 2));
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
