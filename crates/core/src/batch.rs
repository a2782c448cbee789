//! Batch assembly: N requests in, one contiguous tensor per input out, and the
//! reverse for outputs.
//!
//! Triton's dynamic batcher hands `execute` several requests at once. This room checks
//! each request for what only the backend can see (its error stays its own), groups
//! the good ones by shape so that concatenation is well defined, builds one tensor per
//! input (borrowing the request's buffer when a group is a single contiguous request),
//! and tells the caller which rows of each output belong to which request.
//! It knows nothing of Triton or engines: inputs arrive as [`RequestTensor`]s whose
//! pieces are [`Bytes`] (host slices or device views).

use std::ops::Range;

use crate::config::{request_shape_fits, resolve_shape, ModelConfig, TensorConfig};
use crate::error::{Error, Result};
use crate::tensor::{
    decode_strings, element_count, first_non_finite, AlignedBuf, Bytes, DataType, Device,
    DeviceBuffer, DeviceView,
};

/// One input tensor of one request.
#[derive(Debug, Clone)]
pub struct RequestTensor<'a> {
    pub name: String,
    pub dtype: DataType,
    pub shape: Vec<i64>,
    /// The tensor's bytes in the pieces the request holds them in.
    pub chunks: Vec<Bytes<'a>>,
}

impl RequestTensor<'_> {
    pub fn byte_size(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum()
    }

    /// The tensor's bytes in host memory as one slice: the request's own buffer when it is
    /// one piece, the pieces joined otherwise. None when a piece lies in GPU memory.
    pub fn host_bytes(&self) -> Option<std::borrow::Cow<'_, [u8]>> {
        match self.chunks.as_slice() {
            [one] => one.host().map(std::borrow::Cow::Borrowed),
            pieces => {
                let mut joined = Vec::with_capacity(self.byte_size());
                for p in pieces {
                    joined.extend_from_slice(p.host()?);
                }
                Some(std::borrow::Cow::Owned(joined))
            }
        }
    }
}

/// What the model accepts beyond its config: checks only the backend can make.
#[derive(Debug, Clone, Default)]
pub struct InputPolicy {
    /// Reject NaN and Inf in float inputs (`parameters { key: "reject_nonfinite" }`).
    pub reject_nonfinite: bool,
    /// The engine can read inputs that live in GPU memory.
    pub accepts_device_inputs: bool,
    /// Integer inputs whose values must lie in `[lo, hi]` (`parameters { key:
    /// "valid_range" value: "input__0:0:30521,..." }`): an id past a model's vocabulary
    /// is refused here instead of tripping a device-side assert that breaks the GPU for
    /// every model in the process.
    pub valid_range: Vec<(String, i64, i64)>,
}

/// Parses `valid_range`: `name:lo:hi` items, comma-separated.
pub fn parse_valid_range(spec: &str) -> Result<Vec<(String, i64, i64)>> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let bad = || {
                Error::invalid_arg(format!(
                    "parameter 'valid_range': '{item}' is not <input>:<lo>:<hi>"
                ))
            };
            let mut parts = item.rsplitn(3, ':');
            let hi: i64 = parts.next().and_then(|x| x.trim().parse().ok()).ok_or_else(bad)?;
            let lo: i64 = parts.next().and_then(|x| x.trim().parse().ok()).ok_or_else(bad)?;
            let name = parts.next().map(str::trim).filter(|n| !n.is_empty()).ok_or_else(bad)?;
            if lo > hi {
                return Err(bad());
            }
            Ok((name.to_string(), lo, hi))
        })
        .collect()
}

/// The first element of integer `bytes` outside `[lo, hi]`, as (index, value).
fn first_out_of_range(dtype: DataType, bytes: &[u8], lo: i64, hi: i64) -> Option<(usize, i64)> {
    let check = |i: usize, v: i64| (v < lo || v > hi).then_some((i, v));
    match dtype {
        DataType::I64 => bytes
            .chunks_exact(8)
            .enumerate()
            .find_map(|(i, c)| check(i, i64::from_le_bytes(c.try_into().expect("8")))),
        DataType::I32 => bytes
            .chunks_exact(4)
            .enumerate()
            .find_map(|(i, c)| check(i, i32::from_le_bytes(c.try_into().expect("4")) as i64)),
        DataType::I16 => bytes
            .chunks_exact(2)
            .enumerate()
            .find_map(|(i, c)| check(i, i16::from_le_bytes([c[0], c[1]]) as i64)),
        DataType::I8 => bytes.iter().enumerate().find_map(|(i, &b)| check(i, b as i8 as i64)),
        DataType::U8 | DataType::Bool => {
            bytes.iter().enumerate().find_map(|(i, &b)| check(i, b as i64))
        }
        DataType::U16 => bytes
            .chunks_exact(2)
            .enumerate()
            .find_map(|(i, c)| check(i, u16::from_le_bytes([c[0], c[1]]) as i64)),
        DataType::U32 => bytes
            .chunks_exact(4)
            .enumerate()
            .find_map(|(i, c)| check(i, u32::from_le_bytes(c.try_into().expect("4")) as i64)),
        DataType::U64 => bytes.chunks_exact(8).enumerate().find_map(|(i, c)| {
            let v = u64::from_le_bytes(c.try_into().expect("8"));
            check(i, v.min(i64::MAX as u64) as i64)
        }),
        _ => None,
    }
}

/// A request that passed validation: its inputs in config order, and its batch size.
#[derive(Debug)]
pub struct CheckedRequest<'a> {
    pub tensors: Vec<RequestTensor<'a>>,
    /// Rows this request contributes (1 for a non-batching model).
    pub batch: usize,
}

/// Checks one request's inputs against the config and policy. The error names the
/// input and the problem; it fails this request only.
pub fn check_request<'a>(
    cfg: &ModelConfig,
    policy: &InputPolicy,
    mut given: Vec<RequestTensor<'a>>,
) -> Result<CheckedRequest<'a>> {
    if let Some(extra) = given.iter().find(|g| !cfg.inputs.iter().any(|c| c.name == g.name)) {
        let expected: Vec<&str> = cfg.inputs.iter().map(|c| c.name.as_str()).collect();
        return Err(Error::invalid_arg(format!(
            "unexpected input '{}' (the model takes {expected:?})",
            extra.name
        )));
    }
    let mut ordered = Vec::with_capacity(cfg.inputs.len());
    let mut batch: Option<(usize, &str)> = None;
    for c in &cfg.inputs {
        let pos = given
            .iter()
            .position(|g| g.name == c.name)
            .ok_or_else(|| Error::invalid_arg(format!("missing input '{}'", c.name)))?;
        let mut t = given.swap_remove(pos);
        if cfg.sequence.as_ref().and_then(|s| s.string_corrid.as_deref()) == Some(c.name.as_str()) {
            t = string_corrid(t)?;
        }
        check_tensor(cfg, c, policy, &t)?;
        if cfg.batching() {
            let b = t.shape[0] as usize;
            match batch {
                None => batch = Some((b, c.name.as_str())),
                Some((first, first_name)) if first != b => {
                    return Err(Error::invalid_arg(format!(
                        "input '{}' has batch size {b} but input '{first_name}' has {first}",
                        c.name
                    )))
                }
                _ => {}
            }
        }
        ordered.push(t);
    }
    let batch = batch.map_or(1, |(b, _)| b);
    if cfg.batching() && batch as i64 > cfg.max_batch_size {
        return Err(Error::invalid_arg(format!(
            "batch size {batch} is above the model's max_batch_size {}",
            cfg.max_batch_size
        )));
    }
    Ok(CheckedRequest { tensors: ordered, batch })
}

fn check_tensor(
    cfg: &ModelConfig,
    c: &TensorConfig,
    policy: &InputPolicy,
    t: &RequestTensor<'_>,
) -> Result<()> {
    let name = &c.name;
    if t.dtype != c.dtype {
        return Err(Error::invalid_arg(format!(
            "input '{name}' has data type {} but the model expects {}",
            t.dtype.wire_name(),
            c.dtype.wire_name()
        )));
    }
    if !request_shape_fits(cfg, c, &t.shape) {
        let expected =
            if cfg.batching() { format!("[batch, {:?}]", c.dims) } else { format!("{:?}", c.dims) };
        return Err(Error::invalid_arg(format!(
            "input '{name}' has shape {:?} but the model expects {expected}",
            t.shape
        )));
    }
    let count = element_count(&t.shape).map_err(|e| e.context(format!("input '{name}'")))?;
    // (a ragged input may hold nothing for a request: its other inputs say so)
    if count == 0 && !cfg.ragged.contains(name) {
        return Err(Error::invalid_arg(format!("input '{name}' is empty (shape {:?})", t.shape)));
    }
    if let Some(size) = t.dtype.size() {
        // checked: a shape whose byte count wraps to the bytes sent must not pass
        let need = count.checked_mul(size).ok_or_else(|| {
            Error::invalid_arg(format!("input '{name}' has shape {:?}, too large", t.shape))
        })?;
        if t.byte_size() != need {
            return Err(Error::invalid_arg(format!(
                "input '{name}' holds {} bytes but shape {:?} of {} needs {need}",
                t.byte_size(),
                t.shape,
                t.dtype.wire_name(),
            )));
        }
    } else {
        check_strings(name, t, count)?;
    }
    let on_device = t.chunks.iter().any(|c| !c.device().is_host());
    if on_device && !policy.accepts_device_inputs {
        return Err(Error::invalid_arg(format!(
            "input '{name}' is in GPU memory but this model instance runs on the CPU"
        )));
    }
    if let Some((_, lo, hi)) = policy.valid_range.iter().find(|r| r.0 == *name) {
        if on_device {
            return Err(Error::invalid_arg(format!("input '{name}' is in GPU memory, where its valid_range cannot be checked; send it in host memory")));
        }
        let mut offset = 0usize;
        for chunk in &t.chunks {
            if let Bytes::Host(bytes) = chunk {
                if let Some((i, v)) = first_out_of_range(t.dtype, bytes, *lo, *hi) {
                    return Err(Error::invalid_arg(format!(
                        "input '{name}' holds {v} at element {}, outside the model's valid range [{lo}, {hi}]",
                        offset + i
                    )));
                }
                offset += bytes.len() / t.dtype.size().unwrap_or(1);
            }
        }
    }
    if policy.reject_nonfinite && t.dtype.is_float() && !on_device {
        let mut offset = 0usize;
        for chunk in &t.chunks {
            if let Bytes::Host(bytes) = chunk {
                if let Some(i) = first_non_finite(t.dtype, bytes) {
                    return Err(Error::invalid_arg(format!(
                        "input '{name}' holds a NaN or infinite value at element {}",
                        offset + i
                    )));
                }
                offset += bytes.len() / t.dtype.size().unwrap_or(1);
            }
        }
    }
    Ok(())
}

/// A string correlation id as Triton fills its control: one string in a buffer sized for
/// the longest id, the bytes after the string unused. The tensor is cut to that string, so
/// it batches and checks like any one-string input.
fn string_corrid(mut t: RequestTensor<'_>) -> Result<RequestTensor<'_>> {
    let name = t.name.clone();
    let bad = |why: String| Error::invalid_arg(format!("correlation id input '{name}': {why}"));
    let [Bytes::Host(bytes)] = t.chunks.as_slice() else {
        return Err(bad("expected one buffer in host memory".into()));
    };
    let bytes: &[u8] = bytes;
    let len =
        bytes
            .get(..4)
            .map(|p| u32::from_le_bytes(p.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| bad(format!("{} bytes, too few for a string's length", bytes.len())))?;
    let end = 4usize
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad(format!("says {len} bytes but only {} follow", bytes.len() - 4)))?;
    t.chunks = vec![Bytes::Host(&bytes[..end])];
    Ok(t)
}

/// A BYTES input must hold exactly its shape's count of well-formed strings, in host
/// memory (strings are never read on a GPU).
fn check_strings(name: &str, t: &RequestTensor<'_>, count: usize) -> Result<()> {
    let mut joined = Vec::new();
    let bytes: &[u8] = match t.chunks.as_slice() {
        [Bytes::Host(b)] => b,
        chunks => {
            for c in chunks {
                joined.extend_from_slice(c.host().ok_or_else(|| {
                    Error::invalid_arg(format!("input '{name}' is a BYTES tensor in GPU memory; send strings in host memory"))
                })?);
            }
            &joined
        }
    };
    let strings = decode_strings(bytes).map_err(|e| {
        Error::invalid_arg(format!("input '{name}' is malformed BYTES: {}", e.message()))
    })?;
    if strings.len() != count {
        return Err(Error::invalid_arg(format!(
            "input '{name}' holds {} strings but shape {:?} needs {count}",
            strings.len(),
            t.shape
        )));
    }
    Ok(())
}

/// Checks that inputs which share a named dimension in the model (e.g. two inputs of
/// shape `[batch, n]`) agree on its size within one request. `dims[i]` names the
/// dimensions of input `i` (empty string: unnamed), aligned with the request tensor's
/// full shape.
pub fn check_shared_dims(tensors: &[RequestTensor<'_>], dims: &[(&str, &[String])]) -> Result<()> {
    let mut seen: Vec<(&str, i64, &str)> = Vec::new(); // (dim name, size, input)
    for (input, names) in dims {
        let Some(t) = tensors.iter().find(|t| t.name == *input) else { continue };
        if names.len() != t.shape.len() {
            continue;
        }
        for (sym, &size) in names.iter().zip(&t.shape) {
            // ONNX Runtime reports an unnamed dynamic dimension as "" or "?": shared by nothing
            if sym.is_empty() || sym == "?" {
                continue;
            }
            match seen.iter().find(|(n, _, _)| n == sym) {
                Some((_, first, other)) if *first != size && other == input => {
                    return Err(Error::invalid_arg(format!(
                        "input '{input}' must have the same size in every dimension named '{sym}': {first} vs {size}"
                    )))
                }
                Some((_, first, other)) if *first != size => {
                    return Err(Error::invalid_arg(format!(
                        "inputs '{other}' and '{input}' must agree on dimension '{sym}': {first} vs {size}"
                    )))
                }
                Some(_) => {}
                None => seen.push((sym, size, input)),
            }
        }
    }
    Ok(())
}

/// Splits checked requests into groups that can be concatenated: same non-batch dims
/// for every input. Each group is a list of indices into `requests`, in order.
/// A non-batching model runs every request alone.
pub fn group_by_shape(cfg: &ModelConfig, requests: &[&CheckedRequest<'_>]) -> Vec<Vec<usize>> {
    // Requests batch together when every input has the same non-batch dims and lives in
    // the same kind of memory (host, or GPU): GPU inputs are then gathered onto the
    // instance's GPU from whichever GPUs hold them.
    type Key<'k> = Vec<(&'k [i64], bool)>;
    let mut groups: Vec<(Key<'_>, Vec<usize>)> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        if !cfg.batching() {
            groups.push((Vec::new(), vec![i]));
            continue;
        }
        // a ragged input's size is free: requests batch whatever it holds
        let key: Key<'_> = r
            .tensors
            .iter()
            .map(|t| {
                let shape = if cfg.ragged.contains(&t.name) { &[][..] } else { &t.shape[1..] };
                (shape, device_of(t).is_host())
            })
            .collect();
        match groups.iter_mut().find(|(k, _)| !k.is_empty() && *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    groups.into_iter().map(|(_, m)| m).collect()
}

/// Where an input's bytes are: the GPU of its first device piece, else the host (a
/// mixed input is refused when it is assembled).
fn device_of(t: &RequestTensor<'_>) -> Device {
    t.chunks.iter().map(Bytes::device).find(|d| !d.is_host()).unwrap_or(Device::Cpu)
}

/// One input of an assembled batch.
pub enum BatchData<'a> {
    /// A single request's contiguous buffer (host or device), used in place.
    Borrowed(Bytes<'a>),
    /// Requests concatenated into one host buffer.
    Owned(AlignedBuf),
    /// Several device buffers that make up the input, in order (on one GPU or several):
    /// the execute path gathers them into one buffer on the instance's GPU before the
    /// engine sees the batch.
    DeviceParts(Vec<DeviceView<'a>>),
    /// Device parts gathered into one buffer.
    Gathered(DeviceBuffer),
}

pub struct BatchTensor<'a> {
    pub name: String,
    pub dtype: DataType,
    pub shape: Vec<i64>,
    pub data: BatchData<'a>,
}

impl BatchTensor<'_> {
    /// The input's bytes; `None` only for device parts not gathered yet.
    pub fn bytes(&self) -> Option<Bytes<'_>> {
        match &self.data {
            BatchData::Borrowed(b) => Some(*b),
            BatchData::Owned(b) => Some(Bytes::Host(b.as_slice())),
            BatchData::Gathered(b) => Some(Bytes::Device(b.view())),
            BatchData::DeviceParts(_) => None,
        }
    }
    pub fn host_bytes(&self) -> Option<&[u8]> {
        self.bytes().and_then(|b| b.host())
    }
}

/// A batch ready for an engine, and which rows belong to which request.
pub struct Batch<'a> {
    pub tensors: Vec<BatchTensor<'a>>,
    /// Row range of each member request, in the order given to [`assemble`].
    pub rows: Vec<Range<usize>>,
    pub total_rows: usize,
}

/// Builds one tensor per input from a group of same-shape checked requests.
pub fn assemble<'a>(cfg: &ModelConfig, group: &[&CheckedRequest<'a>]) -> Result<Batch<'a>> {
    let first = group.first().ok_or_else(|| Error::internal("assemble called with no requests"))?;
    let mut rows = Vec::with_capacity(group.len());
    let mut total = 0usize;
    for r in group {
        rows.push(total..total + r.batch);
        total += r.batch;
    }
    let mut tensors = Vec::with_capacity(first.tensors.len());
    for (i, proto) in first.tensors.iter().enumerate() {
        let mut shape = proto.shape.clone();
        if cfg.batching() {
            shape[0] = total as i64;
        }
        if cfg.ragged.contains(&proto.name) {
            // every request's elements, one after the other, as one flat tensor (as Triton
            // hands a ragged input to a model); the model's other inputs say where each ends
            let elements: i64 =
                group.iter().map(|r| r.tensors[i].shape.iter().product::<i64>()).sum();
            shape = vec![elements];
        }
        // `reshape`: the engine sees the model's shape, not the one clients send
        if let Some(r) =
            cfg.inputs.iter().find(|c| c.name == proto.name).and_then(|c| c.reshape.as_ref())
        {
            let lead = usize::from(cfg.batching());
            let per_row = element_count(&shape[lead..])?;
            let dims = resolve_shape(r, per_row).ok_or_else(|| {
                Error::invalid_arg(format!(
                    "input '{}': shape {:?} does not fit reshape {r:?}",
                    proto.name,
                    &shape[lead..]
                ))
            })?;
            shape.truncate(lead);
            shape.extend(dims);
        }
        let mixed = || {
            Error::unsupported(format!(
                "input '{}' is split between host and GPU memory; the rust backend takes one or the other",
                proto.name
            ))
        };
        let data = match (group.len(), proto.chunks.as_slice(), device_of(proto)) {
            (1, [only], _) => BatchData::Borrowed(*only),
            (_, _, Device::Gpu(_)) => {
                let mut parts = Vec::new();
                for r in group {
                    for chunk in &r.tensors[i].chunks {
                        match chunk {
                            Bytes::Device(v) => parts.push(*v),
                            Bytes::Host(_) => return Err(mixed()),
                        }
                    }
                }
                BatchData::DeviceParts(parts)
            }
            (_, _, Device::Cpu) => {
                let mut pieces = Vec::new();
                for r in group {
                    for chunk in &r.tensors[i].chunks {
                        pieces.push(chunk.host().ok_or_else(mixed)?);
                    }
                }
                BatchData::Owned(join_host(&pieces))
            }
        };
        tensors.push(BatchTensor { name: proto.name.clone(), dtype: proto.dtype, shape, data });
    }
    Ok(Batch { tensors, rows, total_rows: total })
}

/// The pieces one after the other in one buffer, copied on this thread. A large join copied
/// by the worker pool instead served MLPerf DLRM-v2's keys from host memory 5-14% faster
/// in-process but 2-7% slower through gRPC on the 16-core H100 host, likely because its
/// threads took CPU from the server's front end (bench/gpu/results/dlrm-v2/front_end/README.md,
/// calls 11 to 13).
fn join_host(pieces: &[&[u8]]) -> AlignedBuf {
    let size: usize = pieces.iter().map(|p| p.len()).sum();
    // every byte is written below
    let mut buf = AlignedBuf::for_overwrite(size);
    let mut at = 0;
    let out = buf.as_mut_slice();
    for p in pieces {
        out[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    buf
}

mod scatter;
pub use scatter::scatter_ranges;

#[cfg(test)]
mod tests;
