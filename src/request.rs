//! Requests, responses and the instance's statistics, with Triton's ownership rules
//! in their types:
//! - a [`Request`] handed to `execute` is ours; dropping it releases it to Triton;
//! - a [`Response`] must be sent exactly once; dropping an unsent one sends an error,
//!   so no client is ever left waiting;
//! - `TRITONBACKEND_ResponseSend` does not take the error passed to it: we delete it.
//!
//! Together they are the core's `Transport`: `triton_rust_core::serve::execute` runs on
//! them. Buffers Triton hands over in GPU memory become `DeviceView`s here, the one
//! place their addresses are vouched for.

use triton_rust_core::batch::RequestTensor;
use triton_rust_core::error::{Error, Result};
use triton_rust_core::serve::{finish, Done, InferRequest, InferResponse, Timing, Transport};
use triton_rust_core::tensor::{
    Bytes, BytesMut, DataType, Device, DeviceOps, DeviceView, DeviceViewMut,
};
use triton_rust_cuda::Cuda;

use crate::ffi::{
    c_string, check, device_from_triton, device_to_triton, dtype_from_triton, dtype_to_triton,
    from_c, now_ns, sys, to_triton_error,
};

pub struct Request {
    raw: *mut sys::TRITONBACKEND_Request,
    /// States made and filled on this request (`StateNew`, `StateBuffer`), handed to the
    /// sequence by `commit_states` (`StateUpdate`). One that is never committed stays the
    /// request's own and goes with it: the sequence keeps its state as it was.
    staged: std::cell::RefCell<Vec<*mut sys::TRITONBACKEND_State>>,
}

// SAFETY: a request may be handled from any thread; Triton does not touch it while we own it.
unsafe impl Send for Request {}

impl Request {
    /// # Safety
    /// `raw` must be a request Triton handed to `execute`, not yet released.
    pub(crate) unsafe fn from_raw(raw: *mut sys::TRITONBACKEND_Request) -> Self {
        Request { raw, staged: Default::default() }
    }
}

impl InferRequest for Request {
    fn id(&self) -> String {
        let mut p = std::ptr::null();
        // SAFETY: the id string is owned by the request and copied at once.
        match check(unsafe { sys::TRITONBACKEND_RequestId(self.raw, &mut p) }) {
            Ok(()) => unsafe { from_c(p) },
            Err(_) => String::new(),
        }
    }

    fn is_cancelled(&self) -> bool {
        let mut c = false;
        // SAFETY: a query on a live request.
        check(unsafe { sys::TRITONBACKEND_RequestIsCancelled(self.raw, &mut c) }).is_ok() && c
    }

    /// Every input of the request, with its buffers. Host memory is asked for; a
    /// buffer Triton holds in GPU memory comes back as a [`DeviceView`].
    fn inputs(&self) -> Result<Vec<RequestTensor<'_>>> {
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
                sys::TRITONBACKEND_InputProperties(
                    input,
                    &mut name,
                    &mut dtype,
                    &mut shape,
                    &mut dims,
                    &mut bytes,
                    &mut buffers,
                )
            })?;
            let name = unsafe { from_c(name) };
            let shape = if dims == 0 {
                Vec::new()
            } else {
                unsafe { std::slice::from_raw_parts(shape, dims as usize) }.to_vec()
            };
            let dtype =
                dtype_from_triton(dtype).map_err(|e| e.context(format!("input '{name}'")))?;
            let mut chunks = Vec::with_capacity(buffers as usize);
            for b in 0..buffers {
                let (mut ptr, mut size) = (std::ptr::null(), 0u64);
                let mut mem = sys::TRITONSERVER_memorytype_enum_TRITONSERVER_MEMORY_CPU;
                let mut mem_id = 0i64;
                check(unsafe {
                    sys::TRITONBACKEND_InputBuffer(
                        input,
                        b,
                        &mut ptr,
                        &mut size,
                        &mut mem,
                        &mut mem_id,
                    )
                })
                .map_err(|e| e.context(format!("input '{name}' buffer {b}")))?;
                let size = size as usize;
                chunks.push(match device_from_triton(mem, mem_id) {
                    // SAFETY: GPU memory owned by the request, valid and unchanged while `self` is borrowed.
                    Device::Gpu(id) => {
                        Bytes::Device(unsafe { DeviceView::from_raw(id, ptr as u64, size) })
                    }
                    _ if size == 0 || ptr.is_null() => Bytes::Host(&[]),
                    // SAFETY: host memory owned by the request, valid while `self` is borrowed.
                    _ => Bytes::Host(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), size) }),
                });
            }
            out.push(RequestTensor { name, dtype, shape, chunks });
        }
        Ok(out)
    }

    /// Names of the outputs the client asked for.
    fn parameters(&self) -> Result<Vec<(String, String)>> {
        let mut count = 0u32;
        check(unsafe { sys::TRITONBACKEND_RequestParameterCount(self.raw, &mut count) })?;
        let mut out = Vec::with_capacity(count as usize);
        for i in 0..count {
            let (mut key, mut kind, mut value) = (std::ptr::null(), 0, std::ptr::null());
            check(unsafe {
                sys::TRITONBACKEND_RequestParameter(self.raw, i, &mut key, &mut kind, &mut value)
            })?;
            // SAFETY: key and value are owned by the request and read at once; the value
            // points at the type Triton says it is.
            let key = unsafe { from_c(key) };
            let value = unsafe {
                match kind {
                    _ if value.is_null() => String::new(),
                    sys::TRITONSERVER_parametertype_enum_TRITONSERVER_PARAMETER_STRING => {
                        from_c(value.cast())
                    }
                    sys::TRITONSERVER_parametertype_enum_TRITONSERVER_PARAMETER_INT => {
                        (*value.cast::<i64>()).to_string()
                    }
                    sys::TRITONSERVER_parametertype_enum_TRITONSERVER_PARAMETER_BOOL => {
                        (*value.cast::<bool>()).to_string()
                    }
                    _ => continue,
                }
            };
            out.push((key, value));
        }
        Ok(out)
    }

    /// Triton's implicit state API: `StateNew` makes the state on the request and the
    /// buffer is filled here; `StateUpdate` hands it to the sequence in `commit_states`.
    /// The state and its buffer belong to the request; neither is touched after the update.
    fn stage_state(
        &self,
        name: &str,
        dtype: DataType,
        shape: &[i64],
        byte_size: usize,
        prefer: Device,
        fill: &mut dyn FnMut(BytesMut<'_>) -> Result<()>,
    ) -> Result<Device> {
        let cname = c_string(name);
        let mut state = std::ptr::null_mut();
        // SAFETY: a live request; name and shape are read during the call.
        check(unsafe {
            sys::TRITONBACKEND_StateNew(
                &mut state,
                self.raw,
                cname.as_ptr(),
                dtype_to_triton(dtype),
                shape.as_ptr(),
                shape.len() as u32,
            )
        })?;
        let mut buf = std::ptr::null_mut();
        let (mut mem, mut mem_id) = device_to_triton(prefer);
        // SAFETY: the state was just made on this request and is not updated yet.
        check(unsafe {
            sys::TRITONBACKEND_StateBuffer(state, &mut buf, byte_size as u64, &mut mem, &mut mem_id)
        })?;
        let landed = device_from_triton(mem, mem_id);
        if byte_size > 0 {
            fill(match landed {
                // SAFETY: Triton allocated `byte_size` bytes on that GPU for the state, ours until StateUpdate.
                Device::Gpu(id) => {
                    BytesMut::Device(unsafe { DeviceViewMut::from_raw(id, buf as u64, byte_size) })
                }
                // SAFETY: Triton allocated `byte_size` host bytes for the state, ours until StateUpdate.
                Device::Cpu => BytesMut::Host(unsafe {
                    std::slice::from_raw_parts_mut(buf.cast::<u8>(), byte_size)
                }),
            })?;
        }
        self.staged.borrow_mut().push(state);
        Ok(landed)
    }

    fn commit_states(&self) -> Result<()> {
        for state in self.staged.borrow_mut().drain(..) {
            // SAFETY: a state made on this live request, filled, its buffer no longer
            // borrowed, and updated once (drained).
            check(unsafe { sys::TRITONBACKEND_StateUpdate(state) })?;
        }
        Ok(())
    }

    fn requested_outputs(&self) -> Result<Vec<String>> {
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
            log::error!("failed to release request: {e}");
        }
    }
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
            log::error!("failed to send response: {e}");
        }
        self.raw = std::ptr::null_mut();
    }
}

impl InferResponse for Response {
    fn output_buffer(
        &mut self,
        name: &str,
        dtype: DataType,
        shape: &[i64],
        byte_size: usize,
        prefer: Device,
    ) -> Result<BytesMut<'_>> {
        let cname = c_string(name);
        let mut output = std::ptr::null_mut();
        check(unsafe {
            sys::TRITONBACKEND_ResponseOutput(
                self.raw,
                &mut output,
                cname.as_ptr(),
                dtype_to_triton(dtype),
                shape.as_ptr(),
                shape.len() as u32,
            )
        })
        .map_err(|e| e.context(format!("output '{name}'")))?;
        let mut buf = std::ptr::null_mut();
        let (mut mem, mut mem_id) = device_to_triton(prefer);
        check(unsafe {
            sys::TRITONBACKEND_OutputBuffer(
                output,
                &mut buf,
                byte_size as u64,
                &mut mem,
                &mut mem_id,
            )
        })
        .map_err(|e| e.context(format!("output '{name}'")))?;
        if byte_size == 0 {
            return Ok(BytesMut::Host(&mut []));
        }
        Ok(match device_from_triton(mem, mem_id) {
            // SAFETY: Triton allocated `byte_size` bytes on that GPU for this output, ours until the response is sent.
            Device::Gpu(id) => {
                BytesMut::Device(unsafe { DeviceViewMut::from_raw(id, buf as u64, byte_size) })
            }
            // SAFETY: Triton allocated `byte_size` host bytes for this output, alive with the response.
            Device::Cpu => BytesMut::Host(unsafe {
                std::slice::from_raw_parts_mut(buf.cast::<u8>(), byte_size)
            }),
        })
    }

    fn send(mut self, outcome: &Result<()>) {
        self.send_inner(outcome);
    }
}

impl Drop for Response {
    fn drop(&mut self) {
        self.send_inner(&Err(Error::internal(
            "the rust backend dropped this response without an answer",
        )));
    }
}

/// The model instance as `execute` sees it: where statistics are reported, and the
/// thread that completes its executions, where it has one.
pub struct Instance<'a> {
    raw: *mut sys::TRITONBACKEND_ModelInstance,
    completer: Option<&'a Completer>,
}

impl<'a> Instance<'a> {
    pub(crate) fn from_raw(
        raw: *mut sys::TRITONBACKEND_ModelInstance,
        completer: Option<&'a Completer>,
    ) -> Self {
        Instance { raw, completer }
    }
}

/// An execution's end, handed to the completer: the instance's handle travels with it.
struct Completion {
    raw: *mut sys::TRITONBACKEND_ModelInstance,
    done: Vec<Done<Request, Response>>,
    rows: u64,
    timing: Timing,
}

// SAFETY: the instance outlives its completer (dropped, and drained, before the instance is
// finalized), and Triton's response, statistics and release calls may come from any thread.
unsafe impl Send for Completion {}

/// One instance's completion thread: sends an execution's responses, reports its statistics
/// and releases its requests (Triton lets a backend release requests after `execute` has
/// returned), so that the instance's own thread takes its next batch sooner; responses are
/// sent in the order the executions ended. Dropping it completes everything handed to it
/// first, before the instance goes.
pub struct Completer {
    jobs: Option<std::sync::mpsc::Sender<Completion>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Completer {
    pub fn new(name: &str) -> Result<Completer> {
        let (tx, rx) = std::sync::mpsc::channel::<Completion>();
        let thread = std::thread::Builder::new()
            .name(format!("complete {name}"))
            .spawn(move || {
                for c in rx {
                    let inst = Instance::from_raw(c.raw, None);
                    // a panic in one completion must not take the others' with it
                    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        finish(&inst, c.done, c.rows, c.timing)
                    })) {
                        log::error!(
                            "completing an execution panicked: {}",
                            triton_rust_core::panic::panic_text(&*p)
                        );
                    }
                }
            })
            .map_err(|e| Error::internal(format!("cannot start the completion thread: {e}")))?;
        Ok(Completer { jobs: Some(tx), thread: Some(thread) })
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        drop(self.jobs.take()); // the thread ends once it has done what was sent
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Transport for Instance<'_> {
    type Request = Request;
    type Response = Response;

    fn respond(&self, request: &Request) -> Result<Response> {
        Response::new(request)
    }

    /// Reports one request's statistics. Must come before the request is released.
    fn report(&self, request: &Request, success: bool, t: Timing) {
        let r = check(unsafe {
            sys::TRITONBACKEND_ModelInstanceReportStatistics(
                self.raw,
                request.raw,
                success,
                t.exec_start,
                t.compute_start,
                t.compute_end,
                t.exec_end,
            )
        });
        if let Err(e) = r {
            log::error!("failed to report request statistics: {e}");
        }
    }

    fn report_batch(&self, batch_size: u64, t: Timing) {
        let r = check(unsafe {
            sys::TRITONBACKEND_ModelInstanceReportBatchStatistics(
                self.raw,
                batch_size,
                t.exec_start,
                t.compute_start,
                t.compute_end,
                t.exec_end,
            )
        });
        if let Err(e) = r {
            log::error!("failed to report batch statistics: {e}");
        }
    }

    fn now_ns(&self) -> u64 {
        now_ns()
    }

    fn device_ops(&self) -> &dyn DeviceOps {
        &Cuda
    }

    fn complete(&self, done: Vec<Done<Request, Response>>, rows: u64, timing: Timing) {
        let job = Completion { raw: self.raw, done, rows, timing };
        let job = match self.completer.and_then(|c| c.jobs.as_ref()) {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(e) => e.0, // the thread is gone: completed here instead
            },
            None => job,
        };
        finish(self, job.done, job.rows, job.timing);
    }
}
