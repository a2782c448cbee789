//! Error text across the ABI, plugin side: into the caller's slot, out of a C++ buffer.

use std::ffi::{c_char, CString};

/// Puts `msg` into the caller's error slot, to be freed with [`free_error`].
///
/// # Safety
/// `err` is null or points to the caller's writable out-slot.
pub unsafe fn set_err(err: *mut *mut c_char, msg: String) {
    if !err.is_null() {
        let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        // SAFETY: err points to the caller's out-slot.
        unsafe { *err = c.into_raw() };
    }
}

/// The table's `free_error`: frees a string the plugin handed out through [`set_err`].
///
/// # Safety
/// `err` is null or came from [`set_err`] (or `CString::into_raw`) and is freed once.
pub unsafe extern "C" fn free_error(err: *mut c_char) {
    if !err.is_null() {
        drop(CString::from_raw(err));
    }
}

/// A call into a plugin's C++ side, which writes a NUL-terminated message into the error
/// buffer it is given when it fails: the call's result, and that text (empty when none).
pub fn with_error<T>(call: impl FnOnce(*mut c_char, usize) -> T) -> (T, String) {
    // on the stack: every run passes one
    let mut buf = [0u8; 2048];
    let r = call(buf.as_mut_ptr() as *mut c_char, buf.len());
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    (r, String::from_utf8_lossy(&buf[..end]).into_owned())
}
