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
mod settings;

pub use settings::OnnxSettings;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ort::ep::{self, ExecutionProvider};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::{TensorElementType, TensorRef, ValueType};

use triton_rust_core::batch::{check_shared_dims, BatchTensor, RequestTensor};
use triton_rust_core::config::TensorSpec;
use triton_rust_core::engine::{Device, Engine, EngineOptions, OutputView, Signature};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::settings::BackendSettings;
use triton_rust_core::tensor::{decode_strings, encode_strings, AlignedBuf, Bytes, DataType};

const STOCK_LIBRARY: &str = "/opt/tritonserver/backends/onnxruntime/libonnxruntime.so";

fn ort_err(e: impl std::fmt::Display) -> Error {
    runtime_error(format!("ONNX Runtime: {e}"))
}

/// An ONNX Runtime failure as our error. Its CUDA provider reports a sticky CUDA error only
/// as text: that is a lost device ([`ErrorKind::DeviceLost`](triton_rust_core::ErrorKind)),
/// anything else an engine failure.
fn runtime_error(message: String) -> Error {
    if triton_rust_cuda::sticky_error_in(&message) {
        Error::device_lost(message)
    } else {
        Error::internal(message)
    }
}

/// The process's ONNX Runtime: which library, and its environment.
struct Runtime {
    library: PathBuf,
    env: ort::environment::Environment,
}

static RUNTIME: Mutex<Option<Arc<Runtime>>> = Mutex::new(None);

/// Where the library comes from, in priority order, for the error message too.
/// Also says whether the choice was explicit (model parameter or backend setting): an
/// explicit path is never silently replaced by another.
fn library_candidates(
    settings: &OnnxSettings,
    backend: &BackendSettings,
) -> (Vec<(String, PathBuf)>, bool) {
    let mut c = Vec::new();
    if let Some(p) = &settings.library {
        c.push(("model parameter 'onnxruntime_library'".into(), p.clone()));
        return (c, true);
    }
    if let Some(p) = &backend.onnxruntime_library {
        c.push(("--backend-config=rust,onnxruntime-library".into(), p.clone()));
        return (c, true);
    }
    for (var, p) in &backend.onnxruntime_env {
        c.push((format!("environment variable {var}"), p.clone()));
    }
    c.push(("the stock Triton image location".into(), PathBuf::from(STOCK_LIBRARY)));
    (c, false)
}

fn runtime(settings: &OnnxSettings, backend: &BackendSettings) -> Result<Arc<Runtime>> {
    let (candidates, explicit) = library_candidates(settings, backend);
    let mut slot = RUNTIME.lock().map_err(|_| Error::internal("ONNX Runtime lock poisoned"))?;
    let found = candidates.iter().find(|(_, p)| p.is_file());
    let Some((source, path)) = found else {
        let tried: Vec<String> =
            candidates.iter().map(|(s, p)| format!("'{}' ({s})", p.display())).collect();
        let hint = if settings.library.is_some() {
            "Fix the model parameter 'onnxruntime_library' (an absolute path to libonnxruntime.so)"
        } else {
            "Set --backend-config=rust,onnxruntime-library=<absolute path to libonnxruntime.so>"
        };
        return Err(Error::unavailable(format!(
            "ONNX Runtime library not found: tried {}. {hint}",
            tried.join(", ")
        )));
    };
    if !path.is_absolute() {
        return Err(Error::invalid_arg(format!(
            "ONNX Runtime library path '{}' ({source}) must be absolute",
            path.display()
        )));
    }
    let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
    if let Some(rt) = slot.as_ref() {
        if rt.library == canonical || !explicit {
            return Ok(rt.clone());
        }
        return Err(Error::unavailable(format!(
            "ONNX Runtime is already loaded from '{}'; '{}' ({source}) cannot be loaded beside it (one ONNX Runtime per server process)",
            rt.library.display(),
            canonical.display()
        )));
    }
    let builder = ort::init_from(&canonical).map_err(|e| {
        Error::unavailable(format!(
            "cannot load ONNX Runtime from '{}' ({source}): {e}",
            canonical.display()
        ))
    })?;
    let env = builder.with_name("triton_rust").build().map_err(ort_err)?;
    log::info!("ONNX Runtime loaded from '{}' ({source})", canonical.display());
    let rt = Arc::new(Runtime { library: canonical, env });
    *slot = Some(rt.clone());
    Ok(rt)
}

fn dtype_from_ort(t: TensorElementType) -> Result<DataType> {
    use TensorElementType as T;
    Ok(match t {
        T::Float32 => DataType::F32,
        T::Float64 => DataType::F64,
        T::Float16 => DataType::F16,
        T::Bfloat16 => DataType::Bf16,
        T::Int8 => DataType::I8,
        T::Int16 => DataType::I16,
        T::Int32 => DataType::I32,
        T::Int64 => DataType::I64,
        T::Uint8 => DataType::U8,
        T::Uint16 => DataType::U16,
        T::Uint32 => DataType::U32,
        T::Uint64 => DataType::U64,
        T::Bool => DataType::Bool,
        T::String => DataType::Bytes,
        other => {
            return Err(Error::unsupported(format!("ONNX element type {other:?} is not supported")))
        }
    })
}

/// The model's names for each input's dimensions (empty where unnamed).
fn dim_names(outlets: &[ort::value::Outlet]) -> Vec<(String, Vec<String>)> {
    outlets
        .iter()
        .map(|o| match o.dtype() {
            ValueType::Tensor { dimension_symbols, .. } => {
                (o.name().to_string(), dimension_symbols.to_vec())
            }
            _ => (o.name().to_string(), Vec::new()),
        })
        .collect()
}

fn specs(outlets: &[ort::value::Outlet], what: &str) -> Result<Vec<TensorSpec>> {
    outlets
        .iter()
        .map(|o| match o.dtype() {
            ValueType::Tensor { ty, shape, .. } => Ok(TensorSpec {
                name: o.name().to_string(),
                dtype: dtype_from_ort(*ty)
                    .map_err(|e| e.context(format!("model {what} '{}'", o.name())))?,
                shape: shape.iter().copied().collect(),
            }),
            other => Err(Error::unsupported(format!(
                "model {what} '{}' is a {other:?}, not a tensor",
                o.name()
            ))),
        })
        .collect()
}

pub struct OnnxEngine {
    _runtime: Arc<Runtime>,
    session: Session,
    sig: Signature,
    input_dims: Vec<(String, Vec<String>)>,
    /// GPU instances: inputs and outputs bound in GPU memory.
    gpu: Option<gpu::GpuIo>,
}

impl OnnxEngine {
    pub fn load(model_file: &Path, options: &EngineOptions<'_>) -> Result<OnnxEngine> {
        let cfg = options.config;
        let settings = OnnxSettings::from_config(cfg)?;
        let runtime = runtime(&settings, options.backend)?;
        // CUDA graphs: ONNX Runtime's CUDA provider on a GPU instance (not for the
        // load-time probe, which only reads the signature on the CPU)
        let mut buckets = match options.device {
            Device::Gpu(_) if !options.probe => cfg.cuda_graph_buckets()?,
            _ => None,
        };
        if buckets.is_some() && !cfg.gpu_accelerators.is_empty() {
            log::info!("model '{}': optimization.cuda.graphs applies to the CUDA execution provider; with a GPU accelerator it runs without", cfg.name);
            buckets = None;
        }
        let session = match build_session(
            &runtime,
            model_file,
            options,
            &settings,
            buckets.is_some(),
        ) {
            Ok(s) => s,
            Err(e) if buckets.is_some() => {
                // ONNX Runtime refuses a graph when a node runs outside the CUDA provider
                log::warn!("model '{}': ONNX Runtime cannot capture this model in CUDA graphs ({e}); it runs without", cfg.name);
                buckets = None;
                build_session(&runtime, model_file, options, &settings, false)?
            }
            Err(e) => return Err(e),
        };
        let inputs = specs(session.inputs(), "input")?;
        let outputs = specs(session.outputs(), "output")?;
        let input_dims = dim_names(session.inputs());
        if let (Device::Gpu(_), false) = (options.device, options.probe) {
            if let Some(t) = inputs.iter().chain(&outputs).find(|t| t.dtype == DataType::Bytes) {
                return Err(Error::unsupported(format!(
                    "model '{}' has the string (BYTES) tensor '{}'; ONNX Runtime keeps strings in host memory, so serve this model on KIND_CPU instances",
                    cfg.name, t.name
                )));
            }
        }
        let gpu = match options.device {
            Device::Gpu(id) if !options.probe => {
                Some(gpu::GpuIo::new(&session, id, cfg.batching(), buckets, &outputs)?)
            }
            _ => None,
        };
        Ok(OnnxEngine {
            _runtime: runtime,
            session,
            sig: Signature { inputs, outputs, device: options.device },
            input_dims,
            gpu,
        })
    }
}

fn build_session(
    runtime: &Runtime,
    model_file: &Path,
    options: &EngineOptions<'_>,
    settings: &OnnxSettings,
    cuda_graphs: bool,
) -> Result<Session> {
    let cfg = options.config;
    let mut builder = Session::builder(&runtime.env).map_err(ort_err)?;
    let level = match cfg.graph_optimization_level {
        Some(-1) => GraphOptimizationLevel::Level1,
        Some(1) => GraphOptimizationLevel::Level2,
        _ => GraphOptimizationLevel::Level3,
    };
    builder = builder.with_optimization_level(level).map_err(ort_err)?;
    if let Some(n) = settings.intra_op_threads {
        builder = builder.with_intra_threads(n).map_err(ort_err)?;
    }
    if let Some(n) = settings.inter_op_threads {
        builder = builder.with_inter_threads(n).map_err(ort_err)?;
    }
    if let Some(mode) = settings.execution_mode {
        builder = builder.with_parallel_execution(mode == 1).map_err(ort_err)?;
    }
    let providers = execution_providers(options, cuda_graphs)?;
    if !providers.is_empty() {
        builder = builder.with_execution_providers(providers).map_err(ort_err)?;
    }
    builder.commit_from_file(model_file).map_err(|e| {
        Error::invalid_arg(format!(
            "ONNX Runtime cannot load model file '{}': {e}",
            model_file.display()
        ))
    })
}

/// The execution providers an instance asks for, each checked against the loaded
/// ONNX Runtime so that a missing one is a clear load error, not a silent CPU run.
fn execution_providers(
    options: &EngineOptions<'_>,
    cuda_graphs: bool,
) -> Result<Vec<ep::ExecutionProviderDispatch>> {
    let mut out = Vec::new();
    let available = |ok: ort::Result<bool>, name: &str| -> Result<()> {
        if ok.map_err(ort_err)? {
            Ok(())
        } else {
            Err(Error::unavailable(format!(
                "{name} was asked for, but the ONNX Runtime loaded has no {name} (a CPU-only build?). \
                 Point onnxruntime-library at a GPU build, e.g. the stock image's {STOCK_LIBRARY}"
            )))
        }
    };
    let cfg = options.config;
    if let Device::Gpu(id) = options.device {
        for acc in &cfg.gpu_accelerators {
            match acc.name.as_str() {
                "tensorrt" => {
                    available(ep::TensorRT::is_available(), "the TensorRT execution provider")?;
                    let fp16 = acc.parameters.get("precision_mode").is_some_and(|p| p.eq_ignore_ascii_case("FP16"));
                    out.push(ep::TensorRT::default().with_device_id(id).with_fp16(fp16).build().error_on_failure());
                }
                "cuda" => {}
                other => {
                    return Err(Error::invalid_arg(format!(
                        "gpu_execution_accelerator '{other}' is not supported (use 'tensorrt' or 'cuda')"
                    )))
                }
            }
        }
        available(
            ep::CUDA::is_available(),
            "the CUDA execution provider (instance group KIND_GPU)",
        )?;
        out.push(
            ep::CUDA::default()
                .with_device_id(id)
                .with_cuda_graph(cuda_graphs)
                .build()
                .error_on_failure(),
        );
    }
    for acc in &cfg.cpu_accelerators {
        match acc.name.as_str() {
            "openvino" => {
                available(ep::OpenVINO::is_available(), "the OpenVINO execution provider")?;
                out.push(ep::OpenVINO::default().build().error_on_failure());
            }
            other => {
                return Err(Error::invalid_arg(format!(
                    "cpu_execution_accelerator '{other}' is not supported (use 'openvino')"
                )))
            }
        }
    }
    Ok(out)
}

/// Makes an ONNX Runtime tensor that borrows `bytes` (copied first only if misaligned).
fn input_value<'a>(
    t: &BatchTensor<'a>,
    bytes: &'a [u8],
    scratch: &'a mut Option<AlignedBuf>,
) -> Result<SessionInputValue<'a>> {
    let shape = t.shape.clone();
    let aligned: &'a [u8] = if bytes.as_ptr() as usize % 8 == 0 {
        bytes
    } else {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        buf.as_mut_slice().copy_from_slice(bytes);
        scratch.insert(buf).as_slice()
    };
    macro_rules! view {
        ($ty:ty) => {{
            let data: &[$ty] = bytemuck::try_cast_slice(aligned)
                .map_err(|e| Error::internal(format!("input '{}': {e}", t.name)))?;
            TensorRef::from_array_view((shape, data)).map_err(ort_err)?.into()
        }};
    }
    Ok(match t.dtype {
        DataType::F32 => view!(f32),
        DataType::F64 => view!(f64),
        DataType::F16 => view!(half::f16),
        DataType::Bf16 => view!(half::bf16),
        DataType::I8 => view!(i8),
        DataType::I16 => view!(i16),
        DataType::I32 => view!(i32),
        DataType::I64 => view!(i64),
        DataType::U8 => view!(u8),
        DataType::U16 => view!(u16),
        DataType::U32 => view!(u32),
        DataType::U64 => view!(u64),
        DataType::Bool => {
            if aligned.iter().any(|&b| b > 1) {
                return Err(Error::invalid_arg(format!(
                    "input '{}' is BOOL but holds a byte other than 0 or 1",
                    t.name
                )));
            }
            let v: Vec<bool> = aligned.iter().map(|&b| b == 1).collect();
            ort::value::Tensor::from_array((shape, v)).map_err(ort_err)?.into()
        }
        DataType::Bytes => {
            // checked per request (check_request): well-formed, UTF-8, no NUL
            let strings =
                decode_strings(aligned).map_err(|e| e.context(format!("input '{}'", t.name)))?;
            let strs = strings
                .iter()
                .map(|&s| {
                    String::from_utf8(s.to_vec())
                        .map_err(|e| Error::invalid_arg(format!("input '{}': {e}", t.name)))
                })
                .collect::<Result<Vec<String>>>()?;
            ort::value::Tensor::from_string_array((shape, &strs[..])).map_err(ort_err)?.into()
        }
    })
}

impl Engine for OnnxEngine {
    fn signature(&self) -> &Signature {
        &self.sig
    }

    fn accepts_device_inputs(&self) -> bool {
        self.gpu.is_some()
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

    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        if let Some(gpu) = self.gpu.as_mut() {
            return gpu.run(&mut self.session, inputs, outputs, &self.sig.outputs, sink);
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
        let lost = super::runtime_error(
            "ONNX Runtime run failed: CUDA failure 700: an illegal memory access was encountered"
                .into(),
        );
        assert_eq!(lost.kind(), ErrorKind::DeviceLost);
        let other = super::ort_err("Got invalid dimensions for input: X");
        assert_eq!(other.kind(), ErrorKind::Internal);
    }
}
