//! `libtriton_rust.so`: a Triton Inference Server backend written in Rust.
//!
//! This crate is the Triton room and nothing else: the only code that touches
//! Triton's C API. Three layers, as cudarc does for CUDA: `sys` (the `triton-sys`
//! bindings) and the conversions in [`ffi`]; the safe types whose `Drop`s encode who
//! releases what ([`request`]: requests, responses, the instance's statistics;
//! [`message`]; [`metrics`]; [`log`], the `log` facade's sink); and [`entry`], the
//! `TRITONBACKEND_*` functions Triton calls, each catching panics. [`engines`] names
//! the engine kinds for the core (`EngineKinds`). The serving logic itself is
//! `triton_rust_core::serve`, which reaches Triton only through the `Transport`
//! implemented in [`request`]. README "Map" shows every room.

mod engines;
mod entry;
mod ffi;
pub mod log;
mod message;
mod metrics;
mod request;
