// What the C++ files of libtriton_rust_aoti.so share: the backend's ABI types as C++ sees
// them, libtorch's element types, and a loaded package (Model). package.cpp loads, describes
// and frees packages; run.cpp runs them; graphs.cpp runs them through CUDA graphs.
//
// Built by build.rs against whichever libtorch LIBTORCH names (no tch, so no pinned
// version); the Rust half of the crate (lib.rs) speaks the backend's plugin ABI and calls
// the tra_* functions. Every one catches what libtorch throws and returns it as text in the
// caller's buffer. With TRA_CUDA undefined (a CPU-only libtorch) the GPU paths answer with
// an error instead.
#pragma once

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

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

namespace tra {

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

inline void put(char* err, size_t len, const std::string& what) {
  if (err && len) std::snprintf(err, len, "%s", what.c_str());
}

// The backend's element type codes (triton_rust_abi::dtype) and libtorch's.
inline bool scalar_of(int32_t code, c10::ScalarType* out) {
  static const c10::ScalarType types[] = {at::kBool,  at::kByte,  at::kChar,   at::kShort, at::kInt,
                                          at::kLong,  at::kHalf,  at::kFloat,  at::kDouble, at::kBFloat16};
  if (code < 0 || code >= 10) return false;
  *out = types[code];
  return true;
}

inline int32_t code_of(c10::ScalarType t) {
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
  // the event a run waits on asleep or asks (TRITON_RUST_GPU_WAIT=block or poll), made at the
  // first such run
  cudaEvent_t asleep = nullptr;
#endif
};

using Clock = std::chrono::steady_clock;

inline int64_t micros_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
}

#ifdef TRA_CUDA
// Input `in` on the instance's GPU: itself there, else copied up on the instance's stream
// (from page-locked memory, or from another GPU).
inline at::Tensor on_device(const Model& m, const at::Tensor& in) {
  return in.device() == m.device ? in : in.to(m.device, /*non_blocking=*/true);
}

// graphs.cpp: a run through the CUDA graph of these input shapes, and the GPU time between
// two of the events it records (0 when not measured).
std::vector<at::Tensor> run_graph(Model& m, const std::vector<at::Tensor>& in, int64_t pad_rows, RunTimes* times,
                                  Clock::time_point t0);
int64_t between(const Model& m, int a, int b, const RunTimes* times);
#endif

}  // namespace tra
