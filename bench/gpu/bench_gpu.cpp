// mesh-bench-gpu: throughput of the kernels the Vulkan executor generates, and compile latency.
//
//   mesh-bench-gpu [--quick] [--zeros] [--fresh] [--reps N]
//
// Figures come from GPU timestamps around each kernel (median over N runs, after 300 ms of
// warm-up runs). Tensors are
// parameters resident on the device and results are written back as parameter updates, so no
// host transfer is timed. --quick uses small sizes (for lavapipe, which is CPU emulation).
// Run it next to shared/anchors/cuda_anchor.cu on the same GPU for the reference column.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "graph/builder.hpp"
#include "graph/nn.hpp"
#include "gpu/executor.hpp"

using namespace mesh;

// The static libstdc++ (std::random_device) references glibc 2.36's arc4random; defining it here
// keeps the binary loadable on a GPU machine with an older glibc (2.35). Nothing here draws on it
// for security.
extern "C" uint32_t arc4random(void) {
  static uint32_t state = 0x9e3779b9u;
  state ^= state << 13;
  state ^= state >> 17;
  state ^= state << 5;
  return state;
}

namespace {

int reps = 10;
bool zeros = false;  // --zeros: all-zero tensors, like the CUDA anchor
bool fresh = false;  // --fresh: every graph in a new executor (nothing allocated before it)
gpu::vulkan_options options;

struct result {
  double ms = 0;       // median kernel time (sum of the graph's kernels)
  int kernels = 0;
  std::string variant;  // the first kernel's variant and root node
};

/// Runs `g` reps+1 times (the first is a warm-up) and returns the median summed kernel time.
result time_graph(gpu::executor& shared_ex, const graph& g, const std::function<void(gpu::executor&)>& after = {}) {
  std::unique_ptr<gpu::executor> own;
  if (fresh) {
    auto e = gpu::make_vulkan_executor(options);
    if (!e) std::exit(1);
    own = std::move(*e);
  }
  gpu::executor& ex = fresh ? *own : shared_ex;
  tensor_map params;
  for (const auto& n : g.nodes)
    if (n.op == op_kind::parameter) {
      tensor t = tensor::zeros(n.type, n.dims);
      // Small values of both signs: every op stays on its normal path (no denormals, no NaN)
      // and results can be checked.
      for (int64_t i = 0; i < (zeros ? 0 : t.size()); ++i) t.set(i, 0.001 * static_cast<double>((i * 7919) % 97 - 48));
      params[n.attrs.name] = std::move(t);
    }
  if (auto ok = ex.set_parameters(params); !ok) {
    std::fprintf(stderr, "set_parameters: %s\n", ok.error().to_string().c_str());
    std::exit(1);
  }
  auto id = ex.load(g);
  if (!id) {
    std::fprintf(stderr, "load: %s\n", id.error().to_string().c_str());
    std::exit(1);
  }
  std::vector<double> times;
  result r;
  // Warm-up for 300 ms of runs: a GPU left idle (while the host checks results or compiles)
  // drops its clocks and needs a moment under load to raise them again.
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < warm_until)
    if (!ex.run(*id, {})) break;
  for (int i = 0; i <= reps; ++i) {
    auto out = ex.run(*id, {});
    if (!out) {
      std::fprintf(stderr, "run: %s\n", out.error().to_string().c_str());
      std::exit(1);
    }
    const auto s = ex.stats();
    double ms = 0;
    for (const auto& k : s.kernels) ms += k.last_ms;
    r.kernels = static_cast<int>(s.kernels.size());
    if (!s.kernels.empty()) r.variant = s.kernels[0].name;
    if (i > 0) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  r.ms = times[times.size() / 2];
  if (after) after(ex);
  return r;
}

/// Checks sampled entries of c = a x b (square, s x s) against a host dot product; returns the
/// largest normalised error.
double verify_matmul(gpu::executor& ex, const std::string& p, int64_t s) {
  auto got = ex.get_parameters({p + "a", p + "b", p + "c"});
  if (!got) return 1e9;
  const tensor &a = got->at(p + "a"), &b = got->at(p + "b"), &c = got->at(p + "c");
  double worst = 0;
  uint64_t state = 12345;
  for (int t = 0; t < 256; ++t) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t i = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(s));
    const int64_t j = static_cast<int64_t>((state >> 13) % static_cast<uint64_t>(s));
    double want = 0, scale = 0;
    for (int64_t k = 0; k < s; ++k) {
      want += a.at(i * s + k) * b.at(k * s + j);
      scale += std::abs(a.at(i * s + k) * b.at(k * s + j));
    }
    worst = std::max(worst, std::abs(c.at(i * s + j) - want) / std::max(scale, 1e-6));
  }
  return worst;
}

void row(const char* what, const std::string& size, const result& r, double amount, const char* unit) {
  std::printf("| %-36s | %-14s | %-12s | %7d | %9.3f | %10.1f %s |\n", what, size.c_str(), r.variant.c_str(), r.kernels, r.ms,
              amount / r.ms / 1e6, unit);
}

graph finish(builder& b) {
  auto g = b.finish();
  if (!g) {
    std::fprintf(stderr, "graph: %s\n", g.error().to_string().c_str());
    std::exit(1);
  }
  return *g;
}

/// An elementwise chain of `ops` ops over a and b (two reads, one write).
graph chain(int64_t n, int ops, int tag) {
  builder b;
  const std::string p = "bench" + std::to_string(tag) + ".";
  auto a = b.parameter(p + "a", dtype::f32, {n});
  auto c = b.parameter(p + "c", dtype::f32, {n});
  auto out = b.parameter(p + "out", dtype::f32, {n});
  expr t = a + c;
  for (int k = 1; k < ops; ++k) {
    switch (k % 4) {
      case 1: t = t * t; break;
      case 2: t = t - a; break;
      case 3: t = relu(t); break;
      default: t = t * 0.5; break;
    }
  }
  b.update(out, t);
  return finish(b);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--zeros")) zeros = true;
    else if (!std::strcmp(argv[i], "--fresh")) fresh = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
  }
  const std::string cache = "/tmp/mesh-bench-gpu-cache";
  std::filesystem::remove_all(cache);
  gpu::vulkan_options& o = options;
  o.cache_dir = cache;
  o.block_bytes = 256ull << 20;

  // Compile latency: cold (shaderc + driver), a new executor on the same disk cache, memory hit.
  auto timed_load = [&](gpu::executor& ex, const graph& g) {
    const auto t0 = std::chrono::steady_clock::now();
    auto id = ex.load(g);
    if (!id) {
      std::fprintf(stderr, "load: %s\n", id.error().to_string().c_str());
      std::exit(1);
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  builder tb;
  {
    auto x = tb.input("x", dtype::f32, {8, 16, 64});
    auto blk = nn::make_transformer_block(tb, "lat.blk", 64, 4);
    tb.output("y", blk(x));
  }
  const graph latency_graph = finish(tb);
  double cold = 0, disk = 0, memory = 0;
  uint64_t cold_compiles = 0, disk_compiles = 0;
  {
    auto ex = gpu::make_vulkan_executor(o);
    if (!ex) {
      std::fprintf(stderr, "no Vulkan executor: %s\n", ex.error().to_string().c_str());
      return 1;
    }
    cold = timed_load(**ex, latency_graph);
    cold_compiles = (*ex)->stats().shader_compiles;
    memory = timed_load(**ex, latency_graph);
  }
  auto exp_ex = gpu::make_vulkan_executor(o);
  if (!exp_ex) return 1;
  gpu::executor& ex = **exp_ex;
  disk = timed_load(ex, latency_graph);
  disk_compiles = ex.stats().shader_compiles;

  const auto& info = ex.info();
  std::printf("device: %s (%s), subgroup %u, shared memory %u B, 16-bit storage %s, NV coopmat %s%s\n\n", info.name.c_str(),
              info.kind.c_str(), info.subgroup_size, info.shared_memory_bytes, info.fp16 ? "yes" : "no",
              info.coopmat ? "offered" : "no", info.kind == "cpu" ? "  [CPU EMULATION: not GPU figures]" : "");
  std::printf("| %-36s | %-14s | %-12s | %7s | %9s | %15s |\n", "kernel", "size", "first kernel", "kernels", "ms", "throughput");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(38, '-').c_str(), std::string(16, '-').c_str(), std::string(14, '-').c_str(),
              std::string(9, '-').c_str(), std::string(11, '-').c_str(), std::string(17, '-').c_str());

  const int64_t n = quick ? (1 << 20) : (16 << 20);
  int tag = 0;
  for (int ops : {2, 3, 5, 8}) {
    const std::string what = ops == 2 ? "fused (a+b)^2 [CUDA anchor's kernel]" : "fused chain, " + std::to_string(ops) + " ops";
    row(what.c_str(), std::to_string(n >> 20) + "M f32", time_graph(ex, chain(n, ops, tag++)), 3.0 * n * 4, "GB/s");
  }
  const int64_t rows = quick ? 256 : 4096, cols = quick ? 1024 : 4096;
  const std::string rc = std::to_string(rows) + "x" + std::to_string(cols);
  auto reduce_graph = [&](int kind) {
    builder b;
    const std::string p = "red" + std::to_string(kind) + ".";
    auto x = b.parameter(p + "x", dtype::f32, {rows, cols});
    if (kind == 0) b.update(b.parameter(p + "o", dtype::f32, {rows}), sum(x, {1}));
    if (kind == 1) b.update(b.parameter(p + "o", dtype::f32, {cols}), sum(x, {0}));
    if (kind == 2) b.update(b.parameter(p + "o", dtype::f32, {rows, cols}), nn::softmax(x));
    if (kind == 3) {
      auto g = b.parameter(p + "g", dtype::f32, {cols});
      auto be = b.parameter(p + "b", dtype::f32, {cols});
      b.update(b.parameter(p + "o", dtype::f32, {rows, cols}), nn::layer_norm(x, g, be));
    }
    return finish(b);
  };
  const double mat = static_cast<double>(rows) * cols * 4;
  row("row sum (reduce last axis)", rc, time_graph(ex, reduce_graph(0)), mat, "GB/s");
  row("column sum (reduce first axis)", rc, time_graph(ex, reduce_graph(1)), mat, "GB/s");
  row("softmax rows (read+write)", rc, time_graph(ex, reduce_graph(2)), 2 * mat, "GB/s");
  row("layer norm rows (read+write)", rc, time_graph(ex, reduce_graph(3)), 2 * mat, "GB/s");

  const std::vector<int64_t> sizes = quick ? std::vector<int64_t>{256, 512} : std::vector<int64_t>{2048, 4096};
  for (auto s : sizes)
    for (dtype t : {dtype::f32, dtype::f16}) {
      builder b;
      const std::string p = "mm" + std::to_string(s) + to_string(t) + ".";
      auto a = b.parameter(p + "a", t, {s, s});
      auto w = b.parameter(p + "b", t, {s, s});
      b.update(b.parameter(p + "c", t, {s, s}), matmul(a, w));
      const std::string what = t == dtype::f32 ? "matmul fp32 (tiled, registers)" : "matmul f16 (coopmat if offered)";
      double err = 0;
      const result r = time_graph(ex, finish(b), [&](gpu::executor& e) { err = verify_matmul(e, p, s); });
      row(what.c_str(), std::to_string(s) + "^3", r, 2.0 * s * s * s, "GFLOP/s");
      std::printf("|   checked: max sampled error %.1e (relative to sum |a*b|)\n", err);
    }
  {
    builder b;
    const int64_t bm = quick ? 64 : 1024;
    auto x = b.parameter("ep.x", dtype::f32, {bm, 1024});
    auto w = b.parameter("ep.w", dtype::f32, {1024, 1024});
    auto bias = b.parameter("ep.b", dtype::f32, {1024});
    b.update(b.parameter("ep.o", dtype::f32, {bm, 1024}), nn::gelu(matmul(x, w) + bias));
    row("matmul + bias + gelu (1 kernel?)", std::to_string(bm) + "x1024x1024", time_graph(ex, finish(b)),
        2.0 * bm * 1024 * 1024, "GFLOP/s");
  }

  {
    // The same matmuls with the vec4 + prefetch variant, for comparison.
    setenv("MESH_GEMM", "vec4", 1);
    auto variant = gpu::make_vulkan_executor(o);
    if (variant)
      for (auto s : sizes) {
        builder b;
        const std::string p = "v4_" + std::to_string(s) + ".";
        auto a = b.parameter(p + "a", dtype::f32, {s, s});
        auto w = b.parameter(p + "b", dtype::f32, {s, s});
        b.update(b.parameter(p + "c", dtype::f32, {s, s}), matmul(a, w));
        double err = 0;
        const result r = time_graph(**variant, finish(b), [&](gpu::executor& e) { err = verify_matmul(e, p, s); });
        row("matmul fp32, vec4+prefetch variant", std::to_string(s) + "^3", r, 2.0 * s * s * s, "GFLOP/s");
        std::printf("|   checked: max sampled error %.1e\n", err);
      }
    unsetenv("MESH_GEMM");
  }
  {
    // f16 without tensor cores (16-bit storage, f32 math), for comparison.
    setenv("MESH_COOPMAT", "0", 1);
    auto variant = gpu::make_vulkan_executor(o);
    if (variant)
      for (auto s : sizes) {
        builder b;
        const std::string p = "nocoop" + std::to_string(s) + ".";
        auto a = b.parameter(p + "a", dtype::f16, {s, s});
        auto w = b.parameter(p + "b", dtype::f16, {s, s});
        b.update(b.parameter(p + "c", dtype::f16, {s, s}), matmul(a, w));
        double err = 0;
        const result r = time_graph(**variant, finish(b), [&](gpu::executor& e) { err = verify_matmul(e, p, s); });
        row("matmul f16, no coopmat (f32 math)", std::to_string(s) + "^3", r, 2.0 * s * s * s, "GFLOP/s");
        std::printf("|   checked: max sampled error %.1e\n", err);
      }
    unsetenv("MESH_COOPMAT");
  }

  std::printf("\ncompile latency (transformer block forward, %llu kernels compiled cold):\n",
              static_cast<unsigned long long>(cold_compiles));
  std::printf("  cold (shaderc + pipeline)       %8.1f ms\n", cold);
  std::printf("  new process-like executor, disk %8.1f ms (%llu shaderc compiles)\n", disk,
              static_cast<unsigned long long>(disk_compiles));
  std::printf("  same executor, memory cache     %8.1f ms\n", memory);
  std::filesystem::remove_all(cache);
  return 0;
}
