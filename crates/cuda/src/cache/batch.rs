//! A whole batch's lookup over every table at once (see [`BatchLookup`]), in named steps:
//! room for the batch, the table layout, the keys up and looked up piece by piece, the miss
//! count back, the missed keys to the fetcher, the fetched rows scattered into place, and
//! later the fill of the caches.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaStream, PushKernelArg};

use super::batch_args::{BatchKeys, BatchTimes, FetchMisses, KeyLayout, KeyUpload, RowFormat};
use super::slots::{CacheSlots, SlotsDesc, DESC};
use crate::buffer::{DeviceMem, DevicePtr};
use crate::context::{cuda_err, gpu};
use crate::copy::{dtod_on, dtoh, htod, htod_now, htod_on, zero, Queue};
use crate::error::{CudaError, Result};
use crate::kernels::{self, lookup_keys_per_warp, warps_config, Kernels};
use crate::mem::{DeviceView, DeviceViewMut};
use crate::pinned::{HostRows, PinnedBuf};
use crate::upload::in_parts;

#[path = "batch_host.rs"]
mod host;
#[path = "batch_pool.rs"]
mod pooled;
pub use pooled::PoolSpec;
#[path = "batch_clock.rs"]
mod clock;
pub use clock::KernelTimes;
use clock::Step;

/// One instance's lookup of a whole batch, every table at once: the keys go to the GPU
/// once (from page-locked memory), one kernel serves every hit of every table and lists
/// the misses, the misses come back in one copy, are read below the cache by the
/// caller, go back in one copy and are scattered into place by one more kernel. Rows
/// land in this lookup's own output buffer, or the caller's ([`BatchLookup::run_keys`]),
/// row i at element `i * dim`, as fp32 or fp16 ([`RowFormat`]). The rows read
/// below the cache are already on the GPU afterwards, so [`BatchLookup::fill_last`]
/// inserts them into the caches with one more kernel, queued after the response's rows
/// are complete and never waited for. Every buffer is kept and reused; nothing is
/// allocated per batch once the largest batch was seen.
///
/// With host rows set ([`BatchLookup::set_host_rows`], `batch_host.rs`), the misses are
/// instead read in place by one more kernel from host memory the GPU maps, nothing going
/// to the host.
///
/// Two streams: the caches' queue runs what reads or writes the slots (the lookup and the
/// fill kernels, and what they read first: the keys, the table starts, the zeroed miss
/// count), in one order with every other lookup sharing those caches; this lookup's own
/// stream runs the rest (the misses down and their rows up, the scatter), so that one
/// instance's copies never hold up another's lookup on a shared queue. Each waits on the
/// other by events where one reads what the other wrote; the host waits on its own stream.
pub struct BatchLookup {
    queue: Queue,
    /// This lookup's own stream (see above).
    own: Queue,
    /// The keys' copies to the GPU, beside the queue's lookups: a piece's lookup waits for
    /// its own copy only, so the next piece's DMA overlaps it.
    upload: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    tables: usize,
    dim: usize,
    format: RowFormat,
    /// How the caches keep their rows (all alike).
    stored: RowFormat,
    key_upload: KeyUpload,
    /// The last run wrote its rows into the caller's buffer (`run_keys` with an `out`).
    external: bool,
    /// Every table's descriptor, on the GPU (the kernels read it there).
    desc: DeviceMem,
    /// The cached tables' slots that `desc` names, held so they outlive this lookup and
    /// every kernel it queued.
    _slots: Vec<SlotsDesc>,
    /// Some table's cache is LFU: a fill first counts its keys' misses.
    lfu: bool,
    keys: (PinnedBuf<i64>, DeviceMem),
    starts: (PinnedBuf<i32>, DeviceMem),
    miss: (PinnedBuf<i32>, DeviceMem),
    count: (PinnedBuf<u32>, DeviceMem),
    fetched: (PinnedBuf<f32>, DeviceMem),
    /// The fetcher's rows when fetched as fp16 (`fetched.1` takes them on the GPU).
    fetched16: PinnedBuf<u16>,
    /// The type the misses are fetched as (`set_fetched`).
    fetched_as: RowFormat,
    found: (PinnedBuf<u8>, DeviceMem),
    /// The missed keys, for the fetcher (gathered on the GPU when the keys came there).
    missed_keys: (PinnedBuf<i64>, DeviceMem),
    out: DeviceMem,
    /// Every table's rows in host memory this GPU maps, when set: their descriptors
    /// (`read_host_rows` in the kernels), the registrations they name (held while any
    /// kernel may read them), and whether the next runs read misses there.
    host: Option<(DeviceMem, Vec<Arc<HostRows>>)>,
    host_on: bool,
    /// Blocks of 256 threads the in-place reads run on, 0: a warp for every four misses
    /// (`set_gpu_read_blocks`).
    read_blocks: u32,
    /// Misses shared between the GPU reading in place (on `side`) and the fetcher, by
    /// their measured rates (`share_misses`); `None`: one or the other.
    share: Option<host::MissShare>,
    /// The stream of the GPU's share of the misses, beside the fetcher's copies on `own`.
    side: Queue,
    /// Misses per table then defaults per table of the last run that read on the GPU.
    host_counts: (PinnedBuf<u32>, DeviceMem),
    host_read: Option<Vec<u32>>,
    /// The last run's misses, which `fill_last` may insert: (count, interleaved, their type).
    last: Option<(usize, i32, RowFormat)>,
    /// A fill is queued and may still run (buffers it reads must not be freed).
    fill_queued: bool,
    /// The most keys a run has had room for.
    max_keys: usize,
    /// Pooling as it looks up (`batch_pool.rs`).
    pool: pooled::PoolRun,
    /// The GPU steps' events, when timed (`batch_clock.rs`).
    clock: Option<Box<clock::KernelClock>>,
}

impl BatchLookup {
    /// A lookup over `caches` (one per table, `None` for a table without a cache), all on
    /// `queue`, every table of dim `dim` and every cache's rows kept alike, its rows written
    /// as `format`.
    pub fn new(
        queue: &Queue,
        caches: &[Option<&CacheSlots>],
        dim: usize,
        format: RowFormat,
    ) -> Result<BatchLookup> {
        let (_, kernels) = kernels::device(queue.device)?;
        let d = queue.device;
        if let Some(c) = caches.iter().flatten().find(|c| c.dim() != dim) {
            return Err(CudaError::internal(format!(
                "batch lookup: a cache of dim {} in a lookup of dim {dim}",
                c.dim()
            )));
        }
        let stored = caches.iter().flatten().next().map_or(RowFormat::F32, |c| c.rows());
        if caches.iter().flatten().any(|c| c.rows() != stored) {
            return Err(CudaError::internal(
                "batch lookup: caches keeping their rows in different formats",
            ));
        }
        let slots: Vec<Option<SlotsDesc>> =
            caches.iter().map(|c| c.map(CacheSlots::descriptor)).collect();
        let table_desc: Vec<i64> =
            slots.iter().flat_map(|s| s.as_ref().map_or([0; DESC], |s| s.fields)).collect();
        let mut desc = DeviceMem::growing(d);
        desc.reserve(table_desc.len().max(1) * 8)?;
        htod_now(d, desc.ptr(), &table_desc)?;
        let pair = || (PinnedBuf::new(d), DeviceMem::growing(d));
        Ok(BatchLookup {
            queue: queue.clone(),
            own: queue.another()?,
            upload: queue.another()?.stream,
            kernels,
            tables: caches.len(),
            dim,
            format,
            stored,
            key_upload: KeyUpload::default(),
            external: false,
            desc,
            lfu: slots.iter().flatten().any(|s| s.fields[6] != 0),
            _slots: slots.into_iter().flatten().collect(),
            keys: pair(),
            starts: (PinnedBuf::new(d), DeviceMem::growing(d)),
            miss: (PinnedBuf::new(d), DeviceMem::growing(d)),
            count: (PinnedBuf::new(d), DeviceMem::growing(d)),
            fetched: (PinnedBuf::new(d), DeviceMem::growing(d)),
            fetched16: PinnedBuf::new(d),
            fetched_as: RowFormat::F32,
            found: (PinnedBuf::new(d), DeviceMem::growing(d)),
            missed_keys: pair(),
            out: DeviceMem::growing(d),
            host: None,
            host_on: false,
            read_blocks: host::default_read_blocks(),
            share: None,
            side: queue.another_at(!host::reads_yield())?,
            host_counts: (PinnedBuf::new(d), DeviceMem::growing(d)),
            host_read: None,
            last: None,
            fill_queued: false,
            max_keys: 0,
            pool: pooled::PoolRun::new(d),
            clock: None,
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The type the next runs fetch their misses as (fp32 until set): fp16 only where every
    /// table stores its rows so (the rows go up as stored, and the kernels widen them
    /// exactly where fp32 is written). Read by the fetcher's [`FetchedRows`] and by the
    /// in-place reads of host rows.
    pub fn set_fetched(&mut self, rows: RowFormat) {
        self.fetched_as = rows;
    }

    /// How the next runs send their keys to the GPU.
    pub fn set_key_upload(&mut self, how: KeyUpload) {
        self.key_upload = how;
    }

    /// Looks `keys` up (table of each key as `layout` says), stamping hits with `epoch`.
    /// `fetch(missed, missed_keys, rows, found)` is given indices that missed with their keys,
    /// in no particular order (it may reorder the two together), a page-locked buffer of
    /// `missed.len() * dim` elements to fill with their rows (row j for `missed[j]` as it
    /// leaves them; fp32, or fp16 bits after [`BatchLookup::set_fetched`]), and a flag per
    /// row to set when the row is worth caching. A run with many misses calls it once for
    /// each part of them, a part's rows going up while the next part is read. Returns when
    /// every row is in place in [`BatchLookup::rows`].
    pub fn run<E: From<CudaError>>(
        &mut self,
        keys: &[i64],
        layout: KeyLayout<'_>,
        epoch: u64,
        fetch: &mut FetchMisses<'_, E>,
    ) -> std::result::Result<BatchTimes, E> {
        self.run_to(BatchKeys::Host(keys), layout, epoch, fetch, None)
    }

    /// As [`BatchLookup::run`] for keys on the host or already in GPU memory (on this
    /// lookup's GPU: one copy on the GPU instead of the trip from the host, the missed keys
    /// gathered there for the fetcher), the rows written into `out` when given (on this
    /// lookup's GPU, room for every row) instead of the lookup's own buffer;
    /// [`BatchLookup::rows`] then has none.
    pub fn run_keys<E: From<CudaError>>(
        &mut self,
        keys: BatchKeys<'_>,
        layout: KeyLayout<'_>,
        epoch: u64,
        fetch: &mut FetchMisses<'_, E>,
        out: Option<&mut DeviceViewMut<'_>>,
    ) -> std::result::Result<BatchTimes, E> {
        if let BatchKeys::Device(v) = &keys {
            if v.device() != self.queue.device || v.len() % 8 != 0 {
                return Err(CudaError::internal(format!(
                    "batch lookup: {} bytes of keys on GPU {} for a lookup on GPU {}",
                    v.len(),
                    v.device(),
                    self.queue.device
                ))
                .into());
            }
        }
        let into = match out {
            Some(o) => Some(self.check_out(keys.len(), o)?),
            None => None,
        };
        self.run_to(keys, layout, epoch, fetch, into)
    }

    /// Where `out` starts, when it has room for the rows of `n` keys on this lookup's GPU.
    fn check_out<'o>(&self, n: usize, out: &'o DeviceViewMut<'_>) -> Result<DevicePtr<'o>> {
        let need = n * self.dim * self.format.size();
        if out.device() != self.queue.device || out.len() < need {
            return Err(CudaError::internal(format!(
                "batch lookup: an output of {} bytes on GPU {} for {need} bytes of rows on GPU {}",
                out.len(),
                out.device(),
                self.queue.device
            )));
        }
        DevicePtr::of_view_mut(out)
            .map_err(|_| CudaError::internal("batch lookup: a simulated output buffer"))
    }

    fn run_to<E: From<CudaError>>(
        &mut self,
        keys: BatchKeys<'_>,
        layout: KeyLayout<'_>,
        epoch: u64,
        fetch: &mut FetchMisses<'_, E>,
        into: Option<DevicePtr<'_>>,
    ) -> std::result::Result<BatchTimes, E> {
        let n = keys.len();
        self.pool.active = self.pools(&keys, layout, into.is_none());
        self.external = into.is_some() || self.pool.active.is_some();
        let mut times = BatchTimes { keys: n, ..BatchTimes::default() };
        if n == 0 {
            return Ok(times);
        }
        let t0 = Instant::now();
        let us = |t: Instant| t.elapsed().as_micros() as u64;
        if n > i32::MAX as usize {
            return Err(
                CudaError::internal("batch lookup: more than 2^31 keys in one batch").into()
            );
        }
        gpu(self.queue.device)?;
        self.last = None;
        self.host_read = None;
        self.pool.new_run();
        self.make_room(n, !self.external)?;
        let interleaved = self.place_layout(layout, n)?;
        self.clear_misses(n)?;
        let queue = self.queue.stream.clone();
        self.mark(Step::Lookup, true, &queue)?;
        match keys {
            BatchKeys::Device(v) if self.pool.active.is_some() => {
                self.probe_pool(DevicePtr::of_view(&v)?, n, epoch)?
            }
            _ => self.send_keys(keys, interleaved, epoch, into)?,
        }
        self.mark(Step::Lookup, false, &queue)?;
        let (m, negative) = self.count_misses(n)?;
        times.misses = m;
        times.lookup_us = us(t0);
        if negative > 0 {
            // a fixed layout with padding or a bad key: the caller takes another path
            times.negative = negative;
            self.pool.active = None;
            return Ok(times);
        }
        let t1 = Instant::now();
        let sharing = self.host_on && self.share.is_some();
        if m > 0 && self.host_on && !sharing {
            self.read_host(m, interleaved, false)?;
            times.gpu_misses = m;
            times.read = m;
            times.fetch_us = us(t1);
            self.scatter(m, into)?;
            self.last = Some((m, interleaved, self.fetched_as));
        } else if m > 0 {
            // a pooling run may read each missed (table, key) once: the list is then shorter
            let m = self.distinct_misses(n, m)?;
            times.read = m;
            self.missed_keys_to_host(keys, m)?;
            times.keys_down_us = us(t1);
            // the GPU's share (the first g misses) read in place on the side stream while
            // the fetcher reads the rest
            let g = if sharing { self.share.as_ref().map_or(0, |s| s.gpu_part(m)) } else { 0 };
            if g > 0 {
                // room for all m first: nothing may grow (and move) under the GPU's kernel
                self.fetched.1.reserve(m * self.dim * 4)?;
                self.found.1.reserve(m)?;
                self.read_host(g, interleaved, true)?;
            }
            let th = Instant::now();
            self.fetch_in_parts(g, m, fetch)?;
            let host_s = th.elapsed().as_secs_f64();
            times.gpu_misses = g;
            times.fetch_us = us(t1);
            if g > 0 {
                self.own.stream.join(&self.side.stream).map_err(cuda_err)?;
            }
            self.scatter_fetched(g, m, into)?;
            self.last = Some((m, interleaved, self.fetched_as));
            if let Some(share) = self.share.as_mut() {
                share.host_took(m - g, host_s);
            }
        }
        // the hits' rows were written on the queue before `count_misses` waited for them
        self.own.wait()?;
        if times.gpu_misses > 0 {
            self.host_read = Some(self.host_counts.0.slice(2 * self.tables)?.to_vec());
            if times.gpu_misses < m {
                if let Some(share) = self.share.as_mut() {
                    share.gpu_took(times.gpu_misses)?;
                }
            }
        }
        times.scatter_us = us(t1).saturating_sub(times.fetch_us);
        Ok(times)
    }

    /// Room for a batch of `n` keys (and its rows, in our own buffer unless `own_out` is
    /// false). A fill still queued reads the buffers a growth frees: it is waited for first.
    fn make_room(&mut self, n: usize, own_out: bool) -> Result<()> {
        if self.fill_queued && n > self.max_keys {
            self.queue.wait()?;
        }
        self.fill_queued = false;
        self.max_keys = self.max_keys.max(n);
        if own_out {
            self.out.reserve(n * self.dim * self.format.size())?;
        }
        self.keys.1.reserve(n * 8)
    }

    /// Checks `layout` against `n` keys and puts the blocked layout's table starts on the
    /// GPU; returns the kernels' `interleaved` flag.
    fn place_layout(&mut self, layout: KeyLayout<'_>, n: usize) -> Result<i32> {
        match layout {
            KeyLayout::Interleaved => {
                if self.tables == 0 || !n.is_multiple_of(self.tables) {
                    return Err(CudaError::internal(format!(
                        "batch lookup: {n} keys are not whole rows of {} tables",
                        self.tables
                    )));
                }
                self.starts.1.reserve(8)?;
                Ok(1)
            }
            KeyLayout::Blocked(counts) => {
                if counts.len() != self.tables || counts.iter().sum::<usize>() != n {
                    return Err(CudaError::internal(
                        "batch lookup: the per-table counts do not match the keys",
                    ));
                }
                let h = self.starts.0.slice(counts.len() + 1)?;
                h[0] = 0;
                for (t, c) in counts.iter().enumerate() {
                    h[t + 1] = h[t] + *c as i32;
                }
                self.starts.1.reserve(h.len() * 4)?;
                htod(&self.queue, self.starts.1.ptr(), h)?;
                Ok(0)
            }
            KeyLayout::Fixed { width, at } => {
                let whole = at.len() == self.tables + 1
                    && at.first() == Some(&0)
                    && at.last().is_some_and(|&w| w as usize == width)
                    && at.windows(2).all(|w| w[0] <= w[1]);
                if !whole || width == 0 || !n.is_multiple_of(width) || width > i32::MAX as usize {
                    return Err(CudaError::internal(format!(
                        "batch lookup: {n} keys are not whole samples of {width} keys over {} tables",
                        self.tables
                    )));
                }
                // the starts, then the table of each place of a sample (the kernels' table_of
                // reads it there instead of searching the starts for every key)
                let h = self.starts.0.slice(at.len() + width)?;
                h[..at.len()].copy_from_slice(at);
                for (t, w) in at.windows(2).enumerate() {
                    h[at.len() + w[0] as usize..at.len() + w[1] as usize].fill(t as i32);
                }
                self.starts.1.reserve(h.len() * 4)?;
                htod(&self.queue, self.starts.1.ptr(), h)?;
                Ok(-(width as i32))
            }
        }
    }

    /// Room for `n` misses, and the counts (misses, and keys below zero in a fixed layout)
    /// zeroed on the queue.
    fn clear_misses(&mut self, n: usize) -> Result<()> {
        self.miss.1.reserve(n * 4)?;
        self.count.1.reserve(8)?;
        zero(&self.queue, self.count.1.ptr(), 8)
    }

    /// The keys to the GPU and the lookup kernel queued behind them: host keys in pieces,
    /// each looked up as soon as it is on the GPU, so copying the next piece into
    /// page-locked memory and its DMA overlap the last one's lookup; keys already on the
    /// GPU in one copy there.
    fn send_keys(
        &mut self,
        keys: BatchKeys<'_>,
        interleaved: i32,
        epoch: u64,
        into: Option<DevicePtr<'_>>,
    ) -> Result<()> {
        let n = keys.len();
        let q = &self.queue;
        let (tables, dim_i, desc) = (self.tables as i32, self.dim as i32, self.desc.ptr());
        let k = &self.kernels;
        let kernel = match (self.stored, self.format) {
            (RowFormat::F32, RowFormat::F32) => &k.batch,
            (RowFormat::F32, RowFormat::F16) => &k.batch_h,
            (RowFormat::F16, RowFormat::F32) => &k.s16.batch,
            (RowFormat::F16, RowFormat::F16) => &k.s16.batch_h,
        };
        let (d_keys, d_starts) = (self.keys.1.ptr(), self.starts.1.ptr());
        let (d_miss, d_count) = (self.miss.1.ptr(), self.count.1.ptr());
        let out = into.unwrap_or(self.out.ptr());
        // queues the lookup of keys[at .. at + len], once they are on the GPU
        let look_up = |at: usize, len: usize| -> Result<()> {
            let (at_i, len_i) = (at as i64, len as i32);
            let mut b = q.stream.launch_builder(kernel);
            b.arg(&d_keys)
                .arg(&at_i)
                .arg(&len_i)
                .arg(&tables)
                .arg(&interleaved)
                .arg(&d_starts)
                .arg(&desc)
                .arg(&dim_i)
                .arg(&epoch);
            b.arg(&out).arg(&d_miss).arg(&d_count);
            // SAFETY: argument types and order match batch_lookup(_h)(_s16), the one for the
            // caches' rows and the output's format; this stream has
            // the copy of keys[at .. at + len] queued before it; every buffer was sized for n
            // keys and n rows, and the descriptors name cache slots `self._slots` holds.
            unsafe { b.launch(warps_config(len.div_ceil(lookup_keys_per_warp()))) }
                .map_err(cuda_err)?;
            Ok(())
        };
        let up = &self.upload;
        let piece_keys = self.key_upload.piece_keys.max(1);
        // the keys' buffer is overwritten only after the queue's earlier work (a fill) read it
        up.join(&q.stream).map_err(cuda_err)?;
        let piece = |first: usize, keys: &[i64], pinned: &mut [i64]| -> Result<()> {
            for (j, (from, to)) in
                keys.chunks(piece_keys).zip(pinned.chunks_mut(piece_keys)).enumerate()
            {
                to.copy_from_slice(from);
                let at = first + j * piece_keys;
                // SAFETY: `d_keys` has room for n keys; `to` is page-locked and not written
                // again before the queue's synchronisation that follows this copy (the
                // lookup of this piece waits for it).
                unsafe { htod_on(up, d_keys.at(at * 8), &*to) }?;
                q.stream.wait(&up.record_event(None).map_err(cuda_err)?).map_err(cuda_err)?;
                look_up(at, to.len())?;
            }
            Ok(())
        };
        let sent = match keys {
            BatchKeys::Host(keys) => {
                let h_keys = self.keys.0.slice(n)?;
                in_parts(q.device, self.key_upload.part(n), keys, h_keys, &piece)
            }
            BatchKeys::Device(v) => DevicePtr::of_view(&v).and_then(|src| {
                // `src` holds n keys (checked by `run_keys`) and stays valid through this
                // run, which waits on the queue; the copy is ordered before this run's
                // kernel and any later fill.
                dtod_on(&q.stream, d_keys, src, n * 8)?;
                look_up(0, n)
            }),
        };
        if sent.is_err() {
            // nothing queued may still read the page-locked keys when the next run rewrites them
            let _ = up.synchronize();
            let _ = q.stream.synchronize();
        }
        sent
    }

    /// Waits for the lookup and returns how many keys missed, and how many of a fixed layout
    /// were below zero. The counts come down on this lookup's own stream once it has passed
    /// the queue's work so far (the lookup), so the wait does not take in what other lookups
    /// queue after it.
    fn count_misses(&mut self, n: usize) -> Result<(usize, usize)> {
        self.own.stream.join(&self.queue.stream).map_err(cuda_err)?;
        let h_count = self.count.0.slice(2)?;
        dtoh(&self.own, h_count, self.count.1.ptr())?;
        self.own.wait()?;
        Ok(((h_count[0] as usize).min(n), (h_count[1] as usize).min(n)))
    }

    /// The `m` fetched rows on the GPU put in place: into the open bags when pooling, else
    /// scattered to their keys' places.
    fn scatter(&mut self, m: usize, into: Option<DevicePtr<'_>>) -> Result<()> {
        let own = self.own.stream.clone();
        self.mark(Step::Place, true, &own)?;
        if self.pool.active.is_some() {
            self.close_bags(m)?;
        } else {
            self.scatter_rows(m, into)?;
        }
        self.mark(Step::Place, false, &own)
    }

    /// The scatter of the `m` fetched rows into their keys' places queued.
    fn scatter_rows(&mut self, m: usize, into: Option<DevicePtr<'_>>) -> Result<()> {
        let (q, dim) = (&self.own, self.dim);
        let (d_rows, d_miss) = (self.fetched.1.ptr(), self.miss.1.ptr());
        let out = into.unwrap_or(self.out.ptr());
        let (m_i, stride, dim_i) = (m as i32, dim as i64, dim as i32);
        let k = &self.kernels;
        let scatter = match (self.fetched_as, self.format) {
            (RowFormat::F32, RowFormat::F32) => &k.scatter,
            (RowFormat::F32, RowFormat::F16) => &k.scatter_h,
            (RowFormat::F16, RowFormat::F32) => &k.scatter_r16,
            (RowFormat::F16, RowFormat::F16) => &k.scatter_h_r16,
        };
        let mut b = q.stream.launch_builder(scatter);
        b.arg(&d_rows).arg(&d_miss).arg(&m_i).arg(&out).arg(&stride).arg(&dim_i);
        // SAFETY: argument types and order match scatter_rows(_h)(_r16) (`out` by address,
        // rows of `format`, fetched rows of `fetched_as`); every index is < n.
        unsafe { b.launch(warps_config(m)) }.map_err(cuda_err)?;
        Ok(())
    }

    /// How this lookup writes its rows.
    pub fn format(&self) -> RowFormat {
        self.format
    }

    /// The first `elements` elements of the output (of `format`), as bytes (valid until the next run).
    pub fn rows(&self, elements: usize) -> Option<DeviceView<'_>> {
        if self.external {
            return None;
        }
        // complete (the run waited for its queue) and only written through `&mut self`
        self.out.view(elements * self.format.size())
    }
}

impl Drop for BatchLookup {
    fn drop(&mut self) {
        // a queued fill may still read the buffers freed below
        if gpu(self.queue.device).is_ok() {
            let _ = self.queue.stream.synchronize();
            let _ = self.own.stream.synchronize();
        }
    }
}
