//! Engines: the things that run a model on a batch.
//!
//! One small trait, [`Engine`]; each engine is its own crate (`triton_rust_engine_onnx`,
//! `_torch`, `_embedding`) and the cdylib's [`EngineFactory`] names them all. Engines
//! know nothing of Triton: they take assembled [`BatchTensor`]s and hand each output
//! to a sink as a borrowed view, so the caller copies it straight into the responses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::batch::{BatchTensor, RequestTensor};
use crate::config::{ModelConfig, TensorSpec};
use crate::error::{Error, Result};
pub use crate::tensor::Device;
use crate::tensor::{Bytes, DataType};

/// One output of a run, borrowed from the engine until the sink returns.
pub struct OutputView<'a> {
    pub name: &'a str,
    pub dtype: DataType,
    pub shape: &'a [i64],
    /// Host or GPU memory: GPU outputs go device-to-device into a GPU response buffer
    /// when Triton offers one (ensembles keep tensors on the GPU), else to the host.
    pub data: Bytes<'a>,
}

/// What a loaded model takes and gives (full shapes, -1 where free), and where it runs.
pub struct Signature {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub device: Device,
}

pub trait Engine: Send {
    fn signature(&self) -> &Signature;
    /// Inputs as the model file declares them (full shapes, -1 where free).
    fn inputs(&self) -> &[TensorSpec] {
        &self.signature().inputs
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.signature().outputs
    }
    fn device(&self) -> Device {
        self.signature().device
    }
    /// Whether `run` can take inputs that live in GPU memory.
    fn accepts_device_inputs(&self) -> bool {
        false
    }
    /// Metrics this engine's model publishes on Triton's endpoint (shared by its instances).
    fn metrics_source(&self) -> Option<std::sync::Arc<dyn crate::telemetry::MetricsSource>> {
        None
    }
    /// Checks who is asking, from the request's parameters (key, value as text), before
    /// anything else is looked at; the error fails that request only.
    fn authorize(&self, _parameters: &[(String, String)]) -> Result<()> {
        Ok(())
    }
    /// Checks one request's inputs (already in config order and checked against the
    /// config) for what only this engine can see; the error fails that request only.
    fn check_request(&self, _inputs: &[RequestTensor<'_>]) -> Result<()> {
        Ok(())
    }
    /// Runs the model once on `inputs`, writing its one output into `out` (GPU memory with
    /// room for all of it) instead of a buffer of its own; `Ok(false)`, having done
    /// nothing, when it cannot (the caller then uses `run`). With it a recommender chain
    /// looks up one part of a batch while its network runs on the part before.
    fn run_into(
        &mut self,
        _inputs: &[BatchTensor<'_>],
        _out: &mut triton_rust_cuda::DeviceViewMut<'_>,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Where the responses of the last `run` took its outputs: all into host memory
    /// (`true`), or not. A GPU engine may then hand later outputs over in host memory,
    /// copied on its own stream before it waits for the model, instead of waiting first
    /// and copying each output after.
    fn outputs_landed(&mut self, _on_host: bool) {}
    /// Runs the model once on `inputs` and passes each of `outputs` to `sink`.
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()>;
}

/// What an engine may read when it is created.
pub struct EngineOptions<'a> {
    pub config: &'a ModelConfig,
    /// `--backend-config=rust,<key>=<value>` settings.
    pub backend: &'a BTreeMap<String, String>,
    pub device: Device,
    /// Created at model load only to read the model's tensors and validate the config:
    /// engines skip per-instance resources (the embedding engine's caches, GPU state),
    /// and the probe is dropped once it has been read.
    pub probe: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Onnx,
    /// The hierarchical embedding store; its "model file" is the version directory.
    Embedding,
    /// TorchScript through libtorch (the optional plugin).
    Torch,
    /// The embedding lookup feeding a dense network in one model (`chain.rs`); its
    /// "model file" is the version directory.
    Recommender,
}

impl EngineKind {
    fn default_file(self) -> &'static str {
        match self {
            EngineKind::Onnx => "model.onnx",
            EngineKind::Embedding | EngineKind::Recommender => "",
            EngineKind::Torch => "model.pt",
        }
    }
}

/// Picks the engine and model file for a model version directory: the `engine`
/// parameter if given, else from the file name (`default_model_filename` or the
/// engine's default file that exists).
pub fn select(config: &ModelConfig, version_dir: &Path) -> Result<(EngineKind, PathBuf)> {
    let kind = match config.parameters.get("engine").map(|s| s.trim().to_ascii_lowercase()) {
        Some(e) if e == "onnx" || e == "onnxruntime" => EngineKind::Onnx,
        Some(e) if e == "embedding" || e == "hps" => EngineKind::Embedding,
        Some(e) if e == "torch" || e == "torchscript" || e == "pytorch" => EngineKind::Torch,
        Some(e) if e == "recommender" => EngineKind::Recommender,
        Some(other) => {
            return Err(Error::unsupported(format!(
                "parameter 'engine' is '{other}'; this build of the rust backend has the engines: onnx, torch, embedding, recommender"
            )))
        }
        None => match config.default_model_filename.as_deref() {
            Some(f) if f.ends_with(".onnx") => EngineKind::Onnx,
            Some(f) if f.ends_with(".pt") || f.ends_with(".pth") => EngineKind::Torch,
            Some(f) => {
                return Err(Error::unsupported(format!(
                    "cannot tell the engine from default_model_filename '{f}'; set parameters {{ key: \"engine\" }}"
                )))
            }
            // no file named: whichever default file is there (model.onnx first)
            None if !version_dir.join("model.onnx").exists() && version_dir.join("model.pt").exists() => EngineKind::Torch,
            None => EngineKind::Onnx,
        },
    };
    if matches!(kind, EngineKind::Embedding | EngineKind::Recommender) {
        if !version_dir.is_dir() {
            return Err(Error::not_found(format!(
                "model version directory '{}' not found",
                version_dir.display()
            )));
        }
        return Ok((kind, version_dir.to_path_buf()));
    }
    let file =
        version_dir.join(config.default_model_filename.as_deref().unwrap_or(kind.default_file()));
    if !file.is_file() {
        return Err(Error::not_found(format!("model file '{}' not found", file.display())));
    }
    Ok((kind, file))
}

/// Makes engines: the one place that knows every engine crate (the cdylib's).
pub trait EngineFactory: Send + Sync {
    fn create(
        &self,
        kind: EngineKind,
        model_file: &Path,
        options: &EngineOptions<'_>,
    ) -> Result<Box<dyn Engine>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_names_missing_file_and_unknown_engine() {
        let dir = std::env::temp_dir().join(format!("trt-select-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = ModelConfig::default();
        let e = select(&cfg, &dir).unwrap_err();
        assert!(e.message().contains("model.onnx") && e.message().contains("not found"), "{e}");
        std::fs::write(dir.join("model.onnx"), b"x").unwrap();
        assert_eq!(select(&cfg, &dir).unwrap().0, EngineKind::Onnx);
        let mut cfg2 = ModelConfig::default();
        cfg2.parameters.insert("engine".into(), "tensorflow".into());
        assert!(select(&cfg2, &dir).unwrap_err().message().contains("tensorflow"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
