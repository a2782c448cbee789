//! The OS room: memory-mapped files. Like the Triton and CUDA rooms it holds `unsafe`
//! (mapping a file is unsafe because another process could change it under us), and
//! hands the rest of the crate a plain `&[u8]`.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

/// A read-only file mapping. Table files are written once and never modified while
/// served; updates go to memory, never to the mapped file.
pub struct MappedFile {
    map: Option<memmap2::Mmap>,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<MappedFile> {
        let file = File::open(path).map_err(|e| Error::not_found(format!("cannot open '{}': {e}", path.display())))?;
        let len = file.metadata().map_err(|e| Error::internal(format!("'{}': {e}", path.display())))?.len();
        if len == 0 {
            return Ok(MappedFile { map: None });
        }
        // SAFETY: the file is opened read-only and the project's contract is that
        // table files are not modified while a server maps them (docs/embedding-store.md).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::internal(format!("cannot map '{}': {e}", path.display())))?;
        Ok(MappedFile { map: Some(map) })
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
