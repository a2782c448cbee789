//! Pooled lookups on the GPU: a batch's looked-up rows, bag by bag, reduced to one row each
//! (`pool_bags`, [`Pooler`]), or, over resident tables, each bag's rows read and reduced in
//! one kernel from the keys as sent (`pool_resident`, [`ResidentPool`]).

use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::batch_args::{BatchKeys, RowFormat};
use super::slots::{CacheSlots, SlotsDesc};
use crate::buffer::{DeviceMem, DevicePtr};
use crate::context::cuda_err;
use crate::copy::{dtoh, htod, htod_now, zero, Queue};
use crate::error::{CudaError, Result};
use crate::kernels::{self, threads_config, Kernels};
use crate::mem::{DeviceView, DeviceViewMut};
use crate::pinned::PinnedBuf;
use crate::upload::{int_bytes, Uploader};

/// Reduces bags of rows to one row each, into a buffer of its own (grown as batches grow).
pub struct Pooler {
    queue: Queue,
    kernels: Arc<Kernels>,
    offsets: (PinnedBuf<i32>, DeviceMem),
    out: DeviceMem,
}

impl Pooler {
    /// A pooler on `queue`'s GPU, running on a stream of its own.
    pub fn new(queue: &Queue) -> Result<Pooler> {
        let (_, kernels) = kernels::device(queue.device)?;
        let d = queue.device;
        Ok(Pooler {
            queue: queue.another()?,
            kernels,
            offsets: (PinnedBuf::new(d), DeviceMem::growing(d)),
            out: DeviceMem::growing(d),
        })
    }

    /// Pools `rows` (rows of `dim` kept as `stored`, fp32 or fp16, on this GPU, complete)
    /// whose bags are table-major:
    /// bag `t * batch + b` holds rows `offsets[bag]..offsets[bag + 1]`. Returns `[batch,
    /// tables, dim]` of `format`, each bag's rows summed in order (divided by their count
    /// when `mean`; an empty bag zeros), valid until the next call. Waits for the kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn pool(
        &mut self,
        rows: &DeviceView<'_>,
        stored: RowFormat,
        dim: usize,
        offsets: &[i32],
        batch: usize,
        mean: bool,
        format: RowFormat,
    ) -> Result<DeviceView<'_>> {
        let bags = offsets.len().saturating_sub(1);
        if batch == 0 || !bags.is_multiple_of(batch) || dim == 0 {
            return Err(CudaError::internal(format!(
                "pooling: {bags} bags are not whole tables of a batch of {batch}"
            )));
        }
        let tables = bags / batch;
        self.check_rows(rows, stored, offsets[bags].max(0) as usize, dim)?;
        self.launch(rows, stored, dim, offsets, None, batch, tables, mean, format)
    }

    /// Pools the rows a batch lookup wrote for keys of fixed hotness as sent (`rows`: kept as
    /// `stored`, row i for key i of `[batch, width]`, on this GPU, complete): bag (b, t) is rows
    /// `b * width + at[t] .. b * width + at[t + 1]`, every bag full (`at`: `tables + 1`
    /// starts, the last `width`). Returns `[batch, tables, dim]` of `format`, each bag's rows
    /// summed in key order (divided by their count when `mean`), valid until the next call;
    /// the same sums as [`Pooler::pool`] over the same bags. Waits for the kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn pool_fixed(
        &mut self,
        rows: &DeviceView<'_>,
        stored: RowFormat,
        dim: usize,
        width: usize,
        at: &[i32],
        batch: usize,
        mean: bool,
        format: RowFormat,
    ) -> Result<DeviceView<'_>> {
        let tables = at.len().saturating_sub(1);
        let whole = at.last().is_some_and(|&w| w as usize == width) && width <= i32::MAX as usize;
        if batch == 0 || tables == 0 || dim == 0 || !whole {
            return Err(CudaError::internal(format!(
                "pooling: {tables} tables of a {width}-key sample over a batch of {batch}"
            )));
        }
        self.check_rows(rows, stored, batch * width, dim)?;
        self.launch(rows, stored, dim, at, Some(width as i32), batch, tables, mean, format)
    }

    /// Whether `rows` (kept as `stored`) are on this pooler's GPU and hold `count` rows of `dim`.
    fn check_rows(
        &self,
        rows: &DeviceView<'_>,
        stored: RowFormat,
        count: usize,
        dim: usize,
    ) -> Result<()> {
        if rows.device() != self.queue.device || rows.len() < count * dim * stored.size() {
            return Err(CudaError::internal(format!(
                "pooling: {} bytes of rows on GPU {} for {count} rows of dim {dim} on GPU {}",
                rows.len(),
                rows.device(),
                self.queue.device
            )));
        }
        Ok(())
    }

    /// One pooling kernel over `batch * tables` bags: `pool_bags` with `bounds` the bags'
    /// offsets, or `pool_fixed` with `bounds` a sample's table starts and its `width`.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        rows: &DeviceView<'_>,
        stored: RowFormat,
        dim: usize,
        bounds: &[i32],
        width: Option<i32>,
        batch: usize,
        tables: usize,
        mean: bool,
        format: RowFormat,
    ) -> Result<DeviceView<'_>> {
        let q = &self.queue;
        let h = self.offsets.0.slice(bounds.len())?;
        h.copy_from_slice(bounds);
        self.offsets.1.reserve(bounds.len() * 4)?;
        let d_bounds = self.offsets.1.ptr();
        htod(q, d_bounds, h)?;
        let out_bytes = batch * tables * dim * format.size();
        self.out.reserve(out_bytes)?;
        let out = self.out.ptr();
        let d_rows = DevicePtr::of_view(rows)?;
        let (batch_i, tables_i, dim_i, mean_i) =
            (batch as i32, tables as i32, dim as i32, i32::from(mean));
        let k = &self.kernels;
        let f = match (stored, width.is_some(), format) {
            (RowFormat::F32, false, RowFormat::F32) => &k.pool,
            (RowFormat::F32, false, RowFormat::F16) => &k.pool_h,
            (RowFormat::F32, true, RowFormat::F32) => &k.pool_fixed,
            (RowFormat::F32, true, RowFormat::F16) => &k.pool_fixed_h,
            (RowFormat::F16, false, RowFormat::F32) => &k.s16.pool,
            (RowFormat::F16, false, RowFormat::F16) => &k.s16.pool_h,
            (RowFormat::F16, true, RowFormat::F32) => &k.s16.pool_fixed,
            (RowFormat::F16, true, RowFormat::F16) => &k.s16.pool_fixed_h,
        };
        let mut b = q.stream.launch_builder(f);
        b.arg(&d_rows).arg(&d_bounds);
        if let Some(w) = width.as_ref() {
            b.arg(w);
        }
        b.arg(&batch_i).arg(&tables_i).arg(&dim_i).arg(&mean_i).arg(&out);
        let cfg = LaunchConfig {
            grid_dim: ((batch * tables) as u32, 1, 1),
            block_dim: (dim.next_multiple_of(32).min(256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types and order match pool_bags(_h)(_s16) (rows, offsets, batch,
        // tables, dim, mean, out) or pool_fixed(_h)(_s16) (the same with the width after the
        // starts), the one for the rows' format `stored` and `format`;
        // `rows` holds every row the bounds name (the callers' checks) and `out` has room for
        // batch * tables * dim of `format`.
        unsafe { b.launch(cfg) }.map_err(cuda_err)?;
        q.stream.synchronize().map_err(cuda_err)?;
        Ok(self.out.view(out_bytes).expect("reserved above"))
    }
}

/// How a batch's keys form its bags, for [`ResidentPool::run`].
#[derive(Debug, Clone, Copy)]
pub enum BagLayout<'a> {
    /// Each sample's `width` keys; table t's bag is `at[t]..at[t + 1]` of them, padded with
    /// -1 (fixed hotness: `[batch, Σ hotness]` as sent).
    Fixed { width: usize, at: &'a [i32] },
    /// Bag (b, t) is keys `at[b * tables + t]..at[b * tables + t + 1]` (ragged: the keys as
    /// sent, each sample's tables in order, `batch * tables + 1` starts).
    Ragged { at: &'a [i32] },
}

/// A pooled lookup over resident tables (every table's rows on this GPU, row = key): one
/// kernel reads each bag's rows where they are and writes only the pooled rows, `[batch,
/// tables, dim]`, taking the keys where the request had them (GPU memory as they are, host
/// keys in one copy). Runs on the caches' queue, so an update's rows are never read half
/// written. A key that is no row of its table makes the run report a miss and its rows
/// incomplete: the caller answers that batch by the path that reads below the GPU.
pub struct ResidentPool {
    queue: Queue,
    kernels: Arc<Kernels>,
    /// Every table's descriptor, on the GPU, and the slots it names (held so they outlive
    /// every kernel queued here).
    desc: DeviceMem,
    _slots: Vec<SlotsDesc>,
    tables: usize,
    dim: usize,
    stored: RowFormat,
    format: RowFormat,
    /// Keys sent in host memory go up through the uploader's page-locked buffer, copied into
    /// it by several threads while its chunks are already on their way.
    keys: (Uploader, DeviceMem),
    at: (PinnedBuf<i32>, DeviceMem),
    count: (PinnedBuf<u32>, DeviceMem),
    out: DeviceMem,
}

impl ResidentPool {
    /// A pooled lookup over `tables` on `queue`, pooled rows written as `format`; `None`
    /// unless every table is resident, all of one dim and row format, and a row is whole
    /// 16-byte pieces (what a lane reads).
    pub fn new(
        queue: &Queue,
        tables: &[&CacheSlots],
        format: RowFormat,
    ) -> Result<Option<ResidentPool>> {
        let Some(first) = tables.first() else { return Ok(None) };
        let (dim, stored) = (first.dim(), first.rows());
        if tables
            .iter()
            .any(|t| t.resident_rows().is_none() || t.dim() != dim || t.rows() != stored)
            || dim == 0
            || (dim * stored.size()) % 16 != 0
        {
            return Ok(None);
        }
        let (_, kernels) = kernels::device(queue.device)?;
        let slots: Vec<SlotsDesc> = tables.iter().map(|t| t.descriptor()).collect();
        let fields: Vec<i64> = slots.iter().flat_map(|s| s.fields).collect();
        let d = queue.device;
        let mut desc = DeviceMem::growing(d);
        desc.reserve(fields.len() * 8)?;
        htod_now(d, desc.ptr(), &fields)?;
        Ok(Some(ResidentPool {
            queue: queue.clone(),
            kernels,
            desc,
            _slots: slots,
            tables: tables.len(),
            dim,
            stored,
            format,
            keys: (Uploader::new(d)?, DeviceMem::growing(d)),
            at: (PinnedBuf::new(d), DeviceMem::growing(d)),
            count: (PinnedBuf::new(d), DeviceMem::growing(d)),
            out: DeviceMem::growing(d),
        }))
    }

    /// Pools `batch` samples' bags of `keys` (laid out as `bags` says) into `out` when
    /// given (GPU memory on this GPU with room for `[batch, tables, dim]` of the format),
    /// else into this pool's own buffer ([`ResidentPool::rows`]); each bag's rows summed in
    /// key order, divided by its count when `mean`, an empty bag zeros. Returns how many
    /// keys were no row of their table (then the rows are not the answer). Waits for the
    /// kernel.
    pub fn run(
        &mut self,
        keys: BatchKeys<'_>,
        bags: BagLayout<'_>,
        batch: usize,
        mean: bool,
        out: Option<&mut DeviceViewMut<'_>>,
    ) -> Result<usize> {
        let (tables, dim) = (self.tables, self.dim);
        let (width, at, ragged) = match bags {
            BagLayout::Fixed { width, at } if at.len() == tables + 1 => (width, at, 0),
            BagLayout::Ragged { at } if at.len() == batch * tables + 1 => (0, at, 1),
            _ => {
                return Err(CudaError::internal(format!(
                    "resident pooling: bag starts that do not match {tables} tables of a batch of {batch}"
                )))
            }
        };
        let needed = if ragged == 1 { at[batch * tables].max(0) as usize } else { batch * width };
        if keys.len() < needed {
            return Err(CudaError::internal(format!(
                "resident pooling: {} keys for bags that need {needed}",
                keys.len()
            )));
        }
        let out_bytes = batch * tables * dim * self.format.size();
        if let Some(o) = &out {
            if o.device() != self.queue.device || o.len() < out_bytes {
                return Err(CudaError::internal(format!(
                    "resident pooling: {} bytes on GPU {} for {out_bytes} bytes of rows on GPU {}",
                    o.len(),
                    o.device(),
                    self.queue.device
                )));
            }
        }
        if batch == 0 {
            return Ok(0);
        }
        let q = &self.queue;
        let d_keys = match keys {
            BatchKeys::Device(v) => {
                if v.device() != q.device {
                    return Err(CudaError::internal(format!(
                        "resident pooling: keys on GPU {} for a lookup on GPU {}",
                        v.device(),
                        q.device
                    )));
                }
                DevicePtr::of_view(&v)?.raw()
            }
            BatchKeys::Host(k) => {
                // the last run waited for its kernel, so nothing still reads the old keys
                self.keys.1.reserve(needed.max(1) * 8)?;
                let (dst, _) = self.keys.1.view_mut().split_at(needed * 8);
                self.keys.0.upload(int_bytes(&k[..needed]), dst)?; // done when it returns
                self.keys.1.ptr().raw()
            }
        };
        let h_at = self.at.0.slice(at.len())?;
        h_at.copy_from_slice(at);
        self.at.1.reserve(at.len() * 4)?;
        htod(q, self.at.1.ptr(), h_at)?;
        self.count.1.reserve(4)?;
        zero(q, self.count.1.ptr(), 4)?;
        let d_out = match out {
            Some(o) => DevicePtr::of_view_mut(o)?.raw(),
            None => {
                self.out.reserve(out_bytes)?;
                self.out.ptr().raw()
            }
        };
        let lanes = dim * self.stored.size() / 16;
        let set = match self.stored {
            RowFormat::F32 => (&self.kernels.pool_resident, &self.kernels.pool_resident_h),
            RowFormat::F16 => (&self.kernels.s16.pool_resident, &self.kernels.s16.pool_resident_h),
        };
        let f = if self.format == RowFormat::F16 { set.1 } else { set.0 };
        let (batch_i, width_i, tables_i, dim_i, lanes_i, mean_i) =
            (batch as i32, width as i32, tables as i32, dim as i32, lanes as i32, i32::from(mean));
        let (d_at, d_desc, d_count) = (self.at.1.ptr(), self.desc.ptr(), self.count.1.ptr());
        let mut b = q.stream.launch_builder(f);
        b.arg(&d_keys)
            .arg(&batch_i)
            .arg(&width_i)
            .arg(&tables_i)
            .arg(&d_at)
            .arg(&ragged)
            .arg(&d_desc)
            .arg(&dim_i)
            .arg(&lanes_i)
            .arg(&mean_i)
            .arg(&d_out)
            .arg(&d_count);
        // SAFETY: argument types and order match pool_resident*, the one for the tables'
        // and the output's formats; the keys hold every bag `at` names (checked above), the
        // descriptors name resident tables of dim `dim` held by `_slots`, and the output
        // has room for batch * tables * dim of the format.
        unsafe { b.launch(threads_config(batch * tables * lanes)) }.map_err(cuda_err)?;
        let h_count = self.count.0.slice(1)?;
        dtoh(q, h_count, d_count)?;
        q.stream.record_event(None).map_err(cuda_err)?.synchronize().map_err(cuda_err)?;
        Ok(h_count[0] as usize)
    }

    /// The last run's pooled rows in this pool's own buffer.
    pub fn rows(&self, batch: usize) -> Option<DeviceView<'_>> {
        self.out.view(batch * self.tables * self.dim * self.format.size())
    }

    pub fn format(&self) -> RowFormat {
        self.format
    }
}
