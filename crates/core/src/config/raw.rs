//! The model config's JSON as Triton writes it (protobuf's JSON mapping of
//! `model_config.proto`), as serde-derived types: only the fields this backend reads,
//! every one optional (protobuf leaves defaults and empty lists out), unknown fields
//! ignored. `ModelConfig::from_value` turns this into the checked [`super::ModelConfig`].

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// An integer that protobuf's JSON mapping may write as a string (int64 and uint64 fields:
/// `"max_sequence_idle_microseconds": "1000000"`, dims of a `reshape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Int(pub(super) i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Int, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Number(i64),
            Text(String),
        }
        match Either::deserialize(d)? {
            Either::Number(n) => Ok(Int(n)),
            Either::Text(s) => s
                .trim()
                .parse()
                .map(Int)
                .map_err(|_| serde::de::Error::custom(format!("'{s}' is not an integer"))),
        }
    }
}

pub(super) fn ints(v: &[Int]) -> Vec<i64> {
    v.iter().map(|i| i.0).collect()
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawConfig {
    pub name: String,
    pub max_batch_size: Int,
    pub input: Vec<RawTensor>,
    pub output: Vec<RawTensor>,
    pub parameters: BTreeMap<String, RawParameter>,
    pub platform: String,
    pub default_model_filename: String,
    pub optimization: RawOptimization,
    pub instance_group: Vec<RawInstanceGroup>,
    pub sequence_batching: Option<RawSequence>,
    pub model_transaction_policy: RawTransactionPolicy,
    pub batch_input: Vec<Value>,
    pub batch_output: Vec<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawTensor {
    pub name: String,
    pub data_type: Option<String>,
    pub dims: Vec<Int>,
    /// Present (possibly `{}`: protobuf leaves an empty `shape` out) when the config says
    /// `reshape`.
    pub reshape: Option<RawReshape>,
    pub allow_ragged_batch: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawReshape {
    pub shape: Vec<Int>,
}

/// `parameters { key: "k" value { string_value: "v" } }`; a bare string is taken too.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawParameter {
    Text(String),
    Value {
        #[serde(default)]
        string_value: String,
    },
    Other(Value),
}

impl RawParameter {
    pub fn text(&self) -> String {
        match self {
            RawParameter::Text(s) | RawParameter::Value { string_value: s } => s.clone(),
            RawParameter::Other(v) => v.to_string(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawOptimization {
    pub graph: RawGraph,
    pub execution_accelerators: RawAccelerators,
    pub cuda: RawCuda,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawGraph {
    pub level: Option<Int>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawAccelerators {
    pub gpu_execution_accelerator: Vec<RawAccelerator>,
    pub cpu_execution_accelerator: Vec<RawAccelerator>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawAccelerator {
    pub name: String,
    pub parameters: BTreeMap<String, RawParameter>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawCuda {
    pub graphs: bool,
    pub graph_spec: Vec<RawGraphSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawGraphSpec {
    pub batch_size: Int,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawInstanceGroup {
    pub kind: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawTransactionPolicy {
    pub decoupled: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawSequence {
    /// Present when the strategy is `oldest` (otherwise `direct`).
    pub oldest: Option<Value>,
    pub control_input: Vec<RawControlInput>,
    pub state: Vec<RawState>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawControlInput {
    pub name: String,
    pub control: Vec<RawControl>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawControl {
    pub kind: Option<String>,
    pub data_type: Option<String>,
    pub int32_false_true: Vec<Value>,
    pub fp32_false_true: Vec<Value>,
    pub bool_false_true: Vec<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RawState {
    pub input_name: String,
    pub output_name: String,
    pub data_type: Option<String>,
    pub dims: Vec<Int>,
}
