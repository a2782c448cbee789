//! The ABI's types and function tables, shared by the backend (`plugin.rs`) and the plugins
//! (through `triton_rust_plugin`).

use std::os::raw::{c_char, c_int, c_void};

/// 10: [`LoadOptions::hand_over`]. 9: the table split into a core every plugin fills and the
/// AOTInductor extension.
pub const ABI_VERSION: u32 = 10;

/// [`LoadOptions::hand_over`]: the plugin's default (spinning), spinning, or asleep.
pub const HAND_OVER_DEFAULT: i32 = -1;
pub const HAND_OVER_SPIN: i32 = 0;
pub const HAND_OVER_ASLEEP: i32 = 1;

/// What `run` returns: done, failed (the error says why), or failed because the GPU's CUDA
/// context is lost for this process (a sticky CUDA error; the plugin's `run` shim classifies
/// its runtime's text with `triton_rust_cuda::sticky_error_in`, so the backend branches on
/// this code, never on the text).
pub const RUN_OK: c_int = 0;
pub const RUN_FAILED: c_int = 1;
pub const RUN_DEVICE_LOST: c_int = 2;

/// The symbol the plugin exports: `extern "C" fn() -> *const PluginApi`.
pub const ENTRY_SYMBOL: &[u8] = b"triton_rust_plugin_api\0";

/// Element types (the backend's `DataType` order).
pub mod dtype {
    pub const BOOL: i32 = 0;
    pub const U8: i32 = 1;
    pub const I8: i32 = 2;
    pub const I16: i32 = 3;
    pub const I32: i32 = 4;
    pub const I64: i32 = 5;
    pub const F16: i32 = 6;
    pub const F32: i32 = 7;
    pub const F64: i32 = 8;
    pub const BF16: i32 = 9;
}

/// Where a tensor's bytes live.
pub const MEMORY_CPU: i32 = 0;
pub const MEMORY_GPU: i32 = 1;

/// A tensor borrowed for the duration of a call.
#[repr(C)]
pub struct TensorView {
    pub name: *const c_char,
    pub dtype: i32,
    pub shape: *const i64,
    pub rank: usize,
    pub data: *const c_void,
    pub bytes: usize,
    pub memory: i32,
    pub device_id: i64,
}

/// Receives one output of a run; returns 0 to go on, non-zero to stop (the plugin
/// then returns an error). The data is valid only during the call.
pub type OutputSink = unsafe extern "C" fn(ctx: *mut c_void, output: *const TensorView) -> c_int;

/// Log levels of [`LogFn`].
pub const LOG_INFO: c_int = 0;
pub const LOG_WARN: c_int = 1;
/// Shown with `--log-verbose=1` only.
pub const LOG_VERBOSE: c_int = 2;

/// The backend's logger, for what the plugin has to say outside a call's result
/// (e.g. a CUDA graph that could not be captured). The message is borrowed.
pub type LogFn = unsafe extern "C" fn(level: c_int, message: *const c_char);

/// One step of TorchScript's fusion strategy (libtorch's `FusionBehavior` and depth): the
/// profiling executor compiles up to `depth` fused kernels of this kind before moving on
/// to the next step.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusionStep {
    /// 0: kernels specialised to static shapes; 1: kernels for dynamic shapes.
    pub dynamic: i32,
    pub depth: u32,
}

/// Options for loading a model.
#[repr(C)]
pub struct LoadOptions {
    /// Path of the model file (NUL-terminated).
    pub path: *const c_char,
    /// `MEMORY_CPU` or `MEMORY_GPU`.
    pub device_kind: i32,
    pub device_id: i32,
    /// Threads for intra-op parallelism on CPU (0 = library default).
    pub intra_op_threads: i32,
    /// Run under inference mode (no autograd bookkeeping).
    pub inference_mode: i32,
    /// Allow cuDNN (1) or disable it (0).
    pub cudnn: i32,
    /// TorchScript's optimizing graph executor (1) or the plain interpreter (0)
    /// (Triton's `DISABLE_OPTIMIZED_EXECUTION`).
    pub optimized_execution: i32,
    /// TorchScript's tensor-expression fuser: 1 on, 0 off, -1 libtorch's default
    /// (Triton's `ENABLE_TENSOR_FUSER`). Process-wide in libtorch.
    pub tensor_fuser: i32,
    /// TorchScript's profiling graph executor: 1 on, 0 off, -1 libtorch's default
    /// (Triton's `ENABLE_JIT_PROFILING`). Process-wide in libtorch.
    pub jit_profiling: i32,
    /// TorchScript's fusion strategy (`TORCH_FUSION_STRATEGY`): `n_fusion_steps` steps, each
    /// a number of shape specialisations, static or dynamic, tried in order; none (null, 0)
    /// keeps libtorch's default. Process-wide in libtorch; GPU instances only.
    pub fusion_steps: *const FusionStep,
    pub n_fusion_steps: usize,
    /// CUDA graphs on a GPU instance (Triton's `optimization { cuda { graphs: true } }`):
    /// 0 off, 1 on.
    pub cuda_graphs: i32,
    /// Batch-size buckets graphs are captured for (ascending); a batch is padded to the
    /// smallest bucket that holds it. Empty: one graph per distinct input shape (a model
    /// without batching).
    pub graph_buckets: *const i64,
    pub n_graph_buckets: usize,
    /// Non-zero (a model without batching): `graph_buckets` are exact first dimensions a
    /// request's inputs must all have to run in a graph (no padding; others run eagerly).
    pub graph_exact_rows: i32,
    /// Where the plugin logs; may be null.
    pub log: Option<LogFn>,
    /// Non-zero: the backend logs at verbose level, so the plugin may say where each
    /// run's time goes.
    pub verbose: i32,
    /// How a GPU instance's thread and the plugin's worker thread wait for each other:
    /// [`HAND_OVER_SPIN`], [`HAND_OVER_ASLEEP`] or [`HAND_OVER_DEFAULT`] (see `worker`).
    pub hand_over: i32,
}

/// The table every plugin fills: load, run and free a model. What only some plugins offer
/// comes in an extension table the core points to (null where a plugin lacks it), so a plugin
/// fills no entry it has nothing for; the host asks for an extension before using it.
#[repr(C)]
pub struct PluginApi {
    pub abi_version: u32,
    /// The runtime the plugin wraps and its version, e.g. "libtorch 2.11.0".
    pub runtime: unsafe extern "C" fn() -> *const c_char,
    /// Loads a model; null and `*err` set on failure.
    pub load:
        unsafe extern "C" fn(options: *const LoadOptions, err: *mut *mut c_char) -> *mut c_void,
    /// Runs it on `inputs` (in the model's argument order); each of the `n_outputs`
    /// outputs named in `output_names` (the model's output order; an empty name: not
    /// wanted) goes to `sink`, in host memory when `host_outputs` is non-zero, else where the
    /// model produced it. Returns [`RUN_OK`], [`RUN_FAILED`] or [`RUN_DEVICE_LOST`]
    /// (`*err` set on failure).
    pub run: unsafe extern "C" fn(
        model: *mut c_void,
        inputs: *const TensorView,
        n_inputs: usize,
        output_names: *const *const c_char,
        n_outputs: usize,
        host_outputs: c_int,
        sink: OutputSink,
        sink_ctx: *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int,
    pub free_model: unsafe extern "C" fn(model: *mut c_void),
    /// Frees a string the plugin handed out (an error, a call spec).
    pub free_error: unsafe extern "C" fn(err: *mut c_char),
    /// What the AOTInductor plugin adds; null (`None`) for a plugin without it (TorchScript).
    pub aoti: Option<&'static AotiApi>,
}

/// The AOTInductor plugin's additions to [`PluginApi`]: a package's call spec, and the
/// inputs of its captured CUDA graphs for a caller to write into.
#[repr(C)]
pub struct AotiApi {
    /// The loaded model's call spec as JSON text (`["<in_spec>", "<out_spec>"]`, torch's
    /// serialized pytree specs), freed with `free_error`; null on failure (`*err` set then).
    pub call_spec: unsafe extern "C" fn(model: *mut c_void, err: *mut *mut c_char) -> *mut c_char,
    /// Where the CUDA graph that a batch of `inputs` (in the model's argument order; their
    /// element types and shapes, their data ignored) would replay reads input `index`: the
    /// GPU address of that graph's own input, whose first rows a caller may fill (an
    /// embedding lookup writing straight into the network's input) and then pass as that
    /// input to `run`, which copies nothing for it. Null when no graph already captured
    /// would replay such a batch. The memory is the model's until it is freed; the caller
    /// writes it only while no run of the model is in flight.
    pub graph_input: unsafe extern "C" fn(
        model: *mut c_void,
        inputs: *const TensorView,
        n_inputs: usize,
        index: usize,
    ) -> *mut c_void,
}
