//! Device memory this crate owns: one type, [`DeviceMem`], freed on drop, and
//! [`DevicePtr`], its address borrowed for a launch or a copy. A `DevicePtr` borrows the
//! memory it points into, so the memory cannot be freed, regrown or dropped while a
//! launch or copy is being queued with it; work queued on a stream is waited for by the
//! owner before the memory goes (see each owner's `Drop`). The raw address leaves this
//! module only through [`DevicePtr::raw`], for the driver calls of the copy layer.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{result, CudaSlice, CudaStream, DevicePtr as _, DeviceRepr};

use crate::context::{copy_stream, cuda_err, gpu};
use crate::error::{CudaError, Result};
use crate::mem::{DeviceBuffer, DeviceView, DeviceViewMut, DriverMemory};

/// An address in device memory, valid while the borrow `'a` of its owner lasts. Passed to
/// kernels as the `u64` it holds.
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct DevicePtr<'a> {
    addr: u64,
    _owner: PhantomData<&'a ()>,
}

// SAFETY: a plain 64-bit device address, what the kernels take for a pointer argument.
unsafe impl DeviceRepr for DevicePtr<'_> {}

impl<'a> DevicePtr<'a> {
    /// The address `bytes` further on (inside the same allocation: the caller's sizes).
    pub(crate) fn at(self, bytes: usize) -> DevicePtr<'a> {
        DevicePtr { addr: self.addr + bytes as u64, _owner: PhantomData }
    }
    /// The address for a driver call, which must not outlive `'a`.
    pub(crate) fn raw(self) -> u64 {
        self.addr
    }
    /// The start of memory someone else owns, borrowed through `view`; an error for a
    /// simulated view.
    pub(crate) fn of_view(view: &'a DeviceView<'_>) -> Result<DevicePtr<'a>> {
        Self::of_addr(view.raw_addr())
    }
    /// As [`DevicePtr::of_view`], for writable memory.
    pub(crate) fn of_view_mut(view: &'a DeviceViewMut<'_>) -> Result<DevicePtr<'a>> {
        Self::of_addr(view.raw_addr())
    }
    fn of_addr(addr: Option<u64>) -> Result<DevicePtr<'a>> {
        addr.map(|addr| DevicePtr { addr, _owner: PhantomData })
            .ok_or_else(|| CudaError::internal("a simulated device buffer reached the CUDA driver"))
    }
}

/// Bytes of device memory this process owns.
pub struct DeviceMem {
    device: i32,
    backing: Backing,
}

enum Backing {
    /// cudarc's stream-ordered allocation, freed in `stream`'s order (memory handed to
    /// other code: a gathered batch, a staged input).
    Stream { stream: Arc<CudaStream>, slice: CudaSlice<u8> },
    /// A plain `cuMemAlloc` of `bytes` (0: none yet) that grows and is never shrunk: working
    /// memory several streams use in an order its owner sets with its own events, which
    /// cudarc's per-use event tracking must not add to.
    Plain { addr: u64, bytes: usize },
}

impl DeviceMem {
    /// `len` zeroed bytes (at least one) on `device`, allocated in the order of the calling
    /// thread's copy stream there; ready when this returns.
    pub fn zeroed(device: i32, len: usize) -> Result<DeviceMem> {
        let stream = copy_stream(device)?;
        let slice = stream.alloc_zeros::<u8>(len.max(1)).map_err(cuda_err)?;
        stream.synchronize().map_err(cuda_err)?;
        Ok(DeviceMem { device, backing: Backing::Stream { stream, slice } })
    }

    /// `len` bytes (at least one) on `device`, allocated in the order of the calling thread's
    /// copy stream there and not initialised: for a caller that queues copies filling every
    /// byte on that stream next, and waits for them before anyone reads the memory.
    pub(crate) fn for_copies(device: i32, len: usize) -> Result<DeviceMem> {
        let stream = copy_stream(device)?;
        // SAFETY: stream-ordered memory of plain bytes; the caller's contract above keeps
        // its uninitialised contents from being read.
        let slice = unsafe { stream.alloc::<u8>(len.max(1)) }.map_err(cuda_err)?;
        Ok(DeviceMem { device, backing: Backing::Stream { stream, slice } })
    }

    /// No memory yet on `device`; [`DeviceMem::reserve`] makes room.
    pub(crate) fn growing(device: i32) -> DeviceMem {
        DeviceMem { device, backing: Backing::Plain { addr: 0, bytes: 0 } }
    }

    /// Makes room for `bytes` (old contents are not kept). The owner must have waited for
    /// every queued use of the old memory first.
    pub(crate) fn reserve(&mut self, bytes: usize) -> Result<()> {
        if let Backing::Plain { bytes: have, .. } = self.backing {
            if bytes > have {
                self.release();
                let want = bytes.next_power_of_two().max(256);
                gpu(self.device)?;
                // SAFETY: a plain allocation in the bound context; freed in `release`.
                let addr = unsafe { result::malloc_sync(want) }.map_err(cuda_err)?;
                self.backing = Backing::Plain { addr, bytes: want };
            }
        } else if bytes > self.len() {
            return Err(CudaError::internal("a stream-ordered device buffer cannot grow"));
        }
        Ok(())
    }

    fn release(&mut self) {
        if let Backing::Plain { addr, bytes } = &mut self.backing {
            if *bytes > 0 && gpu(self.device).is_ok() {
                // SAFETY: our allocation, and nothing queued still uses it (`reserve`'s and
                // the owner's contract).
                let _ = unsafe { result::free_sync(*addr) };
            }
            (*addr, *bytes) = (0, 0);
        }
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        match &self.backing {
            Backing::Stream { slice, .. } => slice.len(),
            Backing::Plain { bytes, .. } => *bytes,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The start of the memory, borrowed for a launch or a copy (0 before any `reserve`).
    pub(crate) fn ptr(&self) -> DevicePtr<'_> {
        let addr = match &self.backing {
            Backing::Stream { stream, slice } => slice.device_ptr(stream).0,
            Backing::Plain { addr, .. } => *addr,
        };
        DevicePtr { addr, _owner: PhantomData }
    }

    /// The first `bytes` as a view; `None` past the end.
    pub fn view(&self, bytes: usize) -> Option<DeviceView<'_>> {
        // SAFETY: our allocation, alive while `self` is borrowed and written only through
        // `&mut self` or by work its owner waits for before handing out views.
        (bytes <= self.len())
            .then(|| unsafe { DeviceView::from_raw(self.device, self.ptr().raw(), bytes) })
    }

    /// All of it, writable, for as long as `self` is borrowed mutably.
    pub fn view_mut(&mut self) -> DeviceViewMut<'_> {
        // SAFETY: as for `view`, and `&mut self` makes the view the only access.
        unsafe { DeviceViewMut::from_raw(self.device, self.ptr().raw(), self.len()) }
    }

    /// Handed over as the vocabulary's owned buffer.
    pub fn into_buffer(self) -> DeviceBuffer {
        DeviceBuffer::from_driver(Box::new(self))
    }
}

impl DriverMemory for DeviceMem {
    fn device(&self) -> i32 {
        self.device
    }
    fn len(&self) -> usize {
        DeviceMem::len(self)
    }
    fn view(&self) -> DeviceView<'_> {
        DeviceMem::view(self, self.len()).expect("the whole buffer")
    }
    fn view_mut(&mut self) -> DeviceViewMut<'_> {
        DeviceMem::view_mut(self)
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        self.release();
    }
}
