//! Builds libtriton_rust_torch_cuda.so (src/stream_shim.cpp) next to the plugin: the
//! per-instance CUDA stream and CUDA graph helpers, linked against libtorch's c10_cuda. Needs
//! LIBTORCH (as tch does) and CUDA's runtime headers (CUDA_HOME, or the torch wheel's nvidia
//! packages); triton_rust_plugin finds both.
use std::path::PathBuf;

use triton_rust_plugin::libtorch::Libtorch;

fn main() {
    println!("cargo:rerun-if-changed=src/stream_shim.cpp");
    let libtorch = Libtorch::from_env();
    let cuda = libtorch.cuda_runtime().expect(
        "the TorchScript plugin's CUDA shim needs CUDA's runtime headers: set CUDA_HOME, or install the torch wheel's nvidia packages",
    );
    // target/<profile>/ (OUT_DIR is target/<profile>/build/<crate>-<hash>/out)
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let profile_dir = out_dir.ancestors().nth(3).expect("target/<profile>").to_path_buf();
    let output = profile_dir.join("libtriton_rust_torch_cuda.so");
    // a shared library of its own, so the compiler links it (cc builds static archives)
    let mut cmd = libtorch.cxx("c++17", Some(&cuda)).get_compiler().to_command();
    cmd.args(["-shared", "src/stream_shim.cpp"])
        .args(libtorch.link_args(&["torch_cuda", "torch_cpu", "c10_cuda", "c10"], Some(&cuda)))
        .arg("-o")
        .arg(&output);
    let status = cmd.status().expect("running the C++ compiler");
    assert!(status.success(), "building libtriton_rust_torch_cuda.so failed");
}
