//! Host bytes to the GPU through page-locked memory the owner keeps.
//!
//! A copy from pageable memory makes the driver stage it through its own small pinned
//! buffer, one piece at a time, on the calling thread. An [`Uploader`] keeps a pinned
//! buffer the size of the largest upload so far and splits a large upload over up to
//! four threads: each copies its part into the pinned buffer in 4 MiB chunks and queues
//! every chunk's DMA as soon as it is there, so the copies to the GPU overlap the copies
//! into pinned memory (reading a client's system shared-memory region is the slow part:
//! a few GB/s per thread on the H100 machine). One wait at the end.

use crate::buffer::{DeviceMem, DevicePtr};
use crate::context::gpu;
use crate::copy::{htod, Queue};
use crate::error::{CudaError, Result};
use crate::mem::{DeviceView, DeviceViewMut};
use crate::pinned::PinnedBuf;

/// Bytes per DMA.
const CHUNK: usize = 4 << 20;
/// Uploads at least this large per thread are split over threads (up to 4).
const PER_THREAD: usize = 8 << 20;

/// Bytes per thread of an upload of `len` bytes: whole chunks, at most four threads, one
/// thread below `PER_THREAD` per thread.
fn part_len(len: usize) -> usize {
    let threads = (len / PER_THREAD).clamp(1, 4);
    len.div_ceil(threads).next_multiple_of(CHUNK)
}

/// Runs `work(offset, from, to)` over `src` and `dst` (equal lengths) cut into parts of `per`
/// elements: on this thread when one part holds them all, else one task per part on the
/// process's worker pool (rayon: starting 16 threads per call costs ~0.5 ms on a 2-CPU
/// VM, handing 16 tasks to parked ones ~20 µs; `examples/pool_vs_spawn.rs`), with `device`'s context
/// current on each. The first error (or a panic, as an error) is the result.
/// What [`in_parts`] runs on each part: `(offset, from, to)`.
pub(crate) type PartWork<'w, T, U> = dyn Fn(usize, &[T], &mut [U]) -> Result<()> + Sync + 'w;

pub(crate) fn in_parts<T: Sync, U: Send>(
    device: i32,
    per: usize,
    src: &[T],
    dst: &mut [U],
    work: &PartWork<'_, T, U>,
) -> Result<()> {
    use rayon::prelude::*;
    if per >= src.len() {
        return work(0, src, dst);
    }
    src.par_chunks(per).zip(dst.par_chunks_mut(per)).enumerate().try_for_each(|(k, (from, to))| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gpu(device)?; // the device's context, current on this thread
            work(k * per, from, to)
        }))
        .unwrap_or_else(|_| Err(CudaError::internal("a copying task panicked")))
    })
}

/// The bytes of `k`, in memory order (what a copy to the GPU sends).
pub(crate) fn int_bytes(k: &[i64]) -> &[u8] {
    // SAFETY: i64 has no padding bytes, u8 needs no alignment, and the length is the
    // slice's own size in bytes; the borrow keeps `k` alive and unchanged.
    unsafe { std::slice::from_raw_parts(k.as_ptr().cast::<u8>(), std::mem::size_of_val(k)) }
}

pub struct Uploader {
    queue: Queue,
    pinned: PinnedBuf<u8>,
}

impl Uploader {
    pub fn new(device: i32) -> Result<Uploader> {
        Ok(Uploader { queue: Queue::new(device)?, pinned: PinnedBuf::new(device) })
    }

    /// Copies `src` into `dst` (equal lengths); done when it returns.
    pub fn upload(&mut self, src: &[u8], dst: DeviceViewMut<'_>) -> Result<()> {
        if src.len() != dst.len() {
            return Err(CudaError::internal(format!(
                "upload of {} bytes into a buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        let device = self.queue.device();
        if dst.device() != device {
            return Err(CudaError::internal(format!(
                "an uploader for GPU {device} was given a buffer on GPU {}",
                dst.device()
            )));
        }
        if src.is_empty() {
            return Ok(());
        }
        let base = DevicePtr::of_view_mut(&dst)?;
        let pinned = self.pinned.slice(src.len())?;
        let queue = &self.queue;
        let send = |offset: usize, from: &[u8], to: &mut [u8]| -> Result<()> {
            for (i, (c, p)) in from.chunks(CHUNK).zip(to.chunks_mut(CHUNK)).enumerate() {
                p.copy_from_slice(c);
                // `p` is page-locked and not touched again before the wait below; `dst`
                // has room for `src` (lengths checked above)
                htod(queue, base.at(offset + i * CHUNK), p)?;
            }
            Ok(())
        };
        let sent = in_parts(device, part_len(src.len()), src, pinned, &send);
        // wait even after a failure: nothing may still read the pinned buffer
        let waited = queue.wait();
        sent.and(waited)
    }
}

/// Host inputs copied into one device buffer the owner keeps (grown to the largest set
/// so far, never shrunk), each part at a 256-byte aligned offset: what a chain of engines
/// uses to move its second engine's host inputs to the GPU while the first one runs.
pub struct Staged {
    uploader: Uploader,
    buf: Option<DeviceMem>,
}

/// Offset alignment of the parts in a [`Staged`] buffer.
const ALIGN: usize = 256;

impl Staged {
    pub fn new(device: i32) -> Result<Staged> {
        Ok(Staged { uploader: Uploader::new(device)?, buf: None })
    }

    /// Copies every part to the GPU; done when it returns. The views live until the next call.
    pub fn stage(&mut self, parts: &[&[u8]]) -> Result<Vec<DeviceView<'_>>> {
        let device = self.uploader.queue.device();
        gpu(device)?; // the calling thread may be new to the device
        let mut total = 0usize;
        let offsets: Vec<usize> = parts
            .iter()
            .map(|p| {
                let at = total;
                total += p.len().next_multiple_of(ALIGN);
                at
            })
            .collect();
        if self.buf.as_ref().is_none_or(|b| b.len() < total) {
            self.buf = None; // the old buffer goes before the new one is made
            self.buf = Some(DeviceMem::zeroed(device, total.next_power_of_two())?);
        }
        let buf = self.buf.as_mut().expect("allocated above");
        let mut rest = buf.view_mut();
        for p in parts {
            let (part, after) = rest.split_at(p.len().next_multiple_of(ALIGN));
            self.uploader.upload(p, part.split_at(p.len()).0)?;
            rest = after;
        }
        // the views borrow `self`, so the buffer outlives them and the next `stage` (which
        // needs `&mut self`) cannot overwrite them while they are read
        let whole = self.buf.as_ref().expect("allocated above").view(total).expect("room for all");
        Ok(parts
            .iter()
            .zip(&offsets)
            .map(|(p, &o)| whole.slice(o..o + p.len()).expect("inside the buffer"))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_whole_chunks_on_at_most_four_threads() {
        for len in
            [1, 300_000, CHUNK, PER_THREAD - 1, PER_THREAD, 2 * PER_THREAD + 5, 38_535_168, 1 << 30]
        {
            let per = part_len(len);
            let threads = len.div_ceil(per);
            assert!(
                per.is_multiple_of(CHUNK) && (1..=4).contains(&threads),
                "len {len}: {threads} parts of {per}"
            );
            assert!(
                per * threads >= len && per * (threads - 1) < len,
                "len {len}: the parts cover it, none empty"
            );
            if len < 2 * PER_THREAD {
                assert_eq!(threads, 1, "len {len}: small uploads stay on the calling thread");
            }
        }
        assert_eq!(
            part_len(38_535_168).div_ceil(CHUNK),
            3,
            "ResNet50's batch of 128: 4 threads of 3 chunks"
        );
    }

    #[test]
    fn work_in_parts_covers_every_element_once_with_its_offset() {
        let src: Vec<u32> = (0..1000).collect();
        let mut dst = vec![0u32; 1000];
        let copy = |at: usize, from: &[u32], to: &mut [u32]| -> Result<()> {
            for (i, (t, f)) in to.iter_mut().zip(from).enumerate() {
                *t = *f + (at + i) as u32; // the offset is where the part starts
            }
            Ok(())
        };
        in_parts(0, 1000, &src, &mut dst, &copy).unwrap();
        assert!(
            dst.iter().enumerate().all(|(i, &v)| v == 2 * i as u32),
            "one part, on this thread, no GPU needed"
        );
        dst.fill(0);
        match in_parts(0, 128, &src, &mut dst, &copy) {
            // several parts make each task's GPU context current
            Ok(()) => assert!(dst.iter().enumerate().all(|(i, &v)| v == 2 * i as u32)),
            Err(e) => assert!(
                !std::path::Path::new("/dev/nvidia0").exists(),
                "only a machine without a GPU may refuse: {e}"
            ),
        }
        let fails = |at: usize, _: &[u32], _: &mut [u32]| -> Result<()> {
            if at == 0 {
                Err(CudaError::internal("part 0 failed"))
            } else {
                Ok(())
            }
        };
        assert!(in_parts(0, 2000, &src, &mut dst, &fails)
            .unwrap_err()
            .to_string()
            .contains("part 0 failed"));
    }
}
