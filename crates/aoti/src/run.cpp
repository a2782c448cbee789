// Running a loaded package on borrowed tensors: inputs wrapped in place (a GPU instance's
// host inputs through reused page-locked buffers), on the CPU or on the instance's own
// stream, directly or through a CUDA graph (graphs.cpp); each output handed to the sink.
#include "runtime.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

using namespace tra;

#ifdef TRA_CUDA
namespace {

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

// How a run waits for the instance's stream (`TRITON_RUST_GPU_WAIT`, read once): unset, spinning
// on it (CUDA's choice for a GPU with cores to spare); `block`, asleep on an event made to block,
// which gives the core to other threads (the store's readers) while the network runs; `poll` or
// `poll:US`, the event asked every US microseconds (default 20, 1 to 1000), the thread asleep
// between asks with a timer slack of 1 us, so a reader in SCHED_IDLE has the core between asks
// and the wait ends at most US (plus a wake-up) after the network. Every CUDA wait of the process
// asleep (TRITON_RUST_CUDA_SCHED=block, the lookups' too) served 1.01x spinning with 8 instances
// at a 10% cache, each network run longer (one H200, bench/gpu/results/cache-runs/, `eight`);
// `poll` served 0.99x spinning there (the crew got the cores, each busy reader read fewer rows:
// section `defaults`).
struct GpuWait {
  enum Mode { spin, block, poll } mode = spin;
  long us = 20;
};

GpuWait gpu_wait() {
  static const GpuWait set = [] {
    GpuWait w;
    const char* v = std::getenv("TRITON_RUST_GPU_WAIT");
    std::string s = v == nullptr ? "" : v;
    if (s == "block") w.mode = GpuWait::block;
    if (s == "poll" || s.rfind("poll:", 0) == 0) {
      w.mode = GpuWait::poll;
      if (s.size() > 5) w.us = std::min(1000L, std::max(1L, std::atol(s.c_str() + 5)));
    }
    return w;
  }();
  return set;
}

void wait_for_stream(Model& m) {
  const GpuWait w = gpu_wait();
  if (w.mode == GpuWait::spin) {
    m.stream->synchronize();
    return;
  }
  // made once per instance (a run at a time uses it; freed with the model)
  cudaError_t e = cudaSuccess;
  if (m.asleep == nullptr) {
    unsigned flags = cudaEventDisableTiming | (w.mode == GpuWait::block ? cudaEventBlockingSync : 0u);
    e = cudaEventCreateWithFlags(&m.asleep, flags);
  }
  if (e == cudaSuccess) e = cudaEventRecord(m.asleep, m.stream->stream());
  if (e == cudaSuccess && w.mode == GpuWait::block) e = cudaEventSynchronize(m.asleep);
  if (e == cudaSuccess && w.mode == GpuWait::poll) {
    thread_local const bool slack = prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL) == 0;
    (void)slack;
    while ((e = cudaEventQuery(m.asleep)) == cudaErrorNotReady) {
      std::this_thread::sleep_for(std::chrono::microseconds(w.us));
    }
  }
  if (e != cudaSuccess) throw std::runtime_error(std::string("waiting for the instance's stream: ") + cudaGetErrorString(e));
}

// The networks of a GPU's instances one after another on the GPU, in the order their runs
// launch (`TRITON_RUST_NETWORK_FIFO=1`, read once; an experiment's knob): each run's stream
// waits for the run launched before it on that GPU (one event a GPU, recorded after each run's
// work; a wait takes the event's last record, so the next record does not move it). Otherwise
// the instances' networks share the GPU as they come. Only the launch holds the lock; the wait
// for the GPU does not. It measures a network's own GPU time served: on an H200, DLRM-v2's
// graph took 1.42 ms a batch all in HBM and 2.15 ms beside a 10% cache's kernels, against
// 4.95-6.83 ms shared, and served the same pairs a second (bench/gpu/results/cache-runs/, `fifo`).
class NetworkTurn {
 public:
  static bool on() {
    static const bool set = [] {
      const char* v = std::getenv("TRITON_RUST_NETWORK_FIFO");
      return v != nullptr && std::string(v) == "1";
    }();
    return set;
  }
  // Takes the GPU's turn for `m` (its current device): `m`'s stream waits for the network
  // launched before; `done` then records this one's end and gives the turn on.
  explicit NetworkTurn(Model& m) : m_(m) {
    auto d = static_cast<size_t>(m.device.index());
    if (d >= kGpus) throw std::runtime_error("network turns: GPU index past " + std::to_string(kGpus));
    lock_ = std::unique_lock<std::mutex>(locks()[d]);
    cudaEvent_t& e = events()[d];
    cudaError_t r = cudaSuccess;
    if (e == nullptr) r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    else r = cudaStreamWaitEvent(m.stream->stream(), e, 0);  // never recorded yet: no wait
    if (r != cudaSuccess) throw std::runtime_error(std::string("the network's turn: ") + cudaGetErrorString(r));
    event_ = e;
  }
  void done() {
    cudaError_t r = cudaEventRecord(event_, m_.stream->stream());
    lock_.unlock();
    if (r != cudaSuccess) throw std::runtime_error(std::string("the network's turn: ") + cudaGetErrorString(r));
  }

 private:
  static constexpr size_t kGpus = 64;
  static std::mutex* locks() {
    static std::mutex l[kGpus];
    return l;
  }
  static cudaEvent_t* events() {
    static cudaEvent_t e[kGpus] = {};
    return e;
  }
  Model& m_;
  std::unique_lock<std::mutex> lock_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace
#endif

extern "C" {

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
      std::optional<NetworkTurn> turn;
      if (NetworkTurn::on()) turn.emplace(m);
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
        if (turn) turn->done();
        wait_for_stream(m);
      } else {
        // a package may return views (BERT's two logits are strided slices of one tensor):
        // made contiguous on the instance's stream before the wait, because the backend
        // copies outputs on a stream of its own once this returns
        for (auto& o : out) o = o.contiguous();
        times->launched_us = since();
        if (turn) turn->done();
        wait_for_stream(m);
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

}  // extern "C"
