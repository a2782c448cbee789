//! Serving: where Triton's view (models, instances, requests) meets the engines.
//!
//! `ModelState` reads the config, picks and loads the engine, auto-completes and
//! checks the config; `InstanceState` owns one engine; [`execute`] is the batch path:
//! check each request, group, assemble, run once per group, scatter outputs into the
//! responses, report statistics. A request's own problem fails that request only.
//! Safe code only: Triton is reached through `crate::triton`'s types.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::batch::{assemble, check_request, group_by_shape, scatter_ranges, BatchData, CheckedRequest, InputPolicy};
use crate::config::{autocomplete, check_against_model, ModelConfig, DEFAULT_MAX_BATCH_SIZE};
pub use crate::engine::Device;
use crate::engine::{self, Engine, EngineKind, EngineOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::telemetry::MetricsSource;
use crate::triton::metrics::MetricSet;
use crate::triton::request::Timing;
use crate::triton::request::OutputTarget;
use crate::triton::{now_ns, Instance, Request, Response};
use crate::cuda;
use crate::engine::{OutputData, OutputView};
use crate::tensor::Memory;

/// Backend-wide settings from `--backend-config=rust,<key>=<value>`.
#[derive(Debug, Clone, Default)]
pub struct BackendSettings {
    pub cmdline: BTreeMap<String, String>,
    pub default_max_batch_size: i64,
}

impl BackendSettings {
    pub fn from_json(json: &str) -> Result<Self> {
        let v: Value = if json.trim().is_empty() { Value::Null } else {
            serde_json::from_str(json).map_err(|e| Error::invalid_arg(format!("backend config is not JSON: {e}")))?
        };
        let mut cmdline = BTreeMap::new();
        if let Some(Value::Object(m)) = v.get("cmdline") {
            for (k, v) in m {
                cmdline.insert(k.clone(), v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()));
            }
        }
        let default_max_batch_size = match cmdline.get("default-max-batch-size") {
            Some(s) => s.parse().map_err(|_| Error::invalid_arg(format!("default-max-batch-size '{s}' is not an integer")))?,
            None => DEFAULT_MAX_BATCH_SIZE,
        };
        Ok(BackendSettings { cmdline, default_max_batch_size })
    }
}

pub struct ModelContext<'a> {
    pub name: String,
    pub version: u64,
    pub repository: PathBuf,
    pub config_json: String,
    pub autocomplete: bool,
    pub backend: &'a BackendSettings,
}

pub struct ModelState {
    name: String,
    config: ModelConfig,
    kind: EngineKind,
    model_file: PathBuf,
    backend: BTreeMap<String, String>,
    policy: InputPolicy,
    /// The engine opened at load time to read the model's tensors; the first CPU
    /// instance takes it rather than loading the model a second time.
    spare: Mutex<Option<Box<dyn Engine>>>,
    /// Publishes the engine's metrics while the model is loaded (dropped first).
    _metrics: Option<MetricsPublisher>,
}

/// Every `METRICS_INTERVAL` pushes a source's samples to Triton's metrics endpoint,
/// labelled with the model's name; stops and deletes its metrics when dropped.
pub struct MetricsPublisher {
    stop: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const METRICS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

impl MetricsPublisher {
    fn start(model: String, source: Arc<dyn MetricsSource>) -> Result<MetricsPublisher> {
        let stop = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("metrics-{model}"))
            .spawn(move || {
                let mut set = MetricSet::default();
                let (lock, cv) = &*flag;
                loop {
                    let mut samples = source.samples();
                    for s in &mut samples {
                        s.labels.insert(0, ("model", model.clone()));
                    }
                    if let Err(e) = set.publish(&samples) {
                        crate::log_error!("model '{model}': cannot publish metrics: {e}");
                    }
                    let stopped = lock.lock().map(|g| cv.wait_timeout(g, METRICS_INTERVAL).map(|(g, _)| *g).unwrap_or(true)).unwrap_or(true);
                    if stopped {
                        break;
                    }
                }
            })
            .map_err(|e| Error::internal(format!("cannot start the metrics thread: {e}")))?;
        Ok(MetricsPublisher { stop, thread: Some(thread) })
    }
}

impl Drop for MetricsPublisher {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        if let Ok(mut g) = lock.lock() {
            *g = true;
        }
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl ModelState {
    /// Loads a model. Returns the state and, when auto-complete filled something in,
    /// the completed config JSON for Triton.
    pub fn load(ctx: ModelContext<'_>) -> Result<(ModelState, Option<String>)> {
        let mut raw: Value = serde_json::from_str(&ctx.config_json)
            .map_err(|e| Error::invalid_arg(format!("model config is not JSON: {e}")))?;
        let mut config = ModelConfig::from_value(&raw)?;
        let version_dir = ctx.repository.join(ctx.version.to_string());
        let (kind, model_file) = engine::select(&config, &version_dir)?;
        let probe = engine::create(kind, &model_file, &EngineOptions { config: &config, backend: &ctx.backend.cmdline, device: Device::Cpu, probe: true })?;
        let mut completed = None;
        if ctx.autocomplete {
            if let Some(v) = autocomplete(&raw, probe.inputs(), probe.outputs(), ctx.backend.default_max_batch_size)? {
                raw = v;
                config = ModelConfig::from_value(&raw)?;
                completed = Some(raw.to_string());
                crate::log_info!("model '{}': config auto-completed from '{}'", ctx.name, model_file.display());
            }
        }
        check_against_model(&config, probe.inputs(), probe.outputs())
            .map_err(|e| e.context(format!("model file '{}'", model_file.display())))?;
        let policy = InputPolicy {
            reject_nonfinite: config.parameter_bool("reject_nonfinite")?.unwrap_or(false),
            accepts_device_inputs: false,
        };
        crate::log_info!("model '{}' version {} loaded from '{}' ({:?} engine)", ctx.name, ctx.version, model_file.display(), kind);
        let metrics = match probe.metrics_source() {
            Some(source) => Some(MetricsPublisher::start(ctx.name.clone(), source)?),
            None => None,
        };
        let state = ModelState {
            name: ctx.name,
            config,
            kind,
            model_file,
            backend: ctx.backend.cmdline.clone(),
            policy,
            spare: Mutex::new(Some(probe)),
            _metrics: metrics,
        };
        Ok((state, completed))
    }
}

pub struct InstanceContext {
    pub name: String,
    pub device: Device,
}

pub struct InstanceState {
    name: String,
    /// Inputs already reported as arriving in GPU memory (logged once each).
    device_inputs_seen: Mutex<Vec<String>>,
    config: ModelConfig,
    policy: InputPolicy,
    engine: Mutex<Box<dyn Engine>>,
}

impl InstanceState {
    pub fn new(model: &ModelState, ctx: InstanceContext) -> Result<InstanceState> {
        let spare = if ctx.device == Device::Cpu {
            model.spare.lock().ok().and_then(|mut s| s.take_if(|e| !e.is_probe()))
        } else {
            None
        };
        let engine = match spare {
            Some(e) => e,
            None => engine::create(
                model.kind,
                &model.model_file,
                &EngineOptions { config: &model.config, backend: &model.backend, device: ctx.device, probe: false },
            )?,
        };
        let mut policy = model.policy.clone();
        policy.accepts_device_inputs = engine.accepts_device_inputs();
        crate::log_info!("instance '{}' of model '{}' ready on {:?}", ctx.name, model.name, ctx.device);
        Ok(InstanceState { name: ctx.name, device_inputs_seen: Mutex::new(Vec::new()), config: model.config.clone(), policy, engine: Mutex::new(engine) })
    }
}

impl InstanceState {
    /// Logs, once per input, that it arrived in GPU memory and is used in place: the
    /// evidence that an ensemble keeps a tensor on the GPU between its steps.
    fn note_device_inputs(&self, request: &CheckedRequest<'_>) {
        for t in &request.tensors {
            if let Some(crate::batch::Chunk::Device { memory, .. }) = t.chunks.first() {
                let Ok(mut seen) = self.device_inputs_seen.lock() else { return };
                if !seen.contains(&t.name) {
                    seen.push(t.name.clone());
                    crate::log_info!("instance '{}': input '{}' arrived in GPU memory ({memory:?}) and is used in place", self.name, t.name);
                }
            }
        }
    }
}

/// Answers every request with the same error (used when the instance itself is unusable).
pub fn fail_all(requests: Vec<Request>, error: &Error) {
    for r in &requests {
        if let Ok(resp) = Response::new(r) {
            resp.send(&Err(error.clone()));
        }
    }
}

/// Runs one call of Triton's execute: every request is answered and released.
pub fn execute(inst: &InstanceState, reporter: &Instance, requests: Vec<Request>) {
    let exec_start = now_ns();
    let cfg = &inst.config;
    let n = requests.len();
    let mut responses: Vec<Option<Response>> = Vec::with_capacity(n);
    let mut outcomes: Vec<Result<()>> = Vec::with_capacity(n);
    let mut checked: Vec<Option<CheckedRequest<'_>>> = Vec::with_capacity(n);
    let mut wanted: Vec<Vec<String>> = Vec::with_capacity(n);

    let mut engine = match inst.engine.lock() {
        Ok(e) => e,
        Err(_) => {
            fail_all(requests, &Error::internal("engine lock poisoned by an earlier panic"));
            return;
        }
    };
    for req in &requests {
        let response = Response::new(req).map_err(|e| crate::log_error!("cannot create a response: {e}")).ok();
        let prepared = if response.is_none() {
            Err(Error::internal("could not create a response"))
        } else if req.is_cancelled() {
            Err(Error::new(ErrorKind::Cancelled, "request was cancelled"))
        } else {
            req.inputs()
                .and_then(|t| check_request(cfg, &inst.policy, t))
                .and_then(|c| engine.check_request(&c.tensors).map(|()| c))
                .and_then(|c| Ok((c, req.requested_outputs()?)))
        };
        responses.push(response);
        match prepared {
            Ok((c, outs)) => {
                inst.note_device_inputs(&c);
                checked.push(Some(c));
                wanted.push(outs);
                outcomes.push(Ok(()));
            }
            Err(e) => {
                if e.kind() != ErrorKind::Cancelled {
                    crate::log_verbose!("instance '{}': request '{}' rejected: {e}", inst.name, req.id());
                }
                checked.push(None);
                wanted.push(Vec::new());
                outcomes.push(Err(e));
            }
        }
    }

    let valid: Vec<usize> = (0..n).filter(|&i| checked[i].is_some()).collect();
    let refs: Vec<&CheckedRequest<'_>> = valid.iter().map(|&i| checked[i].as_ref().expect("valid")).collect();
    let groups = group_by_shape(cfg, &refs);
    let compute_start = now_ns();
    let mut sink_ns = 0u64;
    let mut rows_run = 0u64;
    for group in &groups {
        let members: Vec<usize> = group.iter().map(|&g| valid[g]).collect();
        let group_refs: Vec<&CheckedRequest<'_>> = group.iter().map(|&g| refs[g]).collect();
        let result = run_group(&mut **engine, cfg, &group_refs, &members, &wanted, &mut responses, &mut outcomes, &mut sink_ns);
        match result {
            Ok(rows) => rows_run += rows as u64,
            Err(e) => {
                crate::log_error!("instance '{}': batch of {} requests failed: {e}", inst.name, members.len());
                for &i in &members {
                    outcomes[i] = Err(e.clone());
                }
            }
        }
    }
    drop(engine);
    let run_end = now_ns();
    let compute_end = run_end.saturating_sub(sink_ns).max(compute_start);
    let exec_end = now_ns();
    let timing = Timing { exec_start, compute_start, compute_end, exec_end };
    drop(checked);
    for (i, req) in requests.iter().enumerate() {
        if let Some(r) = responses[i].take() {
            r.send(&outcomes[i]);
        }
        reporter.report(req, outcomes[i].is_ok(), timing);
    }
    if rows_run > 0 {
        reporter.report_batch(rows_run, timing);
    }
    drop(requests); // releases every request, after its statistics
}

/// Runs one same-shape group and writes each member's outputs into its response.
/// Returns the number of rows run. A member whose own output fails gets its own error.
#[allow(clippy::too_many_arguments)]
fn run_group(
    engine: &mut dyn Engine,
    cfg: &ModelConfig,
    group: &[&CheckedRequest<'_>],
    members: &[usize],
    wanted: &[Vec<String>],
    responses: &mut [Option<Response>],
    outcomes: &mut [Result<()>],
    sink_ns: &mut u64,
) -> Result<usize> {
    let mut batch = assemble(cfg, group)?;
    // GPU inputs of several requests: gather them into one buffer on their GPU.
    let mut gathered = Vec::new();
    for t in &mut batch.tensors {
        if let BatchData::DeviceParts { memory: Memory::Gpu(id), parts } = &t.data {
            let buf = cuda::GatheredBuffer::gather(*id, parts)?;
            t.data = BatchData::Device { memory: Memory::Gpu(*id), addr: buf.addr(), len: parts.iter().map(|p| p.1).sum() };
            gathered.push(buf);
        }
    }
    let mut names: Vec<&str> = Vec::new();
    for &m in members {
        for w in &wanted[m] {
            if !names.contains(&w.as_str()) {
                names.push(w);
            }
        }
    }
    engine.run(&batch.tensors, &names, &mut |out| {
        let t0 = now_ns();
        let parts = scatter_ranges(cfg, &batch, out.name, out.dtype, out.shape)?;
        for (k, &m) in members.iter().enumerate() {
            if !wanted[m].iter().any(|w| w == out.name) || outcomes[m].is_err() {
                continue;
            }
            let (shape, range) = &parts[k];
            let written = match responses[m].as_mut() {
                Some(resp) => write_output(resp, &out, shape, range.clone()),
                None => Ok(()),
            };
            if let Err(e) = written {
                outcomes[m] = Err(e);
            }
        }
        *sink_ns += now_ns() - t0;
        Ok(())
    })?;
    Ok(batch.total_rows)
}

/// Copies one request's part of an output into its response, from host or GPU memory,
/// into the memory Triton offers (GPU for a GPU output when it can: ensembles keep
/// tensors on the GPU between steps).
fn write_output(resp: &mut Response, out: &OutputView<'_>, shape: &[i64], range: std::ops::Range<usize>) -> Result<()> {
    let prefer = match out.data {
        OutputData::Host(_) => Memory::Cpu,
        OutputData::Device { device, .. } => Memory::Gpu(device),
    };
    let target = resp.output_buffer(out.name, out.dtype, shape, range.len(), prefer)?;
    match (&out.data, target) {
        (OutputData::Host(bytes), OutputTarget::Host(buf)) => buf.copy_from_slice(&bytes[range]),
        (OutputData::Device { device, addr, .. }, OutputTarget::Device { device: to, addr: dst }) if *device == to => {
            cuda::copy_device_to_device(to, dst, addr + range.start as u64, range.len())?
        }
        (OutputData::Device { device, addr, .. }, OutputTarget::Host(buf)) => cuda::copy_device_to_host(*device, buf, addr + range.start as u64)?,
        (OutputData::Device { device, addr, .. }, OutputTarget::Device { device: to, addr: dst }) => {
            // another GPU: through the host (rare: Triton places a step's buffers on its device)
            let mut staged = vec![0u8; range.len()];
            cuda::copy_device_to_host(*device, &mut staged, addr + range.start as u64)?;
            cuda::copy_host_to_device(to, dst, &staged)?
        }
        (OutputData::Host(bytes), OutputTarget::Device { device: to, addr: dst }) => cuda::copy_host_to_device(to, dst, &bytes[range])?,
    }
    Ok(())
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
        assert_eq!(BackendSettings::from_json("").unwrap().default_max_batch_size, DEFAULT_MAX_BATCH_SIZE);
        assert!(BackendSettings::from_json(r#"{"cmdline":{"default-max-batch-size":"x"}}"#).is_err());
    }
}
