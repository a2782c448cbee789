//! One instance's chain: the lookup writing the rows the network reads, on its device.

use std::ops::Range;
use std::sync::Arc;

use triton_rust_core::batch::{BatchData, BatchTensor};
use triton_rust_core::config::TensorSpec;
use triton_rust_core::engine::{Device, Engine, OutputView, Signature};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::tensor::{Bytes, DataType};
use triton_rust_cuda::{DeviceBuffer, DeviceOps, DeviceView};

use crate::settings::{ChainPlan, LOOKUP_OUTPUT};

/// Copies host bytes to the chain's GPU; done when `stage` returns. The views live until
/// the next call. The backend gives one to a chain on a GPU instance.
pub trait Stager: Send {
    fn stage(&mut self, parts: &[&[u8]]) -> Result<Vec<DeviceView<'_>>>;
}

/// Host inputs of the network at least this large (in all) are staged beside the lookup;
/// smaller ones cost less than the thread and are left to the network's engine.
pub(crate) const STAGE_BESIDE: usize = 1 << 20;

/// The fewest rows a part of a batch run in parts has.
const MIN_PART_ROWS: usize = 1024;

/// The chain's lookup: an engine that can also write its rows into GPU memory it is given
/// (`Ok(false)`, having done nothing, where it cannot).
pub trait LookupStep: Engine {
    fn run_into(
        &mut self,
        inputs: &[BatchTensor<'_>],
        out: &mut triton_rust_cuda::DeviceViewMut<'_>,
    ) -> Result<bool>;
}

/// The chain's network: an engine, and where a CUDA graph it already captured for a batch
/// of `inputs` reads input `name` (the AOTInductor engine's `graph_input`), if it has one.
pub trait Network: Engine {
    fn graph_input(
        &self,
        _inputs: &[BatchTensor<'_>],
        _name: &str,
    ) -> Option<triton_rust_core::tensor::DeviceViewMut<'static>> {
        None
    }
}

/// How the lookup's and the network's tensors meet: made once per model, shared by its
/// instances' chains.
#[derive(Debug)]
pub struct Joint {
    pub sparse_input: String,
    pub embeddings_input: String,
    /// The ragged keys' lengths, when the recommender takes them so.
    pub lengths_input: Option<String>,
    pub parts: usize,
    /// The lookup's rows (`[batch, tables, dim]`).
    pub rows: TensorSpec,
    /// The network's inputs, in its order.
    pub dense_inputs: Vec<TensorSpec>,
    /// The chain's: the network's inputs but the embeddings, then the keys; its outputs.
    pub sig: Signature,
}

impl Joint {
    /// Checks that the network takes the lookup's rows as `plan.embeddings_input`.
    pub fn new(lookup: &Signature, dense: &Signature, plan: &ChainPlan) -> Result<Joint> {
        let emb = dense.inputs.iter().find(|t| t.name == plan.embeddings_input).ok_or_else(|| {
            Error::invalid_arg(format!(
                "the dense network '{}' has no input '{}' to take the embeddings (parameter recommender_embeddings_input)",
                plan.dense_file.display(),
                plan.embeddings_input
            ))
        })?;
        let rows = &lookup.outputs[0];
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
            dense.inputs.iter().filter(|t| t.name != plan.embeddings_input).cloned().collect();
        inputs.extend(lookup.inputs.iter().cloned());
        Ok(Joint {
            sparse_input: plan.sparse_input.clone(),
            embeddings_input: plan.embeddings_input.clone(),
            lengths_input: plan.lengths_input.clone(),
            parts: plan.pipeline_parts,
            rows: rows.clone(),
            dense_inputs: dense.inputs.clone(),
            sig: Signature { inputs, outputs: dense.outputs.clone() },
        })
    }
}

/// One instance's chain: its lookup and its network, on its device.
pub struct Chain {
    lookup: Box<dyn LookupStep>,
    dense: Box<dyn Network>,
    joint: Arc<Joint>,
    device: Device,
    /// Whether the network takes inputs in GPU memory on this device.
    dense_takes_device: bool,
    pub(crate) stager: Option<Box<dyn Stager>>,
    /// A GPU instance's device operations: the parts' buffer of rows and their outputs' copies.
    ops: Option<Arc<dyn DeviceOps>>,
    /// The rows of a batch run in parts (grown to the largest batch, never shrunk).
    rows_buf: Option<DeviceBuffer>,
}

impl Chain {
    /// `dense_takes_device`: whether the network's engine takes inputs in GPU memory on `device`.
    pub fn new(
        lookup: Box<dyn LookupStep>,
        dense: Box<dyn Network>,
        joint: Arc<Joint>,
        device: Device,
        dense_takes_device: bool,
    ) -> Chain {
        Chain {
            lookup,
            dense,
            joint,
            device,
            dense_takes_device,
            stager: None,
            ops: None,
            rows_buf: None,
        }
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
    dense_inputs: &[TensorSpec],
    embeddings_input: &str,
    embeddings: BatchTensor<'a>,
    others: impl IntoIterator<Item = Result<BatchTensor<'a>>>,
) -> Result<Vec<BatchTensor<'a>>> {
    let (mut embeddings, mut others) = (Some(embeddings), others.into_iter());
    dense_inputs
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
    if rows == 0 || !bytes.len().is_multiple_of(rows) {
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
        let spec = &self.joint.rows;
        let (rows_type, mut shape) = (spec.dtype, spec.shape.clone());
        let Some(first) = shape.first_mut() else { return Ok(false) };
        *first = rows as i64;
        let Chain { lookup, dense, joint, .. } = self;
        let (embeddings_input, dense_inputs) = (&joint.embeddings_input, &joint.dense_inputs);
        let embeddings = |data| BatchTensor {
            name: embeddings_input.clone(),
            dtype: rows_type,
            shape: shape.clone(),
            data: BatchData::Borrowed(data),
        };
        let rest = || others.iter().map(|t| borrowed(t));
        let probe =
            network_inputs(dense_inputs, embeddings_input, embeddings(Bytes::Host(&[])), rest())?;
        // written while no run of the network is in flight: this instance runs one batch at
        // a time, and the network's run waits for its work before it returns
        let Some(mut slot) = dense.graph_input(&probe, embeddings_input) else {
            return Ok(false);
        };
        drop(probe);
        if !lookup.run_into(lookup_in, &mut slot)? {
            return Ok(false);
        }
        let written = embeddings(Bytes::Device(slot.into_view()));
        let dense_in = network_inputs(dense_inputs, embeddings_input, written, rest())?;
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
        let spec = &self.joint.rows;
        let (rows_type, rows_shape) = (spec.dtype, spec.shape.clone());
        let row_bytes = rows_shape.iter().skip(1).map(|&d| d.max(0) as usize).product::<usize>()
            * rows_type.size().unwrap_or(4);
        let Chain { lookup, dense, stager, rows_buf, joint, dense_takes_device, .. } = self;
        let (embeddings_input, dense_inputs, parts) =
            (&joint.embeddings_input, &joint.dense_inputs, &joint.parts);
        // parts are cut from host inputs; anything else runs whole
        if !*dense_takes_device
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
                    let looked = lookup.run_into(&first, cur.as_mut().expect("one part at least"));
                    let staged = job
                        .join()
                        .map_err(|_| Error::internal("staging the network's inputs panicked"));
                    (looked, staged)
                })
            }
            None => (
                lookup.run_into(&first, cur.as_mut().expect("one part at least")),
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
            let dense_in = network_inputs(dense_inputs, embeddings_input, embeddings, sliced)?;
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
                    (Some(k), Some(v)) => lookup.run_into(k, v).map(Some),
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
                // a later part's keys need the lookup's other path (a key that is no row of
                // its table: past it, added by an update, or a client's bad key): nothing is
                // answered yet, so the whole batch goes that way, where a bad key is the
                // client's error and the server runs each request alone (the parts already
                // looked up are counted again)
                Some(false) => return Ok(false),
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
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let joint = self.joint.clone();
        let keys = inputs.iter().find(|t| t.name == joint.sparse_input).ok_or_else(|| {
            Error::internal(format!("input '{}' missing from the batch", joint.sparse_input))
        })?;
        let lengths = match &joint.lengths_input {
            Some(name) => Some(inputs.iter().find(|t| &t.name == name).ok_or_else(|| {
                Error::internal(format!("input '{name}' missing from the batch"))
            })?),
            None => None,
        };
        let lookup_in: Vec<BatchTensor<'_>> =
            std::iter::once(keys).chain(lengths).map(borrowed).collect::<Result<_>>()?;
        // The network's inputs other than the embeddings, in its order.
        let others = joint
            .dense_inputs
            .iter()
            .filter(|spec| spec.name != joint.embeddings_input)
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
        // ragged keys are one flat run: the samples are the lengths' rows
        let rows = lengths.unwrap_or(keys).shape.first().map_or(0, |&r| r.max(0) as usize);
        if let (Device::Gpu(device), Some(ops)) = (self.device, self.ops.clone()) {
            // parts are cut from the keys by rows, which ragged keys do not have
            if joint.parts > 1
                && lengths.is_none()
                && rows >= joint.parts * MIN_PART_ROWS
                && self.run_in_parts(ops, device, keys, &others, rows, outputs, sink)?
            {
                return Ok(());
            }
        }
        if self.device != Device::Cpu
            && !(self.stager.is_some() && host >= STAGE_BESIDE)
            && self.run_in_graph_input(&lookup_in, &others, rows, outputs, sink)?
        {
            return Ok(());
        }
        // The dense network runs inside the lookup's sink, on the lookup's own buffer of
        // rows: nothing is copied between the two (unless the network's CUDA graph copies
        // them into its own input).
        let (dense, lookup, dense_takes_device) =
            (&mut self.dense, &mut self.lookup, self.dense_takes_device);
        let (embeddings_input, dense_inputs) = (&joint.embeddings_input, &joint.dense_inputs);
        let mut ran = false;
        let mut run_dense =
            |o: OutputView<'_>, staged: Option<Vec<DeviceView<'_>>>| -> Result<()> {
                // Host rows on a CPU instance; on a GPU instance the lookup's own device
                // buffer, which the network reads in place.
                if matches!(o.data, Bytes::Device(_)) && !dense_takes_device {
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
                let dense_in = network_inputs(dense_inputs, embeddings_input, embeddings, rest)?;
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
