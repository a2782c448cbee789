//! The one place that names every engine crate: the core's `EngineFactory` for this
//! build of the backend, each engine with the claim saying which models it serves.

use std::path::Path;

use triton_rust_core::engine::{Device, Engine, EngineClaim, EngineFactory, EngineOptions};
use triton_rust_core::error::{Error, Result};
use triton_rust_cuda::upload::Staged;
use triton_rust_cuda::DeviceView;
use triton_rust_engine_embedding::StoreSettings;
use triton_rust_engine_onnx::OnnxSettings;
use triton_rust_engine_recommender::{self as recommender, Chain, RecommenderSettings, Stager};
use triton_rust_engine_torch::TorchSettings;

/// The recommender chain's dense features to the GPU through pinned memory.
struct GpuStager(Staged);

impl Stager for GpuStager {
    fn stage(&mut self, parts: &[&[u8]]) -> Result<Vec<DeviceView<'_>>> {
        Ok(self.0.stage(parts)?)
    }
}

/// In the order a model file is looked for when the config names no engine.
static CLAIMS: &[EngineClaim] = &[
    EngineClaim {
        names: &["onnx", "onnxruntime"],
        default_file: Some("model.onnx"),
        file_suffixes: &[".onnx"],
        parameters: OnnxSettings::KNOWN,
        builds_on: &[],
        keeps_sequences: true,
        // the load-time probe is a whole session a CPU instance can take over
        probe_serves: true,
    },
    EngineClaim {
        names: &["torch", "torchscript", "pytorch"],
        default_file: Some("model.pt"),
        file_suffixes: &[".pt", ".pth"],
        parameters: TorchSettings::KNOWN,
        builds_on: &[],
        keeps_sequences: true,
        probe_serves: false,
    },
    EngineClaim {
        names: &["aoti", "torch_aoti"],
        default_file: Some("model.pt2"),
        file_suffixes: &[".pt2"],
        parameters: triton_rust_engine_aoti::KNOWN,
        builds_on: &[],
        keeps_sequences: true,
        probe_serves: false,
    },
    EngineClaim {
        names: &["embedding", "hps"],
        default_file: None,
        file_suffixes: &[],
        parameters: StoreSettings::KNOWN,
        builds_on: &[],
        keeps_sequences: false,
        probe_serves: false,
    },
    EngineClaim {
        names: &["recommender"],
        default_file: None,
        file_suffixes: &[],
        parameters: RecommenderSettings::KNOWN,
        builds_on: &["embedding", "onnx", "torch", "aoti"],
        keeps_sequences: false,
        probe_serves: false,
    },
];

pub struct Engines;

impl EngineFactory for Engines {
    fn claims(&self) -> &'static [EngineClaim] {
        CLAIMS
    }

    fn create(
        &self,
        engine: &str,
        model_file: &Path,
        options: &EngineOptions<'_>,
    ) -> Result<Box<dyn Engine>> {
        Ok(match engine {
            "onnx" => Box::new(triton_rust_engine_onnx::OnnxEngine::load(model_file, options)?),
            "embedding" => {
                Box::new(triton_rust_engine_embedding::EmbeddingEngine::load(model_file, options)?)
            }
            "torch" => Box::new(triton_rust_engine_torch::TorchEngine::load(model_file, options)?),
            "aoti" => Box::new(triton_rust_engine_aoti::AotiEngine::load(model_file, options)?),
            "recommender" => {
                // model_file is the version directory: tables/ and dense.onnx, dense.pt or dense.pt2
                let plan = recommender::plan(options.config, model_file, CLAIMS)?;
                let with = |config| EngineOptions {
                    config,
                    backend: options.backend,
                    device: options.device,
                    probe: options.probe,
                };
                let lookup = self.create("embedding", model_file, &with(&plan.lookup_config))?;
                let dense =
                    self.create(plan.dense_engine, &plan.dense_file, &with(&plan.dense_config))?;
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
            other => return Err(Error::internal(format!("no engine is named '{other}'"))),
        })
    }
}
