//! Contexts and streams: one registry of per-device state (the primary context, shared with
//! libtorch and Triton; each thread's copy stream on it), driver errors as [`CudaError`]s with their code,
//! and views of memory other code owns, checked against the driver's own record first.
//! Above the vocabulary only; it owns no memory.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{result::DriverError, CudaContext, CudaStream};
use parking_lot::Mutex;

use crate::error::{CudaError, Result};
use crate::mem::{DeviceView, DeviceViewMut};

/// A driver failure as a [`CudaError`] that keeps the driver's code.
pub(crate) fn cuda_err(e: DriverError) -> CudaError {
    CudaError::driver(e.0 as i32, format!("CUDA: {e:?}"))
}

/// What the process keeps per GPU.
pub struct GpuState {
    pub(crate) ctx: Arc<CudaContext>,
}

// Process-wide because CUDA is: one primary context per device per process.
static DEVICES: Mutex<Option<HashMap<i32, Arc<GpuState>>>> = Mutex::new(None);

/// The device's state, its context bound to the calling thread.
pub fn gpu(device: i32) -> Result<Arc<GpuState>> {
    let state = state(device)?;
    state.ctx.bind_to_thread().map_err(cuda_err)?;
    Ok(state)
}

/// The device's state (made on first use), whatever context the calling thread has bound
/// afterwards: callers that go on with another device bind that one last.
pub(crate) fn state(device: i32) -> Result<Arc<GpuState>> {
    Ok({
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
                keep_freed_memory(&ctx, device);
                wait_policy(&ctx, device, std::env::var("TRITON_RUST_CUDA_SCHED").ok().as_deref())?;
                let s = Arc::new(GpuState { ctx });
                map.insert(device, s.clone());
                s
            }
        }
    })
}

/// How many GPUs the driver shows this process.
pub fn gpu_count() -> Result<i32> {
    catch_unwind(CudaContext::device_count)
        .map_err(|_| {
            CudaError::unavailable("the CUDA driver library (libcuda.so) could not be loaded")
        })?
        .map_err(cuda_err)
}

/// Lets every GPU of `gpus` read the others' memory from its kernels (peer access over NVLink
/// or PCIe), in both directions. An error names a pair that cannot.
pub fn enable_peer_access(gpus: &[i32]) -> Result<()> {
    use cudarc::driver::sys::{cuCtxEnablePeerAccess, cuDeviceCanAccessPeer, CUresult};
    let states = gpus.iter().map(|&g| state(g)).collect::<Result<Vec<_>>>()?;
    for (a, sa) in gpus.iter().zip(&states) {
        for (b, sb) in gpus.iter().zip(&states) {
            if a == b {
                continue;
            }
            let mut can = 0i32;
            // SAFETY: a driver query on two live devices; `can` outlives the call.
            let r =
                unsafe { cuDeviceCanAccessPeer(&mut can, sa.ctx.cu_device(), sb.ctx.cu_device()) };
            if r != CUresult::CUDA_SUCCESS || can == 0 {
                return Err(CudaError::unavailable(format!(
                    "GPU {a} cannot read GPU {b}'s memory (no peer access between them{})",
                    if r == CUresult::CUDA_SUCCESS { String::new() } else { format!(": {r:?}") }
                )));
            }
            sa.ctx.bind_to_thread().map_err(cuda_err)?;
            // SAFETY: both contexts are live primary contexts; flags must be 0.
            match unsafe { cuCtxEnablePeerAccess(sb.ctx.cu_ctx(), 0) } {
                CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
                e => {
                    return Err(CudaError::driver(
                        e as i32,
                        format!("CUDA: peer access from GPU {a} to GPU {b}: {e:?}"),
                    ))
                }
            }
            // peer access covers cuMemAlloc'd memory only; stream-ordered allocations (the
            // cache's rows among them) need their pool opened to the peer as well
            if sb.ctx.has_async_alloc() {
                pool_access(*a, sb, *b)?;
            }
        }
    }
    Ok(())
}

/// Lets GPU `reader`'s kernels read and write what GPU `owner`'s default memory pool hands out.
fn pool_access(reader: i32, owner_state: &GpuState, owner: i32) -> Result<()> {
    use cudarc::driver::sys;
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: reader,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: a driver call on a live device's default pool; `desc` outlives it.
    let r = default_pool(&owner_state.ctx)
        .map_or_else(|e| e, |pool| unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) });
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(CudaError::driver(
            r as i32,
            format!("CUDA: GPU {reader} reading GPU {owner}'s memory pool: {r:?}"),
        ));
    }
    Ok(())
}

/// Bytes free on GPU `device` now.
pub fn free_memory(device: i32) -> Result<u64> {
    gpu(device)?;
    let (free, _total) = cudarc::driver::result::mem_get_info().map_err(cuda_err)?;
    Ok(free as u64)
}

thread_local! {
    /// Each thread's stream per device for the serving path's copies and gathers: an
    /// instance's thread waits for its own copies only, never behind another instance's.
    static COPY_STREAMS: std::cell::RefCell<HashMap<i32, Arc<CudaStream>>> =
        std::cell::RefCell::new(HashMap::new());
}

/// The calling thread's copy stream on `device` (made on first use), the device's context
/// bound to the thread.
pub(crate) fn copy_stream(device: i32) -> Result<Arc<CudaStream>> {
    let g = gpu(device)?;
    COPY_STREAMS.with(|streams| {
        if let Some(s) = streams.borrow().get(&device) {
            return Ok(s.clone());
        }
        let s = g.new_stream()?;
        streams.borrow_mut().insert(device, s.clone());
        Ok(s)
    })
}

/// Keeps the memory freed in stream order (gathered batches, staged inputs) in the device's
/// default pool for the next allocation, instead of the pool's default of handing it back to
/// the driver at every synchronisation, after which each gather mapped its memory anew. The
/// pool serves this process's stream-ordered allocations only (Triton and libtorch allocate
/// their own way); it holds at most what was in use at once. A failure costs speed only.
fn keep_freed_memory(ctx: &CudaContext, device: i32) {
    use cudarc::driver::sys;
    if !ctx.has_async_alloc() {
        return;
    }
    let mut keep: u64 = u64::MAX;
    // SAFETY: a driver call on a live device's default pool; `keep` outlives it.
    let r = default_pool(ctx).map_or_else(
        |e| e,
        |pool| unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
        },
    );
    if r != sys::CUresult::CUDA_SUCCESS {
        log::warn!("GPU {device}: cannot keep freed memory in the default pool ({r:?}); stream-ordered allocations map memory anew");
    }
}

/// How a thread waiting for this device's work waits, for every wait in the process (the
/// primary context is shared with libtorch and ONNX Runtime): `TRITON_RUST_CUDA_SCHED` in the
/// server's environment, `spin`, `yield` or `block` (CUDA's scheduling flags, set on the live
/// context, CUDA 12.1 or later); unset, CUDA's own choice, which spins while the process has
/// fewer contexts than cores. A spinning wait holds a core that the store's readers could
/// use; a blocking one gives it up and wakes later. Any other value, or a driver that refuses,
/// fails the device's first use with the reason.
fn wait_policy(ctx: &CudaContext, device: i32, set: Option<&str>) -> Result<()> {
    use cudarc::driver::sys::{self, CUctx_flags as F};
    let Some(set) = set else { return Ok(()) };
    let sched = sched_flag(set)?;
    ctx.bind_to_thread().map_err(cuda_err)?;
    let mut flags: std::ffi::c_uint = 0;
    // SAFETY: driver calls on the context just bound to this thread; `flags` outlives them.
    let r = unsafe {
        match sys::cuCtxGetFlags(&mut flags) {
            sys::CUresult::CUDA_SUCCESS => sys::cuCtxSetFlags(
                (flags & !(F::CU_CTX_SCHED_MASK as std::ffi::c_uint)) | sched as std::ffi::c_uint,
            ),
            e => e,
        }
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(CudaError::unavailable(format!(
            "GPU {device}: TRITON_RUST_CUDA_SCHED={set}: the driver refused the scheduling flag ({r:?})"
        )));
    }
    log::info!("GPU {device}: waits for its work {set} (TRITON_RUST_CUDA_SCHED)");
    Ok(())
}

/// `TRITON_RUST_CUDA_SCHED`'s value as CUDA's scheduling flag.
fn sched_flag(set: &str) -> Result<cudarc::driver::sys::CUctx_flags> {
    use cudarc::driver::sys::CUctx_flags as F;
    match set.trim() {
        "spin" => Ok(F::CU_CTX_SCHED_SPIN),
        "yield" => Ok(F::CU_CTX_SCHED_YIELD),
        "block" => Ok(F::CU_CTX_SCHED_BLOCKING_SYNC),
        other => Err(CudaError::unavailable(format!(
            "TRITON_RUST_CUDA_SCHED is '{other}': spin, yield or block"
        ))),
    }
}

/// The device's default memory pool (where its stream-ordered allocations come from).
fn default_pool(
    ctx: &CudaContext,
) -> std::result::Result<cudarc::driver::sys::CUmemoryPool, cudarc::driver::sys::CUresult> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a plain driver query on a live device; `pool` outlives the call.
    match unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) } {
        sys::CUresult::CUDA_SUCCESS => Ok(pool),
        e => Err(e),
    }
}

impl GpuState {
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// A new stream on this device (one per cache, or per instance).
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().map_err(cuda_err)
    }

    /// A new stream of the device's highest priority: its kernels' blocks are scheduled
    /// before those of streams of the default priority (a network's) as SMs free up, so a
    /// lookup's short kernels and the miss path's steps do not queue behind another
    /// instance's GEMMs.
    pub fn new_urgent_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        let (_, greatest) =
            cudarc::driver::result::stream::get_priority_range().map_err(cuda_err)?;
        self.ctx.new_stream_with_priority(greatest).map_err(cuda_err)
    }
}

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
            e => Err(CudaError::driver(
                e as i32,
                format!("address {addr:#x} is not device memory the driver knows ({e:?})"),
            )),
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

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUctx_flags as F;

    #[test]
    fn sched_names_are_cudas_flags_and_others_refused() {
        assert_eq!(sched_flag("spin").unwrap(), F::CU_CTX_SCHED_SPIN);
        assert_eq!(sched_flag(" yield ").unwrap(), F::CU_CTX_SCHED_YIELD);
        assert_eq!(sched_flag("block").unwrap(), F::CU_CTX_SCHED_BLOCKING_SYNC);
        let why = sched_flag("sleep").unwrap_err().to_string();
        assert!(why.contains("TRITON_RUST_CUDA_SCHED is 'sleep'"), "{why}");
    }
}
