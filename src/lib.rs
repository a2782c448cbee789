//! `libtriton_rust.so`: a Triton Inference Server backend written in Rust.
//!
//! The map (each room says in its module doc what it is for and what it must not touch):
//! - [`triton`]: Triton's C API, the only room with Triton pointers and `unsafe`;
//!   its `entry` submodule holds the `TRITONBACKEND_*` functions the server calls.
//! - [`serving`]: models, instances and the execute path, in safe code.
//! - [`batch`]: per-request checks, batch assembly and output scatter (pure logic).
//! - [`config`]: the model config, auto-complete, and checks against the model file.
//! - [`engine`]: the `Engine` trait and one room per engine (`onnx`).
//! - [`tensor`], [`error`]: the shared vocabulary.

pub mod batch;
pub mod config;
pub mod cuda;
pub mod embedding;
pub mod engine;
pub mod error;
pub mod os;
pub mod serving;
pub mod telemetry;
pub mod tensor;
pub mod triton;
