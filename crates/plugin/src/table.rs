//! The table a plugin exports: the core filled from its [`RuntimeModel`] through the shims,
//! and the extensions it adds.

use std::ffi::c_char;

use triton_rust_abi::{AotiApi, PluginApi, ABI_VERSION};

use crate::error::free_error;
use crate::shim::{free_model, load, run, RuntimeModel};

/// The table of a plugin whose models are `M`, whose runtime names itself through `runtime`,
/// with the AOTInductor extension when it has one.
pub const fn plugin_api<M: RuntimeModel>(
    runtime: unsafe extern "C" fn() -> *const c_char,
    aoti: Option<&'static AotiApi>,
) -> PluginApi {
    PluginApi {
        abi_version: ABI_VERSION,
        runtime,
        load: load::<M>,
        run: run::<M>,
        free_model: free_model::<M>,
        free_error,
        aoti,
    }
}

/// Exports `$api` (a constant [`PluginApi`], e.g. [`plugin_api`]'s) under the symbol the
/// backend looks for (`triton_rust_abi::ENTRY_SYMBOL`). Once per plugin library.
#[macro_export]
macro_rules! export_plugin_api {
    ($api:expr) => {
        /// The plugin's function table (`triton_rust_abi::ENTRY_SYMBOL`).
        #[no_mangle]
        pub extern "C" fn triton_rust_plugin_api() -> *const $crate::abi::PluginApi {
            static API: $crate::abi::PluginApi = $api;
            &API
        }
    };
}
