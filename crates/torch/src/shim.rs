//! The Rust side of libtriton_rust_torch_cuda.so (the C++ shim on c10_cuda): its functions,
//! opened once, and a GPU instance's own CUDA stream.

use std::ffi::{c_char, c_int, c_void, CStr};

use triton_rust_abi as abi;

/// The CUDA helpers of libtriton_rust_torch_cuda.so (per-instance streams, CUDA
/// graphs), which the backend opens (with global symbols) before the first GPU model.
#[derive(Clone, Copy)]
pub(crate) struct CudaApi {
    pub(crate) new: unsafe extern "C" fn(c_int) -> *mut c_void,
    pub(crate) enter: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub(crate) sync: unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> c_int,
    pub(crate) free: unsafe extern "C" fn(*mut c_void),
    pub(crate) release: unsafe extern "C" fn() -> c_int,
    pub(crate) graph_pool: unsafe extern "C" fn(*mut u64, *mut u64),
    pub(crate) graph_begin: unsafe extern "C" fn(u64, u64, *mut c_char, usize) -> *mut c_void,
    pub(crate) graph_end: unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> c_int,
    pub(crate) graph_replay: unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> c_int,
    pub(crate) graph_free: unsafe extern "C" fn(*mut c_void),
    /// Host to device or device to host (pinned memory: not waited for).
    pub(crate) copy_async: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        *const c_void,
        usize,
        *mut c_char,
        usize,
    ) -> c_int,
    pub(crate) fusion_strategy:
        unsafe extern "C" fn(*const abi::FusionStep, usize, *mut c_char, usize) -> c_int,
}

pub(crate) fn cuda_api() -> Result<CudaApi, String> {
    let find = |name: &CStr| {
        // SAFETY: dlsym only looks the symbol up.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        if p.is_null() {
            Err(format!(
                "{} not found: libtriton_rust_torch_cuda.so is not loaded",
                name.to_string_lossy()
            ))
        } else {
            Ok(p)
        }
    };
    // SAFETY: the shim defines these with exactly these signatures (src/stream_shim.cpp).
    unsafe {
        Ok(CudaApi {
            new: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> *mut c_void>(
                find(c"trt_stream_new")?,
            ),
            enter: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void) -> c_int>(
                find(c"trt_stream_enter")?,
            ),
            sync: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> c_int,
            >(find(c"trt_stream_sync")?),
            free: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void)>(find(
                c"trt_stream_free",
            )?),
            release: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(find(
                c"trt_release_cached",
            )?),
            graph_pool: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut u64, *mut u64)>(
                find(c"trt_graph_pool")?,
            ),
            graph_begin: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(u64, u64, *mut c_char, usize) -> *mut c_void,
            >(find(c"trt_graph_begin")?),
            graph_end: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> c_int,
            >(find(c"trt_graph_end")?),
            graph_replay: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> c_int,
            >(find(c"trt_graph_replay")?),
            graph_free: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void)>(
                find(c"trt_graph_free")?,
            ),
            copy_async: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(
                    *mut c_void,
                    *mut c_void,
                    *const c_void,
                    usize,
                    *mut c_char,
                    usize,
                ) -> c_int,
            >(find(c"trt_copy_async")?),
            fusion_strategy: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*const abi::FusionStep, usize, *mut c_char, usize) -> c_int,
            >(find(c"trt_set_fusion_strategy")?),
        })
    }
}

/// A model instance's own CUDA stream (from libtorch's pool): its work does not queue
/// behind other instances' on the device's default stream.
pub(crate) struct InstanceStream {
    pub(crate) api: CudaApi,
    pub(crate) stream: *mut c_void,
}

/// Calls a shim function that reports failure by a nonzero return and a message in the
/// error buffer it is given; the message comes back in CUDA's own words.
pub(crate) fn shim_call(call: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<(), String> {
    match triton_rust_plugin::with_error(call) {
        (0, _) => Ok(()),
        (_, why) => Err(why),
    }
}

impl InstanceStream {
    /// Waits for the stream's work; a CUDA error from it (a device-side assert, say)
    /// comes back in CUDA's words, which the caller recognises.
    pub(crate) fn sync(&self) -> Result<(), String> {
        // SAFETY: the stream is alive while self is; the buffer outlives the call.
        shim_call(|err, len| unsafe { (self.api.sync)(self.stream, err, len) })
    }
}

impl Drop for InstanceStream {
    fn drop(&mut self) {
        // SAFETY: created by api.new, freed once.
        unsafe { (self.api.free)(self.stream) };
    }
}
