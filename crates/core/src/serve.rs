//! Serving: where the server's view (models, instances, requests) meets the engines.
//!
//! `ModelState` reads the config, picks the engine, auto-completes and checks the
//! config against a load-time probe of the model; `InstanceState` owns one engine;
//! [`execute`] is the batch path: check each request, group, assemble, run once per
//! group, scatter outputs into the responses, report statistics. A request's own
//! problem fails that request only.
//!
//! The server is reached only through the [`Transport`] traits, which the Triton crate
//! implements over Triton's C API and the tests here implement in memory (with a fake
//! device for GPU-resident inputs), so the whole path is unit-tested in-process.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::batch::{
    assemble, check_request, group_by_shape, scatter_ranges, BatchData, CheckedRequest,
    InputPolicy, RequestTensor,
};
use crate::config::{autocomplete, check_against_model, ModelConfig};
use crate::engine::{self, Device, Engine, EngineClaim, EngineFactory, EngineOptions, OutputView};
use crate::error::{Error, ErrorKind, Result};
use crate::settings::{self, CoreSettings};
use crate::telemetry::MetricsSource;
use crate::tensor::{Bytes, BytesMut, DataType, DeviceOps};

/// Timestamps of one execution, in the server's clock (CLOCK_MONOTONIC ns for Triton), in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    pub exec_start: u64,
    pub compute_start: u64,
    pub compute_end: u64,
    pub exec_end: u64,
}

/// One inference request as the server hands it over. Dropping it releases it.
pub trait InferRequest {
    fn id(&self) -> String;
    fn is_cancelled(&self) -> bool;
    /// Every input with its bytes (host slices, or views of GPU memory).
    fn inputs(&self) -> Result<Vec<RequestTensor<'_>>>;
    /// Names of the outputs the client asked for.
    fn requested_outputs(&self) -> Result<Vec<String>>;
    /// The request's parameters (and headers the server forwards as parameters), values as text.
    fn parameters(&self) -> Result<Vec<(String, String)>> {
        Ok(Vec::new())
    }
    /// Stores the next value of the sequence's implicit state `name` (the state's
    /// `output_name`): the server gives a buffer of `byte_size` bytes, on `prefer` when it
    /// can, `fill` writes it, and the value becomes the state input of the sequence's
    /// next request. Returns where the buffer was.
    fn update_state(
        &self,
        name: &str,
        _dtype: DataType,
        _shape: &[i64],
        _byte_size: usize,
        _prefer: Device,
        _fill: &mut dyn FnMut(BytesMut<'_>) -> Result<()>,
    ) -> Result<Device> {
        Err(Error::unsupported(format!("state '{name}': this server keeps no sequence state")))
    }
}

/// A response; sent exactly once.
pub trait InferResponse {
    /// Adds an output and returns its buffer, on `prefer` when the server can (it may
    /// answer with host memory anyway, e.g. for a client over the network).
    fn output_buffer(
        &mut self,
        name: &str,
        dtype: DataType,
        shape: &[i64],
        byte_size: usize,
        prefer: Device,
    ) -> Result<BytesMut<'_>>;
    /// Sends the response as final, with the error if the request failed.
    fn send(self, outcome: &Result<()>);
}

/// The server side of one execute call: responses, statistics, clock and device.
pub trait Transport {
    type Request: InferRequest;
    type Response: InferResponse;
    fn respond(&self, request: &Self::Request) -> Result<Self::Response>;
    /// One request's statistics; called before the request is released.
    fn report(&self, request: &Self::Request, success: bool, timing: Timing);
    fn report_batch(&self, rows: u64, timing: Timing);
    fn now_ns(&self) -> u64;
    /// Copies and gathers of device memory.
    fn device_ops(&self) -> &dyn DeviceOps;
}

pub use crate::settings::BackendSettings;

pub struct ModelContext<'a> {
    pub name: String,
    pub version: u64,
    pub repository: PathBuf,
    pub config_json: String,
    pub autocomplete: bool,
    pub backend: &'a BackendSettings,
    pub engines: Arc<dyn EngineFactory>,
}

pub struct ModelState {
    name: String,
    config: ModelConfig,
    claim: &'static EngineClaim,
    model_file: PathBuf,
    backend: BackendSettings,
    policy: InputPolicy,
    engines: Arc<dyn EngineFactory>,
    /// The load-time probe, kept only when a CPU instance will take it over (a GPU-only
    /// model keeps no CPU copy of itself).
    spare: Mutex<Option<Box<dyn Engine>>>,
    metrics: Option<Arc<dyn MetricsSource>>,
}

impl ModelState {
    /// Loads a model. Returns the state and, when auto-complete filled something in,
    /// the completed config JSON for the server.
    pub fn load(ctx: ModelContext<'_>) -> Result<(ModelState, Option<String>)> {
        let mut raw: Value = serde_json::from_str(&ctx.config_json)
            .map_err(|e| Error::invalid_arg(format!("model config is not JSON: {e}")))?;
        let mut config = ModelConfig::from_value(&raw)?;
        config.check_supported()?;
        let version_dir = ctx.repository.join(ctx.version.to_string());
        let core = CoreSettings::from_config(&config)?;
        let claims = ctx.engines.claims();
        let (claim, model_file) =
            engine::select(claims, &config, core.engine.as_deref(), &version_dir)?;
        settings::warn_unknown_parameters(
            &ctx.name,
            &config.parameters,
            &engine::known_parameters(claims, claim),
        );
        if config.sequence.is_some() && !claim.keeps_sequences {
            return Err(Error::unsupported(format!(
                "sequence_batching is served by the onnx and torch engines; the {} engine keeps no sequences",
                claim.name()
            )));
        }
        // the inputs the sequence batcher adds are the model's like any other (an engine
        // whose signature comes from the config, TorchScript's, sees them too)
        config.add_sequence_inputs()?;
        let probe = ctx.engines.create(
            claim.name(),
            &model_file,
            &EngineOptions {
                config: &config,
                backend: ctx.backend,
                device: Device::Cpu,
                probe: true,
            },
        )?;
        let mut completed = None;
        if ctx.autocomplete {
            if let Some(v) = autocomplete(
                &raw,
                probe.inputs(),
                probe.outputs(),
                ctx.backend.default_max_batch_size,
            )? {
                raw = v;
                config = ModelConfig::from_value(&raw)?;
                config.add_sequence_inputs()?;
                completed = Some(raw.to_string());
                log::info!(
                    "model '{}': config auto-completed from '{}'",
                    ctx.name,
                    model_file.display()
                );
            }
        }
        config.adopt_scalars(probe.inputs(), probe.outputs());
        check_against_model(&config, probe.inputs(), probe.outputs())
            .and_then(|()| check_states(&config, probe.outputs()))
            .map_err(|e| e.context(format!("model file '{}'", model_file.display())))?;
        // (auto-complete may have added inputs valid_range names)
        let core = CoreSettings::from_config(&config)?;
        let policy = InputPolicy {
            reject_nonfinite: core.reject_nonfinite,
            accepts_device_inputs: false,
            valid_range: core.valid_range,
        };
        log::info!(
            "model '{}' version {} loaded from '{}' ({} engine)",
            ctx.name,
            ctx.version,
            model_file.display(),
            claim.name()
        );
        let metrics = probe.metrics_source();
        // Triton completes instance_group before the model is loaded; with none given
        // (a config read outside Triton) a CPU instance may come.
        let cpu_instance = config.instance_kinds.is_empty()
            || config.instance_kinds.iter().any(|k| k == "KIND_CPU");
        // only some probes are whole engines (the embedding and torch probes are not)
        let spare = if cpu_instance && claim.probe_serves {
            Some(probe)
        } else {
            drop(probe);
            None
        };
        let state = ModelState {
            name: ctx.name,
            config,
            claim,
            model_file,
            backend: ctx.backend.clone(),
            policy,
            engines: ctx.engines,
            spare: Mutex::new(spare),
            metrics,
        };
        Ok((state, completed))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// What the model's engine publishes (e.g. the embedding store's counters).
    pub fn metrics_source(&self) -> Option<Arc<dyn MetricsSource>> {
        self.metrics.clone()
    }

    /// Whether the load-time probe is still held for a CPU instance.
    pub fn holds_spare_engine(&self) -> bool {
        self.spare.lock().map(|s| s.is_some()).unwrap_or(false)
    }
}

/// Each implicit state's output must be an output of the model, of the state's type.
fn check_states(config: &ModelConfig, outputs: &[crate::config::TensorSpec]) -> Result<()> {
    for st in config.sequence.iter().flat_map(|s| &s.states) {
        let names: Vec<&str> = outputs.iter().map(|o| o.name.as_str()).collect();
        let out = outputs.iter().find(|o| o.name == st.output).ok_or_else(|| {
            Error::invalid_arg(format!(
                "sequence_batching state '{}' has output_name '{}', which is not an output of the model (its outputs are {names:?})",
                st.input, st.output
            ))
        })?;
        if out.dtype != st.dtype {
            return Err(Error::invalid_arg(format!(
                "sequence_batching state '{}' is {} but the model's output '{}' is {}",
                st.input,
                st.dtype.config_name(),
                st.output,
                out.dtype.config_name()
            )));
        }
    }
    Ok(())
}

pub struct InstanceContext {
    pub name: String,
    pub device: Device,
}

pub struct InstanceState {
    name: String,
    model: String,
    device: Device,
    /// Inputs already reported as arriving in GPU memory (logged once each).
    device_inputs_seen: Mutex<Vec<String>>,
    config: ModelConfig,
    policy: InputPolicy,
    engine: Mutex<Box<dyn Engine>>,
}

impl InstanceState {
    pub fn new(model: &ModelState, ctx: InstanceContext) -> Result<InstanceState> {
        let spare = if ctx.device == Device::Cpu {
            model.spare.lock().ok().and_then(|mut s| s.take())
        } else {
            None
        };
        let engine = match spare {
            Some(e) => e,
            None => model.engines.create(
                model.claim.name(),
                &model.model_file,
                &EngineOptions {
                    config: &model.config,
                    backend: &model.backend,
                    device: ctx.device,
                    probe: false,
                },
            )?,
        };
        Ok(Self::with_engine(model, ctx, engine))
    }

    /// An instance around an engine made elsewhere (tests).
    pub fn with_engine(
        model: &ModelState,
        ctx: InstanceContext,
        engine: Box<dyn Engine>,
    ) -> InstanceState {
        let mut policy = model.policy.clone();
        policy.accepts_device_inputs = engine.accepts_device_inputs();
        log::info!("instance '{}' of model '{}' ready on {:?}", ctx.name, model.name, ctx.device);
        if model.config.cuda_graphs && ctx.device == Device::Cpu {
            log::info!("model '{}': optimization.cuda.graphs applies to KIND_GPU instances; this KIND_CPU one runs without", model.name);
        }
        InstanceState {
            name: ctx.name,
            model: model.name.clone(),
            device: ctx.device,
            device_inputs_seen: Mutex::new(Vec::new()),
            config: model.config.clone(),
            policy,
            engine: Mutex::new(engine),
        }
    }

    /// Logs, once per input, that it arrived in GPU memory and is used in place: the
    /// evidence that an ensemble keeps a tensor on the GPU between its steps.
    fn note_device_inputs(&self, request: &CheckedRequest<'_>) {
        for t in &request.tensors {
            if let Some(Bytes::Device(v)) = t.chunks.first() {
                let Ok(mut seen) = self.device_inputs_seen.lock() else { return };
                if !seen.contains(&t.name) {
                    seen.push(t.name.clone());
                    log::info!("instance '{}': input '{}' arrived in GPU memory (Gpu({})) and is used in place", self.name, t.name, v.device());
                }
            }
        }
    }
}

/// GPUs that hit an unrecoverable CUDA error (a device-side assert, an illegal address):
/// the error is sticky for the whole process's context on that device, so every model
/// there is refused clearly from then on instead of failing in confusing ways.
static GPU_FAULTS: Mutex<Vec<(i32, String)>> = Mutex::new(Vec::new());

/// Records a sticky CUDA fault on `device` seen by `model`'s engine, if `error` is one
/// (engines classify their runtime's failures as [`ErrorKind::DeviceLost`]).
fn note_gpu_fault(device: Device, model: &str, error: &Error) {
    let Device::Gpu(id) = device else { return };
    if error.kind() != ErrorKind::DeviceLost {
        return;
    }
    let msg = error.message();
    let Ok(mut faults) = GPU_FAULTS.lock() else { return };
    if faults.iter().any(|f| f.0 == id) {
        return;
    }
    let first_line = msg.lines().next().unwrap_or(msg);
    let reason =
        format!("model '{model}' hit an unrecoverable CUDA error on GPU {id} ({first_line})");
    log::error!("{reason}; CUDA keeps this error for the whole server process, so every model on GPU {id} is refused until the server restarts");
    faults.push((id, reason));
}

/// The fault recorded on `device`, if any.
pub fn gpu_fault(device: Device) -> Option<String> {
    let Device::Gpu(id) = device else { return None };
    GPU_FAULTS.lock().ok()?.iter().find(|f| f.0 == id).map(|f| f.1.clone())
}

/// Answers every request with the same error (used when the instance itself is unusable).
pub fn fail_all<T: Transport>(transport: &T, requests: Vec<T::Request>, error: &Error) {
    for r in &requests {
        if let Ok(resp) = transport.respond(r) {
            resp.send(&Err(error.clone()));
        }
    }
}

/// One request's way through an execute call; everything is indexed by the request's
/// position in the call.
struct Slot<'r, Q, R> {
    request: &'r Q,
    response: Option<R>,
    outcome: Result<()>,
    /// The checked inputs, while the request is still in the running.
    checked: Option<CheckedRequest<'r>>,
    /// The outputs the client asked for.
    wanted: Vec<String>,
}

/// Runs one execute call: every request is answered, reported and released.
pub fn execute<T: Transport>(inst: &InstanceState, transport: &T, requests: Vec<T::Request>) {
    let exec_start = transport.now_ns();
    let cfg = &inst.config;
    if let Some(fault) = gpu_fault(inst.device) {
        let e = Error::unavailable(format!(
            "{fault}; every model on that GPU is unusable until the server restarts"
        ));
        fail_all(transport, requests, &e);
        return;
    }
    let mut engine = match inst.engine.lock() {
        Ok(e) => e,
        Err(_) => {
            fail_all(
                transport,
                requests,
                &Error::internal("engine lock poisoned by an earlier panic"),
            );
            return;
        }
    };
    let mut slots: Vec<Slot<'_, T::Request, T::Response>> =
        requests.iter().map(|req| inst.prepare(&mut **engine, transport, req)).collect();

    // Requests that passed, grouped by shape and memory (positions in `slots`).
    let passed: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].checked.is_some()).collect();
    let groups: Vec<Vec<usize>> = {
        let refs: Vec<&CheckedRequest<'_>> =
            passed.iter().filter_map(|&i| slots[i].checked.as_ref()).collect();
        group_by_shape(cfg, &refs)
            .into_iter()
            .map(|g| g.into_iter().map(|k| passed[k]).collect())
            .collect()
    };
    let compute_start = transport.now_ns();
    let mut sink_ns = 0u64;
    let mut rows_run = 0u64;
    for members in &groups {
        match run_group(&mut **engine, cfg, transport, members, &mut slots, &mut sink_ns) {
            Ok(rows) => rows_run += rows as u64,
            Err(e) => {
                log::error!(
                    "instance '{}': batch of {} requests failed: {e}",
                    inst.name,
                    members.len()
                );
                note_gpu_fault(inst.device, &inst.model, &e);
                for &i in members {
                    slots[i].outcome = Err(e.clone());
                }
            }
        }
    }
    drop(engine);
    let run_end = transport.now_ns();
    let compute_end = run_end.saturating_sub(sink_ns).max(compute_start);
    let exec_end = transport.now_ns();
    let timing = Timing { exec_start, compute_start, compute_end, exec_end };
    for (slot, req) in slots.into_iter().zip(&requests) {
        if let Some(r) = slot.response {
            r.send(&slot.outcome);
        }
        transport.report(req, slot.outcome.is_ok(), timing);
    }
    if rows_run > 0 {
        transport.report_batch(rows_run, timing);
    }
    drop(requests); // releases every request, after its statistics
}

impl InstanceState {
    /// Makes a request's response and checks it (the server's view, the config, then
    /// the engine); a failure stays this request's own.
    fn prepare<'r, T: Transport>(
        &self,
        engine: &mut dyn Engine,
        transport: &T,
        req: &'r T::Request,
    ) -> Slot<'r, T::Request, T::Response> {
        let response =
            transport.respond(req).map_err(|e| log::error!("cannot create a response: {e}")).ok();
        let prepared = if response.is_none() {
            Err(Error::internal("could not create a response"))
        } else if req.is_cancelled() {
            Err(Error::new(ErrorKind::Cancelled, "request was cancelled"))
        } else {
            let authorized = req
                .parameters()
                .and_then(|p| engine.lookup().map_or(Ok(()), |lookup| lookup.authorize(&p)));
            authorized
                .and_then(|()| req.inputs())
                .and_then(|t| check_request(&self.config, &self.policy, t))
                .and_then(|c| engine.check_request(&c.tensors).map(|()| c))
                .and_then(|c| Ok((c, req.requested_outputs()?)))
        };
        match prepared {
            Ok((c, wanted)) => {
                self.note_device_inputs(&c);
                Slot { request: req, response, outcome: Ok(()), checked: Some(c), wanted }
            }
            Err(e) => {
                if e.kind() != ErrorKind::Cancelled {
                    log::debug!("instance '{}': request '{}' rejected: {e}", self.name, req.id());
                }
                Slot { request: req, response, outcome: Err(e), checked: None, wanted: Vec::new() }
            }
        }
    }
}

/// Runs one same-shape group (`members`: positions in `slots`) and writes each
/// member's outputs into its response. Returns the number of rows run. A member whose
/// own output fails gets its own error.
fn run_group<T: Transport>(
    engine: &mut dyn Engine,
    cfg: &ModelConfig,
    transport: &T,
    members: &[usize],
    slots: &mut [Slot<'_, T::Request, T::Response>],
    sink_ns: &mut u64,
) -> Result<usize> {
    // where a batch's time goes, measured only when it will be logged (`--log-verbose=1`)
    let timing = log::log_enabled!(log::Level::Debug);
    let clock = || if timing { transport.now_ns() } else { 0 };
    let t_start = clock();
    let sink_before = *sink_ns;
    // The batch borrows the requests' buffers, not the slots.
    let mut batch = {
        let group: Vec<&CheckedRequest<'_>> =
            members.iter().filter_map(|&i| slots[i].checked.as_ref()).collect();
        assemble(cfg, &group)?
    };
    // GPU inputs of several requests: gathered into one buffer on their GPU.
    for t in &mut batch.tensors {
        if let BatchData::DeviceParts(parts) = &t.data {
            let device = parts.first().map_or(0, |p| p.device());
            t.data = BatchData::Gathered(transport.device_ops().gather(device, parts)?);
        }
    }
    let mut names: Vec<String> = Vec::new();
    for &m in members {
        for w in &slots[m].wanted {
            if !names.contains(w) {
                names.push(w.clone());
            }
        }
    }
    // the model's state outputs are run whether or not a client asked for them
    let states = cfg.sequence.as_ref().map(|s| s.states.as_slice()).unwrap_or_default();
    for st in states {
        if !names.contains(&st.output) {
            names.push(st.output.clone());
        }
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let ops = transport.device_ops();
    let t_run = clock();
    // a GPU engine's outputs are offered to Triton as GPU memory wherever the engine put
    // them: the memory Triton gives back tells where the responses want them
    let prefer = engine.device();
    let (mut to_host, mut to_device) = (false, false);
    engine.run(&batch.tensors, &names, &mut |view| {
        let t0 = transport.now_ns();
        let parts = scatter_ranges(cfg, &batch, view.name, view.dtype, view.shape, view.data)?;
        let is_state = states.iter().any(|st| st.output == view.name);
        for (k, &m) in members.iter().enumerate() {
            let slot = &mut slots[m];
            if slot.outcome.is_err() {
                continue;
            }
            let (shape, range) = &parts[k];
            if is_state {
                // the sequence's next state: kept by the server for its next request
                let mut copy = |dst: BytesMut<'_>| copy_part(ops, &view, range.clone(), dst);
                if let Err(e) = slot.request.update_state(
                    view.name,
                    view.dtype,
                    shape,
                    range.len(),
                    prefer,
                    &mut copy,
                ) {
                    slot.outcome = Err(e.context(format!("state '{}'", view.name)));
                    continue;
                }
            }
            if !slot.wanted.iter().any(|w| w == view.name) {
                continue;
            }
            if let Some(resp) = slot.response.as_mut() {
                match write_output(ops, resp, &view, shape, range.clone(), prefer) {
                    Ok(Device::Cpu) => to_host = true,
                    Ok(Device::Gpu(_)) => to_device = true,
                    Err(e) => slot.outcome = Err(e),
                }
            }
        }
        *sink_ns += transport.now_ns().saturating_sub(t0);
        Ok(())
    })?;
    if to_host || to_device {
        engine.outputs_landed(to_host && !to_device);
    }
    if timing {
        let (end, outputs) = (transport.now_ns(), *sink_ns - sink_before);
        log::debug!(
            "timing: requests {}, rows {}, assemble {} us, engine {} us, outputs into responses {} us",
            members.len(),
            batch.total_rows,
            t_run.saturating_sub(t_start) / 1000,
            end.saturating_sub(t_run).saturating_sub(outputs) / 1000,
            outputs / 1000
        );
    }
    Ok(batch.total_rows)
}

/// Copies one request's part of an output into its response, from host or GPU memory,
/// into the memory the server offers for `prefer` (a GPU engine's: ensembles keep tensors
/// on the GPU between steps). Returns where the response's buffer is.
fn write_output<R: InferResponse>(
    ops: &dyn DeviceOps,
    resp: &mut R,
    out: &OutputView<'_>,
    shape: &[i64],
    range: std::ops::Range<usize>,
    prefer: Device,
) -> Result<Device> {
    let dst = resp.output_buffer(out.name, out.dtype, shape, range.len(), prefer)?;
    let landed = dst.device();
    copy_part(ops, out, range, dst)?;
    Ok(landed)
}

/// Copies bytes `range` of an engine's output into `dst`, host or GPU either side.
fn copy_part(
    ops: &dyn DeviceOps,
    out: &OutputView<'_>,
    range: std::ops::Range<usize>,
    dst: BytesMut<'_>,
) -> Result<()> {
    let src = out.data.slice(range.clone()).ok_or_else(|| {
        Error::internal(format!(
            "output '{}': rows {range:?} are outside the engine's {} bytes",
            out.name,
            out.data.len()
        ))
    })?;
    ops.copy(src, dst).map_err(|e| Error::from(e).context(format!("output '{}'", out.name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_settings_from_triton_json() {
        let s = BackendSettings::from_json(
            r#"{"cmdline":{"onnxruntime-library":"/x/libonnxruntime.so","default-max-batch-size":"8","auto-complete-config":"true"}}"#,
        )
        .unwrap();
        assert_eq!(s.cmdline["onnxruntime-library"], "/x/libonnxruntime.so");
        assert_eq!(s.default_max_batch_size, 8);
        assert_eq!(
            BackendSettings::from_json("").unwrap().default_max_batch_size,
            crate::config::DEFAULT_MAX_BATCH_SIZE
        );
        assert!(
            BackendSettings::from_json(r#"{"cmdline":{"default-max-batch-size":"x"}}"#).is_err()
        );
    }

    // ---- the execute path in-process: a fake server and a fake device ----

    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::batch::BatchTensor;
    use crate::config::TensorSpec;
    use crate::engine::Signature;
    use crate::fake_device::FakeDevice;
    use crate::tensor::{DeviceView, DeviceViewMut};

    type Sent = (String, Result<()>, Vec<(String, Vec<i64>, Vec<u8>, Device)>);

    /// (name, shape, values, the GPU it is on)
    type FakeInput = (String, Vec<i64>, Vec<u8>, Option<i32>);

    struct FakeRequest {
        id: String,
        inputs: Vec<FakeInput>,
        outputs: Vec<String>,
        /// States handed back for the sequence's next request: (name, shape, bytes).
        states: RefCell<Vec<(String, Vec<i64>, Vec<u8>)>>,
    }

    impl InferRequest for FakeRequest {
        fn id(&self) -> String {
            self.id.clone()
        }
        fn is_cancelled(&self) -> bool {
            false
        }
        fn inputs(&self) -> Result<Vec<RequestTensor<'_>>> {
            Ok(self
                .inputs
                .iter()
                .map(|(name, shape, bytes, gpu)| RequestTensor {
                    name: name.clone(),
                    dtype: DataType::F32,
                    shape: shape.clone(),
                    chunks: vec![match gpu {
                        Some(id) => Bytes::Device(DeviceView::simulated(*id, bytes)),
                        None => Bytes::Host(bytes),
                    }],
                })
                .collect())
        }
        fn requested_outputs(&self) -> Result<Vec<String>> {
            Ok(self.outputs.clone())
        }
        fn update_state(
            &self,
            name: &str,
            _dtype: DataType,
            shape: &[i64],
            byte_size: usize,
            _prefer: Device,
            fill: &mut dyn FnMut(BytesMut<'_>) -> Result<()>,
        ) -> Result<Device> {
            let mut buf = vec![0u8; byte_size];
            fill(BytesMut::Host(&mut buf))?;
            self.states.borrow_mut().push((name.to_string(), shape.to_vec(), buf));
            Ok(Device::Cpu)
        }
    }

    struct FakeResponse {
        id: String,
        outputs: Vec<(String, Vec<i64>, Vec<u8>, Device)>,
        sent: Rc<RefCell<Vec<Sent>>>,
        /// Like Triton for a gRPC/HTTP client: host memory whatever is asked.
        host_only: bool,
    }

    impl InferResponse for FakeResponse {
        fn output_buffer(
            &mut self,
            name: &str,
            _dtype: DataType,
            shape: &[i64],
            byte_size: usize,
            prefer: Device,
        ) -> Result<BytesMut<'_>> {
            // like Triton for an ensemble step: the memory asked for (host_only: a client's)
            let prefer = if self.host_only { Device::Cpu } else { prefer };
            self.outputs.push((name.to_string(), shape.to_vec(), vec![0u8; byte_size], prefer));
            let last = self.outputs.last_mut().expect("pushed");
            Ok(match prefer {
                Device::Gpu(id) => BytesMut::Device(DeviceViewMut::simulated(id, &mut last.2)),
                Device::Cpu => BytesMut::Host(&mut last.2),
            })
        }
        fn send(self, outcome: &Result<()>) {
            self.sent.borrow_mut().push((self.id, outcome.clone(), self.outputs));
        }
    }

    #[derive(Default)]
    struct FakeServer {
        sent: Rc<RefCell<Vec<Sent>>>,
        reports: RefCell<Vec<(String, bool)>>,
        batches: RefCell<Vec<u64>>,
        clock: Cell<u64>,
        device: FakeDevice,
        host_only: bool,
    }

    impl Transport for FakeServer {
        type Request = FakeRequest;
        type Response = FakeResponse;
        fn respond(&self, request: &FakeRequest) -> Result<FakeResponse> {
            Ok(FakeResponse {
                id: request.id.clone(),
                outputs: Vec::new(),
                sent: self.sent.clone(),
                host_only: self.host_only,
            })
        }
        fn report(&self, request: &FakeRequest, success: bool, _timing: Timing) {
            self.reports.borrow_mut().push((request.id.clone(), success));
        }
        fn report_batch(&self, rows: u64, _timing: Timing) {
            self.batches.borrow_mut().push(rows);
        }
        fn now_ns(&self) -> u64 {
            self.clock.set(self.clock.get() + 1);
            self.clock.get()
        }
        fn device_ops(&self) -> &dyn DeviceOps {
            &self.device
        }
    }

    /// Y = 2 X on [batch, 2] floats; refuses a request holding 13 (a check only the
    /// engine can make); reads GPU inputs (simulated) and answers on the same side.
    struct Doubler {
        sig: Signature,
        runs: Arc<Mutex<Vec<(usize, Device)>>>,
        landed: Arc<Mutex<Vec<bool>>>,
    }

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }
    fn to_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    impl Engine for Doubler {
        fn signature(&self) -> &Signature {
            &self.sig
        }
        fn accepts_device_inputs(&self) -> bool {
            true
        }
        fn outputs_landed(&mut self, on_host: bool) {
            self.landed.lock().unwrap().push(on_host);
        }
        fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
            let bytes = match inputs[0].chunks[0] {
                Bytes::Host(b) => b,
                Bytes::Device(v) => v.simulated_bytes().unwrap(),
            };
            if floats(bytes).contains(&13.0) {
                return Err(Error::invalid_arg("input 'X' holds 13, which this model refuses"));
            }
            Ok(())
        }
        fn run(
            &mut self,
            inputs: &[BatchTensor<'_>],
            _outputs: &[&str],
            sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
        ) -> Result<()> {
            let data = inputs[0].bytes().expect("assembled");
            let (src, device) = match data {
                Bytes::Host(b) => (b, Device::Cpu),
                Bytes::Device(v) => (v.simulated_bytes().unwrap(), Device::Gpu(v.device())),
            };
            self.runs.lock().unwrap().push((inputs[0].shape[0] as usize, device));
            let y = to_bytes(&floats(src).iter().map(|x| x * 2.0).collect::<Vec<_>>());
            let data = match device {
                Device::Gpu(id) => Bytes::Device(DeviceView::simulated(id, &y)),
                Device::Cpu => Bytes::Host(&y),
            };
            sink(OutputView { name: "Y", dtype: DataType::F32, shape: &inputs[0].shape, data })
        }
    }

    struct Factory {
        runs: Arc<Mutex<Vec<(usize, Device)>>>,
        landed: Arc<Mutex<Vec<bool>>>,
        created: AtomicUsize,
    }

    impl EngineFactory for Factory {
        fn claims(&self) -> &'static [EngineClaim] {
            &[EngineClaim {
                names: &["doubler"],
                default_file: Some("model.onnx"),
                file_suffixes: &[".onnx"],
                parameters: &[],
                builds_on: &[],
                keeps_sequences: true,
                probe_serves: true,
            }]
        }
        fn create(
            &self,
            _engine: &str,
            _file: &std::path::Path,
            options: &EngineOptions<'_>,
        ) -> Result<Box<dyn Engine>> {
            self.created.fetch_add(1, Ordering::Relaxed);
            let spec = |name: &str| TensorSpec {
                name: name.into(),
                dtype: DataType::F32,
                shape: vec![-1, 2],
            };
            Ok(Box::new(Doubler {
                sig: Signature {
                    inputs: vec![spec("X")],
                    outputs: vec![spec("Y")],
                    device: options.device,
                },
                runs: self.runs.clone(),
                landed: self.landed.clone(),
            }))
        }
    }

    fn model(instance_kind: &str) -> (ModelState, Arc<Factory>) {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "trt-serve-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::write(dir.join("1/model.onnx"), b"stands in for a model file").unwrap();
        let config = format!(
            r#"{{"name": "doubler", "max_batch_size": 8,
                "input": [{{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}}],
                "output": [{{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}}],
                "instance_group": [{{"kind": "{instance_kind}", "count": 1}}]}}"#
        );
        let factory = Arc::new(Factory {
            runs: Arc::default(),
            landed: Arc::default(),
            created: AtomicUsize::new(0),
        });
        let settings = BackendSettings::default();
        let ctx = ModelContext {
            name: "doubler".into(),
            version: 1,
            repository: dir.clone(),
            config_json: config,
            autocomplete: false,
            backend: &settings,
            engines: factory.clone(),
        };
        let (state, _) = ModelState::load(ctx).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        (state, factory)
    }

    fn request(id: &str, shape: &[i64], values: &[f32], gpu: Option<i32>) -> FakeRequest {
        FakeRequest {
            id: id.into(),
            inputs: vec![("X".into(), shape.to_vec(), to_bytes(values), gpu)],
            outputs: vec!["Y".into()],
            states: RefCell::default(),
        }
    }

    #[test]
    fn a_mixed_batch_answers_each_request_and_runs_the_good_ones_once() {
        let (m, factory) = model("KIND_CPU");
        let inst = InstanceState::new(
            &m,
            InstanceContext { name: "doubler_0".into(), device: Device::Cpu },
        )
        .unwrap();
        let server = FakeServer::default();
        let requests = vec![
            request("good-1", &[1, 2], &[1.0, 2.0], None),
            request("bad-shape", &[1, 3], &[1.0, 2.0, 3.0], None),
            request("good-2", &[2, 2], &[3.0, 4.0, 5.0, 6.0], None),
            request("engine-refuses", &[1, 2], &[13.0, 0.0], None),
        ];
        execute(&inst, &server, requests);

        let sent = server.sent.borrow();
        assert_eq!(sent.len(), 4, "every request is answered");
        let by_id = |id: &str| sent.iter().find(|s| s.0 == id).unwrap();
        let out = |id: &str| floats(&by_id(id).2[0].2);
        assert_eq!(out("good-1"), vec![2.0, 4.0]);
        assert_eq!(out("good-2"), vec![6.0, 8.0, 10.0, 12.0]);
        assert_eq!(by_id("good-2").2[0].1, vec![2, 2], "each response gets its own rows' shape");
        let err = by_id("bad-shape").1.clone().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArg);
        assert!(err.message().contains("input 'X'") && err.message().contains("shape"), "{err}");
        assert!(by_id("bad-shape").2.is_empty(), "a refused request gets no outputs");
        assert!(by_id("engine-refuses").1.as_ref().unwrap_err().message().contains("13"));
        // the two good requests ran together, once, as 3 rows; the probe engine was reused
        assert_eq!(*factory.runs.lock().unwrap(), vec![(3, Device::Cpu)]);
        assert_eq!(
            factory.created.load(Ordering::Relaxed),
            1,
            "the first CPU instance takes the load-time probe"
        );
        let reports = server.reports.borrow();
        assert_eq!(reports.len(), 4, "statistics for every request");
        assert_eq!(reports.iter().filter(|r| r.1).count(), 2);
        assert_eq!(*server.batches.borrow(), vec![3]);
    }

    #[test]
    fn each_sequence_gets_its_own_rows_of_the_state_output_back() {
        // Y is the model's output and, through sequence_batching, also the state fed to X
        // of the next request: X is a state input the server adds, and clients ask for nothing
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "trt-seq-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::write(dir.join("1/model.onnx"), b"stands in for a model file").unwrap();
        let config = r#"{"name": "doubler", "max_batch_size": 8,
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
            "sequence_batching": {"oldest": {}, "state": [{"input_name": "X", "output_name": "Y", "data_type": "TYPE_FP32", "dims": [2]}]},
            "instance_group": [{"kind": "KIND_CPU", "count": 1}]}"#;
        let factory = Arc::new(Factory {
            runs: Arc::default(),
            landed: Arc::default(),
            created: AtomicUsize::new(0),
        });
        let settings = BackendSettings::default();
        let ctx = ModelContext {
            name: "doubler".into(),
            version: 1,
            repository: dir.clone(),
            config_json: config.into(),
            autocomplete: false,
            backend: &settings,
            engines: factory.clone(),
        };
        let (m, _) = ModelState::load(ctx).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            m.config().inputs.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["X"],
            "the state input is the model's input"
        );
        let inst =
            InstanceState::new(&m, InstanceContext { name: "seq".into(), device: Device::Cpu })
                .unwrap();
        let server = FakeServer::default();
        let mut requests = vec![
            request("a", &[1, 2], &[1.0, 2.0], None),
            request("refused", &[1, 2], &[13.0, 0.0], None),
            request("b", &[1, 2], &[5.0, 6.0], None),
        ];
        for r in &mut requests {
            r.outputs.clear();
        }
        let states: Vec<_> = requests.iter().map(|r| r.id.clone()).collect();
        let kept = Rc::new(RefCell::new(Vec::new()));
        struct Spy(FakeServer, Rc<RefCell<Vec<(String, Vec<(String, Vec<i64>, Vec<u8>)>)>>>);
        impl Transport for Spy {
            type Request = FakeRequest;
            type Response = FakeResponse;
            fn respond(&self, r: &FakeRequest) -> Result<FakeResponse> {
                self.0.respond(r)
            }
            fn report(&self, r: &FakeRequest, ok: bool, t: Timing) {
                self.1.borrow_mut().push((r.id.clone(), r.states.borrow().clone()));
                self.0.report(r, ok, t)
            }
            fn report_batch(&self, rows: u64, t: Timing) {
                self.0.report_batch(rows, t)
            }
            fn now_ns(&self) -> u64 {
                self.0.now_ns()
            }
            fn device_ops(&self) -> &dyn DeviceOps {
                self.0.device_ops()
            }
        }
        let spy = Spy(server, kept.clone());
        execute(&inst, &spy, requests);
        let kept = kept.borrow();
        assert_eq!(kept.iter().map(|k| k.0.clone()).collect::<Vec<_>>(), states);
        assert_eq!(kept[0].1, vec![("Y".to_string(), vec![1, 2], to_bytes(&[2.0, 4.0]))]);
        assert!(kept[1].1.is_empty(), "a refused request leaves its sequence's state as it was");
        assert_eq!(kept[2].1, vec![("Y".to_string(), vec![1, 2], to_bytes(&[10.0, 12.0]))]);
        let sent = spy.0.sent.borrow();
        assert!(sent.iter().all(|s| s.2.is_empty()), "no client asked for Y: no response output");
        assert_eq!(
            *factory.runs.lock().unwrap(),
            vec![(2, Device::Cpu)],
            "the two sequences ran as one batch"
        );
    }

    #[test]
    fn gpu_resident_inputs_are_gathered_on_their_device_and_answered_there() {
        let (m, factory) = model("KIND_GPU");
        assert!(!m.holds_spare_engine(), "a GPU-only model keeps no CPU probe");
        let inst = InstanceState::new(
            &m,
            InstanceContext { name: "doubler_gpu".into(), device: Device::Gpu(0) },
        )
        .unwrap();
        assert_eq!(
            factory.created.load(Ordering::Relaxed),
            2,
            "probe dropped at load, the GPU instance made its own"
        );
        let server = FakeServer::default();
        let requests = vec![
            request("gpu-1", &[1, 2], &[1.0, 2.0], Some(0)),
            request("host", &[1, 2], &[7.0, 8.0], None),
            request("gpu-2", &[2, 2], &[3.0, 4.0, 5.0, 6.0], Some(0)),
        ];
        execute(&inst, &server, requests);

        // the two GPU requests form one batch gathered on GPU 0; the host one runs apart
        assert_eq!(server.device.gathers.load(Ordering::Relaxed), 1);
        let mut runs = factory.runs.lock().unwrap().clone();
        runs.sort_by_key(|r| r.0);
        assert_eq!(runs, vec![(1, Device::Cpu), (3, Device::Gpu(0))]);
        let sent = server.sent.borrow();
        let by_id = |id: &str| sent.iter().find(|s| s.0 == id).unwrap();
        // every output is offered as the GPU instance's memory, and an ensemble's Triton gives that
        for (id, want) in [
            ("gpu-1", vec![2.0, 4.0]),
            ("gpu-2", vec![6.0, 8.0, 10.0, 12.0]),
            ("host", vec![14.0, 16.0]),
        ] {
            let s = by_id(id);
            assert!(s.1.is_ok(), "{id}: {:?}", s.1);
            assert_eq!(floats(&s.2[0].2), want, "{id}");
            assert_eq!(s.2[0].3, Device::Gpu(0), "{id}: answered in GPU memory");
        }
        assert_eq!(
            *factory.landed.lock().unwrap(),
            vec![false, false],
            "each run told its outputs went to the GPU"
        );
    }

    #[test]
    fn a_gpu_engine_learns_whether_responses_want_its_outputs_on_the_host() {
        let (m, factory) = model("KIND_GPU");
        let inst = InstanceState::new(
            &m,
            InstanceContext { name: "doubler_gpu".into(), device: Device::Gpu(0) },
        )
        .unwrap();
        // a client's responses (gRPC, HTTP, system shared memory): host memory
        let client = FakeServer { host_only: true, ..FakeServer::default() };
        execute(&inst, &client, vec![request("c", &[1, 2], &[1.0, 2.0], Some(0))]);
        assert_eq!(client.sent.borrow()[0].2[0].3, Device::Cpu);
        assert_eq!(floats(&client.sent.borrow()[0].2[0].2), vec![2.0, 4.0]);
        // an ensemble step's: the GPU memory offered for it
        let ensemble = FakeServer::default();
        execute(&inst, &ensemble, vec![request("e", &[1, 2], &[3.0, 4.0], Some(0))]);
        assert_eq!(ensemble.sent.borrow()[0].2[0].3, Device::Gpu(0));
        // a refused request writes no output: nothing to learn from
        execute(&inst, &client, vec![request("bad", &[1, 2], &[13.0, 0.0], Some(0))]);
        assert_eq!(*factory.landed.lock().unwrap(), vec![true, false]);
    }

    #[test]
    fn a_sticky_cuda_error_refuses_that_gpu_clearly_and_spares_the_others() {
        let e = Error::device_lost("TorchScript forward failed: CUDA error: device-side assert triggered\nCompile with TORCH_USE_CUDA_DSA");
        note_gpu_fault(Device::Gpu(7), "bert", &Error::internal("out of memory"));
        assert_eq!(gpu_fault(Device::Gpu(7)), None, "an ordinary failure is not sticky");
        note_gpu_fault(Device::Gpu(7), "bert", &Error::internal(e.message()));
        assert_eq!(gpu_fault(Device::Gpu(7)), None, "the kind decides, not the words");
        note_gpu_fault(Device::Cpu, "bert", &e);
        note_gpu_fault(Device::Gpu(7), "bert", &e);
        let f = gpu_fault(Device::Gpu(7)).unwrap();
        assert!(
            f.contains("'bert'") && f.contains("GPU 7") && f.contains("device-side assert"),
            "{f}"
        );
        assert_eq!(gpu_fault(Device::Gpu(6)), None);
        assert_eq!(gpu_fault(Device::Cpu), None);
        let (m, _) = model("KIND_GPU");
        let inst =
            InstanceState::new(&m, InstanceContext { name: "on7".into(), device: Device::Gpu(7) })
                .unwrap();
        let server = FakeServer::default();
        execute(&inst, &server, vec![request("r", &[1, 2], &[1.0, 2.0], None)]);
        let sent = server.sent.borrow();
        let err = sent[0].1.clone().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert!(err.message().contains("until the server restarts"), "{err}");
    }

    #[test]
    fn a_cpu_model_hands_its_probe_to_the_first_instance_only() {
        let (m, factory) = model("KIND_CPU");
        assert!(m.holds_spare_engine());
        let _a = InstanceState::new(&m, InstanceContext { name: "a".into(), device: Device::Cpu })
            .unwrap();
        assert!(!m.holds_spare_engine());
        let _b = InstanceState::new(&m, InstanceContext { name: "b".into(), device: Device::Cpu })
            .unwrap();
        assert_eq!(factory.created.load(Ordering::Relaxed), 2);
    }
}
