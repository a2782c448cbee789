//! The core room of libtriton_rust: everything between the server and the engines that
//! needs neither Triton's C API nor a GPU library nor an engine runtime.
//!
//! - [`tensor`], [`error`]: the shared vocabulary (data types, shapes, the one `Error`);
//!   where bytes live comes from the CUDA crate's handle vocabulary, re-exported here.
//! - [`config`]: the model config, auto-complete, and checks against the model file.
//! - [`batch`]: per-request checks, batch assembly and output scatter (pure logic).
//! - [`engine`]: the `Engine` trait every engine crate implements.
//! - [`settings`]: the core's and the backend's settings, typed once; the unknown-parameter warning.
//! - [`serve`]: models, instances and the execute path, generic over a `Transport`.
//! - [`telemetry`]: metrics vocabulary.
//!
//! Safe code only; logging goes through the `log` facade.

pub mod batch;
pub mod config;
pub mod engine;
pub mod error;
pub mod panic;
pub mod params;
pub mod serve;
pub mod settings;
pub mod telemetry;
pub mod tensor;

/// A GPU made of host memory, for tests of the serving path and of engines built on it.
pub mod fake_device;

pub use error::{Error, ErrorKind, Result, ResultExt};
