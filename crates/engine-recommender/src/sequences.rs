//! Sequence recommenders, MLPerf DLRM-v3's shape (issue 68): a request is one user, a history
//! of items and the candidates to score, each id looked up as one row (no pooling), and a
//! network package that reads the rows jagged (values and lengths) and answers one row per
//! candidate.
//!
//! A model with `parameters { key: "engine" value { string_value: "sequence_recommender" } }`
//! holds its tables under `<version>/tables/` (as an embedding model: every embedding
//! parameter applies) and its network as `<version>/network.pt2`, an AOTInductor package
//! (`examples/dlrm_v3/network.py` makes DLRM-v3's). What meets what is read from names:
//! - `sequence_lookups` lists `<stem>:<table>` pairs: the request's `<stem>_ids` are looked up,
//!   one row per id, in `<table>`, and the network takes the rows as `<stem>_rows`;
//! - every other input of the network comes from the request's input of the same name;
//! - an input `<group>_lengths` (one value a request) says how many values each other input
//!   named `<group>_...` holds in that request; every input of no group holds one value;
//! - a request's answer has as many rows as its `sequence_rows_input` holds values (the
//!   candidates).
//!
//! Every input is `allow_ragged_batch` with `dims: [ -1 ]`, so requests of any lengths batch
//! together (Triton's ragged batching: each input's values, request after request). A request
//! whose lengths disagree with what it sent, or whose ids are negative or past their table's
//! `vocabulary_size_per_table`, is refused naming the input, before the batch runs, and the
//! rest of the batch is answered. On `KIND_CPU` and `KIND_GPU` instances (a GPU instance's lookup
//! writes the rows on the GPU, where the package reads them), in the type the package takes its
//! rows (FP32, or FP16: an fp16 table's rows as stored).

mod engine;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;

use triton_rust_core::batch::RequestTensor;
use triton_rust_core::config::{ModelConfig, TensorConfig, TensorSpec};
use triton_rust_core::engine::{Device, Engine, EngineClaim, LoadedModel, ModelLoad, Signature};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::telemetry::MetricsSource;
use triton_rust_core::tensor::DataType;
use triton_rust_embedding::settings::TableSettings;
use triton_rust_engine_aoti::AotiModel;
use triton_rust_engine_embedding::{EmbeddingModel, Interface, StoreSettings};

use engine::SequenceEngine;

/// Sequence recommenders: a version directory of tables and a network package.
pub static SEQUENCE_CLAIM: EngineClaim = EngineClaim {
    names: &["sequence_recommender"],
    default_file: None,
    file_suffixes: &[],
    parameters: SequenceParams::KNOWN,
    backend_keys: &[],
    environment: &[],
    builds_on: &["embedding", "aoti"],
    keeps_sequences: false,
};

triton_rust_core::engine_kind!(
    /// The sequence recommender engine kind.
    SequenceKind, SEQUENCE_CLAIM, SequenceModel
);

triton_rust_core::parameters! {
    /// The sequence recommender's own parameters (its tables are the store's).
    pub struct SequenceParams {
        sequence_lookups: String =
            "user:user_id,hist_item:item_id,hist_category:category,cand_item:item_id,cand_category:category".into(),
            doc "user:user_id,hist_item:item_id,hist_category:category,cand_item:item_id,cand_category:category";
        sequence_rows_input: String = "cand_item_ids".into(), doc "cand_item_ids";
        sequence_network: String = "network.pt2".into(), doc "network.pt2";
        sequence_max_length: usize = 16384, doc "16384";
    }
}

/// One lookup: the request's `<stem>_ids` in table `table`, the network's `<stem>_rows`.
#[derive(Debug, Clone)]
struct Lookup {
    ids: String,
    rows: String,
    table: usize,
    dim: usize,
    /// The type the network takes the rows in (FP32 or FP16).
    dtype: DataType,
    /// Ids must lie in `[0, vocabulary)` when the table's size is given.
    vocabulary: Option<u64>,
}

/// What a request's inputs must agree on: the inputs of one group hold `lengths`' value of
/// values each; `singles` one value each.
#[derive(Debug, Clone)]
struct Groups {
    groups: Vec<(String, Vec<String>)>,
    singles: Vec<String>,
}

/// A sequence recommender, loaded: its lookup (the store, HPS's interface), its network, and
/// how the request's inputs become the network's.
pub struct SequenceModel {
    lookup: EmbeddingModel,
    network: AotiModel,
    lookups: Vec<Lookup>,
    groups: Groups,
    rows_input: String,
    /// The most values a `<group>_lengths` may give.
    max_length: usize,
    tables: usize,
    sig: Signature,
}

/// An input's position in the config, or an error naming it and why it is needed.
fn input<'c>(config: &'c ModelConfig, name: &str, why: &str) -> Result<&'c TensorConfig> {
    config.inputs.iter().find(|t| t.name == name).ok_or_else(|| {
        Error::invalid_arg(format!("the config lists no input '{name}', which {why}"))
    })
}

impl SequenceModel {
    pub fn describe(_load: &ModelLoad<'_>) -> Result<Option<Signature>> {
        Ok(None) // the config lists the clients' inputs and the network's output
    }

    pub fn load(load: &ModelLoad<'_>) -> Result<SequenceModel> {
        let config = load.config;
        let p: SequenceParams = triton_rust_core::params::read(&config.parameters)?;
        let tables = TableSettings::from_parameters(&config.parameters)?;
        // the store, looked up through HPS's interface: a batch's keys table by table
        let mut store = StoreSettings::from_config(config, load.model_file, load.backend)?;
        store.interface = Interface::Hps;
        let mut lookup_config = config.clone();
        lookup_config.max_batch_size = 0;
        lookup_config.ragged.clear();
        lookup_config.inputs = vec![
            TensorConfig {
                name: "KEYS".into(),
                dtype: DataType::I64,
                dims: vec![-1],
                reshape: None,
            },
            TensorConfig {
                name: "NUMKEYS".into(),
                dtype: DataType::I32,
                dims: vec![-1],
                reshape: None,
            },
        ];
        // the network: its package's own tensors, no batching of its own (its sizes are the
        // batch's totals)
        let file: PathBuf = load.model_file.join(&p.sequence_network);
        if !file.is_file() {
            return Err(Error::not_found(format!(
                "the sequence recommender's network '{}' not found (parameter sequence_network)",
                file.display()
            )));
        }
        let mut net_config = config.clone();
        net_config.max_batch_size = 0;
        net_config.ragged.clear();
        net_config.inputs.clear();
        net_config.outputs.clear();
        let described = ModelLoad { config: &net_config, model_file: &file, ..*load };
        let net_sig = AotiModel::describe(&described)?
            .ok_or_else(|| Error::internal("the package described nothing"))?;
        let lookups = lookups(&p.sequence_lookups, &tables, config, &net_sig)?;
        // the rows as the network takes them: fp16 ones (an fp16 table's) go up as stored
        lookup_config.outputs = vec![TensorConfig {
            name: "OUTPUT0".into(),
            dtype: rows_type(&lookups)?,
            dims: vec![-1],
            reshape: None,
        }];
        let lookup = EmbeddingModel::open(store, &lookup_config, load.shared)?;
        let as_config = |t: &TensorSpec| TensorConfig {
            name: t.name.clone(),
            dtype: t.dtype,
            dims: t.shape.clone(),
            reshape: None,
        };
        net_config.inputs = net_sig.inputs.iter().map(as_config).collect();
        net_config.outputs = net_sig.outputs.iter().map(as_config).collect();
        let network =
            AotiModel::load(&ModelLoad { config: &net_config, model_file: &file, ..*load })?;
        let groups = groups(config)?;
        check_inputs(config, &net_sig, &lookups, &groups)?;
        if !groups.groups.iter().any(|(_, members)| members.contains(&p.sequence_rows_input)) {
            return Err(Error::invalid_arg(format!(
                "input '{}' (parameter sequence_rows_input) gives each request's answer rows: it must be an input of a group, counted by a <group>_lengths input",
                p.sequence_rows_input
            )));
        }
        for t in &config.outputs {
            let Some(out) = net_sig.outputs.iter().find(|o| o.name == t.name) else {
                return Err(Error::invalid_arg(format!(
                    "output '{}' is not an output of the network package (it has {:?})",
                    t.name,
                    net_sig.outputs.iter().map(|o| &o.name).collect::<Vec<_>>()
                )));
            };
            if out.dtype != t.dtype {
                return Err(Error::invalid_arg(format!(
                    "output '{}' is {:?} in the package, {:?} in the config",
                    t.name, out.dtype, t.dtype
                )));
            }
        }
        let sig = Signature {
            inputs: config
                .inputs
                .iter()
                .map(|t| TensorSpec { name: t.name.clone(), dtype: t.dtype, shape: vec![-1, -1] })
                .collect(),
            outputs: config
                .outputs
                .iter()
                .map(|t| TensorSpec {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: std::iter::once(-1).chain(t.dims.iter().copied()).collect(),
                })
                .collect(),
        };
        Ok(SequenceModel {
            lookup,
            network,
            lookups,
            groups,
            rows_input: p.sequence_rows_input,
            max_length: p.sequence_max_length,
            tables: tables.names.len(),
            sig,
        })
    }
}

/// The `<stem>:<table>` pairs of `spec`, each checked against the tables, the config's
/// inputs and the network's.
fn lookups(
    spec: &str,
    tables: &TableSettings,
    config: &ModelConfig,
    net: &Signature,
) -> Result<Vec<Lookup>> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((stem, table)) = item.split_once(':') else {
            return Err(Error::invalid_arg(format!(
                "parameter 'sequence_lookups': '{item}' is not <stem>:<table>"
            )));
        };
        let (stem, table) = (stem.trim(), table.trim());
        let t = tables.names.iter().position(|n| n == table).ok_or_else(|| {
            Error::invalid_arg(format!(
                "parameter 'sequence_lookups': table '{table}' is not one of embedding_table_names {:?}",
                tables.names
            ))
        })?;
        let (ids, rows) = (format!("{stem}_ids"), format!("{stem}_rows"));
        let given = input(config, &ids, &format!("sequence_lookups looks up in table '{table}'"))?;
        if given.dtype != DataType::I64 {
            return Err(Error::invalid_arg(format!(
                "input '{ids}' holds ids: it must be TYPE_INT64"
            )));
        }
        let dim = tables.dims.get(t).or(tables.dims.first()).copied().unwrap_or(0);
        let Some(takes) = net.inputs.iter().find(|i| i.name == rows) else {
            return Err(Error::invalid_arg(format!(
                "the network package takes no input '{rows}' for the rows of '{ids}'"
            )));
        };
        if !matches!(takes.dtype, DataType::F32 | DataType::F16)
            || takes.shape.len() != 2
            || !matches!(takes.shape[1], -1) && takes.shape[1] != dim as i64
        {
            return Err(Error::invalid_arg(format!(
                "the network's input '{rows}' is {:?} {:?}; the lookup gives FP32 or FP16 rows of {dim}",
                takes.dtype, takes.shape
            )));
        }
        let vocabulary = tables.vocabulary.get(t).copied().flatten();
        out.push(Lookup { ids, rows, table: t, dim, dtype: takes.dtype, vocabulary });
    }
    Ok(out)
}

/// The one row type the network takes every lookup's rows in (FP32, or FP16: the lookup writes
/// all of them in one output); an error naming two inputs that differ.
fn rows_type(lookups: &[Lookup]) -> Result<DataType> {
    let Some(first) = lookups.first() else { return Ok(DataType::F32) };
    match lookups.iter().find(|l| l.dtype != first.dtype) {
        Some(other) => Err(Error::invalid_arg(format!(
            "the network takes '{}' as {:?} but '{}' as {:?}: the lookup gives every table's rows in one type",
            first.rows, first.dtype, other.rows, other.dtype
        ))),
        None => Ok(first.dtype),
    }
}

/// The config's inputs by length: `<group>_lengths` and the inputs named `<group>_...`; the rest one value each.
fn groups(config: &ModelConfig) -> Result<Groups> {
    let names: Vec<&str> = config.inputs.iter().map(|t| t.name.as_str()).collect();
    let mut groups = Vec::new();
    for lengths in names.iter().filter(|n| n.ends_with("_lengths")) {
        let prefix = lengths.trim_end_matches("lengths");
        let members: Vec<String> = names
            .iter()
            .filter(|n| n.starts_with(prefix) && *n != lengths)
            .map(|n| n.to_string())
            .collect();
        groups.push((lengths.to_string(), members));
    }
    // one length for each input: a name two groups claim (`a_lengths` and `a_b_lengths` both
    // claim `a_b_ids`) could never satisfy both
    for (i, (lengths, members)) in groups.iter().enumerate() {
        for (other, theirs) in groups.iter().skip(i + 1) {
            let shared = members.iter().find(|m| theirs.contains(m)).or_else(|| {
                [lengths, other].into_iter().find(|l| members.contains(l) || theirs.contains(l))
            });
            if let Some(name) = shared {
                return Err(Error::invalid_arg(format!(
                    "input '{name}' is counted by both '{lengths}' and '{other}': name the groups so that no input's name begins with two of them"
                )));
            }
        }
    }
    let singles = names
        .iter()
        .filter(|n| !groups.iter().any(|(l, m)| l == *n || m.iter().any(|x| x == *n)))
        .map(|n| n.to_string())
        .collect();
    Ok(Groups { groups, singles })
}

/// Every input ragged (requests of any lengths batch together), and every input of the
/// network fed: by a lookup's rows, or by the request's input of its name and type.
fn check_inputs(
    config: &ModelConfig,
    net: &Signature,
    lookups: &[Lookup],
    groups: &Groups,
) -> Result<()> {
    if !config.batching() {
        return Err(Error::invalid_arg(
            "the sequence recommender batches requests of any lengths: set max_batch_size > 0",
        ));
    }
    for t in &config.inputs {
        if t.dims != [-1] || !config.ragged.contains(&t.name) {
            return Err(Error::invalid_arg(format!(
                "input '{}' must have dims [ -1 ] and allow_ragged_batch: true (a request's values, any number)",
                t.name
            )));
        }
    }
    for (lengths, _) in &groups.groups {
        if input(config, lengths, "counts its group's values")?.dtype != DataType::I64 {
            return Err(Error::invalid_arg(format!(
                "input '{lengths}' holds lengths: it must be TYPE_INT64"
            )));
        }
    }
    for t in &net.inputs {
        if lookups.iter().any(|l| l.rows == t.name) {
            continue;
        }
        let given = input(config, &t.name, "the network package takes")?;
        if given.dtype != t.dtype {
            return Err(Error::invalid_arg(format!(
                "input '{}' is {:?} in the config, {:?} in the network package",
                t.name, given.dtype, t.dtype
            )));
        }
    }
    Ok(())
}

/// An input's values as i64s (little-endian, as Triton carries them).
fn i64s(bytes: &[u8]) -> impl Iterator<Item = i64> + '_ {
    bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
}

fn request_host<'r>(t: &'r RequestTensor<'_>) -> Result<std::borrow::Cow<'r, [u8]>> {
    t.host_bytes().ok_or_else(|| {
        Error::unsupported(format!("input '{}' in GPU memory is not taken yet", t.name))
    })
}

impl LoadedModel for SequenceModel {
    fn signature(&self) -> &Signature {
        &self.sig
    }

    fn metrics_source(&self) -> Option<Arc<dyn MetricsSource>> {
        self.lookup.metrics_source()
    }

    fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        let count = |name: &str| -> Result<usize> {
            let t = inputs
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| Error::invalid_arg(format!("input '{name}' is missing")))?;
            Ok(t.byte_size() / t.dtype.size().unwrap_or(1).max(1))
        };
        for name in &self.groups.singles {
            let n = count(name)?;
            if n != 1 {
                return Err(Error::invalid_arg(format!(
                    "input '{name}' holds {n} values; a request has one"
                )));
            }
        }
        for (lengths, members) in &self.groups.groups {
            let t = inputs
                .iter()
                .find(|t| &t.name == lengths)
                .ok_or_else(|| Error::invalid_arg(format!("input '{lengths}' is missing")))?;
            let values: Vec<i64> = i64s(&request_host(t)?).collect();
            let [want] = values[..] else {
                return Err(Error::invalid_arg(format!(
                    "input '{lengths}' holds {} values; a request has one",
                    values.len()
                )));
            };
            let least = i64::from(members.contains(&self.rows_input));
            if want < least || want as u64 > self.max_length as u64 {
                return Err(Error::invalid_arg(format!(
                    "input '{lengths}' is {want}; it must be from {least} to {} (parameter sequence_max_length)",
                    self.max_length
                )));
            }
            for m in members {
                let n = count(m)?;
                if n as i64 != want {
                    return Err(Error::invalid_arg(format!(
                        "input '{m}' holds {n} values but '{lengths}' says {want}"
                    )));
                }
            }
        }
        for l in &self.lookups {
            let t = inputs
                .iter()
                .find(|t| t.name == l.ids)
                .ok_or_else(|| Error::invalid_arg(format!("input '{}' is missing", l.ids)))?;
            let bytes = request_host(t)?;
            let bad = i64s(&bytes).find(|&k| k < 0 || l.vocabulary.is_some_and(|v| k as u64 >= v));
            if let Some(k) = bad {
                let range =
                    l.vocabulary.map_or("0 or more".to_string(), |v| format!("in [0, {v})"));
                return Err(Error::invalid_arg(format!(
                    "input '{}' holds id {k}; its table's ids are {range}",
                    l.ids
                )));
            }
        }
        Ok(())
    }

    fn request_rows(&self, inputs: &[RequestTensor<'_>]) -> Option<usize> {
        let t = inputs.iter().find(|t| t.name == self.rows_input)?;
        Some(t.byte_size() / 8)
    }

    fn instance(&self, device: Device) -> Result<Box<dyn Engine>> {
        Ok(Box::new(SequenceEngine {
            lookup: self.lookup.engine(device)?,
            network: self.network.engine(device)?,
            lookups: self.lookups.clone(),
            tables: self.tables,
            net_inputs: self.network.signature().inputs.clone(),
            net_outputs: self.network.signature().outputs.iter().map(|t| t.name.clone()).collect(),
        }))
    }
}
