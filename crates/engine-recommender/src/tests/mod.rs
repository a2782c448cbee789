use super::*;
use crate::chain::STAGE_BESIDE;
use crate::settings::LOOKUP_OUTPUT;
use triton_rust_core::batch::BatchData;
use triton_rust_core::config::TensorSpec;
use triton_rust_core::engine::OutputView;
use triton_rust_core::fake_device::FakeDevice;
use triton_rust_core::tensor::{Bytes, DataType};
use triton_rust_cuda::DeviceViewMut;

mod plan;

const CLAIM: EngineClaim = EngineClaim {
    names: &["onnx"],
    default_file: Some("model.onnx"),
    file_suffixes: &[".onnx"],
    parameters: &[],
    backend_keys: &[],
    environment: &[],
    builds_on: &[],
    keeps_sequences: true,
};
static TORCH: EngineClaim = EngineClaim {
    names: &["torch"],
    default_file: Some("model.pt"),
    file_suffixes: &[".pt", ".pth"],
    ..CLAIM
};
static CLAIMS: &[&EngineClaim] = &[&CLAIM, &TORCH];

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

fn settings(c: &ModelConfig) -> RecommenderSettings {
    RecommenderSettings::from_config(c).unwrap()
}

/// The plan of a chain of `config("")`'s lookup and a TorchScript network, in one part.
fn torch_plan() -> ChainPlan {
    ChainPlan {
        lookup_config: config(""),
        dense_config: config(""),
        dense_engine: "torch",
        dense_file: "dense.pt".into(),
        sparse_input: "sparse".into(),
        embeddings_input: "embeddings".into(),
        lengths_input: None,
        pipeline_parts: 1,
    }
}

/// A lookup that gives "device" rows (simulated) of 4 bytes per key.
struct Lookup(Signature, Vec<u8>);
impl LookupStep for Lookup {
    fn run_into(&mut self, _: &[BatchTensor<'_>], _: &mut DeviceViewMut<'_>) -> Result<bool> {
        Ok(false)
    }
}
impl Engine for Lookup {
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        _: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        self.1 = vec![7; inputs[0].bytes().unwrap().len() / 2];
        let shape = [self.1.len() as i64];
        sink(OutputView {
            name: LOOKUP_OUTPUT,
            dtype: DataType::F32,
            shape: &shape,
            data: Bytes::Device(DeviceView::simulated(0, &self.1)),
        })
    }
}
/// A network that answers with where each input was and its bytes.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(bool, Vec<u8>)>>>;
struct Dense(Signature, Seen);
impl Network for Dense {}
impl Engine for Dense {
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        _: &[&str],
        _: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
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
    let sig = |inputs| Signature { inputs, outputs: vec![spec("prediction", DataType::F32)] };
    let lookup = Lookup(sig(vec![spec("sparse", DataType::I64)]), vec![]);
    let seen = Seen::default();
    let dense = Dense(
        sig(vec![spec("dense", DataType::F32), spec("embeddings", DataType::F32)]),
        seen.clone(),
    );
    let joint = Arc::new(Joint::new(&lookup.0, &dense.0, &torch_plan()).unwrap());
    let mut chain = Chain::new(Box::new(lookup), Box::new(dense), joint, Device::Gpu(0), true)
        .with_gpu(Box::new(Copies(vec![], false)), Arc::new(FakeDevice::default()));
    let run = |chain: &mut Chain, dense_bytes: usize| -> Result<Vec<(bool, Vec<u8>)>> {
        let (features, keys) =
            ((0..dense_bytes).map(|i| i as u8).collect::<Vec<u8>>(), vec![1u8; 64]);
        let t = |name: &str, b| BatchTensor {
            name: name.into(),
            dtype: DataType::F32,
            shape: vec![-1],
            data: BatchData::Borrowed(Bytes::Host(b)),
        };
        chain.run(
            &[t("dense", &features), t("sparse", &keys)],
            &["prediction"],
            &mut |_| Ok(()),
        )?;
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen[0].1, features, "the features arrive whole");
        assert_eq!(seen[1], (true, vec![7; 32]), "the rows stay where the lookup put them");
        Ok(seen)
    };
    assert!(
        run(&mut chain, STAGE_BESIDE).unwrap()[0].0,
        "1 MiB of features: staged to the GPU beside the lookup"
    );
    assert!(!run(&mut chain, 1000).unwrap()[0].0, "small features: left to the network's engine");
    chain.stager = Some(Box::new(Copies(vec![], true)));
    let e = run(&mut chain, STAGE_BESIDE).unwrap_err();
    assert!(e.message().contains("no room on GPU 0"), "the stager's failure is the run's: {e}");
}

/// Two tables of dim 1: the lookup writes key k's row as the f32 k; it counts its
/// calls of `run_into` and says so to whoever waits on `started`.
struct PartLookup {
    sig: Signature,
    log: Arc<std::sync::Mutex<Vec<String>>>,
    started: Arc<(std::sync::Mutex<usize>, std::sync::Condvar)>,
    /// The call of `run_into` (1 the first) that cannot write into the buffer, as a batch
    /// with a key that is no row of its table cannot.
    refuse: Option<usize>,
}
impl PartLookup {
    /// On GPU 0 (simulated): keys [rows, 2] in, rows [rows, 2, 1] of f32 out.
    fn new(
        log: Arc<std::sync::Mutex<Vec<String>>>,
        started: Arc<(std::sync::Mutex<usize>, std::sync::Condvar)>,
    ) -> PartLookup {
        let spec =
            |name: &str, dtype, shape: Vec<i64>| TensorSpec { name: name.into(), dtype, shape };
        PartLookup {
            sig: Signature {
                inputs: vec![spec("sparse", DataType::I64, vec![-1, 2])],
                outputs: vec![spec(LOOKUP_OUTPUT, DataType::F32, vec![-1, 2, 1])],
            },
            log,
            started,
            refuse: None,
        }
    }
}
impl Engine for PartLookup {
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        _: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        self.log.lock().unwrap().push(format!("run {:?}", inputs[0].shape));
        let rows: Vec<u8> =
            keys_of(&inputs[0]).iter().flat_map(|&k| (k as f32).to_le_bytes()).collect();
        let shape = [inputs[0].shape[0], 2, 1];
        sink(OutputView {
            name: LOOKUP_OUTPUT,
            dtype: DataType::F32,
            shape: &shape,
            data: Bytes::Device(DeviceView::simulated(0, &rows)),
        })
    }
}
impl LookupStep for PartLookup {
    fn run_into(
        &mut self,
        inputs: &[BatchTensor<'_>],
        out: &mut DeviceViewMut<'_>,
    ) -> Result<bool> {
        let calls = {
            let mut log = self.log.lock().unwrap();
            log.push(format!("run_into {:?}", inputs[0].shape));
            log.iter().filter(|e| e.starts_with("run_into")).count()
        };
        if self.refuse == Some(calls) {
            return Ok(false);
        }
        let rows: Vec<u8> =
            keys_of(&inputs[0]).iter().flat_map(|&k| (k as f32).to_le_bytes()).collect();
        out.simulated_bytes().unwrap()[..rows.len()].copy_from_slice(&rows);
        let (count, cv) = &*self.started;
        *count.lock().unwrap() += 1;
        cv.notify_all();
        Ok(true)
    }
}
fn keys_of(t: &BatchTensor<'_>) -> Vec<i64> {
    t.bytes()
        .unwrap()
        .host()
        .unwrap()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
/// prediction = dense + both embeddings, per row; its first part waits until the
/// lookup has begun the next part (so a chain that does not overlap them fails).
struct PartDense {
    sig: Signature,
    started: Arc<(std::sync::Mutex<usize>, std::sync::Condvar)>,
    runs: usize,
}
impl PartDense {
    /// On GPU 0 (simulated): dense [rows, 1] and embeddings [rows, 2, 1] in, prediction
    /// [rows, 1] out; `runs` it has made already.
    fn new(started: Arc<(std::sync::Mutex<usize>, std::sync::Condvar)>, runs: usize) -> PartDense {
        let spec =
            |name: &str, dtype, shape: Vec<i64>| TensorSpec { name: name.into(), dtype, shape };
        PartDense {
            sig: Signature {
                inputs: vec![
                    spec("dense", DataType::F32, vec![-1, 1]),
                    spec("embeddings", DataType::F32, vec![-1, 2, 1]),
                ],
                outputs: vec![spec("prediction", DataType::F32, vec![-1, 1])],
            },
            started,
            runs,
        }
    }
}
impl Network for PartDense {}
impl Engine for PartDense {
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        _: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let floats = |t: &BatchTensor<'_>| -> Vec<f32> {
            let b = match t.bytes().unwrap() {
                Bytes::Host(b) => b,
                Bytes::Device(v) => v.simulated_bytes().unwrap(),
            };
            b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
        };
        let (dense, emb) = (floats(&inputs[0]), floats(&inputs[1]));
        let rows = inputs[0].shape[0] as usize;
        if self.runs == 0 && inputs[1].shape[0] as usize * 2 < 4096 * 2 {
            // a part, not the whole batch: wait for the lookup of the next part
            let (count, cv) = &*self.started;
            let (n, timeout) = cv
                .wait_timeout_while(
                    count.lock().unwrap(),
                    std::time::Duration::from_secs(10),
                    |n| *n < 2,
                )
                .unwrap();
            if timeout.timed_out() {
                return Err(Error::internal(format!(
                    "the next part's lookup never began while this part ran ({} lookups)",
                    *n
                )));
            }
        }
        self.runs += 1;
        let out: Vec<u8> = (0..rows)
            .flat_map(|i| (dense[i] + emb[2 * i] + emb[2 * i + 1]).to_le_bytes())
            .collect();
        let shape = [rows as i64, 1];
        sink(OutputView {
            name: "prediction",
            dtype: DataType::F32,
            shape: &shape,
            data: Bytes::Device(DeviceView::simulated(0, &out)),
        })
    }
}

/// A chain of `lookup` and `dense` on GPU 0 (simulated), run in `parts` parts.
fn gpu_chain(
    lookup: PartLookup,
    dense: Box<dyn Network>,
    dense_sig: &Signature,
    parts: usize,
) -> Chain {
    let mut c = config("");
    c.parameters.insert("recommender_pipeline_parts".into(), parts.to_string());
    // a folder of its own per call: tests run side by side, several with the same `parts`
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("trt-chain-{parts}-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dense.pt"), b"x").unwrap();
    let plan = plan(&c, &settings(&c), 3, false, &dir, CLAIMS).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(plan.pipeline_parts, parts);
    let joint = Arc::new(Joint::new(&lookup.sig, dense_sig, &plan).unwrap());
    Chain::new(Box::new(lookup), dense, joint, Device::Gpu(0), true)
        .with_gpu(Box::new(Copies(vec![], false)), Arc::new(FakeDevice::default()))
}

/// The chain's prediction for `rows` rows whose keys are 0, 1, 2, ... and dense feature
/// 0.5 × the row (host inputs).
fn run_rows(chain: &mut Chain, rows: usize) -> Vec<f32> {
    let keys: Vec<u8> = (0..rows as i64 * 2).flat_map(|k| k.to_le_bytes()).collect();
    let dense: Vec<u8> = (0..rows).flat_map(|i| (0.5 * i as f32).to_le_bytes()).collect();
    let t = |name: &str, dtype, shape: Vec<i64>, b| BatchTensor {
        name: name.into(),
        dtype,
        shape,
        data: BatchData::Borrowed(Bytes::Host(b)),
    };
    let inputs = [
        t("dense", DataType::F32, vec![rows as i64, 1], &dense),
        t("sparse", DataType::I64, vec![rows as i64, 2], &keys),
    ];
    let mut got = None;
    chain
        .run(&inputs, &["prediction"], &mut |o| {
            assert_eq!(
                (o.name, o.shape),
                ("prediction", &[rows as i64, 1][..]),
                "one output of every row"
            );
            // gathered on the host when run in parts; the network's own buffer when whole
            let b = o.data.host().or_else(|| match o.data {
                Bytes::Device(v) => v.simulated_bytes(),
                Bytes::Host(_) => None,
            });
            got = Some(
                b.unwrap()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            );
            Ok(())
        })
        .unwrap();
    got.expect("the prediction")
}

/// What `run_rows` should give: dense + both embeddings (each key's row is the key).
fn want_rows(rows: usize) -> Vec<f32> {
    (0..rows).map(|i| 0.5 * i as f32 + (2 * i) as f32 + (2 * i + 1) as f32).collect()
}

#[test]
fn a_large_batch_runs_in_parts_each_lookup_beside_the_network_on_the_part_before() {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Arc::new((std::sync::Mutex::new(0usize), std::sync::Condvar::new()));
    let lookup = PartLookup::new(log.clone(), started.clone());
    let dense = PartDense::new(started.clone(), 0);
    let sig = dense.sig.clone();
    let mut chain = gpu_chain(lookup, Box::new(dense), &sig, 3);
    assert_eq!(
        run_rows(&mut chain, 4000),
        want_rows(4000),
        "three parts of 1334, 1334 and 1332 rows, gathered in order"
    );
    assert_eq!(
        log.lock().unwrap().drain(..).collect::<Vec<_>>(),
        ["run_into [1334, 2]", "run_into [1334, 2]", "run_into [1332, 2]"]
    );
    assert_eq!(run_rows(&mut chain, 3000), want_rows(3000), "under 3 × 1024 rows: whole");
    assert_eq!(log.lock().unwrap().drain(..).collect::<Vec<_>>(), ["run [3000, 2]"]);
}

#[test]
fn a_later_part_the_lookup_cannot_write_sends_the_whole_batch_the_other_way() {
    // the second part's keys need the lookup's other path: nothing was answered, so the
    // batch runs whole there (where a bad key is the client's error), not as a failure
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Arc::new((std::sync::Mutex::new(0usize), std::sync::Condvar::new()));
    let mut lookup = PartLookup::new(log.clone(), started.clone());
    lookup.refuse = Some(2);
    let dense = PartDense::new(started, 1); // its parts never wait here
    let sig = dense.sig.clone();
    let mut chain = gpu_chain(lookup, Box::new(dense), &sig, 3);
    assert_eq!(run_rows(&mut chain, 4000), want_rows(4000), "every row answered once");
    assert_eq!(
        log.lock().unwrap().drain(..).collect::<Vec<_>>(),
        ["run_into [1334, 2]", "run_into [1334, 2]", "run [4000, 2]"]
    );
}

/// `PartDense` (which never waits here) offering a "captured graph" for batches of 16
/// rows, whose embeddings input is its own buffer; `in_place` says whether each run's
/// embeddings were read from there.
struct GraphDense {
    inner: PartDense,
    graph_rows: std::sync::Mutex<Option<&'static mut [u8]>>,
    graph_addr: usize,
    in_place: Arc<std::sync::Mutex<Vec<bool>>>,
}
impl Network for GraphDense {
    fn graph_input(
        &self,
        inputs: &[BatchTensor<'_>],
        name: &str,
    ) -> Option<DeviceViewMut<'static>> {
        assert_eq!(name, "embeddings");
        let names: Vec<&str> = inputs.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["dense", "embeddings"], "asked with the network's inputs in its order");
        if inputs[1].shape != [16, 2, 1] {
            return None;
        }
        let rows = self.graph_rows.lock().unwrap().take()?;
        Some(DeviceViewMut::simulated(0, rows))
    }
}
impl Engine for GraphDense {
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let emb_at = match inputs[1].bytes().unwrap() {
            Bytes::Device(v) => v.simulated_bytes().unwrap().as_ptr() as usize,
            Bytes::Host(b) => b.as_ptr() as usize,
        };
        self.in_place.lock().unwrap().push(emb_at == self.graph_addr);
        self.inner.run(inputs, outputs, sink)
    }
}

#[test]
fn a_batch_with_a_captured_graph_is_looked_up_straight_into_its_input() {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let lookup = PartLookup::new(log.clone(), Default::default());
    // the graph's input: 16 rows of two f32 embeddings, filled with a mark
    let graph_rows: &'static mut [u8] = Box::leak(vec![0xAB; 16 * 2 * 4].into_boxed_slice());
    let graph_addr = graph_rows.as_ptr() as usize;
    let in_place = Arc::new(std::sync::Mutex::new(Vec::new()));
    let dense = GraphDense {
        // its wait for a next part is for the first run only
        inner: PartDense::new(Default::default(), 1),
        graph_rows: std::sync::Mutex::new(Some(graph_rows)),
        graph_addr,
        in_place: in_place.clone(),
    };
    let sig = dense.inner.sig.clone();
    let mut chain = gpu_chain(lookup, Box::new(dense), &sig, 1);
    assert_eq!(run_rows(&mut chain, 4), want_rows(4), "no graph for 4 rows");
    assert_eq!(log.lock().unwrap().drain(..).collect::<Vec<_>>(), ["run [4, 2]"]);
    assert_eq!(run_rows(&mut chain, 16), want_rows(16), "16 rows: the graph's");
    assert_eq!(
        log.lock().unwrap().drain(..).collect::<Vec<_>>(),
        ["run_into [16, 2]"],
        "the lookup wrote into the graph's input"
    );
    assert_eq!(*in_place.lock().unwrap(), [false, true], "and the network read it there");
}
