//! Serving: where the server's view (models, instances, requests) meets the engines.
//!
//! `ModelState` reads the config, picks the engine kind, has it describe the model where the
//! config lacks tensors, auto-completes the config from that, loads the model once on the
//! final config and checks the config against the loaded model; `InstanceState` owns
//! the one engine the loaded model made for it;
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
use crate::config::{check_against_model, ModelConfig};
use crate::engine::{
    self, Device, Engine, EngineKinds, LoadedModel, ModelLoad, Opened, OutputView,
};
use crate::error::{Error, ErrorKind, Result};
use crate::settings::{self, CoreSettings};
use crate::telemetry::MetricsSource;
use crate::tensor::{Bytes, BytesMut, DataType, DeviceOps};
use counts::{DeviceCounts, ModelMetrics, RunCounts};

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
    /// Stages the next value of the sequence's implicit state `name` (the state's
    /// `output_name`): the server gives a buffer of `byte_size` bytes, on `prefer` when it
    /// can, and `fill` writes it. The value becomes the state input of the sequence's next
    /// request only at `commit_states`, which `execute` calls once every output of the
    /// request was delivered: a request that fails after its state was staged leaves the
    /// sequence's state as it was. Returns where the buffer was.
    fn stage_state(
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
    /// Hands every state staged on this request to its sequence.
    fn commit_states(&self) -> Result<()> {
        Ok(())
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
    /// Answers, reports and releases an execution's requests ([`finish`]); `rows`: the rows
    /// run (batch statistics where > 0). Here by default; a server may hand it to a thread
    /// of the instance's own, so that the instance takes its next batch sooner (every
    /// output is in its response's buffer by now).
    fn complete(&self, done: Vec<Done<Self::Request, Self::Response>>, rows: u64, timing: Timing)
    where
        Self: Sized,
    {
        finish(self, done, rows, timing);
    }
}

/// One request at the end of an execution: its response (none where none could be made)
/// and its outcome.
pub struct Done<Q, R> {
    pub request: Q,
    pub response: Option<R>,
    pub outcome: Result<()>,
}

/// Reports each request's statistics and the batch's, then sends each response with its
/// outcome, in order (a client that has its answer finds it counted); the requests are
/// released last (dropped).
pub fn finish<T: Transport>(
    transport: &T,
    mut done: Vec<Done<T::Request, T::Response>>,
    rows: u64,
    timing: Timing,
) {
    for d in &done {
        transport.report(&d.request, d.outcome.is_ok(), timing);
    }
    if rows > 0 {
        transport.report_batch(rows, timing);
    }
    for d in &mut done {
        if let Some(r) = d.response.take() {
            r.send(&d.outcome);
        }
    }
    drop(done); // releases every request, after its statistics
}

pub use crate::settings::BackendSettings;

pub struct ModelContext<'a> {
    pub name: String,
    pub version: u64,
    pub repository: PathBuf,
    pub config_json: String,
    pub autocomplete: bool,
    pub backend: &'a BackendSettings,
    pub kinds: Arc<EngineKinds>,
}

pub struct ModelState {
    name: String,
    config: ModelConfig,
    policy: InputPolicy,
    loaded: Arc<dyn LoadedModel>,
    /// What the model's instances ran, per device (a model's instances on several GPUs).
    devices: Arc<DeviceCounts>,
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
        let claims = ctx.kinds.claims();
        let engine_named = CoreSettings::engine_named(&config);
        let (claim, model_file) =
            engine::select(claims, &config, engine_named.as_deref(), &version_dir)?;
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
        // Triton's order: what the model says of itself, the config completed from it, then
        // the one load on the final config (a config that lists its tensors is final as written)
        let kind = ctx.kinds.kind(claim)?;
        let opened = Opened::default();
        let (backend, shared) = (ctx.backend, ctx.kinds.shared());
        let mut completed = None;
        if ctx.autocomplete && (config.inputs.is_empty() || config.outputs.is_empty()) {
            let given = ModelLoad {
                config: &config,
                backend,
                model_file: &model_file,
                shared,
                opened: &opened,
            };
            if let Some(v) = load::completed(kind, &given, &raw)? {
                (raw, config) = v;
                completed = Some(raw.to_string());
                log::info!(
                    "model '{}': config auto-completed from '{}'",
                    ctx.name,
                    model_file.display()
                );
            }
        }
        let load = ModelLoad {
            config: &config,
            backend,
            model_file: &model_file,
            shared,
            opened: &opened,
        };
        let loaded: Arc<dyn LoadedModel> = kind.load(&load)?.into();
        config.adopt_scalars(loaded.inputs(), loaded.outputs());
        check_against_model(&config, loaded.inputs(), loaded.outputs())
            .and_then(|()| load::check_states(&config, loaded.outputs()))
            .map_err(|e| e.context(format!("model file '{}'", model_file.display())))?;
        // read once the config is complete (auto-complete may add inputs valid_range names)
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
        let devices = Arc::default();
        Ok((ModelState { name: ctx.name, config, policy, loaded, devices }, completed))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// What the model publishes: the engine's (e.g. the embedding store's counters) and,
    /// for a model with KIND_GPU instances, what its instances ran on each device
    /// (`rust_device_inferences_total`, `rust_device_executions_total`).
    pub fn metrics_source(&self) -> Option<Arc<dyn MetricsSource>> {
        let engine = self.loaded.metrics_source();
        if !self.config.instance_kinds.iter().any(|k| k == "KIND_GPU") {
            return engine;
        }
        Some(Arc::new(ModelMetrics { engine, devices: self.devices.clone() }))
    }
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
    loaded: Arc<dyn LoadedModel>,
    engine: Mutex<Box<dyn Engine>>,
    /// This device's counts among the model's.
    counts: Arc<RunCounts>,
}

impl InstanceState {
    pub fn new(model: &ModelState, ctx: InstanceContext) -> Result<InstanceState> {
        let engine = model.loaded.instance(ctx.device)?;
        let mut policy = model.policy.clone();
        policy.accepts_device_inputs = model.loaded.accepts_device_inputs(ctx.device);
        log::info!("instance '{}' of model '{}' ready on {:?}", ctx.name, model.name, ctx.device);
        if model.config.cuda_graphs && ctx.device == Device::Cpu {
            log::info!("model '{}': optimization.cuda.graphs applies to KIND_GPU instances; this KIND_CPU one runs without", model.name);
        }
        Ok(InstanceState {
            name: ctx.name,
            model: model.name.clone(),
            device: ctx.device,
            device_inputs_seen: Mutex::new(Vec::new()),
            config: model.config.clone(),
            policy,
            loaded: model.loaded.clone(),
            engine: Mutex::new(engine),
            counts: model.devices.of(ctx.device),
        })
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

/// Records a sticky CUDA fault on `device` seen by `model`'s engine, if `error` is one
/// (engines classify their runtime's failures as [`ErrorKind::DeviceLost`]); the fault is the
/// process's, kept by the CUDA crate (`triton_rust_cuda::fault`).
fn note_gpu_fault(device: Device, model: &str, error: &Error) {
    let Device::Gpu(id) = device else { return };
    if error.kind() != ErrorKind::DeviceLost || triton_rust_cuda::fault::has_fault(id) {
        return;
    }
    let msg = error.message();
    let first_line = msg.lines().next().unwrap_or(msg);
    let reason =
        format!("model '{model}' hit an unrecoverable CUDA error on GPU {id} ({first_line})");
    if triton_rust_cuda::fault::note_fault(id, reason.clone()) {
        log::error!("{reason}; CUDA keeps this error for the whole server process, so every model on GPU {id} is refused until the server restarts");
    }
}

/// The fault recorded on `device`, if any.
pub fn gpu_fault(device: Device) -> Option<String> {
    let Device::Gpu(id) = device else { return None };
    triton_rust_cuda::fault::fault_of(id)
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
        requests.iter().map(|req| inst.prepare(transport, req)).collect();

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
    let mut run = |members: &[usize], slots: &mut [Slot<'_, T::Request, T::Response>]| {
        run_group(&mut **engine, inst.device, cfg, transport, members, slots, &mut sink_ns)
    };
    for members in &groups {
        match run(members, &mut slots) {
            Ok(rows) => rows_run += rows as u64,
            // a client's input that only the run could see was wrong (keys in GPU memory, say):
            // each request again alone, so that only the bad one fails
            Err(e)
                if e.kind() == ErrorKind::InvalidArg
                    && members.len() > 1
                    && cfg.sequence.is_none() =>
            {
                log::debug!(
                    "instance '{}': a batch of {} requests failed on its input ({e}); each runs alone",
                    inst.name,
                    members.len()
                );
                for &m in members {
                    match run(&[m], &mut slots) {
                        Ok(rows) => rows_run += rows as u64,
                        Err(e) => {
                            note_gpu_fault(inst.device, &inst.model, &e);
                            slots[m].outcome = Err(e);
                        }
                    }
                }
            }
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
    // a sequence moves on only with a request that succeeded whole
    for slot in slots.iter_mut().filter(|s| s.outcome.is_ok() && s.checked.is_some()) {
        if let Err(e) = slot.request.commit_states() {
            slot.outcome = Err(e.context("sequence state"));
        }
    }
    let run_end = transport.now_ns();
    let compute_end = run_end.saturating_sub(sink_ns).max(compute_start);
    let exec_end = transport.now_ns();
    let timing = Timing { exec_start, compute_start, compute_end, exec_end };
    if rows_run > 0 {
        use std::sync::atomic::Ordering::Relaxed;
        inst.counts.executions.fetch_add(1, Relaxed);
        inst.counts.rows.fetch_add(rows_run, Relaxed);
    }
    let n = requests.len();
    let ends: Vec<(Option<T::Response>, Result<()>)> =
        slots.into_iter().map(|s| (s.response, s.outcome)).collect();
    let done = requests
        .into_iter()
        .zip(ends)
        .map(|(request, (response, outcome))| Done { request, response, outcome })
        .collect();
    transport.complete(done, rows_run, timing);
    if log::log_enabled!(log::Level::Debug) {
        let done = transport.now_ns();
        log::debug!(
            "timing: execute: requests {n}, checked {} us, run {} us, completed {} us",
            compute_start.saturating_sub(exec_start) / 1000,
            exec_end.saturating_sub(compute_start) / 1000,
            done.saturating_sub(exec_end) / 1000
        );
    }
}

impl InstanceState {
    /// Makes a request's response and checks it (the server's view, the config, then
    /// the engine); a failure stays this request's own.
    fn prepare<'r, T: Transport>(
        &self,
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
            req.parameters()
                .and_then(|p| self.loaded.authorize(&p))
                .and_then(|()| req.inputs())
                .and_then(|t| check_request(&self.config, &self.policy, t))
                .and_then(|c| self.loaded.check_request(&c.tensors).map(|()| c))
                .map(|mut c| {
                    if let Some(rows) = self.loaded.request_rows(&c.tensors) {
                        c.batch = rows;
                    }
                    c
                })
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

mod counts;
mod group;
mod load;

use group::run_group;

#[cfg(test)]
mod execute_tests;
#[cfg(test)]
mod fakes;

#[cfg(test)]
mod tests {
    use super::fakes::*;
    use super::*;

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
}
