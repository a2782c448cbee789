//! Logging through Triton's own logger (`TRITONSERVER_LogMessage`), so our lines
//! appear in the server log with Triton's levels and `--log-verbose` applies. Every
//! crate of the backend logs through the `log` facade; [`install`] points it here.
//!
//! `TRITON_RUST_TIMING=1` in the server's environment logs the backend's `timing:` lines
//! (where each batch's time goes) at INFO without `--log-verbose`: Triton's own verbose
//! lines (several per request) slow the request handling that the timing is meant to show.

use std::ffi::{c_void, CStr};
use std::os::raw::{c_char, c_int};
use std::sync::OnceLock;

use crate::ffi::{c_string, sys};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
    Verbose,
}

impl Level {
    fn raw(self) -> sys::TRITONSERVER_LogLevel {
        match self {
            Level::Info => sys::TRITONSERVER_loglevel_enum_TRITONSERVER_LOG_INFO,
            Level::Warn => sys::TRITONSERVER_loglevel_enum_TRITONSERVER_LOG_WARN,
            Level::Error => sys::TRITONSERVER_loglevel_enum_TRITONSERVER_LOG_ERROR,
            Level::Verbose => sys::TRITONSERVER_loglevel_enum_TRITONSERVER_LOG_VERBOSE,
        }
    }
}

/// Triton's logging functions, looked up in the running process rather than linked:
/// inside tritonserver they are there; in unit tests, benchmarks and tools built from
/// this crate they are not, and lines go to stderr instead.
struct Logger {
    is_enabled: unsafe extern "C" fn(sys::TRITONSERVER_LogLevel) -> bool,
    message: unsafe extern "C" fn(
        sys::TRITONSERVER_LogLevel,
        *const c_char,
        c_int,
        *const c_char,
    ) -> *mut sys::TRITONSERVER_Error,
    error_delete: unsafe extern "C" fn(*mut sys::TRITONSERVER_Error),
}

fn logger() -> Option<&'static Logger> {
    static LOGGER: OnceLock<Option<Logger>> = OnceLock::new();
    LOGGER
        .get_or_init(|| {
            let find = |name: &CStr| {
                // SAFETY: dlsym with RTLD_DEFAULT only looks a symbol up.
                let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
                (!p.is_null()).then_some(p)
            };
            let (e, m, d) = (
                find(c"TRITONSERVER_LogIsEnabled")?,
                find(c"TRITONSERVER_LogMessage")?,
                find(c"TRITONSERVER_ErrorDelete")?,
            );
            // SAFETY: these are Triton's functions with the signatures of tritonserver.h.
            unsafe {
                Some(Logger {
                    is_enabled: std::mem::transmute::<
                        *mut c_void,
                        unsafe extern "C" fn(sys::TRITONSERVER_LogLevel) -> bool,
                    >(e),
                    message: std::mem::transmute::<
                        *mut c_void,
                        unsafe extern "C" fn(
                            sys::TRITONSERVER_LogLevel,
                            *const c_char,
                            c_int,
                            *const c_char,
                        )
                            -> *mut sys::TRITONSERVER_Error,
                    >(m),
                    error_delete: std::mem::transmute::<
                        *mut c_void,
                        unsafe extern "C" fn(*mut sys::TRITONSERVER_Error),
                    >(d),
                })
            }
        })
        .as_ref()
}

fn enabled(level: Level) -> bool {
    match logger() {
        // SAFETY: a pure query.
        Some(l) => unsafe { (l.is_enabled)(level.raw()) },
        None => level != Level::Verbose,
    }
}

pub fn log(level: Level, file: &str, line: u32, message: &str) {
    let Some(l) = logger() else {
        eprintln!("[{level:?} {file}:{line}] {message}");
        return;
    };
    let (file, msg) = (c_string(file), c_string(message));
    // SAFETY: Triton copies both strings; a logging failure has nowhere to go but away.
    unsafe {
        let err = (l.message)(level.raw(), file.as_ptr(), line as c_int, msg.as_ptr());
        if !err.is_null() {
            (l.error_delete)(err);
        }
    }
}

fn level_of(level: log::Level) -> Level {
    match level {
        log::Level::Error => Level::Error,
        log::Level::Warn => Level::Warn,
        log::Level::Info => Level::Info,
        log::Level::Debug | log::Level::Trace => Level::Verbose,
    }
}

/// Whether `TRITON_RUST_TIMING` asks for the timing lines at INFO (read once).
fn timing_lines() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TRITON_RUST_TIMING").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// The `log` facade's sink for every crate of the backend: Triton's log inside the
/// server (`--log-verbose` shows debug lines), stderr outside it.
struct TritonLog;

impl log::Log for TritonLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        let level = level_of(metadata.level());
        enabled(level) || (level == Level::Verbose && timing_lines())
    }

    fn log(&self, record: &log::Record<'_>) {
        // its own level where Triton logs that level; a debug record that is a timing line at
        // INFO under TRITON_RUST_TIMING; else nowhere (formatted only where it may go)
        let level = level_of(record.level());
        let own = enabled(level);
        let timing = level == Level::Verbose && timing_lines();
        if !own && !timing {
            return;
        }
        let message = record.args().to_string();
        let level = if own {
            level
        } else if message.starts_with("timing:") {
            Level::Info
        } else {
            return;
        };
        log(level, record.file().unwrap_or("<unknown>"), record.line().unwrap_or(0), &message);
    }

    fn flush(&self) {}
}

/// Installs the logger (once per process; later calls do nothing).
pub fn install() {
    static LOGGER: TritonLog = TritonLog;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Trace);
    }
}

/// Routes panic messages into Triton's log instead of stderr. The panic is still
/// caught at the entry point; this makes sure its message and location are kept.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let (file, line) = info.location().map_or(("<unknown>", 0), |l| (l.file(), l.line()));
        let payload = triton_rust_core::panic::panic_text(info.payload());
        log(Level::Error, file, line, &format!("rust backend panicked: {payload}"));
    }));
}
