//! `libtriton_rust_aoti.so`: the AOTInductor engine's plugin.
//!
//! PyTorch 2 packages (`torch._inductor.aoti_compile_and_package`, a `.pt2` zip holding a
//! compiled shared library and its weights) run through libtorch's C++
//! `AOTIModelPackageLoader` (src/package.cpp, src/run.cpp, src/graphs.cpp). The C++ is built
//! against whichever libtorch `LIBTORCH` names, with no Rust binding in between, so this
//! plugin follows the libtorch a user deploys with (a package runs only on the torch release
//! that made it).
//! This file is the Rust side of the backend's plugin ABI (`triton_rust_abi`; the core table
//! from `triton_rust_plugin`, plus the AOTInductor extension's entries): it fits each batch
//! to its CUDA graph bucket and runs GPU instances on a long-lived worker thread.
//!
//! Outputs: `output_names[i]` names the package's flat output `i`; an empty name means
//! the caller does not want that output (it is skipped).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use triton_rust_abi::graphs::{fit, Fit};
use triton_rust_abi::worker::Worker;
use triton_rust_abi::{self as abi, AotiApi, LogFn, TensorView};
use triton_rust_plugin::{model_of, plugin_api, set_err, with_error, Load, Outputs, RuntimeModel};

type Sink = unsafe extern "C" fn(ctx: *mut c_void, index: usize, out: *const TensorView) -> c_int;

extern "C" {
    fn tra_runtime() -> *const c_char;
    fn tra_load(
        path: *const c_char,
        gpu: c_int,
        graphs: c_int,
        log: Option<LogFn>,
        err: *mut c_char,
        len: usize,
    ) -> *mut c_void;
    fn tra_call_spec(model: *mut c_void, err: *mut c_char, len: usize) -> *mut c_char;
    fn tra_free_string(s: *mut c_char);
    #[allow(clippy::too_many_arguments)]
    fn tra_run(
        model: *mut c_void,
        inputs: *const TensorView,
        n: usize,
        graph: c_int,
        pad_rows: i64,
        host_outputs: c_int,
        sink: Sink,
        ctx: *mut c_void,
        times: *mut RunTimes,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    fn tra_graph_input(
        model: *mut c_void,
        inputs: *const TensorView,
        n: usize,
        pad_rows: i64,
        index: usize,
    ) -> *mut c_void;
    fn tra_free(model: *mut c_void);
}

/// Where a run's time went, in microseconds from `tra_run`'s start (filled by the C++
/// side; logged as a `timing:` line with `--log-verbose=1`). Through a CUDA graph also
/// when its inputs' copies were queued, and with `gpu_events` set (by the caller, when it
/// logs) what the GPU spent on those copies and on the graph.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RunTimes {
    staged_us: i64,
    copied_us: i64,
    launched_us: i64,
    synced_us: i64,
    delivered_us: i64,
    gpu_copies_us: i64,
    gpu_graph_us: i64,
    replayed: i32,
    gpu_events: i32,
}

struct Model {
    handle: *mut c_void,
    /// GPU instances run on a long-lived thread (see `triton_rust_abi::worker`).
    worker: Option<Worker>,
    /// CUDA graphs: the batch-size buckets, and whether they are exact rows (no batching).
    graphs: Option<(Vec<i64>, bool)>,
    /// The backend logs at verbose level: each run says where its time went.
    log: Option<LogFn>,
    verbose: bool,
}

triton_rust_plugin::export_plugin_api!(plugin_api::<Model>(runtime, Some(&AOTI)));

/// What this plugin adds to the core table.
static AOTI: AotiApi = AotiApi { call_spec, graph_input };

unsafe extern "C" fn runtime() -> *const c_char {
    tra_runtime()
}

impl RuntimeModel for Model {
    const RUNTIME: &'static str = "the AOTInductor plugin";

    fn load(load: &Load<'_>) -> Result<Model, String> {
        let path = load.path;
        let gpu = load.gpu;
        let graphs = (gpu.is_some() && load.cuda_graphs)
            .then(|| (load.graph_buckets.to_vec(), load.graph_exact_rows));
        let log = load.options.log;
        let load_here = || {
            // SAFETY: the path outlives the call; the buffer is with_error's.
            let (handle, why) = with_error(|e, len| unsafe {
                tra_load(path.as_ptr(), gpu.unwrap_or(-1), graphs.is_some() as c_int, log, e, len)
            });
            if handle.is_null() {
                Err(format!(
                    "cannot load the AOTInductor package '{}': {why}",
                    path.to_string_lossy()
                ))
            } else {
                Ok(handle as usize)
            }
        };
        let worker = if gpu.is_some() { Some(Worker::take(load.hand_over)?) } else { None };
        // a GPU package is loaded on the thread that will run it
        let handle = match &worker {
            Some(w) => w.run(load_here)?,
            None => load_here(),
        };
        let handle = match handle {
            Ok(h) => h as *mut c_void,
            Err(e) => {
                if let Some(w) = worker {
                    w.give_back();
                }
                return Err(e);
            }
        };
        Ok(Model { handle, worker, graphs, log, verbose: load.verbose })
    }

    fn run(
        &mut self,
        inputs: &[TensorView],
        outputs: &Outputs<'_>,
        host_outputs: bool,
    ) -> Result<(), String> {
        // SAFETY: the inputs' shapes are valid for the run (the ABI's contract).
        let (graph, pad_rows) = unsafe { graph_plan(self, inputs) };
        let handle = self.handle as usize;
        let outputs_addr = outputs as *const Outputs<'_> as usize;
        let views_addr = inputs.as_ptr() as usize;
        let n_inputs = inputs.len();
        let t0 = Instant::now();
        // the plugin's log when the backend logs at verbose level: each run says where its time went
        let timing_log = self.log.filter(|_| self.verbose);
        let verbose = timing_log.is_some();
        let call = move || {
            let began = t0.elapsed();
            let mut times = RunTimes { gpu_events: verbose as i32, ..RunTimes::default() };
            // SAFETY: the model, the inputs and the outputs outlive the call (the caller
            // waits for it); the buffer is with_error's.
            let (rc, why) = with_error(|e, len| unsafe {
                tra_run(
                    handle as *mut c_void,
                    views_addr as *const TensorView,
                    n_inputs,
                    graph,
                    pad_rows,
                    host_outputs as c_int,
                    forward,
                    outputs_addr as *mut c_void,
                    &mut times,
                    e,
                    len,
                )
            });
            (rc, why, began, times, t0.elapsed())
        };
        let (rc, why, began, times, ended) = match &self.worker {
            Some(w) => w.run(call)?,
            None => call(),
        };
        if rc != 0 {
            return Err(why);
        }
        if let Some(log) = timing_log {
            log_timing(log, &times, began, t0.elapsed().saturating_sub(ended));
        }
        Ok(())
    }

    fn free(mut self) {
        let handle = self.handle as usize;
        match self.worker.take() {
            Some(w) => {
                // SAFETY: the handle is tra_load's, freed once, on the thread that ran it.
                let _ = w.run(|| unsafe { tra_free(handle as *mut c_void) });
                w.give_back();
            }
            // SAFETY: as above.
            None => unsafe { tra_free(self.handle) },
        }
    }
}

unsafe extern "C" fn call_spec(model: *mut c_void, err: *mut *mut c_char) -> *mut c_char {
    let m = model_of::<Model>(model);
    let (text, why) = with_error(|e, len| unsafe { tra_call_spec(m.handle, e, len) });
    if text.is_null() {
        set_err(err, format!("cannot read the package's call spec: {why}"));
        return std::ptr::null_mut();
    }
    let owned = CStr::from_ptr(text).to_owned();
    tra_free_string(text);
    owned.into_raw()
}

/// Whether a batch of `views` runs through a CUDA graph (1) or not (0), and the rows its
/// inputs are padded to for it (0: as they are).
unsafe fn graph_plan(m: &Model, views: &[TensorView]) -> (c_int, i64) {
    let Some((buckets, exact)) = &m.graphs else { return (0, 0) };
    let shapes: Vec<&[i64]> =
        views.iter().map(|v| std::slice::from_raw_parts(v.shape, v.rank)).collect();
    match fit(buckets, !exact, &shapes) {
        Fit::Graph(rows) => (1, rows.unwrap_or(0)),
        _ => (0, 0),
    }
}

/// The graph's own input `index` for a batch of `inputs` (`AotiApi::graph_input`). Only
/// reads what runs captured (the caller runs no batch meanwhile), so on the caller's thread.
unsafe extern "C" fn graph_input(
    model: *mut c_void,
    inputs: *const TensorView,
    n_inputs: usize,
    index: usize,
) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        let m = model_of::<Model>(model);
        let views = std::slice::from_raw_parts(inputs, n_inputs);
        match graph_plan(m, views) {
            (0, _) => std::ptr::null_mut(),
            (_, pad_rows) => tra_graph_input(m.handle, inputs, n_inputs, pad_rows, index),
        }
    }))
    .unwrap_or(std::ptr::null_mut())
}

/// The C++ side's sink: output `index` to the caller's (`ctx` is the run's [`Outputs`]).
unsafe extern "C" fn forward(ctx: *mut c_void, index: usize, out: *const TensorView) -> c_int {
    let outputs = &*(ctx as *const Outputs<'_>);
    outputs.deliver(index, &*out).map_or(1, |()| 0)
}

/// Logs where a run's time went (`--log-verbose=1`).
fn log_timing(log: LogFn, times: &RunTimes, began: std::time::Duration, back: std::time::Duration) {
    let queued = if times.replayed != 0 {
        format!(
            "inputs copied {} us, graph replayed {} us",
            times.copied_us - times.staged_us,
            times.launched_us - times.copied_us
        )
    } else {
        format!("run queued {} us", times.launched_us - times.staged_us)
    };
    let gpu = if times.replayed != 0 && times.gpu_graph_us > 0 {
        format!(", gpu copies {} us, gpu graph {} us", times.gpu_copies_us, times.gpu_graph_us)
    } else {
        String::new()
    };
    let text = format!(
        "timing: aoti run: handed over {} us, inputs staged {} us, {queued}, gpu done {} us, outputs delivered {} us, handed back {} us{gpu}",
        began.as_micros(),
        times.staged_us,
        times.synced_us - times.launched_us,
        times.delivered_us - times.synced_us,
        back.as_micros()
    );
    if let Ok(c) = std::ffi::CString::new(text) {
        // SAFETY: the backend's logger; the message outlives the call.
        unsafe { log(abi::LOG_VERBOSE, c.as_ptr()) };
    }
}
