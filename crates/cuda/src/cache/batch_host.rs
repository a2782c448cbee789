//! A [`BatchLookup`]'s work beyond the lookup itself: misses fetched by the caller in parts
//! that go up as they are filled, or read in place from host rows the GPU maps, and the fill
//! of the caches with the last run's misses.

use std::sync::Arc;

use cudarc::driver::PushKernelArg;

use super::BatchLookup;
use crate::buffer::DeviceMem;
use crate::cache::{FetchMisses, FetchedRows, RowFormat};
use crate::context::{cuda_err, gpu};
use crate::copy::{dtoh, htod, htod_now, zero};
use crate::error::{CudaError, Result};
use crate::kernels::{threads_config, warps_config, HOST_DESC, HOST_ROWS_PER_WARP};
use crate::pinned::HostRows;

impl BatchLookup {
    /// Every table's rows in host memory this GPU maps (`tables[t]`: its rows and the
    /// default value of a key past them), for runs that read their misses there
    /// ([`BatchLookup::read_misses_on_gpu`]) instead of calling the fetcher.
    pub fn set_host_rows(&mut self, tables: &[(Arc<HostRows>, f32)]) -> Result<()> {
        if tables.len() != self.tables {
            return Err(CudaError::internal("batch lookup: host rows for another table count"));
        }
        let d = self.queue.device;
        let mut fields = Vec::with_capacity(tables.len() * HOST_DESC);
        for (rows, default) in tables {
            let addr = rows.device_addr(d)? as i64;
            let v = [addr, rows.rows() as i64, rows.elem() as i64, default.to_bits() as i64];
            fields.extend_from_slice(&v);
        }
        let mut desc = DeviceMem::growing(d);
        desc.reserve(fields.len().max(1) * 8)?;
        htod_now(d, desc.ptr(), &fields)?;
        self.host = Some((desc, tables.iter().map(|(r, _)| r.clone()).collect()));
        Ok(())
    }

    /// Whether the next runs read their misses from the host rows the GPU maps: when they are
    /// set and `now()` says so (asked only then), the fetcher is not called, and
    /// [`BatchLookup::host_read`] tells what was read.
    pub fn read_misses_on_gpu(&mut self, now: impl FnOnce() -> bool) {
        self.host_on = self.host.is_some() && now();
    }

    /// After a run whose misses the GPU read from host memory: each table's misses, then
    /// each table's keys past its rows (given the default value).
    pub fn host_read(&self) -> Option<&[u32]> {
        self.host_read.as_deref()
    }

    /// The `m` missed rows read in place from the host rows the GPU maps, into the fetched
    /// rows' buffer with their flags, and the per-table counts queued back to the host.
    pub(super) fn read_host(&mut self, m: usize, interleaved: i32) -> Result<()> {
        let (q, dim, tables) = (&self.own, self.dim, self.tables);
        let Some((desc, _)) = &self.host else { return Ok(()) };
        self.fetched.1.reserve(m * dim * 4)?; // fp32's room whatever the type, as scatter_fetched
        self.found.1.reserve(m)?;
        self.host_counts.1.reserve(2 * tables * 4)?;
        let counts = self.host_counts.1.ptr();
        zero(q, counts, 2 * tables * 4)?;
        let (keys, miss, starts) = (self.keys.1.ptr(), self.miss.1.ptr(), self.starts.1.ptr());
        let (rows, found, host) = (self.fetched.1.ptr(), self.found.1.ptr(), desc.ptr());
        let (m_i, tables_i, dim_i) = (m as i32, tables as i32, dim as i32);
        let read = match self.fetched_as {
            RowFormat::F32 => &self.kernels.read_host,
            RowFormat::F16 => &self.kernels.read_host_r16,
        };
        let mut b = q.stream.launch_builder(read);
        b.arg(&keys).arg(&miss).arg(&m_i).arg(&tables_i).arg(&interleaved).arg(&starts);
        b.arg(&host).arg(&dim_i).arg(&rows).arg(&found).arg(&counts);
        // SAFETY: argument types and order match read_host_rows(_r16), its rows of
        // `fetched_as`; this stream passed the
        // lookup that wrote the m misses (`count_misses`); the rows and flags have room for
        // m, the counts for 2 × tables; `host` names rows registered while `self.host` lives.
        unsafe { b.launch(warps_config(m.div_ceil(HOST_ROWS_PER_WARP))) }.map_err(cuda_err)?;
        dtoh(q, self.host_counts.0.slice(2 * tables)?, counts)
    }

    /// The fetcher called on the `m` misses part after part, each part's rows queued up to
    /// the GPU as soon as it is filled: a part's trip up overlaps the reads of the next
    /// (page-locked rows, copied on this lookup's stream). Parts of at least `FETCH_PART`
    /// misses, at most `FETCH_PARTS` of them. The fetcher may reorder each part's misses.
    pub(super) fn fetch_in_parts<E: From<CudaError>>(
        &mut self,
        m: usize,
        fetch: &mut FetchMisses<'_, E>,
    ) -> std::result::Result<(), E> {
        // a part's reads are split again over the fetcher's threads: small parts pay that
        // split more than their overlap gains (in miss_reads_bench, whose reader starts its
        // threads per call, 8 parts of 16,384 made a 131,072-miss batch 0.35x as fast as one
        // part on an H200's 16 threads; bench/gpu/results/miss-path/)
        const FETCH_PART: usize = 65_536;
        const FETCH_PARTS: usize = 4;
        let dim = self.dim;
        // room for fp32 rows whatever their type, so a change of type never grows the buffer
        // under a queued fill
        self.fetched.1.reserve(m * dim * 4)?;
        let per = m.div_ceil(FETCH_PARTS).max(FETCH_PART);
        let (q, d_rows) = (&self.own, self.fetched.1.ptr());
        let h_miss = self.miss.0.slice(m)?;
        let h_mkeys = self.missed_keys.0.slice(m)?;
        let found = self.found.0.slice(m)?;
        found.fill(0);
        let mut rows = match self.fetched_as {
            RowFormat::F32 => FetchedRows::F32(self.fetched.0.slice(m * dim)?),
            RowFormat::F16 => FetchedRows::F16(self.fetched16.slice(m * dim)?),
        };
        for at in (0..m).step_by(per) {
            let end = (at + per).min(m);
            let (rs, re) = (at * dim, end * dim);
            let part = match &mut rows {
                FetchedRows::F32(r) => FetchedRows::F32(&mut r[rs..re]),
                FetchedRows::F16(r) => FetchedRows::F16(&mut r[rs..re]),
            };
            fetch(&mut h_miss[at..end], &mut h_mkeys[at..end], part, &mut found[at..end])?;
            // queued, not waited for: the next part's reads run meanwhile
            match &rows {
                FetchedRows::F32(r) => htod(q, d_rows.at(rs * 4), &r[rs..re])?,
                FetchedRows::F16(r) => htod(q, d_rows.at(rs * 2), &r[rs..re])?,
            }
        }
        Ok(())
    }

    /// Queues the insertion of the last run's rows found below the cache into the caches
    /// (stamped with `epoch`) and returns without waiting: the next run's work queues
    /// behind it. At most once per run; nothing to do when the last run had no misses.
    /// Two kernels (three with an LFU cache: its keys' misses counted first): the fill, then
    /// the reset of the ticket counts of the sets it touched
    /// (one launch where clearing every table's tickets took one copy-engine memset per
    /// table on the shared queue).
    pub fn fill_last(&mut self, epoch: u64) -> Result<()> {
        let Some((m, interleaved, fetched)) = self.last.take() else { return Ok(()) };
        let q = &self.queue;
        gpu(q.device)?;
        // the rows, flags and miss order came up on this lookup's own stream
        q.stream.join(&self.own.stream).map_err(cuda_err)?;
        let (keys, miss, found, starts, rows) = (
            self.keys.1.ptr(),
            self.miss.1.ptr(),
            self.found.1.ptr(),
            self.starts.1.ptr(),
            self.fetched.1.ptr(),
        );
        let (m_i, tables, dim_i, desc) =
            (m as i32, self.tables as i32, self.dim as i32, self.desc.ptr());
        let k = &self.kernels;
        let fill = match (self.stored, fetched) {
            (RowFormat::F32, RowFormat::F32) => &k.fill,
            (RowFormat::F16, RowFormat::F32) => &k.s16.fill,
            (RowFormat::F32, RowFormat::F16) => &k.fill_r16,
            (RowFormat::F16, RowFormat::F16) => &k.s16.fill_r16,
        };
        if self.lfu {
            // LFU: every placed key's miss counted before any is placed
            let mut c = q.stream.launch_builder(&self.kernels.fill_count);
            c.arg(&keys).arg(&miss).arg(&found).arg(&m_i).arg(&tables).arg(&interleaved);
            c.arg(&starts).arg(&desc);
            // SAFETY: argument types and order match batch_fill_count; the fill's buffers,
            // read before it on the same queue.
            unsafe { c.launch(threads_config(m)) }.map_err(cuda_err)?;
        }
        let mut b = q.stream.launch_builder(fill);
        b.arg(&keys)
            .arg(&miss)
            .arg(&found)
            .arg(&m_i)
            .arg(&tables)
            .arg(&interleaved)
            .arg(&starts)
            .arg(&desc)
            .arg(&dim_i)
            .arg(&epoch)
            .arg(&rows);
        // SAFETY: argument types and order match batch_fill(_s16)(_r16), the one for the
        // caches' rows and the fetched rows' type; the buffers hold the last
        // run's keys, misses, flags and rows (m of each), untouched since, and stay
        // allocated until the queue has passed this kernel (see `make_room` and `Drop`).
        unsafe { b.launch(warps_config(m)) }.map_err(cuda_err)?;
        let mut r = q.stream.launch_builder(&self.kernels.fill_reset);
        r.arg(&keys).arg(&miss).arg(&found).arg(&m_i).arg(&tables).arg(&interleaved);
        r.arg(&starts).arg(&desc);
        let cfg = threads_config(m);
        // SAFETY: argument types and order match batch_fill_reset; the same buffers as the
        // fill's, read after it on the same queue.
        unsafe { r.launch(cfg) }.map_err(cuda_err)?;
        self.fill_queued = true;
        Ok(())
    }
}
