// CUDA graphs: one per input shape (the first dimension padded to its batch bucket),
// captured at its first run and replayed after; a shape whose run cannot be captured runs
// without one. And a captured graph's own input, for a caller to write into.
#include "runtime.h"

using namespace tra;

#ifdef TRA_CUDA
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

// Records event `k` on the instance's stream, when the caller times the GPU (gpu_events).
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

}  // namespace

namespace tra {

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

}  // namespace tra
#endif

extern "C" {

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

}  // extern "C"
