//! Host inputs to a GPU instance: staged through one pinned buffer the instance keeps,
//! in chunks, so that copying chunk k+1 into pinned memory (on the CPU) overlaps the
//! DMA of chunk k to the GPU; and outputs wanted on the host, copied into another pinned
//! buffer on the instance's stream before its one wait (`outputs_to_host`).

use tch::{Device, Kind, Tensor};

use crate::shim::{shim_call, InstanceStream};

/// Bytes per chunk: large enough that a copy's launch cost is small, small enough that
/// the first DMA starts early.
const CHUNK: usize = 4 << 20;
/// Chunks at least this large are copied into pinned memory by libtorch's threads.
const PARALLEL: usize = 2 << 20;

/// Pinned host bytes (grown to the largest run's need, never shrunk).
pub(crate) struct Pinned {
    buf: Option<Tensor>,
    capacity: usize,
}

impl Pinned {
    pub(crate) fn new() -> Pinned {
        Pinned { buf: None, capacity: 0 }
    }

    /// At least `bytes` of pinned memory; `what` names its use in an error.
    fn reserve(&mut self, bytes: usize, device: Device, what: &str) -> Result<*mut u8, String> {
        if self.buf.is_none() || self.capacity < bytes {
            self.buf = None;
            let cap = bytes.next_power_of_two().max(1 << 16);
            let t = Tensor::f_empty([cap as i64], (Kind::Uint8, Device::Cpu))
                .and_then(|t| t.f_pin_memory(device))
                .map_err(|e| {
                    format!("cannot allocate {cap} bytes of pinned memory for {what}: {e}")
                })?;
            self.buf = Some(t);
            self.capacity = cap;
        }
        Ok(self.buf.as_ref().expect("reserved").data_ptr() as *mut u8)
    }
}

pub(crate) struct Staging {
    pinned: Pinned,
}

/// A host input to stage: its bytes, shape and element type.
pub(crate) struct HostInput<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) shape: &'a [i64],
    pub(crate) kind: Kind,
}

impl Staging {
    pub(crate) fn new() -> Staging {
        Staging { pinned: Pinned::new() }
    }

    /// Copies `inputs` to `device` on the instance's stream `s`; the returned tensors
    /// are valid on that stream (the copies are queued, not finished). First finishes
    /// the stream's earlier work, which may still read the pinned buffer. `into`: where
    /// the inputs go (device tensors of their shape and type: a CUDA graph's static
    /// inputs), else new tensors.
    pub(crate) fn stage(
        &mut self,
        inputs: &[HostInput],
        device: Device,
        s: &InstanceStream,
        into: Option<Vec<Tensor>>,
    ) -> Result<Vec<Tensor>, String> {
        let total: usize = inputs.iter().map(|i| i.bytes.len().next_multiple_of(256)).sum();
        s.sync()?;
        let base = self.pinned.reserve(total, device, "inputs")?;
        let mut out = Vec::with_capacity(inputs.len());
        let mut into = into.map(Vec::into_iter);
        let mut offset = 0;
        for input in inputs {
            let dst = match into.as_mut().and_then(Iterator::next) {
                Some(t)
                    if t.numel() * t.kind().elt_size_in_bytes() == input.bytes.len()
                        && t.device() == device =>
                {
                    t
                }
                Some(t) => {
                    return Err(format!(
                        "staging an input of shape {:?} into a tensor of shape {:?}",
                        input.shape,
                        t.size()
                    ))
                }
                None => Tensor::f_empty(input.shape, (input.kind, device))
                    .map_err(|e| format!("cannot allocate an input on {device:?}: {e}"))?,
            };
            let n = input.bytes.len();
            let mut done = 0;
            while done < n {
                let len = CHUNK.min(n - done);
                // SAFETY: offset + done + len <= total <= the pinned capacity.
                let host = unsafe { base.add(offset + done) };
                copy_in(&input.bytes[done..done + len], host)?;
                let to = (dst.data_ptr() as *mut u8).wrapping_add(done);
                // SAFETY: len bytes from the pinned range just written into dst's
                // storage (at least n bytes; alive until returned), queued on the
                // instance's stream; the range is not rewritten before that stream has
                // passed the copy (the sync above, at the next run).
                shim_call(|err, elen| unsafe {
                    (s.api.copy_async)(s.stream, to.cast(), host.cast(), len, err, elen)
                })
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
/// (301 KB; git show b8ff342:bench/gpu/results/dense_perf_h100_parallel_copy_timing.log).
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
        let from = Tensor::f_from_blob(src.as_ptr(), &n, &[], Kind::Uint8, Device::Cpu)
            .map_err(|e| e.to_string())?;
        let mut to = Tensor::f_from_blob(dst, &n, &[], Kind::Uint8, Device::Cpu)
            .map_err(|e| e.to_string())?;
        to.f_copy_(&from).map_err(|e| format!("copying an input into pinned memory: {e}"))
    }
}

/// Copies a GPU instance's outputs into `pinned` host memory on its stream `s` and waits
/// once for all of it (the model's work and the copies): one wait, and DMA into pinned
/// memory, where copying each output to a response's host buffer from the GPU would wait
/// per output. The returned host tensors view `pinned`: valid until its next use.
pub(crate) fn outputs_to_host(
    outs: Vec<Tensor>,
    pinned: &mut Pinned,
    device: Device,
    s: &InstanceStream,
) -> Result<Vec<Tensor>, String> {
    let outs = outs
        .into_iter()
        .map(|t| t.f_contiguous().map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let size = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
    let total: usize =
        outs.iter().filter(|t| t.device().is_cuda()).map(|t| size(t).next_multiple_of(256)).sum();
    let base = pinned.reserve(total, device, "outputs")?;
    let mut host = Vec::with_capacity(outs.len());
    let mut offset = 0;
    for t in &outs {
        if !t.device().is_cuda() {
            host.push(t.shallow_clone());
            continue;
        }
        let n = size(t);
        // SAFETY: offset + n <= total <= the pinned capacity.
        let dst = unsafe { base.add(offset) };
        // SAFETY: n bytes of a contiguous device tensor (alive in `outs` until the wait
        // below) into the pinned range, queued on the stream the model ran on.
        shim_call(|err, elen| unsafe {
            (s.api.copy_async)(s.stream, dst.cast(), t.data_ptr() as *const _, n, err, elen)
        })
        .map_err(|why| format!("copying an output to the host: {why}"))?;
        // SAFETY: a view of the pinned range just queued, which nothing rewrites before
        // the caller is done with it (the next run).
        host.push(
            unsafe { Tensor::f_from_blob(dst, &t.size(), &[], t.kind(), Device::Cpu) }
                .map_err(|e| e.to_string())?,
        );
        offset += n.next_multiple_of(256);
    }
    s.sync()?;
    Ok(host)
}
