//! The core room of libtriton_rust: everything between the server and the engines that
//! needs neither Triton's C API nor a GPU library nor an engine runtime.
//!
//! - [`tensor`], [`error`]: the shared vocabulary (data types, shapes, the one `Error`);
//!   where bytes live comes from the CUDA crate's handle vocabulary, re-exported here.
//! - [`config`]: the model config, auto-complete, and checks against the model file.
//! - [`batch`]: per-request checks, batch assembly and output scatter (pure logic).
//! - [`engine`]: the `Engine` trait every engine crate implements.
//! - [`serve`]: models, instances and the execute path, generic over a `Transport`.
//! - [`telemetry`]: metrics vocabulary.
//!
//! Safe code only; logging goes through the `log` facade.
#![forbid(unsafe_code)]

pub mod batch;
pub mod chain;
pub mod config;
pub mod engine;
pub mod error;
pub mod serve;
pub mod telemetry;
pub mod tensor;

#[cfg(test)]
mod fake_device;

pub use error::{Error, ErrorKind, Result, ResultExt};
