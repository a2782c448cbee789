//! The C ABI between `libtriton_rust.so` and an engine plugin loaded at run time.
//!
//! Why a plugin: libtorch is large and optional. The backend library links nothing
//! from it, so it loads and serves ONNX and embedding models on machines without
//! libtorch; `libtriton_rust_torch.so` (TorchScript; links libtorch through `tch`) is
//! opened only when a TorchScript model loads, `libtriton_rust_aoti.so` (AOTInductor
//! packages; C++ against whichever libtorch it was built with) when a `.pt2` model loads.
//! The sides share only these `#[repr(C)]`
//! types and the function table below; both are built from this crate (the plugins through
//! `triton_rust_plugin`, which fills the table), and [`ABI_VERSION`] guards against mixing
//! builds.
//!
//! Ownership: every pointer passed into a plugin call is borrowed for that call. A
//! model handle returned by `load` is freed with `free_model`; an error string
//! returned through `err` is freed with `free_error`.

/// The backend's side of the ABI: find libtorch, open the plugin, call it (feature `loader`).
#[cfg(feature = "loader")]
pub mod plugin;

pub mod graphs;
mod types;
pub mod worker;

pub use types::*;

pub use worker::panic_text;
