//! Requests, responses and the instance's statistics, with Triton's ownership rules
//! in their types:
//! - a [`Request`] handed to `execute` is ours; dropping it releases it to Triton;
//! - a [`Response`] must be sent exactly once; dropping an unsent one sends an error,
//!   so no client is ever left waiting;
//! - `TRITONBACKEND_ResponseSend` does not take the error passed to it: we delete it.

use super::{c_string, check, dtype_from_triton, dtype_to_triton, from_c, memory_from_triton, sys, to_triton_error};
use crate::batch::{Chunk, RequestTensor};
use crate::error::{Error, Result};
use crate::tensor::Memory;

pub struct Request {
    raw: *mut sys::TRITONBACKEND_Request,
}

// SAFETY: a request may be handled from any thread; Triton does not touch it while we own it.
unsafe impl Send for Request {}

impl Request {
    /// # Safety
    /// `raw` must be a request Triton handed to `execute`, not yet released.
    pub(crate) unsafe fn from_raw(raw: *mut sys::TRITONBACKEND_Request) -> Self {
        Request { raw }
    }

    pub fn id(&self) -> String {
        let mut p = std::ptr::null();
        // SAFETY: the id string is owned by the request and copied at once.
        match check(unsafe { sys::TRITONBACKEND_RequestId(self.raw, &mut p) }) {
            Ok(()) => unsafe { from_c(p) },
            Err(_) => String::new(),
        }
    }

    pub fn is_cancelled(&self) -> bool {
        let mut c = false;
        // SAFETY: a query on a live request.
        check(unsafe { sys::TRITONBACKEND_RequestIsCancelled(self.raw, &mut c) }).is_ok() && c
    }

    /// Every input of the request, with its buffers. Host memory is asked for; a
    /// buffer Triton holds in GPU memory comes back as [`Chunk::Device`].
    pub fn inputs(&self) -> Result<Vec<RequestTensor<'_>>> {
        let mut count = 0u32;
        check(unsafe { sys::TRITONBACKEND_RequestInputCount(self.raw, &mut count) })?;
        let mut out = Vec::with_capacity(count as usize);
        for i in 0..count {
            let mut input = std::ptr::null_mut();
            check(unsafe { sys::TRITONBACKEND_RequestInputByIndex(self.raw, i, &mut input) })?;
            let (mut name, mut dtype, mut shape, mut dims, mut bytes, mut buffers) =
                (std::ptr::null(), 0, std::ptr::null(), 0u32, 0u64, 0u32);
            // SAFETY: all out-pointers are valid; strings and shape are owned by the input.
            check(unsafe {
                sys::TRITONBACKEND_InputProperties(input, &mut name, &mut dtype, &mut shape, &mut dims, &mut bytes, &mut buffers)
            })?;
            let name = unsafe { from_c(name) };
            let shape = if dims == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(shape, dims as usize) }.to_vec() };
            let dtype = dtype_from_triton(dtype).map_err(|e| e.context(format!("input '{name}'")))?;
            let mut chunks = Vec::with_capacity(buffers as usize);
            for b in 0..buffers {
                let (mut ptr, mut size) = (std::ptr::null(), 0u64);
                let mut mem = sys::TRITONSERVER_memorytype_enum_TRITONSERVER_MEMORY_CPU;
                let mut mem_id = 0i64;
                check(unsafe { sys::TRITONBACKEND_InputBuffer(input, b, &mut ptr, &mut size, &mut mem, &mut mem_id) })
                    .map_err(|e| e.context(format!("input '{name}' buffer {b}")))?;
                let size = size as usize;
                chunks.push(match memory_from_triton(mem, mem_id) {
                    Memory::Gpu(id) => Chunk::Device { memory: Memory::Gpu(id), addr: ptr as u64, len: size },
                    _ if size == 0 || ptr.is_null() => Chunk::Host(&[]),
                    // SAFETY: host memory owned by the request, valid while `self` is borrowed.
                    _ => Chunk::Host(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), size) }),
                });
            }
            out.push(RequestTensor { name, dtype, shape, chunks });
        }
        Ok(out)
    }

    /// Names of the outputs the client asked for.
    pub fn requested_outputs(&self) -> Result<Vec<String>> {
        let mut count = 0u32;
        check(unsafe { sys::TRITONBACKEND_RequestOutputCount(self.raw, &mut count) })?;
        (0..count)
            .map(|i| {
                let mut p = std::ptr::null();
                check(unsafe { sys::TRITONBACKEND_RequestOutputName(self.raw, i, &mut p) })?;
                Ok(unsafe { from_c(p) })
            })
            .collect()
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        // SAFETY: we own the request and release it exactly once.
        let flag = sys::tritonserver_requestreleaseflag_enum_TRITONSERVER_REQUEST_RELEASE_ALL;
        if let Err(e) = check(unsafe { sys::TRITONBACKEND_RequestRelease(self.raw, flag) }) {
            crate::log_error!("failed to release request: {e}");
        }
    }
}

/// Where Triton put an output's buffer.
pub enum OutputTarget<'a> {
    Host(&'a mut [u8]),
    Device { device: i64, addr: u64 },
}

pub struct Response {
    raw: *mut sys::TRITONBACKEND_Response,
}

// SAFETY: a response is only used by the thread that owns it.
unsafe impl Send for Response {}

impl Response {
    pub fn new(request: &Request) -> Result<Response> {
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::TRITONBACKEND_ResponseNew(&mut raw, request.raw) })?;
        Ok(Response { raw })
    }

    /// Adds an output and returns its buffer, in `prefer`red memory when Triton can
    /// (it may answer with host memory anyway, e.g. for a client over the network).
    pub fn output_buffer(
        &mut self,
        name: &str,
        dtype: crate::tensor::DataType,
        shape: &[i64],
        byte_size: usize,
        prefer: Memory,
    ) -> Result<OutputTarget<'_>> {
        let cname = c_string(name);
        let mut output = std::ptr::null_mut();
        check(unsafe {
            sys::TRITONBACKEND_ResponseOutput(self.raw, &mut output, cname.as_ptr(), dtype_to_triton(dtype), shape.as_ptr(), shape.len() as u32)
        })
        .map_err(|e| e.context(format!("output '{name}'")))?;
        let mut buf = std::ptr::null_mut();
        let (mut mem, mut mem_id) = match prefer {
            Memory::Gpu(id) => (sys::TRITONSERVER_memorytype_enum_TRITONSERVER_MEMORY_GPU, id),
            Memory::CpuPinned => (sys::TRITONSERVER_memorytype_enum_TRITONSERVER_MEMORY_CPU_PINNED, 0),
            Memory::Cpu => (sys::TRITONSERVER_memorytype_enum_TRITONSERVER_MEMORY_CPU, 0),
        };
        check(unsafe { sys::TRITONBACKEND_OutputBuffer(output, &mut buf, byte_size as u64, &mut mem, &mut mem_id) })
            .map_err(|e| e.context(format!("output '{name}'")))?;
        if byte_size == 0 {
            return Ok(OutputTarget::Host(&mut []));
        }
        Ok(match memory_from_triton(mem, mem_id) {
            Memory::Gpu(id) => OutputTarget::Device { device: id, addr: buf as u64 },
            // SAFETY: Triton allocated `byte_size` host bytes for this output, alive with the response.
            _ => OutputTarget::Host(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), byte_size) }),
        })
    }

    /// Sends the response as final, with the error if the request failed.
    pub fn send(mut self, outcome: &Result<()>) {
        self.send_inner(outcome);
    }

    fn send_inner(&mut self, outcome: &Result<()>) {
        if self.raw.is_null() {
            return;
        }
        let err = match outcome {
            Ok(()) => std::ptr::null_mut(),
            Err(e) => to_triton_error(e),
        };
        let flag = sys::tritonserver_responsecompleteflag_enum_TRITONSERVER_RESPONSE_COMPLETE_FINAL;
        // SAFETY: the response is live; Send consumes it whether or not it succeeds.
        let sent = check(unsafe { sys::TRITONBACKEND_ResponseSend(self.raw, flag, err) });
        if !err.is_null() {
            // SAFETY: ResponseSend does not take ownership of the error.
            unsafe { sys::TRITONSERVER_ErrorDelete(err) };
        }
        if let Err(e) = sent {
            crate::log_error!("failed to send response: {e}");
        }
        self.raw = std::ptr::null_mut();
    }
}

impl Drop for Response {
    fn drop(&mut self) {
        self.send_inner(&Err(Error::internal("the rust backend dropped this response without an answer")));
    }
}

/// Timestamps of one execution, CLOCK_MONOTONIC ns, in order.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    pub exec_start: u64,
    pub compute_start: u64,
    pub compute_end: u64,
    pub exec_end: u64,
}

/// The model instance as `execute` sees it: where statistics are reported.
pub struct Instance {
    raw: *mut sys::TRITONBACKEND_ModelInstance,
}

impl Instance {
    pub(crate) fn from_raw(raw: *mut sys::TRITONBACKEND_ModelInstance) -> Self {
        Instance { raw }
    }

    /// Reports one request's statistics. Must come before the request is released.
    pub fn report(&self, request: &Request, success: bool, t: Timing) {
        let r = check(unsafe {
            sys::TRITONBACKEND_ModelInstanceReportStatistics(
                self.raw, request.raw, success, t.exec_start, t.compute_start, t.compute_end, t.exec_end,
            )
        });
        if let Err(e) = r {
            crate::log_error!("failed to report request statistics: {e}");
        }
    }

    pub fn report_batch(&self, batch_size: u64, t: Timing) {
        let r = check(unsafe {
            sys::TRITONBACKEND_ModelInstanceReportBatchStatistics(
                self.raw, batch_size, t.exec_start, t.compute_start, t.compute_end, t.exec_end,
            )
        });
        if let Err(e) = r {
            crate::log_error!("failed to report batch statistics: {e}");
        }
    }
}
