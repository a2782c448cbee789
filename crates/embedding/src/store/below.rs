//! The reads below a store's caches: a table's rows from the host tier (then Redis, then the
//! default value), as f32 or, for a GPU lookup whose tables store fp16, as stored; the check
//! that rows read from a mapped file are still the file's; and a GPU batch's misses read over
//! several tables on the worker pool.

use std::sync::atomic::Ordering;
use std::time::Instant;

use triton_rust_core::error::{Error, Result};

use super::{ns_since, EmbeddingStore};
use crate::host::HostTier;

impl EmbeddingStore {
    /// Reads rows below the cache: host, then remote, then the default vector.
    /// Returns which keys were found (defaults are not worth caching). Fails, naming the
    /// table and its file, when the rows read from the table's file are no longer the file's
    /// as loaded (it was cut or rewritten while mapped: `host_memory: mapped`).
    pub(crate) fn fetch_below_cache(
        &self,
        table: usize,
        keys: &[i64],
        out: &mut [f32],
    ) -> Result<Vec<bool>> {
        let found = self.read_below_cache(table, keys, out);
        self.check_rows(table)?;
        Ok(found)
    }

    /// Whether the rows `table`'s host tier read from its file are still the file's as
    /// loaded (see [`HostTier::check_rows`]): `Err` names the table and the file. Asked after
    /// the reads it covers (once for a batch's reads of a table, not once a read: a mapped
    /// table's check is a `fstat`).
    pub(crate) fn check_rows(&self, table: usize) -> Result<()> {
        self.host(table).check_rows().map_err(|why| {
            Error::unavailable(format!(
                "table '{}': {why}; its rows are not served until the model is loaded again",
                self.tables[table].config.name
            ))
        })
    }

    /// `n` keys of `table` read from its host tier by `read` (which says which it found),
    /// timed and counted in the table's counters.
    fn read_host(
        &self,
        table: usize,
        n: usize,
        read: impl FnOnce(&HostTier, &mut [bool]),
    ) -> Vec<bool> {
        let counters = &self.tables[table].counters;
        let mut found = vec![false; n];
        let t0 = Instant::now();
        read(&self.host(table), &mut found);
        counters.host_ns.fetch_add(ns_since(t0), Ordering::Relaxed);
        let hits = found.iter().filter(|&&f| f).count();
        counters.host_hits.fetch_add(hits as u64, Ordering::Relaxed);
        found
    }

    /// [`EmbeddingStore::fetch_below_cache`]'s reads, without the check of the table's file.
    pub(crate) fn read_below_cache(
        &self,
        table: usize,
        keys: &[i64],
        out: &mut [f32],
    ) -> Vec<bool> {
        let t = &self.tables[table];
        let dim = t.config.dim;
        let mut found = self.read_host(table, keys.len(), |h, f| h.get_many(keys, out, f));
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
                    if n.is_multiple_of(1000) {
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

    /// Whether a GPU lookup's misses may go up as the tables store them, fp16, exactly as
    /// the fp32 path gives them: every table's rows are fp16 from its file, untouched by
    /// updates (their f32 rows would be rounded), no Redis tier below (its rows are f32), and
    /// every default value is exact in fp16.
    #[cfg(feature = "gpu")]
    pub(crate) fn misses_as_stored(&self) -> bool {
        self.remote.is_none()
            && self.tables.iter().all(|t| {
                let host = t.host.read();
                let d = t.config.default_value;
                host.stored() == crate::table::VectorType::F16
                    && host.untouched()
                    && half::f16::from_f32(d).to_f32().to_bits() == d.to_bits()
            })
    }

    /// [`EmbeddingStore::read_below_cache`] of rows fetched as fp16 ([`misses_as_stored`]
    /// said so): the host tier's rows as stored, a key it lacks given the default value.
    ///
    /// [`misses_as_stored`]: EmbeddingStore::misses_as_stored
    #[cfg(any(feature = "gpu", test))]
    pub(crate) fn read_below_cache_f16(
        &self,
        table: usize,
        keys: &[i64],
        out: &mut [u16],
    ) -> Vec<bool> {
        let t = &self.tables[table];
        let dim = t.config.dim;
        let found = self.read_host(table, keys.len(), |h, f| {
            h.get_many_raw(keys, bytemuck::cast_slice_mut(out), f)
        });
        let default = half::f16::from_f32(t.config.default_value).to_bits().to_le();
        for (row, _) in out.chunks_exact_mut(dim).zip(&found).filter(|(_, &f)| !f) {
            row.fill(default);
            t.counters.defaults.fetch_add(1, Ordering::Relaxed);
        }
        found
    }
}

/// Reads the missed rows of several tables below the cache into `rows` (`groups` say
/// which part of `keys` is which table's, in order and together covering `keys`), split
/// over up to 16 runs of at least 256 keys each, on the process's worker pool (rayon:
/// starting that many threads per batch costs ~0.5 ms on a 2-CPU VM,
/// `triton_rust_cuda`'s `examples/pool_vs_spawn.rs`);
/// every run takes an equal share of the keys, cut where the tables change. Reading rows
/// scattered over tens of GB is bound by memory latency, not bandwidth, so more readers help:
/// DLRM at 4096 misses ~575 rows a batch, 0.1–0.3 ms on one thread of the H100 machine, and
/// three runs instead of one served it faster (an H100 run kept in git: `git show 5acfa20:bench/gpu/results/aoti_h100_i/README.md`).
/// How one table's rows are read below the cache into rows of `T` (which were found).
#[cfg(feature = "gpu")]
pub(crate) type ReadTable<T> = fn(&EmbeddingStore, usize, &[i64], &mut [T]) -> Vec<bool>;

/// `read_table` is how one table's rows are read below the cache: as f32
/// ([`EmbeddingStore::read_below_cache`]) or as the table stores them (fp16 bits,
/// [`EmbeddingStore::read_below_cache_f16`]). Each table read is checked once, after
/// every run ([`EmbeddingStore::check_rows`]).
#[cfg(feature = "gpu")]
pub(crate) fn fetch_parallel<T: Send>(
    store: &EmbeddingStore,
    groups: &[(usize, std::ops::Range<usize>)],
    keys: &[i64],
    rows: &mut [T],
    dim: usize,
    read_table: ReadTable<T>,
) -> Result<Vec<bool>> {
    use rayon::prelude::*;
    const PER_RUN: usize = 256;
    let n = keys.len();
    let runs = rayon::current_num_threads().clamp(1, 16).min(n.div_ceil(PER_RUN)).max(1);
    let per = n.div_ceil(runs).max(1);
    let read = |at: usize, rows: &mut [T], found: &mut [bool]| {
        let range = at..at + found.len();
        for (t, g) in groups {
            let (s, e) = (g.start.max(range.start), g.end.min(range.end));
            if s < e {
                let f =
                    read_table(store, *t, &keys[s..e], &mut rows[(s - at) * dim..(e - at) * dim]);
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
    for (t, _) in groups {
        store.check_rows(*t)?;
    }
    Ok(found)
}
