//! The CUDA room's error: the driver's result code beside its message, so callers branch on
//! what happened (a lost device, CUDA not being there) rather than on text. Vocabulary: no
//! CUDA needed, so engines whose runtimes report only text classify it here too
//! ([`sticky_error_in`]).

use std::fmt;

/// The CUDA driver's result codes (`CUresult`) this crate acts on.
pub mod code {
    pub const ILLEGAL_ADDRESS: i32 = 700;
    pub const LAUNCH_TIMEOUT: i32 = 702;
    pub const ASSERT: i32 = 710;
    pub const HARDWARE_STACK_ERROR: i32 = 714;
    pub const ILLEGAL_INSTRUCTION: i32 = 715;
    pub const MISALIGNED_ADDRESS: i32 = 716;
    pub const INVALID_ADDRESS_SPACE: i32 = 717;
    pub const INVALID_PC: i32 = 718;
    pub const LAUNCH_FAILED: i32 = 719;
}

/// Codes after which the driver keeps failing every call in the process's context on that
/// device (CUDA's documentation: "the process must be terminated and relaunched").
const STICKY_CODES: [i32; 9] = [
    code::ILLEGAL_ADDRESS,
    code::LAUNCH_TIMEOUT,
    code::ASSERT,
    code::HARDWARE_STACK_ERROR,
    code::ILLEGAL_INSTRUCTION,
    code::MISALIGNED_ADDRESS,
    code::INVALID_ADDRESS_SPACE,
    code::INVALID_PC,
    code::LAUNCH_FAILED,
];

/// How the CUDA runtime and driver word those sticky errors, for runtimes that hand us only
/// text (ONNX Runtime, libtorch): their `cudaGetErrorString` texts and the driver's names.
const STICKY_TEXTS: [&str; 14] = [
    "device-side assert",
    "illegal memory access",
    "unspecified launch failure",
    "illegal instruction",
    "misaligned address",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_LAUNCH_FAILED",
];

/// Whether an engine runtime's error text reports a sticky CUDA error: the device's context
/// in this process is unusable from then on. The one place such text is read.
pub fn sticky_error_in(text: &str) -> bool {
    STICKY_TEXTS.iter().any(|m| text.contains(m))
}

/// A CUDA failure, or CUDA not being there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    /// The driver or NVRTC library could not be loaded (no GPU machine).
    pub unavailable: bool,
    /// The driver's `CUresult`, when the driver reported the failure.
    pub code: Option<i32>,
    pub message: String,
}

impl CudaError {
    pub fn internal(message: impl Into<String>) -> CudaError {
        CudaError { unavailable: false, code: None, message: message.into() }
    }
    pub fn unavailable(message: impl Into<String>) -> CudaError {
        CudaError { unavailable: true, code: None, message: message.into() }
    }
    /// A failure the driver reported with `code` (its `CUresult`).
    pub fn driver(code: i32, message: impl Into<String>) -> CudaError {
        CudaError { unavailable: false, code: Some(code), message: message.into() }
    }
    /// The device's context is unusable for the rest of the process (an illegal address, a
    /// device-side assert, a launch failure, ...), by the driver's code.
    pub fn is_device_lost(&self) -> bool {
        self.code.is_some_and(|c| STICKY_CODES.contains(&c))
    }
    /// The same error with `context` before its message.
    pub fn context(self, context: impl fmt::Display) -> CudaError {
        CudaError { message: format!("{context}: {}", self.message), ..self }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CudaError {}

pub type Result<T> = std::result::Result<T, CudaError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_lost_by_the_drivers_code_not_by_the_words() {
        for c in STICKY_CODES {
            assert!(CudaError::driver(c, "x").is_device_lost(), "code {c}");
        }
        let oom = CudaError::driver(2, "CUDA: illegal memory access, said nobody");
        assert!(!oom.is_device_lost(), "out of memory (2) is not sticky whatever the text");
        assert!(!CudaError::internal("an illegal memory access").is_device_lost());
        assert!(!CudaError::unavailable("no libcuda").is_device_lost());
        let lost = CudaError::driver(code::ASSERT, "assert").context("batch lookup");
        assert!(lost.is_device_lost() && lost.message == "batch lookup: assert");
    }

    #[test]
    fn runtime_texts_of_sticky_errors_are_recognised_and_others_are_not() {
        for text in [
            "CUDA error: device-side assert triggered\nCompile with TORCH_USE_CUDA_DSA",
            "CUDA failure 700: an illegal memory access was encountered ; GPU=0",
            "CUDA error: unspecified launch failure",
            "CUDA error: an illegal instruction was encountered",
            "CUDA error: misaligned address",
            "DriverError(CUDA_ERROR_LAUNCH_FAILED, \"unspecified launch failure\")",
            "DriverError(CUDA_ERROR_INVALID_PC, \"invalid program counter\")",
        ] {
            assert!(sticky_error_in(text), "{text}");
        }
        for text in [
            "CUDA out of memory. Tried to allocate 2.00 GiB",
            "CUDA error: invalid argument",
            "input 'X' is empty",
            "",
        ] {
            assert!(!sticky_error_in(text), "{text}");
        }
    }

    #[cfg(feature = "driver")]
    #[test]
    fn the_codes_are_the_drivers() {
        use cudarc::driver::sys::CUresult as R;
        let named = [
            (R::CUDA_ERROR_ILLEGAL_ADDRESS, code::ILLEGAL_ADDRESS),
            (R::CUDA_ERROR_LAUNCH_TIMEOUT, code::LAUNCH_TIMEOUT),
            (R::CUDA_ERROR_ASSERT, code::ASSERT),
            (R::CUDA_ERROR_HARDWARE_STACK_ERROR, code::HARDWARE_STACK_ERROR),
            (R::CUDA_ERROR_ILLEGAL_INSTRUCTION, code::ILLEGAL_INSTRUCTION),
            (R::CUDA_ERROR_MISALIGNED_ADDRESS, code::MISALIGNED_ADDRESS),
            (R::CUDA_ERROR_INVALID_ADDRESS_SPACE, code::INVALID_ADDRESS_SPACE),
            (R::CUDA_ERROR_INVALID_PC, code::INVALID_PC),
            (R::CUDA_ERROR_LAUNCH_FAILED, code::LAUNCH_FAILED),
        ];
        for (r, c) in named {
            assert_eq!(r as i32, c, "{r:?}");
            assert!(sticky_error_in(&format!("{r:?}")), "{r:?}'s name is recognised in text");
        }
    }
}
