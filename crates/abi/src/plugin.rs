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

use crate::types::{self as abi, LoadOptions, PluginApi, TensorView};

use triton_rust_core::batch::BatchTensor;
use triton_rust_core::error::{Error, ErrorKind, Result};
use triton_rust_core::tensor::{Bytes, DataType, DeviceView, DeviceViewMut};

use crate::types::dtype;
use triton_rust_os::{open_global, own_library_dir};

/// The ABI's element type code of `t`.
pub fn to_abi(t: DataType) -> Result<i32> {
    Ok(match t {
        DataType::Bool => dtype::BOOL,
        DataType::U8 => dtype::U8,
        DataType::I8 => dtype::I8,
        DataType::I16 => dtype::I16,
        DataType::I32 => dtype::I32,
        DataType::I64 => dtype::I64,
        DataType::F16 => dtype::F16,
        DataType::F32 => dtype::F32,
        DataType::F64 => dtype::F64,
        DataType::Bf16 => dtype::BF16,
        other => {
            return Err(Error::unsupported(format!(
                "{} tensors are not supported by the torch engines",
                other.wire_name()
            )))
        }
    })
}

/// The element type of the ABI's code `d`.
pub fn from_abi(d: i32) -> Result<DataType> {
    Ok(match d {
        dtype::BOOL => DataType::Bool,
        dtype::U8 => DataType::U8,
        dtype::I8 => DataType::I8,
        dtype::I16 => DataType::I16,
        dtype::I32 => DataType::I32,
        dtype::I64 => DataType::I64,
        dtype::F16 => DataType::F16,
        dtype::F32 => DataType::F32,
        dtype::F64 => DataType::F64,
        dtype::BF16 => DataType::Bf16,
        other => return Err(Error::internal(format!("the plugin returned element type {other}"))),
    })
}

/// A plugin library, what it serves, and what it needs opened before it.
pub struct PluginFile {
    pub file: &'static str,
    /// What its models are, for messages ("TorchScript models").
    pub serves: &'static str,
    /// The libtorch it needs, for messages.
    pub needs: &'static str,
    /// Its GPU helper library (opened before the first GPU model), if it has one.
    pub cuda_shim: Option<&'static str>,
    /// It links libtorch's CUDA libraries when libtorch has them (built against a CUDA
    /// libtorch): open them before the plugin.
    pub links_cuda: bool,
}

/// The TorchScript engine's plugin (tch, so libtorch 2.11 exactly).
pub const TORCHSCRIPT: PluginFile = PluginFile {
    file: "libtriton_rust_torch.so",
    serves: "TorchScript models",
    needs: "libtorch 2.11.0 (libc10.so, libtorch_cpu.so, libtorch.so; the PyPI torch==2.11.0 wheel's torch/lib works)",
    cuda_shim: Some("libtriton_rust_torch_cuda.so"),
    links_cuda: false,
};

/// The AOTInductor engine's plugin (C++, built against the libtorch it runs with).
pub const AOTI: PluginFile = PluginFile {
    file: "libtriton_rust_aoti.so",
    serves: "AOTInductor packages (.pt2)",
    needs: "the libtorch the plugin was built against (libc10.so, libtorch_cpu.so, libtorch.so; a torch wheel's torch/lib works)",
    cuda_shim: None,
    links_cuda: true,
};

pub const PLUGIN_FILE: &str = TORCHSCRIPT.file;
pub const STREAM_SHIM_FILE: &str = "libtriton_rust_torch_cuda.so";
pub const LIBTORCH_NEEDED: &str = TORCHSCRIPT.needs;

pub struct Plugin {
    api: &'static PluginApi,
    which: &'static PluginFile,
    runtime: String,
    libtorch_dir: Option<PathBuf>,
    cuda_loaded: Mutex<bool>,
    _libs: Mutex<Vec<libloading::Library>>,
}

// Process-wide because a plugin, and the libtorch it links, can be loaded once per process;
// each loaded model holds the `Arc` of its own.
static PLUGINS: Mutex<Vec<Arc<Plugin>>> = Mutex::new(Vec::new());

fn lib_path(dir: &Option<PathBuf>, name: &str) -> PathBuf {
    match dir {
        Some(d) => d.join(name),
        None => PathBuf::from(name),
    }
}

/// The environment variable naming it when the backend setting does not.
pub const LIBTORCH_ENV: &str = "TRITON_RUST_LIBTORCH_DIR";

/// libtorch's directory and what named it: the backend setting `libtorch-dir`'s value (`key`),
/// else the environment's (`LIBTORCH_ENV`).
pub fn libtorch_dir(key: Option<&str>, env: Option<&str>) -> Option<(PathBuf, String)> {
    match (key, env) {
        (Some(d), _) => Some((PathBuf::from(d), "--backend-config=rust,libtorch-dir".to_string())),
        (None, Some(d)) => Some((PathBuf::from(d), LIBTORCH_ENV.to_string())),
        (None, None) => None,
    }
}

/// The process's plugin `which`, opened on first use; libtorch from `libtorch_dir` (the
/// directory and what named it) when given.
pub fn plugin(
    which: &'static PluginFile,
    libtorch_dir: Option<(&Path, &str)>,
) -> Result<Arc<Plugin>> {
    let mut open = PLUGINS.lock().map_err(|_| Error::internal("plugin lock poisoned"))?;
    if let Some(p) = open.iter().find(|p| p.which.file == which.file) {
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
                "{} need {}; '{}' could not be loaded (from {source}): {e}. \
                 Set --backend-config=rust,libtorch-dir=<directory of libtorch_cpu.so>",
                which.serves,
                which.needs,
                path.display()
            ))
        })?;
        libs.push(lib);
    }
    let mut cuda_loaded = false;
    if which.links_cuda {
        // a plugin built against a CUDA libtorch needs its CUDA libraries; a CPU-only
        // libtorch has none (and a plugin built against it needs none)
        let cuda: Vec<PathBuf> =
            ["libc10_cuda.so", "libtorch_cuda.so"].iter().map(|n| lib_path(&dir, n)).collect();
        if dir.is_none() || cuda.iter().all(|p| p.is_file()) {
            for path in &cuda {
                match open_global(path) {
                    Ok(lib) => libs.push(lib),
                    Err(e) if dir.is_some() => {
                        return Err(Error::unavailable(format!(
                            "cannot load '{}' (from {source}): {e}",
                            path.display()
                        )))
                    }
                    Err(_) => break,
                }
            }
            cuda_loaded = true;
        }
    }
    let here = own_library_dir()
        .ok_or_else(|| Error::internal("cannot find the rust backend's own directory"))?;
    let plugin_path = here.join(which.file);
    if !plugin_path.is_file() {
        return Err(Error::unavailable(format!(
            "{} need the plugin '{}', which is not installed next to libtriton_rust.so (build it with scripts/build.sh)",
            which.serves,
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
        "plugin loaded from '{}' ({runtime}, libtorch from {source})",
        plugin_path.display()
    );
    let p = Arc::new(Plugin {
        api,
        which,
        runtime,
        libtorch_dir: dir,
        cuda_loaded: Mutex::new(cuda_loaded && which.cuda_shim.is_none()),
        _libs: Mutex::new(libs),
    });
    open.push(p.clone());
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
    /// How a GPU instance's thread and the plugin's worker wait for each other (the model's
    /// `gpu_hand_over`); None: the plugin's default.
    pub hand_over: Option<crate::worker::HandOver>,
}

/// The model parameter saying how a GPU instance's thread and the plugin's worker wait for
/// each other (TorchScript and AOTInductor models, and a recommender's network).
pub const HAND_OVER_PARAM: &str = "gpu_hand_over";

/// `gpu_hand_over`'s value: `spin` or `asleep`; None when not given.
pub fn hand_over(text: Option<&str>) -> Result<Option<crate::worker::HandOver>> {
    use crate::worker::HandOver;
    match text.map(|t| t.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") => Ok(None),
        Some("spin") => Ok(Some(HandOver::Spin)),
        Some("asleep") => Ok(Some(HandOver::Asleep)),
        Some(_) => Err(Error::invalid_arg(format!(
            "parameter '{HAND_OVER_PARAM}' = '{}': expected 'spin' (the instance's thread and its worker spin for each other first) or 'asleep'",
            text.unwrap_or_default()
        ))),
    }
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
    /// The runtime the plugin wraps and its version, e.g. "libtorch 2.11.0".
    pub fn runtime(&self) -> &str {
        &self.runtime
    }

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
                    "KIND_GPU instances of {} need libtorch's CUDA part: '{}': {e}",
                    self.which.serves,
                    path.display()
                ))
            })?);
        }
        // per-instance CUDA streams (a small C++ library built with the plugin)
        if let Some(shim) = self.which.cuda_shim {
            let shim = own_library_dir()
                .ok_or_else(|| Error::internal("cannot find the rust backend's own directory"))?
                .join(shim);
            libs.push(open_global(&shim).map_err(|e| {
                Error::unavailable(format!("cannot load '{}': {e}", shim.display()))
            })?);
        }
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
            hand_over: crate::worker::HandOver::to_abi(spec.hand_over),
        };
        let mut err = std::ptr::null_mut();
        // SAFETY: opts and its strings outlive the call.
        let handle = unsafe { (self.api.load)(&opts, &mut err) };
        if handle.is_null() {
            return Err(take_error(self.api, err, "loading the model")
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

/// The inputs of a batch in the model's argument order: `order[k]` is the index in `inputs`
/// of argument `k`, named `names[k]`.
pub fn input_refs<'a>(
    inputs: &'a [BatchTensor<'_>],
    order: &[usize],
    names: &'a [CString],
) -> Result<Vec<InputRef<'a>>> {
    order
        .iter()
        .zip(names)
        .map(|(&i, name)| {
            let t = &inputs[i];
            let data = t
                .bytes()
                .ok_or_else(|| Error::internal(format!("input '{}' was not assembled", t.name)))?;
            Ok(InputRef { name, dtype: to_abi(t.dtype)?, shape: &t.shape, data })
        })
        .collect()
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

/// The plugin's views of `inputs`, valid while they are.
fn views_of(inputs: &[InputRef<'_>]) -> Result<Vec<TensorView>> {
    inputs
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
        .collect()
}

impl PluginModel {
    pub fn run(
        &mut self,
        inputs: &[InputRef<'_>],
        outputs: &[CString],
        host_outputs: bool,
        sink: &mut dyn FnMut(OutputRef<'_>) -> Result<()>,
    ) -> Result<()> {
        let views = views_of(inputs)?;
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
            return Err(take_error_of(self.plugin.api, err, "running the model", kind));
        }
        Ok(())
    }
}

impl PluginModel {
    /// Input `index` of the CUDA graph a batch of `inputs` (their types and shapes; data
    /// ignored) would replay on GPU `device`, if one is captured (`AotiApi::graph_input`):
    /// its first `len` bytes, the batch's rows of it. The view is not tied to a borrow of
    /// the model because the model's `run` takes it back as that input: it stays valid
    /// until the model is freed, and may be written only while no run is in flight. None
    /// from a plugin without the AOTInductor extension.
    pub fn graph_input(
        &self,
        inputs: &[InputRef<'_>],
        index: usize,
        device: i32,
        len: usize,
    ) -> Option<DeviceViewMut<'static>> {
        let aoti = self.plugin.api.aoti?;
        let views = views_of(inputs).ok()?;
        // SAFETY: the views point at live inputs for the call; the handle is this plugin's.
        let addr = unsafe { (aoti.graph_input)(self.handle, views.as_ptr(), views.len(), index) };
        // SAFETY: the plugin's contract: the graph's own input for a batch of this shape
        // on `device` (room for at least its rows: `len` bytes), kept until the model is freed.
        (!addr.is_null()).then(|| unsafe { DeviceViewMut::from_raw(device, addr as u64, len) })
    }

    /// The model's call spec (`[in_spec, out_spec]`, torch's serialized pytree specs), if
    /// it has one: only a plugin with the AOTInductor extension (`AotiApi::call_spec`) says.
    pub fn call_spec(&self) -> Result<Option<[String; 2]>> {
        let Some(aoti) = self.plugin.api.aoti else { return Ok(None) };
        let mut err = std::ptr::null_mut();
        // SAFETY: the handle is this plugin's; the string is freed with its free_error.
        let text = unsafe { (aoti.call_spec)(self.handle, &mut err) };
        if text.is_null() {
            if err.is_null() {
                return Ok(None);
            }
            return Err(take_error(self.plugin.api, err, "reading the call spec"));
        }
        let owned = unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned();
        unsafe { (self.plugin.api.free_error)(text) };
        let specs: Vec<String> = serde_json::from_str(&owned)
            .map_err(|e| Error::internal(format!("the call spec is not a JSON list: {e}")))?;
        match <[String; 2]>::try_from(specs) {
            Ok(pair) => Ok(Some(pair)),
            Err(v) => Err(Error::internal(format!("the call spec has {} parts, not 2", v.len()))),
        }
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
