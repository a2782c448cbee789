//! The one place that names every engine crate: the core's `EngineFactory` for this
//! build of the backend.

use std::path::Path;

use triton_rust_core::chain::{self, Chain, Stager};
use triton_rust_core::engine::{Device, Engine, EngineFactory, EngineKind, EngineOptions};
use triton_rust_core::error::{Error, Result};
use triton_rust_cuda::upload::Staged;
use triton_rust_cuda::DeviceView;

/// The recommender chain's dense features to the GPU through pinned memory.
struct GpuStager(Staged);

impl Stager for GpuStager {
    fn stage(&mut self, parts: &[&[u8]]) -> Result<Vec<DeviceView<'_>>> {
        Ok(self.0.stage(parts)?)
    }
}

pub struct Engines;

impl EngineFactory for Engines {
    fn create(
        &self,
        kind: EngineKind,
        model_file: &Path,
        options: &EngineOptions<'_>,
    ) -> Result<Box<dyn Engine>> {
        Ok(match kind {
            EngineKind::Onnx => {
                Box::new(triton_rust_engine_onnx::OnnxEngine::load(model_file, options)?)
            }
            EngineKind::Embedding => {
                Box::new(triton_rust_engine_embedding::EmbeddingEngine::load(model_file, options)?)
            }
            EngineKind::Torch => {
                Box::new(triton_rust_engine_torch::TorchEngine::load(model_file, options)?)
            }
            EngineKind::Recommender => {
                // model_file is the version directory: tables/ and dense.onnx or dense.pt
                let plan = chain::plan(options.config, model_file)?;
                let with = |config| EngineOptions {
                    config,
                    backend: options.backend,
                    device: options.device,
                    probe: options.probe,
                };
                let lookup =
                    self.create(EngineKind::Embedding, model_file, &with(&plan.lookup_config))?;
                let dense =
                    self.create(plan.dense_kind, &plan.dense_file, &with(&plan.dense_config))?;
                let chain = Chain::new(lookup, dense, &plan, options.device)?;
                match options.device {
                    Device::Gpu(id) => {
                        let staged = Staged::new(id)
                            .map_err(|e| Error::unavailable(format!("GPU {id}: {e}")))?;
                        Box::new(chain.with_gpu(
                            Box::new(GpuStager(staged)),
                            std::sync::Arc::new(triton_rust_cuda::Cuda),
                        ))
                    }
                    Device::Cpu => Box::new(chain),
                }
            }
        })
    }
}
