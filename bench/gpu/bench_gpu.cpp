// mesh-bench-gpu: throughput of the kernels the Vulkan executor generates, and compile latency.
//
//   mesh-bench-gpu [--quick] [--zeros] [--fresh] [--reps N] [--no-sweep] [--no-step] [--reductions] [--gemm]
//                  [--reference-gemm GFLOPS]
//                  [--variants VAR=v1,v2,...]... [--matvec V1,V2,...] [--prefill V1,V2,...] [--attention]
//
// Matmul kernels are checked before they are timed: every variant timed here first computes
// odd-shaped, batched, broadcast-weight matmuls with a bias + relu epilogue, checked entry by entry
// on the host, and every timed matmul is checked on 256 sampled entries. Any failure prints
// "CHECK FAILED" and the exit status is 2. --no-sweep leaves out the other matmul variants
// (MESH_GEMM / MESH_COOPMAT), --no-step the transformer block training step; --reductions keeps
// only the reduction rows (split and one-pass), copy, the fp32 GEMM at 4096 and the training step.
// --gemm keeps only the GEMMs (fp32 and f16, 2048 and 4096): one executor per tile rasterisation
// MESH_GEMM_SWIZZLE = 0, 8, 16, 4, then 0 and 8 again (clock drift), each checked before it is timed.
// --variants MESH_COOPMAT=a,b,... (or MESH_GEMM=...; repeatable) keeps only those: one executor per
// value in the order given (repeat a value to see clock drift), checked entry by entry (every
// check shape), then its f16 (MESH_COOPMAT; MESH_COOPMAT_KHR: "" KHR matrices where offered, "0"
// NV ones), bf16 (MESH_COOPMAT_BF16: "" tensor cores where the device has bf16 cooperative
// matrices, "0" the f32 kernels) or fp32 GEMMs at 2048 and 4096 timed.
//
// --matvec V1,V2,... keeps only the decode matrix-vector kernels: for each MESH_MATVEC value
// ("default" is the default kernel) a new executor, then f16, q8_0, q4_k and q6_k weights on the
// Llama-3.2-1B projection shapes, each checked on 64 outputs, timed in weight GB/s.
// --attention: causal attention, 8 heads x 4096 rows x 4096 keys, d = 64, one kernel (`attnc` on
// tensor cores where the device has them, then `attnt` in f32: MESH_ATTENTION=f32), checked on
// sampled rows; bench/gpu/sdpa_reference.py times PyTorch's SDPA on the same shape.
// --prefill V1,V2,... the same with 512 rows of x (a prompt) for each MESH_LINEAR value ("default":
// `mmctl` on tensor cores where the device has them; "f32": the f32 matmul kernels), in GFLOP/s;
// a value VAR=v sets that kernel choice instead (MESH_LINEAR_DECODE=staged: quantized weights
// decoded while staged, not first). --prefill-rows R1,R2,... times those rows of x instead of 512;
// --linear-types T1,T2,... (f16, bf16, q8_0, q4_k, q6_k by default) the weight dtypes of both.
//
// Kernel choices by name, in --variants lists and in the environment (MESH_GEMM=wide
// mesh-bench-gpu runs everything with that variant): MESH_GEMM, MESH_COOPMAT, MESH_COOPMAT_BF16,
// MESH_COOPMAT_KHR and MESH_GEMM_SWIZZLE set gpu::kernel_variants (gemm, coopmat, coopmat_bf16,
// coopmat_khr, gemm_swizzle), MESH_SPLIT_REDUCE and MESH_FUSE_ROWS
// (0 or 1) vulkan_options::split_reductions and fuse_rows. The benchmark reads them and passes
// them in its vulkan_options; the library reads none of them.
//
// Figures come from GPU timestamps around each kernel (median over N runs, after warm-up runs:
// at least 300 ms, until the run time stops improving). Tensors are
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
#include <set>
#include <string>
#include <vector>

#include "graph/autodiff.hpp"
#include "graph/builder.hpp"
#include "graph/evaluate.hpp"
#include "graph/nn.hpp"
#include "graph/optim.hpp"
#include "graph/quant.hpp"
#include "graph/simplify.hpp"
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
int failures = 0;  // matmul and mean checks that failed (exit status 2)

struct result {
  double ms = 0;       // median kernel time (sum of the graph's kernels)
  int kernels = 0;
  std::string variant;  // the first kernel's variant and root node
};

/// GPU time of one run of program `id` (sum of its kernels), or -1 on error.
double run_ms(gpu::executor& ex, gpu::program_id id) {
  if (!ex.run(id, {})) return -1;
  double ms = 0;
  for (const auto& k : ex.stats().kernels) ms += k.last_ms;
  return ms;
}

/// Runs program `id` until the GPU is at speed: a GPU left idle (while the host checks results or
/// compiles) drops its clocks and needs time under load to raise them; short kernels leave it
/// idle between submits and raised them slowly (a 2048 GEMM measured 3x slow after 300 ms).
/// At least 300 ms, then on until no run has beaten the best by 2% for 200 ms (at most 3 s).
void warm_up(gpu::executor& ex, gpu::program_id id) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto last_best = start;
  double best = 1e30;
  while (clock::now() - start < std::chrono::seconds(3)) {
    const double ms = run_ms(ex, id);
    if (ms < 0) return;
    if (ms < best * 0.98) last_best = clock::now();
    best = std::min(best, ms);
    if (clock::now() - start > std::chrono::milliseconds(300) && clock::now() - last_best > std::chrono::milliseconds(200)) return;
  }
}

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
  warm_up(ex, *id);
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

/// Records a matmul check: prints it, and counts it as a failure over `limit`.
void report_check(const std::string& what, double err, double limit) {
  const bool ok = err <= limit;
  if (!ok) ++failures;
  std::printf("|   %s: max error %.1e (relative to sum |a*b|, limit %.0e)%s\n", what.c_str(), err, limit,
              ok ? "" : "  <<< CHECK FAILED");
}

/// Error limit for a matmul of `t` (inputs exact in f32; an f16 result is rounded twice).
double matmul_limit(dtype t) { return t == dtype::f32 ? 1e-4 : 1e-2; }

/// A deterministic pseudo-random tensor in [-1, 1) (rounded to its dtype).
tensor random_tensor(dtype t, const shape& s, uint64_t seed) {
  tensor x = tensor::zeros(t, s);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < x.size(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x.set(i, static_cast<double>(state >> 40) / static_cast<double>(1ull << 23) - 1.0);
  }
  return x;
}

/// Computes relu(a x w + bias) (a [batch, m, k] or [m, k]; w [k, n], or [batch, k, n] when
/// `batched_w`) on `ex` and checks every entry against a host dot product; returns the largest
/// error normalised by sum |a*w| + |bias|. Covers tile edges, batches, a weight broadcast over the
/// batch (read with batch stride 0) and the epilogue of whichever kernel the device picks.
/// The last two axes of `x` swapped, on the host.
tensor swap_last_two(const tensor& x) {
  shape d = x.dims;
  const int64_t r = d[d.size() - 2], c = d[d.size() - 1], mats = x.size() / std::max<int64_t>(r * c, 1);
  std::swap(d[d.size() - 2], d[d.size() - 1]);
  tensor y = tensor::zeros(x.type, d);
  for (int64_t z = 0; z < mats; ++z)
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) y.set(z * r * c + j * r + i, x.at(z * r * c + i * c + j));
  return y;
}

/// With `transposed`, a and w are stored transposed and the graph swaps them back (x^T and w^T
/// read through index arithmetic, as gradients read them).
double check_matmul(gpu::executor& ex, dtype t, int64_t batch, int64_t m, int64_t k, int64_t n, bool batched_w, bool plain,
                    std::string* kernel, bool transposed = false) {
  const std::string p = "chk" + std::to_string(batch) + "_" + std::to_string(m) + "_" + std::to_string(k) + "_" +
                        std::to_string(n) + (batched_w ? "b" : "") + (plain ? "p" : "") + (transposed ? "t" : "") +
                        to_string(t) + ".";
  const shape as{batch, m, k}, ws = batched_w ? shape{batch, k, n} : shape{k, n}, cs{batch, m, n};
  builder b;
  const auto swapped = [](shape d) {
    std::swap(d[d.size() - 2], d[d.size() - 1]);
    return d;
  };
  const auto swap_back = [](const expr& x) {
    return x.dims().size() == 2 ? transpose(x) : permute(x, {0, 2, 1});
  };
  auto a = transposed ? swap_back(b.parameter(p + "a", t, swapped(as))) : b.parameter(p + "a", t, as);
  auto w = transposed ? swap_back(b.parameter(p + "w", t, swapped(ws))) : b.parameter(p + "w", t, ws);
  auto bias = b.parameter(p + "bias", t, {n});
  b.update(b.parameter(p + "c", t, cs), plain ? matmul(a, w) : relu(matmul(a, w) + bias));
  tensor_map params{{p + "a", random_tensor(t, as, 1)}, {p + "w", random_tensor(t, ws, 2)}, {p + "bias", random_tensor(t, {n}, 3)}};
  const tensor logical_a = params[p + "a"], logical_w = params[p + "w"];  // what the reference multiplies
  if (transposed) {
    params[p + "a"] = swap_last_two(logical_a);
    params[p + "w"] = swap_last_two(logical_w);
  }
  if (plain) params[p + "bias"] = tensor::zeros(t, {n});  // not in the graph: the reference adds 0 and skips relu
  params[p + "c"] = tensor::zeros(t, cs);
  for (int64_t i = 0; i < params[p + "c"].size(); ++i) params[p + "c"].set(i, -7.0);  // poison: every entry must be written
  if (!ex.set_parameters(params)) return 1e9;
  auto id = ex.load(finish(b));
  if (!id || !ex.run(*id, {})) return 1e9;
  if (kernel && !ex.stats().kernels.empty()) *kernel = ex.stats().kernels[0].name;
  auto got = ex.get_parameters({p + "c"});
  if (!got) return 1e9;
  const auto values = [](const tensor& x) {
    std::vector<double> v(static_cast<size_t>(x.size()));
    for (int64_t i = 0; i < x.size(); ++i) v[static_cast<size_t>(i)] = x.at(i);
    return v;
  };
  const std::vector<double> va = values(logical_a), vw = values(logical_w), vb = values(params[p + "bias"]),
                            vc = values(got->at(p + "c"));
  double worst = 0;
  std::vector<double> want(static_cast<size_t>(n)), scale(static_cast<size_t>(n));
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < m; ++i) {
      // Row i of the result, accumulated along rows of w (contiguous reads).
      for (int64_t j = 0; j < n; ++j) want[j] = vb[j], scale[j] = std::abs(vb[j]);
      const double* w = vw.data() + (batched_w ? z * k * n : 0);
      for (int64_t q = 0; q < k; ++q) {
        const double x = va[static_cast<size_t>((z * m + i) * k + q)];
        for (int64_t j = 0; j < n; ++j) {
          want[j] += x * w[q * n + j];
          scale[j] += std::abs(x * w[q * n + j]);
        }
      }
      for (int64_t j = 0; j < n; ++j) {
        const double expect = plain ? want[j] : std::max(want[j], 0.0);
        const double err = std::abs(vc[static_cast<size_t>((z * m + i) * n + j)] - expect) / std::max(scale[j], 1e-6);
        worst = std::max(worst, std::isnan(err) ? 1e9 : err);
      }
    }
  return worst;
}

/// Runs the entry-by-entry matmul checks of dtype `t` on `ex` (the variant it was created for).
void check_matmuls(gpu::executor& ex, dtype t, const std::string& variant, bool quick, bool few) {
  struct shape4 { int64_t batch, m, k, n; bool batched_w, plain = false, transposed = false; };
  // Quick (lavapipe): small problems only. Otherwise both tile sizes with ragged edges; the sweep's
  // variants (`few`) get one small and one large problem.
  std::vector<shape4> cases{{1, 77, 40, 24, false}};
  if (quick) cases.insert(cases.end(), {{2, 130, 64, 136, true}, {2, 130, 64, 136, true, false, true}});
  else if (few) cases.push_back({2, 1000, 256, 1032, true});
  else
    cases.insert(cases.end(), {{1, 300, 264, 520, false}, {2, 1000, 256, 1032, true}, {4, 500, 128, 1000, false},
                               {2, 1000, 256, 1032, true, true}, {1, 300, 264, 520, false, false, true},
                               {2, 1000, 256, 1032, true, false, true}, {1, 300, 1100, 260, false},
                               {1, 300, 1100, 260, false, false, true}});  // the last two: few tiles, long k
  for (const auto& c : cases) {
    std::string kernel;
    const double err = check_matmul(ex, t, c.batch, c.m, c.k, c.n, c.batched_w, c.plain, &kernel, c.transposed);
    char what[200];
    std::snprintf(what, sizeof what, "check %s %s %lldx%lldx%lldx%lld%s%s%s", variant.c_str(), to_string(t),
                  static_cast<long long>(c.batch), static_cast<long long>(c.m), static_cast<long long>(c.k),
                  static_cast<long long>(c.n), c.batched_w ? " (batched w)" : " (w broadcast)",
                  c.plain ? " no epilogue" : " +bias relu", (std::string(c.transposed ? ", a and w stored transposed" : "") + " [" + kernel + "]").c_str());
    report_check(what, err, matmul_limit(t));
  }
}

/// Times the square matmuls of `sizes` in dtype `t` on `ex` and checks 256 sampled entries of
/// each; returns the best rate (GFLOP/s).
double time_matmuls(gpu::executor& ex, dtype t, const std::vector<int64_t>& sizes, const std::string& what) {
  double best = 0;
  for (auto s : sizes) {
    builder b;
    const std::string p = "mm" + std::to_string(s) + to_string(t) + what + ".";
    auto a = b.parameter(p + "a", t, {s, s});
    auto w = b.parameter(p + "b", t, {s, s});
    b.update(b.parameter(p + "c", t, {s, s}), matmul(a, w));
    double err = 0;
    const result r = time_graph(ex, finish(b), [&](gpu::executor& e) { err = verify_matmul(e, p, s); });
    row(what.c_str(), std::to_string(s) + "^3", r, 2.0 * s * s * s, "GFLOP/s");
    report_check("sampled check", err, matmul_limit(t));
    best = std::max(best, 2.0 * s * s * s / r.ms / 1e6);
  }
  return best;
}

/// Checks a timed graph's updated parameters against the reference evaluator (graph/evaluate.hpp,
/// in double) run on the same parameters, read back from the device; counts a failure when the
/// normalised error passes `tol`. For the rows with no check of their own (the fused chains,
/// the sums, the copy, the matmul epilogue): a fast wrong kernel must not make a figure.
std::function<void(gpu::executor&)> check_reference(const graph& g, double tol = 1e-5) {
  return [g, tol](gpu::executor& ex) {
    std::vector<std::string> inputs, targets;
    std::set<node_index> updated;
    for (const auto& u : g.updates) updated.insert(u.target);
    for (node_index id = 0; id < g.size(); ++id)
      if (g[id].op == op_kind::parameter) (updated.count(id) ? targets : inputs).push_back(g[id].attrs.name);
    auto got_in = ex.get_parameters(inputs);
    auto got_out = ex.get_parameters(targets);
    if (!got_in || !got_out) {
      ++failures;
      std::printf("|   reference check: cannot read the parameters back  CHECK FAILED\n");
      return;
    }
    tensor_map params = *got_in;
    for (const auto& t : targets) params[t] = got_out->at(t);
    auto reference = evaluate(g, {}, params);
    if (!reference) {
      ++failures;
      std::printf("|   reference check: the reference evaluator failed  CHECK FAILED\n");
      return;
    }
    params = std::move(reference->params);
    double worst = 0;
    for (const auto& t : targets) worst = std::max(worst, normalised_error(got_out->at(t), params.at(t)));
    const bool ok = worst <= tol;
    if (!ok) ++failures;
    std::printf("|   checked against the reference evaluator: largest error %.1e%s%s\n", worst,
                zeros ? " (--zeros: every value is 0, so this check says little)" : "", ok ? "" : "  CHECK FAILED");
  };
}

/// Checks a mean_all result (parameters p + "x" -> p + "o") against a host sum in double; counts
/// a failure when the error exceeds 1e-5 of mean |x|.
std::function<void(gpu::executor&)> check_mean(const std::string& p) {
  return [p](gpu::executor& ex) {
    auto got = ex.get_parameters({p + "x", p + "o"});
    if (!got) return;
    const tensor& x = got->at(p + "x");
    double sum = 0, abs_sum = 0;
    for (int64_t i = 0; i < x.size(); ++i) {
      sum += x.at(i);
      abs_sum += std::abs(x.at(i));
    }
    const double n = static_cast<double>(std::max<int64_t>(x.size(), 1));
    const double err = std::abs(got->at(p + "o").at(0) - sum / n) / std::max(abs_sum / n, 1e-30);
    const bool ok = err <= 1e-5;
    if (!ok) ++failures;
    std::printf("|   %s mean: error %.1e relative to mean |x|%s\n", p.c_str(), err, ok ? "" : "  CHECK FAILED");
  };
}

/// Checks softmax (`layer_norm` false) or layer norm rows (parameters p + "x", "g", "b" -> "o")
/// against the host in double, on 64 rows spread over the matrix; counts a failure when an
/// entry is off by more than 1e-5 (softmax: relative to the row's largest value).
std::function<void(gpu::executor&)> check_rows(const std::string& p, bool layer_norm) {
  return [p, layer_norm](gpu::executor& ex) {
    std::vector<std::string> names{p + "x", p + "o"};
    if (layer_norm) names.insert(names.end(), {p + "g", p + "b"});
    auto got = ex.get_parameters(names);
    if (!got) return;
    const tensor& x = got->at(p + "x");
    const tensor& o = got->at(p + "o");
    const int64_t rows = x.dims[0], cols = x.dims[1];
    double err = 0;
    std::vector<double> want(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; r += std::max<int64_t>(rows / 64, 1)) {
      const int64_t at = r * cols;
      double a = 0, b = 0, scale = 0;
      if (layer_norm) {
        for (int64_t c = 0; c < cols; ++c) a += x.at(at + c);
        a /= static_cast<double>(cols);
        for (int64_t c = 0; c < cols; ++c) b += (x.at(at + c) - a) * (x.at(at + c) - a);
        b = 1 / std::sqrt(b / static_cast<double>(cols) + 1e-5);
        for (int64_t c = 0; c < cols; ++c)
          want[static_cast<size_t>(c)] = (x.at(at + c) - a) * b * got->at(p + "g").at(c) + got->at(p + "b").at(c);
        scale = 1;
      } else {
        a = -1e300;
        for (int64_t c = 0; c < cols; ++c) a = std::max(a, x.at(at + c));
        for (int64_t c = 0; c < cols; ++c) b += std::exp(x.at(at + c) - a);
        for (int64_t c = 0; c < cols; ++c) {
          want[static_cast<size_t>(c)] = std::exp(x.at(at + c) - a) / b;
          scale = std::max(scale, want[static_cast<size_t>(c)]);
        }
      }
      for (int64_t c = 0; c < cols; ++c) err = std::max(err, std::abs(o.at(at + c) - want[static_cast<size_t>(c)]) / scale);
    }
    const bool ok = err <= 1e-5;
    if (!ok) ++failures;
    std::printf("|   %s rows: largest error %.1e%s\n", p.c_str(), err, ok ? "" : "  CHECK FAILED");
  };
}

/// Sets the kernel choice `var` (MESH_GEMM, MESH_COOPMAT, MESH_GEMM_SWIZZLE, MESH_SPLIT_REDUCE,
/// MESH_FUSE_ROWS: see the top of this file) to `value` in `o`; false for another name, or a
/// split/fuse value other than 0 or 1.
bool set_variant(gpu::vulkan_options& o, const std::string& var, const std::string& value) {
  if (var == "MESH_GEMM") o.variants.gemm = value;
  else if (var == "MESH_COOPMAT") o.variants.coopmat = value;
  else if (var == "MESH_COOPMAT_BF16") o.variants.coopmat_bf16 = value;
  else if (var == "MESH_COOPMAT_KHR") o.variants.coopmat_khr = value;
  else if (var == "MESH_MATVEC") o.variants.matvec = value;
  else if (var == "MESH_MATVEC_X") o.variants.matvec_x = value;
  else if (var == "MESH_LINEAR") o.variants.linear = value;
  else if (var == "MESH_LINEAR_DECODE") o.variants.linear_decode = value;
  else if (var == "MESH_ATTENTION") o.variants.attention = value;
  else if (var == "MESH_GEMM_SWIZZLE") o.variants.gemm_swizzle = static_cast<uint32_t>(std::clamp(std::atol(value.c_str()), 0L, 64L));
  else if ((var == "MESH_SPLIT_REDUCE" || var == "MESH_FUSE_ROWS") && (value == "0" || value == "1"))
    (var == "MESH_SPLIT_REDUCE" ? o.split_reductions : o.fuse_rows) = value[0] - '0';
  else return false;
  return true;
}

/// A new executor with the benchmark's options and kernel choice `var` set to `value`.
std::unique_ptr<gpu::executor> executor_with(const char* var, const char* value) {
  gpu::vulkan_options o = options;
  if (!set_variant(o, var, value)) {
    std::fprintf(stderr, "unknown kernel choice %s=%s\n", var, value);
    return nullptr;
  }
  auto ex = gpu::make_vulkan_executor(o);
  if (!ex) return nullptr;
  return std::move(*ex);
}

/// "a,b,c" as {"a", "b", "c"}.
std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    out.push_back(list.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

/// --matvec: the decode matrix-vector kernel (`lmv`) on the projection shapes of Llama-3.2-1B
/// (x [m, k] f32 times w [n, k] transposed) for each weight dtype, once per MESH_MATVEC value in
/// `variants` ("" is the default kernel). Each result is checked on 64 sampled outputs against a
/// double-precision dot product with the weight decoded by graph/quant.hpp's reference, then
/// timed; the figure is the weight's bytes over the kernel's time (the kernel is bound by them).
/// --prefill: the same products with 512 rows of x (a prompt), once per MESH_LINEAR value, in
/// GFLOP/s; the f16 tensor-core kernel (`mmctl`) rounds x and the weight to f16, so its check
/// allows 2e-3 of the sum of |w x| where the f32 kernels' allows 1e-4.
void time_linears(const std::vector<std::string>& variants, bool quick, bool prefill, const std::vector<int64_t>& prefill_rows,
                  const std::vector<dtype>& types) {
  struct shape_case {
    int64_t m, n, k;
  };
  std::vector<shape_case> cases =
      prefill ? (quick ? std::vector<shape_case>{{64, 256, 512}} : std::vector<shape_case>{})
      : quick ? std::vector<shape_case>{{1, 256, 512}, {4, 128, 512}}
              : std::vector<shape_case>{{1, 2048, 2048}, {1, 8192, 2048}, {1, 2048, 8192}, {1, 128256, 2048}, {4, 8192, 2048}};
  if (prefill && !quick)
    for (const int64_t m : prefill_rows)
      for (const auto& [n, k] : {std::pair<int64_t, int64_t>{2048, 2048}, {16384, 2048}, {2048, 8192}, {128256, 2048}}) cases.push_back({m, n, k});
  int tag = 0;
  for (const auto& entry : variants) {
    // "VAR=value" sets that kernel choice; a bare value is MESH_LINEAR's (MESH_MATVEC's).
    const size_t eq = entry.find('=');
    const std::string var = eq == std::string::npos ? (prefill ? "MESH_LINEAR" : "MESH_MATVEC") : entry.substr(0, eq);
    const std::string variant = eq == std::string::npos ? entry : entry.substr(eq + 1);
    auto vex = executor_with(var.c_str(), variant == "default" ? "" : variant.c_str());
    if (!vex) continue;
    for (dtype wt : types)
      for (const auto& c : cases) {
        const std::string p = "mv" + std::to_string(tag++) + ".";
        builder b;
        auto x = b.parameter(p + "x", dtype::f32, {c.m, c.k});
        auto w = b.parameter(p + "w", wt, {c.n, c.k});
        b.update(b.parameter(p + "y", dtype::f32, {c.m, c.n}), linear(x, w));
        const graph g = finish(b);
        uint64_t state = 99 + static_cast<uint64_t>(tag);
        auto draw = [&] {
          state = state * 6364136223846793005ull + 1442695040888963407ull;
          return static_cast<double>(static_cast<int64_t>(state >> 40) % 2001 - 1000) / 1000.0;
        };
        std::vector<double> xv(static_cast<size_t>(c.m * c.k)), wv(static_cast<size_t>(c.n * c.k));
        for (auto& v : xv) v = draw();
        for (auto& v : wv) v = draw();
        tensor_map params{{p + "x", tensor::from_values(dtype::f32, {c.m, c.k}, xv)},
                          {p + "w", tensor::from_values(wt, {c.n, c.k}, wv)},
                          {p + "y", tensor::zeros(dtype::f32, {c.m, c.n})}};
        const tensor wq = params.at(p + "w");
        if (auto ok = vex->set_parameters(params); !ok) {
          std::fprintf(stderr, "set_parameters: %s\n", ok.error().to_string().c_str());
          std::exit(1);
        }
        auto id = vex->load(g);
        if (!id) {
          std::fprintf(stderr, "load: %s\n", id.error().to_string().c_str());
          std::exit(1);
        }
        warm_up(*vex, *id);
        std::vector<double> times;
        std::string name;
        size_t kernels = 1;
        for (int i = 0; i <= reps; ++i) {
          const double ms = run_ms(*vex, *id);
          if (ms < 0) std::exit(1);
          if (i > 0) times.push_back(ms);
          // The kernels' names without their node ids: "dqw_q4_k+mmctl128x128_q4_k_dq".
          name.clear();
          for (const auto& ks : vex->stats().kernels) name += (name.empty() ? "" : "+") + ks.name.substr(0, ks.name.rfind('_'));
          kernels = std::max<size_t>(1, vex->stats().kernels.size());
        }
        std::sort(times.begin(), times.end());
        result r;
        r.ms = times[times.size() / 2];
        r.kernels = static_cast<int>(kernels);
        r.variant = name;
        // The check: sampled outputs against a dot product with the reference decoder's row.
        auto got = vex->get_parameters({p + "y"});
        double worst = got ? 0 : 1e9;
        const int64_t rb = *row_bytes(wt, c.k);
        std::vector<float> row_values(static_cast<size_t>(c.k));
        for (int t = 0; got && t < 64; ++t) {
          const int64_t j = static_cast<int64_t>((static_cast<uint64_t>(t) * 2654435761u) % static_cast<uint64_t>(c.n)), i = t % c.m;
          auto bytes = std::span<const uint8_t>(wq.bytes).subspan(static_cast<size_t>(j * rb), static_cast<size_t>(rb));
          if (!dequantize_row(wt, bytes, row_values)) return;
          double want = 0, scale = 0;
          for (int64_t e = 0; e < c.k; ++e) {
            want += row_values[static_cast<size_t>(e)] * xv[static_cast<size_t>(i * c.k + e)];
            scale += std::abs(row_values[static_cast<size_t>(e)] * xv[static_cast<size_t>(i * c.k + e)]);
          }
          worst = std::max(worst, std::abs(got->at(p + "y").at(i * c.n + j) - want) / std::max(scale, 1e-6));
        }
        const double limit = r.variant.find("mmctl") != std::string::npos ? 2e-3 : 1e-4;
        if (worst > limit) {
          std::printf("CHECK FAILED: %s %s %s, worst relative error %.3g\n", prefill ? "prefill" : "matvec", to_string(wt), variant.c_str(), worst);
          ++failures;
        }
        const std::string what = std::string(prefill ? "prefill " : "matvec ") + to_string(wt) +
                                 (variant == "default" ? "" : " " + var + "=" + variant);
        const std::string size = std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k);
        if (prefill) row(what.c_str(), size, r, 2.0 * static_cast<double>(c.m * c.n) * static_cast<double>(c.k), "GFLOP/s");
        else row(what.c_str(), size, r, static_cast<double>(wq.bytes.size()), "GB/s");
        vex->unload(*id);
      }
  }
}

/// --attention: causal attention, 8 heads x 4096 query rows x 4096 keys, d = 64 (a prompt's
/// shape; bench/gpu/sdpa_reference.py times PyTorch's scaled_dot_product_attention on it), f32
/// tensors, as the models' prompts run it (one kernel: `attnc` on tensor cores where the device
/// has cooperative matrices, `attnt` in f32 with MESH_ATTENTION=f32 or without them). Checked on
/// 6 sampled rows of every head against a host computation in double (to 1e-4, or 5e-3 for
/// `attnc`'s f16 operands); GFLOP/s count the causal half, 4 h d l (l + 1) / 2.
void time_attention(bool quick, const char* variant) {
  const int64_t l = quick ? 96 : 4096, h = 8, d = 64;
  auto ex = executor_with("MESH_ATTENTION", variant);
  if (!ex) return;
  gpu::executor& vex = *ex;
  builder b;
  auto q = b.parameter("at.q", dtype::f32, {l, h, d});
  auto k = b.parameter("at.k", dtype::f32, {l, h, d});
  auto v = b.parameter("at.v", dtype::f32, {l, h, d});
  auto pos = b.parameter("at.pos", dtype::i32, {l});
  b.update(b.parameter("at.y", dtype::f32, {l, h, d}), attention(q, k, v, pos));
  const graph g = finish(b);
  uint64_t state = 7;
  auto draw = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(static_cast<int64_t>(state >> 40) % 2001 - 1000) / 1000.0;
  };
  std::vector<double> qv(static_cast<size_t>(l * h * d)), kv(qv.size()), vv(qv.size()), pv(static_cast<size_t>(l));
  for (auto* x : {&qv, &kv, &vv})
    for (auto& e : *x) e = draw();
  for (int64_t i = 0; i < l; ++i) pv[static_cast<size_t>(i)] = static_cast<double>(i);
  const tensor_map params{{"at.q", tensor::from_values(dtype::f32, {l, h, d}, qv)}, {"at.k", tensor::from_values(dtype::f32, {l, h, d}, kv)},
                          {"at.v", tensor::from_values(dtype::f32, {l, h, d}, vv)}, {"at.pos", tensor::from_values(dtype::i32, {l}, pv)},
                          {"at.y", tensor::zeros(dtype::f32, {l, h, d})}};
  if (auto ok = vex.set_parameters(params); !ok) {
    std::fprintf(stderr, "set_parameters: %s\n", ok.error().to_string().c_str());
    std::exit(1);
  }
  auto id = vex.load(g);
  if (!id) {
    std::fprintf(stderr, "load: %s\n", id.error().to_string().c_str());
    std::exit(1);
  }
  warm_up(vex, *id);
  std::vector<double> times;
  result r;
  for (int i = 0; i <= reps; ++i) {
    const double ms = run_ms(vex, *id);
    if (ms < 0) std::exit(1);
    if (i > 0) times.push_back(ms);
    if (!vex.stats().kernels.empty()) r.variant = vex.stats().kernels[0].name.substr(0, vex.stats().kernels[0].name.rfind('_'));
  }
  std::sort(times.begin(), times.end());
  r.ms = times[times.size() / 2];
  r.kernels = static_cast<int>(vex.stats().kernels.size());
  auto got = vex.get_parameters({"at.y"});
  double worst = got ? 0 : 1e9;
  for (int64_t i : {int64_t{0}, int64_t{1}, l / 3, l / 2, l - 2, l - 1})
    for (int64_t j = 0; got && j < h; ++j) {
      std::vector<double> w(static_cast<size_t>(i + 1));
      double top = -1e300, total = 0;
      for (int64_t t = 0; t <= i; ++t) {
        double dot = 0;
        for (int64_t x = 0; x < d; ++x) dot += qv[static_cast<size_t>((i * h + j) * d + x)] * kv[static_cast<size_t>((t * h + j) * d + x)];
        w[static_cast<size_t>(t)] = dot / std::sqrt(static_cast<double>(d));
        top = std::max(top, w[static_cast<size_t>(t)]);
      }
      for (auto& e : w) total += (e = std::exp(e - top));
      for (int64_t x = 0; x < d; ++x) {
        double want = 0;
        for (int64_t t = 0; t <= i; ++t) want += w[static_cast<size_t>(t)] * vv[static_cast<size_t>((t * h + j) * d + x)];
        worst = std::max(worst, std::abs(got->at("at.y").at((i * h + j) * d + x) - want / total));
      }
    }
  if (worst > (r.variant.rfind("attnc", 0) == 0 ? 5e-3 : 1e-4)) {
    std::printf("CHECK FAILED: attention (%s), worst error %.3g\n", r.variant.c_str(), worst);
    ++failures;
  }
  const std::string size = std::to_string(h) + "x" + std::to_string(l) + "x" + std::to_string(l) + " d" + std::to_string(d);
  row(r.variant.rfind("attnc", 0) == 0 ? "attention causal f16 ops" : "attention causal f32", size, r, 4.0 * static_cast<double>(h * d) * static_cast<double>(l) * static_cast<double>(l + 1) / 2, "GFLOP/s");
}

/// --variants VAR=v1,v2,...: for each value, a new executor with VAR=value, its matmuls checked
/// entry by entry, then its GEMMs timed (f16 for MESH_COOPMAT, fp32 otherwise).
void time_variants(const std::string& list, bool quick) {
  const size_t eq = list.find('=');
  if (eq == std::string::npos) return;
  const std::string var = list.substr(0, eq);
  const dtype t = var == "MESH_COOPMAT" || var == "MESH_COOPMAT_KHR" ? dtype::f16 : var == "MESH_COOPMAT_BF16" ? dtype::bf16 : dtype::f32;
  const std::vector<int64_t> sizes = quick ? std::vector<int64_t>{256, 512} : std::vector<int64_t>{2048, 4096};
  for (const std::string& value : split_list(list.substr(eq + 1))) {
    auto vex = executor_with(var.c_str(), value.c_str());
    if (!vex) continue;
    const std::string tag = var + "=" + value;
    check_matmuls(*vex, t, tag, quick, false);
    time_matmuls(*vex, t, sizes, std::string("matmul ") + (t == dtype::f32 ? "fp32" : to_string(t)) + ", " + tag);
  }
}

/// One training step of a transformer block (forward, backward through autodiff, SGD update),
/// timed per kernel (median of `reps` runs each) against each kernel's ideal time:
/// max(bytes / copy bandwidth, flops / GEMM rate), both measured earlier in the same run.
/// `as_built`: the graph as autodiff makes it; otherwise simplified, as the trainer ships it.
void transformer_step(gpu::executor& ex, int64_t batch, int64_t time, int64_t channels, int64_t heads, double copy_gbs,
                      double gemm_gflops, const char* gemm_source, bool as_built = false) {
  builder b;
  auto x = b.parameter("step.x", dtype::f32, {batch, time, channels});
  auto blk = nn::make_transformer_block(b, "step.blk", channels, heads);
  auto loss = nn::mse(blk(x), b.fill(0.25, dtype::f32, {batch, time, channels}));
  const std::vector<expr> params{blk.ln1_gamma, blk.ln1_beta, blk.attn.wq, blk.attn.wk, blk.attn.wv, blk.attn.wo,
                                 blk.ln2_gamma, blk.ln2_beta, blk.up.w,    blk.up.b,    blk.down.w,  blk.down.b};
  optim::sgd(b, params, gradients(loss, params), {.lr = 1e-3});
  const graph g = as_built ? finish(b) : simplify(finish(b));
  tensor_map init = nn::init_parameters(g, 7);
  init["step.x"] = random_tensor(dtype::f32, {batch, time, channels}, 9);
  if (!ex.set_parameters(init)) std::exit(1);
  auto id = ex.load(g);
  if (!id) {
    std::fprintf(stderr, "load: %s\n", id.error().to_string().c_str());
    std::exit(1);
  }
  warm_up(ex, *id);
  std::vector<std::vector<double>> per_kernel;
  std::vector<gpu::kernel_timing> kernels;
  for (int i = 0; i < reps; ++i) {
    if (!ex.run(*id, {})) std::exit(1);
    kernels = ex.stats().kernels;
    per_kernel.resize(kernels.size());
    for (size_t k = 0; k < kernels.size(); ++k) per_kernel[k].push_back(kernels[k].last_ms);
  }
  struct line { std::string name; double ms, ideal_ms; };
  std::vector<line> lines;
  double total = 0, ideal = 0, mm_ms = 0, mm_ideal = 0;
  for (size_t k = 0; k < kernels.size(); ++k) {
    auto& v = per_kernel[k];
    std::sort(v.begin(), v.end());
    const double ms = v[v.size() / 2];
    const double ideal_ms = std::max(static_cast<double>(kernels[k].bytes) / copy_gbs / 1e6, kernels[k].flops / gemm_gflops / 1e6);
    lines.push_back({kernels[k].name, ms, ideal_ms});
    total += ms;
    ideal += ideal_ms;
    if (kernels[k].flops > 0) {
      mm_ms += ms;
      mm_ideal += ideal_ms;
    }
  }
  std::printf("\ntransformer block training step (x [%lld, %lld, %lld], %lld heads; forward, backward, SGD; %s): %zu kernels\n",
              static_cast<long long>(batch), static_cast<long long>(time), static_cast<long long>(channels),
              static_cast<long long>(heads), as_built ? "the graph as autodiff built it" : "simplified, as the trainer ships it",
              kernels.size());
  std::printf("  ideal per kernel = max(bytes / %.0f GB/s copy (measured above), flops / %.0f GFLOP/s fp32 GEMM (%s))\n",
              copy_gbs, gemm_gflops, gemm_source);
  std::printf("  measured %.3f ms, sum of ideal times %.3f ms: %.0f%% of ideal\n", total, ideal, 100.0 * ideal / total);
  std::printf("  matmul kernels %.3f ms (ideal %.3f), other kernels %.3f ms (ideal %.3f)\n", mm_ms, mm_ideal, total - mm_ms,
              ideal - mm_ideal);
  std::sort(lines.begin(), lines.end(), [](const line& p, const line& q) { return p.ms - p.ideal_ms > q.ms - q.ideal_ms; });
  std::printf("  largest gaps (kernel, ms, ideal ms):\n");
  for (size_t i = 0; i < std::min<size_t>(lines.size(), 12); ++i)
    std::printf("    %-22s %8.3f %8.3f\n", lines[i].name.c_str(), lines[i].ms, lines[i].ideal_ms);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, sweep = true, step = true, focus = false, gemm_only = false;
  // --reference-gemm R: the fp32 GEMM rate (GFLOP/s) the training step's ideal times use, e.g.
  // cuBLAS SGEMM measured in the same run; without it, our own fp32 kernel's rate (which then
  // judges the step's matmuls against themselves: a faster GEMM would barely move the ratio).
  double reference_gemm = 0;
  std::vector<std::string> variant_lists;  // --variants VAR=v1,v2,...
  std::vector<std::string> matvec_variants;  // --matvec V1,V2,... ("default" is the default kernel)
  std::vector<std::string> prefill_variants;  // --prefill V1,V2,... (MESH_LINEAR values)
  std::vector<int64_t> prefill_rows{512};     // --prefill-rows R1,R2,...
  std::vector<dtype> linear_types{dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_k, dtype::q6_k};  // --linear-types T1,T2,...
  bool attention_only = false;                 // --attention
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--zeros")) zeros = true;
    else if (!std::strcmp(argv[i], "--fresh")) fresh = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--no-sweep")) sweep = false;
    else if (!std::strcmp(argv[i], "--no-step")) step = false;
    else if (!std::strcmp(argv[i], "--reductions")) sweep = false, focus = true;
    else if (!std::strcmp(argv[i], "--gemm")) gemm_only = true;
    else if (!std::strcmp(argv[i], "--matvec") && i + 1 < argc) matvec_variants = split_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--prefill") && i + 1 < argc) prefill_variants = split_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--linear-types") && i + 1 < argc) {
      linear_types.clear();
      for (const auto& t : split_list(argv[++i]))
        for (dtype d : {dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k})
          if (t == to_string(d)) linear_types.push_back(d);
    } else if (!std::strcmp(argv[i], "--prefill-rows") && i + 1 < argc) {
      prefill_rows.clear();
      for (const auto& r : split_list(argv[++i])) prefill_rows.push_back(std::max(17L, std::atol(r.c_str())));
    }
    else if (!std::strcmp(argv[i], "--attention")) attention_only = true;
    else if (!std::strcmp(argv[i], "--variants") && i + 1 < argc) variant_lists.push_back(argv[++i]);
    else if (!std::strcmp(argv[i], "--reference-gemm") && i + 1 < argc) reference_gemm = std::atof(argv[++i]);
  }
  const std::string cache = "/tmp/mesh-bench-gpu-cache";
  std::filesystem::remove_all(cache);
  gpu::vulkan_options& o = options;
  o.cache_dir = cache;
  o.block_bytes = 256ull << 20;
  for (const char* var : {"MESH_GEMM", "MESH_COOPMAT", "MESH_COOPMAT_BF16", "MESH_COOPMAT_KHR", "MESH_GEMM_SWIZZLE", "MESH_SPLIT_REDUCE", "MESH_FUSE_ROWS", "MESH_LINEAR_DECODE"})
    if (const char* v = std::getenv(var); v && !set_variant(o, var, v))
      std::fprintf(stderr, "%s=%s ignored (0 or 1)\n", var, v);

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
  double cold = 0, disk = 0, memory = 0, memory_per_kernel = 0;
  uint64_t cold_compiles = 0, disk_compiles = 0;
  {
    auto ex = gpu::make_vulkan_executor(o);
    if (!ex) {
      std::fprintf(stderr, "no Vulkan executor: %s\n", ex.error().to_string().c_str());
      return 1;
    }
    cold = timed_load(**ex, latency_graph);
    cold_compiles = (*ex)->stats().shader_compiles;
    // The cache-hit path, 15 times (the median): the whole load, and its kernel-making part
    // (emit GLSL, find the SPIR-V and the pipeline) per kernel.
    std::vector<double> loads, per_kernel;
    for (int i = 0; i < 15; ++i) {
      const auto before = (*ex)->stats();
      loads.push_back(timed_load(**ex, latency_graph));
      const auto after = (*ex)->stats();
      per_kernel.push_back((after.kernel_making_ms - before.kernel_making_ms) /
                           static_cast<double>(std::max<uint64_t>(after.kernels_made - before.kernels_made, 1)));
    }
    std::sort(loads.begin(), loads.end());
    std::sort(per_kernel.begin(), per_kernel.end());
    memory = loads[loads.size() / 2];
    memory_per_kernel = per_kernel[per_kernel.size() / 2];
  }
  auto exp_ex = gpu::make_vulkan_executor(o);
  if (!exp_ex) return 1;
  gpu::executor& ex = **exp_ex;
  disk = timed_load(ex, latency_graph);
  disk_compiles = ex.stats().shader_compiles;

  const auto& info = ex.info();
  std::printf("device: %s (%s), subgroup %u, shared memory %u B, 16-bit storage %s, NV coopmat %s, KHR coopmat f16 %s bf16 %s%s\n\n",
              info.name.c_str(), info.kind.c_str(), info.subgroup_size, info.shared_memory_bytes, info.fp16 ? "yes" : "no",
              info.coopmat ? "offered" : "no", info.coopmat_khr ? "enabled" : "no", info.coopmat_bf16 ? "enabled" : "no", info.kind == "cpu" ? "  [CPU EMULATION: not GPU figures]" : "");
  std::printf("| %-36s | %-14s | %-12s | %7s | %9s | %15s |\n", "kernel", "size", "first kernel", "kernels", "ms", "throughput");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(38, '-').c_str(), std::string(16, '-').c_str(), std::string(14, '-').c_str(),
              std::string(9, '-').c_str(), std::string(11, '-').c_str(), std::string(17, '-').c_str());

  if (!variant_lists.empty()) {
    for (const auto& list : variant_lists) time_variants(list, quick);
    if (failures) std::printf("\n%d CHECKS FAILED\n", failures);
    std::filesystem::remove_all(cache);
    return failures ? 2 : 0;
  }
  if (attention_only) {
    for (const char* variant : {"", "f32"}) time_attention(quick, variant);
    if (failures) std::printf("\n%d CHECKS FAILED\n", failures);
    std::filesystem::remove_all(cache);
    return failures ? 2 : 0;
  }
  if (!matvec_variants.empty() || !prefill_variants.empty()) {
    time_linears(matvec_variants, quick, false, prefill_rows, linear_types);
    time_linears(prefill_variants, quick, true, prefill_rows, linear_types);
    if (failures) std::printf("\n%d CHECKS FAILED\n", failures);
    std::filesystem::remove_all(cache);
    return failures ? 2 : 0;
  }
  if (gemm_only) {
    const std::vector<int64_t> gs = quick ? std::vector<int64_t>{256, 512} : std::vector<int64_t>{2048, 4096};
    for (const char* v : {"0", "8", "16", "4", "0", "8"})
      if (auto vex = executor_with("MESH_GEMM_SWIZZLE", v)) {
        const std::string tagv = std::string("MESH_GEMM_SWIZZLE=") + v;
        check_matmuls(*vex, dtype::f32, tagv, quick, false);
        time_matmuls(*vex, dtype::f32, gs, "matmul fp32, " + tagv);
        if (info.coopmat) {
          check_matmuls(*vex, dtype::f16, tagv, quick, false);
          time_matmuls(*vex, dtype::f16, gs, "matmul f16, " + tagv);
        }
      }
    if (failures) std::printf("\n%d CHECKS FAILED\n", failures);
    std::filesystem::remove_all(cache);
    return failures ? 2 : 0;
  }
  const int64_t n = quick ? (1 << 20) : (16 << 20);
  int tag = 0;
  for (int ops : {2, 3, 5, 8}) {
    if (focus) break;
    const std::string what = ops == 2 ? "fused (a+b)^2 [CUDA anchor's kernel]" : "fused chain, " + std::to_string(ops) + " ops";
    const graph g = chain(n, ops, tag++);
    row(what.c_str(), std::to_string(n >> 20) + "M f32", time_graph(ex, g, check_reference(g)), 3.0 * n * 4, "GB/s");
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
  row("row sum (reduce last axis)", rc, time_graph(ex, reduce_graph(0), check_reference(reduce_graph(0))), mat, "GB/s");
  row("column sum (reduce first axis)", rc, time_graph(ex, reduce_graph(1), check_reference(reduce_graph(1))), mat, "GB/s");
  if (!focus) {
    // Fused: one rows kernel each; MESH_FUSE_ROWS=0 times the three kernels they replace.
    row("softmax rows (read+write)", rc, time_graph(ex, reduce_graph(2), check_rows("red2.", false)), 2 * mat, "GB/s");
    row("layer norm rows (read+write)", rc, time_graph(ex, reduce_graph(3), check_rows("red3.", true)), 2 * mat, "GB/s");
    if (auto unfused = executor_with("MESH_FUSE_ROWS", "0")) {
      row("softmax rows, unfused (MESH_FUSE_ROWS=0)", rc, time_graph(*unfused, reduce_graph(2), check_rows("red2.", false)),
          2 * mat, "GB/s");
      row("layer norm rows, unfused", rc, time_graph(*unfused, reduce_graph(3), check_rows("red3.", true)), 2 * mat, "GB/s");
    }
  }
  // Full reductions (one output): a loss's mean. Split into two passes unless MESH_SPLIT_REDUCE=0;
  // the one-pass kernels (one workgroup per output, 32 columns per workgroup) are timed beside them.
  const std::vector<int64_t> full_sizes = quick ? std::vector<int64_t>{1 << 20} : std::vector<int64_t>{1572864, n};
  auto full_mean = [&](const std::string& p, int64_t count) {
    builder b;
    b.update(b.parameter(p + "o", dtype::f32, {}), mean_all(b.parameter(p + "x", dtype::f32, {count})));
    return finish(b);
  };
  for (auto count : full_sizes)
    row("mean over all (split reduction)", std::to_string(count) + " f32",
        time_graph(ex, full_mean("mean" + std::to_string(count) + ".", count), check_mean("mean" + std::to_string(count) + ".")),
        count * 4.0, "GB/s");
  auto one_pass = executor_with("MESH_SPLIT_REDUCE", "0");
  if (one_pass) {
    row("column sum, one pass (no split)", rc, time_graph(*one_pass, reduce_graph(1), check_reference(reduce_graph(1))), mat, "GB/s");
    for (auto count : full_sizes)
      row("mean over all, one pass (no split)", std::to_string(count) + " f32",
          time_graph(*one_pass, full_mean("mean1p" + std::to_string(count) + ".", count),
                     check_mean("mean1p" + std::to_string(count) + ".")),
          count * 4.0, "GB/s");
  }

  // --reductions: only what the reduction rows and the training step need (the fp32 GEMM rate
  // is the step's ideal for matmul kernels).
  const std::vector<int64_t> sizes = quick ? std::vector<int64_t>{256, 512}
                                     : focus ? std::vector<int64_t>{4096}
                                             : std::vector<int64_t>{2048, 4096};
  check_matmuls(ex, dtype::f32, "default", quick, false);
  if (!focus) check_matmuls(ex, dtype::f16, "default", quick, false);
  if (!focus) check_matmuls(ex, dtype::bf16, "default", quick, false);
  const double gemm_gflops = time_matmuls(ex, dtype::f32, sizes, "matmul fp32 (default kernel)");
  if (!focus) time_matmuls(ex, dtype::f16, sizes, "matmul f16 (default kernel)");
  if (!focus) time_matmuls(ex, dtype::bf16, sizes, "matmul bf16 (default kernel)");
  if (!focus) {
    builder b;
    const int64_t bm = quick ? 64 : 1024;
    auto x = b.parameter("ep.x", dtype::f32, {bm, 1024});
    auto w = b.parameter("ep.w", dtype::f32, {1024, 1024});
    auto bias = b.parameter("ep.b", dtype::f32, {1024});
    b.update(b.parameter("ep.o", dtype::f32, {bm, 1024}), nn::gelu(matmul(x, w) + bias));
    const graph g = finish(b);
    row("matmul + bias + gelu (1 kernel?)", std::to_string(bm) + "x1024x1024", time_graph(ex, g, check_reference(g, 1e-4)),
        2.0 * bm * 1024 * 1024, "GFLOP/s");
  }
  // Copy bandwidth (y = -x: one read, one write), the memory ceiling of the training step.
  double copy_gbs = 0;
  {
    builder b;
    auto x = b.parameter("copy.x", dtype::f32, {n});
    b.update(b.parameter("copy.y", dtype::f32, {n}), -x);
    const graph g = finish(b);
    const result r = time_graph(ex, g, check_reference(g, 0));
    row("copy y = -x (read + write)", std::to_string(n >> 20) + "M f32", r, 2.0 * n * 4, "GB/s");
    copy_gbs = 2.0 * n * 4 / r.ms / 1e6;
  }

  if (sweep) {
    // The other kernel variants, each in its own executor, each checked entry by entry before
    // it is timed. "classic" and "64" are the kernels these replaced.
    for (const char* v : {"classic", "warp16", "wide", "narrow"})
      if (auto vex = executor_with("MESH_GEMM", v)) {
        check_matmuls(*vex, dtype::f32, std::string("MESH_GEMM=") + v, quick, true);
        time_matmuls(*vex, dtype::f32, sizes, std::string("matmul fp32, MESH_GEMM=") + v);
      }
    if (info.coopmat)
      for (const char* v : {"64", "s8", "wide", "0"})
        if (auto vex = executor_with("MESH_COOPMAT", v)) {
          check_matmuls(*vex, dtype::f16, std::string("MESH_COOPMAT=") + v, quick, true);
          time_matmuls(*vex, dtype::f16, sizes, std::string("matmul f16, MESH_COOPMAT=") + v);
        }
  }
  if (step) {
    auto unfused = executor_with("MESH_FUSE_ROWS", "0");
    for (gpu::executor* e : {&ex, unfused.get(), one_pass.get()}) {
      if (!e) continue;
      if (e == unfused.get()) std::printf("\nrow kernels not fused (MESH_FUSE_ROWS=0), for comparison:");
      if (e == one_pass.get()) std::printf("\none-pass reductions (MESH_SPLIT_REDUCE=0), for comparison:");
      for (bool as_built : {false, true}) {
        if (as_built && e != &ex) continue;  // the unsimplified graph on the default executor only
        const double rate = reference_gemm > 0 ? reference_gemm : gemm_gflops;
        const char* source = reference_gemm > 0 ? "given: --reference-gemm" : "our own kernel, measured above";
        if (quick) transformer_step(*e, 2, 32, 64, 4, copy_gbs, rate, source, as_built);
        else transformer_step(*e, 8, 256, 768, 12, copy_gbs, rate, source, as_built);
      }
    }
  }

  std::printf("\ncompile latency (transformer block forward, %llu kernels compiled cold):\n",
              static_cast<unsigned long long>(cold_compiles));
  std::printf("  cold (shaderc + pipeline)       %8.1f ms\n", cold);
  std::printf("  new process-like executor, disk %8.1f ms (%llu shaderc compiles)\n", disk,
              static_cast<unsigned long long>(disk_compiles));
  std::printf("  same executor, memory cache     %8.2f ms (median of 15 loads; pipelines shared)\n", memory);
  std::printf("    of which making each kernel    %8.3f ms (emit GLSL, cache hit, shared pipeline; the rest of a\n"
              "                                             load allocates buffers and records the command buffer)\n",
              memory_per_kernel);
  std::filesystem::remove_all(cache);
  if (failures) std::printf("\n%d CHECKS FAILED\n", failures);
  return failures ? 2 : 0;
}
