//! The pooled interface's run on an instance: each sample's bag of keys per table reduced to
//! one row, `[batch, tables, dim]`.
//!
//! Four paths, the first that applies:
//! - every table resident on the instance's GPU (`gpucacheper` 1.0, keys `0..rows`): one
//!   kernel reads the bags where the keys are (a client's CUDA shared memory as it is) and
//!   writes only the pooled rows ([`ResidentPool`]);
//! - a GPU instance with fixed hotness and the keys in its GPU's memory: every key looked up
//!   through the GPU caches in one pass as sent, each bag's hits summed from the caches'
//!   slots as they are found and its misses added once read (`BatchLookup::set_pooling`;
//!   the rows written out and reduced by [`Pooler::pool_fixed`] where that does not apply),
//!   when every bag is full and no key is negative;
//! - a GPU instance otherwise: the bags laid out on the host ([`Bags`]), every key looked up
//!   through the GPU caches in one pass, the rows reduced there ([`Pooler`]);
//! - a CPU instance: the same bags, summed on the host ([`pool::pool`]).
//!
//! A batch with a key that is no row of its table (negative, past it, or only in the host
//! tier since an update) leaves the first path for one that reads below the GPU; padding or a
//! negative key leaves the second for the third, whose bags leave padding out and which names
//! a bad key in its error.

use std::borrow::Cow;

use triton_rust_core::batch::BatchTensor;
use triton_rust_core::engine::OutputView;
use triton_rust_core::error::{Error, Result};
use triton_rust_core::tensor::{Bytes, DataType};
#[cfg(feature = "gpu")]
use triton_rust_embedding::gpu::{
    BagLayout, BatchKeys, BatchLookup, GpuInstance, KeyLayout, PoolSpec, Pooler, ResidentPool,
    RowFormat,
};
use triton_rust_embedding::InstanceCaches;

use crate::model::Model;
#[cfg(feature = "gpu")]
use crate::pool::bag_starts;
use crate::pool::{self, Bags};
use crate::rows::as_i32;
#[cfg(feature = "gpu")]
use crate::settings::Combiner;

/// One instance's pooled lookups: what it keeps from batch to batch.
#[derive(Default)]
#[cfg_attr(not(feature = "gpu"), allow(dead_code))]
pub(crate) struct PooledRun {
    /// The bags of the host-side paths, refilled for each batch.
    bags: Bags,
    /// Keys that came unaligned or in GPU memory, read into memory this instance keeps.
    key_scratch: Vec<i64>,
    /// Where each table's bag starts in a sample (fixed hotness: `tables + 1` entries).
    hot_at: Vec<i32>,
    /// A ragged batch's bag starts (`batch × tables + 1`), refilled for each batch.
    ragged_at: Vec<i32>,
    /// A GPU instance's reduction of looked-up rows (the second path).
    #[cfg(feature = "gpu")]
    pub(crate) pooler: Option<Pooler>,
    /// A GPU instance whose every table is resident: the one-kernel lookup (the first path).
    #[cfg(feature = "gpu")]
    pub(crate) resident: Option<ResidentPool>,
    /// A GPU instance's reads of keys sent in GPU memory, for the host-side bags.
    #[cfg(feature = "gpu")]
    pub(crate) keys_reader: Option<triton_rust_cuda::HostReader>,
}

/// How a GPU instance writes a model's pooled rows: as its output's type says.
#[cfg(feature = "gpu")]
pub(crate) fn pooled_format(m: &Model) -> RowFormat {
    if m.rows_type == DataType::F16 {
        RowFormat::F16
    } else {
        RowFormat::F32
    }
}

/// Whether the second path pools as it looks up (`BatchLookup::set_pooling`): yes unless
/// `TRITON_RUST_POOL_FROM_SLOTS=0` in the server's environment (read once), which writes
/// every key's row out and pools those, as before.
#[cfg(feature = "gpu")]
fn pool_from_slots() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TRITON_RUST_POOL_FROM_SLOTS").map_or(true, |v| v != "0"))
}

/// Whether a pooling lookup reads each missed (table, key) of a batch once (`PoolSpec::once`):
/// only with `TRITON_RUST_MISSES_ONCE=1` in the server's environment (read once). Off by
/// default until a GPU run has checked and timed it (written after the last device call);
/// off, a row is read as often as the batch's keys miss it.
#[cfg(feature = "gpu")]
fn misses_once() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TRITON_RUST_MISSES_ONCE").is_ok_and(|v| v == "1"))
}

/// A tensor's bytes on the host: as they are, or copied from GPU memory.
fn host_copy<'t>(t: &'t BatchTensor<'_>) -> Result<Cow<'t, [u8]>> {
    match t.bytes() {
        Some(Bytes::Host(b)) => Ok(Cow::Borrowed(b)),
        #[cfg(feature = "gpu")]
        Some(Bytes::Device(v)) => {
            let mut buf = vec![0u8; v.len()];
            use triton_rust_core::tensor::{BytesMut, DeviceOps};
            triton_rust_cuda::Cuda
                .copy(Bytes::Device(v), BytesMut::Host(&mut buf))
                .map_err(|e| Error::internal(format!("input '{}' from the GPU: {e}", t.name)))?;
            Ok(Cow::Owned(buf))
        }
        #[cfg(not(feature = "gpu"))]
        Some(Bytes::Device(_)) => Err(Error::unsupported(format!(
            "input '{}' in GPU memory: this build of the embedding engine has no GPU (feature `gpu`)",
            t.name
        ))),
        None => Err(Error::internal(format!("input '{}' has no bytes yet", t.name))),
    }
}

/// A ragged batch's `LENGTHS` on the host.
fn lengths_of(t: &BatchTensor<'_>) -> Result<Vec<i32>> {
    Ok(as_i32(&host_copy(t)?))
}

/// `raw` as int64 keys: in place when aligned, else read into `scratch`.
fn keys_of<'k>(raw: &'k [u8], scratch: &'k mut Vec<i64>) -> &'k [i64] {
    match bytemuck::try_cast_slice::<u8, i64>(raw) {
        Ok(keys) if cfg!(target_endian = "little") => keys,
        _ => {
            scratch.clear();
            scratch.extend(
                raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))),
            );
            scratch
        }
    }
}

impl PooledRun {
    pub(crate) fn new(hotness: &[usize]) -> PooledRun {
        let hot_at = std::iter::once(0)
            .chain(hotness.iter().scan(0i32, |a, &h| {
                *a += h as i32;
                Some(*a)
            }))
            .collect();
        PooledRun { hot_at, ..PooledRun::default() }
    }

    /// The first path: `Ok(Some(batch))` when every table is resident and the batch's
    /// pooled rows are complete, in `out` when given, else in the resident pool's buffer;
    /// `Ok(None)` when the batch needs another path.
    #[cfg(feature = "gpu")]
    pub(crate) fn run_resident(
        &mut self,
        m: &Model,
        caches: &InstanceCaches,
        inputs: &[BatchTensor<'_>],
        out: Option<&mut triton_rust_cuda::DeviceViewMut<'_>>,
    ) -> Result<Option<usize>> {
        let PooledRun { key_scratch, hot_at, ragged_at, resident, .. } = self;
        let (Some(pool), Some(pooling)) = (resident.as_mut(), m.settings.pooling.as_ref()) else {
            return Ok(None);
        };
        let keys = match inputs.first().and_then(|t| t.bytes()) {
            // the kernel reads keys as int64: an unaligned address takes the host path
            Some(Bytes::Device(v)) if v.raw_addr().is_some_and(|a| a % 8 == 0) => {
                BatchKeys::Device(v)
            }
            Some(Bytes::Host(raw)) => BatchKeys::Host(keys_of(raw, key_scratch)),
            _ => return Ok(None),
        };
        let tables = hot_at.len() - 1;
        let (layout, batch) = if m.lengths_input() {
            let lengths = lengths_of(&inputs[1])?;
            *ragged_at = bag_starts(keys.len(), &lengths)?;
            (BagLayout::Ragged { at: ragged_at }, lengths.len() / tables.max(1))
        } else {
            let width = pooling.width().max(1);
            (BagLayout::Fixed { width, at: hot_at }, keys.len() / width)
        };
        let mean = pooling.combiner == Combiner::Mean;
        let clock = std::time::Instant::now();
        let on_gpu = matches!(keys, BatchKeys::Device(_));
        // sharded rows: ordered with updates written on the GPU that holds a table (run
        // waits for its kernel)
        let order = caches.update_order();
        let misses = pool.run(keys, layout, batch, mean, out)?;
        drop(order);
        log::debug!(
            "timing: resident pooled lookup: samples {batch}, keys {}, kernel and wait {} us ({})",
            keys.len(),
            clock.elapsed().as_micros(),
            if on_gpu { "keys in GPU memory" } else { "keys in host memory" }
        );
        if misses > 0 {
            // the batch goes on by another path, which counts its keys
            log::debug!("pooled lookup: {misses} keys of {batch} samples are no resident row; reading below the GPU");
            return Ok(None);
        }
        caches.count_resident(&keys_per_table(layout, tables, batch));
        Ok(Some(batch))
    }

    /// The second path: fixed hotness with the keys in this instance's GPU memory, looked up
    /// through the caches as sent and pooled there, no trip to the host. `Ok(false)`, the
    /// rows not handed on, when it does not apply or a bag has padding or a key is negative
    /// (the host-side bags then, which leave padding out and name a bad key).
    #[cfg(feature = "gpu")]
    fn run_as_sent(
        &mut self,
        m: &Model,
        caches: &InstanceCaches,
        (instance, lookup): &mut (GpuInstance, BatchLookup),
        inputs: &[BatchTensor<'_>],
        wanted: bool,
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<bool> {
        let (Some(pooler), Some(pooling), Some(Bytes::Device(v))) =
            (self.pooler.as_mut(), m.settings.pooling.as_ref(), inputs[0].bytes())
        else {
            return Ok(false);
        };
        let width = pooling.width().max(1);
        let aligned = v.raw_addr().is_some_and(|a| a % 8 == 0);
        if m.lengths_input()
            || !aligned
            || v.device() != instance.device()
            || v.len() % (8 * width) != 0
        {
            return Ok(false);
        }
        let clock = std::time::Instant::now();
        let batch = v.len() / 8 / width;
        let layout = KeyLayout::Fixed { width, at: &self.hot_at };
        let mean = pooling.combiner == Combiner::Mean;
        // the lookup pools as it looks up where it can (the hits summed from the caches'
        // slots, never written out), else hands the rows to the pooler
        let spec = PoolSpec { mean, format: pooled_format(m), once: misses_once() };
        lookup.set_pooling(pool_from_slots().then_some(spec));
        let negative =
            caches.lookup_batch_device(BatchKeys::Device(v), layout, instance, lookup, None)?;
        if negative > 0 || batch == 0 {
            return Ok(false);
        }
        let looked_us = clock.elapsed().as_micros();
        let (tables, dim) = (caches.store().table_count(), caches.store().dim(0));
        let dtype = m.rows_type;
        let (pooled, from_slots) = match lookup.pooled() {
            Some(rows) => (rows, true),
            None => {
                let rows = lookup
                    .rows(batch * width * dim)
                    .ok_or_else(|| Error::internal("pooled lookup: no rows"))?;
                let (f, at) = (lookup.format(), &self.hot_at);
                (pooler.pool_fixed(&rows, f, dim, width, at, batch, mean, spec.format)?, false)
            }
        };
        let pooled_us = clock.elapsed().as_micros();
        if wanted {
            let shape = [batch as i64, tables as i64, dim as i64];
            let name = m.sig.outputs[0].name.as_str();
            sink(OutputView { name, dtype, shape: &shape, data: Bytes::Device(pooled) })?;
        }
        log::debug!(
            "timing: pooled lookup: keys {}, lookup {looked_us} us, pooling {} us, rows handed on {} us (the keys as sent{})",
            batch * width,
            pooled_us - looked_us,
            clock.elapsed().as_micros() - pooled_us,
            if from_slots { ", pooled from the caches' slots" } else { "" }
        );
        Ok(true)
    }

    /// Runs a batch and hands its pooled rows to `sink` when `wanted`.
    pub(crate) fn run(
        &mut self,
        m: &Model,
        caches: &InstanceCaches,
        #[cfg(feature = "gpu")] gpu: Option<&mut (GpuInstance, BatchLookup)>,
        inputs: &[BatchTensor<'_>],
        wanted: bool,
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let pooling = m
            .settings
            .pooling
            .as_ref()
            .ok_or_else(|| Error::internal("the pooled interface has no hotness"))?;
        let store = caches.store();
        let (tables, dim) = (store.table_count(), store.dim(0));
        let name = m.sig.outputs[0].name.as_str();
        let dtype = m.rows_type;
        #[cfg(feature = "gpu")]
        if let Some(batch) = self.run_resident(m, caches, inputs, None)? {
            if wanted {
                let shape = [batch as i64, tables as i64, dim as i64];
                let rows = self
                    .resident
                    .as_ref()
                    .and_then(|p| p.rows(batch))
                    .ok_or_else(|| Error::internal("pooled lookup: no rows"))?;
                sink(OutputView { name, dtype, shape: &shape, data: Bytes::Device(rows) })?;
            }
            return Ok(());
        }
        #[cfg(feature = "gpu")]
        let clock = std::time::Instant::now();
        #[cfg(feature = "gpu")]
        let mut gpu = gpu;
        #[cfg(feature = "gpu")]
        if let Some(g) = gpu.as_deref_mut() {
            if self.run_as_sent(m, caches, g, inputs, wanted, sink)? {
                return Ok(());
            }
        }
        #[cfg(feature = "gpu")]
        let raw = match (inputs[0].bytes(), self.keys_reader.as_mut()) {
            (Some(Bytes::Device(v)), Some(reader)) => {
                Cow::Borrowed(reader.read(&v).map_err(|e| {
                    Error::internal(format!("input '{}' from the GPU: {e}", inputs[0].name))
                })?)
            }
            _ => host_copy(&inputs[0])?,
        };
        #[cfg(not(feature = "gpu"))]
        let raw = host_copy(&inputs[0])?;
        let PooledRun { bags, key_scratch, .. } = self;
        let keys = keys_of(&raw, key_scratch);
        // a negative key (the requests' checks read none, unless the model has vocabulary
        // sizes) fails the batch here as a client's error, and the server runs each request
        // of it alone, so that only the one that sent it fails; a batch whose keys are all
        // rows never comes here on a GPU instance with resident tables
        let ragged = m.lengths_input();
        let least = if ragged { 0 } else { crate::settings::PAD };
        if let Some((i, k)) = crate::model::first_below(keys, least) {
            return Err(crate::model::negative_key(&m.sig.inputs[0].name, i, k, ragged));
        }
        if ragged {
            let lengths = lengths_of(&inputs[1])?;
            bags.refill_ragged(tables, keys, &lengths)?;
        } else {
            bags.refill_fixed(pooling, keys);
        }
        let batch = bags.batch();
        let shape = [batch as i64, tables as i64, dim as i64];
        #[cfg(feature = "gpu")]
        if let (Some((instance, lookup)), Some(pooler), false) =
            (gpu, self.pooler.as_mut(), bags.is_empty())
        {
            // every table's keys of the batch in one lookup, table after table; the bags
            // reduced where the rows are
            let (flat, counts, offsets) = bags.table_major();
            let bags_us = clock.elapsed().as_micros();
            caches.lookup_batch_device(
                BatchKeys::Host(flat),
                KeyLayout::Blocked(counts),
                instance,
                lookup,
                None,
            )?;
            let rows = lookup
                .rows(flat.len() * dim)
                .ok_or_else(|| Error::internal("pooled lookup: no rows"))?;
            let format = pooled_format(m);
            let mean = pooling.combiner == Combiner::Mean;
            let looked_us = clock.elapsed().as_micros();
            let pooled = pooler.pool(&rows, lookup.format(), dim, offsets, batch, mean, format)?;
            let pooled_us = clock.elapsed().as_micros();
            if wanted {
                sink(OutputView { name, dtype, shape: &shape, data: Bytes::Device(pooled) })?;
            }
            log::debug!(
                "timing: pooled lookup: keys {}, bags {bags_us} us, lookup {} us, pooling {} us, rows handed on {} us",
                flat.len(),
                looked_us - bags_us,
                pooled_us - looked_us,
                clock.elapsed().as_micros() - pooled_us
            );
            return Ok(());
        }
        let mut rows = vec![0f32; batch * tables * dim];
        pool::pool(caches, bags, pooling.combiner, dim, &mut rows)?;
        if wanted {
            if dtype == DataType::F16 {
                let halves: Vec<half::f16> = rows.iter().map(|&v| half::f16::from_f32(v)).collect();
                let data = Bytes::Host(bytemuck::cast_slice(&halves));
                sink(OutputView { name, dtype, shape: &shape, data })?;
            } else {
                let data = Bytes::Host(bytemuck::cast_slice(&rows));
                sink(OutputView { name, dtype, shape: &shape, data })?;
            }
        }
        Ok(())
    }
}

/// Keys each table's bags hold in a batch of `batch` samples laid out as `layout` (a fixed
/// layout counts its bags' whole width, as sent).
#[cfg(feature = "gpu")]
fn keys_per_table(layout: BagLayout<'_>, tables: usize, batch: usize) -> Vec<usize> {
    let mut per = vec![0usize; tables];
    match layout {
        BagLayout::Fixed { at, .. } => {
            for (t, n) in per.iter_mut().enumerate() {
                let width = at.get(t + 1).zip(at.get(t)).map_or(0, |(e, s)| (e - s).max(0));
                *n = batch * width as usize;
            }
        }
        BagLayout::Ragged { at } => {
            for (i, w) in at.windows(2).enumerate() {
                per[i % tables.max(1)] += (w[1] - w[0]).max(0) as usize;
            }
        }
    }
    per
}

#[cfg(all(test, feature = "gpu"))]
mod tests {
    use super::{keys_per_table, BagLayout};

    #[test]
    fn a_resident_lookup_counts_each_tables_keys() {
        // fixed: hotness 3, 1, 2 over 4 samples
        let at = [0, 3, 4, 6];
        assert_eq!(keys_per_table(BagLayout::Fixed { width: 6, at: &at }, 3, 4), vec![12, 4, 8]);
        // ragged: 2 samples x 2 tables, bags of 1, 0 | 3, 2 keys
        let starts = [0, 1, 1, 4, 6];
        assert_eq!(keys_per_table(BagLayout::Ragged { at: &starts }, 2, 2), vec![4, 2]);
    }
}
