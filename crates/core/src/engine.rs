//! Engines: the things that load a model and run it on a batch.
//!
//! Each engine crate offers an [`EngineKind`]: its [`EngineClaim`] (which models it serves)
//! and a load that returns a [`LoadedModel`] (settings parsed once, what the instances
//! share), which makes one [`Engine`] per instance (what varies per instance: the run).
//! The cdylib lists the kinds ([`EngineKinds`]). Engines know nothing of Triton: they take
//! assembled [`BatchTensor`]s and hand each output to a sink as a borrowed view, so the
//! caller copies it straight into the responses.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::batch::{BatchTensor, RequestTensor};
use crate::config::{ModelConfig, TensorSpec};
use crate::error::{Error, Result};
use crate::settings::{BackendSettings, CoreSettings, Known};
use crate::telemetry::MetricsSource;
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

/// What a loaded model takes and gives (full shapes, -1 where free).
#[derive(Debug, Clone, Default)]
pub struct Signature {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

/// One instance's runner: what varies per instance (its device's resources, the model
/// loaded there) and what a run hands back. Made by [`LoadedModel::instance`].
pub trait Engine: Send {
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

/// A model, loaded: its settings parsed once, what its instances share (a store, a
/// runtime, a plugin, what the model file says of itself), and the answers that do not
/// depend on an instance. Made once per model by [`EngineKind::load`]; it makes one
/// [`Engine`] per instance.
pub trait LoadedModel: Send + Sync {
    fn signature(&self) -> &Signature;
    /// Whether an instance on `device` takes inputs that live in GPU memory where they are.
    fn accepts_device_inputs(&self, _device: Device) -> bool {
        false
    }
    /// Metrics the model publishes on Triton's endpoint (shared by its instances).
    fn metrics_source(&self) -> Option<Arc<dyn MetricsSource>> {
        None
    }
    /// Checks who is asking, from the request's parameters (key, value as text), before
    /// anything else is looked at; the error fails that request only.
    fn authorize(&self, _parameters: &[(String, String)]) -> Result<()> {
        Ok(())
    }
    /// Checks one request's inputs (already in config order and checked against the
    /// config) for what only this model can see; the error fails that request only.
    fn check_request(&self, _inputs: &[RequestTensor<'_>]) -> Result<()> {
        Ok(())
    }
    /// The rows (samples) one request adds to its batch, where the request's inputs say so
    /// rather than its first dimension: a request of ragged inputs only has a batch size of 1
    /// in Triton's terms, but may carry many samples (the embedding engine's `LENGTHS` of
    /// `[samples × tables]`). Its outputs are scattered by these rows. Asked of a request that
    /// passed [`LoadedModel::check_request`]; `None`: the first dimension, as Triton counts.
    fn request_rows(&self, _inputs: &[RequestTensor<'_>]) -> Option<usize> {
        None
    }
    /// The runner of one instance on `device`, made from what the load derived from the
    /// model's final config (an instance is given no config to derive anything again).
    fn instance(&self, device: Device) -> Result<Box<dyn Engine>>;
}

impl dyn LoadedModel + '_ {
    /// Inputs as the model declares them (full shapes, -1 where free).
    pub fn inputs(&self) -> &[TensorSpec] {
        &self.signature().inputs
    }
    pub fn outputs(&self) -> &[TensorSpec] {
        &self.signature().outputs
    }
}

/// What a model's description and load may read.
pub struct ModelLoad<'a> {
    /// The config: as written when describing, final (auto-completed) when loading.
    pub config: &'a ModelConfig,
    pub backend: &'a BackendSettings,
    /// The model file, or the version directory for an engine whose claim has no file.
    pub model_file: &'a Path,
    /// What the backend keeps for all its models.
    pub shared: &'a Shared,
    /// What the description opened (a session, parsed settings), for the load to take
    /// instead of opening it again.
    pub opened: &'a Opened,
}

/// What a model's description opened, kept for its load (one value of each type: an engine
/// that builds on another, the recommender on its network's, keeps its own beside it).
#[derive(Default)]
pub struct Opened(Mutex<Vec<Box<dyn Any + Send>>>);

impl Opened {
    /// Keeps `value` for the load (replacing one of its type).
    pub fn keep<T: Any + Send>(&self, value: T) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|v| !v.is::<T>());
        all.push(Box::new(value));
    }
    /// The value of type `T` the description kept, taken.
    pub fn take<T: Any + Send>(&self) -> Option<T> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let at = all.iter().position(|v| v.is::<T>())?;
        all.swap_remove(at).downcast::<T>().ok().map(|b| *b)
    }
}

/// An engine crate's offer: the models it claims and how it loads one.
///
/// A load runs in Triton's order: the kind describes the model from its file and the config
/// as written (`describe`), the server auto-completes the config from that description, and
/// the kind loads the model once on the final config (`load`), taking what the description
/// opened (`ModelLoad::opened`). Models whose config lists their tensors are not described.
pub trait EngineKind: Send + Sync {
    fn claim(&self) -> &'static EngineClaim;
    /// What the model says of itself before its config is complete: its signature, for
    /// auto-complete to fill the config from; `None` when the config is its only source.
    fn describe(&self, load: &ModelLoad<'_>) -> Result<Option<Signature>>;
    /// Loads the model on its final config.
    fn load(&self, load: &ModelLoad<'_>) -> Result<Box<dyn LoadedModel>>;
}

/// Declares an engine's kind: a unit struct whose claim is the static `$claim`, whose
/// description is `$model::describe(&ModelLoad) -> Result<Option<Signature>>` and whose load
/// is `$model::load(&ModelLoad) -> Result<$model>`, the model boxed as a [`LoadedModel`].
///
/// ```ignore
/// triton_rust_core::engine_kind!(
///     /// The ONNX Runtime engine kind.
///     OnnxKind, CLAIM, OnnxModel
/// );
/// ```
#[macro_export]
macro_rules! engine_kind {
    ($(#[$doc:meta])* $kind:ident, $claim:path, $model:ty) => {
        $(#[$doc])*
        pub struct $kind;

        impl $crate::engine::EngineKind for $kind {
            fn claim(&self) -> &'static $crate::engine::EngineClaim {
                &$claim
            }
            fn describe(
                &self,
                load: &$crate::engine::ModelLoad<'_>,
            ) -> $crate::error::Result<Option<$crate::engine::Signature>> {
                <$model>::describe(load)
            }
            fn load(
                &self,
                load: &$crate::engine::ModelLoad<'_>,
            ) -> $crate::error::Result<Box<dyn $crate::engine::LoadedModel>> {
                Ok(Box::new(<$model>::load(load)?))
            }
        }
    };
}

/// What the backend keeps across its models for the engines (one value of each type, made
/// on first use, e.g. the embedding stores shared by name), dropped with the backend.
#[derive(Default)]
pub struct Shared(Mutex<Vec<Arc<dyn Any + Send + Sync>>>);

impl Shared {
    /// The backend's one `T`.
    pub fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = all.iter().find_map(|v| v.clone().downcast::<T>().ok()) {
            return t;
        }
        let t = Arc::new(T::default());
        all.push(t.clone());
        t
    }
}

/// The engine kinds of this build, in the order a model file is looked for, and what the
/// backend keeps for them.
pub struct EngineKinds {
    kinds: Vec<Box<dyn EngineKind>>,
    claims: Vec<&'static EngineClaim>,
    shared: Shared,
}

impl EngineKinds {
    pub fn new(kinds: Vec<Box<dyn EngineKind>>) -> EngineKinds {
        let claims = kinds.iter().map(|k| k.claim()).collect();
        EngineKinds { kinds, claims, shared: Shared::default() }
    }
    pub fn claims(&self) -> &[&'static EngineClaim] {
        &self.claims
    }
    /// The environment variables the engines read, each once.
    pub fn environment(&self) -> Vec<&'static str> {
        let mut vars: Vec<&'static str> =
            self.claims.iter().flat_map(|c| c.environment.iter().copied()).collect();
        vars.sort_unstable();
        vars.dedup();
        vars
    }
    /// The kind that claims `claim`.
    pub fn kind(&self, claim: &EngineClaim) -> Result<&dyn EngineKind> {
        self.kinds
            .iter()
            .find(|k| std::ptr::eq(k.claim(), claim))
            .map(|k| k.as_ref())
            .ok_or_else(|| Error::internal(format!("no engine is named '{}'", claim.name())))
    }
    /// What the backend keeps for all its models.
    pub fn shared(&self) -> &Shared {
        &self.shared
    }
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
    /// The backend settings it reads (`--backend-config=rust,<key>=<value>`).
    pub backend_keys: &'static [Known],
    /// The environment variables it reads (read once, when the backend starts).
    pub environment: &'static [&'static str],
    /// Engines it builds on, whose parameters apply to its models too.
    pub builds_on: &'static [&'static str],
    /// Whether it serves `sequence_batching`.
    pub keeps_sequences: bool,
}

impl EngineClaim {
    pub fn name(&self) -> &'static str {
        self.names[0]
    }
}

/// The claim for a file name, by its ending.
pub fn claim_for_file(claims: &[&'static EngineClaim], file: &str) -> Option<&'static EngineClaim> {
    claims.iter().copied().find(|c| c.file_suffixes.iter().any(|s| file.ends_with(s)))
}

/// The parameters known for a model served by `claim`: its own, those of the engines it
/// builds on, and the core's.
pub fn known_parameters(
    claims: &[&'static EngineClaim],
    claim: &EngineClaim,
) -> Vec<&'static [Known]> {
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
pub fn select(
    claims: &[&'static EngineClaim],
    config: &ModelConfig,
    engine: Option<&str>,
    version_dir: &Path,
) -> Result<(&'static EngineClaim, PathBuf)> {
    let names = || claims.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ");
    let platform =
        config.platform.as_deref().filter(|p| claims.iter().any(|c| c.names.contains(p)));
    let claim = match engine.or(platform) {
        Some(e) => claims.iter().copied().find(|c| c.names.contains(&e)).ok_or_else(|| {
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
                let with_file = || claims.iter().copied().filter_map(|c| Some((c, c.default_file?)));
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

#[cfg(test)]
mod tests {
    use super::*;

    static CLAIM_LIST: &[EngineClaim] = &[
        EngineClaim {
            names: &["onnx", "onnxruntime"],
            default_file: Some("model.onnx"),
            file_suffixes: &[".onnx"],
            parameters: &[("intra_op_thread_count", "")],
            backend_keys: &[],
            environment: &[],
            builds_on: &[],
            keeps_sequences: true,
        },
        EngineClaim {
            names: &["torch"],
            default_file: Some("model.pt"),
            file_suffixes: &[".pt", ".pth"],
            parameters: &[],
            backend_keys: &[],
            environment: &[],
            builds_on: &[],
            keeps_sequences: true,
        },
        EngineClaim {
            names: &["chain"],
            default_file: None,
            file_suffixes: &[],
            parameters: &[("x", "")],
            backend_keys: &[],
            environment: &[],
            builds_on: &["onnx"],
            keeps_sequences: false,
        },
    ];

    static CLAIMS: &[&EngineClaim] = &[&CLAIM_LIST[0], &CLAIM_LIST[1], &CLAIM_LIST[2]];

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
        let known = known_parameters(CLAIMS, CLAIMS[2]);
        let names: Vec<&str> = known.iter().flat_map(|k| k.iter().map(|(n, _)| *n)).collect();
        assert!(["x", "intra_op_thread_count", "engine", "valid_range"]
            .iter()
            .all(|n| names.contains(n)));
    }
}
