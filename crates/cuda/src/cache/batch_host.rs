//! A [`BatchLookup`]'s work beyond the lookup itself: the misses down to the host, fetched by
//! the caller in parts that go up as they are filled (their order back after them), or read
//! in place from host rows the GPU maps, and the fill of the caches with the last run's misses.

use std::sync::Arc;

use cudarc::driver::PushKernelArg;

use super::BatchLookup;
use crate::buffer::{DeviceMem, DevicePtr};
use crate::cache::{BatchKeys, FetchMisses, FetchedRows, RowFormat};
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

    /// The blocks of 256 threads the GPU's in-place reads run on (0: a warp for every four
    /// misses, as many as the GPU holds). Reads over the bus wait long on each row: a grid
    /// sized to the misses fills every SM with waiting warps, and a network on another stream
    /// waits for them; a few blocks stepping over the misses keep as many reads in flight.
    pub fn set_gpu_read_blocks(&mut self, blocks: u32) {
        self.read_blocks = blocks;
    }

    /// With host rows set, whether each run shares its misses between the GPU reading them
    /// in place and the fetcher's host threads (while `read_misses_on_gpu` allows the GPU):
    /// the GPU takes the first share of the miss list on a stream of its own while the
    /// fetcher reads the rest, the share set so both finish together by each side's rate
    /// measured over the last runs (rows a second, the GPU's by events around its kernel).
    pub fn share_misses(&mut self, on: bool) {
        if on != self.share.is_some() {
            self.share = on.then(MissShare::new);
        }
    }

    /// The rates the share is set by: (GPU, host threads), rows a second; `None` unless sharing.
    pub fn share_rates(&self) -> Option<(f64, f64)> {
        self.share.as_ref().map(|s| (s.gpu, s.host))
    }

    /// The `m` missed rows read in place from the host rows the GPU maps, into the fetched
    /// rows' buffer with their flags, and the per-table counts queued back to the host; on
    /// this lookup's own stream, or with `side` on the side stream (after `own`'s work so
    /// far: the miss list), timed by events for the share.
    pub(super) fn read_host(&mut self, m: usize, interleaved: i32, side: bool) -> Result<()> {
        let (dim, tables) = (self.dim, self.tables);
        let q = if side { &self.side } else { &self.own };
        if side {
            q.stream.join(&self.own.stream).map_err(cuda_err)?;
        }
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
        let mut warps = m.div_ceil(HOST_ROWS_PER_WARP);
        if self.read_blocks > 0 {
            warps = warps.min(self.read_blocks as usize * 8);
        }
        let mut b = q.stream.launch_builder(read);
        b.arg(&keys).arg(&miss).arg(&m_i).arg(&tables_i).arg(&interleaved).arg(&starts);
        b.arg(&host).arg(&dim_i).arg(&rows).arg(&found).arg(&counts);
        // SAFETY: argument types and order match read_host_rows(_r16), its rows of
        // `fetched_as`; this stream passed the
        // lookup that wrote the m misses (`count_misses`); the rows and flags have room for
        // m, the counts for 2 × tables; `host` names rows registered while `self.host` lives.
        let timed = match self.share.as_mut().filter(|_| side) {
            Some(share) => Some(share.start(&q.stream)?),
            None => None,
        };
        unsafe { b.launch(warps_config(warps)) }.map_err(cuda_err)?;
        if let (Some(share), Some(())) = (self.share.as_mut(), timed) {
            share.end(&q.stream, m)?;
        }
        dtoh(q, self.host_counts.0.slice(2 * tables)?, counts)
    }

    /// The `m` missed indices to the host, and their keys beside them (gathered on the GPU
    /// when the keys are there).
    pub(super) fn missed_keys_to_host(&mut self, keys: BatchKeys<'_>, m: usize) -> Result<()> {
        let q = &self.own;
        let h_miss = self.miss.0.slice(m)?;
        dtoh(q, h_miss, self.miss.1.ptr())?;
        q.wait()?;
        let h_mkeys = self.missed_keys.0.slice(m)?;
        match keys {
            BatchKeys::Host(keys) => {
                for (k, &i) in h_mkeys.iter_mut().zip(h_miss.iter()) {
                    *k = keys[i as usize];
                }
            }
            BatchKeys::Device(_) => {
                self.missed_keys.1.reserve(m * 8)?;
                let (d_keys, d_miss) = (self.keys.1.ptr(), self.miss.1.ptr());
                let d_mkeys = self.missed_keys.1.ptr();
                let m_i = m as i32;
                let mut b = q.stream.launch_builder(&self.kernels.gather_keys);
                b.arg(&d_keys).arg(&d_miss).arg(&m_i).arg(&d_mkeys);
                let cfg = threads_config(m);
                // SAFETY: argument types and order match gather_keys; the m indices in
                // `d_miss` are < n, `d_keys` holds n keys and `d_mkeys` room for m.
                unsafe { b.launch(cfg) }.map_err(cuda_err)?;
                dtoh(q, h_mkeys, d_mkeys)?;
                q.wait()?;
            }
        }
        Ok(())
    }

    /// The flags and the miss list (in the fetcher's order) of the rows `from..m`
    /// [`BatchLookup::fetch_in_parts`] sent up, and the scatter of all `m` rows into place
    /// queued (the first `from` the GPU read in place, their flags and order on the GPU).
    pub(super) fn scatter_fetched(
        &mut self,
        from: usize,
        m: usize,
        into: Option<DevicePtr<'_>>,
    ) -> Result<()> {
        let q = &self.own;
        let found = self.found.0.slice(m)?;
        self.found.1.reserve(m)?;
        htod(q, self.found.1.ptr().at(from), &found[from..])?;
        // the miss list, in the fetcher's order, goes back as the scatter's indices
        let (h_miss, d_miss) = (self.miss.0.slice(m)?, self.miss.1.ptr());
        htod(q, d_miss.at(from * 4), &h_miss[from..])?;
        self.scatter(m, into)
    }

    /// The fetcher called on the `m` misses part after part, each part's rows queued up to
    /// the GPU as soon as it is filled: a part's trip up overlaps the reads of the next
    /// (page-locked rows, copied on this lookup's stream). The last part is short (16,384
    /// misses, or `TRITON_RUST_LAST_PART`): only its trip up is left when the reads end; the
    /// parts before it hold at least 131,072 misses, at most `FETCH_PARTS` parts in all (see
    /// [`part_ends`]). The fetcher may reorder each part's misses. Only misses `from..m` are
    /// the fetcher's (the GPU reads the first `from`).
    pub(super) fn fetch_in_parts<E: From<CudaError>>(
        &mut self,
        from: usize,
        m: usize,
        fetch: &mut FetchMisses<'_, E>,
    ) -> std::result::Result<(), E> {
        // a part's reads are split again over the fetcher's threads: small parts pay that
        // split more than their overlap gains (in miss_reads_bench, whose reader starts its
        // threads per call, 8 parts of 16,384 made a 131,072-miss batch 0.35x as fast as one
        // part on an H200's 16 threads; bench/gpu/results/miss-path/). Served (MLPerf
        // DLRM-v2 at a 10% cache, 165,000 misses a batch, one H200), two parts, the last of
        // 16,384, served 1.03x, 1.04x and 0.99x three parts of at least 65,536 in three
        // calls, the readers' rows a busy core 1.05-1.14x (bench/gpu/results/cache-runs/,
        // section `parts`); the misses before the short last part in parts of at least
        // 131,072 (one there)
        const FETCH_PARTS: usize = 4;
        let last = last_part();
        let fetch_part = if last == 0 { 65_536 } else { 131_072 };
        let dim = self.dim;
        // room for fp32 rows whatever their type, so a change of type never grows the buffer
        // under a queued fill
        self.fetched.1.reserve(m * dim * 4)?;
        let ends = part_ends(from, m, fetch_part, FETCH_PARTS, last);
        let (q, d_rows) = (&self.own, self.fetched.1.ptr());
        let h_miss = self.miss.0.slice(m)?;
        let h_mkeys = self.missed_keys.0.slice(m)?;
        let found = self.found.0.slice(m)?;
        found[from..].fill(0);
        let mut rows = match self.fetched_as {
            RowFormat::F32 => FetchedRows::F32(self.fetched.0.slice(m * dim)?),
            RowFormat::F16 => FetchedRows::F16(self.fetched16.slice(m * dim)?),
        };
        let mut at = from;
        for end in ends {
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
            at = end;
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
        gpu(self.queue.device)?;
        let stream = self.queue.stream.clone();
        // the rows, flags and miss order came up on this lookup's own stream
        stream.join(&self.own.stream).map_err(cuda_err)?;
        self.mark(super::Step::Fill, true, &stream)?;
        let q = &self.queue;
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
            // a distinct miss list counts each row as often as the batch's keys missed it
            let mult = self.pool.mult_for_fill();
            let mut c = q.stream.launch_builder(&self.kernels.fill_count);
            c.arg(&keys).arg(&miss).arg(&found).arg(&m_i).arg(&tables).arg(&interleaved);
            c.arg(&starts).arg(&desc).arg(&mult);
            // SAFETY: argument types and order match batch_fill_count; the fill's buffers,
            // read before it on the same queue; `mult` is 0 or the last run's counts by key
            // index (every listed miss's index is one of its keys), untouched until the next
            // run, whose queue work follows this.
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
        self.mark(super::Step::Fill, false, &stream)
    }
}

/// The blocks the in-place reads run on unless set: `TRITON_RUST_GPU_READ_BLOCKS` in the
/// process's environment (read once; 0: one warp for every four misses), else 16.
pub(super) fn default_read_blocks() -> u32 {
    static BLOCKS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *BLOCKS.get_or_init(|| {
        std::env::var("TRITON_RUST_GPU_READ_BLOCKS").ok().and_then(|v| v.parse().ok()).unwrap_or(16)
    })
}

/// Whether the GPU's in-place reads yield the SMs to the networks beside them (an A/B knob):
/// `TRITON_RUST_GPU_READS_YIELD=1` in the process's environment (read once) puts their side
/// stream at the device's least priority, and the AOTInductor networks' streams above it,
/// libtorch's high-priority pool (`crates/aoti/src/package.cpp` reads the same variable). A
/// network's kernel then waits at most for the read blocks already running, short ones on a
/// grid of a warp for every four misses. Served on an H200 it was slower, not faster: the
/// network still slowed beside the bus reads, and each lookup waited for its share to find
/// SMs (`bench/gpu/results/cache-runs/`, `yield`).
pub(super) fn reads_yield() -> bool {
    static YIELD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *YIELD.get_or_init(|| std::env::var("TRITON_RUST_GPU_READS_YIELD").is_ok_and(|v| v == "1"))
}

/// How a run's misses are shared between the GPU reading in place and the fetcher: each
/// side's rate (rows a second) averaged over the last runs, and the events timing the
/// GPU's kernel of the run under way.
pub(super) struct MissShare {
    pub(super) gpu: f64,
    pub(super) host: f64,
    events: Option<(cudarc::driver::CudaEvent, cudarc::driver::CudaEvent)>,
    /// The GPU's part of the run under way, once its end event is recorded.
    timing: Option<usize>,
}

impl MissShare {
    /// Runs smaller than this on one side do not move its rate (fixed costs, not rows).
    const LEARN_FROM: usize = 4096;
    /// Weight of the newest run in a rate.
    const NEWEST: f64 = 0.25;

    fn new() -> MissShare {
        // first guesses from miss_reads_bench on an H200 (bench/gpu/results/miss-path/):
        // the GPU in place about 30 M rows/s, 16 host threads about 60 M
        MissShare { gpu: 30e6, host: 60e6, events: None, timing: None }
    }

    /// The GPU's part of `m` misses: both sides finish together at their rates.
    pub(super) fn gpu_part(&self, m: usize) -> usize {
        ((m as f64 * self.gpu / (self.gpu + self.host)).round() as usize).min(m)
    }

    fn start(&mut self, stream: &Arc<cudarc::driver::CudaStream>) -> Result<()> {
        if self.events.is_none() {
            let ctx = stream.context();
            let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            self.events = Some((
                ctx.new_event(timing).map_err(cuda_err)?,
                ctx.new_event(timing).map_err(cuda_err)?,
            ));
        }
        if let Some((e0, _)) = &self.events {
            e0.record(stream).map_err(cuda_err)?;
        }
        Ok(())
    }

    fn end(&mut self, stream: &Arc<cudarc::driver::CudaStream>, rows: usize) -> Result<()> {
        if let Some((_, e1)) = &self.events {
            e1.record(stream).map_err(cuda_err)?;
            self.timing = Some(rows);
        }
        Ok(())
    }

    fn learn(rate: &mut f64, rows: usize, seconds: f64) {
        if rows >= Self::LEARN_FROM && seconds > 0.0 {
            *rate = (1.0 - Self::NEWEST) * *rate + Self::NEWEST * rows as f64 / seconds;
        }
    }

    /// The fetcher read `rows` in `seconds`.
    pub(super) fn host_took(&mut self, rows: usize, seconds: f64) {
        Self::learn(&mut self.host, rows, seconds);
    }

    /// After the run's wait: the GPU's kernel time for its part (its events are done).
    pub(super) fn gpu_took(&mut self, rows: usize) -> Result<()> {
        if let (Some((e0, e1)), Some(timed)) = (&self.events, self.timing.take()) {
            let ms = e0.elapsed_ms(e1).map_err(cuda_err)?;
            debug_assert_eq!(timed, rows);
            Self::learn(&mut self.gpu, rows, ms as f64 / 1e3);
        }
        Ok(())
    }
}

/// The rows of a batch's last part of misses: 16,384, or `TRITON_RUST_LAST_PART` in the
/// server's environment (rows; 0: no short last part, the parts all alike, as before
/// 2026-12-02), read once.
fn last_part() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("TRITON_RUST_LAST_PART")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(16_384)
    })
}

/// Where each part of the misses `from..m` ends: a last part of `last` misses when there are
/// at least twice as many, the misses before it in equal parts of at least `part` (one when
/// fewer), at most `parts` parts in all; with `last` 0 or fewer misses, parts of at least
/// `part`, at most `parts`, the last the remainder (the rule before 2026-12-02).
fn part_ends(from: usize, m: usize, part: usize, parts: usize, last: usize) -> Vec<usize> {
    let n = m.saturating_sub(from);
    if n == 0 {
        return Vec::new();
    }
    if last == 0 || n < 2 * last {
        // parts alike, the last the remainder
        let per = n.div_ceil(parts.max(1)).max(part.max(1));
        return (1..=n.div_ceil(per)).map(|i| (from + i * per).min(m)).collect();
    }
    // the misses before the last part in equal parts, as many whole `part`s as they hold
    let head = n - last;
    let k = (head / part.max(1)).clamp(1, parts.max(2) - 1);
    let per = head.div_ceil(k);
    let mut ends: Vec<usize> = (1..=k).map(|i| from + (i * per).min(head)).collect();
    ends.push(m);
    ends
}

#[cfg(test)]
mod part_tests {
    use super::part_ends;

    #[test]
    fn parts_cover_the_misses_once_in_order_the_last_short() {
        // MLPerf DLRM-v2's batch at a 10% cache: two parts, the last of 16,384
        assert_eq!(part_ends(0, 165_157, 131_072, 4, 16_384), vec![148_773, 165_157]);
        // a larger batch: the misses before the last part in up to three parts
        assert_eq!(
            part_ends(0, 500_000, 131_072, 4, 16_384),
            vec![161_206, 322_412, 483_616, 500_000]
        );
        assert_eq!(
            part_ends(0, 900_000, 131_072, 4, 16_384),
            vec![294_539, 589_078, 883_616, 900_000]
        );
        // fewer than twice the last part: one part
        assert_eq!(part_ends(10, 30_000, 131_072, 4, 16_384), vec![30_000]);
        assert!(part_ends(7, 7, 131_072, 4, 16_384).is_empty());
        // the GPU's first misses are not the fetcher's
        assert_eq!(part_ends(1_000, 41_000, 131_072, 4, 16_384), vec![24_616, 41_000]);
        // no short last part: parts alike, as before
        assert_eq!(part_ends(0, 165_157, 65_536, 4, 0), vec![65_536, 131_072, 165_157]);
        assert_eq!(part_ends(0, 300_000, 65_536, 4, 0), vec![75_000, 150_000, 225_000, 300_000]);
    }
}
