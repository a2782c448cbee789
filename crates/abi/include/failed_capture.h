// What a failed CUDA graph capture leaves behind in libtorch, given back. Shared by the two
// torch plugins (crates/torch/src/stream_shim.cpp, crates/aoti/src/graphs.cpp), compiled
// against whichever libtorch each is built with.
//
// at::cuda::CUDAGraph::capture_begin takes a reference on the memory pool it captures into
// and tells the caching allocators (device and page-locked host) to route the capturing
// stream's allocations there, through a filter that refers to the graph. capture_end undoes
// the routing only when cudaStreamEndCapture succeeds, and the reference goes back only
// when a graph whose capture ended is destroyed. A run that cannot be captured (one that
// reads a size on the host, as FastPitch's does) makes cudaStreamEndCapture fail, so both
// stay: the pool, and every block the run took from it, is never freed (22 MiB a load of
// FastPitch on an H100, measured before this file existed; after it, +0 MiB over 180 reloads:
// bench/gpu/results/trust/reload_aoti_fastpitch_graphs), and
// each later allocation on that device asks a destroyed graph's filter.
#pragma once

#include <ATen/cuda/CUDAGraph.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>

namespace triton_rust {

// Call after capture_begin(pool) returned and capture_end threw (or was never reached),
// before `graph` is destroyed, on the device the capture ran on. Does nothing for a graph
// whose capture ended (its destructor gives the pool back). Never throws.
inline void give_back_failed_capture(at::cuda::CUDAGraph& graph, c10::DeviceIndex device,
                                     at::cuda::MempoolId_t pool) noexcept {
  try {
    (void)graph.pool();  // throws unless the capture ended
    return;
  } catch (...) {
  }
  // the routing: still there when cudaStreamEndCapture failed; removed already when
  // capture_end failed after it (which then throws "not currently recording": ignored)
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
  } catch (...) {
  }
  bool host_routed = false;
  try {
    at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool);
    host_routed = true;
  } catch (...) {
  }
  // the reference capture_begin took
  try {
    c10::cuda::CUDACachingAllocator::releasePool(device, pool);
  } catch (...) {
  }
  if (host_routed) {
    try {
      at::getHostAllocator(at::kCUDA)->release_pool(pool);
    } catch (...) {
    }
  }
}

}  // namespace triton_rust
