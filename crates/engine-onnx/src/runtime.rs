//! The process's ONNX Runtime: which library is loaded, and its environment.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use triton_rust_core::error::{Error, Result};
use triton_rust_core::settings::BackendSettings;

use crate::settings::{OnnxBackend, OnnxSettings};

pub(crate) const STOCK_LIBRARY: &str = "/opt/tritonserver/backends/onnxruntime/libonnxruntime.so";

/// The environment variables naming it, in the order they are tried.
pub(crate) const ENVIRONMENT: &[&str] = &["TRITON_RUST_ONNXRUNTIME_LIBRARY", "ORT_DYLIB_PATH"];

pub(crate) fn ort_err(e: impl std::fmt::Display) -> Error {
    runtime_error(format!("ONNX Runtime: {e}"))
}

/// An ONNX Runtime failure as our error. Its CUDA provider reports a sticky CUDA error only
/// as text: that is a lost device ([`ErrorKind::DeviceLost`](triton_rust_core::ErrorKind)),
/// anything else an engine failure.
pub(crate) fn runtime_error(message: String) -> Error {
    if triton_rust_cuda::sticky_error_in(&message) {
        Error::device_lost(message)
    } else {
        Error::internal(message)
    }
}

/// The process's ONNX Runtime: which library, and its environment.
pub(crate) struct Runtime {
    library: PathBuf,
    pub(crate) env: ort::environment::Environment,
}

// ONNX Runtime itself is one per process (`ort::init_from` commits a process-wide
// library and environment), so the record of which one was loaded is process-wide too.
static RUNTIME: Mutex<Option<Arc<Runtime>>> = Mutex::new(None);

/// Where the library comes from, in priority order, for the error message too.
/// Also says whether the choice was explicit (model parameter or backend setting): an
/// explicit path is never silently replaced by another.
fn library_candidates(
    settings: &OnnxSettings,
    backend: &BackendSettings,
) -> (Vec<(String, PathBuf)>, bool) {
    let mut c = Vec::new();
    if let Some(p) = &settings.library {
        c.push(("model parameter 'onnxruntime_library'".into(), p.clone()));
        return (c, true);
    }
    let keys: OnnxBackend = triton_rust_core::params::read(&backend.cmdline).unwrap_or_default();
    if let Some(p) = keys.onnxruntime_library {
        c.push(("--backend-config=rust,onnxruntime-library".into(), p));
        return (c, true);
    }
    for var in ENVIRONMENT {
        if let Some(p) = backend.env(var) {
            c.push((format!("environment variable {var}"), PathBuf::from(p)));
        }
    }
    c.push(("the stock Triton image location".into(), PathBuf::from(STOCK_LIBRARY)));
    (c, false)
}

pub(crate) fn runtime(settings: &OnnxSettings, backend: &BackendSettings) -> Result<Arc<Runtime>> {
    let (candidates, explicit) = library_candidates(settings, backend);
    let mut slot = RUNTIME.lock().map_err(|_| Error::internal("ONNX Runtime lock poisoned"))?;
    let found = candidates.iter().find(|(_, p)| p.is_file());
    let Some((source, path)) = found else {
        let tried: Vec<String> =
            candidates.iter().map(|(s, p)| format!("'{}' ({s})", p.display())).collect();
        let hint = if settings.library.is_some() {
            "Fix the model parameter 'onnxruntime_library' (an absolute path to libonnxruntime.so)"
        } else {
            "Set --backend-config=rust,onnxruntime-library=<absolute path to libonnxruntime.so>"
        };
        return Err(Error::unavailable(format!(
            "ONNX Runtime library not found: tried {}. {hint}",
            tried.join(", ")
        )));
    };
    if !path.is_absolute() {
        return Err(Error::invalid_arg(format!(
            "ONNX Runtime library path '{}' ({source}) must be absolute",
            path.display()
        )));
    }
    let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
    if let Some(rt) = slot.as_ref() {
        if rt.library == canonical || !explicit {
            return Ok(rt.clone());
        }
        return Err(Error::unavailable(format!(
            "ONNX Runtime is already loaded from '{}'; '{}' ({source}) cannot be loaded beside it (one ONNX Runtime per server process)",
            rt.library.display(),
            canonical.display()
        )));
    }
    let builder = ort::init_from(&canonical).map_err(|e| {
        Error::unavailable(format!(
            "cannot load ONNX Runtime from '{}' ({source}): {e}",
            canonical.display()
        ))
    })?;
    let env = builder.with_name("triton_rust").build().map_err(ort_err)?;
    log::info!("ONNX Runtime loaded from '{}' ({source})", canonical.display());
    let rt = Arc::new(Runtime { library: canonical, env });
    *slot = Some(rt.clone());
    Ok(rt)
}
