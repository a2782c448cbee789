// Loading an AOTInductor package with torch::inductor::AOTIModelPackageLoader (on the CPU,
// or on a GPU instance's own stream), what it says of itself (the refusals by device kind,
// compute capability and CPU instruction set; its call spec), and freeing it, the directory
// the loader unpacked it into removed with it.
#include "runtime.h"

#ifdef TRA_CUDA
// Declared in ATen/cuda/CUDAContextLight.h, whose includes need CUDA library headers the
// torch wheel does not ship; the declaration is all we need.
namespace at::cuda {
void clearCublasWorkspaces();
}
#endif

// modules.cpp
extern "C" {
void* tra_modules_track(const char* lib_dir, const char* driver_lib, int* routed, char* err, size_t len);
int tra_modules_release(void* tracker);
}

using namespace tra;

namespace {

// Set when the process runs its exit handlers. A host that embeds Triton (perf_analyzer's C
// API mode) may delete the server from a static destructor, after libtorch's own statics are
// gone: a CUDA graph's destructor then finds no generator state, throws, and the process
// terminates. Registered at the first load, after the host's statics and before any graph
// exists, this handler runs before a host's static destructor frees a model; tra_free then
// leaves libtorch's objects to the exiting process.
std::atomic<bool> exiting{false};

void note_exiting() { exiting = true; }

void watch_exit() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(note_exiting); });
}

// The files mapped into this process that lie inside an unpacked package.
std::set<std::string> mapped_package_files() {
  std::set<std::string> found;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    auto path = line.substr(slash);
    if (path.find("/data/aotinductor/") != std::string::npos) found.insert(path);
  }
  return found;
}

// Loads the package, and finds the directory the loader unpacked it into: libtorch's
// loader extracts the package's libraries to a fresh temporary directory and leaves it
// behind, so the plugin removes it at unload. Its library is the one file newly mapped by
// this load (loads hold `loading()`, so that no other load maps one meanwhile); the
// directory is what comes before the package's own `<name>/data/aotinductor/` path.
// Held by every load, from reading the package's metadata to the end of the loader's
// construction, so that no two threads read packages through libtorch at once (Triton loads
// models in parallel). Before, with only the construction held, a server loading three CPU
// packages at start failed twice in about 25 starts: a corrupted metadata read ("type must
// be string, but is null") and a segfault in two load threads at once; rare enough that 24
// further starts did not show it again.
std::mutex& loading() {
  static std::mutex m;
  return m;
}

// The folders directly inside the temporary directories the loader may unpack into.
std::set<std::string> temp_folders() {
  std::set<std::string> found;
  std::error_code ec;
  auto tmp = std::filesystem::temp_directory_path(ec);
  for (const auto& root : {std::filesystem::path("/tmp"), tmp}) {
    if (root.empty()) continue;
    for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
      if (e.is_directory(ec)) found.insert(e.path().string());
    }
  }
  return found;
}

// Removes the folders made since `before` that hold package `path` unpacked: one of the
// package's libraries under `<folder>/<top>/` (libtorch's reader names the records without
// the archive's top folder). Another process's folders never hold this package's files.
void remove_unpacked_since(const std::set<std::string>& before, const char* path) {
  std::vector<std::string> libraries;
  try {
    for (const auto& r : caffe2::serialize::PyTorchStreamReader(path).getAllRecords()) {
      if (r.size() > 3 && r.compare(r.size() - 3, 3, ".so") == 0) libraries.push_back(r);
    }
  } catch (const std::exception&) {
    return;
  }
  std::error_code ec;
  for (const auto& folder : temp_folders()) {
    if (before.count(folder)) continue;
    bool ours = false;
    for (const auto& top : std::filesystem::directory_iterator(folder, ec)) {
      for (const auto& lib : libraries) ours = ours || std::filesystem::exists(top.path() / lib, ec);
    }
    if (ours) std::filesystem::remove_all(folder, ec);
  }
}

std::unique_ptr<torch::inductor::AOTIModelPackageLoader> load_package(const char* path, int device,
                                                                       std::string* unpacked) {
  auto before = mapped_package_files();
  auto folders_before = temp_folders();
  // run_single_threaded: without the container's own pool of model copies and its CUDA
  // event bookkeeping, which a graph capture cannot hold (an instance runs one batch at a
  // time anyway)
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  try {
    loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path, "model", true, 1,
                                                                       static_cast<c10::DeviceIndex>(device));
  } catch (...) {
    // the loader unpacks the package before it opens the library; a failure after that
    // (a library that does not open, constants that do not fit) leaves the folder behind
    remove_unpacked_since(folders_before, path);
    throw;
  }
  for (const auto& file : mapped_package_files()) {
    if (before.count(file)) continue;
    auto data = file.find("/data/aotinductor/");
    auto root = file.rfind('/', data - 1);
    auto tmp = std::filesystem::temp_directory_path().string();
    std::string dir = root == std::string::npos ? std::string() : file.substr(0, root);
    // only ever a directory directly inside a temporary directory
    auto parent = std::filesystem::path(dir).parent_path().string();
    if (!dir.empty() && (parent == tmp || parent == "/tmp")) *unpacked = dir;
    break;
  }
  return loader;
}

#ifdef TRA_CUDA
// Routes the package library's CUDA module loads through modules.cpp, so that its kernels
// are unloaded with it. A package whose modules cannot be tracked still serves; its reloads
// leave its kernels' code in GPU memory, and the log says so.
void track_modules(Model& m) {
  if (m.unpacked.empty()) return;
  char why[512] = {0};
  int routed = 0;
  m.modules = tra_modules_track(m.unpacked.c_str(), "libcuda.so.1", &routed, why, sizeof why);
  if (!m.log) return;
  if (m.modules) {
    m.log(LOG_INFO, ("AOTInductor package: its CUDA module loads are tracked (" + std::to_string(routed) +
                     " import slots), to be unloaded with the model").c_str());
  } else if (why[0]) {
    m.log(LOG_WARN, (std::string("AOTInductor package: its CUDA modules cannot be tracked (") + why +
                     "); each reload of it leaves its kernels' code in GPU memory").c_str());
  }
}
#endif

// The compute capability of GPU `device` as major*10+minor, or -1.
int compute_capability(int device) {
#ifdef TRA_CUDA
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return major * 10 + minor;
#else
  (void)device;
  return -1;
#endif
}

// The instruction sets of `isa` (AOTI_CPU_ISA: Inductor's names for what a CPU package's
// kernels were compiled for, e.g. "AVX512 AVX512_VNNI") that this CPU lacks. Its kernels
// would stop the server with an illegal instruction at the first request.
std::string missing_isa(const std::string& isa) {
  std::string missing;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
  __builtin_cpu_init();
  std::istringstream words(isa);
  std::string w;
  while (words >> w) {
    bool has = true;
    if (w == "AVX2") {
      has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    } else if (w == "AVX512") {
      has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    } else if (w == "AVX512_VNNI") {
      has = __builtin_cpu_supports("avx512vnni");
    } else if (w == "AMX_TILE") {
      has = __builtin_cpu_supports("amx-tile");
    }
    if (!has) missing += (missing.empty() ? "" : " ") + w;
  }
#else
  (void)isa;
#endif
  return missing;
}

// Why the package cannot run on this instance (empty: it can), from the metadata
// AOTInductor writes into it: the device it was compiled for; on a GPU its compute
// capability, on the CPU the instruction sets its kernels use.
std::string refusal(const char* path, int gpu) {
  auto meta = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path, "model");
  auto key = meta.count("AOTI_DEVICE_KEY") ? meta["AOTI_DEVICE_KEY"] : std::string();
  if (gpu < 0 && key != "cpu" && !key.empty()) {
    return "the package was compiled for '" + key +
           "', not for the CPU: serve it from a KIND_GPU instance, or export it again with CPU inputs "
           "for a KIND_CPU instance";
  }
  if (gpu >= 0 && key == "cpu") {
    return "the package was compiled for the CPU: serve it from a KIND_CPU instance, or export it again "
           "with CUDA inputs for a KIND_GPU instance";
  }
  if (key == "cpu") {
    auto isa = meta.count("AOTI_CPU_ISA") ? meta["AOTI_CPU_ISA"] : std::string();
    auto missing = missing_isa(isa);
    if (!missing.empty()) {
      return "the package's kernels were compiled for a CPU with " + isa + ", and this CPU lacks " + missing +
             ": export it again on a machine of the kind that serves it";
    }
  }
  auto want = meta.count("AOTI_COMPUTE_CAPABILITY") ? meta["AOTI_COMPUTE_CAPABILITY"] : std::string();
  if (gpu >= 0 && !want.empty()) {
    int have = compute_capability(gpu);
    if (have >= 0 && std::to_string(have) != want) {
      return "the package was compiled for GPUs of compute capability " + want + ", and GPU " +
             std::to_string(gpu) + " has compute capability " + std::to_string(have) +
             ": export it again on this kind of GPU";
    }
  }
  return "";
}

}  // namespace

extern "C" {

const char* tra_runtime() {
#ifdef TRA_CUDA
  return "libtorch " TORCH_VERSION " (AOTInductor, CUDA)";
#else
  return "libtorch " TORCH_VERSION " (AOTInductor, CPU only)";
#endif
}

// Loads the package at `path` on the CPU (gpu < 0) or on GPU `gpu` with a stream of its
// own; `graphs` non-zero: runs asked to go through a graph capture one per input shape.
void* tra_load(const char* path, int gpu, int graphs, Log log, char* err, size_t len) {
  try {
    watch_exit();
    std::lock_guard<std::mutex> lock(loading());
    auto why = refusal(path, gpu);
    if (!why.empty()) {
      put(err, len, why);
      return nullptr;
    }
    auto m = std::make_unique<Model>();
    m->log = log;
    if (gpu >= 0) {
#ifdef TRA_CUDA
      m->device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(gpu));
      c10::cuda::CUDAGuard device_guard(m->device);
      // above the GPU's in-place miss reads when they yield to the network
      // (TRITON_RUST_GPU_READS_YIELD=1, crates/cuda/src/cache/batch_host.rs), else the
      // pool's default priority
      const char* yield = std::getenv("TRITON_RUST_GPU_READS_YIELD");
      const bool above = yield != nullptr && std::string(yield) == "1";
      m->stream = std::make_unique<c10::cuda::CUDAStream>(
          c10::cuda::getStreamFromPool(above, static_cast<c10::DeviceIndex>(gpu)));
      m->graphs = graphs != 0;
      if (m->graphs) m->pool = at::cuda::graph_pool_handle();
      c10::cuda::CUDAStreamGuard stream_guard(*m->stream);
      m->loader = load_package(path, gpu, &m->unpacked);
      track_modules(*m);
#else
      (void)graphs;
      put(err, len, "this libtriton_rust_aoti.so was built against a libtorch without CUDA: KIND_GPU instances need one built against a CUDA libtorch");
      return nullptr;
#endif
    } else {
      m->loader = load_package(path, -1, &m->unpacked);
    }
    return m.release();
  } catch (const c10::Error& e) {
    put(err, len, e.what_without_backtrace());  // libtorch's own message, not its stack
  } catch (const std::exception& e) {
    put(err, len, e.what());
  } catch (...) {
    put(err, len, "unknown error while loading the package");
  }
  return nullptr;
}

// The call spec as JSON text (`["<in_spec>", "<out_spec>"]`), malloc'ed; null on failure.
char* tra_call_spec(void* model, char* err, size_t len) {
  try {
    auto spec = static_cast<Model*>(model)->loader->get_call_spec();
    std::string json = "[";
    for (size_t i = 0; i < spec.size(); ++i) {
      if (i) json += ",";
      json += "\"";
      for (char c : spec[i]) {
        if (c == '"' || c == '\\') json += '\\';
        json += c;
      }
      json += "\"";
    }
    json += "]";
    return strdup(json.c_str());
  } catch (const std::exception& e) {
    put(err, len, e.what());
  } catch (...) {
    put(err, len, "unknown error while reading the call spec");
  }
  return nullptr;
}

void tra_free_string(char* s) { free(s); }

// Frees the model (graphs before the loader), then removes what the loader unpacked;
// on a GPU, what libtorch cached for it goes back to the device. While the process exits
// (watch_exit), only the unpacked files are removed.
void tra_free(void* model) {
  auto* m = static_cast<Model*>(model);
  if (exiting) {
    // libtorch may be torn down already: its objects go with the process, the files now
    std::error_code ignored;
    if (!m->unpacked.empty()) std::filesystem::remove_all(m->unpacked, ignored);
    return;
  }
  try {
    bool gpu = !m->device.is_cpu();
#ifdef TRA_CUDA
    if (gpu) m->stream->synchronize();
    m->captured.clear();
    for (auto& e : m->events) {
      if (e) (void)cudaEventDestroy(e);
    }
    if (m->asleep) (void)cudaEventDestroy(m->asleep);
#endif
    m->loader.reset();
#ifdef TRA_CUDA
    if (m->modules) {
      c10::cuda::CUDAGuard device_guard(m->device);
      int failed = tra_modules_release(m->modules);
      if (failed && m->log) {
        m->log(LOG_WARN, ("AOTInductor package: " + std::to_string(failed) + " of its CUDA modules did not unload").c_str());
      }
    }
#endif
    if (!m->unpacked.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(m->unpacked, ignored);
    }
    delete m;
#ifdef TRA_CUDA
    if (gpu) {
      at::cuda::clearCublasWorkspaces();
      c10::cuda::CUDACachingAllocator::emptyCache();
      at::cuda::CachingHostAllocator_emptyCache();
    }
#else
    (void)gpu;
#endif
  } catch (...) {
  }
}

}  // extern "C"
