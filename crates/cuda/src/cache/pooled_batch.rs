//! A pooled lookup through the caches of keys of fixed hotness as sent, every bag read and
//! summed where its rows are ([`BatchLookup::pool_fixed_keys`]): one kernel (`pool_cached`)
//! probes each key's set and adds a hit's row in place, so only pooled rows are written; the
//! misses go to the caller's fetcher as a batch lookup's do, and a second kernel
//! (`pool_missed`) adds their rows to the bags they left unfinished. The fill of the caches
//! then runs as after any batch lookup ([`BatchLookup::fill_last`]).

use std::time::Instant;

use cudarc::driver::PushKernelArg;

use super::batch::BatchLookup;
use super::batch_args::{BatchKeys, BatchTimes, FetchMisses, KeyLayout, RowFormat};
use crate::buffer::DevicePtr;
use crate::context::{cuda_err, gpu};
use crate::copy::{dtod_on, dtoh};
use crate::error::{CudaError, Result};
use crate::kernels::threads_config;
use crate::mem::DeviceView;

impl BatchLookup {
    /// Threads a bag for a pooled lookup of these caches' rows: 16 bytes of the row each, a
    /// divisor of 32 (a bag's threads within one warp); `None` when the rows do not split so.
    pub fn pooled_lanes(&self) -> Option<usize> {
        let bytes = self.dim * self.stored.size();
        let lanes = bytes / 16;
        (bytes % 16 == 0 && lanes > 0 && 32 % lanes == 0).then_some(lanes)
    }

    /// Pools keys of fixed hotness in this GPU's memory (`keys`: int64 `[batch, width]`,
    /// bag (b, t) = keys `b * width + at[t] .. b * width + at[t + 1]`, every bag full) through
    /// the caches, into `[batch, tables, dim]` of `format` ([`BatchLookup::pooled`] until the
    /// next run). A bag's hits are read in place and summed in key order; a bag with misses
    /// then adds their rows (read below the cache by `fetch`, as [`BatchLookup::run`]'s are,
    /// rounded to fp16 over caches of fp16 rows as the caches will keep them) in key order;
    /// the mean divides by the bag's keys. Hits are stamped with `epoch`, and
    /// [`BatchLookup::fill_last`] inserts the misses as after any run. A key below zero
    /// (padding, a bad key) stops the run after the kernel with `negative` counted and nothing
    /// read below the cache, for the caller to take another path.
    #[allow(clippy::too_many_arguments)]
    pub fn pool_fixed_keys<E: From<CudaError>>(
        &mut self,
        keys: DeviceView<'_>,
        width: usize,
        at: &[i32],
        mean: bool,
        format: RowFormat,
        epoch: u64,
        fetch: &mut FetchMisses<'_, E>,
    ) -> std::result::Result<BatchTimes, E> {
        let n = keys.len() / 8;
        let mut times = BatchTimes { keys: n, ..BatchTimes::default() };
        let lanes = self.pooled_lanes().ok_or_else(|| {
            CudaError::internal(format!(
                "pooled lookup: rows of {} bytes do not split into 16-byte lanes of a warp",
                self.dim * self.stored.size()
            ))
        })?;
        if keys.device() != self.queue.device || keys.len() % 8 != 0 {
            return Err(CudaError::internal(format!(
                "pooled lookup: {} bytes of keys on GPU {} for a lookup on GPU {}",
                keys.len(),
                keys.device(),
                self.queue.device
            ))
            .into());
        }
        if n == 0 {
            return Ok(times);
        }
        if n > i32::MAX as usize {
            return Err(
                CudaError::internal("pooled lookup: more than 2^31 keys in one batch").into()
            );
        }
        let t0 = Instant::now();
        let us = |t: Instant| t.elapsed().as_micros() as u64;
        gpu(self.queue.device)?;
        self.last = None;
        self.external = false;
        let interleaved = self.place_layout(KeyLayout::Fixed { width, at }, n)?;
        let (batch, tables, dim) = (n / width, self.tables, self.dim);
        let bags = batch * tables;
        self.make_room(n, false)?;
        self.out.reserve(bags * dim * format.size())?;
        self.partial.reserve(bags * dim * 4)?;
        self.miss_at.reserve(n * 4)?;
        self.missed_bags.reserve(bags * 4)?;
        self.clear_misses(n)?;
        let q = &self.queue;
        // the keys in our buffer: the missed keys' gather and the fill read them there
        // `keys` holds n keys and stays valid through this run, which waits on the queue;
        // the copy is ordered before this run's kernel and any later fill
        dtod_on(&q.stream, self.keys.1.ptr(), DevicePtr::of_view(&keys)?, n * 8)?;
        let k = &self.kernels;
        let kernel = match (self.stored, format) {
            (RowFormat::F32, RowFormat::F32) => &k.pool_cached,
            (RowFormat::F32, RowFormat::F16) => &k.pool_cached_h,
            (RowFormat::F16, RowFormat::F32) => &k.s16.pool_cached,
            (RowFormat::F16, RowFormat::F16) => &k.s16.pool_cached_h,
        };
        let (batch_i, width_i, tables_i, dim_i, lanes_i, mean_i) =
            (batch as i32, width as i32, tables as i32, dim as i32, lanes as i32, i32::from(mean));
        let (d_keys, d_at, desc) = (self.keys.1.ptr(), self.starts.1.ptr(), self.desc.ptr());
        let (d_out, d_partial) = (self.out.ptr(), self.partial.ptr());
        let (d_miss, d_count) = (self.miss.1.ptr(), self.count.1.ptr());
        let (d_miss_at, d_bags) = (self.miss_at.ptr(), self.missed_bags.ptr());
        let mut b = q.stream.launch_builder(kernel);
        b.arg(&d_keys).arg(&batch_i).arg(&width_i).arg(&tables_i).arg(&d_at).arg(&desc);
        b.arg(&dim_i).arg(&lanes_i).arg(&mean_i).arg(&epoch);
        b.arg(&d_out).arg(&d_partial).arg(&d_miss).arg(&d_count).arg(&d_miss_at).arg(&d_bags);
        // SAFETY: argument types and order match pool_cached(_h)(_s16), the one for the
        // caches' rows and `format`; the keys, the table starts (place_layout), the outputs
        // and the miss buffers were sized above for n keys and `bags` bags, and the
        // descriptors name cache slots this lookup holds.
        unsafe { b.launch(threads_config(bags * lanes)) }.map_err(cuda_err)?;
        // the counts come down on our own stream once it has passed the kernel
        self.own.stream.join(&q.stream).map_err(cuda_err)?;
        let h = self.count.0.slice(3)?;
        dtoh(&self.own, h, d_count)?;
        self.own.wait()?;
        let (m, negative, unfinished) =
            ((h[0] as usize).min(n), h[1] as usize, (h[2] as usize).min(bags));
        times.misses = m;
        times.lookup_us = us(t0);
        if negative > 0 {
            times.negative = negative;
            return Ok(times);
        }
        if m > 0 {
            let t1 = Instant::now();
            self.missed_keys_to_host(BatchKeys::Device(keys), m)?;
            let h_miss = self.miss.0.slice(m)?;
            let h_mkeys = self.missed_keys.0.slice(m)?;
            let rows = self.fetched.0.slice(m * dim)?;
            let found = self.found.0.slice(m)?;
            found.fill(0);
            fetch(h_miss, h_mkeys, rows, found)?;
            times.fetch_us = us(t1);
            self.upload_fetched(m)?;
            self.finish_missed(m, unfinished, width, lanes, mean, format)?;
            self.last = Some((m, interleaved));
            self.own.wait()?;
            times.scatter_us = us(t1).saturating_sub(times.fetch_us);
        }
        Ok(times)
    }

    /// On this lookup's own stream, after the fetched rows went up: each missed key's place
    /// among them (`index_misses`), then the `unfinished` bags' sums completed (`pool_missed`).
    fn finish_missed(
        &mut self,
        m: usize,
        unfinished: usize,
        width: usize,
        lanes: usize,
        mean: bool,
        format: RowFormat,
    ) -> Result<()> {
        let q = &self.own;
        let (d_miss, d_miss_at) = (self.miss.1.ptr(), self.miss_at.ptr());
        let m_i = m as i32;
        let mut b = q.stream.launch_builder(&self.kernels.index_misses);
        b.arg(&d_miss).arg(&m_i).arg(&d_miss_at);
        // SAFETY: argument types and order match index_misses; the m indices are < n and
        // `miss_at` holds n entries.
        unsafe { b.launch(threads_config(m)) }.map_err(cuda_err)?;
        let f = match format {
            RowFormat::F32 => &self.kernels.pool_missed,
            RowFormat::F16 => &self.kernels.pool_missed_h,
        };
        let (width_i, tables_i, dim_i, lanes_i, mean_i, bags_i) = (
            width as i32,
            self.tables as i32,
            self.dim as i32,
            lanes as i32,
            i32::from(mean),
            unfinished as i32,
        );
        // a missed row counts as the cache will keep it: rounded to fp16 in caches of fp16
        let round16 = i32::from(self.stored == RowFormat::F16);
        let (d_at, d_bags, d_partial) =
            (self.starts.1.ptr(), self.missed_bags.ptr(), self.partial.ptr());
        let (d_fetched, d_out) = (self.fetched.1.ptr(), self.out.ptr());
        let mut b = q.stream.launch_builder(f);
        b.arg(&width_i).arg(&tables_i).arg(&d_at).arg(&dim_i).arg(&lanes_i).arg(&mean_i);
        b.arg(&round16)
            .arg(&d_bags)
            .arg(&bags_i)
            .arg(&d_partial)
            .arg(&d_miss_at)
            .arg(&d_fetched)
            .arg(&d_out);
        // SAFETY: argument types and order match pool_missed(_h), the one for `format`; the
        // unfinished bags' list, their partial sums and every miss's place were written by
        // the kernels before it (on the queue, which this stream joined, and just above), the
        // fetched rows went up before, and `out` holds every bag.
        unsafe { b.launch(threads_config(unfinished * lanes)) }.map_err(cuda_err)?;
        Ok(())
    }

    /// The pooled rows of the last [`BatchLookup::pool_fixed_keys`] (`bytes` of them), valid
    /// until the next run.
    pub fn pooled(&self, bytes: usize) -> Option<DeviceView<'_>> {
        self.out.view(bytes)
    }
}
