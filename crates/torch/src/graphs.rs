//! CUDA graphs for a GPU instance: one graph per padded input shape, captured on the
//! instance's stream at the first batch of that shape and replayed after.
//!
//! A batch of n is padded to the smallest bucket b >= n: its rows are copied into the
//! first n rows of the graph's static inputs (the rest keep whatever they held), the
//! graph replays, and the first n rows of its static outputs are the answer. That
//! needs rows to be independent, which Triton's batching already assumes, and outputs
//! that are batch-major; a model whose capture fails (a host sync, a data-dependent
//! shape, outputs not batch-major) runs eagerly for that shape, logged once.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};

use tch::{CModule, IValue, Tensor};
use triton_rust_abi::graphs::{self, Fit};

use crate::convert::{dtype_of, tensors};
use crate::shim::{shim_call, CudaApi};

/// More distinct shapes than this run eagerly (logged once): each graph holds its
/// static inputs and outputs.
const MAX_GRAPHS: usize = 64;
/// Eager runs of a new shape before its capture: the TorchScript executor profiles and
/// optimizes the first runs of a shape, and cuBLAS/cuDNN set up their workspaces.
const WARMUP_RUNS: usize = 3;

/// Input element types and padded shapes.
type Key = Vec<(i32, Vec<i64>)>;

struct Captured {
    api: CudaApi,
    graph: *mut c_void,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
}

impl Drop for Captured {
    fn drop(&mut self) {
        // SAFETY: made by graph_begin/graph_end, freed once.
        unsafe { (self.api.graph_free)(self.graph) };
    }
}

pub(crate) struct Graphs {
    api: CudaApi,
    /// Ascending. A model without batching: empty (every exact shape gets a graph) or the
    /// rows of `exact_rows`.
    buckets: Vec<i64>,
    /// A model without batching: `buckets` are the exact rows (first dimension of every
    /// input) of the requests that run in graphs, unpadded (`graph_spec`'s batch sizes).
    exact_rows: bool,
    pool: Option<(u64, u64)>,
    captured: HashMap<Key, Captured>,
    refused: HashSet<Key>,
    said_full: bool,
    /// Row counts already logged as not among `graph_spec`'s (exact_rows).
    said_rows: HashSet<i64>,
}

impl Graphs {
    pub(crate) fn new(api: CudaApi, buckets: Vec<i64>, exact_rows: bool) -> Graphs {
        Graphs {
            api,
            buckets,
            exact_rows,
            pool: None,
            captured: HashMap::new(),
            refused: HashSet::new(),
            said_full: false,
            said_rows: HashSet::new(),
        }
    }

    /// The key of a batch and its row count (None for a model without batching), or
    /// None when it fits no bucket. `inputs`: each input's element type and shape.
    fn plan(&self, inputs: Vec<(i32, Vec<i64>)>) -> Option<(Key, Option<i64>)> {
        let shapes: Vec<&[i64]> = inputs.iter().map(|(_, s)| s.as_slice()).collect();
        let batching = !self.exact_rows && !self.buckets.is_empty();
        // inputs that fit no bucket or disagree on the batch run eagerly (eager says why)
        let Fit::Graph(padded) = graphs::fit(&self.buckets, batching, &shapes) else {
            return None;
        };
        let rows = padded.and(shapes.first().and_then(|s| s.first()).copied());
        let key = inputs.iter().map(|(t, s)| (*t, graphs::padded(s, padded))).collect();
        Some((key, rows))
    }

    fn plan_tensors(&self, inputs: &[&Tensor]) -> Result<Option<(Key, Option<i64>)>, String> {
        let typed = inputs
            .iter()
            .map(|t| Ok((dtype_of(t.kind())?, t.size())))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(self.plan(typed))
    }

    /// Where inputs of these element types and shapes go when their batch replays a graph
    /// already captured: the graph's static inputs, their first rows (so host inputs can
    /// be staged straight into them). None when no graph would replay them.
    pub(crate) fn inputs_for(&self, inputs: Vec<(i32, Vec<i64>)>) -> Option<Vec<Tensor>> {
        let (key, rows) = self.plan(inputs)?;
        let c = self.captured.get(&key)?;
        c.inputs.iter().map(|t| rows_of(t, rows).ok()).collect()
    }

    /// Runs the batch through its shape's graph, capturing it first if new; outputs go
    /// to `outs`. Returns false when the batch should run eagerly instead.
    pub(crate) fn run(
        &mut self,
        module: &CModule,
        inputs: &[&Tensor],
        outs: &mut Vec<Tensor>,
        note: &mut dyn FnMut(c_int, String),
    ) -> Result<bool, String> {
        let Some((key, rows)) = self.plan_tensors(inputs)? else {
            if let Some(n) =
                inputs.first().and_then(|t| t.size().first().copied()).filter(|_| self.exact_rows)
            {
                if self.said_rows.insert(n) {
                    let rows = &self.buckets;
                    note(
                        triton_rust_abi::LOG_INFO,
                        format!("requests of {n} rows are not among graph_spec's batch sizes ({rows:?}): they run without a graph"),
                    );
                }
            }
            return Ok(false);
        };
        if self.refused.contains(&key) {
            return Ok(false);
        }
        if !self.captured.contains_key(&key) {
            if self.captured.len() >= MAX_GRAPHS {
                if !self.said_full {
                    self.said_full = true;
                    note(triton_rust_abi::LOG_WARN, format!("{MAX_GRAPHS} CUDA graphs captured; batches of other shapes run eagerly"));
                }
                return Ok(false);
            }
            let started = std::time::Instant::now();
            match self.capture(module, &key, inputs, rows) {
                Ok(c) => {
                    note(
                        triton_rust_abi::LOG_INFO,
                        format!(
                            "CUDA graph captured for inputs {:?} in {} ms",
                            shapes(&key),
                            started.elapsed().as_millis()
                        ),
                    );
                    self.captured.insert(key.clone(), c);
                }
                Err(e) => {
                    note(
                        triton_rust_abi::LOG_WARN,
                        format!(
                            "no CUDA graph for inputs {:?}: {e}; batches of this shape run eagerly",
                            shapes(&key)
                        ),
                    );
                    self.refused.insert(key);
                    return Ok(false);
                }
            }
        }
        let c = &self.captured[&key];
        for (dst, src) in c.inputs.iter().zip(inputs) {
            let mut dst = rows_of(dst, rows)?;
            // (host inputs were staged into the static inputs already)
            if dst.data_ptr() != src.data_ptr() {
                dst.f_copy_(src)
                    .map_err(|e| format!("copying an input into the CUDA graph: {e}"))?;
            }
        }
        // SAFETY: a graph made by this shim; the buffer outlives the call.
        shim_call(|err, len| unsafe { (self.api.graph_replay)(c.graph, err, len) })
            .map_err(|e| format!("CUDA graph replay failed: {e}"))?;
        for o in &c.outputs {
            outs.push(rows_of(o, rows)?);
        }
        Ok(true)
    }

    fn capture(
        &mut self,
        module: &CModule,
        key: &Key,
        inputs: &[&Tensor],
        rows: Option<i64>,
    ) -> Result<Captured, String> {
        // static inputs of the padded shape, holding this batch in their first rows
        let mut statics = Vec::with_capacity(inputs.len());
        for ((_, shape), src) in key.iter().zip(inputs) {
            let t = Tensor::f_zeros(shape.as_slice(), (src.kind(), src.device()))
                .map_err(|e| e.to_string())?;
            rows_of(&t, rows)?.f_copy_(src).map_err(|e| e.to_string())?;
            statics.push(t);
        }
        let args: Vec<IValue> = statics.iter().map(|t| IValue::Tensor(t.shallow_clone())).collect();
        for _ in 0..WARMUP_RUNS {
            module.forward_is(&args).map_err(|e| format!("warm-up run failed: {e}"))?;
        }
        let (first, second) = match self.pool {
            Some(p) => p,
            None => {
                let (mut a, mut b) = (0u64, 0u64);
                // SAFETY: plain out-parameters.
                unsafe { (self.api.graph_pool)(&mut a, &mut b) };
                self.pool = Some((a, b));
                (a, b)
            }
        };
        let mut graph = std::ptr::null_mut();
        // SAFETY: the instance's stream is current on this thread (run entered it).
        shim_call(|err, len| {
            graph = unsafe { (self.api.graph_begin)(first, second, err, len) };
            c_int::from(graph.is_null())
        })
        .map_err(|e| format!("capture did not start: {e}"))?;
        let result = module.forward_is(&args);
        // the capture must end whatever happened, so that the stream leaves capture mode
        // SAFETY: graph came from graph_begin; on failure graph_end frees it.
        if let Err(ended) = shim_call(|err, len| unsafe { (self.api.graph_end)(graph, err, len) }) {
            let why = match &result {
                Err(e) => format!("{e}"),
                Ok(_) => ended,
            };
            // graph_end gave the pool's reference back: with no graph of ours holding it, the
            // pool may now be released for good, and a capture into it again would be refused
            if self.captured.is_empty() {
                self.pool = None;
            }
            return Err(format!("the model cannot be captured ({why})"));
        }
        let mut captured = Captured { api: self.api, graph, inputs: statics, outputs: Vec::new() };
        tensors(
            result.map_err(|e| format!("the captured run failed: {e}"))?,
            &mut captured.outputs,
        )?;
        if let Some(bucket) = key.first().and_then(|(_, s)| s.first()).filter(|_| rows.is_some()) {
            if let Some(o) = captured.outputs.iter().find(|o| o.size().first() != Some(bucket)) {
                return Err(format!(
                    "output of shape {:?} is not batch-major (batch {bucket})",
                    o.size()
                ));
            }
        }
        Ok(captured)
    }
}

/// The first `rows` rows of a graph's static tensor (all of it for a model without batching).
fn rows_of(t: &Tensor, rows: Option<i64>) -> Result<Tensor, String> {
    match rows {
        Some(n) => t.f_narrow(0, 0, n).map_err(|e| e.to_string()),
        None => Ok(t.shallow_clone()),
    }
}

fn shapes(key: &Key) -> Vec<&[i64]> {
    key.iter().map(|(_, s)| s.as_slice()).collect()
}
