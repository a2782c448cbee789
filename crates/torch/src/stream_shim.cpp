// libtriton_rust_torch_cuda.so: per-instance CUDA streams for the torch plugin.
//
// tch exposes no CUDA stream API, so this small C++ library (ours, built by build.rs
// against libtorch's c10_cuda) gives the plugin a stream from libtorch's pool per
// model instance and makes it the calling thread's current stream around each run.
// It is opened only for GPU instances, so CPU-only machines never load c10_cuda.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

// Declared in ATen/cuda/CUDAContextLight.h (libtorch_cuda), whose includes need CUDA
// library headers the torch wheel does not ship; the declaration is all we need.
namespace at::cuda {
void clearCublasWorkspaces();
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

int trt_stream_sync(void* stream) {
  try {
    static_cast<c10::cuda::CUDAStream*>(stream)->synchronize();
    return 0;
  } catch (...) {
    return 1;
  }
}

void trt_stream_free(void* stream) { delete static_cast<c10::cuda::CUDAStream*>(stream); }

// After a GPU model is freed: give back what libtorch keeps for reuse. cuBLAS keeps a
// workspace per (handle, stream) pair and never frees it; instances take a new pool
// stream at every load, so each reload would otherwise add workspaces. The caching
// allocator's unused blocks (the freed weights) go back to the device too.
int trt_release_cached() {
  try {
    at::cuda::clearCublasWorkspaces();
    c10::cuda::CUDACachingAllocator::emptyCache();
    return 0;
  } catch (...) {
    return 1;
  }
}
}
