//! The steps of a model's load around the kind's own: the config completed from what the
//! model says of itself, and the config's sequence states checked against the loaded model.

use serde_json::Value;

use crate::config::{autocomplete, ModelConfig, TensorSpec};
use crate::engine::{EngineKind, ModelLoad};
use crate::error::{Error, Result};

/// The config completed from the kind's description of the model (`given`: the config as
/// written), as JSON for the server and read again; `None` when the kind has no signature
/// of its own or the description fills in nothing.
pub(super) fn completed(
    kind: &dyn EngineKind,
    given: &ModelLoad<'_>,
    raw: &Value,
) -> Result<Option<(Value, ModelConfig)>> {
    let Some(sig) = kind.describe(given)? else { return Ok(None) };
    let max_batch = given.backend.default_max_batch_size;
    let Some(raw) = autocomplete(raw, &sig.inputs, &sig.outputs, max_batch)? else {
        return Ok(None);
    };
    let mut config = ModelConfig::from_value(&raw)?;
    config.add_sequence_inputs()?;
    Ok(Some((raw, config)))
}

/// Each implicit state's output must be an output of the model, of the state's type.
pub(super) fn check_states(config: &ModelConfig, outputs: &[TensorSpec]) -> Result<()> {
    for st in config.sequence.iter().flat_map(|s| &s.states) {
        let names: Vec<&str> = outputs.iter().map(|o| o.name.as_str()).collect();
        let out = outputs.iter().find(|o| o.name == st.output).ok_or_else(|| {
            Error::invalid_arg(format!(
                "sequence_batching state '{}' has output_name '{}', which is not an output of the model (its outputs are {names:?})",
                st.input, st.output
            ))
        })?;
        if out.dtype != st.dtype {
            return Err(Error::invalid_arg(format!(
                "sequence_batching state '{}' is {} but the model's output '{}' is {}",
                st.input,
                st.dtype.config_name(),
                st.output,
                out.dtype.config_name()
            )));
        }
    }
    Ok(())
}
