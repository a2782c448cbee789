//! An instance's caches made and registered for updates: on the CPU, on a GPU (shared by
//! the instances there, as HPS keeps one cache per GPU), or none; warmed from their saved
//! keys where the store keeps them (`warm.rs`).

use super::*;

impl EmbeddingStore {
    /// Creates one instance's caches with `make` (CPU or GPU) and registers them for updates.
    pub fn attach_caches(
        self: &Arc<Self>,
        make: &dyn Fn(CacheGeometry) -> Result<Arc<dyn CacheTier>>,
    ) -> Result<Arc<InstanceCaches>> {
        self.attach_table_caches(&|_, geo| make(geo), "cpu")
    }

    /// [`EmbeddingStore::attach_caches`], `make` told which table each cache is for; the
    /// caches at `place` (`cpu`, `gpu0`, ...) warmed from their saved state when the store
    /// keeps one (`warm.rs`).
    fn attach_table_caches(
        self: &Arc<Self>,
        make: &dyn Fn(usize, CacheGeometry) -> Result<Arc<dyn CacheTier>>,
        place: &str,
    ) -> Result<Arc<InstanceCaches>> {
        let caches = if self.config.any_table_cached() {
            (0..self.tables.len())
                .map(|t| make(t, self.cache_geometry(t)))
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let learning = caches.iter().any(|c| !c.keeps_every_row());
        if let (true, Some(file)) = (learning && self.pinned(), &self.config.pinned_keys) {
            // the keys held from load to unload: any store's file of the same tables
            warm::load(self, None, &caches, file);
        }
        // pinned caches learn nothing to save
        let state = self.config.cache_state.as_ref().filter(|_| learning && !self.pinned());
        let state = state.map(|s| {
            let file = s.file(&s.store, place);
            warm::load(self, Some(&s.store), &caches, &file);
            (file, s.period_s)
        });
        let inst = Arc::new(InstanceCaches::new(self.clone(), caches, state));
        let mut reg = self.caches.lock();
        reg.retain(|w| w.strong_count() > 0);
        reg.push(Arc::downgrade(&inst));
        Ok(inst)
    }

    /// An instance's caches on GPU `device` and the queue and clock they use. `shared`: the
    /// caches every instance of this store there shares, as HPS keeps one cache per GPU:
    /// made (and registered for updates) by the first instance, the same caches and queue
    /// for the next ones while any instance holds them; else caches of its own. Each
    /// instance makes its own [`InstanceCaches::batch_lookup`] over them.
    #[cfg(feature = "gpu")]
    pub fn attach_gpu_caches(
        self: &Arc<Self>,
        device: i32,
        shared: bool,
    ) -> Result<(gpu::GpuInstance, Arc<InstanceCaches>)> {
        let mut registry = self.gpu_shared.lock();
        if shared {
            registry.retain(|(_, held, _)| held.strong_count() > 0);
            let live = registry.iter().find(|(d, _, _)| *d == device);
            if let Some(found) = live.and_then(|(_, w, g)| Some((g.clone(), w.upgrade()?))) {
                return Ok(found);
            }
        }
        let mut gpu = gpu::GpuInstance::new(device, self.config.cache_rows)?;
        // a pinned cache's stamps would order evictions that never come
        gpu.set_hit_stamp_every(if self.pinned() { 0 } else { self.config.hit_stamp_every });
        // A table whose every row the cache would hold and whose keys are its row numbers
        // is kept whole on the GPU, looked up by row number (a resident table). No update
        // lands between its copy and the caches' registration for updates.
        let _gate = self.gate.read();
        if self.config.placement == Placement::Sharded {
            // every GPU's instances look up the same tables, each where the plan put it
            let sharded = self.sharded_tables(device)?;
            // making them bound other GPUs' contexts to this thread: this instance's again
            triton_rust_cuda::gpu(device)?;
            let mine = sharded.caches_for(device)?;
            let caches =
                self.attach_table_caches(&|t, _| Ok(mine[t].clone()), &format!("gpu{device}"))?;
            if shared {
                registry.push((device, Arc::downgrade(&caches), gpu.clone()));
            }
            log::info!(
                "GPU {device}: an instance's lookups read the sharded rows over GPUs {:?}",
                sharded.gpus
            );
            return Ok((gpu, caches));
        }
        let indexed = std::sync::atomic::AtomicUsize::new(0);
        let caches = self.attach_table_caches(
            &|t, geo| {
                let host = self.host(t);
                if self.config.table_ratio(t) >= 1.0 && host.dense_rows().is_some() {
                    gpu.new_resident(&host, geo)
                } else {
                    let rows = self.cache_index_rows(t, &geo);
                    indexed.fetch_add(rows, std::sync::atomic::Ordering::Relaxed);
                    gpu.new_cache(geo, rows)
                }
            },
            &format!("gpu{device}"),
        )?;
        let indexed = indexed.into_inner();
        log::info!(
            "GPU {device}: key indexes of {indexed} keys ({:.2} GB; gpucache_key_index {})",
            indexed as f64 * 4e-9,
            self.config.cache_index.name()
        );
        if shared {
            registry.push((device, Arc::downgrade(&caches), gpu.clone()));
        }
        Ok((gpu, caches))
    }

    /// A view of the store with no caches (lookups go straight to the host tier).
    pub fn attach_caches_none(self: &Arc<Self>) -> Arc<InstanceCaches> {
        Arc::new(InstanceCaches::new(self.clone(), Vec::new(), None))
    }
}
