//! Host inputs to a GPU instance: staged through one pinned buffer the instance keeps,
//! in chunks, so that copying chunk k+1 into pinned memory (on the CPU) overlaps the
//! DMA of chunk k to the GPU.
//!
//! Measured on an H100 (bench/gpu/results/dense_perf_h100_timing.log): staging a
//! ResNet50 input through a fresh `pin_memory()` per run took 379 us at batch 1 (301 KB)
//! and ~2 ms at batch 128 (38.5 MB) before the copy to the GPU even began.
//!
//! The buffer is reused by the next run, so a run first waits for its stream to finish
//! whatever earlier copies from it may still be in flight (nothing, after a run that
//! completed: every run ends synchronised).

use tch::{Device, Kind, Tensor};

use super::{shim_call, InstanceStream};

/// Bytes per chunk: large enough that a copy's launch cost is small, small enough that
/// the first DMA starts early.
const CHUNK: usize = 4 << 20;
/// Chunks at least this large are copied into pinned memory by libtorch's threads.
const PARALLEL: usize = 2 << 20;

pub(crate) struct Staging {
    /// Pinned host bytes (grown to the largest run's host inputs, never shrunk).
    pinned: Option<Tensor>,
    capacity: usize,
}

/// A host input to stage: its bytes, shape and element type.
pub(crate) struct HostInput<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) shape: &'a [i64],
    pub(crate) kind: Kind,
}

impl Staging {
    pub(crate) fn new() -> Staging {
        Staging { pinned: None, capacity: 0 }
    }

    fn reserve(&mut self, bytes: usize, device: Device) -> Result<*mut u8, String> {
        if self.pinned.is_none() || self.capacity < bytes {
            self.pinned = None;
            let cap = bytes.next_power_of_two().max(1 << 16);
            let t = Tensor::f_empty([cap as i64], (Kind::Uint8, Device::Cpu))
                .and_then(|t| t.f_pin_memory(device))
                .map_err(|e| format!("cannot allocate {cap} bytes of pinned memory for inputs: {e}"))?;
            self.pinned = Some(t);
            self.capacity = cap;
        }
        Ok(self.pinned.as_ref().expect("reserved").data_ptr() as *mut u8)
    }

    /// Copies `inputs` to `device` on the instance's stream `s`; the returned tensors
    /// are valid on that stream (the copies are queued, not finished). First finishes
    /// the stream's earlier work, which may still read the pinned buffer.
    pub(crate) fn stage(&mut self, inputs: &[HostInput], device: Device, s: &InstanceStream) -> Result<Vec<Tensor>, String> {
        let total: usize = inputs.iter().map(|i| i.bytes.len().next_multiple_of(256)).sum();
        s.sync()?;
        let base = self.reserve(total, device)?;
        let mut out = Vec::with_capacity(inputs.len());
        let mut offset = 0;
        for input in inputs {
            let dst = Tensor::f_empty(input.shape, (input.kind, device)).map_err(|e| format!("cannot allocate an input on {device:?}: {e}"))?;
            let n = input.bytes.len();
            let mut done = 0;
            while done < n {
                let len = CHUNK.min(n - done);
                // SAFETY: offset + done + len <= total <= capacity.
                let host = unsafe { base.add(offset + done) };
                copy_in(&input.bytes[done..done + len], host)?;
                let to = (dst.data_ptr() as *mut u8).wrapping_add(done);
                // SAFETY: len bytes from the pinned range just written into dst's
                // storage (at least n bytes; alive until returned), queued on the
                // instance's stream; the range is not rewritten before that stream has
                // passed the copy (the sync above, at the next run).
                shim_call(|err, elen| unsafe { (s.api.copy_h2d)(s.stream, to.cast(), host.cast(), len, err, elen) })
                    .map_err(|why| format!("copying an input to {device:?}: {why}"))?;
                done += len;
            }
            offset += n.next_multiple_of(256);
            out.push(dst);
        }
        Ok(out)
    }
}

/// Copies `src` into pinned memory at `dst` with libtorch's CPU copy, which splits a
/// large copy over its intra-op threads: reading Triton's input buffers (a client's
/// system shared memory region, say) runs at a few GB/s per thread, so one thread
/// would take most of a large batch's time (4.4 ms for 38.5 MB on the H100 machine).
///
/// Small copies are a plain memcpy: waking libtorch's thread pool cost ~300 us at batch 1
/// (301 KB; bench/gpu/results/dense_perf_h100_parallel_copy_timing.log).
fn copy_in(src: &[u8], dst: *mut u8) -> Result<(), String> {
    if src.len() < PARALLEL {
        // SAFETY: dst has room for src.len() bytes (pinned range) and does not overlap src.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        return Ok(());
    }
    let n = [src.len() as i64];
    // SAFETY: non-owning views of the caller's input and of the pinned range (at least
    // src.len() bytes), alive for the copy, which is done when copy_ returns (host to
    // host).
    unsafe {
        let from = Tensor::f_from_blob(src.as_ptr(), &n, &[], Kind::Uint8, Device::Cpu).map_err(|e| e.to_string())?;
        let mut to = Tensor::f_from_blob(dst, &n, &[], Kind::Uint8, Device::Cpu).map_err(|e| e.to_string())?;
        to.f_copy_(&from).map_err(|e| format!("copying an input into pinned memory: {e}"))
    }
}
