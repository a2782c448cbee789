//! What only the benchmark programs use (feature `bench`, off in the product build): keys
//! kept on the GPU and a lookup launched without waiting, to time the hit path's kernel
//! alone (`crates/embedding/examples/gpu_cache_check.rs`).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::rows::DeviceRows;
use super::slots::CacheSlots;
use crate::context::{cuda_err, gpu};
use crate::error::{CudaError, Result};

/// Keys copied to the GPU once, with the hit flags of their last lookup.
pub struct DeviceKeys {
    stream: Arc<CudaStream>,
    keys: CudaSlice<i64>,
    hit: CudaSlice<u8>,
    len: usize,
}

impl DeviceKeys {
    pub fn new(device: i32, keys: &[i64]) -> Result<DeviceKeys> {
        let stream = gpu(device)?.new_stream()?;
        let d_keys = stream.clone_htod(keys).map_err(cuda_err)?;
        let hit = stream.alloc_zeros::<u8>(keys.len().max(1)).map_err(cuda_err)?;
        stream.synchronize().map_err(cuda_err)?;
        Ok(DeviceKeys { stream, keys: d_keys, hit, len: keys.len() })
    }
    /// Hit flag per key of the last lookup.
    pub fn hits(&self) -> Result<Vec<u8>> {
        let mut hit = vec![0u8; self.hit.len()];
        self.stream.memcpy_dtoh(&self.hit, &mut hit).map_err(cuda_err)?;
        self.stream.synchronize().map_err(cuda_err)?;
        hit.truncate(self.len);
        Ok(hit)
    }
}

impl CacheSlots {
    /// Launches a lookup of keys already on the GPU into `rows` (row i at `i * stride`
    /// floats) and returns without waiting: the kernel alone, for the hit-path benchmark.
    pub fn launch_resident(
        &self,
        keys: &mut DeviceKeys,
        epoch: u64,
        rows: &mut DeviceRows,
        stride: usize,
    ) -> Result<()> {
        let n = keys.len;
        if n == 0 {
            return Ok(());
        }
        if rows.len() < (n - 1) * stride + self.dim() {
            return Err(CudaError::internal("device rows buffer is too small"));
        }
        keys.stream.synchronize().map_err(cuda_err)?;
        rows.stream.synchronize().map_err(cuda_err)?;
        let mut view = rows.buf.slice_mut(..);
        self.launch_lookup(&keys.keys, n, &mut view, stride, &mut keys.hit, epoch)
    }
}
