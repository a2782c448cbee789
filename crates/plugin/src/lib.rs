//! The plugin side of the plugin ABI (`triton_rust_abi`), shared by both torch plugins
//! (`libtriton_rust_torch.so`, `libtriton_rust_aoti.so`): a plugin implements
//! [`RuntimeModel`] and exports [`plugin_api`]'s table with [`export_plugin_api!`]; the
//! core table's entries (load, the nine-argument run, free) are the shims of `shim.rs`.
//! With feature `build`, its build script finds libtorch and CUDA's runtime here
//! (`libtorch.rs`). It knows no libtorch API itself, so it builds without one.

pub mod error;
pub mod shim;
pub mod table;

#[cfg(feature = "build")]
pub mod libtorch;

pub use error::{set_err, with_error};
pub use shim::{model_of, run_status, Load, Outputs, RuntimeModel};
pub use table::plugin_api;
/// For [`export_plugin_api!`]'s expansion.
pub use triton_rust_abi as abi;
