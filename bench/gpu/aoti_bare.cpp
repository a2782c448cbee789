// The bare AOTInductor reference: a CUDA `.pt2` package run by libtorch's C++ package loader
// (torch::inductor::AOTIModelPackageLoader) with no server and no Python, inputs already on
// the GPU. For each batch size asked, on one CUDA stream of its own:
//   plain  runs of the package (loader.run on the stream), each timed with CUDA events
//          around it and waited for;
//   graph  one CUDA graph capture of the run (at::cuda::CUDAGraph, after warm-up runs),
//          replayed, each replay timed the same way; and calls as a server makes them, timed
//          on the host (`graph_call`): the inputs copied into the graph's own from other device
//          buffers, the replay, the wait for the stream; with --gaps-us, those calls again with the
//          host idle that long between them, and from inputs in pageable host memory (staged
//          through pinned memory, as a server does for a client's host buffers).
// Prints one JSON line per batch on stdout (median and p99 ms, inferences/s = batch / median);
// notes go to stderr. The package is loaded as the rust backend's AOTInductor plugin loads it
// (single-threaded runner, one model copy), and the directory the loader unpacks it into is
// removed at exit.
//
//   aoti_bare --package model.pt2 --batches 1,16,128 [--iters 200] [--warmup 10]
//             [--input float16:3,224,224 ...] [--int-high 2] [--device 0] [--gaps-us 0,100]
//   aoti_bare --package model.pt2 --print-inputs     # the inputs the metadata gives, as JSON
//
// Inputs: their element type and shape without the batch dimension, from the package's
// metadata `triton_rust.inputs` (written by examples/aoti_export.py; -1 in the first
// dimension is the batch) unless given by --input (one per input, in the package's order:
// DTYPE:D1,D2,...[:HIGH], dims without the batch dimension; HIGH bounds an integer input's
// values). Floating inputs are standard normal; integer inputs uniform in [0, HIGH) (default
// --int-high 2: valid ids, segments and masks); bool inputs true.
//
// Built on the GPU machine by bench/gpu/run.sh (or by bench/gpu/pack.sh here, against the same
// torch release):
//   g++ -O2 -std=c++20 -D_GLIBCXX_USE_CXX11_ABI=1 bench/gpu/aoti_bare.cpp -o aoti_bare \
//       -I$TORCH/include -I$TORCH/include/torch/csrc/api/include -I$CUDA/include \
//       -L$TORCH/lib -ltorch -ltorch_cpu -ltorch_cuda -lc10 -lc10_cuda -L$CUDA/lib -lcudart
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct InputSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> dims;  // without the batch dimension
  int64_t high = 0;           // integers: values in [0, high); 0: --int-high
};

struct Args {
  std::string package;
  std::vector<int64_t> batches;
  int iters = 200;
  int warmup = 10;
  int64_t int_high = 2;
  int device = 0;
  std::vector<InputSpec> inputs;
  bool print_inputs = false;
  std::vector<int64_t> gaps_us;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "aoti_bare: " << why << "\n"
            << "usage: aoti_bare --package model.pt2 --batches 1,16,128 [--iters 200] [--warmup 10]\n"
            << "                 [--input DTYPE:D1,D2,...[:HIGH] ...] [--int-high 2] [--device 0] [--gaps-us 0,100]\n";
  std::exit(2);
}

std::vector<int64_t> int_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    if (item.empty()) continue;
    try {
      out.push_back(std::stoll(item));
    } catch (const std::exception&) {
      usage("not a list of integers: '" + text + "'");
    }
  }
  return out;
}

InputSpec parse_input(const std::string& text) {
  InputSpec spec;
  auto a = text.find(':');
  if (a == std::string::npos) usage("--input wants DTYPE:D1,D2,...[:HIGH], not '" + text + "'");
  spec.dtype = text.substr(0, a);
  auto b = text.find(':', a + 1);
  spec.dims = int_list(text.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1));
  if (b != std::string::npos) spec.high = std::stoll(text.substr(b + 1));
  spec.name = "input " + std::to_string(0);
  return spec;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    if (k == "--package") a.package = value();
    else if (k == "--batches") a.batches = int_list(value());
    else if (k == "--iters") a.iters = std::stoi(value());
    else if (k == "--warmup") a.warmup = std::stoi(value());
    else if (k == "--int-high") a.int_high = std::stoll(value());
    else if (k == "--device") a.device = std::stoi(value());
    else if (k == "--print-inputs") a.print_inputs = true;
    else if (k == "--gaps-us") a.gaps_us = int_list(value());
    else if (k == "--input") {
      a.inputs.push_back(parse_input(value()));
      a.inputs.back().name = "input " + std::to_string(a.inputs.size() - 1);
    } else if (k == "-h" || k == "--help") usage("help");
    else usage("unknown argument '" + k + "'");
  }
  if (a.package.empty()) usage("--package is required");
  if (a.batches.empty() && !a.print_inputs) usage("--batches is required");
  if (a.iters < 2 || a.warmup < 1) usage("--iters >= 2 and --warmup >= 1");
  return a;
}

// ---- the package's metadata: triton_rust.inputs, a JSON list of {name, dtype, shape} ----

void skip_ws(const std::string& s, size_t& i) {
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
}

std::string json_string(const std::string& s, size_t& i) {
  skip_ws(s, i);
  if (i >= s.size() || s[i] != '"') throw std::runtime_error("expected a string in triton_rust.inputs");
  std::string out;
  for (++i; i < s.size() && s[i] != '"'; ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) ++i;
    out.push_back(s[i]);
  }
  ++i;
  return out;
}

std::vector<int64_t> json_ints(const std::string& s, size_t& i) {
  skip_ws(s, i);
  if (i >= s.size() || s[i] != '[') throw std::runtime_error("expected a list of integers in triton_rust.inputs");
  auto end = s.find(']', i);
  if (end == std::string::npos) throw std::runtime_error("unterminated list in triton_rust.inputs");
  auto out = int_list(s.substr(i + 1, end - i - 1));
  i = end + 1;
  return out;
}

// Skips one JSON value of a kind this metadata does not need (numbers, literals, nested lists).
void json_skip(const std::string& s, size_t& i) {
  skip_ws(s, i);
  if (i < s.size() && s[i] == '"') {
    json_string(s, i);
    return;
  }
  int depth = 0;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '[' || c == '{') ++depth;
    else if (c == ']' || c == '}') {
      if (depth == 0) return;
      --depth;
    } else if (c == ',' && depth == 0) return;
  }
}

std::vector<InputSpec> inputs_from_metadata(const std::string& json) {
  std::vector<InputSpec> out;
  size_t i = 0;
  skip_ws(json, i);
  if (i >= json.size() || json[i] != '[') throw std::runtime_error("triton_rust.inputs is not a JSON list");
  ++i;
  while (true) {
    skip_ws(json, i);
    if (i < json.size() && json[i] == ']') break;
    if (i >= json.size() || json[i] != '{') throw std::runtime_error("triton_rust.inputs: expected an object");
    ++i;
    InputSpec spec;
    std::vector<int64_t> shape;
    while (true) {
      skip_ws(json, i);
      if (json[i] == '}') {
        ++i;
        break;
      }
      auto key = json_string(json, i);
      skip_ws(json, i);
      if (json[i] != ':') throw std::runtime_error("triton_rust.inputs: expected ':'");
      ++i;
      if (key == "name") spec.name = json_string(json, i);
      else if (key == "dtype") spec.dtype = json_string(json, i);
      else if (key == "shape") shape = json_ints(json, i);
      else json_skip(json, i);
      skip_ws(json, i);
      if (json[i] == ',') ++i;
    }
    if (shape.empty() || shape[0] != -1) {
      throw std::runtime_error("input '" + spec.name +
                               "' has no dynamic batch dimension in triton_rust.inputs (export with "
                               "dynamic_batch=True, or give --input)");
    }
    spec.dims.assign(shape.begin() + 1, shape.end());
    for (auto d : spec.dims) {
      if (d < 0) {
        throw std::runtime_error("input '" + spec.name + "' has a dynamic dimension besides the batch: give --input");
      }
    }
    out.push_back(spec);
    skip_ws(json, i);
    if (json[i] == ',') ++i;
  }
  return out;
}

c10::ScalarType scalar_type(const std::string& name) {
  static const std::vector<std::pair<std::string, c10::ScalarType>> known = {
      {"float32", c10::kFloat}, {"float", c10::kFloat},     {"float16", c10::kHalf},   {"half", c10::kHalf},
      {"bfloat16", c10::kBFloat16}, {"float64", c10::kDouble}, {"double", c10::kDouble}, {"int64", c10::kLong},
      {"long", c10::kLong},     {"int32", c10::kInt},       {"int", c10::kInt},        {"int16", c10::kShort},
      {"int8", c10::kChar},     {"uint8", c10::kByte},      {"bool", c10::kBool},
  };
  for (const auto& [n, t] : known) {
    if (n == name) return t;
  }
  throw std::runtime_error("unknown element type '" + name + "'");
}

std::vector<at::Tensor> make_inputs(const std::vector<InputSpec>& specs, int64_t batch, int64_t int_high,
                                    const c10::Device& dev) {
  std::vector<at::Tensor> out;
  for (const auto& s : specs) {
    std::vector<int64_t> shape{batch};
    shape.insert(shape.end(), s.dims.begin(), s.dims.end());
    auto t = scalar_type(s.dtype);
    auto opts = at::TensorOptions().device(dev);
    if (t == c10::kBool) {
      out.push_back(at::ones(shape, opts.dtype(t)));
    } else if (at::isFloatingType(t)) {
      out.push_back(at::randn(shape, opts.dtype(at::kFloat)).to(t));
    } else {
      out.push_back(at::randint(0, s.high > 0 ? s.high : int_high, shape, opts.dtype(t)));
    }
  }
  return out;
}

struct Stats {
  double p50 = 0, p99 = 0;
};

Stats stats(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[std::min(ms.size() - 1, static_cast<size_t>(q * (ms.size() - 1) + 0.5))]; };
  // the median of an even count: the mean of the two middle values
  double p50 = ms.size() % 2 ? ms[ms.size() / 2] : (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]) / 2;
  return {p50, at(0.99)};
}

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

// `iters` timings (ms) of `step` on `stream`: CUDA events around each, waited for.
template <typename F>
std::vector<double> timed(const c10::cuda::CUDAStream& stream, int warmup, int iters, F step) {
  for (int i = 0; i < warmup; ++i) step();
  stream.synchronize();
  std::vector<double> ms;
  ms.reserve(iters);
  cudaEvent_t start = nullptr, end = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&end), "cudaEventCreate");
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(start, stream.stream()), "cudaEventRecord");
    step();
    check(cudaEventRecord(end, stream.stream()), "cudaEventRecord");
    check(cudaEventSynchronize(end), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, start, end), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return ms;
}

// The entries of the temporary directory ($TMPDIR) and of /tmp: where the loader unpacks.
std::set<std::string> temp_entries() {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& dir : {std::filesystem::temp_directory_path(ec), std::filesystem::path("/tmp")}) {
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) out.insert(e.path().string());
  }
  return out;
}

bool holds_package_files(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->path().string().find("/data/aotinductor/") != std::string::npos) return true;
  }
  return false;
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

// The inputs as a JSON line, read from the package's metadata alone (no GPU needed).
int print_inputs(const Args& a) {
  auto meta = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(a.package, "model");
  if (!meta.count("triton_rust.inputs")) {
    std::cerr << "aoti_bare: the package has no triton_rust.inputs metadata\n";
    return 2;
  }
  std::cout << "[";
  auto specs = inputs_from_metadata(meta["triton_rust.inputs"]);
  for (size_t i = 0; i < specs.size(); ++i) {
    std::cout << (i ? ", " : "") << "{\"name\": \"" << specs[i].name << "\", \"dtype\": \"" << specs[i].dtype
              << "\", \"dims\": [";
    for (size_t k = 0; k < specs[i].dims.size(); ++k) std::cout << (k ? ", " : "") << specs[i].dims[k];
    std::cout << "]}";
  }
  std::cout << "]" << std::endl;
  return 0;
}

int bench(const Args& a) {
  c10::InferenceMode no_grad;
  const c10::Device dev(c10::kCUDA, static_cast<c10::DeviceIndex>(a.device));
  c10::cuda::CUDAGuard device_guard(dev);
  auto before = temp_entries();
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  try {
    loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(a.package, "model", true, 1,
                                                                       static_cast<c10::DeviceIndex>(a.device));
  } catch (const std::exception& e) {
    std::cerr << "aoti_bare: cannot load '" << a.package << "': " << e.what() << "\n";
    return 1;
  }
  std::vector<std::string> unpacked;
  for (const auto& p : temp_entries()) {
    if (!before.count(p) && std::filesystem::is_directory(p) && holds_package_files(p)) unpacked.push_back(p);
  }
  auto meta = loader->get_metadata();
  if (meta.count("AOTI_DEVICE_KEY") && meta["AOTI_DEVICE_KEY"] != "cuda") {
    std::cerr << "aoti_bare: '" << a.package << "' is a package for '" << meta["AOTI_DEVICE_KEY"]
              << "', not a CUDA package\n";
    return 1;
  }
  std::vector<InputSpec> specs = a.inputs;
  if (specs.empty()) {
    if (!meta.count("triton_rust.inputs")) {
      std::cerr << "aoti_bare: the package has no triton_rust.inputs metadata: give each input with --input\n";
      return 2;
    }
    try {
      specs = inputs_from_metadata(meta["triton_rust.inputs"]);
    } catch (const std::exception& e) {
      std::cerr << "aoti_bare: " << e.what() << "\n";
      return 2;
    }
  }
  {
    std::ostringstream s;
    for (const auto& sp : specs) {
      s << " " << sp.name << " " << sp.dtype << "[B";
      for (auto d : sp.dims) s << "," << d;
      s << "]";
    }
    std::cerr << "aoti_bare: " << a.package << " (torch " << (meta.count("triton_rust.torch_version") ? meta["triton_rust.torch_version"] : "?")
              << ", compute capability " << (meta.count("AOTI_COMPUTE_CAPABILITY") ? meta["AOTI_COMPUTE_CAPABILITY"] : "?")
              << "); inputs:" << s.str() << "\n";
  }

  int rc = 0;
  auto stream = c10::cuda::getStreamFromPool(false, dev.index());
  c10::cuda::CUDAStreamGuard stream_guard(stream);
  for (auto batch : a.batches) {
    try {
      auto inputs = make_inputs(specs, batch, a.int_high, dev);
      cudaStream_t raw = stream.stream();
      std::vector<at::Tensor> plain_out;
      auto plain = stats(timed(stream, a.warmup, a.iters, [&] { plain_out = loader->run(inputs, raw); }));

      // one capture of the run, on this stream (the loader's lazy initialisation and
      // cuBLAS workspaces happened in the runs above)
      std::string graph_json;
      try {
        at::cuda::CUDAGraph graph;
        std::vector<at::Tensor> graph_out;
        stream.synchronize();
        graph.capture_begin(at::cuda::graph_pool_handle(), cudaStreamCaptureModeThreadLocal);
        graph_out = loader->run(inputs, raw);
        graph.capture_end();
        auto replayed = stats(timed(stream, a.warmup, a.iters, [&] { graph.replay(); }));
        // one call as a server makes it, timed on the host: the inputs copied into the graph's
        // own (from other device buffers), the replay, the wait for the stream
        std::vector<at::Tensor> sources;
        for (const auto& t : inputs) sources.push_back(t.clone());
        auto call = [&] {
          for (size_t k = 0; k < inputs.size(); ++k) inputs[k].copy_(sources[k], true);
          graph.replay();
          stream.synchronize();
        };
        for (int i = 0; i < a.warmup; ++i) call();
        std::vector<double> wall;
        wall.reserve(a.iters);
        for (int i = 0; i < a.iters; ++i) {
          auto t0 = std::chrono::steady_clock::now();
          call();
          wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        auto waited = stats(wall);
        // the same calls with the host idle `gap` us between them (a server at concurrency 1
        // leaves the GPU idle while a request comes and goes); and with the inputs in pageable
        // host memory, staged through pinned memory and copied up on the stream, as a server
        // does for a client's host buffers
        std::string gap_json;
        for (auto gap : a.gaps_us) {
          std::vector<double> g_wall, h_wall;
          std::vector<at::Tensor> host, pinned;
          for (const auto& t : sources) {
            host.push_back(t.cpu());
            pinned.push_back(at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true)));
          }
          auto host_call = [&] {
            for (size_t k = 0; k < inputs.size(); ++k) {
              std::memcpy(pinned[k].data_ptr(), host[k].data_ptr(), host[k].nbytes());
              inputs[k].copy_(pinned[k], true);
            }
            graph.replay();
            stream.synchronize();
          };
          auto idle = [gap] {
            auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(gap);
            while (std::chrono::steady_clock::now() < until) {
            }
          };
          for (int i = 0; i < a.warmup; ++i) call(), host_call();
          for (int i = 0; i < a.iters; ++i) {
            idle();
            auto t0 = std::chrono::steady_clock::now();
            call();
            g_wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            idle();
            t0 = std::chrono::steady_clock::now();
            host_call();
            h_wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          }
          gap_json += ", \"graph_call_gap" + std::to_string(gap) + "_p50_ms\": " + fmt(stats(g_wall).p50) +
                      ", \"graph_call_host_gap" + std::to_string(gap) + "_p50_ms\": " + fmt(stats(h_wall).p50);
        }
        double diff = 0;
        for (size_t k = 0; k < graph_out.size() && k < plain_out.size(); ++k) {
          if (graph_out[k].is_floating_point()) {
            diff = std::max(diff, (graph_out[k].to(at::kFloat) - plain_out[k].to(at::kFloat)).abs().max().item<double>());
          }
        }
        graph_json = ", \"graph_p50_ms\": " + fmt(replayed.p50) + ", \"graph_p99_ms\": " + fmt(replayed.p99) +
                     ", \"graph_ips\": " + fmt(batch / replayed.p50 * 1e3) + ", \"graph_vs_plain_max_abs\": " + fmt(diff) +
                     ", \"graph_call_p50_ms\": " + fmt(waited.p50) + ", \"graph_call_p99_ms\": " + fmt(waited.p99) +
                     gap_json;
      } catch (const std::exception& e) {
        (void)cudaGetLastError();
        std::string what = e.what();
        std::cerr << "aoti_bare: batch " << batch << ": no CUDA graph: " << what.substr(0, what.find('\n')) << "\n";
        graph_json = ", \"graph_p50_ms\": null, \"graph_p99_ms\": null, \"graph_ips\": null, \"graph_call_p50_ms\": null";
      }
      std::cout << "{\"package\": \"" << a.package << "\", \"batch\": " << batch << ", \"iters\": " << a.iters
                << ", \"plain_p50_ms\": " << fmt(plain.p50) << ", \"plain_p99_ms\": " << fmt(plain.p99)
                << ", \"plain_ips\": " << fmt(batch / plain.p50 * 1e3) << graph_json << "}" << std::endl;
    } catch (const std::exception& e) {
      std::string what = e.what();
      std::cerr << "aoti_bare: batch " << batch << ": " << what.substr(0, 600) << "\n";
      rc = 1;
    }
  }
  loader.reset();
  for (const auto& dir : unpacked) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return rc;
}

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
    return a.print_inputs ? print_inputs(a) : bench(a);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cerr << "aoti_bare: " << what.substr(0, what.find('\n')) << "\n";
    return 1;
  }
}
