//! One instance's view of the store: its cache per table, lookups through the tiers, and
//! the background thread that fills caches after a lookup.

#[cfg(feature = "gpu")]
use super::below::fetch_parallel;
#[cfg(feature = "gpu")]
use super::gather::KeyTables;
use super::*;

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
    pub(super) store: Arc<EmbeddingStore>,
    pub(crate) caches: Vec<Arc<dyn CacheTier>>,
    filler: Mutex<Option<mpsc::SyncSender<Job>>>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Where these caches save the keys they hold (at drop, and every period seconds
    /// when above 0; `warm.rs`).
    state: Option<(std::path::PathBuf, f64)>,
}

impl InstanceCaches {
    pub(crate) fn new(
        store: Arc<EmbeddingStore>,
        caches: Vec<Arc<dyn CacheTier>>,
        state: Option<(std::path::PathBuf, f64)>,
    ) -> InstanceCaches {
        let (tx, rx) = mpsc::sync_channel::<Job>(256);
        let (s, c) = (store.clone(), caches.clone());
        let periodic = state.clone().filter(|(_, p)| *p > 0.0);
        let worker = std::thread::Builder::new()
            .name("embedding-fill".into())
            .spawn(move || {
                let period = periodic.as_ref().map(|(_, p)| std::time::Duration::from_secs_f64(*p));
                let mut next = period.map(|p| Instant::now() + p);
                loop {
                    let job = match next {
                        None => rx.recv().ok(),
                        Some(at) => {
                            match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                                Ok(job) => Some(job),
                                Err(mpsc::RecvTimeoutError::Timeout) => {
                                    if let Some((file, _)) = &periodic {
                                        save_state(&s, &c, file);
                                    }
                                    next = period.map(|p| Instant::now() + p);
                                    continue;
                                }
                                Err(mpsc::RecvTimeoutError::Disconnected) => None,
                            }
                        }
                    };
                    match job {
                        None => break,
                        Some(Job::Fill(fill)) => {
                            if let Err(e) = fill_cache(&s, &c, fill) {
                                log::error!("embedding cache fill failed: {e}");
                            }
                        }
                        Some(Job::Barrier(ack)) => {
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
            state,
        }
    }

    /// Saves the keys these caches hold now, where the store keeps its cache state (tests,
    /// and the periodic and final saves). Returns the keys saved, or `None` without one.
    pub fn save_state(&self) -> Option<usize> {
        let (file, _) = self.state.as_ref()?;
        save_state(&self.store, &self.caches, file)
    }

    /// Held across a lookup that reads rows in place on a GPU, when the rows are sharded:
    /// a table's update is written on the GPU that holds it while other GPUs' instances look
    /// it up, and this orders the two (an update waits for the lookups under way, and a
    /// lookup after it reads its rows whole). `None` otherwise: one GPU's lookups and
    /// updates already share one queue. The lookup must wait for its kernel before the
    /// guard goes, and take no other hold of the update gate meanwhile.
    pub fn update_order(&self) -> Option<parking_lot::RwLockReadGuard<'_, ()>> {
        (self.store.config.placement == crate::store_config::Placement::Sharded)
            .then(|| self.store.gate.read())
    }

    /// Counts a lookup that found every one of its rows resident in GPU memory (the
    /// one-kernel pooled lookup): `keys[t]` keys of table `t`, each a hit of the cache tier.
    pub fn count_resident(&self, keys: &[usize]) {
        for (t, &c) in keys.iter().enumerate().filter(|(_, &c)| c > 0) {
            let Some(table) = self.store.tables.get(t) else { continue };
            table.counters.lookups.fetch_add(1, Ordering::Relaxed);
            table.counters.keys.fetch_add(c as u64, Ordering::Relaxed);
            table.counters.cache_hits.fetch_add(c as u64, Ordering::Relaxed);
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
            store.fetch_below_cache(table, keys, out)?;
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
        let found = store.fetch_below_cache(table, &mkeys, &mut mout)?;
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
        let found = store.fetch_below_cache(table, &mkeys, &mut mout)?;
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
        if !store.one_dim() {
            return Err(Error::unsupported(
                "the whole-batch GPU lookup needs every table to have the same dim",
            ));
        }
        let caches: Vec<Option<&gpu::GpuCache>> = (0..store.table_count())
            .map(|t| self.caches.get(t).and_then(|c| c.as_any().downcast_ref::<gpu::GpuCache>()))
            .collect();
        let mut lookup = gpu.batch_lookup(&caches, dim, format)?;
        if time_queue() {
            lookup.time_kernels(true)?;
        }
        Ok(lookup)
    }

    /// The one-kernel pooled lookup over this instance's tables when every one is resident
    /// on `gpu` (see `triton_rust_cuda::cache::ResidentPool`), its rows written as `format`.
    #[cfg(feature = "gpu")]
    pub fn resident_pool(
        &self,
        gpu: &gpu::GpuInstance,
        format: gpu::RowFormat,
    ) -> Result<Option<gpu::ResidentPool>> {
        let caches: Vec<Option<&gpu::GpuCache>> = (0..self.store.table_count())
            .map(|t| self.caches.get(t).and_then(|c| c.as_any().downcast_ref::<gpu::GpuCache>()))
            .collect();
        gpu.resident_pool(&caches, format)
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
    /// (GPU memory with room for them all) instead of `lookup`'s own buffer. Returns how many
    /// keys of a fixed layout (`KeyLayout::Fixed`) were below zero: when any, the batch was
    /// not looked up (nothing read below the cache, nothing counted) and its rows are not
    /// complete, for the caller to take another path.
    pub fn lookup_batch_device(
        &self,
        keys: gpu::BatchKeys<'_>,
        layout: gpu::KeyLayout<'_>,
        gpu: &gpu::GpuInstance,
        lookup: &mut gpu::BatchLookup,
        into: Option<&mut triton_rust_cuda::DeviceViewMut<'_>>,
    ) -> Result<usize> {
        let store = &self.store;
        let tables = store.tables.len();
        let dim = lookup.dim();
        let key_tables = KeyTables::new(layout, keys.len(), tables);
        let (counts, table_of) = (&key_tables.counts, |i: usize| key_tables.table_of(i));
        let versions: Vec<u64> =
            store.tables.iter().map(|t| t.version.load(Ordering::SeqCst)).collect();
        let t0 = Instant::now();
        let mut missed_per_table = vec![0usize; tables];
        let mut fetch_ns = 0u64;
        let mut reads = super::GatherTimes::default();
        let mut fetch = |missed: &mut [i32],
                         missed_keys: &mut [i64],
                         mut rows: gpu::FetchedRows<'_>,
                         found: &mut [u8]|
         -> Result<()> {
            // every table dense and untouched: read in the lookup's order, as a plain gather
            let tf = Instant::now();
            let raw: &mut [u8] = match &mut rows {
                gpu::FetchedRows::F32(r) => bytemuck::cast_slice_mut(r),
                gpu::FetchedRows::F16(r) => bytemuck::cast_slice_mut(r),
            };
            if store.gather_dense(
                &table_of,
                missed,
                missed_keys,
                raw,
                found,
                &mut missed_per_table,
                Some(&mut reads),
            )? {
                fetch_ns += ns_since(tf);
                return Ok(());
            }
            // group the misses by table (a counting sort), so each table is read in one call;
            // the lookup may call this on its misses part after part: the batch's counts add up
            let of: Vec<u32> = missed.iter().map(|&i| table_of(i as usize) as u32).collect();
            let mut here = vec![0usize; tables];
            for &t in &of {
                here[t as usize] += 1;
            }
            for (all, n) in missed_per_table.iter_mut().zip(&here) {
                *all += n;
            }
            let mut at: Vec<usize> = here
                .iter()
                .scan(0, |a, &c| {
                    let s = *a;
                    *a += c;
                    Some(s)
                })
                .collect();
            let groups: Vec<(usize, std::ops::Range<usize>)> = here
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
            let f = match rows {
                gpu::FetchedRows::F32(rows) => fetch_parallel(
                    store,
                    &groups,
                    &mkeys,
                    rows,
                    dim,
                    EmbeddingStore::read_below_cache,
                )?,
                gpu::FetchedRows::F16(rows) => fetch_parallel(
                    store,
                    &groups,
                    &mkeys,
                    rows,
                    dim,
                    EmbeddingStore::read_below_cache_f16,
                )?,
            };
            fetch_ns += ns_since(tf);
            for (dst, src) in found.iter_mut().zip(f) {
                *dst = src as u8;
            }
            Ok(())
        };
        let epoch = gpu.next_epoch();
        let order = self.update_order();
        lookup.read_misses_on_gpu(|| self.misses_on_gpu_now());
        // the misses go up as the tables store them where that is exact
        lookup.set_fetched(if store.misses_as_stored() {
            gpu::RowFormat::F16
        } else {
            gpu::RowFormat::F32
        });
        let times = lookup.run_keys::<Error>(keys, layout, epoch, &mut fetch, into)?;
        // the fill below takes the gate itself
        drop(order);
        if times.negative > 0 {
            // not looked up: the caller takes another path, which counts the batch
            return Ok(times.negative);
        }
        if let Some(read) = lookup.host_read() {
            // the GPU read the misses below the cache: its counts per table
            for (t, table) in store.tables.iter().enumerate() {
                let (m, defaults) = (read[t] as usize, read[tables + t] as u64);
                // beside the fetcher's share, when the two shared the misses
                missed_per_table[t] += m;
                table.counters.host_hits.fetch_add(m as u64 - defaults, Ordering::Relaxed);
                table.counters.defaults.fetch_add(defaults, Ordering::Relaxed);
            }
        }
        for (t, &c) in counts.iter().enumerate() {
            if c > 0 {
                store.tables[t].counters.lookups.fetch_add(1, Ordering::Relaxed);
                store.tables[t].counters.keys.fetch_add(c as u64, Ordering::Relaxed);
            }
        }
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
            return Ok(0);
        }
        let tf = Instant::now();
        // pinned caches take no miss in
        if !store.pinned() {
            // Under the update gate: an update's cache refresh is queued either before this
            // fill (and then its version bump is seen here) or after it (and overwrites it).
            let _gate = store.gate.read();
            let moved = store.tables.iter().zip(&versions);
            if moved.into_iter().any(|(t, &v)| t.version.load(Ordering::SeqCst) != v) {
                for (t, &m) in missed_per_table.iter().enumerate() {
                    if m > 0 {
                        store.tables[t].counters.fills_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
                return Ok(0);
            }
            lookup.fill_last(gpu.next_epoch())?;
        }
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
            let rates = lookup.share_rates().map_or(String::new(), |(g, h)| {
                format!(
                    "; shared at {:.1} M rows/s on the GPU, {:.1} M on the host",
                    g / 1e6,
                    h / 1e6
                )
            });
            log::debug!(
                "timing: batch lookup: keys {}, misses {}, rows read {}, read by the gpu {}, lookup {} us, below cache {} us, keys down {} us, host reads {} us, scatter {} us, fill queued {} us, read calls {}, last share started {} us, longest share {} us, shares busy {} us{} (most misses: {}{rates})",
                times.keys,
                times.misses,
                times.read,
                times.gpu_misses,
                times.lookup_us,
                times.fetch_us,
                times.keys_down_us,
                fetch_ns / 1000,
                times.scatter_us,
                tf.elapsed().as_micros(),
                reads.calls,
                reads.last_start_ns / 1000,
                reads.longest_ns / 1000,
                reads.busy_ns / 1000,
                // the lookup was waited for, the fill before it on the queue too; a figure for
                // this line, never a failed batch
                queue_line(lookup.queue_times().ok().flatten()),
                worst.join(", ")
            );
        }
        Ok(0)
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
        if store.pinned() {
            // the caches hold their pinned keys only
            return Ok(());
        }
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
        // the fills are in: what the caches hold is saved for the next start
        self.save_state();
    }
}

/// Saves what `caches` hold into `file`; a failure is logged (serving goes on).
fn save_state(
    store: &EmbeddingStore,
    caches: &[Arc<dyn CacheTier>],
    file: &std::path::Path,
) -> Option<usize> {
    let name = store.config.cache_state.as_ref().map_or("", |s| s.store.as_str());
    match super::warm::save(store, name, caches, file) {
        Ok(n) => Some(n),
        Err(e) => {
            log::warn!("store '{name}': its caches' keys not saved: {e}");
            None
        }
    }
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

/// Whether every GPU batch lookup times how long it holds the caches' queue:
/// `TRITON_RUST_TIME_QUEUE=1` in the server's environment (read once). The timing lines
/// (`--log-verbose=1`) then say it, and the benchmarks how busy that queue was.
#[cfg(feature = "gpu")]
fn time_queue() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TRITON_RUST_TIME_QUEUE").is_ok_and(|v| v == "1"))
}

/// The timing line's figures for the caches' queue: this batch's lookup on it and the fill
/// before (GPU time by events), when timed.
#[cfg(feature = "gpu")]
fn queue_line(queue: Option<(f32, Option<f32>)>) -> String {
    let us = |ms: f32| (ms * 1000.0).round() as u64;
    match queue {
        Some((lookup, Some(fill))) => {
            format!(", queue lookup {} us, queue fill {} us", us(lookup), us(fill))
        }
        Some((lookup, None)) => format!(", queue lookup {} us", us(lookup)),
        None => String::new(),
    }
}
