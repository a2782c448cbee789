//! The bottom two of the Triton room's three layers (as cudarc does for CUDA): `sys`
//! (the raw bindings from the `triton-sys` crate) and the conversions here (`check`,
//! `to_triton_error`: every call becomes a `Result`, errors carry Triton's code; data
//! types, memory types, the clock). The safe layer is the sibling modules.

use std::ffi::{CStr, CString};

pub(crate) use triton_sys as sys;

use triton_rust_core::error::{Error, ErrorKind, Result};
use triton_rust_core::tensor::{DataType, Device};

/// Turns a `TRITONSERVER_Error*` returned by Triton into our `Result`, deleting it.
pub(crate) fn check(err: *mut sys::TRITONSERVER_Error) -> Result<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null error from Triton is ours to read and delete, once.
    let (code, message) = unsafe {
        let code = sys::TRITONSERVER_ErrorCode(err);
        let msg = sys::TRITONSERVER_ErrorMessage(err);
        let message = if msg.is_null() {
            String::new()
        } else {
            CStr::from_ptr(msg).to_string_lossy().into_owned()
        };
        sys::TRITONSERVER_ErrorDelete(err);
        (code, message)
    };
    let kind = match code {
        sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_INVALID_ARG => ErrorKind::InvalidArg,
        sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_NOT_FOUND => ErrorKind::NotFound,
        sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_UNAVAILABLE => ErrorKind::Unavailable,
        sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_UNSUPPORTED => ErrorKind::Unsupported,
        sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_CANCELLED => ErrorKind::Cancelled,
        _ => ErrorKind::Internal,
    };
    Err(Error::new(kind, message))
}

/// The one place an [`ErrorKind`] becomes a Triton error code. The caller owns the
/// returned error (Triton takes it when it is returned from an entry point).
pub(crate) fn to_triton_error(e: &Error) -> *mut sys::TRITONSERVER_Error {
    let code = match e.kind() {
        ErrorKind::InvalidArg => sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_INVALID_ARG,
        ErrorKind::NotFound => sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_NOT_FOUND,
        // a lost GPU: this server cannot serve on it until restarted
        ErrorKind::Unavailable | ErrorKind::DeviceLost => {
            sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_UNAVAILABLE
        }
        ErrorKind::Unsupported => sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_UNSUPPORTED,
        ErrorKind::Cancelled => sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_CANCELLED,
        ErrorKind::Internal => sys::TRITONSERVER_errorcode_enum_TRITONSERVER_ERROR_INTERNAL,
    };
    let msg = c_string(e.message());
    // SAFETY: Triton copies the message.
    unsafe { sys::TRITONSERVER_ErrorNew(code, msg.as_ptr()) }
}

/// A C string from any text (interior NULs replaced, never a panic).
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).expect("NULs replaced")
}

/// Reads a C string Triton owns into an owned `String`.
///
/// # Safety
/// `p` must be null or a valid NUL-terminated string.
pub(crate) unsafe fn from_c(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

pub(crate) fn dtype_from_triton(t: sys::TRITONSERVER_DataType) -> Result<DataType> {
    use DataType::*;
    Ok(match t {
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_BOOL => Bool,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_UINT8 => U8,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_UINT16 => U16,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_UINT32 => U32,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_UINT64 => U64,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_INT8 => I8,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_INT16 => I16,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_INT32 => I32,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_INT64 => I64,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_FP16 => F16,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_FP32 => F32,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_FP64 => F64,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_BF16 => Bf16,
        sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_BYTES => Bytes,
        other => return Err(Error::invalid_arg(format!("unknown Triton data type {other}"))),
    })
}

pub(crate) fn dtype_to_triton(t: DataType) -> sys::TRITONSERVER_DataType {
    use DataType::*;
    match t {
        Bool => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_BOOL,
        U8 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_UINT8,
        U16 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_UINT16,
        U32 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_UINT32,
        U64 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_UINT64,
        I8 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_INT8,
        I16 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_INT16,
        I32 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_INT32,
        I64 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_INT64,
        F16 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_FP16,
        F32 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_FP32,
        F64 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_FP64,
        Bf16 => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_BF16,
        Bytes => sys::TRITONSERVER_datatype_enum_TRITONSERVER_TYPE_BYTES,
    }
}

/// Where a Triton buffer is (pinned host memory is host memory).
pub(crate) fn device_from_triton(t: sys::TRITONSERVER_MemoryType, id: i64) -> Device {
    match t {
        sys::TRITONSERVER_memorytype_enum_TRITONSERVER_MEMORY_GPU => Device::Gpu(id as i32),
        _ => Device::Cpu,
    }
}

/// The memory type and id to ask Triton for.
pub(crate) fn device_to_triton(d: Device) -> (sys::TRITONSERVER_MemoryType, i64) {
    match d {
        Device::Gpu(id) => (sys::TRITONSERVER_memorytype_enum_TRITONSERVER_MEMORY_GPU, id as i64),
        Device::Cpu => (sys::TRITONSERVER_memorytype_enum_TRITONSERVER_MEMORY_CPU, 0),
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock Triton's statistics expect.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the struct we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
