//! Who reads a GPU instance's cache misses from the host tier (`gpucache_miss_reads`).

use triton_rust_core::error::{Error, Result};

/// Who reads a GPU instance's misses from the host tier's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissReads {
    /// Host threads, into page-locked memory, and one copy to the GPU.
    Cpu,
    /// The lookup's kernels, in place over the bus (the rows page-locked and mapped for the
    /// GPU; `triton_rust_embedding`'s `store/host_rows.rs`).
    Gpu,
    /// Both at once: each batch's misses shared between the GPU in place and host threads
    /// by their measured rates (`BatchLookup::share_misses`).
    Both,
}

/// As a model parameter's text.
impl std::str::FromStr for MissReads {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<MissReads, String> {
        MissReads::parse(Some(s)).map_err(|e| e.message().to_string())
    }
}

impl MissReads {
    pub(crate) fn parse(text: Option<&str>) -> Result<MissReads> {
        match text.map(str::trim) {
            None | Some("cpu") => Ok(MissReads::Cpu),
            Some("gpu") => Ok(MissReads::Gpu),
            Some("both") => Ok(MissReads::Both),
            Some(other) => Err(Error::invalid_arg(format!(
                "parameter 'gpucache_miss_reads' is '{other}'; use cpu (host threads read the misses), gpu (the GPU reads them in place) or both (shared by their rates)"
            ))),
        }
    }
}
