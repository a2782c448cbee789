//! `libtriton_rust_torch.so`: the TorchScript engine, as a plugin.
//!
//! It links libtorch (through `tch`), so it is built and shipped apart from
//! `libtriton_rust.so`, which opens it only when a TorchScript model loads (see
//! `triton_rust_abi` for why and for the ABI; `triton_rust_plugin` makes the table it exports
//! from [`Model`]'s `RuntimeModel`). Inputs are wrapped in place
//! (`from_blob`, host or device memory), the module runs under no-grad, and each
//! output is handed to the caller's sink in the memory it was produced in.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use tch::{CModule, Device, IValue, Tensor};
use triton_rust_abi::{self as abi, TensorView};
use triton_rust_plugin::{plugin_api, Load, Outputs, RuntimeModel};

struct Model {
    module: CModule,
    device: Device,
    stream: Option<InstanceStream>,
    optimized_execution: bool,
    /// CUDA graphs (a GPU instance with `optimization.cuda.graphs`); dropped before the
    /// stream (field order).
    graphs: Option<graphs::Graphs>,
    log: Option<abi::LogFn>,
    verbose: bool,
    /// The long-lived thread a GPU instance runs on (see `worker`).
    worker: Option<worker::Worker>,
    /// Host inputs to a GPU instance go through this pinned buffer (see `staging`).
    staging: staging::Staging,
    /// A GPU instance's outputs, when they are wanted on the host (see `staging`).
    outputs: staging::Pinned,
}

mod convert;
mod graphs;
mod shim;
mod staging;

use convert::{dtype_of, kind_of, tensors};
use shim::{cuda_api, shim_call, InstanceStream};
use triton_rust_abi::worker;

triton_rust_plugin::export_plugin_api!(plugin_api::<Model>(runtime, None));

static RUNTIME: &CStr = c"libtorch 2.11.0 (tch 0.24.0)";

unsafe extern "C" fn runtime() -> *const c_char {
    RUNTIME.as_ptr()
}

impl RuntimeModel for Model {
    const RUNTIME: &'static str = "libtorch";

    fn load(load: &Load<'_>) -> Result<Model, String> {
        let o = load.options;
        let path = load.path.to_string_lossy().into_owned();
        let device = match load.gpu {
            Some(id) => {
                if !tch::Cuda::is_available() {
                    return Err("a KIND_GPU instance needs CUDA, but libtorch sees no GPU (is libtorch_cuda.so loaded?)".into());
                }
                tch::Cuda::set_user_enabled_cudnn(o.cudnn != 0);
                Device::Cuda(id as usize)
            }
            None => Device::Cpu,
        };
        if o.intra_op_threads > 0 {
            tch::set_num_threads(o.intra_op_threads);
        }
        if o.tensor_fuser >= 0 {
            tch::jit::f_set_tensor_expr_fuser_enabled(o.tensor_fuser != 0)
                .map_err(|e| e.to_string())?;
        }
        if o.jit_profiling >= 0 {
            tch::jit::f_set_profiling_mode(o.jit_profiling != 0).map_err(|e| e.to_string())?;
        }
        let steps = load.fusion_steps;
        if !steps.is_empty() {
            // (the engine gives a strategy to GPU instances only: the shim is loaded)
            let api = cuda_api()?;
            // SAFETY: the steps are the caller's slice, valid for the call.
            shim_call(|err, len| unsafe {
                (api.fusion_strategy)(steps.as_ptr(), steps.len(), err, len)
            })
            .map_err(|why| format!("cannot set TorchScript's fusion strategy: {why}"))?;
        }
        let stream = match device {
            Device::Cuda(id) => {
                let api = cuda_api()?;
                // SAFETY: a plain call into the shim.
                let stream = unsafe { (api.new)(id as c_int) };
                if stream.is_null() {
                    return Err(format!("cannot get a CUDA stream on device {id}"));
                }
                Some(InstanceStream { api, stream })
            }
            _ => None,
        };
        let worker =
            if device.is_cuda() { Some(worker::Worker::take(load.hand_over)?) } else { None };
        let mut module = CModule::load_on_device(&path, device)
            .map_err(|e| format!("cannot load TorchScript file '{path}': {e}"))?;
        module.set_eval();
        let graphs = match (&stream, load.cuda_graphs) {
            (Some(s), true) => {
                Some(graphs::Graphs::new(s.api, load.graph_buckets.to_vec(), load.graph_exact_rows))
            }
            _ => None,
        };
        Ok(Model {
            module,
            device,
            stream,
            optimized_execution: o.optimized_execution != 0,
            graphs,
            log: o.log,
            verbose: load.verbose,
            worker,
            staging: staging::Staging::new(),
            outputs: staging::Pinned::new(),
        })
    }

    fn run(
        &mut self,
        inputs: &[TensorView],
        outputs: &Outputs<'_>,
        host_outputs: bool,
    ) -> Result<(), String> {
        let t0 = std::time::Instant::now();
        let n_outputs = outputs.len();
        // SAFETY (both calls): the inputs' pointers are valid for the run (the ABI's contract).
        let (outs, times) = match self.worker.take() {
            Some(w) => {
                let r = w.run(|| {
                    let began = t0.elapsed();
                    unsafe { compute(self, inputs, n_outputs, host_outputs) }
                        .map(|(o, t)| (o, RunTimes { began, ..t }))
                });
                self.worker = Some(w);
                r??
            }
            None => unsafe { compute(self, inputs, n_outputs, host_outputs) }?,
        };
        let returned = t0.elapsed();
        for (i, t) in outs.iter().enumerate() {
            let shape = t.size();
            let (memory, device_id) = match t.device() {
                Device::Cuda(i) => (abi::MEMORY_GPU, i as i64),
                _ => (abi::MEMORY_CPU, 0),
            };
            let numel: i64 = shape.iter().product();
            let view = TensorView {
                name: std::ptr::null(),
                dtype: dtype_of(t.kind())?,
                shape: shape.as_ptr(),
                rank: shape.len(),
                data: t.data_ptr() as *const c_void,
                bytes: numel as usize * t.kind().elt_size_in_bytes(),
                memory,
                device_id,
            };
            outputs.deliver(i, &view)?;
        }
        if self.verbose {
            let launch = times.launched - times.staged;
            if let (Some(log), Ok(c)) = (
                self.log,
                CString::new(format!(
                    "timing: torch run: handed over {} us, inputs staged {} us, {} {} us, gpu done {} us, handed back {} us, outputs delivered {} us",
                    times.began.as_micros(),
                    times.staged.as_micros(),
                    if times.replayed { "graph replayed" } else { "forward queued" },
                    launch.as_micros(),
                    times.synced.map_or(0, |t| (t - times.launched).as_micros()),
                    returned.saturating_sub(times.began + times.total).as_micros(),
                    t0.elapsed().as_micros()
                )),
            ) {
                // SAFETY: the backend's logger; the message outlives the call.
                unsafe { log(abi::LOG_VERBOSE, c.as_ptr()) };
            }
        }
        Ok(())
    }

    fn free(mut self) {
        // graphs (and their memory pool) go before the module and the stream
        self.graphs = None;
        let release = self.stream.as_ref().map(|s| s.api.release);
        let worker = self.worker.take();
        drop(self);
        // a GPU model: what libtorch cached for it goes back to the device (flat GPU
        // memory across reloads)
        if let Some(release) = release {
            // SAFETY: a plain call into the shim.
            unsafe { release() };
        }
        if let Some(w) = worker {
            w.give_back();
        }
    }
}

/// Where a run's time went (`--log-verbose=1`).
struct RunTimes {
    staged: std::time::Duration,
    launched: std::time::Duration,
    synced: Option<std::time::Duration>,
    /// The whole of `compute`.
    total: std::time::Duration,
    /// From the call until `compute` began (the hand-off to the worker thread).
    began: std::time::Duration,
    replayed: bool,
}

/// Stages the inputs, runs the module (or replays its CUDA graph) and returns the
/// outputs ready to hand over: on the host when `host_outputs`, else where they were
/// made, with the instance's GPU work finished. On a GPU instance this runs on the
/// instance's worker thread.
unsafe fn compute(
    m: &mut Model,
    views: &[TensorView],
    n_outputs: usize,
    host_outputs: bool,
) -> Result<(Vec<Tensor>, RunTimes), String> {
    let _guard = tch::no_grad_guard();
    if !m.optimized_execution {
        // thread-local in libtorch: set on the running thread for each run
        tch::jit::f_set_graph_executor_optimize(false).map_err(|e| e.to_string())?;
    }
    if let Some(s) = &m.stream {
        // make the instance's stream current on the running thread
        if (s.api.enter)(s.stream) != 0 {
            return Err("cannot make the instance's CUDA stream current".into());
        }
    }
    let t0 = std::time::Instant::now();
    // host inputs of a GPU instance, staged together (their positions in `views`)
    let mut host = Vec::new();
    let mut host_at = Vec::new();
    let mut args = Vec::with_capacity(views.len());
    for (i, v) in views.iter().enumerate() {
        let shape = std::slice::from_raw_parts(v.shape, v.rank);
        let kind = kind_of(v.dtype)?;
        let dev = if v.memory == abi::MEMORY_GPU {
            Device::Cuda(v.device_id as usize)
        } else {
            Device::Cpu
        };
        if let (Device::Cpu, Device::Cuda(_), Some(_)) = (dev, m.device, &m.stream) {
            let want = shape.iter().product::<i64>() as usize * kind.elt_size_in_bytes();
            if v.bytes != want {
                return Err(format!(
                    "an input of shape {shape:?} holds {} bytes, not {want}",
                    v.bytes
                ));
            }
            host.push(staging::HostInput {
                bytes: std::slice::from_raw_parts(v.data as *const u8, v.bytes),
                shape,
                kind,
            });
            host_at.push(i);
            args.push(IValue::None);
            continue;
        }
        // Wrap the caller's buffer without copying; move it to the model's device if needed.
        let t = Tensor::f_from_blob(v.data as *const u8, shape, &[], kind, dev)
            .map_err(|e| e.to_string())?;
        let t = if dev == m.device {
            t
        } else {
            t.f_to_device(m.device)
                .map_err(|e| format!("moving an input to {:?}: {e}", m.device))?
        };
        args.push(IValue::Tensor(t));
    }
    if let Some(s) = &m.stream {
        if !host.is_empty() {
            // every input from the host, for a graph already captured: staged straight into
            // its static inputs (no copy on the device before the replay)
            let into = match &m.graphs {
                Some(g) if host.len() == views.len() => {
                    let typed = host
                        .iter()
                        .map(|h| Ok((dtype_of(h.kind)?, h.shape.to_vec())))
                        .collect::<Result<Vec<_>, String>>()?;
                    g.inputs_for(typed)
                }
                _ => None,
            };
            for (t, i) in m.staging.stage(&host, m.device, s, into)?.into_iter().zip(host_at) {
                args[i] = IValue::Tensor(t);
            }
        }
    }
    let staged = t0.elapsed();
    let mut outs = Vec::new();
    let log = m.log;
    let replayed = match m.graphs.as_mut() {
        Some(g) => {
            let inputs: Vec<&Tensor> = args
                .iter()
                .map(|a| match a {
                    IValue::Tensor(t) => t,
                    _ => unreachable!("inputs are tensors"),
                })
                .collect();
            let mut note = |level: c_int, msg: String| {
                if let (Some(log), Ok(c)) = (log, CString::new(msg.replace('\0', " "))) {
                    log(level, c.as_ptr());
                }
            };
            g.run(&m.module, &inputs, &mut outs, &mut note)?
        }
        None => false,
    };
    if !replayed {
        let result =
            m.module.forward_is(&args).map_err(|e| format!("TorchScript forward failed: {e}"))?;
        tensors(result, &mut outs)?;
    }
    if outs.len() < n_outputs {
        return Err(format!(
            "the model returned {} tensors; the config asks for {n_outputs} outputs",
            outs.len()
        ));
    }
    outs.truncate(n_outputs);
    let launched = t0.elapsed();
    let (ready, waited) = match (host_outputs, &m.stream) {
        // a GPU instance whose responses want host memory: one wait for the model and the
        // copies into pinned memory
        (true, Some(s)) => (staging::outputs_to_host(outs, &mut m.outputs, m.device, s)?, true),
        (_, stream) => outputs_where_made(outs, host_outputs, stream)?,
    };
    let synced = waited.then(|| t0.elapsed());
    Ok((
        ready,
        RunTimes {
            staged,
            launched,
            synced,
            total: t0.elapsed(),
            began: Default::default(),
            replayed,
        },
    ))
}

/// Outputs made contiguous where libtorch made them (on the host when `host_outputs`), the
/// GPU work finished before they are handed over; true when it waited for the GPU.
fn outputs_where_made(
    outs: Vec<Tensor>,
    host_outputs: bool,
    stream: &Option<InstanceStream>,
) -> Result<(Vec<Tensor>, bool), String> {
    let mut ready = Vec::with_capacity(outs.len());
    for t in outs {
        // the f_ forms return CUDA errors (a device-side assert surfaces here) instead of panicking
        let t =
            if host_outputs { t.f_to_device(Device::Cpu).map_err(|e| e.to_string())? } else { t };
        ready.push(t.f_contiguous().map_err(|e| e.to_string())?);
    }
    let Some(Device::Cuda(id)) = ready.iter().map(Tensor::device).find(|d| d.is_cuda()) else {
        return Ok((ready, false));
    };
    // The caller copies on another stream: finish this instance's work first.
    match stream {
        Some(s) => s.sync()?,
        None => tch::Cuda::synchronize(id as i64),
    }
    Ok((ready, true))
}
