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
