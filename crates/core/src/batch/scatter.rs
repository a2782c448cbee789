//! The reverse of assembly: which bytes of a batch's output belong to which request, and the
//! shape each client gets back.

use std::ops::Range;

use super::Batch;
use crate::config::{resolve_shape, ModelConfig};
use crate::error::{Error, Result};
use crate::tensor::{decode_strings, element_count, Bytes, DataType};

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
