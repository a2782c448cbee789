//! The TorchScript engine: libtorch through the `libtriton_rust_torch.so` plugin.
//!
//! TorchScript files carry no input/output signature, so the config must list the
//! inputs and outputs (no auto-complete). Arguments follow Triton's PyTorch-backend
//! convention: names ending in `__<i>` (INPUT__0, OUTPUT__1) give the position; other
//! names keep the config's order. Parameters (Triton's PyTorch-backend spellings):
//! `intra_op_thread_count`, `DISABLE_CUDNN`, `DISABLE_OPTIMIZED_EXECUTION`,
//! `ENABLE_TENSOR_FUSER`, `ENABLE_JIT_PROFILING`; ours, on a GPU instance: `TORCH_FUSION_STRATEGY`
//! (libtorch's fusion strategy, e.g. `STATIC:20` or `STATIC:2,DYNAMIC:10`). On a GPU instance, `optimization { cuda { graphs: true } }`
//! captures a CUDA graph per batch-size bucket at the bucket's first batch and replays
//! it (see `ModelConfig::cuda_graph_buckets`; Triton's `model_warmup` captures at load).
//! The plugin's FFI (finding libtorch, opening the plugin, calling it) is
//! `triton_rust_abi::plugin`; this crate is safe code.

use std::ffi::CString;
use std::path::PathBuf;

mod settings;
pub use settings::{parse_fusion_strategy, TorchSettings, FUSION_STRATEGY};

use triton_rust_abi::plugin::{self, from_abi, to_abi};
use triton_rust_core::batch::BatchTensor;
use triton_rust_core::config::{ModelConfig, TensorConfig, TensorSpec};
use triton_rust_core::engine::{
    Device, Engine, EngineClaim, LoadedModel, ModelLoad, OutputView, Signature,
};
use triton_rust_core::error::{Error, Result};

pub use plugin::{LIBTORCH_NEEDED, PLUGIN_FILE};

/// Positions of the config's tensors in the model's argument (or result) order.
pub fn positional_order(tensors: &[TensorConfig]) -> Vec<usize> {
    let index = |n: &str| n.rsplit_once("__").and_then(|(_, i)| i.parse::<usize>().ok());
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    if tensors.iter().all(|t| index(&t.name).is_some()) {
        order.sort_by_key(|&i| index(&tensors[i].name));
    }
    order
}

fn specs(cfg: &ModelConfig, tensors: &[TensorConfig]) -> Vec<TensorSpec> {
    tensors
        .iter()
        .map(|t| {
            let mut shape = if cfg.batching() { vec![-1] } else { Vec::new() };
            shape.extend(&t.dims);
            TensorSpec { name: t.name.clone(), dtype: t.dtype, shape }
        })
        .collect()
}

/// TorchScript models: `model.pt`, or a file ending in `.pt` or `.pth`.
pub static CLAIM: EngineClaim = EngineClaim {
    names: &["torch", "torchscript", "pytorch"],
    default_file: Some("model.pt"),
    file_suffixes: &[".pt", ".pth"],
    parameters: TorchSettings::KNOWN,
    backend_keys: settings::TorchBackend::KNOWN,
    environment: &[plugin::LIBTORCH_ENV],
    builds_on: &[],
    keeps_sequences: true,
};

triton_rust_core::engine_kind!(
    /// The TorchScript engine kind.
    TorchKind, CLAIM, TorchModel
);

/// A TorchScript model, loaded: its settings, the plugin, and its signature (the config's).
/// The module itself is loaded by each instance, on its device.
pub struct TorchModel {
    settings: TorchSettings,
    /// The final config, which every instance's module is loaded by.
    config: ModelConfig,
    plugin: std::sync::Arc<plugin::Plugin>,
    model_file: PathBuf,
    sig: Signature,
}

impl TorchModel {
    /// A TorchScript file carries no signature: the config is its only source.
    pub fn describe(_load: &ModelLoad<'_>) -> Result<Option<Signature>> {
        Ok(None)
    }

    pub fn load(load: &ModelLoad<'_>) -> Result<TorchModel> {
        let cfg = load.config;
        if cfg.inputs.is_empty() || cfg.outputs.is_empty() {
            return Err(Error::invalid_arg(
                "a TorchScript model carries no input/output signature: list every input and output in config.pbtxt",
            ));
        }
        // an element type libtorch cannot take (strings, unsigned ints past 8 bits) fails the
        // load, naming the tensor, instead of every request
        for t in cfg.inputs.iter().chain(&cfg.outputs) {
            to_abi(t.dtype).map_err(|e| e.context(format!("tensor '{}'", t.name)))?;
        }
        let settings = TorchSettings::from_config(cfg)?;
        let plugin = plugin::plugin(
            &plugin::TORCHSCRIPT,
            plugin::libtorch_dir(
                triton_rust_core::params::read::<settings::TorchBackend>(&load.backend.cmdline)?
                    .libtorch_dir
                    .as_deref(),
                load.backend.env(plugin::LIBTORCH_ENV),
            )
            .as_ref()
            .map(|(d, source)| (d.as_path(), source.as_str())),
        )?;
        if let Some(text) = &settings.fusion_strategy {
            log::info!(
                "model '{}' asks for TorchScript's fusion strategy {text} (process-wide) on its KIND_GPU instances",
                cfg.name
            );
        }
        let sig = Signature { inputs: specs(cfg, &cfg.inputs), outputs: specs(cfg, &cfg.outputs) };
        let model_file = load.model_file.to_path_buf();
        Ok(TorchModel { settings, config: cfg.clone(), plugin, model_file, sig })
    }
}

impl LoadedModel for TorchModel {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    fn accepts_device_inputs(&self, _device: Device) -> bool {
        true
    }
    fn instance(&self, device: Device) -> Result<Box<dyn Engine>> {
        Ok(Box::new(self.engine(device)?))
    }
}

impl TorchModel {
    /// The module loaded for an instance on `device`.
    pub fn engine(&self, device: Device) -> Result<TorchEngine> {
        let (settings, cfg) = (&self.settings, &self.config);
        let gpu = match device {
            Device::Gpu(id) => Some(id),
            Device::Cpu => None,
        };
        if settings.fusion_strategy.is_some() && gpu.is_none() {
            return Err(Error::invalid_arg(format!(
                "parameter '{FUSION_STRATEGY}' is set through the GPU helper library: give it to KIND_GPU instances only"
            )));
        }
        // (a KIND_CPU instance with graphs asked for says so when it is made: serve.rs)
        let buckets = cfg.cuda_graph_buckets()?;
        let model = self.plugin.load(&plugin::LoadSpec {
            path: &self.model_file,
            gpu,
            intra_op_threads: settings.intra_op_threads as i32,
            cudnn: settings.cudnn,
            optimized_execution: settings.optimized_execution,
            tensor_fuser: settings.tensor_fuser,
            jit_profiling: settings.jit_profiling,
            fusion_strategy: &settings.fusion_steps,
            cuda_graphs: if gpu.is_some() { buckets.as_deref() } else { None },
            graph_exact_rows: !cfg.batching(),
            hand_over: settings.hand_over,
        })?;
        let cstr =
            |s: &str| CString::new(s).map_err(|_| Error::invalid_arg("tensor name has a NUL"));
        let input_order = positional_order(&cfg.inputs);
        let output_order = positional_order(&cfg.outputs);
        Ok(TorchEngine {
            model,
            device,
            input_names: input_order
                .iter()
                .map(|&i| cstr(&cfg.inputs[i].name))
                .collect::<Result<_>>()?,
            output_names: output_order.iter().map(|&i| cfg.outputs[i].name.clone()).collect(),
            output_cnames: output_order
                .iter()
                .map(|&i| cstr(&cfg.outputs[i].name))
                .collect::<Result<_>>()?,
            input_order,
            outputs_on_host: false,
        })
    }
}

/// One instance's module, loaded on its device.
pub struct TorchEngine {
    model: plugin::PluginModel,
    device: Device,
    input_order: Vec<usize>,
    input_names: Vec<CString>,
    /// The outputs' names in the module's result order.
    output_names: Vec<String>,
    output_cnames: Vec<CString>,
    /// The last batch's responses all took their outputs in host memory (a GPU instance
    /// serving gRPC/HTTP clients or system shared memory, not an ensemble step).
    outputs_on_host: bool,
}

impl Engine for TorchEngine {
    fn outputs_landed(&mut self, on_host: bool) {
        self.outputs_on_host = on_host;
    }

    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let refs = plugin::input_refs(inputs, &self.input_order, &self.input_names)?;
        // On a GPU instance outputs stay where libtorch made them and the serving layer puts
        // them in the memory the response asks for, unless the last responses all wanted
        // host memory: then the plugin copies them there before its one wait.
        let host_outputs = self.device == Device::Cpu || self.outputs_on_host;
        let names = &self.output_names;
        self.model.run(&refs, &self.output_cnames, host_outputs, &mut |out| {
            let name = &names[out.index];
            if !outputs.contains(&name.as_str()) {
                return Ok(());
            }
            sink(OutputView { name, dtype: from_abi(out.dtype)?, shape: out.shape, data: out.data })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use triton_rust_core::tensor::DataType;

    fn t(name: &str) -> TensorConfig {
        TensorConfig { name: name.into(), dtype: DataType::F32, dims: vec![1], reshape: None }
    }

    #[test]
    fn fusion_strategy_spelling() {
        use triton_rust_abi::FusionStep;
        assert_eq!(
            parse_fusion_strategy("STATIC:20").unwrap(),
            vec![FusionStep { dynamic: 0, depth: 20 }]
        );
        assert_eq!(
            parse_fusion_strategy(" static:2, DYNAMIC : 10 ").unwrap(),
            vec![FusionStep { dynamic: 0, depth: 2 }, FusionStep { dynamic: 1, depth: 10 }]
        );
        for bad in ["", "STATIC", "STATIC:x", "FAST:2", "STATIC:0", "STATIC:-1", "STATIC:2,"] {
            let e = parse_fusion_strategy(bad).unwrap_err().to_string();
            assert!(e.contains(FUSION_STRATEGY), "{bad}: {e}");
        }
    }

    #[test]
    fn argument_order_follows_the_index_suffix() {
        assert_eq!(
            positional_order(&[t("OUTPUT__1"), t("OUTPUT__0"), t("OUTPUT__2")]),
            vec![1, 0, 2]
        );
        assert_eq!(
            positional_order(&[t("b"), t("a")]),
            vec![0, 1],
            "other names keep the config's order"
        );
        assert_eq!(positional_order(&[t("INPUT__0"), t("mask")]), vec![0, 1]);
    }
}
