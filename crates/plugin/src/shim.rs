//! The core table's `extern "C"` entries, written once for both plugins: each turns the
//! ABI's raw pointers into borrowed values, keeps a panic from crossing the ABI, and calls
//! the plugin's [`RuntimeModel`]. A model handle is the plugin's model boxed (`Box<M>`).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use triton_rust_abi::{self as abi, panic_text, FusionStep, LoadOptions, OutputSink, TensorView};

use crate::error::set_err;

/// A model a plugin loads and runs: what the shims call, with the ABI's pointers made safe.
pub trait RuntimeModel: Sized {
    /// Who a caught panic is put down to ("libtorch" panicked while running).
    const RUNTIME: &'static str;

    fn load(load: &Load<'_>) -> Result<Self, String>;

    /// Runs on `inputs` (the model's argument order; their pointers valid for the call),
    /// handing each output to `outputs`. A sticky CUDA error's text makes the run's status
    /// [`abi::RUN_DEVICE_LOST`].
    fn run(
        &mut self,
        inputs: &[TensorView],
        outputs: &Outputs<'_>,
        host_outputs: bool,
    ) -> Result<(), String>;

    /// Frees the model: by dropping it, unless the plugin orders what goes back when.
    fn free(self) {}
}

/// What `load` is given: the caller's options, with their strings and arrays borrowed.
pub struct Load<'a> {
    /// The plain values (threads, cuDNN, the TorchScript executor's switches, the log).
    pub options: &'a LoadOptions,
    pub path: &'a CStr,
    /// The GPU of a `KIND_GPU` instance; None on the CPU.
    pub gpu: Option<i32>,
    /// CUDA graphs asked for (they run only on a GPU).
    pub cuda_graphs: bool,
    pub graph_buckets: &'a [i64],
    pub graph_exact_rows: bool,
    pub fusion_steps: &'a [FusionStep],
    pub verbose: bool,
    /// How a GPU instance's thread and its worker wait for each other.
    pub hand_over: abi::worker::HandOver,
}

/// Where a run's outputs go: the caller's sink, under the caller's names.
pub struct Outputs<'a> {
    names: &'a [*const c_char],
    sink: OutputSink,
    ctx: *mut c_void,
}

impl Outputs<'_> {
    /// How many outputs the caller named (some perhaps empty: not wanted).
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Hands `view` (valid for the call) to the caller as output `index`, named as the caller
    /// names it; an output the caller did not name (past its names, or an empty name) is
    /// skipped. Fails when the sink refuses it.
    pub fn deliver(&self, index: usize, view: &TensorView) -> Result<(), String> {
        let Some(&name) = self.names.get(index) else { return Ok(()) };
        // SAFETY: the caller's names are null or NUL-terminated strings alive for the run.
        if name.is_null() || unsafe { *name } == 0 {
            return Ok(());
        }
        let named = TensorView { name, ..*view };
        // SAFETY: the caller's sink and its context, for this run.
        if unsafe { (self.sink)(self.ctx, &named) } != 0 {
            // SAFETY: as above.
            let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
            return Err(format!("could not deliver output '{name}'"));
        }
        Ok(())
    }
}

/// `n` items at `ptr` (null when `n` is 0), borrowed for the call.
///
/// # Safety
/// When `n > 0`, `ptr` points to `n` initialised items alive for `'a`.
unsafe fn borrowed<'a, T>(ptr: *const T, n: usize) -> &'a [T] {
    if n == 0 || ptr.is_null() {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(ptr, n) }
    }
}

/// The table's `load`.
///
/// # Safety
/// The ABI's contract: `options` and what it points to are valid for the call; `err` is
/// null or the caller's out-slot.
pub unsafe extern "C" fn load<M: RuntimeModel>(
    options: *const LoadOptions,
    err: *mut *mut c_char,
) -> *mut c_void {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let o = &*options;
        M::load(&Load {
            options: o,
            path: CStr::from_ptr(o.path),
            gpu: (o.device_kind == abi::MEMORY_GPU).then_some(o.device_id),
            cuda_graphs: o.cuda_graphs != 0,
            graph_buckets: borrowed(o.graph_buckets, o.n_graph_buckets),
            graph_exact_rows: o.graph_exact_rows != 0,
            fusion_steps: borrowed(o.fusion_steps, o.n_fusion_steps),
            verbose: o.verbose != 0,
            hand_over: abi::worker::HandOver::from_abi(o.hand_over),
        })
    }));
    let message = match result {
        Ok(Ok(m)) => return Box::into_raw(Box::new(m)) as *mut c_void,
        Ok(Err(e)) => e,
        Err(p) => format!("{} panicked while loading: {}", M::RUNTIME, panic_text(p)),
    };
    set_err(err, message);
    std::ptr::null_mut()
}

/// The table's `run`: the nine arguments of `PluginApi::run`, as [`RuntimeModel::run`] takes them.
///
/// # Safety
/// The ABI's contract: `model` came from [`load`] for this `M`, no other call of it is in
/// flight, and every pointer is valid for the call.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn run<M: RuntimeModel>(
    model: *mut c_void,
    inputs: *const TensorView,
    n_inputs: usize,
    output_names: *const *const c_char,
    n_outputs: usize,
    host_outputs: c_int,
    sink: OutputSink,
    sink_ctx: *mut c_void,
    err: *mut *mut c_char,
) -> c_int {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let m = &mut *(model as *mut M);
        let outputs = Outputs { names: borrowed(output_names, n_outputs), sink, ctx: sink_ctx };
        m.run(borrowed(inputs, n_inputs), &outputs, host_outputs != 0)
    }));
    let message = match result {
        Ok(Ok(())) => return abi::RUN_OK,
        Ok(Err(e)) => e,
        Err(p) => format!("{} panicked while running: {}", M::RUNTIME, panic_text(p)),
    };
    let status = run_status(&message);
    set_err(err, message);
    status
}

/// The table's `free_model`.
///
/// # Safety
/// `model` is null or came from [`load`] for this `M`, and is freed once.
pub unsafe extern "C" fn free_model<M: RuntimeModel>(model: *mut c_void) {
    if !model.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| (*Box::from_raw(model as *mut M)).free()));
    }
}

/// The model behind a handle, for a plugin's own extension entries.
///
/// # Safety
/// `model` came from [`load`] for this `M`, is not freed, and is not being run meanwhile.
pub unsafe fn model_of<'a, M: RuntimeModel>(model: *mut c_void) -> &'a M {
    &*(model as *const M)
}

/// The status `run` returns for a failure reported as `message`. libtorch reports a sticky
/// CUDA error only as text: classified here, once, so the backend reads the kind from the
/// status.
pub fn run_status(message: &str) -> c_int {
    if triton_rust_cuda::sticky_error_in(message) {
        abi::RUN_DEVICE_LOST
    } else {
        abi::RUN_FAILED
    }
}

#[cfg(test)]
mod tests;
