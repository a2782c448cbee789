//! Page-locked host memory that grows: what copies to and from the GPU go through, so the
//! driver queues them as DMA instead of staging them itself.

use cudarc::driver::result;

use crate::context::{cuda_err, gpu};
use crate::error::Result;

/// Page-locked host memory of `T`s that grows and is never shrunk; its owner waits for every
/// queued copy into or out of it before it grows or goes.
pub(crate) struct PinnedBuf<T: Copy> {
    device: i32,
    ptr: *mut T,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by one owner and used under `&mut`.
unsafe impl<T: Copy> Send for PinnedBuf<T> {}

impl<T: Copy> PinnedBuf<T> {
    pub(crate) fn new(device: i32) -> PinnedBuf<T> {
        PinnedBuf { device, ptr: std::ptr::null_mut(), len: 0 }
    }
    /// The first `len` elements (contents unspecified after a growth).
    pub(crate) fn slice(&mut self, len: usize) -> Result<&mut [T]> {
        if len > self.len {
            self.release();
            let want = len.next_power_of_two().max(64);
            gpu(self.device)?;
            // SAFETY: a page-locked allocation of `want` elements; freed in `release`.
            let p = unsafe { result::malloc_host(want * std::mem::size_of::<T>(), 0) }
                .map_err(cuda_err)?;
            // zeroed once so the slice never exposes uninitialised memory
            // SAFETY: `p` points to `want * size_of::<T>()` writable bytes.
            unsafe { std::ptr::write_bytes(p as *mut u8, 0, want * std::mem::size_of::<T>()) };
            self.ptr = p as *mut T;
            self.len = want;
        }
        // SAFETY: `ptr` holds `self.len >= len` initialised elements, borrowed mutably via `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, len) })
    }
    fn release(&mut self) {
        if !self.ptr.is_null() && gpu(self.device).is_ok() {
            // SAFETY: our allocation; no copy into or out of it is in flight (the owner's
            // contract above).
            let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
        }
        self.ptr = std::ptr::null_mut();
        self.len = 0;
    }
}

impl<T: Copy> Drop for PinnedBuf<T> {
    fn drop(&mut self) {
        self.release();
    }
}

/// Rows in host memory that the caller owns (a table's file mapping), page-locked where
/// they are and mapped read-only into every GPU's address space, so kernels read them over
/// the bus with no copy: a batch lookup's misses (`BatchLookup::set_host_rows`).
pub struct HostRows {
    /// The context bound when the range was registered (and unregistered).
    device: i32,
    /// The registered range: whole pages around the rows.
    base: usize,
    /// The rows' first byte, how many rows, bytes an element.
    start: usize,
    rows: usize,
    elem: usize,
    /// What keeps the rows mapped (dropped after the range is unregistered).
    _owner: std::sync::Arc<dyn std::any::Any + Send + Sync>,
}

// SAFETY: plain addresses of memory the owner keeps mapped; nothing here is mutated.
unsafe impl Send for HostRows {}
unsafe impl Sync for HostRows {}

impl HostRows {
    /// Registers the bytes `bytes` finds in `owner` (held, and so kept where they are,
    /// while this lives): `rows` rows of elements of `elem` bytes (2: fp16, 4: fp32). The
    /// kernels reading them see what the bytes hold when they read.
    pub fn register<T: std::any::Any + Send + Sync>(
        device: i32,
        owner: std::sync::Arc<T>,
        bytes: fn(&T) -> &[u8],
        rows: usize,
        elem: usize,
    ) -> Result<HostRows> {
        use cudarc::driver::sys;
        const PAGE: usize = 4096;
        let bytes = bytes(&owner);
        let start = bytes.as_ptr() as usize;
        let (base, end) = (start & !(PAGE - 1), (start + bytes.len()).div_ceil(PAGE) * PAGE);
        gpu(device)?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE
            | sys::CU_MEMHOSTREGISTER_DEVICEMAP
            | sys::CU_MEMHOSTREGISTER_READ_ONLY;
        // SAFETY: whole pages around memory `owner` holds (a mapping, or an allocation, covers
        // whole pages), which stays where it is while `owner` lives: a `&[u8]` borrowed from
        // `&T` cannot be freed or moved through it, and `owner` outlives the registration
        // (unregistered in `drop`, before the fields go).
        unsafe { sys::cuMemHostRegister_v2(base as *mut std::ffi::c_void, end - base, flags) }
            .result()
            .map_err(cuda_err)?;
        Ok(HostRows { device, base, start, rows, elem, _owner: owner })
    }

    /// The rows' address on GPU `device`.
    pub fn device_addr(&self, device: i32) -> Result<u64> {
        use cudarc::driver::sys;
        gpu(device)?;
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: a registered, mapped range; writes one address.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, self.base as *mut std::ffi::c_void, 0) }
            .result()
            .map_err(cuda_err)?;
        Ok(d + (self.start - self.base) as u64)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes an element: 2 (fp16) or 4 (fp32).
    pub fn elem(&self) -> usize {
        self.elem
    }
}

impl Drop for HostRows {
    fn drop(&mut self) {
        if gpu(self.device).is_ok() {
            // SAFETY: the range `register` registered; no kernel reads it any more (every
            // lookup that could holds this alive while it runs).
            let _ = unsafe {
                cudarc::driver::sys::cuMemHostUnregister(self.base as *mut std::ffi::c_void)
            };
        }
    }
}
