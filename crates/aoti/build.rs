//! Compiles the C++ side (src/package.cpp, src/run.cpp, src/graphs.cpp around
//! src/runtime.h, and src/modules.cpp, the package's CUDA modules) against the libtorch
//! `LIBTORCH` names and links the plugin to it; triton_rust_plugin finds libtorch and CUDA's
//! runtime. With libtorch's CUDA libraries there (and CUDA's runtime headers: CUDA_HOME, or
//! the torch wheel's nvidia packages) the GPU paths are built too (TRA_CUDA).
use triton_rust_plugin::libtorch::Libtorch;

const SOURCES: [&str; 4] = ["src/package.cpp", "src/run.cpp", "src/graphs.cpp", "src/modules.cpp"];

fn main() {
    for f in SOURCES.iter().chain(&["src/runtime.h"]) {
        println!("cargo:rerun-if-changed={f}");
    }
    let libtorch = Libtorch::from_env();
    let cuda = libtorch.cuda_runtime().filter(|_| libtorch.has_cuda());
    // torch 2.12 and later need C++20; earlier releases build with it too
    let mut build = libtorch.cxx("c++20", cuda.as_ref());
    build.files(SOURCES);
    let mut links = vec!["torch", "torch_cpu", "c10"];
    if cuda.is_some() {
        build.define("TRA_CUDA", None);
        links.extend(["torch_cuda", "c10_cuda"]);
    }
    build.compile("tra_runtime");
    libtorch.link(&links, cuda.as_ref());
}
