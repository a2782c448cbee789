//! Builds libtriton_rust_torch_cuda.so (src/stream_shim.cpp) next to the plugin: the
//! per-instance CUDA stream and CUDA graph helpers, linked against libtorch's c10_cuda. Needs
//! LIBTORCH (as tch does) and CUDA's runtime headers (the torch wheel's nvidia
//! packages have them; CUDA_HOME/include otherwise).
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/stream_shim.cpp");
    println!("cargo:rerun-if-changed=../abi/include/failed_capture.h");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let libtorch = PathBuf::from(
        std::env::var("LIBTORCH")
            .expect("LIBTORCH must point at libtorch (e.g. site-packages/torch)"),
    );
    let mut includes = vec![
        libtorch.join("include"),
        libtorch.join("include/torch/csrc/api/include"),
        // failed_capture.h, shared with the AOTInductor plugin
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../abi/include"),
    ];
    // CUDA's runtime (headers, and libcudart for cudaGetLastError)
    let cudart = match std::env::var("CUDA_HOME").map(PathBuf::from) {
        Ok(home) if home.join("include").exists() => {
            includes.push(home.join("include"));
            vec![format!("-L{}", home.join("lib64").display()), "-lcudart".to_string()]
        }
        // The torch wheel's dependencies: CUDA's runtime headers and library, and the
        // crt/ headers they include (shipped with the triton compiler wheel torch
        // depends on).
        _ => {
            includes.push(libtorch.join("../nvidia/cu13/include"));
            includes.push(libtorch.join("../triton/backends/nvidia/include"));
            vec![
                format!("-L{}", libtorch.join("../nvidia/cu13/lib").display()),
                "-l:libcudart.so.13".to_string(),
            ]
        }
    };
    // target/<profile>/ (OUT_DIR is target/<profile>/build/<crate>-<hash>/out)
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let profile_dir = out_dir.ancestors().nth(3).expect("target/<profile>").to_path_buf();
    let output = profile_dir.join("libtriton_rust_torch_cuda.so");
    let mut cmd = Command::new(std::env::var("CXX").unwrap_or_else(|_| "c++".into()));
    cmd.args([
        "-std=c++17",
        "-O2",
        "-shared",
        "-fPIC",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        "-DGLOG_USE_GLOG_EXPORT",
        "-Wno-interference-size",
    ]);
    for i in &includes {
        cmd.arg(format!("-I{}", i.display()));
    }
    cmd.arg("src/stream_shim.cpp");
    cmd.arg(format!("-L{}", libtorch.join("lib").display()));
    cmd.args(["-ltorch_cuda", "-ltorch_cpu", "-lc10_cuda", "-lc10"])
        .args(&cudart)
        .arg("-o")
        .arg(&output);
    let status = cmd.status().expect("running the C++ compiler");
    assert!(status.success(), "building libtriton_rust_torch_cuda.so failed");
}
