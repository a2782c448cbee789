//! The TorchScript engine's model parameters, read once at load (Triton's PyTorch-backend
//! spellings, and ours: `TORCH_FUSION_STRATEGY`).

use triton_rust_core::config::ModelConfig;
use triton_rust_core::error::Result;
use triton_rust_core::settings::Known;

use crate::{parse_fusion_strategy, FUSION_STRATEGY};

#[derive(Debug, Clone, Default)]
pub struct TorchSettings {
    /// `intra_op_thread_count`; 0: libtorch's.
    pub intra_op_threads: usize,
    /// `DISABLE_CUDNN` false.
    pub cudnn: bool,
    /// `DISABLE_OPTIMIZED_EXECUTION` false.
    pub optimized_execution: bool,
    /// `ENABLE_TENSOR_FUSER`, `ENABLE_JIT_PROFILING`; `None`: libtorch's.
    pub tensor_fuser: Option<bool>,
    pub jit_profiling: Option<bool>,
    /// `TORCH_FUSION_STRATEGY` as given, and its steps; empty: libtorch's.
    pub fusion_strategy: Option<String>,
    pub fusion_steps: Vec<triton_rust_abi::FusionStep>,
}

impl TorchSettings {
    pub const KNOWN: &'static [Known] = &[
        ("intra_op_thread_count", "the runtime's"),
        ("DISABLE_CUDNN", "false"),
        ("DISABLE_OPTIMIZED_EXECUTION", "false"),
        ("ENABLE_TENSOR_FUSER", "libtorch's"),
        ("ENABLE_JIT_PROFILING", "libtorch's"),
        (FUSION_STRATEGY, "libtorch's"),
    ];

    pub fn from_config(cfg: &ModelConfig) -> Result<TorchSettings> {
        let fusion_strategy = cfg.parameters.get(FUSION_STRATEGY).cloned();
        let fusion_steps = match &fusion_strategy {
            None => Vec::new(),
            Some(text) => parse_fusion_strategy(text)?,
        };
        Ok(TorchSettings {
            intra_op_threads: cfg.parameter_usize("intra_op_thread_count")?.unwrap_or(0),
            cudnn: !cfg.parameter_bool("DISABLE_CUDNN")?.unwrap_or(false),
            optimized_execution: !cfg
                .parameter_bool("DISABLE_OPTIMIZED_EXECUTION")?
                .unwrap_or(false),
            tensor_fuser: cfg.parameter_bool("ENABLE_TENSOR_FUSER")?,
            jit_profiling: cfg.parameter_bool("ENABLE_JIT_PROFILING")?,
            fusion_strategy,
            fusion_steps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use triton_rust_core::settings::{documented_defaults, undocumented};

    #[test]
    fn read_once_and_documented() {
        let mut cfg = ModelConfig::default();
        let s = TorchSettings::from_config(&cfg).unwrap();
        assert!(s.cudnn && s.optimized_execution && s.tensor_fuser.is_none());
        cfg.parameters.insert("DISABLE_CUDNN".into(), "true".into());
        cfg.parameters.insert(FUSION_STRATEGY.into(), "STATIC:20".into());
        let s = TorchSettings::from_config(&cfg).unwrap();
        assert!(!s.cudnn && s.fusion_steps.len() == 1);
        cfg.parameters.insert("ENABLE_JIT_PROFILING".into(), "maybe".into());
        assert!(TorchSettings::from_config(&cfg)
            .unwrap_err()
            .message()
            .contains("ENABLE_JIT_PROFILING"));
        let doc = documented_defaults(include_str!("../../../docs/settings.md"));
        let wrong = undocumented(TorchSettings::KNOWN, &doc);
        assert!(wrong.is_empty(), "{wrong:?}");
    }
}
