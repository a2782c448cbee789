//! The one place that names every engine crate: the core's `EngineFactory` for this
//! build of the backend.

use std::path::Path;

use triton_rust_core::chain::{self, Chain};
use triton_rust_core::engine::{Engine, EngineFactory, EngineKind, EngineOptions};
use triton_rust_core::error::Result;

pub struct Engines;

impl EngineFactory for Engines {
    fn create(&self, kind: EngineKind, model_file: &Path, options: &EngineOptions<'_>) -> Result<Box<dyn Engine>> {
        Ok(match kind {
            EngineKind::Onnx => Box::new(triton_rust_engine_onnx::OnnxEngine::load(model_file, options)?),
            EngineKind::Embedding => Box::new(triton_rust_engine_embedding::EmbeddingEngine::load(model_file, options)?),
            EngineKind::Torch => Box::new(triton_rust_engine_torch::TorchEngine::load(model_file, options)?),
            EngineKind::Recommender => {
                // model_file is the version directory: tables/ and dense.onnx or dense.pt
                let plan = chain::plan(options.config, model_file)?;
                let with = |config| EngineOptions { config, backend: options.backend, device: options.device, probe: options.probe };
                let lookup = self.create(EngineKind::Embedding, model_file, &with(&plan.lookup_config))?;
                let dense = self.create(plan.dense_kind, &plan.dense_file, &with(&plan.dense_config))?;
                Box::new(Chain::new(lookup, dense, &plan, options.device)?)
            }
        })
    }
}
