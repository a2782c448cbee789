//! The ONNX Runtime engine (`ort`, with ONNX Runtime loaded at run time).
//!
//! One ONNX Runtime per server process (a process can load only one), found from, in
//! order: the model parameter `onnxruntime_library`, the backend setting
//! `--backend-config=rust,onnxruntime-library=...`, the environment variables
//! `TRITON_RUST_ONNXRUNTIME_LIBRARY` and `ORT_DYLIB_PATH`, and the stock Triton image's
//! `/opt/tritonserver/backends/onnxruntime/libonnxruntime.so`. A model whose library
//! cannot be loaded fails to load and names what was tried; other models go on.
//! One `Session` per instance. On the CPU, inputs are handed to ONNX Runtime in place when
//! they are aligned and outputs are handed to the sink in place. On a GPU instance inputs
//! and outputs are bound in GPU memory, with CUDA graphs on request (`gpu.rs`).

mod gpu;
mod runtime;
mod session;
mod settings;

pub use settings::OnnxSettings;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ort::session::{Session, SessionInputValue};
use ort::value::ValueType;

use triton_rust_core::batch::{check_shared_dims, BatchTensor, RequestTensor};
use triton_rust_core::config::{ModelConfig, TensorSpec};
use triton_rust_core::engine::{
    Device, Engine, EngineClaim, LoadedModel, ModelLoad, OutputView, Signature,
};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::tensor::{decode_strings, encode_strings, AlignedBuf, Bytes, DataType};

use runtime::{ort_err, runtime, runtime_error, Runtime};
use session::{build_session, dim_names, dtype_from_ort, input_value, specs};

/// ONNX models: `model.onnx`, or a file ending in `.onnx`.
pub static CLAIM: EngineClaim = EngineClaim {
    names: &["onnx", "onnxruntime"],
    default_file: Some("model.onnx"),
    file_suffixes: &[".onnx"],
    parameters: OnnxSettings::KNOWN,
    backend_keys: settings::OnnxBackend::KNOWN,
    environment: runtime::ENVIRONMENT,
    builds_on: &[],
    keeps_sequences: true,
};

triton_rust_core::engine_kind!(
    /// The ONNX Runtime engine kind.
    OnnxKind, CLAIM, OnnxModel
);

/// An ONNX model, loaded: its settings, the runtime, its signature read from a CPU session.
pub struct OnnxModel {
    runtime: Arc<Runtime>,
    settings: OnnxSettings,
    /// The final config, which every instance's session is built by.
    config: ModelConfig,
    model_file: PathBuf,
    sig: Signature,
    input_dims: Vec<(String, Vec<String>)>,
    /// The CPU session that read the signature, kept for the first KIND_CPU instance to
    /// take (a model with no CPU instance drops it at load).
    cpu_session: Mutex<Option<Session>>,
}

/// What describing an ONNX model opened: its settings, the runtime and a CPU session that
/// read the file's signature, for the load to take.
struct Opened {
    runtime: Arc<Runtime>,
    settings: OnnxSettings,
    session: Session,
    sig: Signature,
    input_dims: Vec<(String, Vec<String>)>,
}

impl Opened {
    fn open(load: &ModelLoad<'_>) -> Result<Opened> {
        let cfg = load.config;
        let settings = OnnxSettings::from_config(cfg)?;
        let runtime = runtime(&settings, load.backend)?;
        let gpu_instances =
            cfg.instance_kinds.is_empty() || cfg.instance_kinds.iter().any(|k| k == "KIND_GPU");
        session::check_accelerators(&settings, gpu_instances)?;
        let session = build_session(&runtime, load.model_file, cfg, Device::Cpu, &settings, false)?;
        let sig = Signature {
            inputs: specs(session.inputs(), "input")?,
            outputs: specs(session.outputs(), "output")?,
        };
        let input_dims = dim_names(session.inputs());
        Ok(Opened { runtime, settings, session, sig, input_dims })
    }
}

impl OnnxModel {
    /// The file's signature, read by a CPU session that the load then keeps.
    pub fn describe(load: &ModelLoad<'_>) -> Result<Option<Signature>> {
        let opened = Opened::open(load)?;
        let sig = opened.sig.clone();
        load.opened.keep(opened);
        Ok(Some(sig))
    }

    pub fn load(load: &ModelLoad<'_>) -> Result<OnnxModel> {
        let cfg = load.config;
        let Opened { runtime, settings, session, sig, input_dims } = match load.opened.take() {
            Some(o) => o,
            None => Opened::open(load)?,
        };
        // Triton completes instance_group before the model is loaded; with none given
        // (a config read outside Triton) a CPU instance may come.
        let cpu_instance =
            cfg.instance_kinds.is_empty() || cfg.instance_kinds.iter().any(|k| k == "KIND_CPU");
        Ok(OnnxModel {
            runtime,
            settings,
            config: cfg.clone(),
            model_file: load.model_file.to_path_buf(),
            sig,
            input_dims,
            cpu_session: Mutex::new(cpu_instance.then_some(session)),
        })
    }

    /// A GPU instance's engine: inputs and outputs bound in GPU memory, CUDA graphs on request.
    fn gpu_instance(&self, id: i32) -> Result<OnnxEngine> {
        let cfg = &self.config;
        let mut buckets = cfg.cuda_graph_buckets()?;
        if buckets.is_some() && !cfg.gpu_accelerators.is_empty() {
            log::info!("model '{}': optimization.cuda.graphs applies to the CUDA execution provider; with a GPU accelerator it runs without", cfg.name);
            buckets = None;
        }
        if let Some(t) =
            self.sig.inputs.iter().chain(&self.sig.outputs).find(|t| t.dtype == DataType::Bytes)
        {
            return Err(Error::unsupported(format!(
                "model '{}' has the string (BYTES) tensor '{}'; ONNX Runtime keeps strings in host memory, so serve this model on KIND_CPU instances",
                cfg.name, t.name
            )));
        }
        let (file, rt, settings, gpu) =
            (&self.model_file, &self.runtime, &self.settings, Device::Gpu(id));
        let session = match build_session(rt, file, cfg, gpu, settings, buckets.is_some()) {
            Ok(s) => s,
            Err(e) if buckets.is_some() => {
                // ONNX Runtime refuses a graph when a node runs outside the CUDA provider
                log::warn!("model '{}': ONNX Runtime cannot capture this model in CUDA graphs ({e}); it runs without", cfg.name);
                buckets = None;
                build_session(rt, file, cfg, gpu, settings, false)?
            }
            Err(e) => return Err(e),
        };
        let io = gpu::GpuIo::new(&session, id, cfg.batching(), buckets, &self.sig.outputs)?;
        Ok(OnnxEngine {
            _runtime: rt.clone(),
            session,
            outputs: self.sig.outputs.clone(),
            gpu: Some(io),
        })
    }
}

impl LoadedModel for OnnxModel {
    fn signature(&self) -> &Signature {
        &self.sig
    }

    fn accepts_device_inputs(&self, device: Device) -> bool {
        device != Device::Cpu
    }

    fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        let dims: Vec<(&str, &[String])> =
            self.input_dims.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
        check_shared_dims(inputs, &dims)?;
        // ONNX Runtime reads a bool as one byte that must be 0 or 1: refused per request here,
        // so the rest of a batch is still answered
        for t in inputs.iter().filter(|t| t.dtype == DataType::Bool) {
            if t.chunks.iter().filter_map(|c| c.host()).any(|h| h.iter().any(|&b| b > 1)) {
                return Err(Error::invalid_arg(format!(
                    "input '{}' is BOOL but holds a byte other than 0 or 1",
                    t.name
                )));
            }
        }
        // ONNX Runtime's strings are UTF-8 text without NUL (the layout is checked already)
        for t in inputs.iter().filter(|t| t.dtype == DataType::Bytes) {
            let joined = t.host_bytes().unwrap_or_default();
            for (i, s) in decode_strings(&joined)?.iter().enumerate() {
                if let Err(e) = std::str::from_utf8(s) {
                    return Err(Error::invalid_arg(format!(
                        "input '{}' element {i} is not UTF-8 text ({e})",
                        t.name
                    )));
                }
                if s.contains(&0) {
                    return Err(Error::invalid_arg(format!("input '{}' element {i} holds a NUL byte, which ONNX Runtime strings cannot", t.name)));
                }
            }
        }
        Ok(())
    }

    fn instance(&self, device: Device) -> Result<Box<dyn Engine>> {
        Ok(Box::new(self.engine(device)?))
    }
}

impl OnnxModel {
    /// The session of an instance on `device`.
    pub fn engine(&self, device: Device) -> Result<OnnxEngine> {
        Ok(match device {
            Device::Gpu(id) => self.gpu_instance(id)?,
            Device::Cpu => {
                let kept = self.cpu_session.lock().ok().and_then(|mut s| s.take());
                let session = match kept {
                    Some(s) => s,
                    None => build_session(
                        &self.runtime,
                        &self.model_file,
                        &self.config,
                        Device::Cpu,
                        &self.settings,
                        false,
                    )?,
                };
                OnnxEngine {
                    _runtime: self.runtime.clone(),
                    session,
                    outputs: self.sig.outputs.clone(),
                    gpu: None,
                }
            }
        })
    }
}

/// One instance's session.
pub struct OnnxEngine {
    _runtime: Arc<Runtime>,
    session: Session,
    outputs: Vec<TensorSpec>,
    /// GPU instances: inputs and outputs bound in GPU memory.
    gpu: Option<gpu::GpuIo>,
}

impl Engine for OnnxEngine {
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        if let Some(gpu) = self.gpu.as_mut() {
            return gpu.run(&mut self.session, inputs, outputs, &self.outputs, sink);
        }
        let mut scratch: Vec<Option<AlignedBuf>> = (0..inputs.len()).map(|_| None).collect();
        let mut values: Vec<(String, SessionInputValue<'_>)> = Vec::with_capacity(inputs.len());
        for (t, s) in inputs.iter().zip(scratch.iter_mut()) {
            let bytes = t.host_bytes().ok_or_else(|| {
                Error::unsupported(format!(
                    "input '{}' is in GPU memory; the ONNX engine takes host inputs",
                    t.name
                ))
            })?;
            values.push((t.name.clone(), input_value(t, bytes, s)?));
        }
        let results = self
            .session
            .run(values)
            .map_err(|e| runtime_error(format!("ONNX Runtime run failed: {e}")))?;
        for &name in outputs {
            let value = results.get(name).ok_or_else(|| {
                Error::internal(format!("ONNX Runtime returned no output '{name}'"))
            })?;
            let ValueType::Tensor { ty, .. } = value.dtype() else {
                return Err(Error::unsupported(format!("output '{name}' is not a tensor")));
            };
            let dtype = dtype_from_ort(*ty)?;
            macro_rules! emit {
                ($ty:ty) => {{
                    let (shape, data) = value.try_extract_tensor::<$ty>().map_err(ort_err)?;
                    let shape: Vec<i64> = shape.iter().copied().collect();
                    sink(OutputView {
                        name,
                        dtype,
                        shape: &shape,
                        data: Bytes::Host(bytemuck::cast_slice(data)),
                    })?
                }};
            }
            match dtype {
                DataType::F32 => emit!(f32),
                DataType::F64 => emit!(f64),
                DataType::F16 => emit!(half::f16),
                DataType::Bf16 => emit!(half::bf16),
                DataType::I8 => emit!(i8),
                DataType::I16 => emit!(i16),
                DataType::I32 => emit!(i32),
                DataType::I64 => emit!(i64),
                DataType::U8 => emit!(u8),
                DataType::U16 => emit!(u16),
                DataType::U32 => emit!(u32),
                DataType::U64 => emit!(u64),
                DataType::Bool => {
                    let (shape, data) = value.try_extract_tensor::<bool>().map_err(ort_err)?;
                    let shape: Vec<i64> = shape.iter().copied().collect();
                    let bytes: Vec<u8> = data.iter().map(|&b| b as u8).collect();
                    sink(OutputView { name, dtype, shape: &shape, data: Bytes::Host(&bytes) })?
                }
                DataType::Bytes => {
                    let (shape, strings) = value.try_extract_strings().map_err(ort_err)?;
                    let shape: Vec<i64> = shape.iter().copied().collect();
                    let bytes = encode_strings(&strings)?;
                    sink(OutputView { name, dtype, shape: &shape, data: Bytes::Host(&bytes) })?
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod error_tests {
    use triton_rust_core::ErrorKind;

    #[test]
    fn a_sticky_cuda_error_from_onnx_runtime_is_a_lost_device() {
        let lost = super::runtime::runtime_error(
            "ONNX Runtime run failed: CUDA failure 700: an illegal memory access was encountered"
                .into(),
        );
        assert_eq!(lost.kind(), ErrorKind::DeviceLost);
        let other = super::runtime::ort_err("Got invalid dimensions for input: X");
        assert_eq!(other.kind(), ErrorKind::Internal);
    }
}
