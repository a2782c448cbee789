//! ONNX Runtime sessions: made with the model's settings and execution providers, their
//! tensors read as ours, and our bytes handed to them.

use std::path::Path;

use ort::ep::{self, ExecutionProvider};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::{TensorElementType, TensorRef, ValueType};

use triton_rust_core::batch::BatchTensor;
use triton_rust_core::config::{ModelConfig, TensorSpec};
use triton_rust_core::engine::Device;
use triton_rust_core::error::{Error, Result};
use triton_rust_core::tensor::{decode_strings, AlignedBuf, DataType};

use crate::runtime::{ort_err, Runtime, STOCK_LIBRARY};
use crate::settings::OnnxSettings;

pub(crate) fn dtype_from_ort(t: TensorElementType) -> Result<DataType> {
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
pub(crate) fn dim_names(outlets: &[ort::value::Outlet]) -> Vec<(String, Vec<String>)> {
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

pub(crate) fn specs(outlets: &[ort::value::Outlet], what: &str) -> Result<Vec<TensorSpec>> {
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

pub(crate) fn build_session(
    runtime: &Runtime,
    model_file: &Path,
    cfg: &ModelConfig,
    device: Device,
    settings: &OnnxSettings,
    cuda_graphs: bool,
) -> Result<Session> {
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
    let providers = execution_providers(settings, device, cuda_graphs)?;
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

/// Fails unless the loaded ONNX Runtime has `name`'s provider (`ok`): a missing one is a
/// clear load error, not a silent CPU run.
fn available(ok: ort::Result<bool>, name: &str) -> Result<()> {
    if ok.map_err(ort_err)? {
        Ok(())
    } else {
        Err(Error::unavailable(format!(
            "{name} was asked for, but the ONNX Runtime loaded has no {name} (a CPU-only build?). \
             Point onnxruntime-library at a GPU build, e.g. the stock image's {STOCK_LIBRARY}"
        )))
    }
}

/// Checks once, at load, that the loaded ONNX Runtime has the accelerators the config asks
/// for: TensorRT where GPU instances may come, OpenVINO for every instance.
pub(crate) fn check_accelerators(settings: &OnnxSettings, gpu_instances: bool) -> Result<()> {
    if settings.tensorrt.is_some() && gpu_instances {
        available(ep::TensorRT::is_available(), "the TensorRT execution provider")?;
    }
    if settings.openvino {
        available(ep::OpenVINO::is_available(), "the OpenVINO execution provider")?;
    }
    Ok(())
}

/// The execution providers an instance on `device` asks for (the accelerators checked at
/// load; the CUDA provider here, for a GPU instance).
fn execution_providers(
    settings: &OnnxSettings,
    device: Device,
    cuda_graphs: bool,
) -> Result<Vec<ep::ExecutionProviderDispatch>> {
    let mut out = Vec::new();
    if let Device::Gpu(id) = device {
        if let Some(fp16) = settings.tensorrt {
            out.push(
                ep::TensorRT::default()
                    .with_device_id(id)
                    .with_fp16(fp16)
                    .build()
                    .error_on_failure(),
            );
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
    if settings.openvino {
        out.push(ep::OpenVINO::default().build().error_on_failure());
    }
    Ok(out)
}

/// Makes an ONNX Runtime tensor that borrows `bytes` (copied first only if misaligned).
pub(crate) fn input_value<'a>(
    t: &BatchTensor<'a>,
    bytes: &'a [u8],
    scratch: &'a mut Option<AlignedBuf>,
) -> Result<SessionInputValue<'a>> {
    let shape = t.shape.clone();
    let aligned: &'a [u8] = if (bytes.as_ptr() as usize).is_multiple_of(8) {
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
