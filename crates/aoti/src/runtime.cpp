// The libtorch side of libtriton_rust_aoti.so: AOTInductor packages loaded with
// torch::inductor::AOTIModelPackageLoader and run on borrowed tensors, on the CPU or on a
// GPU instance's own stream, optionally through one CUDA graph per input shape.
//
// Built by build.rs against whichever libtorch LIBTORCH names (no tch, so no pinned
// version); the Rust half of the crate (lib.rs) speaks the backend's plugin ABI and calls
// the tra_* functions below. Every function catches what libtorch throws and returns it
// as text in the caller's buffer. With TRA_CUDA undefined (a CPU-only libtorch) the GPU
// paths answer with an error instead.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/headeronly/version.h>
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#ifdef TRA_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "failed_capture.h"
#endif

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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

namespace {

// The backend's TensorView (triton_rust_abi), field for field.
struct View {
  const char* name;
  int32_t dtype;
  const int64_t* shape;
  size_t rank;
  const void* data;
  size_t bytes;
  int32_t memory;
  int64_t device_id;
};

using Sink = int (*)(void* ctx, size_t index, const View* out);

// Where a run's time went, in microseconds from tra_run's start (the Rust side's RunTimes):
// inputs in place, the work queued (and, on a GPU, the outputs made contiguous), the GPU
// done, the outputs handed to the sink; `replayed` when a CUDA graph ran. Through a graph
// also: its inputs' copies queued (`copied_us`), and, when the caller sets `gpu_events`,
// what the GPU spent on those copies and on the graph (CUDA events; 0 when not measured).
struct RunTimes {
  int64_t staged_us;
  int64_t copied_us;
  int64_t launched_us;
  int64_t synced_us;
  int64_t delivered_us;
  int64_t gpu_copies_us;
  int64_t gpu_graph_us;
  int32_t replayed;
  int32_t gpu_events;
};

using Log = void (*)(int level, const char* message);
constexpr int LOG_INFO = 0;
constexpr int LOG_WARN = 1;
constexpr int MEMORY_GPU = 1;

void put(char* err, size_t len, const std::string& what) {
  if (err && len) std::snprintf(err, len, "%s", what.c_str());
}

// The backend's element type codes (triton_rust_abi::dtype) and libtorch's.
bool scalar_of(int32_t code, c10::ScalarType* out) {
  static const c10::ScalarType types[] = {at::kBool,  at::kByte,  at::kChar,   at::kShort, at::kInt,
                                          at::kLong,  at::kHalf,  at::kFloat,  at::kDouble, at::kBFloat16};
  if (code < 0 || code >= 10) return false;
  *out = types[code];
  return true;
}

int32_t code_of(c10::ScalarType t) {
  switch (t) {
    case at::kBool: return 0;
    case at::kByte: return 1;
    case at::kChar: return 2;
    case at::kShort: return 3;
    case at::kInt: return 4;
    case at::kLong: return 5;
    case at::kHalf: return 6;
    case at::kFloat: return 7;
    case at::kDouble: return 8;
    case at::kBFloat16: return 9;
    default: return -1;
  }
}

#ifdef TRA_CUDA
// A graph's input shapes: what it is captured for.
using GraphKey = std::vector<std::vector<int64_t>>;

// One captured run: fixed input buffers the batch is copied into, the outputs the
// replay writes.
struct Graph {
  at::cuda::CUDAGraph graph;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> outputs;
};
#endif

struct Model {
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  // The directory the loader unpacked the package into (removed at free).
  std::string unpacked;
  c10::Device device = c10::Device(c10::kCPU);
  Log log = nullptr;
#ifdef TRA_CUDA
  std::unique_ptr<c10::cuda::CUDAStream> stream;
  // the package's CUDA modules (modules.cpp): unloaded after the loader
  void* modules = nullptr;
  bool graphs = false;
  at::cuda::MempoolId_t pool{0, 0};
  std::map<GraphKey, std::unique_ptr<Graph>> captured;
  std::set<GraphKey> uncapturable;
  // page-locked buffers, one per input and one per output, reused from run to run (each run
  // waits for its stream before it returns, so no copy from or into them is in flight when
  // the next run fills them): a client's host inputs go up from them, outputs wanted on the
  // host come down into them
  std::vector<at::Tensor> host_in, host_out;
  // the events that time a replay's copies and graph on the GPU, made at the first run asking
  cudaEvent_t events[3] = {nullptr, nullptr, nullptr};
#endif
};

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

using Clock = std::chrono::steady_clock;

int64_t micros_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

#ifdef TRA_CUDA
// A tensor of `shape` and `type` over reusable page-locked buffer `i` of `bufs`, which grows
// to the largest tensor it has held.
at::Tensor pinned_view(std::vector<at::Tensor>& bufs, size_t i, at::IntArrayRef shape, c10::ScalarType type) {
  if (bufs.size() <= i) bufs.resize(i + 1);
  int64_t bytes = static_cast<int64_t>(c10::elementSize(type));
  for (auto d : shape) bytes *= d;
  auto& buf = bufs[i];
  if (!buf.defined() || buf.numel() < bytes) {
    buf = at::empty({std::max<int64_t>(bytes, 1)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  }
  return at::from_blob(buf.data_ptr(), shape, at::TensorOptions().dtype(type));
}

// Input `in` on the instance's GPU: itself there, else copied up on the instance's stream
// (from page-locked memory, or from another GPU).
at::Tensor on_device(const Model& m, const at::Tensor& in) {
  return in.device() == m.device ? in : in.to(m.device, /*non_blocking=*/true);
}

void record(Model& m, int k, const RunTimes* times) {
  if (!times->gpu_events) return;
  if (!m.events[k]) {
    if (cudaEventCreate(&m.events[k]) != cudaSuccess) {
      (void)cudaGetLastError();
      m.events[k] = nullptr;
      return;
    }
  }
  (void)cudaEventRecord(m.events[k], m.stream->stream());
}

// Microseconds between two recorded events (after the stream's wait), 0 when not measured.
int64_t between(const Model& m, int a, int b, const RunTimes* times) {
  float ms = 0;
  if (!times->gpu_events || !m.events[a] || !m.events[b] ||
      cudaEventElapsedTime(&ms, m.events[a], m.events[b]) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(ms * 1000.0f);
}

// The graph a batch of inputs of these shapes runs through: theirs, the first dimension
// padded to `pad_rows` when it is > 0.
GraphKey graph_key(GraphKey shapes, int64_t pad_rows) {
  for (auto& s : shapes) {
    if (pad_rows > 0 && !s.empty()) s[0] = pad_rows;
  }
  return shapes;
}

// Copies `src` into the first rows of `dst` (a graph's input, padded); a rank-0 input whole.
void copy_rows(at::Tensor& dst, const at::Tensor& src) {
  if (src.dim() == 0) {
    dst.copy_(src, true);
  } else {
    dst.narrow(0, 0, src.size(0)).copy_(src, true);
  }
}

// Runs through the graph of these input shapes (their first dimension padded to `pad_rows`
// when it is > 0), capturing it at its first run; `times->replayed` says whether a graph ran
// (not for shapes whose run cannot be captured). `in` are on the instance's GPU or in
// page-locked host memory: a replay copies each straight into the graph's own input, unless
// it is that input already (tra_graph_input).
std::vector<at::Tensor> run_graph(Model& m, const std::vector<at::Tensor>& in, int64_t pad_rows, RunTimes* times,
                                  Clock::time_point t0) {
  GraphKey shapes;
  for (const auto& t : in) shapes.push_back(t.sizes().vec());
  auto key = graph_key(shapes, pad_rows);
  auto stream = m.stream->stream();
  times->replayed = 0;
  auto plain = [&] {
    std::vector<at::Tensor> dev;
    for (const auto& t : in) dev.push_back(on_device(m, t));
    return m.loader->run(dev, stream);
  };
  if (m.uncapturable.count(key)) return plain();
  auto found = m.captured.find(key);
  if (found == m.captured.end()) {
    auto g = std::make_unique<Graph>();
    for (size_t i = 0; i < in.size(); ++i) {
      g->inputs.push_back(at::zeros(key[i], in[i].options().device(m.device)));
      copy_rows(g->inputs.back(), in[i]);
    }
    // one run outside the capture: lazy initialisation (cuBLAS handles, workspaces) must
    // not happen inside it
    m.loader->run(g->inputs, stream);
    m.stream->synchronize();
    bool begun = false, capturing = false;
    try {
      g->graph.capture_begin(m.pool, cudaStreamCaptureModeThreadLocal);
      begun = capturing = true;
      g->outputs = m.loader->run(g->inputs, stream);
      capturing = false;  // capture_end ends the capture even when it throws
      g->graph.capture_end();
    } catch (const std::exception& e) {
      if (capturing) {
        // a run that cannot be captured (one that reads a size on the host, as FastPitch's
        // does) leaves the stream capturing: ended here whatever happened, so that the
        // stream and the allocator's capture pool take ordinary work again (ending an
        // invalidated capture throws too)
        try {
          g->graph.capture_end();
        } catch (...) {
        }
      }
      if (begun) {
        // the pool's reference and the allocators' routing, which libtorch keeps after a
        // failed capture (failed_capture.h); with no graph of this model holding the pool
        // it may now be released for good, so later captures take a new one
        g->outputs.clear();
        triton_rust::give_back_failed_capture(g->graph, m.device.index(), m.pool);
        if (m.captured.empty()) m.pool = at::cuda::graph_pool_handle();
      }
      (void)cudaGetLastError();
      m.uncapturable.insert(key);
      if (m.log) {
        std::string text = std::string("AOTInductor package: no CUDA graph for input shapes starting ") +
                           shape_text(key[0]) + ", running it without one: " + e.what();
        m.log(LOG_WARN, text.c_str());
      }
      return plain();
    }
    found = m.captured.emplace(key, std::move(g)).first;
    record(m, 0, times);  // this run's inputs went in before the capture
  } else {
    record(m, 0, times);
    for (size_t i = 0; i < in.size(); ++i) {
      auto& own = found->second->inputs[i];
      if (in[i].data_ptr() == own.data_ptr()) continue;  // in place already
      copy_rows(own, in[i]);
    }
  }
  times->copied_us = micros_since(t0);
  record(m, 1, times);
  auto& g = *found->second;
  g.graph.replay();
  record(m, 2, times);
  times->replayed = 1;
  std::vector<at::Tensor> out;
  int64_t rows = in.empty() || in[0].dim() == 0 ? 0 : in[0].size(0);
  for (const auto& o : g.outputs) {
    out.push_back(pad_rows > 0 && o.dim() > 0 && o.size(0) == pad_rows ? o.narrow(0, 0, rows) : o);
  }
  return out;
}
#endif

}  // namespace

extern "C" {

const char* tra_runtime() {
#ifdef TRA_CUDA
  return "libtorch " TORCH_VERSION " (AOTInductor, CUDA)";
#else
  return "libtorch " TORCH_VERSION " (AOTInductor, CPU only)";
#endif
}

}  // extern "C"

namespace {

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

// Loads the package at `path` on the CPU (gpu < 0) or on GPU `gpu` with a stream of its
// own; `graphs` non-zero: runs asked to go through a graph capture one per input shape.
void* tra_load(const char* path, int gpu, int graphs, Log log, char* err, size_t len) {
  try {
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
      m->stream = std::make_unique<c10::cuda::CUDAStream>(
          c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(gpu)));
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

// Runs the model on `n` borrowed inputs (host or GPU memory); each output goes to `sink`
// (in host memory when `host_outputs`, else where it was made), valid during the call.
// `graph`: 0 no graph; 1 through the graph of these shapes, inputs' first dimension
// padded to `pad_rows` when it is > 0. Returns 0, or 1 with the reason in err.
int tra_run(void* model, const View* inputs, size_t n, int graph, int64_t pad_rows, int host_outputs, Sink sink,
            void* ctx, RunTimes* times, char* err, size_t len) {
  auto& m = *static_cast<Model*>(model);
  auto t0 = Clock::now();
  auto since = [t0]() { return micros_since(t0); };
  try {
    c10::InferenceMode inference;
#ifdef TRA_CUDA
    // a GPU instance's work, input copies included, goes on its own stream
    std::optional<c10::cuda::CUDAGuard> device_guard;
    std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
    if (!m.device.is_cpu()) {
      device_guard.emplace(m.device);
      stream_guard.emplace(*m.stream);
    }
#endif
    std::vector<at::Tensor> in;
    in.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const View& v = inputs[i];
      c10::ScalarType type;
      if (!scalar_of(v.dtype, &type)) {
        put(err, len, std::string("input '") + v.name + "': element type code " + std::to_string(v.dtype));
        return 1;
      }
      std::vector<int64_t> shape(v.shape, v.shape + v.rank);
      auto where = v.memory == MEMORY_GPU ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(v.device_id))
                                          : c10::Device(c10::kCPU);
      auto t = at::from_blob(const_cast<void*>(v.data), shape, at::TensorOptions().dtype(type).device(where));
      if (where == m.device || m.device.is_cpu()) {
        // (the backend refuses GPU inputs for a CPU instance; one that came would be copied down)
        in.push_back(where == m.device ? t : t.to(m.device));
      } else if (where.is_cpu()) {
#ifdef TRA_CUDA
        // host memory (a client's, pageable) for a GPU instance: copied into this input's
        // page-locked buffer here, so that its copy to the GPU is queued on the instance's
        // stream (straight into a graph's input) rather than waited for
        auto pinned = pinned_view(m.host_in, i, shape, type);
        if (v.bytes != pinned.nbytes()) {
          put(err, len, std::string("input '") + v.name + "': " + std::to_string(v.bytes) + " bytes for a shape of " +
                            std::to_string(pinned.nbytes()));
          return 1;
        }
        std::memcpy(pinned.data_ptr(), v.data, v.bytes);
        in.push_back(pinned);
#endif
      } else {
        in.push_back(t);
      }
    }
    times->staged_us = since();
    std::vector<at::Tensor> out;
    if (m.device.is_cpu()) {
      out = m.loader->run(in);
      times->launched_us = times->synced_us = since();
    } else {
#ifdef TRA_CUDA
      if (graph && m.graphs) {
        out = run_graph(m, in, pad_rows, times, t0);
      } else {
        for (auto& t : in) t = on_device(m, t);
        out = m.loader->run(in, m.stream->stream());
      }
      if (host_outputs) {
        times->launched_us = since();
        // every output copied into its page-locked buffer on the instance's stream, then one wait
        for (size_t i = 0; i < out.size(); ++i) {
          auto host = pinned_view(m.host_out, i, out[i].sizes(), out[i].scalar_type());
          host.copy_(out[i], /*non_blocking=*/true);
          out[i] = host;
        }
        m.stream->synchronize();
      } else {
        // a package may return views (BERT's two logits are strided slices of one tensor):
        // made contiguous on the instance's stream before the wait, because the backend
        // copies outputs on a stream of its own once this returns
        for (auto& o : out) o = o.contiguous();
        times->launched_us = since();
        m.stream->synchronize();
      }
      times->synced_us = since();
      if (times->replayed) {
        times->gpu_copies_us = between(m, 0, 1, times);
        times->gpu_graph_us = between(m, 1, 2, times);
      }
#endif
    }
    for (size_t i = 0; i < out.size(); ++i) {
      at::Tensor o = out[i].contiguous();
      int32_t code = code_of(o.scalar_type());
      if (code < 0) {
        put(err, len, "output " + std::to_string(i) + " has element type " + std::string(c10::toString(o.scalar_type())) +
                          ", which Triton cannot carry");
        return 1;
      }
      std::vector<int64_t> shape = o.sizes().vec();
      View view{"", code, shape.data(), shape.size(), o.data_ptr(), static_cast<size_t>(o.nbytes()),
                o.is_cuda() ? MEMORY_GPU : 0, o.is_cuda() ? o.device().index() : 0};
      if (sink(ctx, i, &view) != 0) {
        put(err, len, "the output sink stopped the run");
        return 1;
      }
    }
    times->delivered_us = since();
    return 0;
  } catch (const std::exception& e) {
    put(err, len, e.what());
  } catch (...) {
    put(err, len, "unknown error while running the package");
  }
#ifdef TRA_CUDA
  // a failed run may have left copies from or into the page-locked buffers queued: the next
  // run refills them only after they are done
  if (!m.device.is_cpu()) {
    try {
      m.stream->synchronize();
    } catch (...) {
    }
  }
#endif
  return 1;
}

// The GPU address of input `index` of the graph captured for inputs of these shapes (the
// first dimension padded to `pad_rows` when it is > 0) and of that input's element type;
// null when there is none. Its first rows may be written, while no run is in flight, and
// passed to tra_run as that input, which then copies nothing for it.
void* tra_graph_input(void* model, const View* inputs, size_t n, int64_t pad_rows, size_t index) {
#ifdef TRA_CUDA
  try {
    auto& m = *static_cast<Model*>(model);
    if (!m.graphs || index >= n) return nullptr;
    GraphKey shapes;
    for (size_t i = 0; i < n; ++i) shapes.emplace_back(inputs[i].shape, inputs[i].shape + inputs[i].rank);
    auto found = m.captured.find(graph_key(shapes, pad_rows));
    if (found == m.captured.end() || index >= found->second->inputs.size()) return nullptr;
    const auto& own = found->second->inputs[index];
    c10::ScalarType type;
    if (!scalar_of(inputs[index].dtype, &type) || own.scalar_type() != type || !own.is_contiguous()) return nullptr;
    return own.data_ptr();
  } catch (...) {
  }
#else
  (void)model;
  (void)inputs;
  (void)n;
  (void)pad_rows;
  (void)index;
#endif
  return nullptr;
}

// Frees the model (graphs before the loader), then removes what the loader unpacked;
// on a GPU, what libtorch cached for it goes back to the device.
void tra_free(void* model) {
  auto* m = static_cast<Model*>(model);
  try {
    bool gpu = !m->device.is_cpu();
#ifdef TRA_CUDA
    if (gpu) m->stream->synchronize();
    m->captured.clear();
    for (auto& e : m->events) {
      if (e) (void)cudaEventDestroy(e);
    }
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
