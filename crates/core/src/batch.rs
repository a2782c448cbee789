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
        let t = given.swap_remove(pos);
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
    if count == 0 {
        return Err(Error::invalid_arg(format!("input '{name}' is empty (shape {:?})", t.shape)));
    }
    if let Some(size) = t.dtype.size() {
        if t.byte_size() != count * size {
            return Err(Error::invalid_arg(format!(
                "input '{name}' holds {} bytes but shape {:?} of {} needs {}",
                t.byte_size(),
                t.shape,
                t.dtype.wire_name(),
                count * size
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
    // the same memory (host, or a given GPU): GPU inputs are then gathered on their GPU.
    type Key<'k> = Vec<(&'k [i64], Device)>;
    let mut groups: Vec<(Key<'_>, Vec<usize>)> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        if !cfg.batching() {
            groups.push((Vec::new(), vec![i]));
            continue;
        }
        let key: Key<'_> = r.tensors.iter().map(|t| (&t.shape[1..], device_of(t))).collect();
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
    /// Several device buffers that make up the input, in order: the execute path
    /// gathers them into one buffer on that GPU before the engine sees the batch.
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
            (_, _, Device::Gpu(id)) => {
                let mut parts = Vec::new();
                for r in group {
                    for chunk in &r.tensors[i].chunks {
                        match chunk {
                            Bytes::Device(v) if v.device() == id => parts.push(*v),
                            _ => return Err(mixed()),
                        }
                    }
                }
                BatchData::DeviceParts(parts)
            }
            (_, _, Device::Cpu) => {
                let size: usize = group.iter().map(|r| r.tensors[i].byte_size()).sum();
                // every byte is written below
                let mut buf = AlignedBuf::for_overwrite(size);
                let out = buf.as_mut_slice();
                let mut at = 0;
                for r in group {
                    for chunk in &r.tensors[i].chunks {
                        let b = chunk.host().ok_or_else(mixed)?;
                        out[at..at + b.len()].copy_from_slice(b);
                        at += b.len();
                    }
                }
                if at != size {
                    return Err(Error::internal(format!(
                        "input '{}': {at} bytes assembled, {size} expected",
                        proto.name
                    )));
                }
                BatchData::Owned(buf)
            }
        };
        tensors.push(BatchTensor { name: proto.name.clone(), dtype: proto.dtype, shape, data });
    }
    Ok(Batch { tensors, rows, total_rows: total })
}

/// Byte range of each request's rows in an output of the batch, and the shape its
/// client gets. Checks that the engine really produced one row per batch item. `data`
/// is the output's bytes, read only for BYTES (whose elements differ in size; they must
/// be in host memory).
pub fn scatter_ranges(
    cfg: &ModelConfig,
    batch: &Batch<'_>,
    name: &str,
    dtype: DataType,
    shape: &[i64],
    data: Bytes<'_>,
) -> Result<Vec<(Vec<i64>, Range<usize>)>> {
    let elements = element_count(shape)?;
    // where element i starts, in bytes (i = elements: the end)
    let offsets: Box<dyn Fn(usize) -> usize> = match dtype.size() {
        Some(size) => Box::new(move |i| i * size),
        None => {
            let bytes = data.host().ok_or_else(|| {
                Error::internal(format!("BYTES output '{name}' is not in host memory"))
            })?;
            let strings = decode_strings(bytes).map_err(|e| {
                Error::internal(format!("output '{name}' is malformed BYTES: {}", e.message()))
            })?;
            if strings.len() != elements {
                return Err(Error::internal(format!(
                    "output '{name}' of shape {shape:?} holds {} strings",
                    strings.len()
                )));
            }
            let mut starts: Vec<usize> =
                strings.iter().map(|s| s.as_ptr() as usize - bytes.as_ptr() as usize - 4).collect();
            starts.push(bytes.len());
            Box::new(move |i| starts[i])
        }
    };
    // `reshape`: clients get the config's dims back, not the model's shape
    let reshaped = cfg.outputs.iter().find(|c| c.name == name).filter(|c| c.reshape.is_some());
    let client_shape = |rows: Option<usize>, elements: usize| -> Result<Vec<i64>> {
        let Some(c) = reshaped else {
            let mut s = shape.to_vec();
            if let Some(r) = rows {
                s[0] = r as i64;
            }
            return Ok(s);
        };
        let per_row = rows.map_or(elements, |r| elements.checked_div(r).unwrap_or(0));
        let dims = resolve_shape(&c.dims, per_row).ok_or_else(|| {
            Error::internal(format!(
                "output '{name}' of shape {shape:?} does not fit the config's dims {:?}",
                c.dims
            ))
        })?;
        Ok(rows.map(|r| r as i64).into_iter().chain(dims).collect())
    };
    if !cfg.batching() {
        return Ok(vec![(client_shape(None, elements)?, 0..offsets(elements))]);
    }
    if shape.first().copied() != Some(batch.total_rows as i64) {
        return Err(Error::internal(format!(
            "output '{name}' has shape {shape:?}; expected a first dimension of {} (the batch size)",
            batch.total_rows
        )));
    }
    let per_row = elements.checked_div(batch.total_rows).unwrap_or(0);
    batch
        .rows
        .iter()
        .map(|r| {
            Ok((
                client_shape(Some(r.len()), r.len() * per_row)?,
                offsets(r.start * per_row)..offsets(r.end * per_row),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max_batch: i64) -> ModelConfig {
        ModelConfig::from_json(&format!(
            r#"{{"max_batch_size": {max_batch},
            "input": [{{"name": "A", "data_type": "TYPE_FP32", "dims": [-1]}},
                      {{"name": "B", "data_type": "TYPE_INT32", "dims": [2]}}],
            "output": [{{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}}]}}"#
        ))
        .unwrap()
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn i32s(v: &[i32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn t<'a>(
        name: &str,
        dtype: DataType,
        shape: &[i64],
        chunks: Vec<&'a [u8]>,
    ) -> RequestTensor<'a> {
        RequestTensor {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            chunks: chunks.into_iter().map(Bytes::Host).collect(),
        }
    }

    #[test]
    fn checks_name_the_problem() {
        let c = cfg(8);
        let p = InputPolicy { reject_nonfinite: true, ..Default::default() };
        let a = f32s(&[1.0, 2.0, 3.0]);
        let b = i32s(&[1, 2]);
        fn ok<'a>(a: &'a [u8], b: &'a [u8]) -> Vec<RequestTensor<'a>> {
            vec![t("A", DataType::F32, &[1, 3], vec![a]), t("B", DataType::I32, &[1, 2], vec![b])]
        }
        assert_eq!(check_request(&c, &p, ok(&a, &b)).unwrap().batch, 1);

        let err = |inputs| check_request(&c, &p, inputs).unwrap_err().to_string();
        assert!(err(vec![t("A", DataType::F32, &[1, 3], vec![&a])]).contains("missing input 'B'"));
        let mut extra = ok(&a, &b);
        extra.push(t("C", DataType::F32, &[1, 3], vec![&a]));
        assert!(err(extra).contains("unexpected input 'C'"));
        assert!(err(vec![
            t("A", DataType::F64, &[1, 3], vec![&a]),
            t("B", DataType::I32, &[1, 2], vec![&b])
        ])
        .contains("'A' has data type FP64"));
        assert!(err(vec![
            t("A", DataType::F32, &[1, 3], vec![&a]),
            t("B", DataType::I32, &[1, 3], vec![&b])
        ])
        .contains("'B' has shape [1, 3]"));
        assert!(err(vec![
            t("A", DataType::F32, &[1, 4], vec![&a]),
            t("B", DataType::I32, &[1, 2], vec![&b])
        ])
        .contains("holds 12 bytes"));
        assert!(err(vec![
            t("A", DataType::F32, &[1, 0], vec![]),
            t("B", DataType::I32, &[1, 2], vec![&b])
        ])
        .contains("'A' is empty"));
        let nan = f32s(&[1.0, f32::NAN, 3.0]);
        assert!(err(ok(&nan, &b)).contains("'A' holds a NaN or infinite value at element 1"));
        let b2 = i32s(&[1, 2, 3, 4]);
        assert!(err(vec![
            t("A", DataType::F32, &[1, 3], vec![&a]),
            t("B", DataType::I32, &[2, 2], vec![&b2])
        ])
        .contains("batch size 2 but input 'A' has 1"));
        let big = f32s(&[0.0; 9]);
        let bigb = i32s(&[0; 18]);
        assert!(err(vec![
            t("A", DataType::F32, &[9, 1], vec![&big]),
            t("B", DataType::I32, &[9, 2], vec![&bigb])
        ])
        .contains("above the model's max_batch_size 8"));
        // NaN allowed unless the policy forbids it
        assert!(check_request(&c, &InputPolicy::default(), ok(&nan, &b)).is_ok());
    }

    #[test]
    fn reshape_gives_the_engine_the_models_shape_and_clients_the_configs() {
        // a scalar input and output, as auto-complete writes them: dims [1], reshape []
        let c = ModelConfig::from_json(
            r#"{"max_batch_size": 0,
            "input": [{"name": "sr", "data_type": "TYPE_INT64", "dims": [1], "reshape": {}}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}]}"#,
        )
        .unwrap();
        assert_eq!(c.inputs[0].reshape, Some(vec![]));
        let sr = 16000i64.to_le_bytes();
        let r = check_request(
            &c,
            &InputPolicy::default(),
            vec![t("sr", DataType::I64, &[1], vec![&sr])],
        )
        .unwrap();
        let batch = assemble(&c, &[&r]).unwrap();
        assert_eq!(batch.tensors[0].shape, Vec::<i64>::new(), "the engine gets a rank-0 tensor");
        let parts = scatter_ranges(&c, &batch, "y", DataType::F32, &[], Bytes::Host(&[])).unwrap();
        assert_eq!(parts, vec![(vec![1], 0..4)], "the client gets dims [1] back");
        // batching: [batch, 1] on the wire, [batch] in the model
        let c = ModelConfig::from_json(
            r#"{"max_batch_size": 8,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1], "reshape": {}}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2, 2], "reshape": {"shape": [4]}}]}"#,
        )
        .unwrap();
        let (a, b) = (f32s(&[1.0]), f32s(&[2.0, 3.0]));
        let r1 = check_request(
            &c,
            &InputPolicy::default(),
            vec![t("x", DataType::F32, &[1, 1], vec![&a])],
        )
        .unwrap();
        let r2 = check_request(
            &c,
            &InputPolicy::default(),
            vec![t("x", DataType::F32, &[2, 1], vec![&b])],
        )
        .unwrap();
        let batch = assemble(&c, &[&r1, &r2]).unwrap();
        assert_eq!(batch.tensors[0].shape, vec![3]);
        let parts =
            scatter_ranges(&c, &batch, "y", DataType::F32, &[3, 4], Bytes::Host(&[])).unwrap();
        assert_eq!(parts, vec![(vec![1, 2, 2], 0..16), (vec![2, 2, 2], 16..48)]);
        assert!(ModelConfig::from_json(r#"{"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2], "reshape": {"shape": [3]}}]}"#).is_err());
    }

    #[test]
    fn valid_range_refuses_ids_past_the_vocabulary() {
        let c = ModelConfig::from_json(r#"{"max_batch_size": 4, "input": [{"name": "ids", "data_type": "TYPE_INT32", "dims": [3]}]}"#).unwrap();
        let p = InputPolicy {
            valid_range: parse_valid_range("ids:0:30521").unwrap(),
            ..Default::default()
        };
        let ok = i32s(&[0, 101, 30521]);
        check_request(&c, &p, vec![t("ids", DataType::I32, &[1, 3], vec![&ok])]).unwrap();
        let bad = i32s(&[5, 30522, 7]);
        let e =
            check_request(&c, &p, vec![t("ids", DataType::I32, &[1, 3], vec![&bad])]).unwrap_err();
        assert_eq!(
            e.message(),
            "input 'ids' holds 30522 at element 1, outside the model's valid range [0, 30521]"
        );
        let neg = i32s(&[-1, 0, 0]);
        assert!(check_request(&c, &p, vec![t("ids", DataType::I32, &[1, 3], vec![&neg])]).is_err());
        assert_eq!(
            parse_valid_range(" a:0:9 , b:-3:3").unwrap(),
            vec![("a".into(), 0, 9), ("b".into(), -3, 3)]
        );
        assert!(
            parse_valid_range("a:9:0").is_err()
                && parse_valid_range("a:x:1").is_err()
                && parse_valid_range(":0:1").is_err()
        );
    }

    #[test]
    fn shared_named_dims_must_agree() {
        let a = f32s(&[0.0; 16]);
        let b = f32s(&[0.0; 8]);
        let n: Vec<String> = vec!["batch".into(), "n".into()];
        let good =
            [t("X", DataType::F32, &[1, 16], vec![&a]), t("Y", DataType::F32, &[1, 16], vec![&a])];
        check_shared_dims(&good, &[("X", &n), ("Y", &n)]).unwrap();
        let bad =
            [t("X", DataType::F32, &[1, 16], vec![&a]), t("Y", DataType::F32, &[1, 8], vec![&b])];
        let e = check_shared_dims(&bad, &[("X", &n), ("Y", &n)]).unwrap_err();
        assert_eq!(e.message(), "inputs 'X' and 'Y' must agree on dimension 'n': 16 vs 8");
        // unnamed dims are free
        let free: Vec<String> = vec![String::new(), String::new()];
        check_shared_dims(&bad, &[("X", &free), ("Y", &free)]).unwrap();
        // ONNX Runtime's "?" is unnamed too, even when one input has several of them
        let q: Vec<String> = vec!["?".into(), "?".into()];
        check_shared_dims(&bad, &[("X", &q), ("Y", &q)]).unwrap();
        // a name repeated within one input (a square matrix) binds that input to itself
        let sq: Vec<String> = vec!["m".into(), "m".into()];
        let e = check_shared_dims(&bad, &[("X", &sq)]).unwrap_err();
        assert_eq!(
            e.message(),
            "input 'X' must have the same size in every dimension named 'm': 1 vs 16"
        );
    }

    #[test]
    fn device_inputs_need_a_device_engine() {
        let c = cfg(8);
        let b = i32s(&[1, 2]);
        let on_gpu = f32s(&[1.0, 2.0, 3.0]);
        let dev = RequestTensor {
            name: "A".into(),
            dtype: DataType::F32,
            shape: vec![1, 3],
            chunks: vec![Bytes::Device(DeviceView::simulated(0, &on_gpu))],
        };
        let e = check_request(
            &c,
            &InputPolicy::default(),
            vec![dev.clone(), t("B", DataType::I32, &[1, 2], vec![&b])],
        )
        .unwrap_err();
        assert!(e.message().contains("GPU memory"), "{e}");
        let p = InputPolicy { accepts_device_inputs: true, ..Default::default() };
        let r = check_request(&c, &p, vec![dev, t("B", DataType::I32, &[1, 2], vec![&b])]).unwrap();
        let batch = assemble(&c, &[&r]).unwrap();
        assert!(
            matches!(batch.tensors[0].data, BatchData::Borrowed(Bytes::Device(_))),
            "used in place"
        );
    }

    #[test]
    fn gpu_inputs_batch_together_as_device_parts() {
        let c = cfg(8);
        let p = InputPolicy { accepts_device_inputs: true, ..Default::default() };
        let b = i32s(&[1, 2]);
        let (g1, g2) = (f32s(&[1.0, 2.0, 3.0]), f32s(&[4.0, 5.0, 6.0]));
        let dev = |bytes| RequestTensor {
            name: "A".into(),
            dtype: DataType::F32,
            shape: vec![1, 3],
            chunks: vec![Bytes::Device(DeviceView::simulated(0, bytes))],
        };
        let r1 = check_request(&c, &p, vec![dev(&g1), t("B", DataType::I32, &[1, 2], vec![&b])])
            .unwrap();
        let r2 = check_request(&c, &p, vec![dev(&g2), t("B", DataType::I32, &[1, 2], vec![&b])])
            .unwrap();
        let a = f32s(&[1.0, 2.0, 3.0]);
        let host = check_request(
            &c,
            &p,
            vec![
                t("A", DataType::F32, &[1, 3], vec![&a]),
                t("B", DataType::I32, &[1, 2], vec![&b]),
            ],
        )
        .unwrap();
        let all = [&r1, &host, &r2];
        // GPU requests batch with each other, not with the host one
        assert_eq!(group_by_shape(&c, &all), vec![vec![0, 2], vec![1]]);
        let batch = assemble(&c, &[&r1, &r2]).unwrap();
        match &batch.tensors[0].data {
            BatchData::DeviceParts(parts) => {
                assert!(parts.iter().all(|v| v.device() == 0));
                assert_eq!(parts[0].simulated_bytes(), Some(&g1[..]));
                assert_eq!(parts[1].simulated_bytes(), Some(&g2[..]));
            }
            _ => panic!("expected device parts"),
        }
        assert!(
            matches!(batch.tensors[1].data, BatchData::Owned(_)),
            "the host input is concatenated as usual"
        );
        assert_eq!(batch.tensors[0].shape, vec![2, 3]);
    }

    #[test]
    fn assembles_groups_and_scatters() {
        let c = cfg(8);
        let p = InputPolicy::default();
        let a1 = f32s(&[1.0, 2.0, 3.0]);
        let a2 = f32s(&[4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
        let a2_lo = &a2[..12];
        let a2_hi = &a2[12..];
        let a3 = f32s(&[1.0, 2.0]);
        let b1 = i32s(&[1, 2]);
        let b2 = i32s(&[3, 4, 5, 6]);
        let b3 = i32s(&[7, 8]);
        let r1 = check_request(
            &c,
            &p,
            vec![
                t("A", DataType::F32, &[1, 3], vec![&a1]),
                t("B", DataType::I32, &[1, 2], vec![&b1]),
            ],
        )
        .unwrap();
        // r2's A arrives in two chunks
        let r2 = check_request(
            &c,
            &p,
            vec![
                t("B", DataType::I32, &[2, 2], vec![&b2]),
                t("A", DataType::F32, &[2, 3], vec![a2_lo, a2_hi]),
            ],
        )
        .unwrap();
        let r3 = check_request(
            &c,
            &p,
            vec![
                t("A", DataType::F32, &[1, 2], vec![&a3]),
                t("B", DataType::I32, &[1, 2], vec![&b3]),
            ],
        )
        .unwrap();
        let all = [&r1, &r2, &r3];
        let groups = group_by_shape(&c, &all);
        assert_eq!(groups, vec![vec![0, 1], vec![2]]);

        let g: Vec<&CheckedRequest> = groups[0].iter().map(|&i| all[i]).collect();
        let batch = assemble(&c, &g).unwrap();
        assert_eq!(batch.total_rows, 3);
        assert_eq!(batch.tensors[0].shape, vec![3, 3]);
        let mut want = a1.clone();
        want.extend(&a2);
        assert_eq!(batch.tensors[0].host_bytes().unwrap(), &want[..]);
        assert_eq!(batch.tensors[1].shape, vec![3, 2]);
        assert!(matches!(batch.tensors[0].data, BatchData::Owned(_)));

        // A single contiguous request is used in place.
        let single = assemble(&c, &[&r3]).unwrap();
        assert!(matches!(single.tensors[0].data, BatchData::Borrowed(_)));
        assert_eq!(single.tensors[0].host_bytes().unwrap().as_ptr(), a3.as_ptr());

        let parts =
            scatter_ranges(&c, &batch, "Y", DataType::F32, &[3, 5], Bytes::Host(&[])).unwrap();
        assert_eq!(parts, vec![(vec![1, 5], 0..20), (vec![2, 5], 20..60)]);
        let e =
            scatter_ranges(&c, &batch, "Y", DataType::F32, &[2, 5], Bytes::Host(&[])).unwrap_err();
        assert!(e.message().contains("'Y'"), "{e}");
    }

    #[test]
    fn strings_are_checked_batched_and_scattered_by_element() {
        use crate::tensor::encode_strings;
        let c = ModelConfig::from_json(
            r#"{"max_batch_size": 8,
            "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
            "output": [{"name": "label", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}]}"#,
        )
        .unwrap();
        let p = InputPolicy::default();
        let one = encode_strings(&["a"]).unwrap();
        let two = encode_strings(&["bb", "ccc"]).unwrap();
        let r1 =
            check_request(&c, &p, vec![t("text", DataType::Bytes, &[1, 1], vec![&one])]).unwrap();
        // a request's strings may arrive in pieces that split an element
        let r2 = check_request(
            &c,
            &p,
            vec![t("text", DataType::Bytes, &[2, 1], vec![&two[..5], &two[5..]])],
        )
        .unwrap();
        let batch = assemble(&c, &[&r1, &r2]).unwrap();
        let mut joined = one.clone();
        joined.extend(&two);
        assert_eq!(batch.tensors[0].host_bytes().unwrap(), &joined[..]);
        let out = encode_strings(&["x", "yy", "zzz"]).unwrap();
        let parts =
            scatter_ranges(&c, &batch, "label", DataType::Bytes, &[3], Bytes::Host(&out)).unwrap();
        assert_eq!(parts, vec![(vec![1, 1], 0..5), (vec![2, 1], 5..out.len())]);
        assert_eq!(decode_strings(&out[parts[1].1.clone()]).unwrap(), vec![&b"yy"[..], b"zzz"]);
        // malformed bodies: the input and the problem are named
        let err = |shape: &[i64], b: &[u8]| {
            check_request(&c, &p, vec![t("text", DataType::Bytes, shape, vec![b])])
                .unwrap_err()
                .to_string()
        };
        assert!(
            err(&[2, 1], &one).contains("input 'text' holds 1 strings but shape [2, 1] needs 2"),
            "{}",
            err(&[2, 1], &one)
        );
        let e = err(&[1, 1], &[9, 0, 0, 0, b'a']);
        assert!(
            e.contains(
                "input 'text' is malformed BYTES: element 0 says it has 9 bytes but only 1 remain"
            ),
            "{e}"
        );
        let e = err(&[1, 1], &[1, 0]);
        assert!(e.contains("input 'text' is malformed BYTES"), "{e}");
        // an engine whose string output does not match its shape is caught
        assert!(scatter_ranges(&c, &batch, "label", DataType::Bytes, &[3], Bytes::Host(&out[..6]))
            .is_err());
    }

    #[test]
    fn non_batching_model_runs_requests_alone() {
        let c = ModelConfig::from_json(
            r#"{"max_batch_size": 0, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [3]}], "output": []}"#,
        )
        .unwrap();
        let a = f32s(&[1.0, 2.0, 3.0]);
        let r1 =
            check_request(&c, &InputPolicy::default(), vec![t("A", DataType::F32, &[3], vec![&a])])
                .unwrap();
        let r2 =
            check_request(&c, &InputPolicy::default(), vec![t("A", DataType::F32, &[3], vec![&a])])
                .unwrap();
        assert_eq!(group_by_shape(&c, &[&r1, &r2]), vec![vec![0], vec![1]]);
        let batch = assemble(&c, &[&r1]).unwrap();
        assert_eq!(batch.tensors[0].shape, vec![3]);
        assert_eq!(
            scatter_ranges(&c, &batch, "Y", DataType::F32, &[3], Bytes::Host(&[])).unwrap(),
            vec![(vec![3], 0..12)]
        );
    }
}
