//! The CUDA driver through cudarc: one registry of per-device state (the primary
//! context, shared with libtorch and Triton, a copy stream, and the GPU cache's
//! kernels once compiled), raw copies behind `unsafe fn`, and [`Cuda`], the
//! [`DeviceOps`] the serving path uses on a GPU machine.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, CudaContext, CudaSlice, CudaStream, DevicePtr};
use parking_lot::Mutex;

use crate::mem::{copy_host, Bytes, BytesMut, DeviceBuffer, DeviceOps, DeviceView, DeviceViewMut};
use crate::{CudaError, Result};

pub(crate) fn cuda_err(e: impl std::fmt::Debug) -> CudaError {
    CudaError::internal(format!("CUDA: {e:?}"))
}

/// What the process keeps per GPU.
pub struct GpuState {
    pub(crate) ctx: Arc<CudaContext>,
    /// Stream for the serving path's copies and gathers.
    pub(crate) copy_stream: Arc<CudaStream>,
    /// The GPU cache's kernels, compiled on first use.
    pub(crate) kernels: OnceLock<std::result::Result<Arc<crate::cache::Kernels>, CudaError>>,
}

static DEVICES: Mutex<Option<HashMap<i32, Arc<GpuState>>>> = Mutex::new(None);

/// The device's state, its context bound to the calling thread.
pub fn gpu(device: i32) -> Result<Arc<GpuState>> {
    let state = {
        let mut guard = DEVICES.lock();
        let map = guard.get_or_insert_with(HashMap::new);
        match map.get(&device) {
            Some(s) => s.clone(),
            None => {
                // cudarc loads libcuda on first use and panics when it is absent.
                let ctx = catch_unwind(AssertUnwindSafe(|| CudaContext::new(device as usize)))
                    .map_err(|_| {
                        CudaError::unavailable(
                            "the CUDA driver library (libcuda.so) could not be loaded",
                        )
                    })?
                    .map_err(cuda_err)?;
                let copy_stream = ctx.new_stream().map_err(cuda_err)?;
                let s = Arc::new(GpuState { ctx, copy_stream, kernels: OnceLock::new() });
                map.insert(device, s.clone());
                s
            }
        }
    };
    state.ctx.bind_to_thread().map_err(cuda_err)?;
    Ok(state)
}

impl GpuState {
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// A new stream on this device (one per cache, or per instance).
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().map_err(cuda_err)
    }
}

/// An owned device allocation of bytes with the stream it was made on.
pub(crate) struct CudaBytes {
    device: i32,
    stream: Arc<CudaStream>,
    buf: CudaSlice<u8>,
}

impl CudaBytes {
    pub(crate) fn device(&self) -> i32 {
        self.device
    }
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }
    pub(crate) fn addr(&self) -> u64 {
        let (ptr, _sync) = self.buf.device_ptr(&self.stream);
        ptr
    }
}

// Every copy below is complete when it returns. The driver's "synchronous" cuMemcpyDtoD
// and cuMemcpyHtoD (from pageable memory) may return before the data has landed, and our
// streams do not wait on the legacy default stream, so a buffer reused by the next
// execution could be overwritten while still being read: those two are queued on the
// device's copy stream and waited for. cuMemcpyDtoH into pageable memory does return
// only once done, and is kept.

/// Asks the driver whether `addr .. addr + len` lies inside one live allocation on GPU
/// `device`.
fn check_allocated(device: i32, addr: u64, len: usize) -> Result<()> {
    use cudarc::driver::sys::{cuPointerGetAttribute, CUpointer_attribute as A, CUresult};
    gpu(device)?;
    let (mut start, mut size, mut ordinal) = (0u64, 0usize, -1i32);
    let ask = |out: *mut std::ffi::c_void, what: A| -> Result<()> {
        // SAFETY: `out` points at a live value of the type the driver writes for `what`
        // (CUdeviceptr, size_t, int); the driver only reads `addr` as a number.
        match unsafe { cuPointerGetAttribute(out, what, addr) } {
            CUresult::CUDA_SUCCESS => Ok(()),
            e => Err(CudaError::internal(format!(
                "address {addr:#x} is not device memory the driver knows ({e:?})"
            ))),
        }
    };
    ask((&mut start as *mut u64).cast(), A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)?;
    ask((&mut size as *mut usize).cast(), A::CU_POINTER_ATTRIBUTE_RANGE_SIZE)?;
    ask((&mut ordinal as *mut i32).cast(), A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)?;
    let end = addr
        .checked_add(len as u64)
        .ok_or_else(|| CudaError::internal("device range overflows"))?;
    if ordinal != device || addr < start || end > start + size as u64 {
        return Err(CudaError::internal(format!(
            "{len} bytes at {addr:#x} on GPU {device} are not inside one allocation (the driver has {size} bytes at {start:#x} on GPU {ordinal})"
        )));
    }
    Ok(())
}

/// A view of `len` bytes at `addr` in a device allocation that `owner` keeps alive (an
/// engine's output tensor, say), for as long as `owner` is borrowed. The range is checked
/// against the driver's own record of live allocations first, so a wrong address or
/// length is an error, not a wild copy.
pub fn view_in<'a, O: ?Sized>(
    _owner: &'a O,
    device: i32,
    addr: u64,
    len: usize,
) -> Result<DeviceView<'a>> {
    check_allocated(device, addr, len)?;
    // SAFETY: the driver has just confirmed the range is allocated on `device`; the
    // borrow of its owner keeps it so for 'a.
    Ok(unsafe { DeviceView::from_raw(device, addr, len) })
}

/// The writable form of [`view_in`]: `owner` is borrowed mutably, so nothing else reads
/// or writes the allocation through it while the view lives.
pub fn view_mut_in<'a, O: ?Sized>(
    _owner: &'a mut O,
    device: i32,
    addr: u64,
    len: usize,
) -> Result<DeviceViewMut<'a>> {
    check_allocated(device, addr, len)?;
    // SAFETY: as in view_in, with the owner borrowed exclusively for 'a.
    Ok(unsafe { DeviceViewMut::from_raw(device, addr, len) })
}

/// Copies `len` bytes between device addresses (same device); done when it returns.
///
/// # Safety
/// Both ranges must be live device memory on `device`, and must not overlap.
pub unsafe fn copy_dtod_raw(device: i32, dst: u64, src: u64, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let g = gpu(device)?;
    // SAFETY: the caller's contract; the stream is this device's.
    unsafe { result::memcpy_dtod_async(dst, src, len, g.copy_stream.cu_stream()) }
        .map_err(cuda_err)?;
    g.copy_stream.synchronize().map_err(cuda_err)
}

/// Copies device memory at `src` into host memory; done when it returns.
///
/// # Safety
/// `src .. src + dst.len()` must be live device memory on `device`.
pub unsafe fn copy_dtoh_raw(device: i32, dst: &mut [u8], src: u64) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    gpu(device)?;
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(cuda_err)
}

/// Copies host bytes to device memory at `dst`; done when it returns.
///
/// # Safety
/// `dst .. dst + src.len()` must be live device memory on `device`, not in use elsewhere.
pub unsafe fn copy_htod_raw(device: i32, dst: u64, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    let g = gpu(device)?;
    // SAFETY: the caller's contract; `src` outlives the wait below.
    unsafe { result::memcpy_htod_async(dst, src, g.copy_stream.cu_stream()) }.map_err(cuda_err)?;
    g.copy_stream.synchronize().map_err(cuda_err)
}

/// A new allocation of `len` bytes on `device` (zeroed; at least one byte).
pub fn alloc(device: i32, len: usize) -> Result<DeviceBuffer> {
    alloc_bytes(device, len).map(DeviceBuffer::cuda)
}

fn alloc_bytes(device: i32, len: usize) -> Result<CudaBytes> {
    let g = gpu(device)?;
    let stream = g.copy_stream.clone();
    let buf = stream.alloc_zeros::<u8>(len.max(1)).map_err(cuda_err)?;
    stream.synchronize().map_err(cuda_err)?;
    Ok(CudaBytes { device, stream, buf })
}

pub(crate) fn real(addr: Option<u64>) -> Result<u64> {
    addr.ok_or_else(|| CudaError::internal("a simulated device buffer reached the CUDA driver"))
}

/// The real GPU: [`DeviceOps`] through the CUDA driver.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cuda;

impl DeviceOps for Cuda {
    fn copy(&self, src: Bytes<'_>, dst: BytesMut<'_>) -> Result<()> {
        if src.len() != dst.len() {
            return Err(CudaError::internal(format!(
                "copy of {} bytes into a buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        // SAFETY (every arm): views are only made from live allocations (their
        // constructors' contracts), and the lengths were checked above.
        match (src, dst) {
            (Bytes::Host(s), BytesMut::Host(d)) => copy_host(s, d),
            (Bytes::Device(s), BytesMut::Host(d)) => unsafe {
                copy_dtoh_raw(s.device(), d, real(s.raw_addr())?)
            },
            (Bytes::Host(s), BytesMut::Device(d)) => unsafe {
                copy_htod_raw(d.device(), real(d.raw_addr())?, s)
            },
            (Bytes::Device(s), BytesMut::Device(d)) if s.device() == d.device() => unsafe {
                copy_dtod_raw(d.device(), real(d.raw_addr())?, real(s.raw_addr())?, s.len())
            },
            (Bytes::Device(s), BytesMut::Device(d)) => {
                // another GPU: through the host (rare: Triton places a step's buffers on its device)
                let mut staged = vec![0u8; s.len()];
                unsafe {
                    copy_dtoh_raw(s.device(), &mut staged, real(s.raw_addr())?)?;
                    copy_htod_raw(d.device(), real(d.raw_addr())?, &staged)
                }
            }
        }
    }

    fn alloc(&self, device: i32, bytes: usize) -> Result<DeviceBuffer> {
        alloc(device, bytes)
    }

    fn gather(&self, device: i32, parts: &[DeviceView<'_>]) -> Result<DeviceBuffer> {
        let total: usize = parts.iter().map(DeviceView::len).sum();
        let out = alloc_bytes(device, total)?;
        let base = out.addr();
        let mut at = 0u64;
        for p in parts {
            if p.device() != device {
                return Err(CudaError::internal(format!(
                    "gather on GPU {device} was given a buffer on GPU {}",
                    p.device()
                )));
            }
            if !p.is_empty() {
                // SAFETY: each part is a live view on `device`; the new buffer has room for all.
                unsafe {
                    result::memcpy_dtod_async(
                        base + at,
                        real(p.raw_addr())?,
                        p.len(),
                        out.stream.cu_stream(),
                    )
                }
                .map_err(cuda_err)?;
            }
            at += p.len() as u64;
        }
        out.stream.synchronize().map_err(cuda_err)?;
        Ok(DeviceBuffer::cuda(out))
    }
}
