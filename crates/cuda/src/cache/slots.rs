//! One table's cache slots on one GPU (keys, stamps, rows) and the kernels that read and
//! write them one table at a time: lookups of host keys, inserts and refreshes. A resident
//! table ([`CacheSlots::resident`]) is every row of a table whose keys are its row numbers,
//! kept as a plain array: row `key`, no tags to read, nothing evicted.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr as _, PushKernelArg};
use parking_lot::Mutex;

use super::batch_args::RowFormat;
use super::rows::DeviceRows;
use crate::context::{cuda_err, GpuState};
use crate::copy::Queue;
use crate::error::{CudaError, Result};
use crate::kernels::{self, threads_config, warps_config, Kernels};

/// Ways per set: the kernels use one warp per set.
pub const WAYS: usize = 32;

/// Fields of a table's descriptor for the whole-batch kernels (see `batch_lookup` in the kernels).
pub(crate) const DESC: usize = 11;

/// A table's slots as the whole-batch kernels see them: the descriptor's fields (keys,
/// stamps, rows, sets, locks, counters, the LFU sketch or 0, its width, the key index or 0,
/// the keys it covers, the pooled probes' hit stamp rate), with a hold on the memory they name, so the
/// addresses stay valid for as long as this lives.
pub(crate) struct SlotsDesc {
    pub(crate) fields: [i64; DESC],
    _held: Arc<Mutex<Slots>>,
}

struct Slots {
    keys: CudaSlice<i64>,
    stamps: CudaSlice<u64>,
    /// `dim` elements a slot, fp32 or fp16 (`CacheSlots::rows`).
    rows: CudaSlice<u8>,
    counters: CudaSlice<u64>,
    /// Per set, for `batch_fill`: a lock word (warps of one launch filling one set take
    /// it in turn), then after all sets' locks, a ticket count (how many of this fill's
    /// warps came for the set; only the first WAYS insert), zeroed again by
    /// `batch_fill_reset` after each fill for the sets it touched.
    locks: CudaSlice<u32>,
    /// LFU: the count-min sketch of the misses, 2 rows of `sketch_width` counters (see
    /// `sketch_miss` in the kernels); one unused word under LRU.
    sketch: CudaSlice<u32>,
    /// The key index (`index_rows` of [`CacheSlots::new`]): key k's slot at k, `u32::MAX`
    /// until a fill or insert places k (`way_for` in the kernels; `probe_index` reads it). One
    /// unused word without one.
    index: CudaSlice<u32>,
}

/// One table's cache slots on one GPU: `sets × WAYS` keys, stamps and rows of `dim`,
/// kept as fp32 or fp16.
pub struct CacheSlots {
    kernels: Arc<Kernels>,
    _gpu: Arc<GpuState>,
    stream: Arc<CudaStream>,
    sets: usize,
    /// LFU: the sketch's width (a power of two); 0 under LRU.
    sketch_width: usize,
    /// A resident table's rows (keys `0..rows`); `None` for a cache.
    resident: Option<usize>,
    /// Keys `0..index_rows` have a slot in the key index (0: no index).
    index_rows: usize,
    /// The pooled lookup's probes stamp one hit in this many ([`CacheSlots::set_hit_stamp_every`]).
    stamp_every: u32,
    dim: usize,
    rows: RowFormat,
    /// Shared with every [`super::BatchLookup`] whose descriptors name these slots, so the
    /// memory outlives them all.
    slots: Arc<Mutex<Slots>>,
}

/// Host-side description of an insert: key indices grouped by set (see `cache_insert`).
pub struct InsertPlan<'a> {
    pub order: &'a [i32],
    pub group_start: &'a [i32],
    pub group_set: &'a [i64],
}

impl CacheSlots {
    /// Empty slots hold `empty_key`, which must never be inserted. The slots' work goes
    /// through `queue`; their rows are kept as `rows` says. `sketch_width`: 0 for LRU, else
    /// LFU with a sketch of 2 rows of that many counters (a power of two). `index_rows`: keys
    /// `0..index_rows` get a key index (4 bytes a key, the slot each is in), through which the
    /// pooled lookup finds them (`probe_index`) instead of reading their set's tags; 0: none.
    pub fn new(
        queue: &Queue,
        sets: usize,
        dim: usize,
        empty_key: i64,
        rows: RowFormat,
        sketch_width: usize,
        index_rows: usize,
    ) -> Result<CacheSlots> {
        if sketch_width != 0 && !sketch_width.is_power_of_two() {
            return Err(CudaError::internal(format!(
                "an LFU sketch's width must be a power of two, not {sketch_width}"
            )));
        }
        let capacity = sets * WAYS;
        if index_rows > 0 && capacity >= u32::MAX as usize {
            return Err(CudaError::internal(format!(
                "a key index names slots in 32 bits: {capacity} slots are too many"
            )));
        }
        let (g, kernels) = kernels::device(queue.device)?;
        let stream = queue.stream.clone();
        let index = stream.alloc_zeros::<u32>(index_rows.max(1)).map_err(|e| {
            CudaError::internal(format!(
                "a key index of {index_rows} keys ({:.2} GB) does not fit GPU {}: {e}",
                (index_rows * 4) as f64 / 1e9,
                queue.device
            ))
        })?;
        let slots = Slots {
            keys: stream.clone_htod(&vec![empty_key; capacity]).map_err(cuda_err)?,
            stamps: stream.alloc_zeros::<u64>(capacity).map_err(cuda_err)?,
            rows: stream.alloc_zeros::<u8>(capacity * dim * rows.size()).map_err(cuda_err)?,
            counters: stream.alloc_zeros::<u64>(2).map_err(cuda_err)?,
            locks: stream.alloc_zeros::<u32>(2 * sets.max(1)).map_err(cuda_err)?,
            sketch: stream.alloc_zeros::<u32>((2 * sketch_width).max(1)).map_err(cuda_err)?,
            index,
        };
        if index_rows > 0 {
            // no key has a slot yet
            let (p, _i) = slots.index.device_ptr(&stream);
            // SAFETY: the index holds index_rows u32s (4 bytes each), all set here on its
            // stream, which is synchronized below
            unsafe {
                cudarc::driver::result::memset_d8_async(p, 0xff, index_rows * 4, stream.cu_stream())
            }
            .map_err(cuda_err)?;
        }
        stream.synchronize().map_err(cuda_err)?;
        let slots = Arc::new(Mutex::new(slots));
        Ok(CacheSlots {
            kernels,
            _gpu: g,
            stream,
            sets,
            sketch_width,
            resident: None,
            index_rows,
            stamp_every: 1,
            dim,
            rows,
            slots,
        })
    }

    /// A resident table of `nrows` rows of `dim` (keys `0..nrows`, row `key` at `key × dim`),
    /// kept as `rows` says, zeros until [`CacheSlots::upload_rows`] writes them. Its work
    /// goes through `queue`, as a cache's does.
    pub fn resident(
        queue: &Queue,
        nrows: usize,
        dim: usize,
        rows: RowFormat,
    ) -> Result<CacheSlots> {
        let (g, kernels) = kernels::device(queue.device)?;
        let stream = queue.stream.clone();
        let bytes = nrows.max(1) * dim * rows.size();
        let slots = Slots {
            keys: stream.alloc_zeros::<i64>(1).map_err(cuda_err)?,
            stamps: stream.alloc_zeros::<u64>(1).map_err(cuda_err)?,
            rows: stream.alloc_zeros::<u8>(bytes).map_err(|e| {
                CudaError::internal(format!(
                    "a resident table of {nrows} rows of dim {dim} ({:.2} GB) does not fit GPU {}: {e}",
                    bytes as f64 / 1e9,
                    queue.device
                ))
            })?,
            counters: stream.alloc_zeros::<u64>(2).map_err(cuda_err)?,
            locks: stream.alloc_zeros::<u32>(2).map_err(cuda_err)?,
            sketch: stream.alloc_zeros::<u32>(1).map_err(cuda_err)?,
            index: stream.alloc_zeros::<u32>(1).map_err(cuda_err)?,
        };
        stream.synchronize().map_err(cuda_err)?;
        let slots = Arc::new(Mutex::new(slots));
        Ok(CacheSlots {
            kernels,
            _gpu: g,
            stream,
            sets: 0,
            sketch_width: 0,
            resident: Some(nrows),
            index_rows: 0,
            stamp_every: 1,
            dim,
            rows,
            slots,
        })
    }

    /// A resident table's rows (keys `0..rows`); `None` for a cache.
    pub fn resident_rows(&self) -> Option<usize> {
        self.resident
    }

    /// Writes rows `first..` of a resident table from `bytes`, whole rows already in the
    /// table's format (fp32 or fp16 bits, little-endian), in pieces of at most 256 MB.
    pub fn upload_rows(&self, first: usize, bytes: &[u8]) -> Result<()> {
        let row = self.dim * self.rows.size();
        let nrows = self.resident.unwrap_or(0);
        if row == 0 || !bytes.len().is_multiple_of(row) || first + bytes.len() / row > nrows {
            return Err(CudaError::internal(format!(
                "resident table: {} bytes from row {first} are not whole rows of {row} bytes within its {nrows}",
                bytes.len()
            )));
        }
        let mut slots = self.slots.lock();
        let piece = (256 << 20) / row * row;
        for (i, part) in bytes.chunks(piece.max(row)).enumerate() {
            let at = first * row + i * piece.max(row);
            let mut dst = slots.rows.slice_mut(at..at + part.len());
            self.stream.memcpy_htod(part, &mut dst).map_err(cuda_err)?;
        }
        self.stream.synchronize().map_err(cuda_err)
    }

    /// The `sets` the kernels are given: a cache's sets, or minus a resident table's rows.
    fn sets_field(&self) -> i64 {
        match self.resident {
            Some(n) => -(n as i64),
            None => self.sets as i64,
        }
    }

    /// The slots' descriptor for [`super::BatchLookup`] (the slots are never reallocated).
    /// The one place their addresses are read.
    pub(crate) fn descriptor(&self) -> SlotsDesc {
        let slots = self.slots.lock();
        let addr = |p: u64| p as i64;
        let (k, _a) = slots.keys.device_ptr(&self.stream);
        let (st, _b) = slots.stamps.device_ptr(&self.stream);
        let (r, _c) = slots.rows.device_ptr(&self.stream);
        let (l, _d) = slots.locks.device_ptr(&self.stream);
        let (c, _e) = slots.counters.device_ptr(&self.stream);
        let (sk, _f) = slots.sketch.device_ptr(&self.stream);
        let (ix, _g) = slots.index.device_ptr(&self.stream);
        let (sketch, width) = match self.sketch_width {
            0 => (0, 0),
            w => (addr(sk), w as i64),
        };
        let (index, irows) = match self.index_rows {
            0 => (0, 0),
            n => (addr(ix), n as i64),
        };
        let fields = [
            addr(k),
            addr(st),
            addr(r),
            self.sets_field(),
            addr(l),
            addr(c),
            sketch,
            width,
            index,
            irows,
            self.stamp_every as i64,
        ];
        SlotsDesc { fields, _held: self.slots.clone() }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The pooled lookup's probes (`probe_index`, `probe_slots`) stamp one hit in `every` (a
    /// power of two up to 1024; 0: none), chosen by a hash of the key's place in the batch and
    /// the epoch: LRU writes the epoch, LFU adds `every` uses (a slot's count is its hits' on
    /// average). 1 (every hit, as every other lookup stamps) until set. Read by the lookups
    /// made after.
    pub fn set_hit_stamp_every(&mut self, every: u32) -> Result<()> {
        if every != 0 && !(every.is_power_of_two() && every <= 1024) {
            return Err(CudaError::internal(format!(
                "a hit stamp rate must be 0 or a power of two up to 1024, not {every}"
            )));
        }
        self.stamp_every = every;
        Ok(())
    }

    /// How the rows are kept.
    pub fn rows(&self) -> RowFormat {
        self.rows
    }

    pub(crate) fn launch_lookup(
        &self,
        keys: &CudaSlice<i64>,
        n: usize,
        out: &mut cudarc::driver::CudaViewMut<'_, f32>,
        out_stride: usize,
        hit: &mut CudaSlice<u8>,
        epoch: u64,
    ) -> Result<()> {
        let slots = self.slots.lock();
        let (n_i, sets, dim, stride) =
            (n as i32, self.sets_field(), self.dim as i32, out_stride as i64);
        let lfu = (self.sketch_width != 0) as i32;
        let f = match self.rows {
            RowFormat::F32 => &self.kernels.lookup,
            RowFormat::F16 => &self.kernels.s16.lookup,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(keys)
            .arg(&n_i)
            .arg(&slots.keys)
            .arg(&slots.stamps)
            .arg(&slots.rows)
            .arg(&sets)
            .arg(&dim)
            .arg(&epoch)
            .arg(&lfu)
            .arg(out)
            .arg(&stride)
            .arg(hit);
        // SAFETY: argument types and order match cache_lookup(_s16), the one for the rows'
        // format; out holds n rows at out_stride.
        unsafe { b.launch(warps_config(n)) }.map_err(cuda_err)?;
        Ok(())
    }

    /// Looks host `keys` up into `rows`: row i at `offset + i * stride` floats. Returns
    /// a hit flag per key (rows of misses are left as they were).
    pub fn lookup_into(
        &self,
        keys: &[i64],
        epoch: u64,
        rows: &mut DeviceRows,
        offset: usize,
        stride: usize,
    ) -> Result<Vec<u8>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let need = offset + (keys.len() - 1) * stride + self.dim;
        if rows.len() < need {
            return Err(CudaError::internal(format!(
                "device rows buffer of {} floats is too small ({need})",
                rows.len()
            )));
        }
        let s = &self.stream;
        let d_keys = s.clone_htod(keys).map_err(cuda_err)?;
        let mut d_hit = s.alloc_zeros::<u8>(keys.len()).map_err(cuda_err)?;
        // rows was written on its own stream: finish that first
        rows.stream.synchronize().map_err(cuda_err)?;
        let mut view = rows.buf.slice_mut(offset..);
        self.launch_lookup(&d_keys, keys.len(), &mut view, stride, &mut d_hit, epoch)?;
        let mut hit = vec![0u8; keys.len()];
        s.memcpy_dtoh(&d_hit, &mut hit).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(hit)
    }

    /// Looks host `keys` up into host `out` (row i at `i * dim`). Returns a hit flag per key.
    pub fn lookup_to_host(&self, keys: &[i64], epoch: u64, out: &mut [f32]) -> Result<Vec<u8>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let s = &self.stream;
        let d_keys = s.clone_htod(keys).map_err(cuda_err)?;
        let mut d_out = s.alloc_zeros::<f32>(keys.len() * self.dim).map_err(cuda_err)?;
        let mut d_hit = s.alloc_zeros::<u8>(keys.len()).map_err(cuda_err)?;
        let mut view = d_out.slice_mut(..);
        self.launch_lookup(&d_keys, keys.len(), &mut view, self.dim, &mut d_hit, epoch)?;
        let mut hit = vec![0u8; keys.len()];
        s.memcpy_dtoh(&d_hit, &mut hit).map_err(cuda_err)?;
        s.memcpy_dtoh(&d_out, out).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(hit)
    }

    /// Inserts (or, with `only_if_present`, refreshes) rows, set by set as `plan` says.
    pub fn write(
        &self,
        keys: &[i64],
        vectors: &[f32],
        plan: &InsertPlan<'_>,
        epoch: u64,
        only_if_present: bool,
    ) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        if let Some(nrows) = self.resident {
            return self.write_resident(keys, vectors, nrows);
        }
        if vectors.len() != keys.len() * self.dim
            || plan.order.len() != keys.len()
            || plan.group_start.len() != plan.group_set.len() + 1
        {
            return Err(CudaError::internal("gpu cache: the insert does not match its keys"));
        }
        let mut slots = self.slots.lock();
        let s = &self.stream;
        let d_keys = s.clone_htod(keys).map_err(cuda_err)?;
        let d_vecs = s.clone_htod(vectors).map_err(cuda_err)?;
        let d_order = s.clone_htod(plan.order).map_err(cuda_err)?;
        let d_starts = s.clone_htod(plan.group_start).map_err(cuda_err)?;
        let d_sets = s.clone_htod(plan.group_set).map_err(cuda_err)?;
        let (groups, dim, flag, width) = (
            plan.group_set.len() as i32,
            self.dim as i32,
            only_if_present as i32,
            self.sketch_width as i64,
        );
        let Slots { keys: sk, stamps, rows, counters, sketch, index, .. } = &mut *slots;
        if self.sketch_width != 0 && !only_if_present {
            // LFU: every key's miss counted before any is placed
            let n = keys.len() as i32;
            let mut c = s.launch_builder(&self.kernels.sketch_count);
            c.arg(&d_keys).arg(&n).arg(&mut *sketch).arg(&width);
            // SAFETY: argument types and order match sketch_count; the sketch holds 2 rows
            // of `width` counters and the kernel reads n keys.
            unsafe { c.launch(threads_config(keys.len())) }.map_err(cuda_err)?;
        }
        let f = match self.rows {
            RowFormat::F32 => &self.kernels.insert,
            RowFormat::F16 => &self.kernels.s16.insert,
        };
        let mut b = s.launch_builder(f);
        b.arg(&d_keys).arg(&d_vecs).arg(&d_order).arg(&d_starts).arg(&d_sets).arg(&groups);
        b.arg(sk).arg(stamps).arg(rows).arg(&dim).arg(&epoch).arg(&flag).arg(counters);
        // under LRU the kernel reads no sketch: a null pointer says so
        let none = 0u64;
        if self.sketch_width == 0 {
            b.arg(&none);
        } else {
            b.arg(sketch);
        }
        b.arg(&width);
        // without a key index the kernel writes none: a null pointer says so
        let irows = self.index_rows as i64;
        if self.index_rows == 0 {
            b.arg(&none);
        } else {
            b.arg(index);
        }
        b.arg(&irows);
        // SAFETY: argument types and order match cache_insert(_s16), the one for the rows'
        // format; the plan's sets are < sets, the index holds index_rows keys' slots.
        unsafe { b.launch(warps_config(plan.group_set.len())) }.map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(())
    }

    /// A resident table's rows written in place (an update, or a fill of rows read below
    /// it): keys past its rows are not resident and are left out; of a key given twice,
    /// the last row stays, as the host tier keeps it.
    fn write_resident(&self, keys: &[i64], vectors: &[f32], nrows: usize) -> Result<()> {
        let dim = self.dim;
        if vectors.len() != keys.len() * dim {
            return Err(CudaError::internal("resident table: the rows do not match the keys"));
        }
        let mut last = std::collections::HashMap::with_capacity(keys.len());
        for (i, &k) in keys.iter().enumerate() {
            if (0..nrows as i64).contains(&k) {
                last.insert(k, i);
            }
        }
        if last.is_empty() {
            return Ok(());
        }
        let mut which: Vec<(i64, usize)> = last.into_iter().collect();
        which.sort_unstable();
        let ks: Vec<i64> = which.iter().map(|&(k, _)| k).collect();
        let vs: Vec<f32> = which
            .iter()
            .flat_map(|&(_, i)| vectors[i * dim..(i + 1) * dim].iter().copied())
            .collect();
        let mut slots = self.slots.lock();
        let s = &self.stream;
        let d_keys = s.clone_htod(&ks).map_err(cuda_err)?;
        let d_vecs = s.clone_htod(&vs).map_err(cuda_err)?;
        let (n, nrows_i, dim_i) = (ks.len() as i32, nrows as i64, dim as i32);
        let f = match self.rows {
            RowFormat::F32 => &self.kernels.resident_write,
            RowFormat::F16 => &self.kernels.s16.resident_write,
        };
        let mut b = s.launch_builder(f);
        b.arg(&d_keys).arg(&n).arg(&d_vecs).arg(&mut slots.rows).arg(&nrows_i).arg(&dim_i);
        // SAFETY: argument types and order match resident_write(_s16), the one for the rows'
        // format; the rows hold nrows rows of dim and the kernel skips keys past them.
        unsafe { b.launch(warps_config(ks.len())) }.map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(())
    }

    /// Waits for everything launched on this cache's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err)
    }

    /// The keys a cache holds (not `empty_key`), least recently stamped first; a resident
    /// table holds none to tell (its rows are all there). Read on the cache's stream, so
    /// every fill queued before is in.
    pub fn held_keys(&self, empty_key: i64) -> Result<Vec<i64>> {
        if self.resident.is_some() {
            return Ok(Vec::new());
        }
        let slots = self.slots.lock();
        let keys = self.stream.clone_dtoh(&slots.keys).map_err(cuda_err)?;
        let stamps = self.stream.clone_dtoh(&slots.stamps).map_err(cuda_err)?;
        self.stream.synchronize().map_err(cuda_err)?;
        let mut held: Vec<(u64, i64)> =
            stamps.into_iter().zip(keys).filter(|&(_, k)| k != empty_key).collect();
        held.sort_unstable();
        Ok(held.into_iter().map(|(_, k)| k).collect())
    }

    /// The device counters: (insertions, evictions).
    pub fn counters(&self) -> Result<(u64, u64)> {
        let slots = self.slots.lock();
        let mut c = [0u64; 2];
        self.stream.memcpy_dtoh(&slots.counters, &mut c).map_err(cuda_err)?;
        self.stream.synchronize().map_err(cuda_err)?;
        Ok((c[0], c[1]))
    }
}

impl Drop for CacheSlots {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}
