// The CPU executor's kernels against anchors measured in the same run:
// - f32 GEMM (gemm_f32, AVX2 and portable kernels) beside OpenBLAS cblas_sgemm, square sizes,
//   GFLOP/s best and median of the repetitions and the ratio of the bests;
// - linear with one row of x (a decode step) per weight dtype: weight bytes streamed per second
//   with the integer dots (x quantized to 8 bits: q4_k, q6_k, q8_0, q4_0 on AVX2) and with f32 x,
//   beside a plain read of the same bytes with the same threads (the memory's ceiling).
//
// usage: mesh-bench-cpu-gemm [--threads N] [--reps R] [--sizes 512,1024,2048] [--no-linear] [--linear-rows N]
// OpenBLAS runs N threads too (openblas_set_num_threads; OPENBLAS_NUM_THREADS is overridden). It is
// opened with dlopen after meshnode's measurements (its path found at build time).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "graph/quant.hpp"
#include "gpu/cpu_gemm.hpp"
#include "gpu/cpu_isa.hpp"
#include "gpu/cpu_linear.hpp"
#include "gpu/cpu_thread_pool.hpp"

#include <dlfcn.h>

using namespace mesh;
using namespace mesh::gpu;

namespace {

struct timing {
  double best = 0, median = 0;  // seconds
};

/// Runs f for 0.2 s to warm up (caches, clocks, and the threads of a virtual machine's idle
/// cores, which take tens of microseconds to wake), then `reps` times: the best and the median.
timing time_it(int reps, const std::function<void()>& f) {
  const auto warm = std::chrono::steady_clock::now();
  do f();
  while (std::chrono::steady_clock::now() - warm < std::chrono::milliseconds(200));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// OpenBLAS, opened after meshnode's measurements: its threads spin (sched_yield) from the
/// moment the library loads, and on a machine of few cores they take the cores from other threads'
/// short waits (a 64^3 product ran 15 times slower beside them).
struct openblas {
  using sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
  sgemm_fn sgemm = nullptr;
  std::string version;
  explicit openblas(unsigned threads) {
#ifdef MESH_OPENBLAS_PATH
    void* lib = dlopen(MESH_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    sgemm = reinterpret_cast<sgemm_fn>(dlsym(lib, "cblas_sgemm"));
    if (auto set = reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"))) set(static_cast<int>(threads));
    if (auto config = reinterpret_cast<const char* (*)()>(dlsym(lib, "openblas_get_config"))) version = config();
#else
    (void)threads;
#endif
  }
};

struct gemm_result {
  int64_t size = 0;
  timing avx, portable, blas;
  std::vector<float> c;  ///< meshnode's product, to compare with OpenBLAS's
};

std::vector<float> operand(int64_t s, uint64_t seed) { return random_floats(static_cast<size_t>(s * s), seed); }

gemm_result bench_gemm(int64_t s, int reps, thread_pool& pool) {
  const std::vector<float> a = operand(s, 1), b = operand(s, 2);
  gemm_result r;
  r.size = s;
  r.c.resize(static_cast<size_t>(s * s));
  auto ours = [&](cpu_isa isa) {
    gemm_args g;
    g.m = g.n = g.k = s;
    g.a = a.data(), g.a_row = s, g.b = b.data(), g.b_row = s, g.c = r.c.data(), g.c_row = s;
    return time_it(reps, [&] { gemm_f32(g, isa, &pool); });
  };
  r.portable = ours(cpu_isa::portable);
  r.avx = ours(supported_isa());
  return r;
}

void print_gemm(gemm_result& r, int reps, const openblas& blas, unsigned threads) {
  const int64_t s = r.size;
  const double flops = 2.0 * static_cast<double>(s) * static_cast<double>(s) * static_cast<double>(s);
  std::printf("gemm %5lld^3 %u threads  mesh %-8s best %7.1f median %7.1f GFLOP/s  mesh portable best %6.1f median %6.1f GFLOP/s",
              static_cast<long long>(s), threads, to_string(supported_isa()), flops / r.avx.best * 1e-9, flops / r.avx.median * 1e-9,
              flops / r.portable.best * 1e-9, flops / r.portable.median * 1e-9);
  if (!blas.sgemm) {
    std::printf("  (no OpenBLAS anchor)\n");
    return;
  }
  const std::vector<float> a = operand(s, 1), b = operand(s, 2);
  std::vector<float> c(static_cast<size_t>(s * s));
  const int n = static_cast<int>(s);
  r.blas = time_it(reps, [&] { blas.sgemm(101, 111, 111, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); });  // row-major, no transposes
  std::printf("  openblas best %7.1f median %7.1f GFLOP/s  mesh/openblas %.2f (best), %.2f (median)  max rel diff %.1e\n", flops / r.blas.best * 1e-9,
              flops / r.blas.median * 1e-9, r.blas.best / r.avx.best, r.blas.median / r.avx.median, max_rel_diff(r.c, c));
}

void bench_linear(dtype t, int64_t n, int reps, thread_pool& pool, unsigned threads) {
  const int64_t k = 2048;  // Llama-3.2-1B's hidden size
  const int64_t rb = *row_bytes(t, k);
  std::vector<uint8_t> w(static_cast<size_t>(n * rb));
  const std::vector<float> row = random_floats(static_cast<size_t>(k), 3);
  for (int64_t j = 0; j < n; ++j) (void)quantize_row(t, row, {w.data() + j * rb, static_cast<size_t>(rb)});
  const std::vector<float> x = random_floats(static_cast<size_t>(k), 4);
  std::vector<float> y(static_cast<size_t>(n));
  linear_args la;
  la.type = t, la.w = w.data(), la.n = n, la.k = k, la.x = x.data(), la.rows = 1, la.y = y.data();
  const double bytes = static_cast<double>(w.size());
  auto run = [&](cpu_isa isa, linear_x mode) {
    la.x_mode = mode;
    return time_it(reps, [&] { linear_f32(la, isa, &pool); });
  };
  const bool int8 = takes_int8_dots(t, supported_isa());
  const timing avx = run(supported_isa(), linear_x::f32), portable = run(cpu_isa::portable, linear_x::f32);
  const timing avx8 = int8 ? run(supported_isa(), linear_x::int8) : avx;
  // The ceiling: the same bytes read (summed as 64-bit words) by the same threads.
  std::vector<uint64_t> sums(64);
  const int64_t parts = 64, words = static_cast<int64_t>(w.size() / 8);
  const timing read = time_it(reps, [&] {
    pool.run(parts, [&](int64_t p) {
      uint64_t s = 0;
      const uint8_t* base = w.data();
      for (int64_t i = words * p / parts; i < words * (p + 1) / parts; ++i) {
        uint64_t v = 0;
        std::memcpy(&v, base + 8 * i, 8);
        s += v;
      }
      sums[static_cast<size_t>(p)] = s;
    });
  });
  std::printf("linear %-5s [%lld x %lld] x 1 row, %u threads: mesh %s", to_string(t), static_cast<long long>(n), static_cast<long long>(k), threads,
              to_string(supported_isa()));
  if (int8) std::printf(" int8 %6.2f GB/s (%5.2f ms, %.0f%% of the read),", bytes / avx8.median * 1e-9, avx8.median * 1e3, 100.0 * read.median / avx8.median);
  std::printf(" f32 x %6.2f GB/s (%5.2f ms, %.0f%%), portable %6.2f GB/s, plain read %6.2f GB/s\n", bytes / avx.median * 1e-9, avx.median * 1e3,
              100.0 * read.median / avx.median, bytes / portable.median * 1e-9, bytes / read.median * 1e-9);
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 2;
  int reps = 5;
  bool linear = true;
  int64_t linear_n = 8192;  // weight rows: 8192 (ffn_up, in L3 on large CPUs); 131072 streams from memory
  std::vector<int64_t> sizes{512, 1024, 2048};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = static_cast<unsigned>(std::atoi(argv[++i]));
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--no-linear") linear = false;
    else if (a == "--linear-rows" && i + 1 < argc) linear_n = std::max<int64_t>(1, std::atoll(argv[++i]));
    else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      for (const char* p = argv[++i]; *p;) {
        char* end = nullptr;
        sizes.push_back(std::strtoll(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) break;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--reps R] [--sizes 512,1024,2048] [--no-linear] [--linear-rows N]\n", argv[0]);
      return 2;
    }
  }
  thread_pool pool(threads);
  // meshnode's kernels first, all of them; OpenBLAS is loaded after (see openblas).
  std::vector<gemm_result> results;
  for (const int64_t size : sizes) results.push_back(bench_gemm(size, reps, pool));
  if (linear)
    for (const dtype t : {dtype::q4_k, dtype::q6_k, dtype::q8_0, dtype::q4_0, dtype::f16}) bench_linear(t, linear_n, reps * 4, pool, threads);
  const openblas blas(threads);
  std::printf("anchor: %s\n", blas.sgemm ? ("OpenBLAS " + blas.version + ", " + std::to_string(threads) + " threads").c_str()
                                          : "none (OpenBLAS not found at build time or not loadable)");
  for (auto& r : results) print_gemm(r, reps, blas, threads);
  return 0;
}
