//! Compiles src/runtime.cpp (and src/modules.cpp, the package's CUDA modules) against the
//! libtorch `LIBTORCH` names (a libtorch directory: a torch wheel's site-packages/torch, or
//! NVIDIA's PyTorch image's) and links the plugin to it. With libtorch's CUDA libraries there
//! (and CUDA's runtime headers: CUDA_HOME, or the torch wheel's nvidia packages) the GPU paths
//! are built too (TRA_CUDA).
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=src/runtime.cpp");
    println!("cargo:rerun-if-changed=src/modules.cpp");
    println!("cargo:rerun-if-changed=../abi/include/failed_capture.h");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let libtorch = PathBuf::from(
        std::env::var("LIBTORCH")
            .expect("LIBTORCH must point at libtorch (e.g. site-packages/torch)"),
    );
    let lib = libtorch.join("lib");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        // torch 2.12 and later need C++20; earlier releases build with it too
        .std("c++20")
        .file("src/runtime.cpp")
        .file("src/modules.cpp")
        .include(libtorch.join("include"))
        .include(libtorch.join("include/torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-interference-size")
        .warnings(false);
    let mut links = vec!["torch", "torch_cpu", "c10"];
    let cuda = cuda_runtime(&libtorch).filter(|_| lib.join("libtorch_cuda.so").is_file());
    if let Some((include, libdir, cudart)) = &cuda {
        // failed_capture.h (shared with the TorchScript plugin)
        build
            .define("TRA_CUDA", None)
            .include(include)
            .include(Path::new(env!("CARGO_MANIFEST_DIR")).join("../abi/include"));
        for extra in [libtorch.join("../triton/backends/nvidia/include")] {
            if extra.is_dir() {
                build.include(extra);
            }
        }
        links.extend(["torch_cuda", "c10_cuda"]);
        println!("cargo:rustc-link-search=native={}", libdir.display());
        println!("cargo:rustc-link-arg=-l{cudart}");
    }
    build.compile("tra_runtime");
    println!("cargo:rustc-link-search=native={}", lib.display());
    for l in links {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
}

/// CUDA's runtime headers, library directory and link name: CUDA_HOME's, else the torch
/// wheel's nvidia packages'.
fn cuda_runtime(libtorch: &Path) -> Option<(PathBuf, PathBuf, String)> {
    if let Ok(home) = std::env::var("CUDA_HOME").map(PathBuf::from) {
        if home.join("include/cuda_runtime_api.h").is_file() {
            return Some((home.join("include"), home.join("lib64"), "cudart".into()));
        }
    }
    let nvidia = libtorch.join("../nvidia");
    for sub in ["cu13", "cuda_runtime"] {
        let root = nvidia.join(sub);
        if root.join("include/cuda_runtime_api.h").is_file() {
            let libdir = root.join("lib");
            let name = std::fs::read_dir(&libdir)
                .ok()?
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .find(|n| n.starts_with("libcudart.so."))?;
            return Some((root.join("include"), libdir, format!(":{name}")));
        }
    }
    None
}
