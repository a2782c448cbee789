//! The ONNX engine's model parameters, read once at load.

use std::path::PathBuf;

use triton_rust_core::config::ModelConfig;
use triton_rust_core::error::{Error, Result};
use triton_rust_core::settings::Known;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct OnnxSettings {
    /// `onnxruntime_library`: this model's ONNX Runtime (one per process).
    pub library: Option<PathBuf>,
    /// `intra_op_thread_count`, `inter_op_thread_count`: ONNX Runtime's thread pools.
    pub intra_op_threads: Option<usize>,
    pub inter_op_threads: Option<usize>,
    /// `execution_mode`: 1 runs independent nodes in parallel.
    pub execution_mode: Option<usize>,
    /// The config's `gpu_execution_accelerator` TensorRT, in FP16 or not (`cuda` is the
    /// GPU instances' own provider).
    pub tensorrt: Option<bool>,
    /// The config's `cpu_execution_accelerator` OpenVINO.
    pub openvino: bool,
}

triton_rust_core::parameters! {
    /// The ONNX engine's model parameters, as config.pbtxt spells them.
    pub struct OnnxParams {
        onnxruntime_library: Option<PathBuf> = None, doc "the backend's";
        intra_op_thread_count: Option<usize> = None, doc "the runtime's";
        inter_op_thread_count: Option<usize> = None, doc "the runtime's";
        execution_mode: Option<usize> = None, doc "0";
    }
}

triton_rust_core::parameters! {
    /// The ONNX engine's backend setting (`--backend-config=rust,<key>=<value>`).
    pub struct OnnxBackend {
        #[serde(rename = "onnxruntime-library")]
        onnxruntime_library: Option<PathBuf> = None, doc "none";
    }
}

impl OnnxSettings {
    pub const KNOWN: &'static [Known] = OnnxParams::KNOWN;

    pub fn from_config(cfg: &ModelConfig) -> Result<OnnxSettings> {
        let mut tensorrt = None;
        for acc in &cfg.gpu_accelerators {
            match acc.name.as_str() {
                "tensorrt" => {
                    let mode = acc.parameters.get("precision_mode");
                    tensorrt = Some(mode.is_some_and(|p| p.eq_ignore_ascii_case("FP16")));
                }
                "cuda" => {}
                other => {
                    return Err(Error::invalid_arg(format!(
                        "gpu_execution_accelerator '{other}' is not supported (use 'tensorrt' or 'cuda')"
                    )))
                }
            }
        }
        let mut openvino = false;
        for acc in &cfg.cpu_accelerators {
            match acc.name.as_str() {
                "openvino" => openvino = true,
                other => {
                    return Err(Error::invalid_arg(format!(
                        "cpu_execution_accelerator '{other}' is not supported (use 'openvino')"
                    )))
                }
            }
        }
        let p: OnnxParams = triton_rust_core::params::read(&cfg.parameters)?;
        Ok(OnnxSettings {
            library: p.onnxruntime_library,
            intra_op_threads: p.intra_op_thread_count,
            inter_op_threads: p.inter_op_thread_count,
            execution_mode: p.execution_mode,
            tensorrt,
            openvino,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use triton_rust_core::settings::check_section;

    #[test]
    fn read_once_and_documented() {
        let mut cfg = ModelConfig::default();
        cfg.parameters.insert("intra_op_thread_count".into(), "2".into());
        let s = OnnxSettings::from_config(&cfg).unwrap();
        assert_eq!((s.intra_op_threads, s.inter_op_threads, s.library), (Some(2), None, None));
        cfg.parameters.insert("execution_mode".into(), "x".into());
        let e = OnnxSettings::from_config(&cfg).unwrap_err();
        assert!(e.message().contains("'execution_mode'"), "{e}");
        let doc = include_str!("../../../docs/settings.md");
        check_section(doc, "ONNX engine", OnnxSettings::KNOWN).unwrap();
    }
}
