//! Two engines as one model: the recommender's single-model path. The embedding store's
//! lookup (the first engine, `embedding_interface: batched`) writes the embeddings the
//! dense network (the second engine, ONNX or TorchScript) reads, inside the backend: no
//! trip through Triton between them, one model to configure, load and version.
//!
//! A model with `parameters { key: "engine" value { string_value: "recommender" } }`
//! holds its tables under `<version>/tables/` (as an embedding model) and its dense
//! network as `<version>/dense.onnx`, `<version>/dense.pt` or `<version>/dense.pt2`. Its config lists the
//! clients' inputs (the keys, `recommender_sparse_input`, default `sparse`, INT64
//! `[tables]`, and the dense features) and the network's outputs; the network's input
//! that takes the embeddings is `recommender_embeddings_input` (default `embeddings`,
//! `[tables, dim]` of `recommender_embeddings_type`: `TYPE_FP32`, the default, or
//! `TYPE_FP16` for an fp16 network: the lookup then writes fp16 rows, half the bytes,
//! and the network has nothing to cast). Every embedding-store parameter applies as for an embedding
//! model. On a GPU instance the lookup writes the rows into its own device buffer (every
//! table in one pass) and the network reads that buffer as its input, in place: the
//! embeddings never leave the GPU and never pass through Triton. Where the network replays
//! a CUDA graph already captured for the batch's shape and offers that graph's own input
//! (`Engine::graph_input`: the AOTInductor engine does), the lookup writes into it instead,
//! and the replay copies nothing for them. The network's other
//! inputs (the dense features, in host memory) go to the GPU on a thread of their own
//! while the lookup runs, when a [`Stager`] is given and they are large enough to pay
//! for the thread.
//!
//! `recommender_pipeline_parts: P` (default 1) runs a large batch on a GPU instance in P
//! parts: the lookup of part k+1 runs while the network runs on part k (the lookup moves
//! keys over PCIe and rows through HBM, the network keeps the tensor cores busy), each
//! part's rows written into one buffer of the chain's, the network's outputs gathered in
//! order into one response. Batches under P × 1024 rows run whole.

use std::path::{Path, PathBuf};

use std::ops::Range;
use std::sync::Arc;

use triton_rust_core::batch::{BatchData, BatchTensor, RequestTensor};
use triton_rust_core::config::{ModelConfig, TensorConfig, TensorSpec};
use triton_rust_core::engine::{
    claim_for_file, Device, Engine, EngineClaim, OutputView, Signature,
};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::settings::Known;
use triton_rust_core::tensor::{Bytes, DataType};
use triton_rust_embedding::settings::TableSettings;

use triton_rust_cuda::{DeviceBuffer, DeviceOps, DeviceView};

/// Copies host bytes to the chain's GPU; done when `stage` returns. The views live until
/// the next call. The backend gives one to a chain on a GPU instance.
pub trait Stager: Send {
    fn stage(&mut self, parts: &[&[u8]]) -> Result<Vec<DeviceView<'_>>>;
}

/// Host inputs of the network at least this large (in all) are staged beside the lookup;
/// smaller ones cost less than the thread and are left to the network's engine.
const STAGE_BESIDE: usize = 1 << 20;

/// The fewest rows a part of a batch run in parts has.
const MIN_PART_ROWS: usize = 1024;

/// How a recommender model splits into its two engines.
#[derive(Debug)]
pub struct ChainPlan {
    pub lookup_config: ModelConfig,
    pub dense_config: ModelConfig,
    /// The network's engine (a claim's name).
    pub dense_engine: &'static str,
    pub dense_file: PathBuf,
    sparse_input: String,
    embeddings_input: String,
    pipeline_parts: usize,
}

/// The embedding engine's output name inside the chain.
const LOOKUP_OUTPUT: &str = "OUTPUT0";

/// The recommender's own model parameters, read once at load; the tables come from the
/// store's parser (`TableSettings`), so both engines read them alike.
#[derive(Debug, Clone, PartialEq)]
pub struct RecommenderSettings {
    pub sparse_input: String,
    pub embeddings_input: String,
    pub embeddings_type: DataType,
    pub pipeline_parts: usize,
    /// `recommender_dense_model`, under the version directory.
    pub dense_model: Option<String>,
    pub tables: usize,
    /// The row width every table shares.
    pub dim: usize,
}

impl RecommenderSettings {
    pub const KNOWN: &'static [Known] = &[
        ("recommender_sparse_input", "sparse"),
        ("recommender_embeddings_input", "embeddings"),
        ("recommender_embeddings_type", "TYPE_FP32"),
        ("recommender_pipeline_parts", "1"),
        ("recommender_dense_model", "dense.onnx, else dense.pt, else dense.pt2"),
    ];

    pub fn from_config(config: &ModelConfig) -> Result<RecommenderSettings> {
        let param = |key: &str, default: &str| -> String {
            config
                .parameters
                .get(key)
                .map(|s| s.trim())
                .filter(|s| !s.is_empty())
                .unwrap_or(default)
                .to_string()
        };
        let tables = TableSettings::from_parameters(&config.parameters)?;
        let dim = match tables.dims.as_slice() {
            [d, rest @ ..] if rest.iter().all(|x| x == d) => *d,
            _ => return Err(Error::invalid_arg(
                "the recommender engine needs one embedding_vecsize_per_table shared by every table",
            )),
        };
        let embeddings_type = match param("recommender_embeddings_type", "TYPE_FP32").as_str() {
            "TYPE_FP32" => DataType::F32,
            "TYPE_FP16" => DataType::F16,
            other => {
                return Err(Error::invalid_arg(format!(
                    "parameter recommender_embeddings_type is TYPE_FP32 or TYPE_FP16, not '{other}'"
                )))
            }
        };
        let pipeline_parts = param("recommender_pipeline_parts", "1")
            .parse::<usize>()
            .ok()
            .filter(|p| (1..=16).contains(p))
            .ok_or_else(|| {
                Error::invalid_arg(
                    "parameter recommender_pipeline_parts is a number of parts from 1 to 16",
                )
            })?;
        Ok(RecommenderSettings {
            sparse_input: param("recommender_sparse_input", "sparse"),
            embeddings_input: param("recommender_embeddings_input", "embeddings"),
            embeddings_type,
            pipeline_parts,
            dense_model: config
                .parameters
                .get("recommender_dense_model")
                .map(|s| s.trim().to_string()),
            tables: tables.names.len(),
            dim,
        })
    }
}

/// Splits a recommender model's config into the lookup's and the dense network's; the
/// network's engine is the one of `claims` its file's name says.
pub fn plan(
    config: &ModelConfig,
    version_dir: &Path,
    claims: &'static [EngineClaim],
) -> Result<ChainPlan> {
    let settings = RecommenderSettings::from_config(config)?;
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
    let want: Vec<i64> = lead.iter().copied().chain([tables as i64]).collect();
    if sparse.dims != want {
        return Err(Error::invalid_arg(format!(
            "input '{sparse_input}' must have dims {want:?} (one key per table); it has {:?}",
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
    lookup_config.inputs = vec![sparse.clone()];
    lookup_config.outputs = vec![TensorConfig {
        name: LOOKUP_OUTPUT.into(),
        dtype: rows_type,
        dims: rows_dims.clone(),
        reshape: None,
    }];
    lookup_config.parameters.insert("embedding_interface".into(), "batched".into());
    let mut dense_config = config.clone();
    dense_config.inputs.retain(|t| t.name != sparse_input);
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
        pipeline_parts,
    })
}

/// The lookup's `run_into`, `Ok(false)` when the lookup engine offers none.
fn run_into(
    lookup: &mut dyn Engine,
    inputs: &[BatchTensor<'_>],
    out: &mut triton_rust_cuda::DeviceViewMut<'_>,
) -> Result<bool> {
    lookup.lookup().map_or(Ok(false), |l| l.run_into(inputs, out))
}

pub struct Chain {
    lookup: Box<dyn Engine>,
    dense: Box<dyn Engine>,
    sparse_input: String,
    embeddings_input: String,
    stager: Option<Box<dyn Stager>>,
    /// A GPU instance's device operations: the parts' buffer of rows and their outputs' copies.
    ops: Option<Arc<dyn DeviceOps>>,
    parts: usize,
    /// The rows of a batch run in parts (grown to the largest batch, never shrunk).
    rows_buf: Option<DeviceBuffer>,
    sig: Signature,
}

impl Chain {
    pub fn new(
        lookup: Box<dyn Engine>,
        dense: Box<dyn Engine>,
        plan: &ChainPlan,
        device: Device,
    ) -> Result<Chain> {
        if device != Device::Cpu && !dense.accepts_device_inputs() {
            return Err(Error::unsupported(format!(
                "on a KIND_GPU instance the recommender's network reads the embeddings in GPU memory, which the engine of '{}' cannot; use a TorchScript dense.pt or an AOTInductor dense.pt2 (or KIND_CPU)",
                plan.dense_file.display()
            )));
        }
        let emb = dense.inputs().iter().find(|t| t.name == plan.embeddings_input).ok_or_else(|| {
            Error::invalid_arg(format!(
                "the dense network '{}' has no input '{}' to take the embeddings (parameter recommender_embeddings_input)",
                plan.dense_file.display(),
                plan.embeddings_input
            ))
        })?;
        let rows = &lookup.outputs()[0];
        let fits = emb.dtype == rows.dtype
            && emb.shape.len() == rows.shape.len()
            && emb.shape.iter().zip(&rows.shape).all(|(&a, &b)| a == -1 || b == -1 || a == b);
        if !fits {
            return Err(Error::invalid_arg(format!(
                "the dense network's input '{}' is {:?} {:?}; the lookup gives {:?} {:?}",
                emb.name, emb.dtype, emb.shape, rows.dtype, rows.shape
            )));
        }
        let mut inputs: Vec<TensorSpec> =
            dense.inputs().iter().filter(|t| t.name != plan.embeddings_input).cloned().collect();
        inputs.push(lookup.inputs()[0].clone());
        let sig = Signature { inputs, outputs: dense.outputs().to_vec(), device };
        Ok(Chain {
            lookup,
            dense,
            sparse_input: plan.sparse_input.clone(),
            embeddings_input: plan.embeddings_input.clone(),
            stager: None,
            ops: None,
            parts: plan.pipeline_parts,
            rows_buf: None,
            sig,
        })
    }

    /// On a GPU instance: stages the network's large host inputs with `stager` while the
    /// lookup runs, and runs large batches in parts (`recommender_pipeline_parts`) with `ops`.
    pub fn with_gpu(mut self, stager: Box<dyn Stager>, ops: Arc<dyn DeviceOps>) -> Chain {
        self.stager = Some(stager);
        self.ops = Some(ops);
        self
    }
}

/// One output of a batch run in parts, its parts' bytes gathered in order on the host.
struct Gathered {
    name: String,
    dtype: DataType,
    /// Dims after the first (the rows).
    rest: Vec<i64>,
    bytes: Vec<u8>,
}

/// An input's host bytes; an error naming it when they are in GPU memory.
fn host_of<'a>(t: &'a BatchTensor<'_>) -> Result<&'a [u8]> {
    t.host_bytes().ok_or_else(|| Error::unsupported(format!("input '{}' in GPU memory", t.name)))
}

/// The network's inputs in its order: `embeddings` where it takes the lookup's rows, the
/// `others` (its other inputs, in its order) everywhere else.
fn network_inputs<'a>(
    dense: &dyn Engine,
    embeddings_input: &str,
    embeddings: BatchTensor<'a>,
    others: impl IntoIterator<Item = Result<BatchTensor<'a>>>,
) -> Result<Vec<BatchTensor<'a>>> {
    let (mut embeddings, mut others) = (Some(embeddings), others.into_iter());
    dense
        .inputs()
        .iter()
        .map(|spec| match embeddings.take_if(|_| spec.name == embeddings_input) {
            Some(e) => Ok(e),
            None => others.next().unwrap_or_else(|| {
                Err(Error::internal("the network's inputs changed during a run"))
            }),
        })
        .collect()
}

/// Rows `r` of a host input whose first dim holds `rows` rows.
fn rows_of<'a>(
    t: &BatchTensor<'_>,
    bytes: &'a [u8],
    rows: usize,
    r: &Range<usize>,
) -> Result<BatchTensor<'a>> {
    if rows == 0 || bytes.len() % rows != 0 {
        return Err(Error::internal(format!(
            "input '{}': {} bytes are not {rows} whole rows",
            t.name,
            bytes.len()
        )));
    }
    let per = bytes.len() / rows;
    let mut shape = t.shape.clone();
    if let Some(first) = shape.first_mut() {
        *first = r.len() as i64;
    }
    Ok(BatchTensor {
        name: t.name.clone(),
        dtype: t.dtype,
        shape,
        data: BatchData::Borrowed(Bytes::Host(&bytes[r.start * per..r.end * per])),
    })
}

impl Chain {
    /// Runs a batch whose network replays a CUDA graph already captured with the lookup
    /// writing its rows straight into that graph's own input, so that the replay copies
    /// nothing for them (DLRM at 4096 rows: 27 MB a batch). `Ok(false)`, having done
    /// nothing, when the network has no such graph or the lookup cannot write there; the
    /// other inputs go to the network as they are (the caller stages large host ones
    /// beside the lookup instead, by the other path).
    fn run_in_graph_input(
        &mut self,
        lookup_in: &[BatchTensor<'_>],
        others: &[&BatchTensor<'_>],
        rows: usize,
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<bool> {
        let spec = &self.lookup.outputs()[0];
        let (rows_type, mut shape) = (spec.dtype, spec.shape.clone());
        let Some(first) = shape.first_mut() else { return Ok(false) };
        *first = rows as i64;
        let Chain { lookup, dense, embeddings_input, .. } = self;
        let embeddings = |data| BatchTensor {
            name: embeddings_input.clone(),
            dtype: rows_type,
            shape: shape.clone(),
            data: BatchData::Borrowed(data),
        };
        let rest = || others.iter().map(|t| borrowed(t));
        let probe =
            network_inputs(dense.as_ref(), embeddings_input, embeddings(Bytes::Host(&[])), rest())?;
        // written while no run of the network is in flight: this instance runs one batch at
        // a time, and the network's run waits for its work before it returns
        let Some(mut slot) = dense.graph_input(&probe, embeddings_input) else {
            return Ok(false);
        };
        drop(probe);
        if !run_into(&mut **lookup, lookup_in, &mut slot)? {
            return Ok(false);
        }
        let written = embeddings(Bytes::Device(slot.into_view()));
        let dense_in = network_inputs(dense.as_ref(), embeddings_input, written, rest())?;
        dense.run(&dense_in, outputs, sink)?;
        Ok(true)
    }

    /// Runs a batch of `rows` rows in `self.parts` parts, the lookup of each part beside the
    /// network's run on the part before (see the module's notes). `Ok(false)`, having
    /// answered nothing, when the lookup cannot write into the chain's buffer.
    #[allow(clippy::too_many_arguments)]
    fn run_in_parts(
        &mut self,
        ops: Arc<dyn DeviceOps>,
        device: i32,
        keys: &BatchTensor<'_>,
        others: &[&BatchTensor<'_>],
        rows: usize,
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<bool> {
        let spec = &self.lookup.outputs()[0];
        let (rows_type, rows_shape) = (spec.dtype, spec.shape.clone());
        let row_bytes = rows_shape.iter().skip(1).map(|&d| d.max(0) as usize).product::<usize>()
            * rows_type.size().unwrap_or(4);
        let Chain { lookup, dense, stager, rows_buf, embeddings_input, parts, .. } = self;
        // parts are cut from host inputs; anything else runs whole
        if !dense.accepts_device_inputs()
            || keys.host_bytes().is_none()
            || others.iter().any(|t| t.host_bytes().is_none())
        {
            return Ok(false);
        }
        let total = rows * row_bytes;
        if rows_buf.as_ref().is_none_or(|b| b.len() < total) {
            *rows_buf = None; // the old buffer goes before the new one is made
            *rows_buf = Some(ops.alloc(device, total)?);
        }
        let per = rows.div_ceil(*parts);
        let ranges: Vec<Range<usize>> = (0..*parts)
            .map(|i| i * per..((i + 1) * per).min(rows))
            .filter(|r| !r.is_empty())
            .collect();
        let mut views = Vec::with_capacity(ranges.len());
        let mut rest = rows_buf.as_mut().expect("allocated above").view_mut();
        for r in &ranges {
            let (part, tail) = rest.split_at(r.len() * row_bytes);
            views.push(part);
            rest = tail;
        }
        let key_bytes = host_of(keys)?;
        let key_part = |r: &Range<usize>| rows_of(keys, key_bytes, rows, r);
        let host = others.iter().map(|t| host_of(t)).collect::<Result<Vec<_>>>()?;
        let host_total: usize = host.iter().map(|b| b.len()).sum();
        let mut views = views.into_iter();
        let mut cur = views.next();
        // part 0's lookup, the network's host inputs staged beside it when large
        let first = [key_part(&ranges[0])?];
        let (looked, staged) = match stager.as_mut().filter(|_| host_total >= STAGE_BESIDE) {
            Some(stager) => {
                let stager: &mut dyn Stager = &mut **stager;
                let parts_in = host.clone();
                std::thread::scope(|s| {
                    let job = s.spawn(move || stager.stage(&parts_in));
                    let looked =
                        run_into(&mut **lookup, &first, cur.as_mut().expect("one part at least"));
                    let staged = job
                        .join()
                        .map_err(|_| Error::internal("staging the network's inputs panicked"));
                    (looked, staged)
                })
            }
            None => (
                run_into(&mut **lookup, &first, cur.as_mut().expect("one part at least")),
                Ok(Ok(Vec::new())),
            ),
        };
        if !looked? {
            return Ok(false);
        }
        let staged = staged??;
        let mut gathered: Vec<Gathered> = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            let part_rows = cur
                .take()
                .ok_or_else(|| Error::internal("a part's rows went missing"))?
                .into_view();
            let mut next = views.next();
            // the network's inputs for rows r: its embeddings in place, the rest sliced
            let mut shape = rows_shape.clone();
            shape[0] = r.len() as i64;
            let embeddings = BatchTensor {
                name: embeddings_input.clone(),
                dtype: rows_type,
                shape,
                data: BatchData::Borrowed(Bytes::Device(part_rows)),
            };
            let sliced = others.iter().zip(&host).enumerate().map(|(k, (t, bytes))| {
                let mut part = rows_of(t, bytes, rows, r)?;
                if let Some(v) = staged.get(k) {
                    let per = bytes.len() / rows;
                    let view = v.slice(r.start * per..r.end * per).ok_or_else(|| {
                        Error::internal("a staged input is shorter than its rows")
                    })?;
                    part.data = BatchData::Borrowed(Bytes::Device(view));
                }
                Ok(part)
            });
            let dense_in = network_inputs(dense.as_ref(), embeddings_input, embeddings, sliced)?;
            let next_keys = match ranges.get(i + 1) {
                Some(nr) => Some([key_part(nr)?]),
                None => None,
            };
            let gathered = &mut gathered;
            let ops = &ops;
            let dense = &mut *dense;
            let (ran, looked) = std::thread::scope(|s| {
                let job = s.spawn(move || {
                    dense.run(&dense_in, outputs, &mut |o: OutputView<'_>| {
                        if o.shape.first() != Some(&(r.len() as i64)) {
                            return Err(Error::unsupported(format!(
                                "output '{}' of shape {:?} does not have the part's {} rows first: set recommender_pipeline_parts to 1",
                                o.name,
                                o.shape,
                                r.len()
                            )));
                        }
                        let at = match gathered.iter().position(|g| g.name == o.name) {
                            Some(at) => at,
                            None => {
                                gathered.push(Gathered { name: o.name.to_string(), dtype: o.dtype, rest: o.shape[1..].to_vec(), bytes: Vec::new() });
                                gathered.len() - 1
                            }
                        };
                        let g = &mut gathered[at];
                        let start = g.bytes.len();
                        g.bytes.resize(start + o.data.len(), 0);
                        ops.copy(o.data, triton_rust_cuda::BytesMut::Host(&mut g.bytes[start..]))?;
                        Ok(())
                    })
                });
                let looked = match (next_keys.as_ref(), next.as_mut()) {
                    (Some(k), Some(v)) => run_into(&mut **lookup, k, v).map(Some),
                    _ => Ok(None),
                };
                (
                    job.join().map_err(|_| {
                        Error::internal("the network panicked on a part of the batch")
                    }),
                    looked,
                )
            });
            ran??;
            match looked? {
                Some(true) => cur = next,
                Some(false) => {
                    return Err(Error::internal(
                        "the lookup stopped writing into the chain's buffer",
                    ))
                }
                None => {}
            }
        }
        for g in &gathered {
            let shape: Vec<i64> =
                std::iter::once(rows as i64).chain(g.rest.iter().copied()).collect();
            sink(OutputView {
                name: &g.name,
                dtype: g.dtype,
                shape: &shape,
                data: Bytes::Host(&g.bytes),
            })?;
        }
        Ok(true)
    }
}

/// A view of a batch input for one of the chain's engines (the chain takes host inputs).
fn borrowed<'a>(t: &'a BatchTensor<'_>) -> Result<BatchTensor<'a>> {
    let bytes =
        t.bytes().ok_or_else(|| Error::unsupported(format!("input '{}' in GPU memory", t.name)))?;
    Ok(BatchTensor {
        name: t.name.clone(),
        dtype: t.dtype,
        shape: t.shape.clone(),
        data: BatchData::Borrowed(bytes),
    })
}

impl Engine for Chain {
    fn signature(&self) -> &Signature {
        &self.sig
    }

    fn metrics_source(
        &self,
    ) -> Option<std::sync::Arc<dyn triton_rust_core::telemetry::MetricsSource>> {
        self.lookup.metrics_source()
    }

    /// Inputs in GPU memory (CUDA shared memory) go where they are when both engines take
    /// them: the keys to the GPU lookup, the rest to the network.
    fn accepts_device_inputs(&self) -> bool {
        self.sig.device != Device::Cpu
            && self.lookup.accepts_device_inputs()
            && self.dense.accepts_device_inputs()
    }

    /// The keys by the lookup's checks, and what the network takes from the request by its
    /// own (an AOTInductor package's index ranges, ONNX's shared dimensions): engines check
    /// their inputs by name, so the network is shown the whole request.
    fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        if let Some(i) = inputs.iter().position(|t| t.name == self.sparse_input) {
            self.lookup.check_request(&inputs[i..=i])?;
        }
        self.dense.check_request(inputs)
    }

    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let keys = inputs.iter().find(|t| t.name == self.sparse_input).ok_or_else(|| {
            Error::internal(format!("input '{}' missing from the batch", self.sparse_input))
        })?;
        let lookup_in = [borrowed(keys)?];
        // The network's inputs other than the embeddings, in its order.
        let others = self
            .dense
            .inputs()
            .iter()
            .filter(|spec| spec.name != self.embeddings_input)
            .map(|spec| {
                inputs.iter().find(|t| t.name == spec.name).ok_or_else(|| {
                    Error::internal(format!(
                        "input '{}' of the dense network missing from the batch",
                        spec.name
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let host: usize = others.iter().map(|t| t.host_bytes().map_or(0, <[u8]>::len)).sum();
        let rows = keys.shape.first().map_or(0, |&r| r.max(0) as usize);
        if let (Device::Gpu(device), Some(ops)) = (self.sig.device, self.ops.clone()) {
            if self.parts > 1
                && rows >= self.parts * MIN_PART_ROWS
                && self.run_in_parts(ops, device, keys, &others, rows, outputs, sink)?
            {
                return Ok(());
            }
        }
        if self.sig.device != Device::Cpu
            && !(self.stager.is_some() && host >= STAGE_BESIDE)
            && self.run_in_graph_input(&lookup_in, &others, rows, outputs, sink)?
        {
            return Ok(());
        }
        // The dense network runs inside the lookup's sink, on the lookup's own buffer of
        // rows: nothing is copied between the two (unless the network's CUDA graph copies
        // them into its own input).
        let (dense, embeddings_input, lookup) =
            (&mut self.dense, &self.embeddings_input, &mut self.lookup);
        let mut ran = false;
        let mut run_dense =
            |o: OutputView<'_>, staged: Option<Vec<DeviceView<'_>>>| -> Result<()> {
                // Host rows on a CPU instance; on a GPU instance the lookup's own device
                // buffer, which the network reads in place.
                if matches!(o.data, Bytes::Device(_)) && !dense.accepts_device_inputs() {
                    return Err(Error::unsupported(
                        "the dense network's engine cannot read inputs in GPU memory",
                    ));
                }
                let embeddings = BatchTensor {
                    name: embeddings_input.clone(),
                    dtype: o.dtype,
                    shape: o.shape.to_vec(),
                    data: BatchData::Borrowed(o.data),
                };
                let mut staged = staged.map(Vec::into_iter);
                let rest = others.iter().map(|t| match staged.as_mut().and_then(Iterator::next) {
                    Some(v) => Ok(BatchTensor {
                        name: t.name.clone(),
                        dtype: t.dtype,
                        shape: t.shape.clone(),
                        data: BatchData::Borrowed(Bytes::Device(v)),
                    }),
                    None => borrowed(t),
                });
                let dense_in = network_inputs(dense.as_ref(), embeddings_input, embeddings, rest)?;
                ran = true;
                dense.run(&dense_in, outputs, sink)
            };
        match self.stager.as_mut().filter(|_| host >= STAGE_BESIDE) {
            Some(stager) => {
                let parts = others.iter().map(|t| host_of(t)).collect::<Result<Vec<_>>>()?;
                let stager: &mut dyn Stager = &mut **stager;
                std::thread::scope(|s| {
                    let mut job = Some(s.spawn(move || stager.stage(&parts)));
                    lookup.run(&lookup_in, &[LOOKUP_OUTPUT], &mut |o: OutputView<'_>| {
                        let job = job.take().ok_or_else(|| {
                            Error::internal("the embedding lookup gave its rows twice")
                        })?;
                        let staged = job.join().map_err(|_| {
                            Error::internal("staging the network's inputs panicked")
                        })??;
                        run_dense(o, Some(staged))
                    })
                })?;
            }
            None => lookup
                .run(&lookup_in, &[LOOKUP_OUTPUT], &mut |o: OutputView<'_>| run_dense(o, None))?,
        }
        if !ran {
            return Err(Error::internal("the embedding lookup gave no rows"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
