//! A buffer of f32 rows in GPU memory that a GPU instance's lookups write into.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, PushKernelArg};

use crate::context::cuda_err;
use crate::error::{CudaError, Result};
use crate::kernels::{self, warps_config, Kernels};
use crate::mem::DeviceView;

/// A buffer of f32 rows in GPU memory that lookups write into (an embedding engine's
/// output on a GPU instance), with the copy-in of rows found below the cache.
pub struct DeviceRows {
    device: i32,
    kernels: Arc<Kernels>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) buf: CudaSlice<f32>,
}

impl DeviceRows {
    pub fn new(device: i32, len: usize) -> Result<DeviceRows> {
        let (g, kernels) = kernels::device(device)?;
        let stream = g.new_stream()?;
        let buf = stream.alloc_zeros::<f32>(len.max(1)).map_err(cuda_err)?;
        stream.synchronize().map_err(cuda_err)?;
        Ok(DeviceRows { device, kernels, stream, buf })
    }
    /// Length in floats.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }
    /// The first `floats` floats as a byte view.
    pub fn view(&self, floats: usize) -> Option<DeviceView<'_>> {
        if floats > self.buf.len() {
            return None;
        }
        let (ptr, _sync) = self.buf.device_ptr(&self.stream);
        // SAFETY: our allocation, alive and unwritten while `&self` is borrowed.
        Some(unsafe { DeviceView::from_raw(self.device, ptr, floats * 4) })
    }
    /// Writes host rows (`dim` floats each) to rows `idx[i]` at `offset + idx[i] * stride`.
    pub fn scatter(
        &mut self,
        rows: &[f32],
        idx: &[usize],
        dim: usize,
        offset: usize,
        stride: usize,
    ) -> Result<()> {
        if idx.is_empty() {
            return Ok(());
        }
        if rows.len() != idx.len() * dim {
            return Err(CudaError::internal(
                "device rows: scatter rows do not match their indices",
            ));
        }
        let max = idx.iter().copied().max().unwrap_or(0);
        if offset + max * stride + dim > self.buf.len() {
            return Err(CudaError::internal("device rows: scatter past the end of the buffer"));
        }
        let s = &self.stream;
        let d_rows = s.clone_htod(rows).map_err(cuda_err)?;
        let idx32: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
        let d_idx = s.clone_htod(&idx32).map_err(cuda_err)?;
        let (n, stride, dim_i) = (idx.len() as i32, stride as i64, dim as i32);
        let mut view = self.buf.slice_mut(offset..);
        let mut b = s.launch_builder(&self.kernels.scatter);
        b.arg(&d_rows).arg(&d_idx).arg(&n).arg(&mut view).arg(&stride).arg(&dim_i);
        // SAFETY: argument types and order match scatter_rows; indices were checked against the buffer.
        unsafe { b.launch(warps_config(idx.len())) }.map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(())
    }
}
