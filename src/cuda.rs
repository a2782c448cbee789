//! The CUDA room's shared part: one context per device (the primary context, shared
//! with libtorch and Triton) and raw copies between buffers Triton or an engine hands
//! us by address. CUDA is loaded at run time (cudarc), so nothing here is needed, or
//! linked, on a machine without a GPU.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{result, CudaContext};
use parking_lot::Mutex;

use crate::error::{Error, Result};

static CONTEXTS: Mutex<Option<HashMap<i64, Arc<CudaContext>>>> = Mutex::new(None);

pub fn cuda_err(e: impl std::fmt::Debug) -> Error {
    Error::internal(format!("CUDA: {e:?}"))
}

/// The device's primary context, bound to the calling thread.
pub fn context(device: i64) -> Result<Arc<CudaContext>> {
    let ctx = {
        let mut guard = CONTEXTS.lock();
        let map = guard.get_or_insert_with(HashMap::new);
        match map.get(&device) {
            Some(c) => c.clone(),
            None => {
                // cudarc loads libcuda on first use and panics when it is absent.
                let c = catch_unwind(AssertUnwindSafe(|| CudaContext::new(device as usize)))
                    .map_err(|_| Error::unavailable("the CUDA driver library (libcuda.so) could not be loaded"))?
                    .map_err(cuda_err)?;
                map.insert(device, c.clone());
                c
            }
        }
    };
    ctx.bind_to_thread().map_err(cuda_err)?;
    Ok(ctx)
}

/// Copies `bytes` from one device address to another (same device), synchronously.
pub fn copy_device_to_device(device: i64, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let _ctx = context(device)?;
    // SAFETY: the caller passes device buffers of at least `bytes` on `device`.
    unsafe { result::memcpy_dtod_sync(dst, src, bytes) }.map_err(cuda_err)
}

/// Copies device memory at `src` into host memory, synchronously.
pub fn copy_device_to_host(device: i64, dst: &mut [u8], src: u64) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let _ctx = context(device)?;
    // SAFETY: the caller passes a device buffer of at least dst.len() bytes.
    unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(cuda_err)
}

/// Copies host bytes to device memory at `dst`, synchronously.
pub fn copy_host_to_device(device: i64, dst: u64, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    let _ctx = context(device)?;
    // SAFETY: the caller passes a device buffer of at least src.len() bytes.
    unsafe { result::memcpy_htod_sync(dst, src) }.map_err(cuda_err)
}

/// A device buffer holding several device buffers copied one after another: a batch
/// input gathered on the GPU from the requests' own GPU buffers.
pub struct GatheredBuffer {
    stream: Arc<cudarc::driver::CudaStream>,
    buf: cudarc::driver::CudaSlice<u8>,
}

impl GatheredBuffer {
    pub fn gather(device: i64, parts: &[(u64, usize)]) -> Result<GatheredBuffer> {
        use cudarc::driver::DevicePtr;
        let ctx = context(device)?;
        let stream = ctx.new_stream().map_err(cuda_err)?;
        let total: usize = parts.iter().map(|p| p.1).sum();
        let buf = stream.alloc_zeros::<u8>(total.max(1)).map_err(cuda_err)?;
        stream.synchronize().map_err(cuda_err)?;
        let base = {
            let (ptr, _sync) = buf.device_ptr(&stream);
            ptr
        };
        let mut at = 0u64;
        for &(addr, len) in parts {
            if len > 0 {
                // SAFETY: each part is a live device buffer of `len` bytes; the destination
                // has room for all of them.
                unsafe { result::memcpy_dtod_sync(base + at, addr, len) }.map_err(cuda_err)?;
            }
            at += len as u64;
        }
        Ok(GatheredBuffer { stream, buf })
    }

    pub fn addr(&self) -> u64 {
        use cudarc::driver::DevicePtr;
        let (ptr, _sync) = self.buf.device_ptr(&self.stream);
        ptr
    }
}
