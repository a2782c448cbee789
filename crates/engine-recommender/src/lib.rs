//! Two loaded models as one: the recommender's single-model path. The embedding store's
//! lookup (an embedding model with the batched interface, opened from typed settings)
//! writes the embeddings the dense network (an ONNX, TorchScript or AOTInductor model)
//! reads, inside the backend: no trip through Triton between them, one model to
//! configure, load and version. The chain of one instance is `chain.rs`.
//!
//! A model with `parameters { key: "engine" value { string_value: "recommender" } }`
//! holds its tables under `<version>/tables/` (as an embedding model) and its dense
//! network as `<version>/dense.onnx`, `<version>/dense.pt` or `<version>/dense.pt2`. Its config lists the
//! clients' inputs (the keys, `recommender_sparse_input`, default `sparse`, INT64
//! `[tables]`, and the dense features) and the network's outputs; the network's input
//! that takes the embeddings is `recommender_embeddings_input` (default `embeddings`,
//! `[tables, dim]` of `recommender_embeddings_type`: `TYPE_FP32`, the default, or
//! `TYPE_FP16` for an fp16 network: the lookup then writes fp16 rows, half the bytes,
//! and the network has nothing to cast). Every embedding-store parameter applies as for an embedding
//! model. On a GPU instance the lookup writes the rows into its own device buffer (every
//! table in one pass) and the network reads that buffer as its input, in place: the
//! embeddings never leave the GPU and never pass through Triton. Where the network replays
//! a CUDA graph already captured for the batch's shape and offers that graph's own input
//! (`Network::graph_input`: the AOTInductor engine does), the lookup writes into it instead,
//! and the replay copies nothing for them. The network's other
//! inputs (the dense features, in host memory) go to the GPU on a thread of their own
//! while the lookup runs, when a [`Stager`] is given and they are large enough to pay
//! for the thread.
//!
//! `recommender_pipeline_parts: P` (default 1) runs a large batch on a GPU instance in P
//! parts: the lookup of part k+1 runs while the network runs on part k (the lookup moves
//! keys over PCIe and rows through HBM, the network keeps the tensor cores busy), each
//! part's rows written into one buffer of the chain's, the network's outputs gathered in
//! order into one response. Batches under P × 1024 rows run whole.

mod chain;
mod sequences;
mod settings;

pub use chain::{Chain, Joint, LookupStep, Network, Stager};
pub use sequences::{SequenceKind, SequenceModel, SequenceParams, SEQUENCE_CLAIM};
pub use settings::{plan, ChainPlan, RecommenderSettings};

use std::sync::Arc;

use triton_rust_core::batch::{BatchTensor, RequestTensor};
use triton_rust_core::config::ModelConfig;
use triton_rust_core::engine::{Device, Engine, EngineClaim, LoadedModel, ModelLoad, Signature};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::telemetry::MetricsSource;
use triton_rust_cuda::upload::Staged;
use triton_rust_cuda::DeviceView;
use triton_rust_engine_aoti::{AotiEngine, AotiModel, HAND_OVER_PARAM};
use triton_rust_engine_embedding::{EmbeddingEngine, EmbeddingModel, Interface, StoreSettings};
use triton_rust_engine_onnx::{OnnxEngine, OnnxModel};
use triton_rust_engine_torch::{TorchEngine, TorchModel};

/// Recommenders: a version directory of tables and a dense network.
pub static CLAIM: EngineClaim = EngineClaim {
    names: &["recommender"],
    default_file: None,
    file_suffixes: &[],
    parameters: RecommenderSettings::KNOWN,
    backend_keys: &[],
    environment: &[],
    builds_on: &["embedding", "onnx", "torch", "aoti"],
    keeps_sequences: false,
};

/// The engines a dense network may be served by, by its file's name.
static DENSE: &[&EngineClaim] = &[
    &triton_rust_engine_onnx::CLAIM,
    &triton_rust_engine_torch::CLAIM,
    &triton_rust_engine_aoti::CLAIM,
];

triton_rust_core::engine_kind!(
    /// The recommender engine kind.
    RecommenderKind, CLAIM, RecommenderModel
);

/// The dense network, loaded by its engine.
enum DenseModel {
    Onnx(OnnxModel),
    Torch(TorchModel),
    Aoti(AotiModel),
}

impl DenseModel {
    fn load(plan: &ChainPlan, load: &ModelLoad<'_>) -> Result<DenseModel> {
        let load = ModelLoad { config: &plan.dense_config, model_file: &plan.dense_file, ..*load };
        Ok(match plan.dense_engine {
            "onnx" => DenseModel::Onnx(OnnxModel::load(&load)?),
            "torch" => DenseModel::Torch(TorchModel::load(&load)?),
            "aoti" => DenseModel::Aoti(AotiModel::load(&load)?),
            other => {
                return Err(Error::internal(format!(
                    "the recommender has no network engine named '{other}' (DENSE lists onnx, torch and aoti)"
                )))
            }
        })
    }

    fn model(&self) -> &dyn LoadedModel {
        match self {
            DenseModel::Onnx(m) => m,
            DenseModel::Torch(m) => m,
            DenseModel::Aoti(m) => m,
        }
    }

    fn network(&self, device: Device) -> Result<Box<dyn Network>> {
        Ok(match self {
            DenseModel::Onnx(m) => Box::new(m.engine(device)?),
            DenseModel::Torch(m) => Box::new(m.engine(device)?),
            DenseModel::Aoti(m) => Box::new(m.engine(device)?),
        })
    }
}

impl Network for OnnxEngine {}
impl Network for TorchEngine {}
impl Network for AotiEngine {
    fn graph_input(
        &self,
        inputs: &[BatchTensor<'_>],
        name: &str,
    ) -> Option<triton_rust_core::tensor::DeviceViewMut<'static>> {
        AotiEngine::graph_input(self, inputs, name)
    }
}

impl LookupStep for EmbeddingEngine {
    fn run_into(
        &mut self,
        inputs: &[BatchTensor<'_>],
        out: &mut triton_rust_cuda::DeviceViewMut<'_>,
    ) -> Result<bool> {
        EmbeddingEngine::run_into(self, inputs, out)
    }
}

/// A recommender, loaded: its lookup (an embedding model) and its network, each loaded
/// once, and how their tensors meet.
pub struct RecommenderModel {
    lookup: EmbeddingModel,
    dense: DenseModel,
    plan: ChainPlan,
    joint: Arc<Joint>,
}

/// What a recommender's description kept for its load: its settings parsed, its lookup (its
/// store alive in the backend's registry) and its network with the config it was loaded on.
struct Described {
    settings: RecommenderSettings,
    store: StoreSettings,
    /// Held, not read: its store stays registered until the load finds it again.
    _lookup: EmbeddingModel,
    dense: (ModelConfig, DenseModel),
}

impl RecommenderModel {
    /// Its tensors, from its settings, tables and network, the config as written; kept for
    /// the load. (Its plan needs the config's inputs: a recommender is described only to
    /// complete its outputs.)
    pub fn describe(load: &ModelLoad<'_>) -> Result<Option<Signature>> {
        let (settings, store) = RecommenderModel::read_settings(load)?;
        let model = RecommenderModel::open(&settings, store.clone(), None, load)?;
        let sig = model.joint.sig.clone();
        let dense = (model.plan.dense_config.clone(), model.dense);
        load.opened.keep(Described { settings, store, _lookup: model.lookup, dense });
        Ok(Some(sig))
    }

    pub fn load(load: &ModelLoad<'_>) -> Result<RecommenderModel> {
        match load.opened.take::<Described>() {
            Some(d) => RecommenderModel::open(&d.settings, d.store, Some(d.dense), load),
            None => {
                let (settings, store) = RecommenderModel::read_settings(load)?;
                RecommenderModel::open(&settings, store, None, load)
            }
        }
    }

    /// The recommender's settings and its lookup's, read from the config.
    fn read_settings(load: &ModelLoad<'_>) -> Result<(RecommenderSettings, StoreSettings)> {
        // model_file is the version directory: tables/ and dense.onnx, dense.pt or dense.pt2
        let settings = RecommenderSettings::from_config(load.config)?;
        let mut store = StoreSettings::from_config(load.config, load.model_file, load.backend)?;
        // one key per table (batched), or a bag per table (pooled: embedding_interface
        // pooled, embedding_hotness_per_table) whose rows the lookup sums
        if store.interface != Interface::Pooled {
            store.interface = Interface::Batched;
        }
        Ok((settings, store))
    }

    /// The recommender on `load`'s config: its plan, its lookup, and its network (`dense`:
    /// one already loaded, taken when its config is the plan's).
    fn open(
        settings: &RecommenderSettings,
        store: StoreSettings,
        dense: Option<(ModelConfig, DenseModel)>,
        load: &ModelLoad<'_>,
    ) -> Result<RecommenderModel> {
        let keys = store.pooling.as_ref().map_or(settings.tables, |p| p.width());
        let pooled = store.interface == Interface::Pooled;
        let mut plan = plan(load.config, settings, keys, pooled, load.model_file, DENSE)?;
        hand_over_asleep(&mut plan.dense_config, store.host_threads_read_misses());
        let lookup = EmbeddingModel::open(store, &plan.lookup_config, load.shared)?;
        let dense = match dense {
            Some((config, dense)) if config == plan.dense_config => dense,
            _ => DenseModel::load(&plan, load)?,
        };
        let joint = Arc::new(Joint::new(lookup.signature(), dense.model().signature(), &plan)?);
        Ok(RecommenderModel { lookup, dense, plan, joint })
    }
}

/// The network's config, with `gpu_hand_over` asleep unless it says otherwise when host
/// threads read the cache's misses (`host_reads`): those threads need the cores the
/// hand-over would spin on (DLRM-v2 at a 10% cache on 8 instances served 1.20x with nothing
/// spinning: `bench/gpu/results/cache-runs/`, section `defaults`).
fn hand_over_asleep(dense_config: &mut ModelConfig, host_reads: bool) {
    if host_reads {
        dense_config
            .parameters
            .entry(HAND_OVER_PARAM.to_string())
            .or_insert_with(|| "asleep".to_string());
    }
}

/// The recommender chain's dense features to the GPU through pinned memory.
struct GpuStager(Staged);

impl Stager for GpuStager {
    fn stage(&mut self, parts: &[&[u8]]) -> Result<Vec<DeviceView<'_>>> {
        Ok(self.0.stage(parts)?)
    }
}

impl LoadedModel for RecommenderModel {
    fn signature(&self) -> &Signature {
        &self.joint.sig
    }

    fn metrics_source(&self) -> Option<Arc<dyn MetricsSource>> {
        self.lookup.metrics_source()
    }

    /// Inputs in GPU memory (CUDA shared memory) go where they are when both models take
    /// them: the keys to the GPU lookup, the rest to the network.
    fn accepts_device_inputs(&self, device: Device) -> bool {
        device != Device::Cpu
            && self.lookup.accepts_device_inputs(device)
            && self.dense.model().accepts_device_inputs(device)
    }

    fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        let joint = &self.joint;
        let lengths = joint.lengths_input.as_deref();
        check_both(&joint.sparse_input, lengths, &self.lookup, self.dense.model(), inputs)
    }

    fn instance(&self, device: Device) -> Result<Box<dyn Engine>> {
        let dense_takes_device = self.dense.model().accepts_device_inputs(device);
        if device != Device::Cpu && !dense_takes_device {
            return Err(Error::unsupported(format!(
                "on a KIND_GPU instance the recommender's network reads the embeddings in GPU memory, which the engine of '{}' cannot; use a TorchScript dense.pt or an AOTInductor dense.pt2 (or KIND_CPU)",
                self.plan.dense_file.display()
            )));
        }
        // the network loaded on the final config's plan
        let lookup = Box::new(self.lookup.engine(device)?);
        let dense = self.dense.network(device)?;
        let chain = Chain::new(lookup, dense, self.joint.clone(), device, dense_takes_device);
        Ok(Box::new(match device {
            Device::Gpu(id) => {
                let staged =
                    Staged::new(id).map_err(|e| Error::unavailable(format!("GPU {id}: {e}")))?;
                chain.with_gpu(Box::new(GpuStager(staged)), Arc::new(triton_rust_cuda::Cuda))
            }
            Device::Cpu => chain,
        }))
    }
}

/// The keys by the lookup's checks, and what the network takes from the request by its
/// own (an AOTInductor package's index ranges, ONNX's shared dimensions): models check
/// their inputs by name, so the network is shown the whole request.
fn check_both(
    sparse_input: &str,
    lengths_input: Option<&str>,
    lookup: &dyn LoadedModel,
    dense: &dyn LoadedModel,
    inputs: &[RequestTensor<'_>],
) -> Result<()> {
    // the lookup's inputs in its order: the keys, then their lengths when ragged
    let names = std::iter::once(sparse_input).chain(lengths_input);
    let mine: Vec<RequestTensor<'_>> =
        names.filter_map(|n| inputs.iter().find(|t| t.name == n).cloned()).collect();
    if !mine.is_empty() {
        lookup.check_request(&mine)?;
    }
    dense.check_request(inputs)
}

#[cfg(test)]
mod tests;
