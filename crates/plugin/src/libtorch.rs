//! For a plugin's build script (feature `build`): the libtorch `LIBTORCH` names (a libtorch
//! directory: a torch wheel's site-packages/torch, or NVIDIA's PyTorch image's), CUDA's
//! runtime beside it, and C++ compiled and linked against both.

use std::path::{Path, PathBuf};

/// Where the ABI's C++ header lives (`failed_capture.h`, which both plugins compile).
fn abi_include() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../abi/include")
}

/// A libtorch to build against.
pub struct Libtorch {
    root: PathBuf,
}

/// CUDA's runtime: its headers, its library's directory and its name for `-l`.
pub struct CudaRuntime {
    pub include: PathBuf,
    pub lib_dir: PathBuf,
    /// `cudart`, or `:libcudart.so.<n>` for the torch wheel's versioned file.
    pub link_name: String,
}

impl Libtorch {
    /// The libtorch `LIBTORCH` names (as tch reads it); the build script runs again when it,
    /// `CUDA_HOME` or the ABI's C++ header changes.
    pub fn from_env() -> Libtorch {
        println!("cargo:rerun-if-env-changed=LIBTORCH");
        println!("cargo:rerun-if-env-changed=CUDA_HOME");
        println!("cargo:rerun-if-changed={}", abi_include().join("failed_capture.h").display());
        let root = std::env::var("LIBTORCH")
            .expect("LIBTORCH must point at libtorch (e.g. site-packages/torch)");
        Libtorch { root: PathBuf::from(root) }
    }

    pub fn lib_dir(&self) -> PathBuf {
        self.root.join("lib")
    }

    /// Whether this libtorch has its CUDA part.
    pub fn has_cuda(&self) -> bool {
        self.lib_dir().join("libtorch_cuda.so").is_file()
    }

    /// CUDA's runtime: `CUDA_HOME`'s, else the torch wheel's nvidia packages'.
    pub fn cuda_runtime(&self) -> Option<CudaRuntime> {
        if let Ok(home) = std::env::var("CUDA_HOME").map(PathBuf::from) {
            if home.join("include/cuda_runtime_api.h").is_file() {
                return Some(CudaRuntime {
                    include: home.join("include"),
                    lib_dir: home.join("lib64"),
                    link_name: "cudart".into(),
                });
            }
        }
        let nvidia = self.root.join("../nvidia");
        for sub in ["cu13", "cuda_runtime"] {
            let root = nvidia.join(sub);
            if root.join("include/cuda_runtime_api.h").is_file() {
                let lib_dir = root.join("lib");
                let name = std::fs::read_dir(&lib_dir)
                    .ok()?
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .find(|n| n.starts_with("libcudart.so."))?;
                return Some(CudaRuntime {
                    include: root.join("include"),
                    lib_dir,
                    link_name: format!(":{name}"),
                });
            }
        }
        None
    }

    /// C++ of standard `std` against this libtorch (and `cuda`'s headers when given): its
    /// headers and the ABI's, the definitions its headers expect, its own warnings quiet.
    pub fn cxx(&self, std: &str, cuda: Option<&CudaRuntime>) -> cc::Build {
        let mut build = cc::Build::new();
        build
            .cpp(true)
            .std(std)
            .include(self.root.join("include"))
            .include(self.root.join("include/torch/csrc/api/include"))
            .include(abi_include())
            .define("_GLIBCXX_USE_CXX11_ABI", "1")
            .define("GLOG_USE_GLOG_EXPORT", None)
            .flag_if_supported("-Wno-unused-parameter")
            .flag_if_supported("-Wno-interference-size")
            .warnings(false);
        if let Some(cuda) = cuda {
            build.include(&cuda.include);
            // the crt/ headers CUDA's runtime headers include: in the torch wheel, shipped
            // with the triton compiler wheel torch depends on
            let crt = self.root.join("../triton/backends/nvidia/include");
            if crt.is_dir() {
                build.include(crt);
            }
        }
        build
    }

    /// Linker arguments for libtorch's `libs` (e.g. `torch_cpu`) and `cuda`'s runtime, for
    /// a library the build script links itself.
    pub fn link_args(&self, libs: &[&str], cuda: Option<&CudaRuntime>) -> Vec<String> {
        let mut args = vec![format!("-L{}", self.lib_dir().display())];
        args.extend(libs.iter().map(|l| format!("-l{l}")));
        if let Some(cuda) = cuda {
            args.push(format!("-L{}", cuda.lib_dir.display()));
            args.push(format!("-l{}", cuda.link_name));
        }
        args
    }

    /// Links the crate being built to libtorch's `libs` and `cuda`'s runtime.
    pub fn link(&self, libs: &[&str], cuda: Option<&CudaRuntime>) {
        if let Some(cuda) = cuda {
            println!("cargo:rustc-link-search=native={}", cuda.lib_dir.display());
            println!("cargo:rustc-link-arg=-l{}", cuda.link_name);
        }
        println!("cargo:rustc-link-search=native={}", self.lib_dir().display());
        for l in libs {
            println!("cargo:rustc-link-lib=dylib={l}");
        }
    }
}
