//! ONNX Runtime on a GPU instance: inputs and outputs bound in GPU memory (I/O binding),
//! and CUDA graphs per batch-size bucket.
//!
//! Without binding, ONNX Runtime's CUDA provider copies every host input to the GPU and
//! every output back to the host inside `Run`, and an ensemble's GPU tensors or a client's
//! CUDA shared memory would go through the host twice. Here each input is copied once,
//! from wherever it lives (host bytes, or GPU memory device-to-device), into a tensor
//! ONNX Runtime allocated on the instance's GPU, and outputs stay on the GPU: the serving
//! layer copies them into the response's buffer (GPU to GPU when Triton offers GPU memory).
//!
//! CUDA graphs (`optimization { cuda { graphs: true } }`, ONNX Runtime's
//! `enable_cuda_graph`): one graph per bucket (`ModelConfig::cuda_graph_buckets`), each
//! with its own `gpu_graph_id` and its own fixed input and output tensors, since a replay
//! reads and writes the addresses it was captured with. A batch of n rows is copied into
//! the first n rows of the smallest bucket b >= n (the other rows keep whatever they
//! held: rows are independent, as Triton's batching already assumes) and the first n rows
//! of each output are the answer. ONNX Runtime runs a graph id regularly a few times
//! before it captures it. A batch that fits no bucket, and a model whose outputs have a
//! free dimension other than the batch, run without a graph (`gpu_graph_id` -1), logged
//! once.
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, NoSelectedOutputs, RunOptions, Session, SessionOutputs};
use ort::value::{DynTensor, DynTensorValueType, TensorElementType, ValueType};

use triton_rust_abi::graphs::{self, Fit};
use triton_rust_core::batch::BatchTensor;
use triton_rust_core::config::TensorSpec;
use triton_rust_core::engine::OutputView;
use triton_rust_core::error::{Error, Result};
use triton_rust_core::tensor::{Bytes, BytesMut, DataType, DeviceOps};
use triton_rust_cuda::upload::Uploader;
use triton_rust_cuda::{view_in, view_mut_in, Cuda};

use crate::runtime::{ort_err, runtime_error};
use crate::session::dtype_from_ort;

/// More captured shapes than this run without a graph (each holds its own tensors).
const MAX_GRAPHS: usize = 64;

fn to_ort(t: DataType) -> Result<TensorElementType> {
    use TensorElementType as T;
    Ok(match t {
        DataType::F32 => T::Float32,
        DataType::F64 => T::Float64,
        DataType::F16 => T::Float16,
        DataType::Bf16 => T::Bfloat16,
        DataType::I8 => T::Int8,
        DataType::I16 => T::Int16,
        DataType::I32 => T::Int32,
        DataType::I64 => T::Int64,
        DataType::U8 => T::Uint8,
        DataType::U16 => T::Uint16,
        DataType::U32 => T::Uint32,
        DataType::U64 => T::Uint64,
        DataType::Bool => T::Bool,
        DataType::Bytes => {
            return Err(Error::unsupported("BYTES tensors cannot be bound in GPU memory"))
        }
    })
}

/// One captured graph: its id, the tensors it reads and writes, and its binding.
struct Graph {
    binding: IoBinding,
    inputs: Vec<DynTensor>,
    options: RunOptions<NoSelectedOutputs>,
}

/// What a batch runs as: which graph (and bucket), or none.
enum Plan {
    /// Key of the graph and the padded row count (None without batching).
    Graph(Vec<Vec<i64>>, Option<i64>),
    Eager,
}

pub(crate) struct GpuIo {
    device: i32,
    allocator: Allocator,
    on_gpu: MemoryInfo<'static>,
    batching: bool,
    /// `Some` when the session was built with CUDA graphs: the buckets (empty: exact
    /// shapes, for a model without batching).
    buckets: Option<Vec<i64>>,
    /// Outputs whose every dimension but the batch is known (a graph needs them all).
    static_outputs: bool,
    graphs: HashMap<Vec<Vec<i64>>, Graph>,
    /// Run options of a graph-enabled session's runs that take no graph.
    no_graph: Option<RunOptions<NoSelectedOutputs>>,
    said: HashSet<String>,
    /// Host inputs go to the GPU through its page-locked buffer.
    uploader: Uploader,
}

impl GpuIo {
    pub(crate) fn new(
        session: &Session,
        device: i32,
        batching: bool,
        buckets: Option<Vec<i64>>,
        outputs: &[TensorSpec],
    ) -> Result<GpuIo> {
        let on_gpu = MemoryInfo::new(
            AllocationDevice::CUDA,
            device,
            AllocatorType::Device,
            MemoryType::Default,
        )
        .map_err(ort_err)?;
        let allocator = Allocator::new(session, on_gpu.clone()).map_err(ort_err)?;
        let skip = usize::from(batching);
        let static_outputs = outputs.iter().all(|o| o.shape.iter().skip(skip).all(|&d| d >= 0));
        let no_graph = match buckets {
            Some(_) => {
                let mut o = RunOptions::new().map_err(ort_err)?;
                o.set("gpu_graph_id", "-1").map_err(ort_err)?;
                Some(o)
            }
            None => None,
        };
        let uploader =
            Uploader::new(device).map_err(|e| Error::unavailable(format!("GPU {device}: {e}")))?;
        Ok(GpuIo {
            device,
            allocator,
            on_gpu,
            batching,
            buckets,
            static_outputs,
            graphs: HashMap::new(),
            no_graph,
            said: HashSet::new(),
            uploader,
        })
    }

    fn say_once(&mut self, key: &str, message: impl FnOnce() -> String) {
        if self.said.insert(key.to_string()) {
            log::info!("{}", message());
        }
    }

    fn plan(&mut self, inputs: &[BatchTensor<'_>]) -> Plan {
        let Some(buckets) = self.buckets.as_deref() else { return Plan::Eager };
        if !self.static_outputs {
            self.say_once("free", || {
                "ONNX Runtime CUDA graphs need outputs of fixed shape (but for the batch); this model's are not: it runs without".into()
            });
            return Plan::Eager;
        }
        let shapes: Vec<&[i64]> = inputs.iter().map(|t| t.shape.as_slice()).collect();
        match graphs::fit(buckets, self.batching, &shapes) {
            Fit::Graph(padded) => {
                let key: Vec<Vec<i64>> = shapes.iter().map(|s| graphs::padded(s, padded)).collect();
                if self.graphs.contains_key(&key) || self.graphs.len() < MAX_GRAPHS {
                    return Plan::Graph(key, padded);
                }
                self.say_once("full", || {
                    format!(
                        "{MAX_GRAPHS} CUDA graphs captured already: further shapes run without one"
                    )
                });
                Plan::Eager
            }
            Fit::TooMany(n) => {
                let buckets = buckets.to_vec();
                self.say_once(&format!("rows {n}"), || {
                    format!("a batch of {n} fits no CUDA graph bucket ({buckets:?}): it runs without a graph")
                });
                Plan::Eager
            }
            Fit::NotListed(n) => {
                let buckets = buckets.to_vec();
                self.say_once(&format!("rows {n}"), || {
                    format!("requests of {n} rows are not among graph_spec's batch sizes ({buckets:?}): they run without a graph")
                });
                Plan::Eager
            }
            Fit::Ragged => Plan::Eager,
        }
    }

    fn tensor_for(&self, t: &BatchTensor<'_>, shape: Vec<i64>) -> Result<DynTensor> {
        DynTensor::new(&self.allocator, to_ort(t.dtype)?, shape).map_err(|e| {
            Error::unavailable(format!(
                "cannot allocate input '{}' on GPU {}: {e}",
                t.name, self.device
            ))
        })
    }

    /// Runs one batch; each of `outputs` goes to `sink` as GPU memory.
    pub(crate) fn run(
        &mut self,
        session: &mut Session,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        all_outputs: &[TensorSpec],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let rows = if self.batching {
            inputs.first().and_then(|t| t.shape.first().copied())
        } else {
            None
        };
        match self.plan(inputs) {
            Plan::Graph(key, padded) => {
                if !self.graphs.contains_key(&key) {
                    let graph = self.new_graph(session, inputs, &key, padded, all_outputs)?;
                    self.graphs.insert(key.clone(), graph);
                }
                let graph = self.graphs.get_mut(&key).expect("inserted above");
                let mut times = Times::start();
                for (t, dst) in inputs.iter().zip(graph.inputs.iter_mut()) {
                    copy_in(&mut self.uploader, self.device, t, dst)?;
                }
                times.staged();
                let out = session
                    .run_binding_with_options(&graph.binding, &graph.options)
                    .map_err(run_err)?;
                times.ran();
                emit(self.device, &out, outputs, rows, sink)?;
                times.log("graph", inputs);
                Ok(())
            }
            Plan::Eager => {
                let mut times = Times::start();
                let mut binding = session.create_binding().map_err(ort_err)?;
                for t in inputs {
                    // the binding keeps the tensor alive until it is dropped
                    let mut dst = self.tensor_for(t, t.shape.clone())?;
                    copy_in(&mut self.uploader, self.device, t, &mut dst)?;
                    binding.bind_input(t.name.as_str(), &dst).map_err(ort_err)?;
                }
                for o in all_outputs {
                    binding
                        .bind_output_to_device(o.name.as_str(), &self.on_gpu)
                        .map_err(ort_err)?;
                }
                times.staged();
                let out = match &self.no_graph {
                    Some(options) => session.run_binding_with_options(&binding, options),
                    None => session.run_binding(&binding),
                }
                .map_err(run_err)?;
                times.ran();
                emit(self.device, &out, outputs, rows, sink)?;
                times.log("eager", inputs);
                Ok(())
            }
        }
    }

    fn new_graph(
        &mut self,
        session: &Session,
        inputs: &[BatchTensor<'_>],
        key: &[Vec<i64>],
        padded: Option<i64>,
        all_outputs: &[TensorSpec],
    ) -> Result<Graph> {
        let id = self.graphs.len();
        let mut binding = session.create_binding().map_err(ort_err)?;
        let mut held = Vec::with_capacity(inputs.len());
        for (t, shape) in inputs.iter().zip(key) {
            let dst = self.tensor_for(t, shape.clone())?;
            binding.bind_input(t.name.as_str(), &dst).map_err(ort_err)?;
            held.push(dst);
        }
        for o in all_outputs {
            let mut shape = o.shape.clone();
            if let (Some(b), Some(first)) = (padded, shape.first_mut()) {
                *first = b;
            }
            let out = DynTensor::new(&self.allocator, to_ort(o.dtype)?, shape).map_err(|e| {
                Error::unavailable(format!(
                    "cannot allocate output '{}' on GPU {}: {e}",
                    o.name, self.device
                ))
            })?;
            binding.bind_output(o.name.as_str(), out).map_err(ort_err)?;
        }
        let mut options = RunOptions::new().map_err(ort_err)?;
        options.set("gpu_graph_id", id.to_string()).map_err(ort_err)?;
        log::info!(
            "ONNX Runtime CUDA graph {id} for input shapes {key:?} on GPU {} (captured after ONNX Runtime's warm-up runs)",
            self.device
        );
        Ok(Graph { binding, inputs: held, options })
    }
}

/// Hands each asked-for output to the sink as GPU memory, its first `rows` rows when
/// the batch was padded into a bucket.
fn emit(
    device: i32,
    out: &SessionOutputs<'_>,
    outputs: &[&str],
    rows: Option<i64>,
    sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
) -> Result<()> {
    for &name in outputs {
        let value = out
            .get(name)
            .ok_or_else(|| Error::internal(format!("ONNX Runtime returned no output '{name}'")))?;
        let ValueType::Tensor { ty, shape, .. } = value.dtype() else {
            return Err(Error::unsupported(format!("output '{name}' is not a tensor")));
        };
        let dtype = dtype_from_ort(*ty)?;
        let size = dtype.size().ok_or_else(|| {
            Error::unsupported(format!("output '{name}': BYTES outputs are not supported yet"))
        })?;
        let mut shape: Vec<i64> = shape.iter().copied().collect();
        if let (Some(n), Some(first)) = (rows, shape.first_mut()) {
            *first = n.min(*first);
        }
        let count: i64 = shape.iter().product();
        let tensor = value.view().downcast::<DynTensorValueType>().map_err(ort_err)?;
        if tensor.memory_info().is_cpu_accessible() {
            return Err(Error::internal(format!(
                "ONNX Runtime left output '{name}' in host memory on a GPU instance"
            )));
        }
        let len = count.max(0) as usize * size;
        // ONNX Runtime's tensor, alive while `out` (and the binding) live
        let data = view_in(&tensor, device, tensor.data_ptr() as u64, len)
            .map_err(|e| Error::internal(format!("output '{name}': {e}")))?;
        sink(OutputView { name, dtype, shape: &shape, data: Bytes::Device(data) })?;
    }
    Ok(())
}

/// Copies `t`'s bytes into the start of the GPU tensor `dst` on `device`: host bytes through
/// the uploader's page-locked buffer, GPU bytes device to device. (BOOL bytes were checked
/// per request, in `check_request`.)
fn copy_in(
    uploader: &mut Uploader,
    device: i32,
    t: &BatchTensor<'_>,
    dst: &mut DynTensor,
) -> Result<()> {
    let src = t
        .bytes()
        .ok_or_else(|| Error::internal(format!("input '{}' was not assembled", t.name)))?;
    if dst.memory_info().is_cpu_accessible() {
        return Err(Error::internal(format!(
            "input '{}': ONNX Runtime gave host memory for a GPU input",
            t.name
        )));
    }
    let (len, addr) = (src.len(), dst.data_ptr_mut() as u64);
    // `dst` has at least as many rows as `t` (same row shape and element type); the
    // driver checks the range
    let view = view_mut_in(dst, device, addr, len)
        .map_err(|e| Error::internal(format!("input '{}': {e}", t.name)))?;
    let copied = match src {
        Bytes::Host(h) => uploader.upload(h, view),
        Bytes::Device(_) => Cuda.copy(src, BytesMut::Device(view)),
    };
    copied
        .map_err(|e| Error::from(e).context(format!("copying input '{}' to GPU {device}", t.name)))
}

/// Where one GPU run's time went, logged at debug level (`--log-verbose=1`) as a `timing:`
/// line like the other engines' (bench/gpu/timing_summary.py averages them).
struct Times {
    t0: Option<Instant>,
    staged: Duration,
    ran: Duration,
}

impl Times {
    fn start() -> Times {
        Times {
            t0: log::log_enabled!(log::Level::Debug).then(Instant::now),
            staged: Duration::ZERO,
            ran: Duration::ZERO,
        }
    }
    fn staged(&mut self) {
        if let Some(t0) = self.t0 {
            self.staged = t0.elapsed();
        }
    }
    fn ran(&mut self) {
        if let Some(t0) = self.t0 {
            self.ran = t0.elapsed();
        }
    }
    fn log(&self, how: &str, inputs: &[BatchTensor<'_>]) {
        let Some(t0) = self.t0 else { return };
        let bytes: usize = inputs.iter().filter_map(|t| t.bytes()).map(|b| b.len()).sum();
        log::debug!(
            "timing: onnx run: input bytes {bytes}, inputs staged {} us, {how} run {} us, outputs delivered {} us",
            self.staged.as_micros(),
            self.ran.saturating_sub(self.staged).as_micros(),
            t0.elapsed().saturating_sub(self.ran).as_micros()
        );
    }
}

fn run_err(e: ort::Error) -> Error {
    runtime_error(format!("ONNX Runtime run failed: {e}"))
}
