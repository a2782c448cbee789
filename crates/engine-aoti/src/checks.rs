//! What a request is checked against: the sizes and values a package was exported for.

use triton_rust_core::batch::RequestTensor;
use triton_rust_core::config::{ModelConfig, TensorSpec};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::tensor::DataType;

use crate::package::{DimBounds, Package};

/// Under batching, every input's first dimension must be the package's dynamic batch, and
/// reach `max_batch_size`: a package exported with a static batch (no metadata says so, its
/// wrapper does) would fail every merged batch, and one exported for smaller batches than
/// the config asks would be run past its export.
pub(crate) fn check_batch_dims(
    cfg: &ModelConfig,
    package: &Package,
    in_pos: &[usize],
    inputs: &[TensorSpec],
) -> Result<()> {
    for (j, &p) in in_pos.iter().enumerate() {
        let Some(b) = package.dims.get(&(p, 0)) else { continue };
        let name = &inputs[j].name;
        if let Some(fixed) = b.fixed {
            return Err(Error::invalid_arg(format!(
                "max_batch_size {} asks for batching, but the package's input '{name}' was exported with a fixed first dimension of {fixed}: export it with a dynamic batch dimension (torch.export.Dim(\"batch\", max=N) on dimension 0 of every input; docs/pytorch2.md), or serve it with max_batch_size: 0",
                cfg.max_batch_size
            )));
        }
        if let Some(max) = b.max.filter(|&m| m < cfg.max_batch_size) {
            return Err(Error::invalid_arg(format!(
                "max_batch_size {} is larger than the batch the package's input '{name}' was exported for (at most {max}): set max_batch_size to at most {max}, or export with torch.export.Dim(\"batch\", max={})",
                cfg.max_batch_size, cfg.max_batch_size
            )));
        }
    }
    Ok(())
}

/// Every dimension of a request's input within the sizes the package was exported for:
/// past them the compiled code indexes out of bounds (a sequence longer than BERT's
/// position table), which on a CPU ends the process and on a GPU trips a device-side
/// assertion that poisons the GPU's context. `dims`: (input, dimension of the request's
/// shape, bounds); the batch dimension of a batching model is held by `max_batch_size`.
pub(crate) fn check_dims(
    dims: &[(String, usize, DimBounds)],
    inputs: &[RequestTensor<'_>],
) -> Result<()> {
    for (name, d, bounds) in dims {
        let Some(t) = inputs.iter().find(|t| t.name == *name) else { continue };
        let Some(&size) = t.shape.get(*d) else { continue };
        if !bounds.admits(size) {
            return Err(Error::invalid_arg(format!(
                "input '{name}' has size {size} in dimension {d} (shape {:?}), and the package was exported for {} there",
                t.shape,
                bounds.describe()
            )));
        }
    }
    Ok(())
}

/// The first element of integer `bytes` (little-endian `dtype`) outside `[lo, hi)`: its
/// index and value.
pub(crate) fn first_outside(
    dtype: DataType,
    bytes: &[u8],
    (lo, hi): (i64, i64),
) -> Option<(usize, i64)> {
    let size = dtype.size()?;
    let value = |c: &[u8]| -> Option<i64> {
        Some(match dtype {
            DataType::I8 => c[0] as i8 as i64,
            DataType::U8 => c[0] as i64,
            DataType::I16 => i16::from_le_bytes([c[0], c[1]]) as i64,
            DataType::I32 => i32::from_le_bytes(c.try_into().ok()?) as i64,
            DataType::I64 => i64::from_le_bytes(c.try_into().ok()?),
            _ => return None,
        })
    };
    bytes.chunks_exact(size).enumerate().find_map(|(i, c)| {
        let v = value(c)?;
        (v < lo || v >= hi).then_some((i, v))
    })
}

/// Inputs that index an embedding table hold only values it has rows for: an index past
/// the table fails inside the package's compiled kernel, and in a CPU package that check
/// throws inside an OpenMP region, which ends the process. Checked per request (the rest
/// of its batch is still answered) where the request holds the input in host memory; one
/// in GPU memory is not read back to be checked.
/// `ranges`: the range of each input, by name; inputs the request lacks (a recommender's
/// network gets its embeddings from the lookup, not the request) are not checked.
pub(crate) fn check_ranges(
    ranges: &[(String, (i64, i64))],
    inputs: &[RequestTensor<'_>],
) -> Result<()> {
    for (name, range) in ranges {
        let range = *range;
        let Some(t) = inputs.iter().find(|t| t.name == *name) else { continue };
        let Some(bytes) = t.host_bytes() else { continue };
        if let Some((i, v)) = first_outside(t.dtype, &bytes, range) {
            return Err(Error::invalid_arg(format!(
                "input '{}' holds {v} at element {i}, outside [{}, {}): the model looks it up in a table of {} rows",
                t.name,
                range.0,
                range.1,
                range.1 - range.0
            )));
        }
    }
    Ok(())
}
