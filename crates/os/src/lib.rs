//! The OS room: memory-mapped files, dladdr, dlopen. Like the Triton and CUDA crates it holds `unsafe`
//! (mapping a file is unsafe because another process could change it under us), and
//! hands the other crates safe types (a plain `&[u8]`, a path, a `Library`).

use std::fs::File;
use std::path::{Path, PathBuf};

use triton_rust_core::error::{Error, Result};

mod crew;
mod guard;
mod memory;

pub use crew::Crew;
pub use guard::Guard;
pub use memory::{huge_copy_refused, memory_available, transparent_huge_pages};

/// A read-only file mapping. Table files are meant to be written once and left alone while
/// served (updates go to memory, never to the mapped file), but a file cut or rewritten under
/// a server must not end it: the mapping is guarded ([`Guard`]: a read past the file's new end
/// reads zeros instead of raising SIGBUS) and [`MappedFile::intact`] tells its reader whether
/// what it read is still the file it mapped.
pub struct MappedFile {
    // dropped before the mapping it guards
    guard: Option<Guard>,
    map: Option<memmap2::Mmap>,
    file: File,
    /// The file's size and modification time when it was mapped.
    stamp: (u64, i64, i64),
    path: PathBuf,
}

fn stamp_of(meta: &std::fs::Metadata) -> (u64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    (meta.len(), meta.mtime(), meta.mtime_nsec())
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<MappedFile> {
        let file = File::open(path)
            .map_err(|e| Error::not_found(format!("cannot open '{}': {e}", path.display())))?;
        let meta =
            file.metadata().map_err(|e| Error::internal(format!("'{}': {e}", path.display())))?;
        let (stamp, path) = (stamp_of(&meta), path.to_path_buf());
        if meta.len() == 0 {
            return Ok(MappedFile { guard: None, map: None, file, stamp, path });
        }
        // SAFETY: the file is opened read-only. Another process may still change it under
        // us: a read past a new end is guarded (zeros, and `intact` says so) and a rewrite
        // is seen by `intact`; nothing here hands out the bytes as anything but `&[u8]`.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::internal(format!("cannot map '{}': {e}", path.display())))?;
        let guard = Some(Guard::new(map.as_ptr(), map.len()));
        Ok(MappedFile { guard, map: Some(map), file, stamp, path })
    }

    /// The file mapped.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file is still the one mapped: `Err` says how it is not (cut while mapped,
    /// so a read met a page past its new end; or rewritten since: another size or
    /// modification time). Asked after a read, it covers that read.
    pub fn intact(&self) -> std::result::Result<(), String> {
        if self.guard.as_ref().is_some_and(Guard::cut) {
            return Err("was cut (truncated) while mapped: a read met a page past its end".into());
        }
        let now = self.file.metadata().map_err(|e| format!("cannot be checked: {e}"))?;
        let now = stamp_of(&now);
        if now != self.stamp {
            return Err(format!(
                "changed since it was loaded ({} bytes then, {} now; rewritten in place)",
                self.stamp.0, now.0
            ));
        }
        Ok(())
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// Maps every page of the file into this process now (`MADV_POPULATE_READ`, split over
    /// up to `threads` threads), so the first read of a row does not stop on a page fault:
    /// ~2.7 µs a row where a mapped row reads in ~0.1–0.3 µs, which made the reads of a
    /// GPU lookup's misses scattered over a 42 GB table fault-bound. Pages not yet in
    /// memory are read from the file. Kernels before Linux 5.14 lack the advice: then
    /// nothing happens and the error says so.
    pub fn populate(&self, threads: usize) -> std::io::Result<()> {
        let Some(map) = &self.map else { return Ok(()) };
        const PIECE: usize = 64 << 20;
        let len = map.len();
        let per = len.div_ceil(threads.max(1)).next_multiple_of(PIECE);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..len)
                .step_by(per)
                .map(|start| {
                    s.spawn(move || {
                        let mut at = start;
                        while at < (start + per).min(len) {
                            let n = PIECE.min(len - at);
                            map.advise_range(memmap2::Advice::PopulateRead, at, n)?;
                            at += n;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a populating thread panicked")))
            })
        })
    }
}

/// The directory holding the shared library this code was loaded from
/// (`<backends>/rust/` inside tritonserver), found with `dladdr`.
pub fn own_library_dir() -> Option<std::path::PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let here = own_library_dir as *const libc::c_void;
    // SAFETY: dladdr only reads the loader's tables for an address inside this library.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    std::path::Path::new(&path).parent().map(|p| p.to_path_buf())
}

/// Opens a shared library with its symbols made global (so libraries opened after it
/// resolve against it), as libtorch's pieces need.
pub fn open_global(path: &Path) -> std::result::Result<libloading::Library, String> {
    // SAFETY: opening a library runs its initialisers; these are libtorch's and our plugin's.
    unsafe { libloading::os::unix::Library::open(Some(path), libc::RTLD_NOW | libc::RTLD_GLOBAL) }
        .map(libloading::Library::from)
        .map_err(|e| e.to_string())
}

/// Returns the C heap's free pages to the OS (glibc keeps them otherwise, and a server
/// that loads and unloads models all day would grow for nothing). Called after a model
/// is unloaded.
pub fn release_free_heap() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Fixes glibc's mmap threshold: allocations of at least `bytes` get their own mapping,
/// returned to the OS when freed. glibc otherwise raises the threshold each time a large
/// mapped block is freed (up to 32 MiB), after which large buffers are carved from the
/// heap arenas and a server that loads and unloads models keeps growing. Returns false
/// where the allocator refused (or is not glibc's).
pub fn fix_mmap_threshold(bytes: usize) -> bool {
    // SAFETY: mallopt only changes the allocator's tuning parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, bytes.min(i32::MAX as usize) as libc::c_int) == 1
    }
}

/// Asks the CPU to start loading `bytes` into its caches (one hint per 64-byte line)
/// without waiting for them: a reader of many rows scattered over a large mapping
/// issues the next rows' hints while it copies this one, so their cache and TLB misses
/// overlap. A hint only; nothing is read and no fault can follow. No-op off x86_64.
#[inline]
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes.len()).step_by(64) {
        // SAFETY: SSE is part of the x86_64 baseline, and a prefetch is a hint that
        // never faults; the address is inside `bytes`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                bytes.as_ptr().add(line) as *const i8,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Copies `src` into `dst` (equal lengths) with stores that bypass the CPU's caches where
/// both are 16-byte aligned and a whole number of 16 bytes (x86_64's streaming stores;
/// otherwise a plain copy). For rows gathered into a buffer that only a device reads next:
/// a plain store first reads the destination's line into the cache and later writes it
/// back, two more trips to memory per row than the row itself. Stores made this way are
/// ordered for other threads only after [`store_fence`].
#[inline]
pub fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if dst.len().is_multiple_of(16)
        && (dst.as_ptr() as usize).is_multiple_of(16)
        && (src.as_ptr() as usize).is_multiple_of(16)
    {
        use std::arch::x86_64::{__m128i, _mm_load_si128, _mm_stream_si128};
        for at in (0..dst.len()).step_by(16) {
            // SAFETY: SSE2 is part of the x86_64 baseline; both addresses are 16-byte
            // aligned (checked above) and `at + 16 <= len` for both slices.
            unsafe {
                let v = _mm_load_si128(src.as_ptr().add(at) as *const __m128i);
                _mm_stream_si128(dst.as_mut_ptr().add(at) as *mut __m128i, v);
            }
        }
        return;
    }
    dst.copy_from_slice(src);
}

/// Orders every store [`copy_streaming`] made on this thread before its later stores (an
/// atomic's release included), so another thread that sees those sees the rows.
#[inline]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86_64 baseline; a fence has no operands.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// An anonymous copy of some bytes in memory the kernel is asked to back with 2 MiB
/// pages (`MADV_HUGEPAGE`; transparent huge pages on, as "madvise" or "always"). Reading
/// rows scattered over tens of GB through 4 KiB pages costs a TLB miss per row, and a
/// walk of two page tables on a virtual machine; huge pages make that rare.
pub struct HugeCopy {
    map: memmap2::MmapMut,
    len: usize,
    huge: bool,
}

impl HugeCopy {
    /// Copies `bytes` on up to `threads` threads.
    pub fn new(bytes: &[u8], threads: usize) -> std::io::Result<HugeCopy> {
        let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1))?;
        let huge = map.advise(memmap2::Advice::HugePage).is_ok();
        let per = bytes.len().div_ceil(threads.max(1)).next_multiple_of(2 << 20).max(2 << 20);
        std::thread::scope(|s| {
            for (to, from) in map.chunks_mut(per).zip(bytes.chunks(per)) {
                s.spawn(move || to[..from.len()].copy_from_slice(from));
            }
        });
        Ok(HugeCopy { map, len: bytes.len(), huge })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map[..self.len]
    }

    /// Whether the kernel took the huge-page advice.
    pub fn huge(&self) -> bool {
        self.huge
    }
}

#[cfg(test)]
mod copy_tests {
    #[test]
    fn a_streaming_copy_copies_aligned_or_not() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut dst = vec![0u8; 4096 + 16];
        // aligned (a Vec<u8> of this size starts 16-byte aligned on glibc), then shifted by one
        for shift in [0usize, 1] {
            let off = (16 - dst.as_ptr() as usize % 16) % 16 + shift;
            let n = 4096 - 16;
            super::copy_streaming(&mut dst[off..off + n], &src[..n]);
            super::store_fence();
            assert_eq!(&dst[off..off + n], &src[..n]);
        }
    }
}
