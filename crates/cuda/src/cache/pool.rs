//! Pooled lookups' last step on the GPU: a batch's looked-up rows, bag by bag, reduced to one
//! row each (`pool_bags`).

use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::batch_args::RowFormat;
use crate::buffer::{DeviceMem, DevicePtr};
use crate::context::cuda_err;
use crate::copy::{htod, Queue};
use crate::error::{CudaError, Result};
use crate::kernels::{self, Kernels};
use crate::mem::DeviceView;
use crate::pinned::PinnedBuf;

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
            queue: Queue { device: d, stream: queue.stream.fork().map_err(cuda_err)? },
            kernels,
            offsets: (PinnedBuf::new(d), DeviceMem::growing(d)),
            out: DeviceMem::growing(d),
        })
    }

    /// Pools `rows` (fp32 rows of `dim`, on this GPU, complete) whose bags are table-major:
    /// bag `t * batch + b` holds rows `offsets[bag]..offsets[bag + 1]`. Returns `[batch,
    /// tables, dim]` of `format`, each bag's rows summed in order (divided by their count
    /// when `mean`; an empty bag zeros), valid until the next call. Waits for the kernel.
    pub fn pool(
        &mut self,
        rows: &DeviceView<'_>,
        dim: usize,
        offsets: &[i32],
        batch: usize,
        mean: bool,
        format: RowFormat,
    ) -> Result<DeviceView<'_>> {
        let bags = offsets.len().saturating_sub(1);
        if batch == 0 || bags % batch != 0 || dim == 0 {
            return Err(CudaError::internal(format!(
                "pooling: {bags} bags are not whole tables of a batch of {batch}"
            )));
        }
        let tables = bags / batch;
        let last = offsets[bags].max(0) as usize;
        if rows.device() != self.queue.device || rows.len() < last * dim * 4 {
            return Err(CudaError::internal(format!(
                "pooling: {} bytes of rows on GPU {} for {last} rows of dim {dim} on GPU {}",
                rows.len(),
                rows.device(),
                self.queue.device
            )));
        }
        let q = &self.queue;
        let h = self.offsets.0.slice(offsets.len())?;
        h.copy_from_slice(offsets);
        self.offsets.1.reserve(offsets.len() * 4)?;
        let d_offsets = self.offsets.1.ptr();
        htod(q, d_offsets, h)?;
        let out_bytes = batch * tables * dim * format.size();
        self.out.reserve(out_bytes)?;
        let out = self.out.ptr();
        let d_rows = DevicePtr::of_view(rows)?;
        let (batch_i, tables_i, dim_i, mean_i) =
            (batch as i32, tables as i32, dim as i32, i32::from(mean));
        let f = match format {
            RowFormat::F32 => &self.kernels.pool,
            RowFormat::F16 => &self.kernels.pool_h,
        };
        let mut b = q.stream.launch_builder(f);
        b.arg(&d_rows)
            .arg(&d_offsets)
            .arg(&batch_i)
            .arg(&tables_i)
            .arg(&dim_i)
            .arg(&mean_i)
            .arg(&out);
        let cfg = LaunchConfig {
            grid_dim: (bags as u32, 1, 1),
            block_dim: (dim.next_multiple_of(32).min(256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types and order match pool_bags(_h); `rows` holds every row the
        // offsets name and `out` has room for batch * tables * dim of `format`.
        unsafe { b.launch(cfg) }.map_err(cuda_err)?;
        q.stream.synchronize().map_err(cuda_err)?;
        Ok(self.out.view(out_bytes).expect("reserved above"))
    }
}
