//! The shims through the table, as the backend calls them, on a model that echoes its inputs.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use triton_rust_abi::{self as abi, LoadOptions, PluginApi, TensorView};

use super::{Outputs, RuntimeModel};
use crate::table::plugin_api;

/// Loads unless its path says otherwise; each run hands input `i` back as output `i`, or
/// fails the way the first input's name asks.
struct Echo {
    rows: Vec<i64>,
}

impl RuntimeModel for Echo {
    const RUNTIME: &'static str = "the echo runtime";

    fn load(load: &super::Load<'_>) -> Result<Self, String> {
        match load.path.to_str().unwrap() {
            "missing" => Err("no such model".into()),
            "panics" => panic!("a bad file"),
            _ => Ok(Echo { rows: load.graph_buckets.to_vec() }),
        }
    }

    fn run(
        &mut self,
        inputs: &[TensorView],
        outputs: &Outputs<'_>,
        _host_outputs: bool,
    ) -> Result<(), String> {
        if let Some(first) = inputs.first() {
            // SAFETY: the test's names are NUL-terminated.
            match unsafe { CStr::from_ptr(first.name) }.to_str().unwrap() {
                "lose" => return Err("CUDA error: an illegal memory access was encountered".into()),
                "panic" => panic!("boom"),
                _ => {}
            }
        }
        for (i, v) in inputs.iter().enumerate() {
            outputs.deliver(i, v)?;
        }
        Ok(())
    }
}

static API: PluginApi = plugin_api::<Echo>(runtime, None);

unsafe extern "C" fn runtime() -> *const c_char {
    c"echo 1".as_ptr()
}

fn options(path: &CStr, buckets: &[i64]) -> LoadOptions {
    LoadOptions {
        path: path.as_ptr(),
        device_kind: abi::MEMORY_CPU,
        device_id: 0,
        intra_op_threads: 0,
        inference_mode: 1,
        cudnn: 1,
        optimized_execution: 1,
        tensor_fuser: -1,
        jit_profiling: -1,
        fusion_steps: std::ptr::null(),
        n_fusion_steps: 0,
        cuda_graphs: 0,
        graph_buckets: buckets.as_ptr(),
        n_graph_buckets: buckets.len(),
        graph_exact_rows: 0,
        log: None,
        verbose: 0,
        hand_over: abi::HAND_OVER_DEFAULT,
    }
}

/// `load`'s handle, or its error text.
fn load(path: &CStr) -> Result<*mut c_void, String> {
    let mut err = std::ptr::null_mut();
    let opts = options(path, &[4, 8]);
    // SAFETY: the options and the slot outlive the call.
    let handle = unsafe { (API.load)(&opts, &mut err) };
    if handle.is_null() {
        Err(taken(err))
    } else {
        Ok(handle)
    }
}

fn taken(err: *mut c_char) -> String {
    assert!(!err.is_null(), "a failure leaves a message");
    // SAFETY: the plugin's string, freed with its free_error.
    let text = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    unsafe { (API.free_error)(err) };
    text
}

/// Collects what the sink is given: (name, first element); refuses an output named "refused".
unsafe extern "C" fn collect(ctx: *mut c_void, view: *const TensorView) -> c_int {
    let got = &mut *(ctx as *mut Vec<(String, i64)>);
    let v = &*view;
    let name = CStr::from_ptr(v.name).to_string_lossy().into_owned();
    if name == "refused" {
        return 1;
    }
    got.push((name, *(v.data as *const i64)));
    0
}

/// Runs `handle` on one-element inputs named `inputs` holding 10, 11, ..., asking for
/// outputs `wanted`: the status, what the sink got, and the error text.
fn run(
    handle: *mut c_void,
    inputs: &[&str],
    wanted: &[&str],
) -> (c_int, Vec<(String, i64)>, String) {
    let names: Vec<CString> = inputs.iter().map(|n| CString::new(*n).unwrap()).collect();
    let data: Vec<i64> = (10..10 + inputs.len() as i64).collect();
    let shape = [1i64];
    let views: Vec<TensorView> = names
        .iter()
        .zip(&data)
        .map(|(n, d)| TensorView {
            name: n.as_ptr(),
            dtype: abi::dtype::I64,
            shape: shape.as_ptr(),
            rank: 1,
            data: d as *const i64 as *const c_void,
            bytes: 8,
            memory: abi::MEMORY_CPU,
            device_id: 0,
        })
        .collect();
    let wanted: Vec<CString> = wanted.iter().map(|n| CString::new(*n).unwrap()).collect();
    let wanted_ptrs: Vec<*const c_char> = wanted.iter().map(|n| n.as_ptr()).collect();
    let mut got: Vec<(String, i64)> = Vec::new();
    let mut err = std::ptr::null_mut();
    // SAFETY: every pointer outlives the call; the handle is this table's.
    let status = unsafe {
        (API.run)(
            handle,
            views.as_ptr(),
            views.len(),
            wanted_ptrs.as_ptr(),
            wanted_ptrs.len(),
            0,
            collect,
            &mut got as *mut Vec<(String, i64)> as *mut c_void,
            &mut err,
        )
    };
    let text = if err.is_null() { String::new() } else { taken(err) };
    (status, got, text)
}

#[test]
fn the_table_is_the_core_at_this_abi_version_without_the_aoti_extension() {
    assert_eq!(API.abi_version, abi::ABI_VERSION);
    assert!(API.aoti.is_none());
    // SAFETY: a static string.
    assert_eq!(unsafe { CStr::from_ptr((API.runtime)()) }, c"echo 1");
}

#[test]
fn outputs_reach_the_sink_under_the_callers_names_and_unnamed_ones_are_skipped() {
    let handle = load(c"model").unwrap();
    // SAFETY: the handle came from this table's load and is not being run.
    assert_eq!(unsafe { super::model_of::<Echo>(handle) }.rows, [4, 8], "the buckets borrowed");
    let (status, got, err) = run(handle, &["a", "b", "c"], &["X", "", "Z"]);
    assert_eq!((status, err.as_str()), (abi::RUN_OK, ""));
    assert_eq!(got, [("X".to_string(), 10), ("Z".to_string(), 12)]);
    let (status, got, _) = run(handle, &["a", "b"], &["X"]);
    assert_eq!(
        (status, got.len()),
        (abi::RUN_OK, 1),
        "outputs past the caller's names are skipped"
    );
    unsafe { (API.free_model)(handle) };
}

#[test]
fn a_refused_output_fails_the_run_naming_it() {
    let handle = load(c"model").unwrap();
    let (status, _, err) = run(handle, &["a"], &["refused"]);
    assert_eq!((status, err.as_str()), (abi::RUN_FAILED, "could not deliver output 'refused'"));
    unsafe { (API.free_model)(handle) };
}

#[test]
fn failures_and_panics_come_back_as_statuses_and_text() {
    let handle = load(c"model").unwrap();
    let (status, _, err) = run(handle, &["panic"], &["X"]);
    assert_eq!(status, abi::RUN_FAILED);
    assert_eq!(err, "the echo runtime panicked while running: boom");
    let (status, _, err) = run(handle, &["lose"], &["X"]);
    assert_eq!(status, abi::RUN_DEVICE_LOST, "a sticky CUDA error: {err}");
    let (status, got, _) = run(handle, &["a"], &["X"]);
    assert_eq!((status, got.len()), (abi::RUN_OK, 1), "the model runs on after a caught panic");
    unsafe { (API.free_model)(handle) };
}

#[test]
fn a_failed_load_returns_null_with_its_reason() {
    assert_eq!(load(c"missing").unwrap_err(), "no such model");
    assert_eq!(load(c"panics").unwrap_err(), "the echo runtime panicked while loading: a bad file");
}

#[test]
fn a_sticky_cuda_error_from_libtorch_returns_the_device_lost_status() {
    let assert = "CUDA error: device-side assert triggered\nCompile with TORCH_USE_CUDA_DSA";
    assert_eq!(super::run_status(assert), abi::RUN_DEVICE_LOST);
    assert_eq!(super::run_status("CUDA out of memory"), abi::RUN_FAILED);
}
