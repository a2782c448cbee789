//! `TRITONSERVER_Message` (JSON documents: model configs, backend config).
//!
//! Ownership differs by source, so it is a type: [`OwnedMessage`] deletes on drop
//! (the model config we request, a message we create), while the backend config is
//! Triton's and is only ever read through [`read_json`].

use crate::ffi::{check, sys};
use triton_rust_core::error::{Error, Result};

/// Serializes a message we do not own (or own elsewhere) to a JSON string.
pub(crate) fn read_json(msg: *mut sys::TRITONSERVER_Message) -> Result<String> {
    if msg.is_null() {
        return Err(Error::internal("Triton returned a null message"));
    }
    let mut base: *const std::os::raw::c_char = std::ptr::null();
    let mut size = 0usize;
    // SAFETY: msg is a live message; Triton owns the returned buffer until the message is deleted.
    check(unsafe { sys::TRITONSERVER_MessageSerializeToJson(msg, &mut base, &mut size) })?;
    if base.is_null() {
        return Ok(String::new());
    }
    let bytes = unsafe { std::slice::from_raw_parts(base.cast::<u8>(), size) };
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// A message this process owns; deleted when dropped.
pub struct OwnedMessage(*mut sys::TRITONSERVER_Message);

impl OwnedMessage {
    /// Takes ownership of a message Triton handed to us.
    ///
    /// # Safety
    /// `raw` must be a message the caller owns (e.g. from `TRITONBACKEND_ModelConfig`).
    pub(crate) unsafe fn from_raw(raw: *mut sys::TRITONSERVER_Message) -> Self {
        OwnedMessage(raw)
    }

    pub fn from_json(json: &str) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: Triton copies the bytes into a new message that we then own.
        check(unsafe {
            sys::TRITONSERVER_MessageNewFromSerializedJson(
                &mut raw,
                json.as_ptr().cast(),
                json.len(),
            )
        })?;
        Ok(OwnedMessage(raw))
    }

    pub fn to_json(&self) -> Result<String> {
        read_json(self.0)
    }

    pub(crate) fn raw(&self) -> *mut sys::TRITONSERVER_Message {
        self.0
    }
}

impl Drop for OwnedMessage {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: we own it and drop it once.
            let _ = check(unsafe { sys::TRITONSERVER_MessageDelete(self.0) });
        }
    }
}
