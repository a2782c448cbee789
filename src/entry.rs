//! The functions Triton looks up in `libtriton_rust.so`.
//!
//! Each one catches panics (a panic crossing `extern "C"` would abort the server),
//! turns our `Result` into a `TRITONSERVER_Error*`, and stores or frees the state
//! boxes Triton keeps for us. `execute` is special: once it has wrapped the requests
//! it owns them, so it always returns null and answers every request itself.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use std::sync::Arc;

use triton_rust_core::engine::{Device, EngineKinds};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::panic::panic_text;
use triton_rust_core::serve::{
    self, BackendSettings, InstanceContext, InstanceState, ModelContext, ModelState,
};
use triton_rust_core::settings::MmapThreshold;

use crate::engines;
use crate::ffi::{check, from_c, sys, to_triton_error};
use crate::message::{read_json, OwnedMessage};
use crate::metrics::MetricsPublisher;
use crate::request::{Completer, Instance, Request};

/// What Triton keeps for the backend: its settings, and the engine kinds with what they
/// keep for all the backend's models (e.g. the embedding stores shared by name).
struct TritonBackend {
    settings: BackendSettings,
    kinds: Arc<EngineKinds>,
}

/// What Triton keeps for a model: the core's state and, while it is loaded, the
/// publisher of its engine's metrics (declared first: stopped before the model goes).
struct TritonModel {
    _metrics: Option<MetricsPublisher>,
    state: ModelState,
}

/// What Triton keeps for an instance: the core's state and the thread that completes its
/// executions (declared first: it finishes what it was handed before the instance goes).
struct TritonInstance {
    completer: Completer,
    state: InstanceState,
}

/// Runs an entry point body, catching panics and converting errors for Triton.
fn guard(what: &str, body: impl FnOnce() -> Result<()>) -> *mut sys::TRITONSERVER_Error {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => to_triton_error(&e),
        Err(p) => to_triton_error(&Error::internal(format!(
            "{what}: the rust backend panicked: {}",
            panic_text(&*p)
        ))),
    }
}

/// # Safety
/// `get` must be one of Triton's `*State` getters, and the state must have been set
/// by us as a `Box<T>`.
unsafe fn state<'a, T, H>(
    handle: *mut H,
    get: unsafe extern "C" fn(*mut H, *mut *mut c_void) -> *mut sys::TRITONSERVER_Error,
) -> Result<&'a T> {
    let mut p = std::ptr::null_mut();
    check(get(handle, &mut p))?;
    (p as *const T).as_ref().ok_or_else(|| Error::internal("backend state is missing"))
}

/// Takes back a state box we stored, to drop it.
unsafe fn take_state<T, H>(
    handle: *mut H,
    get: unsafe extern "C" fn(*mut H, *mut *mut c_void) -> *mut sys::TRITONSERVER_Error,
) -> Result<Option<Box<T>>> {
    let mut p = std::ptr::null_mut();
    check(get(handle, &mut p))?;
    Ok((!p.is_null()).then(|| Box::from_raw(p as *mut T)))
}

#[no_mangle]
pub extern "C" fn TRITONBACKEND_Initialize(
    backend: *mut sys::TRITONBACKEND_Backend,
) -> *mut sys::TRITONSERVER_Error {
    guard("TRITONBACKEND_Initialize", || {
        crate::log::install();
        crate::log::install_panic_hook();
        let (mut major, mut minor) = (0u32, 0u32);
        check(unsafe { sys::TRITONBACKEND_ApiVersion(&mut major, &mut minor) })?;
        if major != sys::TRITONBACKEND_API_VERSION_MAJOR
            || minor < sys::TRITONBACKEND_API_VERSION_MINOR
        {
            return Err(Error::unsupported(format!(
                "the rust backend needs Triton backend API {}.{} or a later 1.x; this server has {major}.{minor}",
                sys::TRITONBACKEND_API_VERSION_MAJOR,
                sys::TRITONBACKEND_API_VERSION_MINOR
            )));
        }
        // The backend config message belongs to Triton: read it, never delete it.
        let mut msg = std::ptr::null_mut();
        check(unsafe { sys::TRITONBACKEND_BackendConfig(backend, &mut msg) })?;
        let kinds = engines::kinds();
        let settings = BackendSettings::from_json(&read_json(msg)?, &kinds.environment())?;
        // Flat memory across model reloads (issue 10): large buffers get their own
        // mappings. `--backend-config=rust,malloc-mmap-threshold=default` leaves glibc's
        // adaptive threshold; a number of bytes sets another fixed one.
        if let MmapThreshold::Fixed(bytes) = settings.mmap_threshold {
            if !triton_rust_os::fix_mmap_threshold(bytes) {
                log::warn!("could not fix the allocator's mmap threshold at {bytes} bytes");
            }
        }
        log::info!(
            "rust backend {} initialized (Triton backend API {major}.{minor}); settings: {:?}",
            env!("CARGO_PKG_VERSION"),
            settings.cmdline
        );
        let boxed = Box::into_raw(Box::new(TritonBackend { settings, kinds: Arc::new(kinds) }));
        check(unsafe { sys::TRITONBACKEND_BackendSetState(backend, boxed.cast()) }).inspect_err(
            |_| {
                drop(unsafe { Box::from_raw(boxed) });
            },
        )
    })
}

#[no_mangle]
pub extern "C" fn TRITONBACKEND_Finalize(
    backend: *mut sys::TRITONBACKEND_Backend,
) -> *mut sys::TRITONSERVER_Error {
    guard("TRITONBACKEND_Finalize", || {
        drop(unsafe { take_state::<TritonBackend, _>(backend, sys::TRITONBACKEND_BackendState)? });
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn TRITONBACKEND_ModelInitialize(
    model: *mut sys::TRITONBACKEND_Model,
) -> *mut sys::TRITONSERVER_Error {
    guard("TRITONBACKEND_ModelInitialize", || {
        let mut name = std::ptr::null();
        check(unsafe { sys::TRITONBACKEND_ModelName(model, &mut name) })?;
        let name = unsafe { from_c(name) };
        let mut version = 0u64;
        check(unsafe { sys::TRITONBACKEND_ModelVersion(model, &mut version) })?;
        let (mut artifact, mut location) = (0, std::ptr::null());
        check(unsafe { sys::TRITONBACKEND_ModelRepository(model, &mut artifact, &mut location) })?;
        let repository = PathBuf::from(unsafe { from_c(location) });
        // The model config message is ours: OwnedMessage deletes it.
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::TRITONBACKEND_ModelConfig(model, 1, &mut raw) })?;
        let config_json = unsafe { OwnedMessage::from_raw(raw) }.to_json()?;
        let mut autocomplete = false;
        check(unsafe { sys::TRITONBACKEND_ModelAutoCompleteConfig(model, &mut autocomplete) })?;
        let mut backend = std::ptr::null_mut();
        check(unsafe { sys::TRITONBACKEND_ModelBackend(model, &mut backend) })?;
        let backend: &TritonBackend = unsafe { state(backend, sys::TRITONBACKEND_BackendState)? };

        let ctx = ModelContext {
            name: name.clone(),
            version,
            repository,
            config_json,
            autocomplete,
            backend: &backend.settings,
            kinds: backend.kinds.clone(),
        };
        let (state, completed) =
            ModelState::load(ctx).map_err(|e| e.context(format!("model '{name}'")))?;
        let metrics = state
            .metrics_source()
            .map(|source| MetricsPublisher::start(name.clone(), source))
            .transpose()?;
        let model_state = TritonModel { _metrics: metrics, state };
        if let Some(json) = completed {
            let msg = OwnedMessage::from_json(&json)?;
            // Triton copies the config; the message stays ours and is deleted on drop.
            check(unsafe { sys::TRITONBACKEND_ModelSetConfig(model, 1, msg.raw()) })?;
        }
        let boxed = Box::into_raw(Box::new(model_state));
        check(unsafe { sys::TRITONBACKEND_ModelSetState(model, boxed.cast()) }).inspect_err(|_| {
            drop(unsafe { Box::from_raw(boxed) });
        })
    })
}

#[no_mangle]
pub extern "C" fn TRITONBACKEND_ModelFinalize(
    model: *mut sys::TRITONBACKEND_Model,
) -> *mut sys::TRITONSERVER_Error {
    guard("TRITONBACKEND_ModelFinalize", || {
        drop(unsafe { take_state::<TritonModel, _>(model, sys::TRITONBACKEND_ModelState)? });
        triton_rust_os::release_free_heap();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn TRITONBACKEND_ModelInstanceInitialize(
    instance: *mut sys::TRITONBACKEND_ModelInstance,
) -> *mut sys::TRITONSERVER_Error {
    guard("TRITONBACKEND_ModelInstanceInitialize", || {
        let mut name = std::ptr::null();
        check(unsafe { sys::TRITONBACKEND_ModelInstanceName(instance, &mut name) })?;
        let name = unsafe { from_c(name) };
        let mut kind = 0;
        check(unsafe { sys::TRITONBACKEND_ModelInstanceKind(instance, &mut kind) })?;
        let mut device_id = 0i32;
        check(unsafe { sys::TRITONBACKEND_ModelInstanceDeviceId(instance, &mut device_id) })?;
        let device = match kind {
            sys::TRITONSERVER_instancegroupkind_enum_TRITONSERVER_INSTANCEGROUPKIND_GPU => {
                Device::Gpu(device_id)
            }
            sys::TRITONSERVER_instancegroupkind_enum_TRITONSERVER_INSTANCEGROUPKIND_CPU => {
                Device::Cpu
            }
            // KIND_AUTO resolves to CPU or GPU before we are called.
            sys::TRITONSERVER_instancegroupkind_enum_TRITONSERVER_INSTANCEGROUPKIND_MODEL => {
                return Err(Error::unsupported(format!(
                    "instance '{name}': instance_group kind KIND_MODEL is not supported by the rust \
                     backend (no engine places itself across devices); use KIND_CPU, or KIND_GPU \
                     with `gpus: [ ... ]` for the devices to run on"
                )));
            }
            other => {
                return Err(Error::unsupported(format!(
                    "instance '{name}': instance_group kind {other} is not one the rust backend knows"
                )));
            }
        };
        let mut model = std::ptr::null_mut();
        check(unsafe { sys::TRITONBACKEND_ModelInstanceModel(instance, &mut model) })?;
        let model_state: &TritonModel = unsafe { state(model, sys::TRITONBACKEND_ModelState)? };
        let state =
            InstanceState::new(&model_state.state, InstanceContext { name: name.clone(), device })
                .map_err(|e| e.context(format!("instance '{name}'")))?;
        let completer =
            Completer::new(&name).map_err(|e| e.context(format!("instance '{name}'")))?;
        let boxed = Box::into_raw(Box::new(TritonInstance { completer, state }));
        check(unsafe { sys::TRITONBACKEND_ModelInstanceSetState(instance, boxed.cast()) })
            .inspect_err(|_| {
                drop(unsafe { Box::from_raw(boxed) });
            })
    })
}

#[no_mangle]
pub extern "C" fn TRITONBACKEND_ModelInstanceFinalize(
    instance: *mut sys::TRITONBACKEND_ModelInstance,
) -> *mut sys::TRITONSERVER_Error {
    guard("TRITONBACKEND_ModelInstanceFinalize", || {
        drop(unsafe {
            take_state::<TritonInstance, _>(instance, sys::TRITONBACKEND_ModelInstanceState)?
        });
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn TRITONBACKEND_ModelInstanceExecute(
    instance: *mut sys::TRITONBACKEND_ModelInstance,
    requests: *mut *mut sys::TRITONBACKEND_Request,
    request_count: u32,
) -> *mut sys::TRITONSERVER_Error {
    // From here on the requests are ours: wrapped at once, so that even a panic
    // below releases them (and answers them) through Drop.
    let owned: Vec<Request> = if requests.is_null() {
        Vec::new()
    } else {
        unsafe { std::slice::from_raw_parts(requests, request_count as usize) }
            .iter()
            .map(|&r| unsafe { Request::from_raw(r) })
            .collect()
    };
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
        match unsafe { state::<TritonInstance, _>(instance, sys::TRITONBACKEND_ModelInstanceState) }
        {
            Ok(inst) => {
                let transport = Instance::from_raw(instance, Some(&inst.completer));
                serve::execute(&inst.state, &transport, owned)
            }
            Err(e) => serve::fail_all(&Instance::from_raw(instance, None), owned, &e),
        }
        Ok(())
    }));
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::error!("execute failed: {e}"),
        Err(p) => log::error!("execute panicked: {}", panic_text(&*p)),
    }
    std::ptr::null_mut()
}
