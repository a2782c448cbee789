//! Host bytes to the GPU through page-locked memory the owner keeps.
//!
//! A copy from pageable memory makes the driver stage it through its own small pinned
//! buffer, one piece at a time, on the calling thread. An [`Uploader`] keeps a pinned
//! buffer the size of the largest upload so far and splits a large upload over up to
//! four threads: each copies its part into the pinned buffer in 4 MiB chunks and queues
//! every chunk's DMA as soon as it is there, so the copies to the GPU overlap the copies
//! into pinned memory (reading a client's system shared-memory region is the slow part:
//! a few GB/s per thread on the H100 machine). One wait at the end.

use crate::cache::{htod, HostBuf, Queue};
use crate::driver::{gpu, real};
use crate::mem::DeviceViewMut;
use crate::{CudaError, Result};

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
/// elements: on this thread when one part holds them all, else one thread per part, with
/// `device`'s context current on each. The first error (or a panic) is the result.
pub(crate) fn in_parts<T: Sync, U: Send>(
    device: i32,
    per: usize,
    src: &[T],
    dst: &mut [U],
    work: &(dyn Fn(usize, &[T], &mut [U]) -> Result<()> + Sync),
) -> Result<()> {
    if per >= src.len() {
        return work(0, src, dst);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = src
            .chunks(per)
            .zip(dst.chunks_mut(per))
            .enumerate()
            .map(|(k, (from, to))| {
                s.spawn(move || {
                    gpu(device)?; // the device's context, current on this thread
                    work(k * per, from, to)
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err(CudaError::internal("a copying thread panicked"))))
    })
}

pub struct Uploader {
    queue: Queue,
    pinned: HostBuf<u8>,
}

impl Uploader {
    pub fn new(device: i32) -> Result<Uploader> {
        Ok(Uploader { queue: Queue::new(device)?, pinned: HostBuf::new(device) })
    }

    /// Copies `src` into `dst` (equal lengths); done when it returns.
    pub fn upload(&mut self, src: &[u8], dst: DeviceViewMut<'_>) -> Result<()> {
        if src.len() != dst.len() {
            return Err(CudaError::internal(format!("upload of {} bytes into a buffer of {}", src.len(), dst.len())));
        }
        let device = self.queue.device();
        if dst.device() != device {
            return Err(CudaError::internal(format!("an uploader for GPU {device} was given a buffer on GPU {}", dst.device())));
        }
        if src.is_empty() {
            return Ok(());
        }
        let base = real(dst.raw_addr())?;
        let pinned = self.pinned.slice(src.len())?;
        let queue = &self.queue;
        let send = |offset: usize, from: &[u8], to: &mut [u8]| -> Result<()> {
            for (i, (c, p)) in from.chunks(CHUNK).zip(to.chunks_mut(CHUNK)).enumerate() {
                p.copy_from_slice(c);
                // `p` is page-locked and not touched again before the wait below; `dst`
                // has room for `src` (lengths checked above)
                htod(queue, base + (offset + i * CHUNK) as u64, p)?;
            }
            Ok(())
        };
        let sent = in_parts(device, part_len(src.len()), src, pinned, &send);
        // wait even after a failure: nothing may still read the pinned buffer
        let waited = queue.wait();
        sent.and(waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_whole_chunks_on_at_most_four_threads() {
        for len in [1, 300_000, CHUNK, PER_THREAD - 1, PER_THREAD, 2 * PER_THREAD + 5, 38_535_168, 1 << 30] {
            let per = part_len(len);
            let threads = len.div_ceil(per);
            assert!(per % CHUNK == 0 && (1..=4).contains(&threads), "len {len}: {threads} parts of {per}");
            assert!(per * threads >= len && per * (threads - 1) < len, "len {len}: the parts cover it, none empty");
            if len < 2 * PER_THREAD {
                assert_eq!(threads, 1, "len {len}: small uploads stay on the calling thread");
            }
        }
        assert_eq!(part_len(38_535_168).div_ceil(CHUNK), 3, "ResNet50's batch of 128: 4 threads of 3 chunks");
    }
}
