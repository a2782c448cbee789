//! Two engines as one model: the recommender's single-model path. The embedding store's
//! lookup (the first engine, `embedding_interface: batched`) writes the embeddings the
//! dense network (the second engine, ONNX or TorchScript) reads, inside the backend: no
//! trip through Triton between them, one model to configure, load and version.
//!
//! A model with `parameters { key: "engine" value { string_value: "recommender" } }`
//! holds its tables under `<version>/tables/` (as an embedding model) and its dense
//! network as `<version>/dense.onnx` or `<version>/dense.pt`. Its config lists the
//! clients' inputs (the keys, `recommender_sparse_input`, default `sparse`, INT64
//! `[tables]`, and the dense features) and the network's outputs; the network's input
//! that takes the embeddings is `recommender_embeddings_input` (default `embeddings`,
//! `[tables, dim]` of `recommender_embeddings_type`: `TYPE_FP32`, the default, or
//! `TYPE_FP16` for an fp16 network: the lookup then writes fp16 rows, half the bytes,
//! and the network has nothing to cast). Every embedding-store parameter applies as for an embedding
//! model. On a GPU instance the lookup writes the rows into its own device buffer (every
//! table in one pass) and the network reads that buffer as its input, in place: the
//! embeddings never leave the GPU and never pass through Triton. The network's other
//! inputs (the dense features, in host memory) go to the GPU on a thread of their own
//! while the lookup runs, when a [`Stager`] is given and they are large enough to pay
//! for the thread.

use std::path::{Path, PathBuf};

use crate::batch::{BatchData, BatchTensor, RequestTensor};
use crate::config::{ModelConfig, TensorConfig, TensorSpec};
use crate::engine::{Device, Engine, EngineKind, OutputView, Signature};
use crate::error::{Error, Result};
use crate::tensor::{Bytes, DataType};
use triton_rust_cuda::DeviceView;

/// Copies host bytes to the chain's GPU; done when `stage` returns. The views live until
/// the next call. The backend gives one to a chain on a GPU instance.
pub trait Stager: Send {
    fn stage(&mut self, parts: &[&[u8]]) -> Result<Vec<DeviceView<'_>>>;
}

/// Host inputs of the network at least this large (in all) are staged beside the lookup;
/// smaller ones cost less than the thread and are left to the network's engine.
const STAGE_BESIDE: usize = 1 << 20;

/// How a recommender model splits into its two engines.
#[derive(Debug)]
pub struct ChainPlan {
    pub lookup_config: ModelConfig,
    pub dense_config: ModelConfig,
    pub dense_kind: EngineKind,
    pub dense_file: PathBuf,
    sparse_input: String,
    embeddings_input: String,
}

/// The embedding engine's output name inside the chain.
const LOOKUP_OUTPUT: &str = "OUTPUT0";

fn param<'a>(config: &'a ModelConfig, key: &str, default: &'a str) -> &'a str {
    config.parameters.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()).unwrap_or(default)
}

/// Splits a recommender model's config into the lookup's and the dense network's.
pub fn plan(config: &ModelConfig, version_dir: &Path) -> Result<ChainPlan> {
    let sparse_input = param(config, "recommender_sparse_input", "sparse").to_string();
    let embeddings_input = param(config, "recommender_embeddings_input", "embeddings").to_string();
    let sparse = config.inputs.iter().find(|t| t.name == sparse_input).ok_or_else(|| {
        Error::invalid_arg(format!(
            "the recommender engine takes the keys from input '{sparse_input}' (parameter recommender_sparse_input), which the config does not list"
        ))
    })?;
    if sparse.dtype != DataType::I64 {
        return Err(Error::invalid_arg(format!("input '{sparse_input}' holds the keys: it must be TYPE_INT64")));
    }
    if config.inputs.iter().any(|t| t.name == embeddings_input) {
        return Err(Error::invalid_arg(format!(
            "input '{embeddings_input}' is filled by the embedding lookup inside the model; clients do not send it (remove it from the config)"
        )));
    }
    let tables = config.parameters.get("embedding_table_names").map_or(0, |s| s.split(',').filter(|t| !t.trim().is_empty()).count());
    let dims: Vec<i64> = config
        .parameters
        .get("embedding_vecsize_per_table")
        .map(|s| s.split(',').filter_map(|d| d.trim().parse().ok()).collect())
        .unwrap_or_default();
    let dim = match dims.as_slice() {
        [d] => *d,
        [d, rest @ ..] if rest.iter().all(|x| x == d) => *d,
        _ => return Err(Error::invalid_arg("the recommender engine needs one embedding_vecsize_per_table shared by every table")),
    };
    if tables == 0 {
        return Err(Error::invalid_arg("the recommender engine needs parameter embedding_table_names"));
    }
    // With max_batch_size 0 the batch dimension is the config's own first dim.
    let lead: Vec<i64> = if config.batching() { vec![] } else { vec![-1] };
    let want: Vec<i64> = lead.iter().copied().chain([tables as i64]).collect();
    if sparse.dims != want {
        return Err(Error::invalid_arg(format!("input '{sparse_input}' must have dims {want:?} (one key per table); it has {:?}", sparse.dims)));
    }
    let rows_dims: Vec<i64> = lead.iter().copied().chain([tables as i64, dim]).collect();
    let rows_type = match param(config, "recommender_embeddings_type", "TYPE_FP32") {
        "TYPE_FP32" => DataType::F32,
        "TYPE_FP16" => DataType::F16,
        other => return Err(Error::invalid_arg(format!("parameter recommender_embeddings_type is TYPE_FP32 or TYPE_FP16, not '{other}'"))),
    };
    let named = config.parameters.get("recommender_dense_model").map(|s| version_dir.join(s.trim()));
    let dense_file = match named {
        Some(f) => f,
        None if version_dir.join("dense.onnx").exists() => version_dir.join("dense.onnx"),
        None => version_dir.join("dense.pt"),
    };
    if !dense_file.is_file() {
        return Err(Error::not_found(format!("the recommender's dense network '{}' not found (dense.onnx or dense.pt)", dense_file.display())));
    }
    let file_name = dense_file.to_string_lossy();
    let dense_kind = if file_name.ends_with(".onnx") {
        EngineKind::Onnx
    } else if file_name.ends_with(".pt") || file_name.ends_with(".pth") {
        EngineKind::Torch
    } else {
        return Err(Error::invalid_arg(format!("cannot tell the dense network's engine from '{file_name}' (.onnx or .pt)")));
    };

    let mut lookup_config = config.clone();
    lookup_config.inputs = vec![sparse.clone()];
    lookup_config.outputs = vec![TensorConfig { name: LOOKUP_OUTPUT.into(), dtype: rows_type, dims: rows_dims.clone(), reshape: None }];
    lookup_config.parameters.insert("embedding_interface".into(), "batched".into());
    let mut dense_config = config.clone();
    dense_config.inputs.retain(|t| t.name != sparse_input);
    dense_config.inputs.push(TensorConfig { name: embeddings_input.clone(), dtype: rows_type, dims: rows_dims, reshape: None });
    // `optimization { cuda { graphs: true } }` in the recommender's config is the network's
    // (a TorchScript network on a GPU instance: one graph per batch bucket, or per shape
    // without batching; the lookup has nothing to capture)
    Ok(ChainPlan { lookup_config, dense_config, dense_kind, dense_file, sparse_input, embeddings_input })
}

pub struct Chain {
    lookup: Box<dyn Engine>,
    dense: Box<dyn Engine>,
    sparse_input: String,
    embeddings_input: String,
    stager: Option<Box<dyn Stager>>,
    sig: Signature,
}

impl Chain {
    pub fn new(lookup: Box<dyn Engine>, dense: Box<dyn Engine>, plan: &ChainPlan, device: Device) -> Result<Chain> {
        if device != Device::Cpu && !dense.accepts_device_inputs() {
            return Err(Error::unsupported(format!(
                "on a KIND_GPU instance the recommender's network reads the embeddings in GPU memory, which the engine of '{}' cannot; use a TorchScript dense.pt (or KIND_CPU)",
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
        let mut inputs: Vec<TensorSpec> = dense.inputs().iter().filter(|t| t.name != plan.embeddings_input).cloned().collect();
        inputs.push(lookup.inputs()[0].clone());
        let sig = Signature { inputs, outputs: dense.outputs().to_vec(), device };
        Ok(Chain { lookup, dense, sparse_input: plan.sparse_input.clone(), embeddings_input: plan.embeddings_input.clone(), stager: None, sig })
    }

    /// Stages the network's large host inputs with `stager` while the lookup runs.
    pub fn with_stager(mut self, stager: Box<dyn Stager>) -> Chain {
        self.stager = Some(stager);
        self
    }
}

/// A view of a batch input for one of the chain's engines (the chain takes host inputs).
fn borrowed<'a>(t: &'a BatchTensor<'_>) -> Result<BatchTensor<'a>> {
    let bytes = t.bytes().ok_or_else(|| Error::unsupported(format!("input '{}' in GPU memory", t.name)))?;
    Ok(BatchTensor { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone(), data: BatchData::Borrowed(bytes) })
}

impl Engine for Chain {
    fn signature(&self) -> &Signature {
        &self.sig
    }

    fn metrics_source(&self) -> Option<std::sync::Arc<dyn crate::telemetry::MetricsSource>> {
        self.lookup.metrics_source()
    }

    fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        match inputs.iter().position(|t| t.name == self.sparse_input) {
            Some(i) => self.lookup.check_request(&inputs[i..=i]),
            None => Ok(()),
        }
    }

    fn run(&mut self, inputs: &[BatchTensor<'_>], outputs: &[&str], sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>) -> Result<()> {
        let keys = inputs
            .iter()
            .find(|t| t.name == self.sparse_input)
            .ok_or_else(|| Error::internal(format!("input '{}' missing from the batch", self.sparse_input)))?;
        let lookup_in = [borrowed(keys)?];
        // The network's inputs other than the embeddings, in its order.
        let others = self
            .dense
            .inputs()
            .iter()
            .filter(|spec| spec.name != self.embeddings_input)
            .map(|spec| {
                inputs
                    .iter()
                    .find(|t| t.name == spec.name)
                    .ok_or_else(|| Error::internal(format!("input '{}' of the dense network missing from the batch", spec.name)))
            })
            .collect::<Result<Vec<_>>>()?;
        let host: usize = others.iter().map(|t| t.bytes().and_then(|b| b.host()).map_or(0, <[u8]>::len)).sum();
        // The dense network runs inside the lookup's sink, on the lookup's own buffer of
        // rows: nothing is copied between the two.
        let (dense, embeddings_input, lookup) = (&mut self.dense, &self.embeddings_input, &mut self.lookup);
        let mut ran = false;
        let mut run_dense = |o: OutputView<'_>, staged: Option<Vec<DeviceView<'_>>>| -> Result<()> {
            // Host rows on a CPU instance; on a GPU instance the lookup's own device
            // buffer, which the network reads in place.
            if matches!(o.data, Bytes::Device(_)) && !dense.accepts_device_inputs() {
                return Err(Error::unsupported("the dense network's engine cannot read inputs in GPU memory"));
            }
            let mut staged = staged.map(Vec::into_iter);
            let mut others = others.iter();
            let mut dense_in = Vec::with_capacity(dense.inputs().len());
            for spec in dense.inputs() {
                if spec.name == *embeddings_input {
                    dense_in.push(BatchTensor { name: spec.name.clone(), dtype: o.dtype, shape: o.shape.to_vec(), data: BatchData::Borrowed(o.data) });
                    continue;
                }
                let t = others.next().ok_or_else(|| Error::internal("the network's inputs changed during a run"))?;
                match staged.as_mut().and_then(Iterator::next) {
                    Some(v) => dense_in.push(BatchTensor { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone(), data: BatchData::Borrowed(Bytes::Device(v)) }),
                    None => dense_in.push(borrowed(t)?),
                }
            }
            ran = true;
            dense.run(&dense_in, outputs, sink)
        };
        match self.stager.as_mut().filter(|_| host >= STAGE_BESIDE) {
            Some(stager) => {
                let parts = others.iter().map(|t| t.bytes().and_then(|b| b.host()).ok_or_else(|| Error::unsupported(format!("input '{}' in GPU memory", t.name)))).collect::<Result<Vec<_>>>()?;
                let stager: &mut dyn Stager = &mut **stager;
                std::thread::scope(|s| {
                    let mut job = Some(s.spawn(move || stager.stage(&parts)));
                    lookup.run(&lookup_in, &[LOOKUP_OUTPUT], &mut |o: OutputView<'_>| {
                        let job = job.take().ok_or_else(|| Error::internal("the embedding lookup gave its rows twice"))?;
                        let staged = job.join().map_err(|_| Error::internal("staging the network's inputs panicked"))??;
                        run_dense(o, Some(staged))
                    })
                })?;
            }
            None => lookup.run(&lookup_in, &[LOOKUP_OUTPUT], &mut |o: OutputView<'_>| run_dense(o, None))?,
        }
        if !ran {
            return Err(Error::internal("the embedding lookup gave no rows"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> ModelConfig {
        ModelConfig::from_json(&format!(
            r#"{{"name": "r", "max_batch_size": 8,
                "input": [{{"name": "dense", "data_type": "TYPE_FP32", "dims": [13]}},
                          {{"name": "sparse", "data_type": "TYPE_INT64", "dims": [3]}}{extra}],
                "output": [{{"name": "prediction", "data_type": "TYPE_FP32", "dims": [1]}}],
                "parameters": {{"embedding_table_names": {{"string_value": "a,b,c"}},
                                "embedding_vecsize_per_table": {{"string_value": "4"}}}}}}"#
        ))
        .unwrap()
    }

    /// A lookup that gives "device" rows (simulated) of 4 bytes per key.
    struct Lookup(Signature, Vec<u8>);
    impl Engine for Lookup {
        fn signature(&self) -> &Signature {
            &self.0
        }
        fn run(&mut self, inputs: &[BatchTensor<'_>], _: &[&str], sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>) -> Result<()> {
            self.1 = vec![7; inputs[0].bytes().unwrap().len() / 2];
            let shape = [self.1.len() as i64];
            sink(OutputView { name: LOOKUP_OUTPUT, dtype: DataType::F32, shape: &shape, data: Bytes::Device(DeviceView::simulated(0, &self.1)) })
        }
    }
    /// A network that answers with where each input was and its bytes.
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<(bool, Vec<u8>)>>>;
    struct Dense(Signature, Seen);
    impl Engine for Dense {
        fn signature(&self) -> &Signature {
            &self.0
        }
        fn accepts_device_inputs(&self) -> bool {
            true
        }
        fn run(&mut self, inputs: &[BatchTensor<'_>], _: &[&str], _: &mut dyn FnMut(OutputView<'_>) -> Result<()>) -> Result<()> {
            *self.1.lock().unwrap() = inputs
                .iter()
                .map(|t| match t.bytes().unwrap() {
                    Bytes::Host(b) => (false, b.to_vec()),
                    Bytes::Device(v) => (true, v.simulated_bytes().unwrap().to_vec()),
                })
                .collect();
            Ok(())
        }
    }
    /// Copies into buffers of its own, standing in for the GPU.
    struct Copies(Vec<Vec<u8>>, bool);
    impl Stager for Copies {
        fn stage(&mut self, parts: &[&[u8]]) -> Result<Vec<DeviceView<'_>>> {
            if self.1 {
                return Err(Error::unavailable("no room on GPU 0"));
            }
            self.0 = parts.iter().map(|p| p.to_vec()).collect();
            Ok(self.0.iter().map(|b| DeviceView::simulated(0, b)).collect())
        }
    }

    #[test]
    fn large_host_inputs_reach_the_network_staged_beside_the_lookup() {
        let spec = |name: &str, dtype| TensorSpec { name: name.into(), dtype, shape: vec![-1] };
        let sig = |inputs| Signature { inputs, outputs: vec![spec("prediction", DataType::F32)], device: Device::Gpu(0) };
        let lookup = Lookup(sig(vec![spec("sparse", DataType::I64)]), vec![]);
        let seen = Seen::default();
        let dense = Dense(sig(vec![spec("dense", DataType::F32), spec("embeddings", DataType::F32)]), seen.clone());
        let plan = ChainPlan {
            lookup_config: config(""),
            dense_config: config(""),
            dense_kind: EngineKind::Torch,
            dense_file: "dense.pt".into(),
            sparse_input: "sparse".into(),
            embeddings_input: "embeddings".into(),
        };
        let mut chain = Chain::new(Box::new(lookup), Box::new(dense), &plan, Device::Gpu(0)).unwrap().with_stager(Box::new(Copies(vec![], false)));
        let run = |chain: &mut Chain, dense_bytes: usize| -> Result<Vec<(bool, Vec<u8>)>> {
            let (features, keys) = ((0..dense_bytes).map(|i| i as u8).collect::<Vec<u8>>(), vec![1u8; 64]);
            let t = |name: &str, b| BatchTensor { name: name.into(), dtype: DataType::F32, shape: vec![-1], data: BatchData::Borrowed(Bytes::Host(b)) };
            chain.run(&[t("dense", &features), t("sparse", &keys)], &["prediction"], &mut |_| Ok(()))?;
            let seen = seen.lock().unwrap().clone();
            assert_eq!(seen[0].1, features, "the features arrive whole");
            assert_eq!(seen[1], (true, vec![7; 32]), "the rows stay where the lookup put them");
            Ok(seen)
        };
        assert!(run(&mut chain, STAGE_BESIDE).unwrap()[0].0, "1 MiB of features: staged to the GPU beside the lookup");
        assert!(!run(&mut chain, 1000).unwrap()[0].0, "small features: left to the network's engine");
        chain.stager = Some(Box::new(Copies(vec![], true)));
        let e = run(&mut chain, STAGE_BESIDE).unwrap_err();
        assert!(e.message().contains("no room on GPU 0"), "the stager's failure is the run's: {e}");
    }

    #[test]
    fn plans_the_two_engines_and_names_what_is_wrong() {
        let dir = std::env::temp_dir().join(format!("trt-chain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = plan(&config(""), &dir).unwrap_err();
        assert!(e.message().contains("dense.onnx or dense.pt"), "{e}");
        std::fs::write(dir.join("dense.onnx"), b"x").unwrap();
        let p = plan(&config(""), &dir).unwrap();
        assert_eq!(p.dense_kind, EngineKind::Onnx);
        assert_eq!(p.lookup_config.inputs.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["sparse"]);
        assert_eq!(p.lookup_config.parameters["embedding_interface"], "batched");
        let dense: Vec<_> = p.dense_config.inputs.iter().map(|t| (t.name.as_str(), t.dims.clone())).collect();
        assert_eq!(dense, [("dense", vec![13]), ("embeddings", vec![3, 4])]);
        let e = plan(&config(r#", {"name": "embeddings", "data_type": "TYPE_FP32", "dims": [3, 4]}"#), &dir).unwrap_err();
        assert!(e.message().contains("clients do not send it"), "{e}");
        let mut c = config("");
        c.parameters.insert("recommender_sparse_input".into(), "ids".into());
        assert!(plan(&c, &dir).unwrap_err().message().contains("'ids'"));
        let mut c = config("");
        c.max_batch_size = 0;
        assert!(plan(&c, &dir).unwrap_err().message().contains("[-1, 3]"), "without batching the keys carry their own batch dim");
        c.inputs[1].dims = vec![-1, 3];
        c.inputs[0].dims = vec![-1, 13];
        let p = plan(&c, &dir).unwrap();
        assert_eq!(p.lookup_config.outputs[0].dims, [-1, 3, 4]);
        assert_eq!(p.dense_config.inputs[1].dims, [-1, 3, 4]);
        let mut c = config("");
        c.parameters.insert("recommender_embeddings_type".into(), "TYPE_FP16".into());
        let p = plan(&c, &dir).unwrap();
        assert_eq!((p.lookup_config.outputs[0].dtype, p.dense_config.inputs[1].dtype), (DataType::F16, DataType::F16), "fp16 rows end to end");
        c.parameters.insert("recommender_embeddings_type".into(), "TYPE_BF16".into());
        assert!(plan(&c, &dir).unwrap_err().message().contains("TYPE_FP32 or TYPE_FP16"));
        let mut c = config("");
        c.parameters.insert("embedding_vecsize_per_table".into(), "4,8,4".into());
        assert!(plan(&c, &dir).unwrap_err().message().contains("shared by every table"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
