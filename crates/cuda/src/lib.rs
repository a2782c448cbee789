//! The CUDA room: the only crate that holds device addresses. Its files form one-way
//! layers, each importing only from the layers below it (checked by
//! `scripts/check_architecture.py`):
//!
//! 1. vocabulary, no CUDA needed: [`error`] ([`CudaError`] with the driver's code,
//!    [`sticky_error_in`] for runtimes that give only text), [`fault`] (the GPUs whose
//!    context a sticky error broke, the process's state) and [`mem`] ([`Device`], borrowed
//!    views [`DeviceView`]/[`DeviceViewMut`], owned [`DeviceBuffer`]s, [`Bytes`]/[`BytesMut`],
//!    the [`DeviceOps`] trait the serving path copies through);
//! 2. contexts and streams (feature `driver`, cudarc with libcuda and NVRTC loaded at run
//!    time): `context` (one registry per device; views of memory others own, checked
//!    against the driver) and `kernels` (the cache's CUDA C, compiled once per device);
//! 3. buffers: `buffer` (`DeviceMem`, the one owned device buffer, and `DevicePtr`, its
//!    address borrowed for a launch or copy) and `pinned` (page-locked host memory);
//! 4. copies: `copy` ([`Cuda`], the queue, the driver's copy calls) and [`upload`];
//! 5. the GPU embedding cache: [`cache`].
//!
//! Every function that takes a raw address is `unsafe fn`; everything else is safe.

pub mod error;
pub mod fault;
pub mod mem;
pub use error::{sticky_error_in, CudaError, Result};
pub use mem::{
    copy_host, Bytes, BytesMut, Device, DeviceBuffer, DeviceOps, DeviceView, DeviceViewMut,
};

#[cfg(feature = "driver")]
mod buffer;
#[cfg(feature = "driver")]
pub mod cache;
#[cfg(feature = "driver")]
mod context;
#[cfg(feature = "driver")]
mod copy;
#[cfg(feature = "driver")]
mod kernels;
#[cfg(feature = "driver")]
mod pinned;
#[cfg(feature = "driver")]
pub mod upload;

#[cfg(feature = "driver")]
pub use buffer::DeviceMem;
#[cfg(feature = "driver")]
pub use context::{
    enable_peer_access, free_memory, gpu, gpu_count, view_in, view_mut_in, GpuState,
};
#[cfg(feature = "driver")]
pub use copy::{alloc, Cuda, HostReader};
#[cfg(feature = "driver")]
pub use pinned::HostRows;
