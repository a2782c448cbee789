// libtriton_rust_torch_cuda.so: per-instance CUDA streams and CUDA graphs for the
// torch plugin.
//
// tch exposes no CUDA stream or graph API, so this small C++ library (ours, built by
// build.rs against libtorch's CUDA libraries) gives the plugin a stream from libtorch's
// pool per model instance, makes it the calling thread's current stream around each
// run, and wraps at::cuda::CUDAGraph for capture and replay. It is opened only for GPU
// instances, so CPU-only machines never load c10_cuda.
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/jit/api/module.h>

#include "failed_capture.h"

#include <cstdio>
#include <cstring>
#include <exception>

// Declared in ATen/cuda/CUDAContextLight.h (libtorch_cuda), whose includes need CUDA
// library headers the torch wheel does not ship; the declaration is all we need.
namespace at::cuda {
void clearCublasWorkspaces();
}

// Writes `what` into the caller's error buffer (`len` bytes, NUL-terminated).
static void put_error(char* err, size_t len, const char* what) {
  if (err && len) {
    std::snprintf(err, len, "%s", what);
  }
}

extern "C" {

void* trt_stream_new(int device) {
  try {
    return new c10::cuda::CUDAStream(c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device)));
  } catch (...) {
    return nullptr;
  }
}

int trt_stream_enter(void* stream) {
  try {
    c10::cuda::setCurrentCUDAStream(*static_cast<c10::cuda::CUDAStream*>(stream));
    return 0;
  } catch (...) {
    return 1;
  }
}

// Waits for the instance's stream. Returns 0, or 1 with the CUDA error (a device-side
// assert in the model's kernels surfaces here) in err.
int trt_stream_sync(void* stream, char* err, size_t len) {
  try {
    static_cast<c10::cuda::CUDAStream*>(stream)->synchronize();
    return 0;
  } catch (const std::exception& e) {
    put_error(err, len, e.what());
    return 1;
  } catch (...) {
    put_error(err, len, "unknown error while waiting for the CUDA stream");
    return 1;
  }
}

// Queues a copy of n bytes on the instance's stream, host to device or device to host
// (CUDA tells which from the pointers; between pinned memory and the GPU it is a DMA the
// CPU does not wait for). Returns 0, or 1 with the CUDA error in err.
int trt_copy_async(void* stream, void* dst, const void* src, size_t n, char* err, size_t len) {
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, static_cast<c10::cuda::CUDAStream*>(stream)->stream());
  if (e == cudaSuccess) return 0;
  put_error(err, len, cudaGetErrorString(e));
  return 1;
}

void trt_stream_free(void* stream) { delete static_cast<c10::cuda::CUDAStream*>(stream); }

// After a GPU model is freed: give back what libtorch keeps for reuse. cuBLAS keeps a
// workspace per (handle, stream) pair and never frees it; instances take a new pool
// stream at every load, so each reload would otherwise add workspaces. The caching
// allocator's unused blocks (the freed weights) go back to the device, and the unused
// pinned host blocks (input staging) back to the OS.
int trt_release_cached() {
  try {
    at::cuda::clearCublasWorkspaces();
    c10::cuda::CUDACachingAllocator::emptyCache();
    at::cuda::CachingHostAllocator_emptyCache();
    return 0;
  } catch (...) {
    return 1;
  }
}

// One step of TorchScript's fusion strategy, as triton_rust_abi::FusionStep lays it out.
struct trt_fusion_step {
  int dynamic;
  unsigned depth;
};

// Sets libtorch's (process-wide) fusion strategy: for each step in order, how many fused
// kernels the profiling executor compiles, specialised to static shapes or for dynamic
// ones. Returns 0, or 1 with the reason in err.
int trt_set_fusion_strategy(const trt_fusion_step* steps, size_t n, char* err, size_t len) {
  try {
    torch::jit::FusionStrategy strategy;
    for (size_t i = 0; i < n; ++i) {
      strategy.emplace_back(steps[i].dynamic ? torch::jit::FusionBehavior::DYNAMIC : torch::jit::FusionBehavior::STATIC,
                            static_cast<size_t>(steps[i].depth));
    }
    torch::jit::setFusionStrategy(strategy);
    return 0;
  } catch (const std::exception& e) {
    put_error(err, len, e.what());
  } catch (...) {
    put_error(err, len, "setFusionStrategy failed");
  }
  return 1;
}

// ---- CUDA graphs ----
// A model instance captures one graph per input shape (batch buckets) on its own
// stream, all drawing intermediates from one private memory pool (they replay one at
// a time on that stream, so they may share it). Errors come back as text in `err`.

// A fresh pool id for an instance's graphs.
void trt_graph_pool(unsigned long long* first, unsigned long long* second) {
  auto id = at::cuda::graph_pool_handle();
  *first = id.first;
  *second = id.second;
}

// A graph, and the pool and device it captures into (a failed capture gives them back).
struct ShimGraph {
  at::cuda::CUDAGraph graph;
  at::cuda::MempoolId_t pool;
  c10::DeviceIndex device;
};

// Starts capturing the calling thread's current stream (the instance's). Capture mode
// is thread-local: other threads of the server (other models) go on using CUDA.
void* trt_graph_begin(unsigned long long pool_first, unsigned long long pool_second, char* err, size_t len) {
  ShimGraph* g = nullptr;
  try {
    g = new ShimGraph{at::cuda::CUDAGraph(), {pool_first, pool_second}, c10::cuda::current_device()};
    g->graph.capture_begin(g->pool, cudaStreamCaptureModeThreadLocal);
    return g;
  } catch (const std::exception& e) {
    put_error(err, len, e.what());
  } catch (...) {
    put_error(err, len, "capture_begin failed");
  }
  delete g;
  return nullptr;
}

// Ends the capture and instantiates the graph. On failure (the model did something a
// graph cannot hold: a host sync, a data-dependent shape) the stream leaves capture mode,
// the pool's reference and the allocators' routing go back (failed_capture.h) and the graph
// is destroyed; returns 1. The pool is then free to be released for good: the caller makes a
// new one for its next capture when no graph of its own holds this one.
int trt_graph_end(void* graph, char* err, size_t len) {
  auto* g = static_cast<ShimGraph*>(graph);
  try {
    g->graph.capture_end();
    return 0;
  } catch (const std::exception& e) {
    put_error(err, len, e.what());
  } catch (...) {
    put_error(err, len, "capture_end failed");
  }
  triton_rust::give_back_failed_capture(g->graph, g->device, g->pool);
  delete g;
  // a failed capture leaves its error as the thread's last CUDA error: clear it, it is
  // not sticky and must not be reported by the next unrelated call
  (void)cudaGetLastError();
  return 1;
}

int trt_graph_replay(void* graph, char* err, size_t len) {
  try {
    static_cast<ShimGraph*>(graph)->graph.replay();
    return 0;
  } catch (const std::exception& e) {
    put_error(err, len, e.what());
  } catch (...) {
    put_error(err, len, "replay failed");
  }
  return 1;
}

void trt_graph_free(void* graph) {
  try {
    delete static_cast<ShimGraph*>(graph);
  } catch (...) {
  }
}
}
