//! The model config as this backend reads it.
//!
//! Triton hands the backend the model's `config.pbtxt` as JSON. This room turns that
//! JSON into [`ModelConfig`], checks it, and writes the auto-completed config back
//! (inputs, outputs and `max_batch_size` filled from the model file). It knows no
//! engine and no Triton pointer: it is plain data, unit-tested on strings.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::tensor::{shape_matches, DataType};

/// One input or output as the config declares it (dims exclude the batch dimension).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorConfig {
    pub name: String,
    pub dtype: DataType,
    pub dims: Vec<i64>,
    /// `reshape { shape: [...] }`: the shape the model sees (without the batch dimension)
    /// when it differs from what clients send, e.g. `dims: [1]` for a rank-0 model input.
    pub reshape: Option<Vec<i64>>,
}

impl TensorConfig {
    /// The dims the model file declares (without the batch dimension).
    pub fn model_dims(&self) -> &[i64] {
        self.reshape.as_deref().unwrap_or(&self.dims)
    }
}

/// `template` (which may hold one -1) made concrete for `count` elements; `None` when it
/// cannot hold them.
pub fn resolve_shape(template: &[i64], count: usize) -> Option<Vec<i64>> {
    let known: i64 = template.iter().filter(|&&d| d != -1).product();
    let free = template.iter().filter(|&&d| d == -1).count();
    match free {
        0 if known as usize == count => Some(template.to_vec()),
        1 if known > 0 && count as i64 % known == 0 => {
            Some(template.iter().map(|&d| if d == -1 { count as i64 / known } else { d }).collect())
        }
        _ => None,
    }
}

/// An execution accelerator named in `optimization.execution_accelerators`.
#[derive(Debug, Clone, PartialEq)]
pub struct Accelerator {
    pub name: String,
    pub parameters: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelConfig {
    pub name: String,
    pub max_batch_size: i64,
    pub inputs: Vec<TensorConfig>,
    pub outputs: Vec<TensorConfig>,
    /// `parameters { key: .. value { string_value: .. } }`
    pub parameters: BTreeMap<String, String>,
    pub default_model_filename: Option<String>,
    /// `platform`, when given (e.g. Triton's `torch_aoti`, which names an engine here).
    pub platform: Option<String>,
    /// `optimization { graph { level: N } }`, if given.
    pub graph_optimization_level: Option<i64>,
    pub gpu_accelerators: Vec<Accelerator>,
    pub cpu_accelerators: Vec<Accelerator>,
    /// `instance_group [ { kind: .. } ]`, as Triton completed them (`KIND_CPU`, `KIND_GPU`, ..).
    pub instance_kinds: Vec<String>,
    /// `optimization { cuda { graphs: true } }`
    pub cuda_graphs: bool,
    /// The batch sizes of `optimization { cuda { graph_spec [ { batch_size: N } ] } }`.
    pub cuda_graph_batches: Vec<i64>,
    /// `sequence_batching { ... }`: the control inputs and implicit states the server
    /// adds to each request of a sequence.
    pub sequence: Option<SequenceConfig>,
    /// Inputs with `allow_ragged_batch`: requests whose sizes differ there batch together,
    /// the input's elements of every request concatenated into one flat tensor.
    pub ragged: Vec<String>,
    /// Sections this backend does not serve, as read (refused at load by
    /// [`ModelConfig::check_supported`], never accepted and then misbehaving).
    pub unsupported: Vec<String>,
}

/// How the sequence batcher forms batches (`sequence_batching { direct | oldest }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceStrategy {
    /// One batch slot per live sequence (null requests fill idle slots).
    Direct,
    /// The oldest request of each ready sequence, batched like dynamic batching.
    Oldest,
}

/// One implicit state: Triton feeds the stored value to `input` and the backend hands
/// the model's `output` back to Triton for the sequence's next request.
#[derive(Debug, Clone, PartialEq)]
pub struct StateConfig {
    pub input: String,
    pub output: String,
    pub dtype: DataType,
    /// Without the batch dimension (-1: the shape the model gives decides).
    pub dims: Vec<i64>,
}

/// `sequence_batching` as this backend needs it: what arrives besides the client's
/// inputs. Triton core keeps the sequences, their slots and their states; the backend
/// reads control and state inputs like any other and writes each state back.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceConfig {
    pub strategy: SequenceStrategy,
    /// START, END, READY and CORRID tensors, one value per request (dims `[1]`).
    pub controls: Vec<TensorConfig>,
    pub states: Vec<StateConfig>,
    /// The CORRID control, when its `data_type` is `TYPE_STRING`: Triton fills it from a
    /// buffer sized for its longest id, the id first and unused bytes after it.
    pub string_corrid: Option<String>,
}

impl SequenceConfig {
    fn from_raw(v: &raw::RawSequence) -> Result<SequenceConfig> {
        let strategy =
            if v.oldest.is_some() { SequenceStrategy::Oldest } else { SequenceStrategy::Direct };
        let mut controls = Vec::new();
        let mut string_corrid = None;
        for c in &v.control_input {
            let name = c.name.clone();
            if name.is_empty() {
                return Err(Error::invalid_arg("a sequence_batching control_input has no name"));
            }
            let [control] = c.control.as_slice() else {
                return Err(Error::invalid_arg(format!(
                    "sequence_batching control_input '{name}' must have exactly one control"
                )));
            };
            let kind = control.kind.as_deref().unwrap_or("CONTROL_SEQUENCE_START");
            let dtype = if kind == "CONTROL_SEQUENCE_CORRID" {
                let t = control.data_type.as_deref().unwrap_or("TYPE_INVALID");
                DataType::from_config_name(t).map_err(|e| {
                    Error::invalid_arg(format!("sequence_batching control_input '{name}': {e}"))
                })?
            } else if !control.fp32_false_true.is_empty() {
                DataType::F32
            } else if !control.bool_false_true.is_empty() {
                DataType::Bool
            } else if !control.int32_false_true.is_empty() {
                DataType::I32
            } else {
                return Err(Error::invalid_arg(format!(
                    "sequence_batching control_input '{name}' ({kind}) gives none of int32_false_true, fp32_false_true, bool_false_true"
                )));
            };
            if kind == "CONTROL_SEQUENCE_CORRID" && dtype == DataType::Bytes {
                string_corrid = Some(name.clone());
            }
            controls.push(TensorConfig { name, dtype, dims: vec![1], reshape: None });
        }
        let mut states = Vec::new();
        for st in &v.state {
            let (input, output) = (st.input_name.clone(), st.output_name.clone());
            if input.is_empty() || output.is_empty() {
                return Err(Error::invalid_arg(
                    "a sequence_batching state needs both input_name and output_name",
                ));
            }
            let dtype =
                DataType::from_config_name(st.data_type.as_deref().unwrap_or("TYPE_INVALID"))
                    .map_err(|e| {
                        Error::invalid_arg(format!("sequence_batching state '{input}': {e}"))
                    })?;
            states.push(StateConfig { input, output, dtype, dims: raw::ints(&st.dims) });
        }
        Ok(SequenceConfig { strategy, controls, states, string_corrid })
    }

    /// The names of the inputs the server adds to every request: controls, then states.
    pub fn added_inputs(&self) -> impl Iterator<Item = &str> {
        self.controls
            .iter()
            .map(|c| c.name.as_str())
            .chain(self.states.iter().map(|s| s.input.as_str()))
    }

    /// The state whose model output is `name`.
    pub fn state_for_output(&self, name: &str) -> Option<&StateConfig> {
        self.states.iter().find(|s| s.output == name)
    }
}

/// The sections and fields of a model config this backend refuses, with why.
fn unsupported_sections(v: &raw::RawConfig) -> Vec<String> {
    let mut out = Vec::new();
    if v.model_transaction_policy.decoupled {
        out.push(
            "model_transaction_policy.decoupled: the rust backend sends exactly one response per request; \
             decoupled models (several or no responses per request) are not supported yet"
                .to_string(),
        );
    }
    for t in v.input.iter().filter(|t| t.allow_ragged_batch && v.max_batch_size.0 == 0) {
        out.push(format!(
            "input '{}' has allow_ragged_batch, which batches requests of different sizes: it needs max_batch_size > 0",
            t.name
        ));
    }
    for (key, list) in [("batch_input", &v.batch_input), ("batch_output", &v.batch_output)] {
        if !list.is_empty() {
            out.push(format!(
                "{key}: ragged batching's batch tensors are not supported by the rust backend yet; \
                 a ragged input's per-sample sizes come from an input of the model (the embedding \
                 engine's pooled interface takes LENGTHS)"
            ));
        }
    }
    out
}

fn string_map(v: &BTreeMap<String, raw::RawParameter>) -> BTreeMap<String, String> {
    v.iter().map(|(k, p)| (k.clone(), p.text())).collect()
}

fn tensors(list: &[raw::RawTensor], what: &str) -> Result<Vec<TensorConfig>> {
    list.iter()
        .map(|t| {
            let name = t.name.clone();
            if name.is_empty() {
                return Err(Error::invalid_arg(format!(
                    "an {what} in the model config has no name"
                )));
            }
            let dtype =
                DataType::from_config_name(t.data_type.as_deref().unwrap_or("TYPE_INVALID"))
                    .map_err(|e| Error::invalid_arg(format!("{what} '{name}': {e}")))?;
            let dims = raw::ints(&t.dims);
            let reshape = t.reshape.as_ref().map(|r| raw::ints(&r.shape));
            if let Some(r) = &reshape {
                let fixed = |d: &[i64]| d.iter().all(|&x| x >= 0);
                if r.iter().filter(|&&d| d == -1).count() > 1
                    || (fixed(r)
                        && fixed(&dims)
                        && r.iter().product::<i64>() != dims.iter().product::<i64>())
                {
                    return Err(Error::invalid_arg(format!(
                        "{what} '{name}': reshape {r:?} cannot hold dims {dims:?}"
                    )));
                }
            }
            Ok(TensorConfig { name, dtype, dims, reshape })
        })
        .collect()
}

fn accelerators(list: &[raw::RawAccelerator]) -> Vec<Accelerator> {
    list.iter()
        .map(|a| Accelerator { name: a.name.clone(), parameters: string_map(&a.parameters) })
        .collect()
}

/// `Some(text)` unless empty (protobuf writes an unset string as `""` or leaves it out).
fn given(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

impl ModelConfig {
    pub fn from_json(text: &str) -> Result<ModelConfig> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::invalid_arg(format!("model config is not JSON: {e}")))?;
        Self::from_value(&v)
    }

    pub fn from_value(v: &Value) -> Result<ModelConfig> {
        use serde::Deserialize;
        let raw = raw::RawConfig::deserialize(v)
            .map_err(|e| Error::invalid_arg(format!("the model config does not read: {e}")))?;
        let opt = &raw.optimization;
        let cfg = ModelConfig {
            name: raw.name.clone(),
            max_batch_size: raw.max_batch_size.0,
            inputs: tensors(&raw.input, "input")?,
            outputs: tensors(&raw.output, "output")?,
            parameters: string_map(&raw.parameters),
            platform: given(&raw.platform),
            default_model_filename: given(&raw.default_model_filename),
            graph_optimization_level: opt.graph.level.map(|l| l.0),
            gpu_accelerators: accelerators(&opt.execution_accelerators.gpu_execution_accelerator),
            cpu_accelerators: accelerators(&opt.execution_accelerators.cpu_execution_accelerator),
            instance_kinds: raw.instance_group.iter().filter_map(|g| g.kind.clone()).collect(),
            cuda_graphs: opt.cuda.graphs,
            cuda_graph_batches: opt.cuda.graph_spec.iter().map(|g| g.batch_size.0).collect(),
            sequence: raw.sequence_batching.as_ref().map(SequenceConfig::from_raw).transpose()?,
            ragged: raw
                .input
                .iter()
                .filter(|t| t.allow_ragged_batch)
                .map(|t| t.name.clone())
                .collect(),
            unsupported: unsupported_sections(&raw),
        };
        if cfg.max_batch_size < 0 {
            return Err(Error::invalid_arg(format!(
                "max_batch_size {} is negative",
                cfg.max_batch_size
            )));
        }
        Ok(cfg)
    }

    pub fn batching(&self) -> bool {
        self.max_batch_size > 0
    }

    /// Refuses, naming it, what this backend does not serve (decoupled responses,
    /// ragged batching), so such a config fails to load instead of misbehaving.
    pub fn check_supported(&self) -> Result<()> {
        match self.unsupported.first() {
            Some(why) => Err(Error::unsupported(why.clone())),
            None => Ok(()),
        }
    }

    /// Adds the inputs the sequence batcher puts into every request (control tensors,
    /// then implicit states) to `inputs`, so requests are checked, batched and fed to
    /// the model like the client's own inputs. A name the config already lists as an
    /// input is refused: the server, not the client, fills it.
    pub fn add_sequence_inputs(&mut self) -> Result<()> {
        let Some(seq) = self.sequence.clone() else { return Ok(()) };
        let added = seq.controls.iter().cloned().chain(seq.states.iter().map(|s| TensorConfig {
            name: s.input.clone(),
            dtype: s.dtype,
            dims: s.dims.clone(),
            reshape: None,
        }));
        for t in added {
            if self.inputs.iter().any(|c| c.name == t.name) {
                return Err(Error::invalid_arg(format!(
                    "input '{}' is listed under input and under sequence_batching; the sequence batcher fills it, so list it only there",
                    t.name
                )));
            }
            self.inputs.push(t);
        }
        Ok(())
    }

    /// The batch sizes CUDA graphs are captured for when `optimization.cuda.graphs` is
    /// on (`None` when off): `graph_spec`'s batch sizes, or else the powers of two up to
    /// `max_batch_size` and `max_batch_size` itself. A batch is padded to the smallest
    /// bucket holding it. For a model without batching: empty without `graph_spec` (one
    /// graph per input shape; so are `graph_spec` entries by input shape, batch_size 0),
    /// else `graph_spec`'s batch sizes taken as the exact first
    /// dimension every input must share for a request to run in a graph (no padding:
    /// other requests run without), so a model whose requests carry their own rows (the
    /// recommenders' `[-1, 26]` keys) can keep graphs to the sizes where they pay.
    pub fn cuda_graph_buckets(&self) -> Result<Option<Vec<i64>>> {
        if !self.cuda_graphs {
            return Ok(None);
        }
        if !self.batching() {
            if let Some(&bad) = self.cuda_graph_batches.iter().find(|&&b| b < 0) {
                return Err(Error::invalid_arg(format!(
                    "optimization.cuda.graph_spec batch_size {bad}: a model without batching names the rows of the requests to graph"
                )));
            }
            // entries of batch_size 0 (Triton's spelling by input shape) name no rows
            let mut rows: Vec<i64> =
                self.cuda_graph_batches.iter().copied().filter(|&b| b > 0).collect();
            rows.sort_unstable();
            rows.dedup();
            return Ok(Some(rows));
        }
        let mut buckets = if self.cuda_graph_batches.is_empty() {
            let mut b: Vec<i64> = std::iter::successors(Some(1i64), |&x| x.checked_mul(2))
                .take_while(|&x| x < self.max_batch_size)
                .collect();
            b.push(self.max_batch_size);
            b
        } else {
            if let Some(&bad) =
                self.cuda_graph_batches.iter().find(|&&b| b < 1 || b > self.max_batch_size)
            {
                return Err(Error::invalid_arg(format!(
                    "optimization.cuda.graph_spec batch_size {bad} is outside 1..={} (max_batch_size)",
                    self.max_batch_size
                )));
            }
            self.cuda_graph_batches.clone()
        };
        buckets.sort_unstable();
        buckets.dedup();
        Ok(Some(buckets))
    }

    /// A model parameter parsed as a number, with a clear error naming the key.
    pub fn parameter_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.parameters.get(key) {
            None => Ok(None),
            Some(s) => s.trim().parse().map(Some).map_err(|_| {
                Error::invalid_arg(format!(
                    "parameter '{key}' must be a non-negative integer, got '{s}'"
                ))
            }),
        }
    }

    /// Config tensors of `dims: [1]` whose model tensor is a scalar (rank 0, per sample
    /// when batching) are served as such: the engine sees rank 0, clients send and get [1].
    pub fn adopt_scalars(&mut self, inputs: &[TensorSpec], outputs: &[TensorSpec]) {
        let batching = self.batching();
        let adopt = |declared: &mut Vec<TensorConfig>, actual: &[TensorSpec]| {
            for c in declared.iter_mut().filter(|c| c.reshape.is_none() && c.dims == [1]) {
                if let Some(m) = actual.iter().find(|m| m.name == c.name) {
                    let model_dims =
                        if batching { m.shape.get(1..).unwrap_or(&[]) } else { &m.shape[..] };
                    if model_dims.is_empty() && (!batching || !m.shape.is_empty()) {
                        c.reshape = Some(Vec::new());
                    }
                }
            }
        };
        adopt(&mut self.inputs, inputs);
        adopt(&mut self.outputs, outputs);
    }

    /// A model parameter parsed as a boolean (`true/false/1/0/yes/no`).
    pub fn parameter_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.parameters.get(key).map(|s| s.trim().to_ascii_lowercase()) {
            None => Ok(None),
            Some(s) => match s.as_str() {
                "true" | "1" | "yes" | "on" => Ok(Some(true)),
                "false" | "0" | "no" | "off" => Ok(Some(false)),
                _ => Err(Error::invalid_arg(format!(
                    "parameter '{key}' must be true or false, got '{s}'"
                ))),
            },
        }
    }
}

/// A tensor as the model file declares it: full shape including any batch dimension,
/// -1 where the size is free.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DataType,
    pub shape: Vec<i64>,
}

/// Batch size the auto-completer picks for a model that can batch and whose config
/// gives none, unless the server's `--backend-config=default-max-batch-size` says otherwise.
pub const DEFAULT_MAX_BATCH_SIZE: i64 = 4;

/// Fills what the config leaves out from what the model file declares, the way
/// Triton's own backends auto-complete: inputs and outputs when absent, and
/// `max_batch_size` (with dynamic batching) when every tensor has a free first dim.
/// Returns the new config JSON, or `None` when nothing needed filling.
pub fn autocomplete(
    config: &Value,
    inputs: &[TensorSpec],
    outputs: &[TensorSpec],
    default_max_batch_size: i64,
) -> Result<Option<Value>> {
    let mut cfg = config.clone();
    let parsed = ModelConfig::from_value(config)?;
    let mut changed = false;
    let all_batchable = inputs.iter().chain(outputs).all(|t| t.shape.first() == Some(&-1));
    let mut max_batch = parsed.max_batch_size;
    let io_missing = parsed.inputs.is_empty() || parsed.outputs.is_empty();
    if max_batch == 0 && io_missing && all_batchable && !inputs.is_empty() {
        max_batch = default_max_batch_size;
        cfg["max_batch_size"] = json!(max_batch);
        if cfg.get("dynamic_batching").is_none() && cfg.get("sequence_batching").is_none() {
            cfg["dynamic_batching"] = json!({});
        }
        changed = true;
    }
    let to_json = |t: &TensorSpec| -> Value {
        let dims: Vec<i64> = if max_batch > 0 { t.shape[1..].to_vec() } else { t.shape.clone() };
        if dims.is_empty() {
            // A scalar (per sample): Triton needs a dim, so clients send [1]. A batching
            // model says so with an empty reshape; Triton 2.51 refuses an empty reshape on a
            // non-batching model, so there the backend maps dims [1] to the model's rank 0
            // itself (ModelConfig::adopt_scalars).
            return if max_batch > 0 {
                json!({ "name": t.name, "data_type": t.dtype.config_name(), "dims": [1], "reshape": { "shape": [] } })
            } else {
                json!({ "name": t.name, "data_type": t.dtype.config_name(), "dims": [1] })
            };
        }
        json!({ "name": t.name, "data_type": t.dtype.config_name(), "dims": dims })
    };
    if parsed.inputs.is_empty() {
        // the sequence batcher fills its control and state inputs: clients send the rest
        let filled_by_server: Vec<&str> =
            parsed.sequence.iter().flat_map(|s| s.added_inputs()).collect();
        cfg["input"] = Value::Array(
            inputs
                .iter()
                .filter(|t| !filled_by_server.contains(&t.name.as_str()))
                .map(to_json)
                .collect(),
        );
        changed = true;
    }
    if parsed.outputs.is_empty() {
        cfg["output"] = Value::Array(outputs.iter().map(to_json).collect());
        changed = true;
    }
    Ok(changed.then_some(cfg))
}

/// Checks that the config's tensors agree with the model file's, naming the first
/// tensor that does not. Config tensors must exist in the model with the same type
/// and a compatible shape; every model input must be fed by the config.
pub fn check_against_model(
    cfg: &ModelConfig,
    inputs: &[TensorSpec],
    outputs: &[TensorSpec],
) -> Result<()> {
    let check = |what: &str, declared: &[TensorConfig], actual: &[TensorSpec]| -> Result<()> {
        for c in declared {
            let Some(m) = actual.iter().find(|m| m.name == c.name) else {
                let names: Vec<&str> = actual.iter().map(|m| m.name.as_str()).collect();
                let article = if what.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
                return Err(Error::invalid_arg(format!(
                    "config {what} '{}' is not {article} {what} of the model (the model's {what}s are {names:?})",
                    c.name
                )));
            };
            if m.dtype != c.dtype {
                return Err(Error::invalid_arg(format!(
                    "config {what} '{}' has data_type {} but the model's is {}",
                    c.name,
                    c.dtype.config_name(),
                    m.dtype.config_name()
                )));
            }
            let mut full: Vec<i64> = Vec::with_capacity(c.dims.len() + 1);
            if cfg.batching() {
                full.push(-1);
            }
            full.extend(c.model_dims());
            // Compatible when each model dim is free or equal to the config's.
            let ok = full.len() == m.shape.len()
                && full.iter().zip(&m.shape).all(|(&c, &m)| m == -1 || c == m);
            if !ok {
                let batch_note = if cfg.batching() {
                    " (max_batch_size > 0 adds a leading batch dimension, so the model's first dimension must be free)"
                } else {
                    ""
                };
                let dims = match &c.reshape {
                    Some(r) => format!("reshape {r:?}"),
                    None => format!("dims {:?}", c.dims),
                };
                return Err(Error::invalid_arg(format!(
                    "config {what} '{}' has {dims} but the model's shape is {:?}{batch_note}",
                    c.name, m.shape
                )));
            }
        }
        Ok(())
    };
    check("input", &cfg.inputs, inputs)?;
    check("output", &cfg.outputs, outputs)?;
    for m in inputs {
        if !cfg.inputs.iter().any(|c| c.name == m.name) {
            return Err(Error::invalid_arg(format!(
                "model input '{}' is missing from the config",
                m.name
            )));
        }
    }
    Ok(())
}

/// Shape check used per request: does `shape` (with batch dim when batching) fit the config dims?
pub fn request_shape_fits(cfg: &ModelConfig, t: &TensorConfig, shape: &[i64]) -> bool {
    if cfg.batching() {
        !shape.is_empty() && shape_matches(&t.dims, &shape[1..])
    } else {
        shape_matches(&t.dims, shape)
    }
}

mod raw;

#[cfg(test)]
mod tests;
