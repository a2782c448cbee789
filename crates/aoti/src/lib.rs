//! `libtriton_rust_aoti.so`: the AOTInductor engine's plugin.
//!
//! PyTorch 2 packages (`torch._inductor.aoti_compile_and_package`, a `.pt2` zip holding a
//! compiled shared library and its weights) run through libtorch's C++
//! `AOTIModelPackageLoader` (src/runtime.cpp). The C++ is built against whichever
//! libtorch `LIBTORCH` names, with no Rust binding in between, so this plugin follows the
//! libtorch a user deploys with (a package runs only on the torch release that made it).
//! This file speaks the backend's plugin ABI (`triton_rust_abi`): it fits each batch to
//! its CUDA graph bucket, runs GPU instances on a long-lived worker thread, and turns
//! libtorch's errors into the ABI's statuses.
//!
//! Outputs: `output_names[i]` names the package's flat output `i`; an empty name means
//! the caller does not want that output (it is skipped).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use triton_rust_abi::graphs::{fit, Fit};
use triton_rust_abi::worker::Worker;
use triton_rust_abi::{
    self as abi, free_error, panic_text, set_err, with_error, LoadOptions, LogFn, OutputSink,
    PluginApi, TensorView,
};

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

static API: PluginApi = PluginApi {
    abi_version: abi::ABI_VERSION,
    runtime,
    load,
    run,
    free_model,
    free_error,
    call_spec,
    graph_input,
};

/// The plugin's function table (see `triton_rust_abi::ENTRY_SYMBOL`).
#[no_mangle]
pub extern "C" fn triton_rust_plugin_api() -> *const PluginApi {
    &API
}

unsafe extern "C" fn runtime() -> *const c_char {
    tra_runtime()
}

unsafe extern "C" fn load(options: *const LoadOptions, err: *mut *mut c_char) -> *mut c_void {
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<Model, String> {
        let o = &*options;
        let path = CStr::from_ptr(o.path);
        let gpu = (o.device_kind == abi::MEMORY_GPU).then_some(o.device_id);
        let graphs = (gpu.is_some() && o.cuda_graphs != 0).then(|| {
            let buckets = if o.n_graph_buckets == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(o.graph_buckets, o.n_graph_buckets).to_vec()
            };
            (buckets, o.graph_exact_rows != 0)
        });
        let load_here = || {
            let (handle, why) = with_error(|e, len| unsafe {
                tra_load(path.as_ptr(), gpu.unwrap_or(-1), graphs.is_some() as c_int, o.log, e, len)
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
        let worker = if gpu.is_some() { Some(Worker::take()?) } else { None };
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
        Ok(Model { handle, worker, graphs, log: o.log, verbose: o.verbose != 0 })
    }));
    match result {
        Ok(Ok(m)) => Box::into_raw(Box::new(m)) as *mut c_void,
        Ok(Err(e)) => {
            set_err(err, e);
            std::ptr::null_mut()
        }
        Err(p) => {
            set_err(
                err,
                format!("the AOTInductor plugin panicked while loading: {}", panic_text(p)),
            );
            std::ptr::null_mut()
        }
    }
}

unsafe extern "C" fn free_model(model: *mut c_void) {
    if model.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let mut m = Box::from_raw(model as *mut Model);
        let handle = m.handle as usize;
        match m.worker.take() {
            Some(w) => {
                let _ = w.run(|| unsafe { tra_free(handle as *mut c_void) });
                w.give_back();
            }
            None => tra_free(m.handle),
        }
    }));
}

unsafe extern "C" fn call_spec(model: *mut c_void, err: *mut *mut c_char) -> *mut c_char {
    let m = &*(model as *mut Model);
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

/// The graph's own input `index` for a batch of `inputs` (`PluginApi::graph_input`). Only
/// reads what runs captured (the caller runs no batch meanwhile), so on the caller's thread.
unsafe extern "C" fn graph_input(
    model: *mut c_void,
    inputs: *const TensorView,
    n_inputs: usize,
    index: usize,
) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        let m = &*(model as *mut Model);
        let views = std::slice::from_raw_parts(inputs, n_inputs);
        match graph_plan(m, views) {
            (0, _) => std::ptr::null_mut(),
            (_, pad_rows) => tra_graph_input(m.handle, inputs, n_inputs, pad_rows, index),
        }
    }))
    .unwrap_or(std::ptr::null_mut())
}

/// What the C++ side's sink calls back with: the caller's sink and output names.
struct SinkCtx<'a> {
    names: &'a [*const c_char],
    sink: OutputSink,
    ctx: *mut c_void,
}

unsafe extern "C" fn forward(ctx: *mut c_void, index: usize, out: *const TensorView) -> c_int {
    let c = &*(ctx as *const SinkCtx<'_>);
    let Some(&name) = c.names.get(index) else { return 0 };
    if name.is_null() || *name == 0 {
        return 0;
    }
    let mut view = std::ptr::read(out);
    view.name = name;
    (c.sink)(c.ctx, &view)
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn run(
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
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
        let m = &mut *(model as *mut Model);
        let views = std::slice::from_raw_parts(inputs, n_inputs);
        let (graph, pad_rows) = graph_plan(m, views);
        let names = std::slice::from_raw_parts(output_names, n_outputs);
        let ctx = SinkCtx { names, sink, ctx: sink_ctx };
        let handle = m.handle as usize;
        let ctx_addr = &ctx as *const SinkCtx<'_> as usize;
        let views_addr = views.as_ptr() as usize;
        let t0 = Instant::now();
        // the plugin's log when the backend logs at verbose level: each run says where its time went
        let timing_log = m.log.filter(|_| m.verbose);
        let verbose = timing_log.is_some();
        let call = move || {
            let began = t0.elapsed();
            let mut times = RunTimes { gpu_events: verbose as i32, ..RunTimes::default() };
            let (rc, why) = with_error(|e, len| unsafe {
                tra_run(
                    handle as *mut c_void,
                    views_addr as *const TensorView,
                    n_inputs,
                    graph,
                    pad_rows,
                    host_outputs,
                    forward,
                    ctx_addr as *mut c_void,
                    &mut times,
                    e,
                    len,
                )
            });
            (rc, why, began, times, t0.elapsed())
        };
        let (rc, why, began, times, ended) = match &m.worker {
            Some(w) => w.run(call)?,
            None => call(),
        };
        if rc != 0 {
            return Err(why);
        }
        if let Some(log) = timing_log {
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
                format!(
                    ", gpu copies {} us, gpu graph {} us",
                    times.gpu_copies_us, times.gpu_graph_us
                )
            } else {
                String::new()
            };
            let text = format!(
                "timing: aoti run: handed over {} us, inputs staged {} us, {queued}, gpu done {} us, outputs delivered {} us, handed back {} us{gpu}",
                began.as_micros(),
                times.staged_us,
                times.synced_us - times.launched_us,
                times.delivered_us - times.synced_us,
                t0.elapsed().saturating_sub(ended).as_micros()
            );
            if let Ok(c) = std::ffi::CString::new(text) {
                log(abi::LOG_VERBOSE, c.as_ptr());
            }
        }
        Ok(())
    }));
    let message = match result {
        Ok(Ok(())) => return abi::RUN_OK,
        Ok(Err(e)) => e,
        Err(p) => format!("the AOTInductor plugin panicked while running: {}", panic_text(p)),
    };
    // libtorch reports a sticky CUDA error only as text: classified here, once, so the
    // backend reads the kind from the status
    let status = if triton_rust_cuda::sticky_error_in(&message) {
        abi::RUN_DEVICE_LOST
    } else {
        abi::RUN_FAILED
    };
    set_err(err, message);
    status
}
