//! Opening `libtriton_rust_torch.so` and calling it: the plugin FFI room.
//!
//! libtorch is found in the directory the backend settings name (`libtorch-dir`, else the
//! environment variable `TRITON_RUST_LIBTORCH_DIR`), else on the loader's own search path;
//! its libraries are opened with global symbols before the plugin (which needs them),
//! and `libtorch_cuda.so` before the first GPU model (libtorch registers its CUDA
//! kernels when that library loads, so it must come before any CUDA use).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::{self as abi, LoadOptions, PluginApi, TensorView};

use triton_rust_core::error::{Error, ErrorKind, Result};
use triton_rust_core::tensor::{Bytes, DeviceView};
use triton_rust_os::{open_global, own_library_dir};

pub const PLUGIN_FILE: &str = "libtriton_rust_torch.so";
pub const STREAM_SHIM_FILE: &str = "libtriton_rust_torch_cuda.so";
pub const LIBTORCH_NEEDED: &str = "libtorch 2.11.0 (libc10.so, libtorch_cpu.so, libtorch.so; the PyPI torch==2.11.0 wheel's torch/lib works)";

pub struct Plugin {
    api: &'static PluginApi,
    libtorch_dir: Option<PathBuf>,
    cuda_loaded: Mutex<bool>,
    _libs: Mutex<Vec<libloading::Library>>,
}

static PLUGIN: Mutex<Option<Arc<Plugin>>> = Mutex::new(None);

fn lib_path(dir: &Option<PathBuf>, name: &str) -> PathBuf {
    match dir {
        Some(d) => d.join(name),
        None => PathBuf::from(name),
    }
}

/// The process's plugin, opened on first use; libtorch from `libtorch_dir` (the directory
/// and what named it) when given.
pub fn plugin(libtorch_dir: Option<(&Path, &str)>) -> Result<Arc<Plugin>> {
    let mut slot = PLUGIN.lock().map_err(|_| Error::internal("torch plugin lock poisoned"))?;
    if let Some(p) = slot.as_ref() {
        return Ok(p.clone());
    }
    let (dir, source) = match libtorch_dir {
        Some((d, source)) => (Some(d.to_path_buf()), source.to_string()),
        None => (None, "the loader's search path (LD_LIBRARY_PATH)".to_string()),
    };
    let mut libs = Vec::new();
    for name in ["libc10.so", "libtorch_cpu.so", "libtorch.so"] {
        let path = lib_path(&dir, name);
        let lib = open_global(&path).map_err(|e| {
            Error::unavailable(format!(
                "TorchScript models need {LIBTORCH_NEEDED}; '{}' could not be loaded (from {source}): {e}. \
                 Set --backend-config=rust,libtorch-dir=<directory of libtorch_cpu.so>",
                path.display()
            ))
        })?;
        libs.push(lib);
    }
    let here = own_library_dir()
        .ok_or_else(|| Error::internal("cannot find the rust backend's own directory"))?;
    let plugin_path = here.join(PLUGIN_FILE);
    if !plugin_path.is_file() {
        return Err(Error::unavailable(format!(
            "TorchScript models need the plugin '{}', which is not installed next to libtriton_rust.so (build it with scripts/build.sh)",
            plugin_path.display()
        )));
    }
    let lib = open_global(&plugin_path)
        .map_err(|e| Error::unavailable(format!("cannot load '{}': {e}", plugin_path.display())))?;
    // SAFETY: the plugin exports this symbol with this signature (triton_rust_abi).
    let api: &'static PluginApi = unsafe {
        let entry: libloading::Symbol<unsafe extern "C" fn() -> *const PluginApi> =
            lib.get(abi::ENTRY_SYMBOL).map_err(|e| {
                Error::unavailable(format!(
                    "'{}' is not a rust backend plugin: {e}",
                    plugin_path.display()
                ))
            })?;
        &*entry()
    };
    if api.abi_version != abi::ABI_VERSION {
        return Err(Error::unavailable(format!(
            "'{}' speaks plugin ABI {} but this backend speaks {}; rebuild both together",
            plugin_path.display(),
            api.abi_version,
            abi::ABI_VERSION
        )));
    }
    // SAFETY: the plugin returns a static NUL-terminated string.
    let runtime = unsafe { CStr::from_ptr((api.runtime)()) }.to_string_lossy().into_owned();
    libs.push(lib);
    log::info!(
        "torch plugin loaded from '{}' ({runtime}, libtorch from {source})",
        plugin_path.display()
    );
    let p = Arc::new(Plugin {
        api,
        libtorch_dir: dir,
        cuda_loaded: Mutex::new(false),
        _libs: Mutex::new(libs),
    });
    *slot = Some(p.clone());
    Ok(p)
}

fn take_error(api: &PluginApi, err: *mut c_char, what: &str) -> Error {
    take_error_of(api, err, what, ErrorKind::Internal)
}

/// The plugin's error message, as an error of `kind` (the kind its status code said).
fn take_error_of(api: &PluginApi, err: *mut c_char, what: &str, kind: ErrorKind) -> Error {
    if err.is_null() {
        return Error::new(kind, format!("{what} failed without a message"));
    }
    // SAFETY: the plugin allocated it; we free it with the plugin's free_error.
    let msg = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    unsafe { (api.free_error)(err) };
    Error::new(kind, msg)
}

/// A model loaded by the plugin; freed when dropped.
pub struct PluginModel {
    plugin: Arc<Plugin>,
    handle: *mut c_void,
}

// SAFETY: a TorchScript module may be used from any thread, one call at a time (the
// instance's engine lock).
unsafe impl Send for PluginModel {}

pub struct LoadSpec<'a> {
    pub path: &'a Path,
    pub gpu: Option<i32>,
    pub intra_op_threads: i32,
    pub cudnn: bool,
    pub optimized_execution: bool,
    /// `None`: libtorch's default.
    pub tensor_fuser: Option<bool>,
    /// Triton's `ENABLE_JIT_PROFILING` (process-wide in libtorch); None keeps libtorch's default.
    pub jit_profiling: Option<bool>,
    /// `TORCH_FUSION_STRATEGY` (process-wide in libtorch; GPU instances); empty keeps libtorch's default.
    pub fusion_strategy: &'a [abi::FusionStep],
    /// CUDA graphs (GPU instances): `None` off; `Some(buckets)` on, with the batch-size
    /// buckets (empty: one graph per input shape).
    pub cuda_graphs: Option<&'a [i64]>,
    /// The buckets are the exact rows of the requests to graph (a model without batching).
    pub graph_exact_rows: bool,
}

/// The plugin's log lines go to the backend's log (Triton's).
unsafe extern "C" fn plugin_log(level: c_int, message: *const c_char) {
    if message.is_null() {
        return;
    }
    // SAFETY: the plugin passes a NUL-terminated string valid for the call.
    let text = unsafe { CStr::from_ptr(message) }.to_string_lossy();
    match level {
        abi::LOG_WARN => log::warn!("{text}"),
        abi::LOG_VERBOSE => log::debug!("{text}"),
        _ => log::info!("{text}"),
    }
}

impl Plugin {
    fn ensure_cuda(&self) -> Result<()> {
        let mut loaded = self.cuda_loaded.lock().map_err(|_| Error::internal("lock poisoned"))?;
        if *loaded {
            return Ok(());
        }
        let mut libs = self._libs.lock().map_err(|_| Error::internal("lock poisoned"))?;
        for name in ["libc10_cuda.so", "libtorch_cuda.so"] {
            let path = lib_path(&self.libtorch_dir, name);
            libs.push(open_global(&path).map_err(|e| {
                Error::unavailable(format!(
                    "a KIND_GPU TorchScript model needs libtorch's CUDA part: '{}': {e}",
                    path.display()
                ))
            })?);
        }
        // per-instance CUDA streams (a small C++ library built with the plugin)
        let shim = own_library_dir()
            .ok_or_else(|| Error::internal("cannot find the rust backend's own directory"))?
            .join(STREAM_SHIM_FILE);
        libs.push(
            open_global(&shim).map_err(|e| {
                Error::unavailable(format!("cannot load '{}': {e}", shim.display()))
            })?,
        );
        *loaded = true;
        Ok(())
    }

    pub fn load(self: &Arc<Self>, spec: &LoadSpec<'_>) -> Result<PluginModel> {
        if spec.gpu.is_some() {
            self.ensure_cuda()?;
        }
        let path = CString::new(spec.path.to_string_lossy().as_bytes())
            .map_err(|_| Error::invalid_arg("model path has a NUL"))?;
        let opts = LoadOptions {
            path: path.as_ptr(),
            device_kind: if spec.gpu.is_some() { abi::MEMORY_GPU } else { abi::MEMORY_CPU },
            device_id: spec.gpu.unwrap_or(0),
            intra_op_threads: spec.intra_op_threads,
            inference_mode: 1,
            cudnn: spec.cudnn as i32,
            optimized_execution: spec.optimized_execution as i32,
            tensor_fuser: spec.tensor_fuser.map_or(-1, i32::from),
            jit_profiling: spec.jit_profiling.map_or(-1, i32::from),
            fusion_steps: if spec.fusion_strategy.is_empty() {
                std::ptr::null()
            } else {
                spec.fusion_strategy.as_ptr()
            },
            n_fusion_steps: spec.fusion_strategy.len(),
            cuda_graphs: spec.cuda_graphs.is_some() as i32,
            graph_buckets: spec.cuda_graphs.map_or(std::ptr::null(), <[i64]>::as_ptr),
            n_graph_buckets: spec.cuda_graphs.map_or(0, <[i64]>::len),
            graph_exact_rows: spec.graph_exact_rows as i32,
            log: Some(plugin_log),
            verbose: log::log_enabled!(log::Level::Debug) as i32,
        };
        let mut err = std::ptr::null_mut();
        // SAFETY: opts and its strings outlive the call.
        let handle = unsafe { (self.api.load)(&opts, &mut err) };
        if handle.is_null() {
            return Err(take_error(self.api, err, "loading the TorchScript model")
                .context(format!("model file '{}'", spec.path.display())));
        }
        Ok(PluginModel { plugin: self.clone(), handle })
    }
}

/// One input handed to the plugin: host bytes or a view of GPU memory.
pub struct InputRef<'a> {
    pub name: &'a CStr,
    pub dtype: i32,
    pub shape: &'a [i64],
    pub data: Bytes<'a>,
}

/// One output from the plugin, valid during the callback.
pub struct OutputRef<'a> {
    pub index: usize,
    pub dtype: i32,
    pub shape: &'a [i64],
    pub data: Bytes<'a>,
}

struct SinkCtx<'s, 'f> {
    names: &'s [CString],
    sink: &'f mut dyn FnMut(OutputRef<'_>) -> Result<()>,
    error: Option<Error>,
}

unsafe extern "C" fn sink_trampoline(ctx: *mut c_void, view: *const TensorView) -> c_int {
    let ctx = &mut *(ctx as *mut SinkCtx<'_, '_>);
    let v = &*view;
    let name = CStr::from_ptr(v.name);
    let Some(index) = ctx.names.iter().position(|n| n.as_c_str() == name) else { return 1 };
    let shape = std::slice::from_raw_parts(v.shape, v.rank);
    // The plugin's contract (abi::TensorView): the memory is valid for the callback.
    let data = if v.memory == abi::MEMORY_GPU {
        Bytes::Device(DeviceView::from_raw(v.device_id as i32, v.data as u64, v.bytes))
    } else if v.bytes == 0 {
        Bytes::Host(&[])
    } else {
        Bytes::Host(std::slice::from_raw_parts(v.data as *const u8, v.bytes))
    };
    match (ctx.sink)(OutputRef { index, dtype: v.dtype, shape, data }) {
        Ok(()) => 0,
        Err(e) => {
            ctx.error = Some(e);
            1
        }
    }
}

impl PluginModel {
    pub fn run(
        &mut self,
        inputs: &[InputRef<'_>],
        outputs: &[CString],
        host_outputs: bool,
        sink: &mut dyn FnMut(OutputRef<'_>) -> Result<()>,
    ) -> Result<()> {
        let views: Vec<TensorView> = inputs
            .iter()
            .map(|i| {
                let (data, bytes, memory, device_id) = match i.data {
                    Bytes::Host(h) => (h.as_ptr() as *const c_void, h.len(), abi::MEMORY_CPU, 0),
                    Bytes::Device(v) => {
                        let addr = v.raw_addr().ok_or_else(|| {
                            Error::internal("a simulated device buffer reached libtorch")
                        })?;
                        (addr as *const c_void, v.len(), abi::MEMORY_GPU, v.device() as i64)
                    }
                };
                Ok(TensorView {
                    name: i.name.as_ptr(),
                    dtype: i.dtype,
                    shape: i.shape.as_ptr(),
                    rank: i.shape.len(),
                    data,
                    bytes,
                    memory,
                    device_id,
                })
            })
            .collect::<Result<_>>()?;
        let names: Vec<*const c_char> = outputs.iter().map(|n| n.as_ptr()).collect();
        let mut ctx = SinkCtx { names: outputs, sink, error: None };
        let mut err = std::ptr::null_mut();
        // SAFETY: every pointer refers to data alive for the call; ctx outlives it.
        let rc = unsafe {
            (self.plugin.api.run)(
                self.handle,
                views.as_ptr(),
                views.len(),
                names.as_ptr(),
                names.len(),
                host_outputs as c_int,
                sink_trampoline,
                &mut ctx as *mut SinkCtx<'_, '_> as *mut c_void,
                &mut err,
            )
        };
        if let Some(e) = ctx.error {
            if !err.is_null() {
                unsafe { (self.plugin.api.free_error)(err) };
            }
            return Err(e);
        }
        if rc != abi::RUN_OK {
            let kind = run_error_kind(rc);
            return Err(take_error_of(self.plugin.api, err, "running the TorchScript model", kind));
        }
        Ok(())
    }
}

impl Drop for PluginModel {
    fn drop(&mut self) {
        // SAFETY: the handle came from this plugin's load and is freed once.
        unsafe { (self.plugin.api.free_model)(self.handle) };
    }
}

/// The kind of error a non-zero status of the plugin's `run` stands for.
fn run_error_kind(status: c_int) -> ErrorKind {
    if status == abi::RUN_DEVICE_LOST {
        ErrorKind::DeviceLost
    } else {
        ErrorKind::Internal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_status_carries_a_lost_device_across_the_abi() {
        assert_eq!(run_error_kind(abi::RUN_DEVICE_LOST), ErrorKind::DeviceLost);
        assert_eq!(run_error_kind(abi::RUN_FAILED), ErrorKind::Internal);
        assert_eq!(run_error_kind(7), ErrorKind::Internal, "an unknown status is a failure");
    }
}
