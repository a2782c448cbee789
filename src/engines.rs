//! The one place that names every engine crate: the core's `EngineFactory` for this
//! build of the backend.

use std::path::Path;

use triton_rust_core::engine::{Engine, EngineFactory, EngineKind, EngineOptions};
use triton_rust_core::error::Result;

pub struct Engines;

impl EngineFactory for Engines {
    fn create(&self, kind: EngineKind, model_file: &Path, options: &EngineOptions<'_>) -> Result<Box<dyn Engine>> {
        Ok(match kind {
            EngineKind::Onnx => Box::new(triton_rust_engine_onnx::OnnxEngine::load(model_file, options)?),
            EngineKind::Embedding => Box::new(triton_rust_engine_embedding::EmbeddingEngine::load(model_file, options)?),
            EngineKind::Torch => Box::new(triton_rust_engine_torch::TorchEngine::load(model_file, options)?),
        })
    }
}
