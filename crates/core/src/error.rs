//! One error type for the whole backend.
//!
//! Every fallible function returns [`Result`]. The [`ErrorKind`] says whose fault it
//! is; the Triton layer maps it to a `TRITONSERVER_Error` code in exactly one place
//! (the Triton crate's `ffi::to_triton_error`), so an engine never needs to know Triton's codes.

use std::fmt;

/// Whose mistake an error is, in the terms Triton reports to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller sent something wrong (bad tensor, bad config): HTTP 400.
    InvalidArg,
    /// A file, tensor or model that should exist does not.
    NotFound,
    /// Something we depend on is not there right now (a runtime library, a device).
    Unavailable,
    /// A feature asked for is not supported by this build or this runtime.
    Unsupported,
    /// The client cancelled the request.
    Cancelled,
    /// Our own bug or an engine failure.
    Internal,
    /// The GPU's CUDA context in this process is unusable (a sticky CUDA error: an illegal
    /// address, a device-side assert, a launch failure): every later call on that device fails.
    DeviceLost,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }
    pub fn invalid_arg(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArg, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    pub fn device_lost(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::DeviceLost, message)
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    /// Prefixes the message with where it happened, keeping the kind.
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error { kind: self.kind, message: format!("{context}: {}", self.message) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<triton_rust_cuda::CudaError> for Error {
    fn from(e: triton_rust_cuda::CudaError) -> Self {
        let kind = if e.is_device_lost() {
            ErrorKind::DeviceLost
        } else if e.unavailable {
            ErrorKind::Unavailable
        } else {
            ErrorKind::Internal
        };
        Error::new(kind, e.message)
    }
}

/// Adds context to any `Result` whose error converts into ours.
pub trait ResultExt<T> {
    fn context(self, context: impl fmt::Display) -> Result<T>;
}

impl<T, E: Into<Error>> ResultExt<T> for std::result::Result<T, E> {
    fn context(self, context: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().context(context))
    }
}

/// Returns early with an error of the given kind: `bail!(InvalidArg, "input '{}' ...", name)`.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::error::Error::new($crate::error::ErrorKind::$kind, format!($($arg)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fails() -> Result<()> {
        bail!(InvalidArg, "input '{}' is empty", "X");
    }

    #[test]
    fn bail_and_context_keep_kind() {
        let e = fails().context("request 7").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArg);
        assert_eq!(e.message(), "request 7: input 'X' is empty");
    }

    #[test]
    fn a_cuda_error_keeps_its_kind_by_the_drivers_code() {
        use triton_rust_cuda::{error::code, CudaError};
        let lost = Error::from(CudaError::driver(code::ILLEGAL_ADDRESS, "CUDA: illegal address"));
        assert_eq!(lost.kind(), ErrorKind::DeviceLost);
        assert_eq!(lost.context("batch lookup").kind(), ErrorKind::DeviceLost);
        let oom = CudaError::driver(2, "CUDA: an illegal memory access in the text only");
        assert_eq!(Error::from(oom).kind(), ErrorKind::Internal, "the code decides, not the text");
        assert_eq!(
            Error::from(CudaError::unavailable("no libcuda")).kind(),
            ErrorKind::Unavailable
        );
        assert_eq!(Error::from(CudaError::internal("bad length")).kind(), ErrorKind::Internal);
    }
}
