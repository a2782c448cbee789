//! Copies: a [`Queue`] (a stream of this crate's GPU work), the queued copies the layers
//! above use (each a borrow of the memory it touches), and [`Cuda`], the [`DeviceOps`] the
//! serving path copies and gathers through on a GPU machine. The only file that hands a
//! device address to the driver's copy and fill calls.

use std::sync::Arc;

use cudarc::driver::{result, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::buffer::{DeviceMem, DevicePtr};
use crate::context::{copy_stream, cuda_err, gpu, state, GpuState};
use crate::error::{CudaError, Result};
use crate::kernels;
use crate::mem::{copy_host, Bytes, BytesMut, DeviceBuffer, DeviceOps, DeviceView};
use crate::pinned::PinnedBuf;

/// The GPU work queue of a set of caches (one instance's, or shared by the instances that
/// share those caches): their lookups, fills and refreshes all go through it, in order, so
/// an insert never overlaps a lookup of the same slots.
#[derive(Clone)]
pub struct Queue {
    pub(crate) device: i32,
    pub(crate) stream: Arc<CudaStream>,
}

impl Queue {
    /// A new stream on `device` of its highest priority (see `GpuState::new_urgent_stream`),
    /// whose cache kernels are compiled first.
    pub fn new(device: i32) -> Result<Queue> {
        let (g, _) = kernels::device(device)?;
        Ok(Queue { device, stream: g.new_urgent_stream()? })
    }

    /// Another stream of the same device and priority.
    pub(crate) fn another(&self) -> Result<Queue> {
        self.another_at(true)
    }

    /// Another stream of the same device: of its highest priority (`urgent`), or of its
    /// least (a network's, or below one whose stream asks more), whose kernels' blocks go to
    /// SMs only when no block of a stream above waits for one.
    pub(crate) fn another_at(&self, urgent: bool) -> Result<Queue> {
        let (g, _) = kernels::device(self.device)?;
        let stream = if urgent { g.new_urgent_stream()? } else { g.new_stream()? };
        Ok(Queue { device: self.device, stream })
    }
    pub fn device(&self) -> i32 {
        self.device
    }
    /// Waits for everything queued so far.
    pub(crate) fn wait(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err)
    }
}

/// Queues a copy of host `src` to `dst` on `stream`.
///
/// # Safety
/// `dst` has room for `src`; `src` is page-locked (or the copy is waited for before this
/// returns' caller lets go of it) and is not written before `stream` has passed the copy.
pub(crate) unsafe fn htod_on<T: Copy>(
    stream: &CudaStream,
    dst: DevicePtr<'_>,
    src: &[T],
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_htod_async(dst.raw(), src, stream.cu_stream()) }.map_err(cuda_err)
}

/// [`htod_on`] on `queue`. The same contract: callers reach the queue's next
/// synchronisation before touching `src` again, and `dst` has room for it.
pub(crate) fn htod<T: Copy>(queue: &Queue, dst: DevicePtr<'_>, src: &[T]) -> Result<()> {
    // SAFETY (callers): `dst` has room for `src`; `src` is page-locked and outlives the
    // queue's next synchronisation, which every caller reaches before touching it again.
    unsafe { htod_on(&queue.stream, dst, src) }
}

/// Queues a copy of `dst.len()` elements at `src` to host `dst`. Callers read `dst` only
/// after the queue is synchronised, and `src` holds that many elements.
pub(crate) fn dtoh<T: Copy>(queue: &Queue, dst: &mut [T], src: DevicePtr<'_>) -> Result<()> {
    // SAFETY (callers): `src` holds `dst.len()` elements; `dst` is page-locked and is
    // read only after the queue is synchronised.
    unsafe { result::memcpy_dtoh_async(dst, src.raw(), queue.stream.cu_stream()) }.map_err(cuda_err)
}

/// Queues a copy of `bytes` from `src` to `dst` on `stream`; both hold that many.
pub(crate) fn dtod_on(
    stream: &CudaStream,
    dst: DevicePtr<'_>,
    src: DevicePtr<'_>,
    bytes: usize,
) -> Result<()> {
    dtod_raw(stream, dst.raw(), src.raw(), bytes)
}

/// [`dtod_on`] between raw addresses (callers: both ranges are live device memory of
/// `bytes` on the stream's device).
fn dtod_raw(stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    // SAFETY (callers): both ranges are live device memory of `bytes` on this stream's device.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }.map_err(cuda_err)
}

/// Queues zeroing `bytes` at `dst` (which holds them) on `queue`.
pub(crate) fn zero(queue: &Queue, dst: DevicePtr<'_>, bytes: usize) -> Result<()> {
    // SAFETY (callers): `dst` holds at least `bytes`.
    unsafe { result::memset_d8_async(dst.raw(), 0, bytes, queue.stream.cu_stream()) }
        .map_err(cuda_err)
}

/// Copies `host` to `dst` now (a synchronous copy; `dst` holds as many).
pub(crate) fn htod_now<T: Copy>(device: i32, dst: DevicePtr<'_>, host: &[T]) -> Result<()> {
    gpu(device)?;
    // SAFETY (callers): `dst` has room for `host`; a synchronous copy.
    unsafe { result::memcpy_htod_sync(dst.raw(), host) }.map_err(cuda_err)
}

// Every copy below is complete when it returns. The driver's "synchronous" cuMemcpyDtoD
// and cuMemcpyHtoD (from pageable memory) may return before the data has landed, and our
// streams do not wait on the legacy default stream, so a buffer reused by the next
// execution could be overwritten while still being read: those two are queued on the
// calling thread's copy stream and waited for. cuMemcpyDtoH into pageable memory does return
// only once done, and is kept.

/// Copies `len` bytes between device memory on `device` (not overlapping); done when it returns.
fn copy_dtod(device: i32, dst: DevicePtr<'_>, src: DevicePtr<'_>, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let stream = copy_stream(device)?;
    dtod_on(&stream, dst, src, len)?;
    stream.synchronize().map_err(cuda_err)
}

/// Queues on `stream` (of GPU `to`) a copy of part `p` (not empty) from GPU `src_device`'s
/// memory: over NVLink or PCIe where the two GPUs can reach each other, staged by the
/// driver where they cannot. Both ranges are live memory of `p.len` bytes (the callers').
fn peer_on(stream: &CudaStream, to: &GpuState, src_device: i32, p: Part) -> Result<()> {
    use cudarc::driver::sys::{cuMemcpyPeerAsync, CUresult};
    let from = state(src_device)?;
    // SAFETY: the contexts are the two devices' primary ones, alive in the registry; the
    // ranges are the callers'.
    let r = unsafe {
        cuMemcpyPeerAsync(
            p.dst,
            to.ctx.cu_ctx(),
            p.src,
            from.ctx.cu_ctx(),
            p.len as usize,
            stream.cu_stream(),
        )
    };
    match r {
        CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(CudaError::driver(
            e as i32,
            format!(
                "CUDA: copy of {} bytes from GPU {src_device} to GPU {}: {e:?}",
                p.len,
                to.ctx.ordinal()
            ),
        )),
    }
}

/// Copies `len` bytes from GPU `src_device`'s memory at `src` to GPU `dst_device`'s at
/// `dst`; done when it returns.
fn copy_peer(
    dst_device: i32,
    dst: DevicePtr<'_>,
    src_device: i32,
    src: DevicePtr<'_>,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let stream = copy_stream(dst_device)?;
    peer_on(
        &stream,
        &*state(dst_device)?,
        src_device,
        Part { src: src.raw(), dst: dst.raw(), len: len as u64 },
    )?;
    stream.synchronize().map_err(cuda_err)
}

/// Copies device memory at `src` (holding `dst.len()` bytes) into host memory; done when it returns.
fn copy_dtoh(device: i32, dst: &mut [u8], src: DevicePtr<'_>) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    gpu(device)?;
    // SAFETY: `src` holds `dst.len()` bytes on `device` (the caller's lengths).
    unsafe { result::memcpy_dtoh_sync(dst, src.raw()) }.map_err(cuda_err)
}

/// Copies host bytes to device memory at `dst` (room for them); done when it returns.
fn copy_htod(device: i32, dst: DevicePtr<'_>, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    let stream = copy_stream(device)?;
    // SAFETY: `dst` has room for `src` (the caller's lengths); `src` outlives the wait below.
    unsafe { htod_on(&stream, dst, src) }?;
    stream.synchronize().map_err(cuda_err)
}

/// Device bytes read to the host into page-locked memory its owner keeps, on a stream of its
/// own. A fresh host allocation for every batch pays its page faults, and a synchronous copy
/// into pageable memory is staged by the driver: the pooled lookup's 5.5 MB of DLRM-v2 keys
/// took 10 ms a batch that way (`bench/gpu/results/dlrm-v2/timing/cache10.console.log`).
pub struct HostReader {
    queue: Queue,
    buf: PinnedBuf<u8>,
}

impl HostReader {
    /// A reader whose stream is on `device` (the view it reads may be on any GPU).
    pub fn new(device: i32) -> Result<HostReader> {
        let g = gpu(device)?;
        Ok(HostReader {
            queue: Queue { device, stream: g.new_stream()? },
            buf: PinnedBuf::new(device),
        })
    }

    /// `src`'s bytes, read when this returns; valid until the next read.
    pub fn read(&mut self, src: &DeviceView<'_>) -> Result<&[u8]> {
        let ptr = DevicePtr::of_view(src)?;
        let dst = self.buf.slice(src.len())?;
        if !dst.is_empty() {
            gpu(self.queue.device)?;
            dtoh(&self.queue, dst, ptr)?;
            self.queue.wait()?;
        }
        Ok(dst)
    }
}

/// A new allocation of `len` bytes on `device` (zeroed; at least one byte).
pub fn alloc(device: i32, len: usize) -> Result<DeviceBuffer> {
    DeviceMem::zeroed(device, len).map(DeviceMem::into_buffer)
}

/// One copy of `len` bytes between two addresses of one GPU, not yet made.
#[derive(Debug, Clone, Copy)]
struct Part {
    src: u64,
    dst: u64,
    len: u64,
}

thread_local! {
    /// The copies this thread queued with [`DeviceOps::copy_queued`] and has not made yet,
    /// with their GPU: [`DeviceOps::finish_copies`] makes them all in one launch a GPU.
    static QUEUED: std::cell::RefCell<Vec<(i32, Part)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `copy_parts`' parameters (`kernels/copy.cu`'s `Parts`, then the count).
#[repr(C)]
struct PartsArg {
    src: [u64; kernels::COPY_PARTS],
    dst: [u64; kernels::COPY_PARTS],
    len: [u64; kernels::COPY_PARTS],
}

// SAFETY: plain words laid out as the kernel's struct of three arrays (repr(C), no padding).
unsafe impl DeviceRepr for PartsArg {}

/// Queues `parts` (non-empty, live memory of `device`, each range inside one allocation that
/// outlives `stream`'s next synchronisation) on `stream`: one launch of the batched copy per
/// `COPY_PARTS` parts, or one driver copy each where there is only one or the kernel cannot
/// be had (no NVRTC).
fn copy_all(device: i32, stream: &CudaStream, parts: &[Part]) -> Result<()> {
    let kernel = if parts.len() > 1 { kernels::copy_parts(device).ok() } else { None };
    let Some(f) = kernel else {
        for p in parts {
            dtod_raw(stream, p.dst, p.src, p.len as usize)?;
        }
        return Ok(());
    };
    for chunk in parts.chunks(kernels::COPY_PARTS) {
        let mut arg = PartsArg {
            src: [0; kernels::COPY_PARTS],
            dst: [0; kernels::COPY_PARTS],
            len: [0; kernels::COPY_PARTS],
        };
        for (k, p) in chunk.iter().enumerate() {
            (arg.src[k], arg.dst[k], arg.len[k]) = (p.src, p.dst, p.len);
        }
        let longest = chunk.iter().map(|p| p.len).max().unwrap_or(0);
        // a block copies up to 64 KB of a part (256 threads, 16 bytes each, 16 times)
        let blocks = longest.div_ceil(1 << 16).clamp(1, 256) as u32;
        let n = chunk.len() as i32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, chunk.len() as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&f);
        b.arg(&arg).arg(&n);
        // SAFETY: the arguments are copy_parts' (Parts by value, then int); each of the n
        // parts is a range of live memory on this device (the callers' contract).
        unsafe { b.launch(cfg) }.map_err(cuda_err)?;
    }
    Ok(())
}

/// The real GPU: [`DeviceOps`] through the CUDA driver.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cuda;

impl DeviceOps for Cuda {
    fn copy(&self, src: Bytes<'_>, dst: BytesMut<'_>) -> Result<()> {
        if src.len() != dst.len() {
            return Err(CudaError::internal(format!(
                "copy of {} bytes into a buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        // Views are only made from live allocations (their constructors' contracts), and
        // the lengths were checked above.
        match (src, dst) {
            (Bytes::Host(s), BytesMut::Host(d)) => copy_host(s, d),
            (Bytes::Device(s), BytesMut::Host(d)) => {
                copy_dtoh(s.device(), d, DevicePtr::of_view(&s)?)
            }
            (Bytes::Host(s), BytesMut::Device(d)) => {
                copy_htod(d.device(), DevicePtr::of_view_mut(&d)?, s)
            }
            (Bytes::Device(s), BytesMut::Device(d)) if s.device() == d.device() => {
                copy_dtod(d.device(), DevicePtr::of_view_mut(&d)?, DevicePtr::of_view(&s)?, s.len())
            }
            (Bytes::Device(s), BytesMut::Device(d)) => copy_peer(
                d.device(),
                DevicePtr::of_view_mut(&d)?,
                s.device(),
                DevicePtr::of_view(&s)?,
                s.len(),
            ),
        }
    }

    fn alloc(&self, device: i32, bytes: usize) -> Result<DeviceBuffer> {
        alloc(device, bytes)
    }

    fn copy_queued(&self, src: Bytes<'_>, dst: BytesMut<'_>) -> Result<()> {
        match (src, dst) {
            (Bytes::Device(s), BytesMut::Device(d))
                if s.device() == d.device() && s.len() == d.len() =>
            {
                if s.is_empty() {
                    return Ok(());
                }
                let part = Part {
                    src: DevicePtr::of_view(&s)?.raw(),
                    dst: DevicePtr::of_view_mut(&d)?.raw(),
                    len: s.len() as u64,
                };
                QUEUED.with(|q| q.borrow_mut().push((d.device(), part)));
                Ok(())
            }
            (src, dst) => self.copy(src, dst),
        }
    }

    fn finish_copies(&self) -> Result<()> {
        let mut queued = QUEUED.with(|q| std::mem::take(&mut *q.borrow_mut()));
        // by device, each device's in the order queued
        queued.sort_by_key(|q| q.0);
        // every device's copies queued before any is waited for
        let mut first_error = None;
        let mut streams = Vec::new();
        for group in queued.chunk_by(|a, b| a.0 == b.0) {
            let device = group[0].0;
            let parts: Vec<Part> = group.iter().map(|q| q.1).collect();
            match copy_stream(device) {
                Ok(s) => {
                    if let Err(e) = copy_all(device, &s, &parts) {
                        first_error.get_or_insert(e);
                    }
                    streams.push(s);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        for s in &streams {
            if let Err(e) = s.synchronize().map_err(cuda_err) {
                first_error.get_or_insert(e);
            }
        }
        // the list's room back for the next output's copies
        queued.clear();
        QUEUED.with(|q| {
            let mut q = q.borrow_mut();
            if q.is_empty() {
                *q = queued;
            }
        });
        first_error.map_or(Ok(()), Err)
    }

    fn discard_queued(&self) {
        QUEUED.with(|q| q.borrow_mut().clear());
    }

    fn gather(&self, device: i32, parts: &[DeviceView<'_>]) -> Result<DeviceBuffer> {
        // where a gather's time goes, measured only when it will be logged
        let clock = log::log_enabled!(log::Level::Debug).then(std::time::Instant::now);
        let total: usize = parts.iter().map(DeviceView::len).sum();
        // every byte is one of the parts' (copied below, on the stream it was allocated on)
        let out = DeviceMem::for_copies(device, total)?;
        let stream = copy_stream(device)?;
        let base = out.ptr();
        let mut at = 0usize;
        let (mut copies, mut from_peers) = (Vec::with_capacity(parts.len()), Vec::new());
        for p in parts {
            if !p.is_empty() {
                let src = DevicePtr::of_view(p)?.raw();
                let part = Part { src, dst: base.at(at).raw(), len: p.len() as u64 };
                if p.device() == device {
                    copies.push(part);
                } else {
                    from_peers.push((p.device(), part));
                }
            }
            at += p.len();
        }
        // each part is a live view on its device; the new buffer has room for all
        copy_all(device, &stream, &copies)?;
        if !from_peers.is_empty() {
            let to = state(device)?;
            for &(from, part) in &from_peers {
                peer_on(&stream, &to, from, part)?;
            }
        }
        let queued = clock.map(|c| c.elapsed());
        stream.synchronize().map_err(cuda_err)?;
        if let (Some(c), Some(q)) = (clock, queued) {
            log::debug!(
                "timing: gather: parts {}, bytes {total}, allocated and queued {} us, waited {} us",
                parts.len(),
                q.as_micros(),
                (c.elapsed() - q).as_micros()
            );
        }
        Ok(out.into_buffer())
    }
}
