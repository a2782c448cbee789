//! A fake server (requests, responses, transport) and a fake engine for the execute path's
//! tests, with a fake device for GPU-resident inputs.

use super::*;

pub(super) use std::cell::{Cell, RefCell};
pub(super) use std::rc::Rc;
pub(super) use std::sync::atomic::{AtomicUsize, Ordering};

pub(super) use crate::batch::BatchTensor;
pub(super) use crate::batch::RequestTensor;
pub(super) use crate::config::TensorSpec;
pub(super) use crate::engine::{EngineClaim, EngineKind, ModelLoad, Signature};
pub(super) use crate::fake_device::FakeDevice;
pub(super) use crate::tensor::{DeviceView, DeviceViewMut};

pub(super) type Sent = (String, Result<()>, Vec<(String, Vec<i64>, Vec<u8>, Device)>);

/// (name, shape, values, the GPU it is on)
pub(super) type FakeInput = (String, Vec<i64>, Vec<u8>, Option<i32>);

/// A state handed back: (name, shape, bytes).
pub(super) type FakeState = (String, Vec<i64>, Vec<u8>);

pub(super) struct FakeRequest {
    pub(super) id: String,
    pub(super) inputs: Vec<FakeInput>,
    pub(super) outputs: Vec<String>,
    /// States handed back for the sequence's next request: (name, shape, bytes).
    pub(super) states: RefCell<Vec<FakeState>>,
    /// States staged and not yet committed.
    pub(super) staged: RefCell<Vec<FakeState>>,
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
    fn stage_state(
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
        self.staged.borrow_mut().push((name.to_string(), shape.to_vec(), buf));
        Ok(Device::Cpu)
    }
    fn commit_states(&self) -> Result<()> {
        self.states.borrow_mut().append(&mut self.staged.borrow_mut());
        Ok(())
    }
}

pub(super) struct FakeResponse {
    pub(super) id: String,
    pub(super) outputs: Vec<(String, Vec<i64>, Vec<u8>, Device)>,
    pub(super) sent: Rc<RefCell<Vec<Sent>>>,
    /// Like Triton for a gRPC/HTTP client: host memory whatever is asked.
    pub(super) host_only: bool,
    /// No output can be delivered (as for a client's shared-memory region too small).
    pub(super) undeliverable: bool,
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
        if self.undeliverable {
            return Err(Error::invalid_arg(format!(
                "output '{name}': the client's shared-memory region is too small"
            )));
        }
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
pub(super) struct FakeServer {
    pub(super) sent: Rc<RefCell<Vec<Sent>>>,
    pub(super) reports: RefCell<Vec<(String, bool)>>,
    pub(super) batches: RefCell<Vec<u64>>,
    pub(super) clock: Cell<u64>,
    pub(super) device: FakeDevice,
    pub(super) host_only: bool,
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
            undeliverable: false,
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

/// What the fake kind's models did, for the tests to read.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) runs: Mutex<Vec<(usize, Device)>>,
    pub(super) landed: Mutex<Vec<bool>>,
    /// Models loaded, and typed settings parsed (at each load).
    pub(super) loads: AtomicUsize,
    pub(super) settings_parsed: AtomicUsize,
    /// Engines made for instances.
    pub(super) instances: AtomicUsize,
    /// Descriptions asked for, and the inputs each load's config listed.
    pub(super) described: AtomicUsize,
    pub(super) load_inputs: Mutex<Vec<usize>>,
}

/// Y = 2 X on [batch, 2] floats; refuses a request holding 13 (a check only the
/// model can make); reads GPU inputs (simulated) and answers on the same side.
pub(super) struct DoublerKind(pub(super) Arc<Counts>);

static DOUBLER: EngineClaim = EngineClaim {
    names: &["doubler"],
    default_file: Some("model.onnx"),
    file_suffixes: &[".onnx"],
    parameters: &[("scale", "2")],
    backend_keys: &[],
    environment: &[],
    builds_on: &[],
    keeps_sequences: true,
};

impl EngineKind for DoublerKind {
    fn claim(&self) -> &'static EngineClaim {
        &DOUBLER
    }
    /// Its settings parsed here, kept for the load.
    fn describe(&self, load: &ModelLoad<'_>) -> Result<Option<Signature>> {
        self.0.described.fetch_add(1, Ordering::Relaxed);
        load.opened.keep(DoublerSettings::parse(&self.0, load)?);
        Ok(Some(doubler_signature()))
    }
    fn load(&self, load: &ModelLoad<'_>) -> Result<Box<dyn LoadedModel>> {
        self.0.loads.fetch_add(1, Ordering::Relaxed);
        self.0.load_inputs.lock().unwrap().push(load.config.inputs.len());
        let settings = match load.opened.take::<DoublerSettings>() {
            Some(s) => s,
            None => DoublerSettings::parse(&self.0, load)?,
        };
        Ok(Box::new(DoublerModel {
            sig: doubler_signature(),
            scale: settings.scale,
            counts: self.0.clone(),
        }))
    }
}

fn doubler_signature() -> Signature {
    let spec =
        |name: &str| TensorSpec { name: name.into(), dtype: DataType::F32, shape: vec![-1, 2] };
    Signature { inputs: vec![spec("X")], outputs: vec![spec("Y")] }
}

struct DoublerSettings {
    scale: f32,
}

impl DoublerSettings {
    fn parse(counts: &Counts, load: &ModelLoad<'_>) -> Result<DoublerSettings> {
        counts.settings_parsed.fetch_add(1, Ordering::Relaxed);
        let scale: f32 = load.config.parameters.get("scale").map_or(Ok(2.0), |s| {
            s.parse().map_err(|_| Error::invalid_arg("parameter 'scale' is a number"))
        })?;
        Ok(DoublerSettings { scale })
    }
}

struct DoublerModel {
    sig: Signature,
    scale: f32,
    counts: Arc<Counts>,
}

impl LoadedModel for DoublerModel {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    fn accepts_device_inputs(&self, _device: Device) -> bool {
        true
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
    fn instance(&self, _device: Device) -> Result<Box<dyn Engine>> {
        self.counts.instances.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(Doubler { scale: self.scale, counts: self.counts.clone() }))
    }
}

struct Doubler {
    scale: f32,
    counts: Arc<Counts>,
}

pub(super) fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}
pub(super) fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Engine for Doubler {
    fn outputs_landed(&mut self, on_host: bool) {
        self.counts.landed.lock().unwrap().push(on_host);
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
        self.counts.runs.lock().unwrap().push((inputs[0].shape[0] as usize, device));
        // a value only the run finds wrong (as keys in GPU memory, which no check reads)
        if floats(src).contains(&99.0) {
            return Err(Error::invalid_arg("input 'X': 99 is not a value this engine takes"));
        }
        let y = to_bytes(&floats(src).iter().map(|x| x * self.scale).collect::<Vec<_>>());
        let data = match device {
            Device::Gpu(id) => Bytes::Device(DeviceView::simulated(id, &y)),
            Device::Cpu => Bytes::Host(&y),
        };
        sink(OutputView { name: "Y", dtype: DataType::F32, shape: &inputs[0].shape, data })
    }
}

/// The doubler's kinds, for a model context.
pub(super) fn kinds() -> (Arc<EngineKinds>, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    (Arc::new(EngineKinds::new(vec![Box::new(DoublerKind(counts.clone()))])), counts)
}

/// Loads the doubler with `config` (its version directory made and removed here).
pub(super) fn load_config(config: &str) -> Result<(ModelState, Arc<Counts>)> {
    load_config_completing(config, false).map(|(m, c, _)| (m, c))
}

/// Loads the doubler with `config`, auto-complete on or off; also the completed config.
pub(super) fn load_config_completing(
    config: &str,
    autocomplete: bool,
) -> Result<(ModelState, Arc<Counts>, Option<String>)> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "trt-serve-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(dir.join("1")).unwrap();
    std::fs::write(dir.join("1/model.onnx"), b"stands in for a model file").unwrap();
    let (kinds, counts) = kinds();
    let settings = BackendSettings::default();
    let ctx = ModelContext {
        name: "doubler".into(),
        version: 1,
        repository: dir.clone(),
        config_json: config.into(),
        autocomplete,
        backend: &settings,
        kinds,
    };
    let loaded = ModelState::load(ctx);
    std::fs::remove_dir_all(&dir).unwrap();
    let (model, completed) = loaded?;
    Ok((model, counts, completed))
}

pub(super) fn model(instance_kind: &str) -> (ModelState, Arc<Counts>) {
    load_config(&format!(
        r#"{{"name": "doubler", "max_batch_size": 8,
            "input": [{{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}}],
            "output": [{{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}}],
            "instance_group": [{{"kind": "{instance_kind}", "count": 1}}]}}"#
    ))
    .unwrap()
}

pub(super) fn request(id: &str, shape: &[i64], values: &[f32], gpu: Option<i32>) -> FakeRequest {
    FakeRequest {
        id: id.into(),
        inputs: vec![("X".into(), shape.to_vec(), to_bytes(values), gpu)],
        outputs: vec!["Y".into()],
        states: RefCell::default(),
        staged: RefCell::default(),
    }
}
