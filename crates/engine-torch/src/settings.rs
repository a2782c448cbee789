//! The TorchScript engine's model parameters, read once at load (Triton's PyTorch-backend
//! spellings, and ours: `TORCH_FUSION_STRATEGY`).

use triton_rust_core::config::ModelConfig;
use triton_rust_core::error::{Error, Result};
use triton_rust_core::settings::Known;

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
    /// `gpu_hand_over`; None: the plugin's default (spinning).
    pub hand_over: Option<triton_rust_abi::worker::HandOver>,
}

triton_rust_core::parameters! {
    /// The TorchScript engine's model parameters, as config.pbtxt spells them.
    pub struct TorchParams {
        intra_op_thread_count: Option<usize> = None, doc "the runtime's";
        #[serde(rename = "DISABLE_CUDNN")]
        disable_cudnn: bool = false, doc "false";
        #[serde(rename = "DISABLE_OPTIMIZED_EXECUTION")]
        disable_optimized_execution: bool = false, doc "false";
        #[serde(rename = "ENABLE_TENSOR_FUSER")]
        enable_tensor_fuser: Option<bool> = None, doc "libtorch's";
        #[serde(rename = "ENABLE_JIT_PROFILING")]
        enable_jit_profiling: Option<bool> = None, doc "libtorch's";
        #[serde(rename = "TORCH_FUSION_STRATEGY")]
        torch_fusion_strategy: Option<String> = None, doc "libtorch's";
        gpu_hand_over: Option<String> = None, doc "spin";
    }
}

triton_rust_core::parameters! {
    /// The TorchScript engine's backend setting (`--backend-config=rust,<key>=<value>`).
    pub struct TorchBackend {
        #[serde(rename = "libtorch-dir")]
        libtorch_dir: Option<String> = None, doc "none";
    }
}

impl TorchSettings {
    pub const KNOWN: &'static [Known] = TorchParams::KNOWN;

    pub fn from_config(cfg: &ModelConfig) -> Result<TorchSettings> {
        let p: TorchParams = triton_rust_core::params::read(&cfg.parameters)?;
        let fusion_steps = match &p.torch_fusion_strategy {
            None => Vec::new(),
            Some(text) => parse_fusion_strategy(text)?,
        };
        Ok(TorchSettings {
            intra_op_threads: p.intra_op_thread_count.unwrap_or(0),
            cudnn: !p.disable_cudnn,
            optimized_execution: !p.disable_optimized_execution,
            tensor_fuser: p.enable_tensor_fuser,
            jit_profiling: p.enable_jit_profiling,
            fusion_strategy: p.torch_fusion_strategy,
            fusion_steps,
            hand_over: triton_rust_abi::plugin::hand_over(p.gpu_hand_over.as_deref())?,
        })
    }
}

/// The model parameter naming TorchScript's fusion strategy.
pub const FUSION_STRATEGY: &str = "TORCH_FUSION_STRATEGY";

/// `STATIC:20` or `STATIC:2,DYNAMIC:10` (libtorch's `torch.jit.set_fusion_strategy`, spelled as
/// one string): in order, how many fused kernels of each kind the profiling executor compiles
/// for the input shapes it meets. libtorch's default is `STATIC:2,DYNAMIC:10`: a model that
/// sees more than two shapes (CUDA graph buckets) gets kernels for dynamic shapes after the
/// second; enough static depth gives each bucket its own.
pub fn parse_fusion_strategy(text: &str) -> Result<Vec<triton_rust_abi::FusionStep>> {
    let bad = |why: &str| {
        Error::invalid_arg(format!(
            "parameter '{FUSION_STRATEGY}' = '{text}': {why} (expected steps like 'STATIC:20' or 'STATIC:2,DYNAMIC:10')"
        ))
    };
    let steps = text
        .split(',')
        .map(|step| {
            let (kind, depth) = step
                .trim()
                .split_once(':')
                .ok_or_else(|| bad(&format!("step '{}' has no ':'", step.trim())))?;
            let dynamic = match kind.trim().to_ascii_uppercase().as_str() {
                "STATIC" => 0,
                "DYNAMIC" => 1,
                other => return Err(bad(&format!("'{other}' is neither STATIC nor DYNAMIC"))),
            };
            let depth: u32 = depth
                .trim()
                .parse()
                .map_err(|_| bad(&format!("depth '{}' is not a count", depth.trim())))?;
            Ok(triton_rust_abi::FusionStep { dynamic, depth })
        })
        .collect::<Result<Vec<_>>>()?;
    if steps.iter().all(|s| s.depth == 0) {
        return Err(bad("no step allows any fused kernel"));
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use triton_rust_core::settings::check_section;

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
        let doc = include_str!("../../../docs/settings.md");
        check_section(doc, "TorchScript engine", TorchSettings::KNOWN).unwrap();
        assert!(TorchSettings::KNOWN.iter().any(|k| k.0 == FUSION_STRATEGY));
    }

    #[test]
    fn the_hand_over_is_spin_asleep_or_refused_by_name() {
        use triton_rust_abi::worker::HandOver;
        let mut cfg = ModelConfig::default();
        assert_eq!(TorchSettings::from_config(&cfg).unwrap().hand_over, None);
        cfg.parameters.insert("gpu_hand_over".into(), "Asleep".into());
        assert_eq!(TorchSettings::from_config(&cfg).unwrap().hand_over, Some(HandOver::Asleep));
        cfg.parameters.insert("gpu_hand_over".into(), "spin".into());
        assert_eq!(TorchSettings::from_config(&cfg).unwrap().hand_over, Some(HandOver::Spin));
        cfg.parameters.insert("gpu_hand_over".into(), "nap".into());
        let e = TorchSettings::from_config(&cfg).unwrap_err().message().to_string();
        assert!(e.contains("gpu_hand_over") && e.contains("nap"), "{e}");
    }
}
