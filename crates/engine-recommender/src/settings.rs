//! The recommender's settings, and how its config splits into the lookup's and the network's.

use std::path::{Path, PathBuf};

use triton_rust_core::config::{ModelConfig, TensorConfig};
use triton_rust_core::engine::{claim_for_file, EngineClaim};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::settings::Known;
use triton_rust_core::tensor::DataType;
use triton_rust_embedding::settings::TableSettings;

#[cfg(test)]
thread_local! {
    /// How many times this thread parsed a recommender's settings (tests count them).
    pub(crate) static PARSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The embedding lookup's output name inside the chain.
pub const LOOKUP_OUTPUT: &str = "OUTPUT0";

/// How a recommender model splits into its two engines.
#[derive(Debug)]
pub struct ChainPlan {
    pub lookup_config: ModelConfig,
    pub dense_config: ModelConfig,
    /// The network's engine (a claim's name).
    pub dense_engine: &'static str,
    pub dense_file: PathBuf,
    pub sparse_input: String,
    pub embeddings_input: String,
    /// The bags' lengths (`[tables]` a sample) when the keys come ragged: TorchRec's values
    /// and lengths.
    pub lengths_input: Option<String>,
    pub pipeline_parts: usize,
}

/// The recommender's own model parameters, read once at load; the tables come from the
/// store's parser (`TableSettings`), so both engines read them alike.
#[derive(Debug, Clone, PartialEq)]
pub struct RecommenderSettings {
    pub sparse_input: String,
    pub embeddings_input: String,
    /// The input holding the bags' lengths, when the config lists it (ragged keys).
    pub lengths_input: String,
    pub embeddings_type: DataType,
    pub pipeline_parts: usize,
    /// `recommender_dense_model`, under the version directory.
    pub dense_model: Option<String>,
    pub tables: usize,
    /// The row width every table shares.
    pub dim: usize,
}

triton_rust_core::parameters! {
    /// The recommender's model parameters, as config.pbtxt spells them (its tables are the
    /// store's parameters).
    pub struct RecommenderParams {
        recommender_sparse_input: String = "sparse".into(), doc "sparse";
        recommender_embeddings_input: String = "embeddings".into(), doc "embeddings";
        recommender_lengths_input: String = "lengths".into(), doc "lengths";
        recommender_embeddings_type: EmbeddingsType = EmbeddingsType::TYPE_FP32, doc "TYPE_FP32";
        recommender_pipeline_parts: usize = 1, doc "1";
        recommender_dense_model: Option<String> = None, doc "dense.onnx, else dense.pt, else dense.pt2";
    }
}

/// The network's embeddings input type, as config.pbtxt names types.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
pub enum EmbeddingsType {
    TYPE_FP32,
    TYPE_FP16,
}

impl RecommenderSettings {
    pub const KNOWN: &'static [Known] = RecommenderParams::KNOWN;

    pub fn from_config(config: &ModelConfig) -> Result<RecommenderSettings> {
        #[cfg(test)]
        PARSED.with(|n| n.set(n.get() + 1));
        let p: RecommenderParams = triton_rust_core::params::read(&config.parameters)?;
        let tables = TableSettings::from_parameters(&config.parameters)?;
        let dim = match tables.dims.as_slice() {
            [d, rest @ ..] if rest.iter().all(|x| x == d) => *d,
            _ => return Err(Error::invalid_arg(
                "the recommender engine needs one embedding_vecsize_per_table shared by every table",
            )),
        };
        if !(1..=16).contains(&p.recommender_pipeline_parts) {
            return Err(Error::invalid_arg(format!(
                "parameter 'recommender_pipeline_parts' must be a number of parts from 1 to 16, got '{}'",
                p.recommender_pipeline_parts
            )));
        }
        Ok(RecommenderSettings {
            sparse_input: p.recommender_sparse_input,
            embeddings_input: p.recommender_embeddings_input,
            lengths_input: p.recommender_lengths_input,
            embeddings_type: match p.recommender_embeddings_type {
                EmbeddingsType::TYPE_FP32 => DataType::F32,
                EmbeddingsType::TYPE_FP16 => DataType::F16,
            },
            pipeline_parts: p.recommender_pipeline_parts,
            dense_model: p.recommender_dense_model,
            tables: tables.names.len(),
            dim,
        })
    }
}

/// Splits a recommender model's config into the lookup's and the dense network's; the
/// network's engine is the one of `claims` its file's name says. `keys`: how many keys a
/// sample sends (one per table, or, pooled, every table's hotness); `pooled`: whether the
/// lookup pools bags (then the keys may come ragged, with their lengths).
pub fn plan(
    config: &ModelConfig,
    settings: &RecommenderSettings,
    keys: usize,
    pooled: bool,
    version_dir: &Path,
    claims: &[&'static EngineClaim],
) -> Result<ChainPlan> {
    let RecommenderSettings { sparse_input, embeddings_input, tables, .. } = settings.clone();
    let dim = settings.dim as i64;
    let sparse = config.inputs.iter().find(|t| t.name == sparse_input).ok_or_else(|| {
        Error::invalid_arg(format!(
            "the recommender engine takes the keys from input '{sparse_input}' (parameter recommender_sparse_input), which the config does not list"
        ))
    })?;
    if sparse.dtype != DataType::I64 {
        return Err(Error::invalid_arg(format!(
            "input '{sparse_input}' holds the keys: it must be TYPE_INT64"
        )));
    }
    if config.inputs.iter().any(|t| t.name == embeddings_input) {
        return Err(Error::invalid_arg(format!(
            "input '{embeddings_input}' is filled by the embedding lookup inside the model; clients do not send it (remove it from the config)"
        )));
    }
    // With max_batch_size 0 the batch dimension is the config's own first dim.
    let lead: Vec<i64> = if config.batching() { vec![] } else { vec![-1] };
    // ragged keys: a sample's bags of any length one after the other, and their lengths
    let lengths = config.inputs.iter().find(|t| t.name == settings.lengths_input);
    if let Some(lengths) = lengths {
        check_ragged(config, &sparse_input, lengths, &lead, tables, pooled)?;
    }
    let want: Vec<i64> =
        lead.iter().copied().chain([if lengths.is_some() { -1 } else { keys as i64 }]).collect();
    if sparse.dims != want {
        let what = match (lengths.is_some(), keys == tables) {
            (true, _) => "bags of any length, their lengths in another input",
            (false, true) => "one key per table",
            (false, false) => "every table's hotness",
        };
        return Err(Error::invalid_arg(format!(
            "input '{sparse_input}' must have dims {want:?} ({what}); it has {:?}",
            sparse.dims
        )));
    }
    let rows_dims: Vec<i64> = lead.iter().copied().chain([tables as i64, dim]).collect();
    let rows_type = settings.embeddings_type;
    let pipeline_parts = settings.pipeline_parts;
    let named = settings.dense_model.as_ref().map(|s| version_dir.join(s));
    let dense_file = match named {
        Some(f) => f,
        None => ["dense.onnx", "dense.pt", "dense.pt2"]
            .iter()
            .map(|f| version_dir.join(f))
            .find(|f| f.exists())
            .unwrap_or_else(|| version_dir.join("dense.onnx")),
    };
    if !dense_file.is_file() {
        return Err(Error::not_found(format!(
            "the recommender's dense network '{}' not found (dense.onnx, dense.pt or dense.pt2)",
            dense_file.display()
        )));
    }
    let file_name = dense_file.to_string_lossy();
    let dense_engine = claim_for_file(claims, &file_name)
        .filter(|c| c.default_file.is_some())
        .ok_or_else(|| {
            Error::invalid_arg(format!(
                "cannot tell the dense network's engine from '{file_name}' (.onnx, .pt or .pt2)"
            ))
        })?
        .name();
    let mut lookup_config = config.clone();
    lookup_config.inputs = std::iter::once(sparse).chain(lengths).cloned().collect();
    lookup_config.outputs = vec![TensorConfig {
        name: LOOKUP_OUTPUT.into(),
        dtype: rows_type,
        dims: rows_dims.clone(),
        reshape: None,
    }];
    let mut dense_config = config.clone();
    dense_config
        .inputs
        .retain(|t| t.name != sparse_input && lengths.is_none_or(|l| l.name != t.name));
    dense_config.ragged.clear();
    dense_config.inputs.push(TensorConfig {
        name: embeddings_input.clone(),
        dtype: rows_type,
        dims: rows_dims,
        reshape: None,
    });
    // `optimization { cuda { graphs: true } }` in the recommender's config is the network's
    // (a TorchScript network on a GPU instance: one graph per batch bucket, or per shape
    // without batching; the lookup has nothing to capture)
    Ok(ChainPlan {
        lookup_config,
        dense_config,
        dense_engine,
        dense_file,
        sparse_input,
        embeddings_input,
        lengths_input: lengths.map(|l| l.name.clone()),
        pipeline_parts,
    })
}

/// Ragged keys need the pooled lookup, their lengths as INT32 `[tables]` a sample, and, where
/// requests batch, `allow_ragged_batch` on the keys (Triton batches them end to end).
fn check_ragged(
    config: &ModelConfig,
    sparse_input: &str,
    lengths: &TensorConfig,
    lead: &[i64],
    tables: usize,
    pooled: bool,
) -> Result<()> {
    if !pooled {
        return Err(Error::invalid_arg(format!(
            "input '{}' gives bag lengths, which only pooled lookups take: set embedding_interface pooled (or remove the input)",
            lengths.name
        )));
    }
    let want: Vec<i64> = lead.iter().copied().chain([tables as i64]).collect();
    if lengths.dtype != DataType::I32 || lengths.dims != want {
        return Err(Error::invalid_arg(format!(
            "input '{}' holds each sample's bag lengths: it must be TYPE_INT32 with dims {want:?} (one per table)",
            lengths.name
        )));
    }
    if config.batching() && !config.ragged.iter().any(|r| r == sparse_input) {
        return Err(Error::invalid_arg(format!(
            "input '{sparse_input}' holds bags of any length: set allow_ragged_batch: true on it, so that requests of different lengths batch together"
        )));
    }
    Ok(())
}
