//! The CUDA room: the only crate that holds device addresses.
//!
//! - [`mem`]: the vocabulary other crates use — [`Device`], borrowed views
//!   ([`DeviceView`], [`DeviceViewMut`]), owned [`DeviceBuffer`]s, [`Bytes`]/[`BytesMut`]
//!   ("where bytes live") and the [`DeviceOps`] trait the serving path copies through.
//!   It needs no CUDA and builds everywhere.
//! - feature `driver`: the real thing through cudarc (libcuda and NVRTC loaded at run
//!   time, so nothing is linked): one registry of contexts and streams per device
//!   ([`driver`]), [`Cuda`] implementing `DeviceOps`, and the GPU embedding cache's
//!   kernels ([`cache`]).
//!
//! Every function that takes a raw address is `unsafe fn`; everything else is safe.

use std::fmt;

pub mod mem;
pub use mem::{
    copy_host, Bytes, BytesMut, Device, DeviceBuffer, DeviceOps, DeviceView, DeviceViewMut,
};

#[cfg(feature = "driver")]
pub mod cache;
#[cfg(feature = "driver")]
pub mod driver;
#[cfg(feature = "driver")]
pub use driver::{view_in, view_mut_in, Cuda};
#[cfg(feature = "driver")]
pub mod upload;

/// A CUDA failure, or CUDA not being there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    /// The driver or NVRTC library could not be loaded (no GPU machine).
    pub unavailable: bool,
    pub message: String,
}

impl CudaError {
    pub fn internal(message: impl Into<String>) -> CudaError {
        CudaError { unavailable: false, message: message.into() }
    }
    pub fn unavailable(message: impl Into<String>) -> CudaError {
        CudaError { unavailable: true, message: message.into() }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CudaError {}

pub type Result<T> = std::result::Result<T, CudaError>;
