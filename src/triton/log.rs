//! Logging through Triton's own logger (`TRITONSERVER_LogMessage`), so our lines
//! appear in the server log with Triton's levels and `--log-verbose` applies.

#[cfg(not(test))]
use super::c_string;
use super::sys;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
    Verbose,
}

impl Level {
    #[cfg_attr(test, allow(dead_code))]
    fn raw(self) -> sys::TRITONSERVER_LogLevel {
        match self {
            Level::Info => sys::TRITONSERVER_loglevel_enum_TRITONSERVER_LOG_INFO,
            Level::Warn => sys::TRITONSERVER_loglevel_enum_TRITONSERVER_LOG_WARN,
            Level::Error => sys::TRITONSERVER_loglevel_enum_TRITONSERVER_LOG_ERROR,
            Level::Verbose => sys::TRITONSERVER_loglevel_enum_TRITONSERVER_LOG_VERBOSE,
        }
    }
}

#[cfg(not(test))]
pub fn enabled(level: Level) -> bool {
    // SAFETY: a pure query.
    unsafe { sys::TRITONSERVER_LogIsEnabled(level.raw()) }
}

/// Unit tests run without a server to resolve Triton's symbols: log to stderr.
#[cfg(test)]
pub fn enabled(level: Level) -> bool {
    level != Level::Verbose
}

#[cfg(test)]
pub fn log(level: Level, file: &str, line: u32, message: &str) {
    eprintln!("[{level:?} {file}:{line}] {message}");
}

#[cfg(not(test))]
pub fn log(level: Level, file: &str, line: u32, message: &str) {
    if !enabled(level) {
        return;
    }
    let file = c_string(file);
    let msg = c_string(message);
    // SAFETY: Triton copies both strings. A logging failure has nowhere to go.
    let err = unsafe { sys::TRITONSERVER_LogMessage(level.raw(), file.as_ptr(), line as i32, msg.as_ptr()) };
    let _ = super::check(err);
}

#[macro_export]
macro_rules! log_at {
    ($level:expr, $($arg:tt)*) => {
        if $crate::triton::log::enabled($level) {
            $crate::triton::log::log($level, file!(), line!(), &format!($($arg)*))
        }
    };
}
#[macro_export]
macro_rules! log_info { ($($arg:tt)*) => { $crate::log_at!($crate::triton::log::Level::Info, $($arg)*) }; }
#[macro_export]
macro_rules! log_warn { ($($arg:tt)*) => { $crate::log_at!($crate::triton::log::Level::Warn, $($arg)*) }; }
#[macro_export]
macro_rules! log_error { ($($arg:tt)*) => { $crate::log_at!($crate::triton::log::Level::Error, $($arg)*) }; }
#[macro_export]
macro_rules! log_verbose { ($($arg:tt)*) => { $crate::log_at!($crate::triton::log::Level::Verbose, $($arg)*) }; }

/// Routes panic messages into Triton's log instead of stderr. The panic is still
/// caught at the entry point; this makes sure its message and location are kept.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let (file, line) = info.location().map_or(("<unknown>", 0), |l| (l.file(), l.line()));
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "<non-string panic payload>".into());
        log(Level::Error, file, line, &format!("rust backend panicked: {payload}"));
    }));
}
