//! Where bytes live, as types: the vocabulary every other crate uses for device memory.
//!
//! A device address never travels as a plain number. Memory someone else owns (a
//! request's buffer in Triton, an engine's output) is a [`DeviceView`] or
//! [`DeviceViewMut`] borrowed for a lifetime; memory we own is a [`DeviceBuffer`].
//! Making a view from a raw address is `unsafe` (the caller vouches for it); every
//! other operation is safe and bounds-checked. Views may also be *simulated*: host
//! bytes labelled with a device, which a fake device (tests) reads and the real
//! driver refuses, so the serving path is tested in-process without a GPU.

use std::marker::PhantomData;
use std::ops::Range;

use crate::error::{CudaError, Result};

/// Where a buffer lives, or where an instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Gpu(i32),
}

impl Device {
    pub fn is_host(self) -> bool {
        self == Device::Cpu
    }
}

#[derive(Debug, Clone, Copy)]
enum Backing<'a> {
    Raw(u64),
    Simulated(&'a [u8]),
}

/// Device memory owned elsewhere, readable for `'a`.
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a> {
    device: i32,
    len: usize,
    backing: Backing<'a>,
    _life: PhantomData<&'a [u8]>,
}

impl<'a> DeviceView<'a> {
    /// # Safety
    /// `addr .. addr + len` must be memory on GPU `device`, allocated and not freed for
    /// all of `'a`, and not written by anyone else while the view is read.
    pub unsafe fn from_raw(device: i32, addr: u64, len: usize) -> DeviceView<'a> {
        DeviceView { device, len, backing: Backing::Raw(addr), _life: PhantomData }
    }

    /// Host bytes standing in for memory on `device` (a fake device in tests).
    pub fn simulated(device: i32, bytes: &'a [u8]) -> DeviceView<'a> {
        DeviceView {
            device,
            len: bytes.len(),
            backing: Backing::Simulated(bytes),
            _life: PhantomData,
        }
    }

    pub fn device(&self) -> i32 {
        self.device
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A part of this view; `None` when the range is outside it.
    pub fn slice(&self, range: Range<usize>) -> Option<DeviceView<'a>> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let backing = match self.backing {
            Backing::Raw(a) => Backing::Raw(a + range.start as u64),
            Backing::Simulated(b) => Backing::Simulated(&b[range.clone()]),
        };
        Some(DeviceView { device: self.device, len: range.len(), backing, _life: PhantomData })
    }

    /// The device address, for handing to a library that takes one (an FFI call, which
    /// is `unsafe` at the call site). `None` for a simulated view.
    pub fn raw_addr(&self) -> Option<u64> {
        match self.backing {
            Backing::Raw(a) => Some(a),
            Backing::Simulated(_) => None,
        }
    }

    /// The host bytes behind a simulated view (`None` for real device memory).
    pub fn simulated_bytes(&self) -> Option<&'a [u8]> {
        match self.backing {
            Backing::Simulated(b) => Some(b),
            Backing::Raw(_) => None,
        }
    }
}

#[derive(Debug)]
enum BackingMut<'a> {
    Raw(u64),
    Simulated(&'a mut [u8]),
}

/// Device memory owned elsewhere, writable for `'a` (e.g. a response buffer).
#[derive(Debug)]
pub struct DeviceViewMut<'a> {
    device: i32,
    len: usize,
    backing: BackingMut<'a>,
    _life: PhantomData<&'a mut [u8]>,
}

impl<'a> DeviceViewMut<'a> {
    /// # Safety
    /// `addr .. addr + len` must be memory on GPU `device`, allocated for all of `'a`,
    /// and neither read nor written by anyone else while the view lives.
    pub unsafe fn from_raw(device: i32, addr: u64, len: usize) -> DeviceViewMut<'a> {
        DeviceViewMut { device, len, backing: BackingMut::Raw(addr), _life: PhantomData }
    }

    /// Host bytes standing in for writable memory on `device` (a fake device in tests).
    pub fn simulated(device: i32, bytes: &'a mut [u8]) -> DeviceViewMut<'a> {
        DeviceViewMut {
            device,
            len: bytes.len(),
            backing: BackingMut::Simulated(bytes),
            _life: PhantomData,
        }
    }

    pub fn device(&self) -> i32 {
        self.device
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn raw_addr(&self) -> Option<u64> {
        match self.backing {
            BackingMut::Raw(a) => Some(a),
            BackingMut::Simulated(_) => None,
        }
    }
    pub fn simulated_bytes(&mut self) -> Option<&mut [u8]> {
        match &mut self.backing {
            BackingMut::Simulated(b) => Some(b),
            BackingMut::Raw(_) => None,
        }
    }

    /// Two views, of `..mid` and `mid..` (`mid` clamped to the length).
    pub fn split_at(self, mid: usize) -> (DeviceViewMut<'a>, DeviceViewMut<'a>) {
        let (device, mid) = (self.device, mid.min(self.len));
        let (a, b) = match self.backing {
            BackingMut::Raw(addr) => (BackingMut::Raw(addr), BackingMut::Raw(addr + mid as u64)),
            BackingMut::Simulated(bytes) => {
                let (x, y) = bytes.split_at_mut(mid);
                (BackingMut::Simulated(x), BackingMut::Simulated(y))
            }
        };
        let view = |len, backing| DeviceViewMut { device, len, backing, _life: PhantomData };
        (view(mid, a), view(self.len - mid, b))
    }

    /// The same memory, now only to be read (for the rest of `'a`).
    pub fn into_view(self) -> DeviceView<'a> {
        let backing = match self.backing {
            BackingMut::Raw(a) => Backing::Raw(a),
            BackingMut::Simulated(b) => Backing::Simulated(b),
        };
        DeviceView { device: self.device, len: self.len, backing, _life: PhantomData }
    }
}

/// Bytes to read, on whichever side they are.
#[derive(Debug, Clone, Copy)]
pub enum Bytes<'a> {
    Host(&'a [u8]),
    Device(DeviceView<'a>),
}

impl<'a> Bytes<'a> {
    pub fn len(&self) -> usize {
        match self {
            Bytes::Host(b) => b.len(),
            Bytes::Device(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn device(&self) -> Device {
        match self {
            Bytes::Host(_) => Device::Cpu,
            Bytes::Device(v) => Device::Gpu(v.device()),
        }
    }
    /// A part of these bytes; `None` when the range is outside them.
    pub fn slice(&self, range: Range<usize>) -> Option<Bytes<'a>> {
        match self {
            Bytes::Host(b) => b.get(range).map(Bytes::Host),
            Bytes::Device(v) => v.slice(range).map(Bytes::Device),
        }
    }
    pub fn host(&self) -> Option<&'a [u8]> {
        match self {
            Bytes::Host(b) => Some(b),
            Bytes::Device(_) => None,
        }
    }
}

/// Bytes to write, on whichever side they are.
#[derive(Debug)]
pub enum BytesMut<'a> {
    Host(&'a mut [u8]),
    Device(DeviceViewMut<'a>),
}

impl BytesMut<'_> {
    pub fn len(&self) -> usize {
        match self {
            BytesMut::Host(b) => b.len(),
            BytesMut::Device(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn device(&self) -> Device {
        match self {
            BytesMut::Host(_) => Device::Cpu,
            BytesMut::Device(v) => Device::Gpu(v.device()),
        }
    }
}

/// Device memory a driver allocated for a [`DeviceBuffer`] (the driver layer's owned
/// buffer implements it), freed when dropped.
pub(crate) trait DriverMemory: Send + Sync {
    fn device(&self) -> i32;
    fn len(&self) -> usize;
    fn view(&self) -> DeviceView<'_>;
    fn view_mut(&mut self) -> DeviceViewMut<'_>;
}

/// Device memory this process owns (freed on drop).
pub struct DeviceBuffer {
    inner: Owned,
}

enum Owned {
    Driver(Box<dyn DriverMemory>),
    Simulated { device: i32, bytes: Vec<u8> },
}

impl DeviceBuffer {
    #[cfg_attr(not(feature = "driver"), allow(dead_code))]
    pub(crate) fn from_driver(memory: Box<dyn DriverMemory>) -> DeviceBuffer {
        DeviceBuffer { inner: Owned::Driver(memory) }
    }

    /// Host bytes standing in for a buffer on `device` (a fake device in tests).
    pub fn simulated(device: i32, bytes: Vec<u8>) -> DeviceBuffer {
        DeviceBuffer { inner: Owned::Simulated { device, bytes } }
    }

    pub fn device(&self) -> i32 {
        match &self.inner {
            Owned::Driver(m) => m.device(),
            Owned::Simulated { device, .. } => *device,
        }
    }

    pub fn len(&self) -> usize {
        match &self.inner {
            Owned::Driver(m) => m.len(),
            Owned::Simulated { bytes, .. } => bytes.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn view(&self) -> DeviceView<'_> {
        match &self.inner {
            Owned::Driver(m) => m.view(),
            Owned::Simulated { device, bytes } => DeviceView::simulated(*device, bytes),
        }
    }

    pub fn view_mut(&mut self) -> DeviceViewMut<'_> {
        match &mut self.inner {
            Owned::Driver(m) => m.view_mut(),
            Owned::Simulated { device, bytes } => DeviceViewMut::simulated(*device, bytes),
        }
    }
}

/// The operations the serving path needs on device memory. The real one is
/// [`crate::Cuda`] (feature `driver`); tests use a fake that handles simulated views.
pub trait DeviceOps: Send + Sync {
    /// A new buffer of `bytes` on `device` (zeroed).
    fn alloc(&self, device: i32, bytes: usize) -> Result<DeviceBuffer>;
    /// Copies `src` into `dst` (equal lengths), whichever side each is on.
    fn copy(&self, src: Bytes<'_>, dst: BytesMut<'_>) -> Result<()>;
    /// As [`DeviceOps::copy`], but a copy between buffers of one GPU may only be queued:
    /// it is complete once this thread's next [`DeviceOps::finish_copies`] returns, and
    /// until then neither buffer may be reused, written or read. Several responses'
    /// outputs so cost one launch and one wait instead of one each.
    fn copy_queued(&self, src: Bytes<'_>, dst: BytesMut<'_>) -> Result<()> {
        self.copy(src, dst)
    }
    /// Makes and waits for every copy this thread queued with [`DeviceOps::copy_queued`].
    fn finish_copies(&self) -> Result<()> {
        Ok(())
    }
    /// Forgets, unmade, the copies this thread queued and did not finish (a run that
    /// unwound between the two): their buffers may be gone.
    fn discard_queued(&self) {}
    /// Gathers device buffers, in order, into one new buffer on `device`; parts may lie
    /// on other GPUs.
    fn gather(&self, device: i32, parts: &[DeviceView<'_>]) -> Result<DeviceBuffer>;
}

/// Copies host to host; the part of `copy` every implementation shares.
pub fn copy_host(src: &[u8], dst: &mut [u8]) -> Result<()> {
    if src.len() != dst.len() {
        return Err(CudaError::internal(format!(
            "copy of {} bytes into a buffer of {}",
            src.len(),
            dst.len()
        )));
    }
    dst.copy_from_slice(src);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_view_splits_into_disjoint_parts_and_becomes_readable() {
        let mut bytes: Vec<u8> = (0..10).collect();
        let (mut a, b) = DeviceViewMut::simulated(3, &mut bytes).split_at(4);
        assert_eq!((a.len(), b.len(), b.device()), (4, 6, 3));
        a.simulated_bytes().unwrap()[0] = 99;
        let (b, c) = b.split_at(100);
        assert_eq!((b.len(), c.len()), (6, 0), "mid past the end is the end");
        assert_eq!(b.into_view().simulated_bytes().unwrap(), &[4, 5, 6, 7, 8, 9]);
        assert_eq!(a.into_view().simulated_bytes().unwrap(), &[99, 1, 2, 3]);
        // SAFETY: an address nobody dereferences; only the arithmetic is checked
        let raw = unsafe { DeviceViewMut::from_raw(0, 0x1000, 64) };
        let (x, y) = raw.split_at(16);
        assert_eq!((x.raw_addr(), y.raw_addr(), y.len()), (Some(0x1000), Some(0x1010), 48));
        assert_eq!(y.into_view().raw_addr(), Some(0x1010));
    }
}
