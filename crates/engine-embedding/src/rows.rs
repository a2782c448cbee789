//! Where a lookup's rows land (`RowSink`: host memory, or a GPU instance's device buffer) and a
//! request's bytes read as keys, counts and vectors.

use triton_rust_core::batch::RequestTensor;
use triton_rust_core::engine::Device;
use triton_rust_core::error::{Error, Result};
use triton_rust_core::tensor::Bytes;
#[cfg(feature = "gpu")]
pub(crate) use triton_rust_embedding::gpu::DeviceRows;
use triton_rust_embedding::InstanceCaches;

/// Without the GPU cache there are no device rows.
#[cfg(not(feature = "gpu"))]
pub(crate) type DeviceRows = std::convert::Infallible;

/// Where a lookup's rows land, one sink for every interface: a host buffer, or on a
/// GPU instance the device buffer the response is copied from (grown as batches grow).
pub(crate) enum RowSink<'r> {
    Host(Vec<f32>),
    #[cfg(feature = "gpu")]
    Device(&'r mut DeviceRows),
    #[cfg(not(feature = "gpu"))]
    #[allow(dead_code)]
    Never(std::marker::PhantomData<&'r ()>),
}

impl<'r> RowSink<'r> {
    /// A sink of `total` floats for an instance on `device`.
    #[cfg_attr(not(feature = "gpu"), allow(unused_variables))]
    pub(crate) fn new(
        slot: &'r mut Option<DeviceRows>,
        device: Device,
        total: usize,
    ) -> Result<RowSink<'r>> {
        match device {
            Device::Cpu => Ok(RowSink::Host(vec![0f32; total])),
            #[cfg(feature = "gpu")]
            Device::Gpu(id) => {
                if slot.as_ref().is_none_or(|r| r.len() < total) {
                    *slot = None; // free the old buffer before allocating the new one
                    *slot = Some(DeviceRows::new(id, total.max(1))?);
                }
                Ok(RowSink::Device(slot.as_mut().expect("allocated above")))
            }
            #[cfg(not(feature = "gpu"))]
            Device::Gpu(_) => Err(Error::unsupported(
                "this build of the embedding engine has no GPU cache (feature `gpu`)",
            )),
        }
    }

    /// Looks one table's `keys` up: row i lands at `offset + i * stride` floats.
    pub(crate) fn put(
        &mut self,
        caches: &InstanceCaches,
        table: usize,
        keys: &[i64],
        offset: usize,
        stride: usize,
    ) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let dim = caches.store().dim(table);
        match self {
            RowSink::Host(out) if stride == dim => {
                caches.lookup(table, keys, &mut out[offset..offset + keys.len() * dim])
            }
            RowSink::Host(out) => {
                let mut rows = vec![0f32; keys.len() * dim];
                caches.lookup(table, keys, &mut rows)?;
                for (i, row) in rows.chunks_exact(dim).enumerate() {
                    out[offset + i * stride..offset + i * stride + dim].copy_from_slice(row);
                }
                Ok(())
            }
            #[cfg(feature = "gpu")]
            RowSink::Device(rows) => caches.lookup_device(table, keys, rows, offset, stride),
            #[cfg(not(feature = "gpu"))]
            RowSink::Never(_) => unreachable!(),
        }
    }

    /// The first `floats` floats, wherever they are.
    pub(crate) fn bytes(&self, floats: usize) -> Result<Bytes<'_>> {
        match self {
            RowSink::Host(out) => Ok(Bytes::Host(bytemuck::cast_slice(&out[..floats]))),
            #[cfg(feature = "gpu")]
            RowSink::Device(rows) => rows
                .view(floats)
                .map(Bytes::Device)
                .ok_or_else(|| Error::internal("device rows buffer is too small")),
            #[cfg(not(feature = "gpu"))]
            RowSink::Never(_) => unreachable!(),
        }
    }
}

/// Decodes a request tensor's host bytes into values, straight from the server's buffer
/// when it is one piece (device pieces never reach this engine: it takes no GPU inputs).
pub(crate) fn from_chunks<T, const N: usize>(
    t: &RequestTensor<'_>,
    decode: fn([u8; N]) -> T,
) -> Vec<T> {
    let bytes = t.host_bytes().unwrap_or_default();
    bytes.chunks_exact(N).map(|c| decode(c.try_into().expect("N bytes"))).collect()
}

pub(crate) fn as_i64(bytes: &[u8]) -> std::borrow::Cow<'_, [i64]> {
    match bytemuck::try_cast_slice::<u8, i64>(bytes) {
        // in place when aligned (always on a little-endian host: the bytes are LE)
        Ok(keys) if cfg!(target_endian = "little") => std::borrow::Cow::Borrowed(keys),
        _ => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
    }
}
pub(crate) fn as_i32(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}
pub(crate) fn as_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}
