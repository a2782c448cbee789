//! Engines: the things that run a model on a batch.
//!
//! One small trait, [`Engine`], and [`Lookup`] for what only a store lookup offers; each
//! engine is its own crate (`triton_rust_engine_onnx`, `_torch`, `_embedding`,
//! `_recommender`) and the cdylib's [`EngineFactory`] names them all, each with the
//! [`EngineClaim`] saying which models it serves. Engines
//! know nothing of Triton: they take assembled [`BatchTensor`]s and hand each output
//! to a sink as a borrowed view, so the caller copies it straight into the responses.

use std::path::{Path, PathBuf};

use crate::batch::{BatchTensor, RequestTensor};
use crate::config::{ModelConfig, TensorSpec};
use crate::error::{Error, Result};
use crate::settings::{BackendSettings, CoreSettings, Known};
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
    /// Whether `run` can take inputs that live in GPU memory.
    fn accepts_device_inputs(&self) -> bool {
        false
    }
    /// Metrics this engine's model publishes on Triton's endpoint (shared by its instances).
    fn metrics_source(&self) -> Option<std::sync::Arc<dyn crate::telemetry::MetricsSource>> {
        None
    }
    /// Checks one request's inputs (already in config order and checked against the
    /// config) for what only this engine can see; the error fails that request only.
    fn check_request(&self, _inputs: &[RequestTensor<'_>]) -> Result<()> {
        Ok(())
    }
    /// Where the responses of the last `run` took its outputs: all into host memory
    /// (`true`), or not. A GPU engine may then hand later outputs over in host memory,
    /// copied on its own stream before it waits for the model, instead of waiting first
    /// and copying each output after.
    fn outputs_landed(&mut self, _on_host: bool) {}
    /// The embedding store's hooks, for an engine that is a store lookup.
    fn lookup(&mut self) -> Option<&mut dyn Lookup> {
        None
    }
    /// Where this engine's CUDA graph for a batch of `inputs` (as `run` would take them;
    /// their data unread) reads input `name`: that input's bytes for this batch in the
    /// graph's own GPU memory, for a caller to write and pass to `run` as that input, which
    /// then copies nothing for it. `None` when no graph already captured would run such a
    /// batch. The memory is the engine's: the view stays valid while the engine lives, and
    /// may be written only while none of its runs is in flight.
    fn graph_input(
        &self,
        _inputs: &[BatchTensor<'_>],
        _name: &str,
    ) -> Option<crate::tensor::DeviceViewMut<'static>> {
        None
    }
    /// Runs the model once on `inputs` and passes each of `outputs` to `sink`.
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()>;
}

impl dyn Engine + '_ {
    /// Inputs as the model file declares them (full shapes, -1 where free).
    pub fn inputs(&self) -> &[TensorSpec] {
        &self.signature().inputs
    }
    pub fn outputs(&self) -> &[TensorSpec] {
        &self.signature().outputs
    }
    pub fn device(&self) -> Device {
        self.signature().device
    }
}

/// What an embedding-store lookup offers beyond [`Engine`].
pub trait Lookup {
    /// Checks who is asking, from the request's parameters (key, value as text), before
    /// anything else is looked at; the error fails that request only.
    fn authorize(&self, _parameters: &[(String, String)]) -> Result<()> {
        Ok(())
    }
    /// Runs the lookup once on `inputs`, writing its one output into `out` (GPU memory with
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
}

/// What an engine may read when it is created.
pub struct EngineOptions<'a> {
    pub config: &'a ModelConfig,
    pub backend: &'a BackendSettings,
    pub device: Device,
    /// Created at model load only to read the model's tensors and validate the config:
    /// engines skip per-instance resources (the embedding engine's caches, GPU state),
    /// and the probe is dropped once it has been read.
    pub probe: bool,
}

/// What one engine serves: the names the `engine` parameter may give it, the model file
/// it reads, and the model parameters it knows. The factory lists one per engine crate.
#[derive(Debug)]
pub struct EngineClaim {
    /// The engine's name (in logs and errors), then the other spellings `engine` accepts.
    pub names: &'static [&'static str],
    /// The model file's name in the version directory when the config names none;
    /// `None`: the model is the version directory itself (chosen only by `engine`).
    pub default_file: Option<&'static str>,
    /// Endings of `default_model_filename` that mean this engine.
    pub file_suffixes: &'static [&'static str],
    /// The model parameters it reads.
    pub parameters: &'static [Known],
    /// Engines it builds on, whose parameters apply to its models too.
    pub builds_on: &'static [&'static str],
    /// Whether it serves `sequence_batching`.
    pub keeps_sequences: bool,
    /// Whether its load-time probe is a whole engine a CPU instance may take over.
    pub probe_serves: bool,
}

impl EngineClaim {
    pub fn name(&self) -> &'static str {
        self.names[0]
    }
}

/// The claim for a file name, by its ending.
pub fn claim_for_file<'c>(claims: &'c [EngineClaim], file: &str) -> Option<&'c EngineClaim> {
    claims.iter().find(|c| c.file_suffixes.iter().any(|s| file.ends_with(s)))
}

/// The parameters known for a model served by `claim`: its own, those of the engines it
/// builds on, and the core's.
pub fn known_parameters<'c>(claims: &'c [EngineClaim], claim: &'c EngineClaim) -> Vec<&'c [Known]> {
    let mut known = vec![CoreSettings::KNOWN, claim.parameters];
    known.extend(
        claims.iter().filter(|c| claim.builds_on.contains(&c.name())).map(|c| c.parameters),
    );
    known
}

/// Picks the engine and model file for a model version directory: the `engine`
/// parameter if given, else the config's `platform` where an engine has that name
/// (Triton's `torch_aoti`), else from the file name (`default_model_filename`, or the first
/// engine whose default file is there, else the first engine's).
pub fn select<'c>(
    claims: &'c [EngineClaim],
    config: &ModelConfig,
    engine: Option<&str>,
    version_dir: &Path,
) -> Result<(&'c EngineClaim, PathBuf)> {
    let names = || claims.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ");
    let platform =
        config.platform.as_deref().filter(|p| claims.iter().any(|c| c.names.contains(p)));
    let claim = match engine.or(platform) {
        Some(e) => claims.iter().find(|c| c.names.contains(&e)).ok_or_else(|| {
            Error::unsupported(format!(
                "parameter 'engine' is '{e}'; this build of the rust backend has the engines: {}",
                names()
            ))
        })?,
        None => match config.default_model_filename.as_deref() {
            Some(f) => claim_for_file(claims, f).ok_or_else(|| {
                Error::unsupported(format!(
                    "cannot tell the engine from default_model_filename '{f}'; set parameters {{ key: \"engine\" }}"
                ))
            })?,
            None => {
                let with_file = || claims.iter().filter_map(|c| Some((c, c.default_file?)));
                with_file()
                    .find(|(_, f)| version_dir.join(f).exists())
                    .or_else(|| with_file().next())
                    .ok_or_else(|| Error::unsupported("no engine reads a model file"))?
                    .0
            }
        },
    };
    let Some(default_file) = claim.default_file else {
        if !version_dir.is_dir() {
            return Err(Error::not_found(format!(
                "model version directory '{}' not found",
                version_dir.display()
            )));
        }
        return Ok((claim, version_dir.to_path_buf()));
    };
    let file = version_dir.join(config.default_model_filename.as_deref().unwrap_or(default_file));
    if !file.is_file() {
        return Err(Error::not_found(format!("model file '{}' not found", file.display())));
    }
    Ok((claim, file))
}

/// Makes engines: the one place that knows every engine crate (the cdylib's).
pub trait EngineFactory: Send + Sync {
    /// The engines this build serves, in the order a model file is looked for.
    fn claims(&self) -> &'static [EngineClaim];
    /// Makes the engine named `engine` (a claim's name).
    fn create(
        &self,
        engine: &str,
        model_file: &Path,
        options: &EngineOptions<'_>,
    ) -> Result<Box<dyn Engine>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLAIMS: &[EngineClaim] = &[
        EngineClaim {
            names: &["onnx", "onnxruntime"],
            default_file: Some("model.onnx"),
            file_suffixes: &[".onnx"],
            parameters: &[("intra_op_thread_count", "")],
            builds_on: &[],
            keeps_sequences: true,
            probe_serves: true,
        },
        EngineClaim {
            names: &["torch"],
            default_file: Some("model.pt"),
            file_suffixes: &[".pt", ".pth"],
            parameters: &[],
            builds_on: &[],
            keeps_sequences: true,
            probe_serves: false,
        },
        EngineClaim {
            names: &["chain"],
            default_file: None,
            file_suffixes: &[],
            parameters: &[("x", "")],
            builds_on: &["onnx"],
            keeps_sequences: false,
            probe_serves: false,
        },
    ];

    #[test]
    fn select_names_missing_file_and_unknown_engine() {
        let dir = std::env::temp_dir().join(format!("trt-select-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = ModelConfig::default();
        let e = select(CLAIMS, &cfg, None, &dir).unwrap_err();
        assert!(e.message().contains("model.onnx") && e.message().contains("not found"), "{e}");
        std::fs::write(dir.join("model.pt"), b"x").unwrap();
        assert_eq!(select(CLAIMS, &cfg, None, &dir).unwrap().0.name(), "torch");
        std::fs::write(dir.join("model.onnx"), b"x").unwrap();
        assert_eq!(select(CLAIMS, &cfg, None, &dir).unwrap().0.name(), "onnx");
        assert_eq!(select(CLAIMS, &cfg, Some("onnxruntime"), &dir).unwrap().0.name(), "onnx");
        let (c, file) = select(CLAIMS, &cfg, Some("chain"), &dir).unwrap();
        assert_eq!((c.name(), file), ("chain", dir.clone()));
        let e = select(CLAIMS, &cfg, Some("tensorflow"), &dir).unwrap_err();
        assert!(e.message().contains("tensorflow") && e.message().contains("onnx, torch, chain"));
        let named =
            ModelConfig { default_model_filename: Some("net.pth".into()), ..Default::default() };
        assert!(select(CLAIMS, &named, None, &dir).unwrap_err().message().contains("net.pth"));
        std::fs::write(dir.join("net.pth"), b"x").unwrap();
        assert_eq!(select(CLAIMS, &named, None, &dir).unwrap().0.name(), "torch");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn known_parameters_take_in_what_an_engine_builds_on() {
        let known = known_parameters(CLAIMS, &CLAIMS[2]);
        let names: Vec<&str> = known.iter().flat_map(|k| k.iter().map(|(n, _)| *n)).collect();
        assert!(["x", "intra_op_thread_count", "engine", "valid_range"]
            .iter()
            .all(|n| names.contains(n)));
    }
}
