// The CPU executor's kernels on their own and through the executor: the blocked GEMM against a
// double-precision loop (odd, empty and batched shapes, strided and transposed operands, NaN and
// infinity), the linear kernels against dequantize_row() and a double dot for every weight dtype
// (extreme block scales, x of large and small magnitude), each on the AVX2 path (where this CPU
// has it) and the portable one, with and without the thread pool; the integer dots (x quantized
// to 8 bits) against x quantized as cpu_quant_dot.hpp publishes it and against the published error
// bound; then linear and matmul graphs on the CPU executor (x in f32, and the default 8-bit x)
// against mesh::evaluate. No Vulkan needed.
#include "harness.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "graph/quant.hpp"
#include "gpu/cpu_gemm.hpp"
#include "gpu/cpu_isa.hpp"
#include "gpu/cpu_linear.hpp"
#include "gpu/cpu_quant_dot.hpp"
#include "gpu/cpu_thread_pool.hpp"
#include "gpu/host_copy.hpp"

using namespace mesh;
using namespace mesh::gpu;
using namespace mesh::gpu::test;

namespace {

/// Both kernel sets where this CPU runs both.
std::vector<cpu_isa> isas() {
  std::vector<cpu_isa> out{cpu_isa::portable};
  if (supported_isa() != cpu_isa::portable) out.push_back(supported_isa());
  return out;
}

thread_pool& pool2() {
  static thread_pool p(2);
  return p;
}

std::vector<float> uniform(size_t n, uint64_t seed, float lo = -1, float hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

/// |got - want| within `rel` of `scale` (the sum of the products' magnitudes), NaN where want is
/// NaN, the same infinity where want is infinite.
bool close(float got, double want, double scale, double rel) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::abs(static_cast<double>(got) - want) <= rel * scale + 1e-35;
}

struct gemm_case {
  int64_t batch, m, k, n;
  bool broadcast_b = false;  ///< one B for every batch (b_batch = 0)
  bool transposed_b = false; ///< B stored as [n, k] (a linear layer's weight)
  int64_t pad = 0;           ///< extra elements at the end of each row of A and C (strides > k, n)
};

/// C = A x B by gemm_f32 against a double loop, element by element.
void check_gemm(const gemm_case& c, cpu_isa isa, thread_pool* pool, bool specials = false) {
  INFO("batch " << c.batch << " m " << c.m << " k " << c.k << " n " << c.n << " broadcast " << c.broadcast_b << " transposed " << c.transposed_b
                << " pad " << c.pad << " isa " << to_string(isa) << " pool " << (pool != nullptr));
  const int64_t lda = c.k + c.pad, ldc = c.n + c.pad, b_batches = c.broadcast_b ? 1 : c.batch;
  std::vector<float> a = uniform(static_cast<size_t>(c.batch * c.m * lda), 1 + c.m);
  std::vector<float> b = uniform(static_cast<size_t>(b_batches * c.k * c.n), 2 + c.n);
  if (specials && c.m >= 3 && c.k >= 2 && c.n >= 2) {
    a[0] = NAN;                                     // row 0 of C: all NaN
    a[static_cast<size_t>(lda)] = INFINITY;         // row 1: inf x (B values of either sign)
    b[static_cast<size_t>(c.transposed_b ? 1 : c.n + 1)] = 0.0f;  // B(1, 1) = 0: inf x 0 somewhere in row 2
    a[static_cast<size_t>(2 * lda + 1)] = INFINITY;
  }
  const float sentinel = 12345.0f;
  std::vector<float> out(static_cast<size_t>(c.batch * c.m * ldc), sentinel);
  gemm_args g;
  g.m = c.m, g.n = c.n, g.k = c.k, g.batch = c.batch;
  g.a = a.data(), g.a_row = lda, g.a_col = 1, g.a_batch = c.m * lda;
  g.b = b.data(), g.b_batch = c.broadcast_b ? 0 : c.k * c.n;
  if (c.transposed_b) g.b_row = 1, g.b_col = c.k;
  else g.b_row = c.n, g.b_col = 1;
  g.c = out.data(), g.c_row = ldc, g.c_batch = c.m * ldc;
  gemm_f32(g, isa, pool);
  int64_t bad = 0;
  for (int64_t t = 0; t < c.batch; ++t)
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double want = 0, scale = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double x = a[static_cast<size_t>(t * c.m * lda + i * lda + p)];
          const double y = b[static_cast<size_t>(g.b_batch * t + p * g.b_row + j * g.b_col)];
          want += x * y;
          scale += std::abs(x * y);
        }
        const float got = out[static_cast<size_t>(t * c.m * ldc + i * ldc + j)];
        if (!close(got, want, scale, 1e-5) && bad++ < 5) CHECK(got == Approx(want));
      }
      for (int64_t j = c.n; j < ldc; ++j) CHECK(out[static_cast<size_t>(t * c.m * ldc + i * ldc + j)] == sentinel);  // the padding is untouched
    }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("host copies: parallel_copy copies every byte once, whatever the size and the pool") {
  // The staging copies of read_parameters / write_parameters: parts end on 4 KiB, the last one
  // short; sizes below two parts copy on the caller's thread.
  thread_pool three(3);
  std::mt19937 rng(7);
  for (size_t bytes : {size_t{0}, size_t{1}, copy_part_bytes - 1, 2 * copy_part_bytes, 3 * copy_part_bytes + 5, 7 * copy_part_bytes + 4093}) {
    std::vector<uint8_t> src(bytes + 2), dst(bytes + 2, 0xee);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    for (thread_pool* pool : {static_cast<thread_pool*>(nullptr), &pool2(), &three}) {
      INFO(bytes << " bytes, " << (pool ? pool->size() : 1) << " threads");
      std::fill(dst.begin(), dst.end(), 0xee);
      parallel_copy(dst.data() + 1, src.data() + 1, bytes, pool);  // unaligned on purpose
      CHECK(dst.front() == 0xee);
      CHECK(dst.back() == 0xee);
      CHECK(std::equal(src.begin() + 1, src.end() - 1, dst.begin() + 1));
    }
  }
  // MESH_COPY_THREADS picks the count; anything but 1 to 64 leaves the default.
  ::setenv("MESH_COPY_THREADS", "3", 1);
  CHECK(copy_threads() == 3);
  const unsigned fallback = [] {
    ::unsetenv("MESH_COPY_THREADS");
    return copy_threads();
  }();
  CHECK(fallback >= 1);
  CHECK(fallback <= 4);
  for (const char* bad : {"0", "65", "x", "2x", ""}) {
    ::setenv("MESH_COPY_THREADS", bad, 1);
    CHECK(copy_threads() == fallback);
  }
  ::unsetenv("MESH_COPY_THREADS");
}

TEST_CASE("cpu gemm: odd, empty, batched and strided shapes against a double loop, every kernel set") {
  const gemm_case cases[] = {
      {1, 1, 1, 1},       {1, 1, 7, 1},      {1, 1, 300, 1},       {1, 17, 33, 65},   {1, 130, 257, 67},
      {1, 6, 256, 16},    {1, 12, 512, 32},  {1, 97, 600, 2100},   {1, 0, 5, 7},      {1, 5, 0, 7},
      {1, 5, 7, 0},       {3, 17, 33, 65},   {4, 9, 40, 23, true}, {2, 130, 257, 67, true},
      {1, 33, 70, 45, false, true},          {3, 20, 300, 19, true, true},           {2, 17, 33, 65, false, false, 3},
      {0, 4, 4, 4},
  };
  for (const cpu_isa isa : isas())
    for (const auto& c : cases) {
      check_gemm(c, isa, nullptr);
      check_gemm(c, isa, &pool2());
    }
}

TEST_CASE("cpu gemm: NaN and infinity propagate as in the naive loop") {
  for (const cpu_isa isa : isas()) {
    check_gemm({1, 17, 33, 65}, isa, &pool2(), true);
    check_gemm({1, 7, 300, 20, false, true}, isa, nullptr, true);
  }
}

namespace {

// ---- the linear kernels ----

/// Bytes of the f16 fields that scale a block (d, and dmin/m where the dtype has them): the
/// offsets within a block.
std::vector<int64_t> scale_fields(dtype t) {
  switch (t) {
    case dtype::q8_0:
    case dtype::q4_0:
    case dtype::q5_0: return {0};
    case dtype::q4_1:
    case dtype::q5_1:
    case dtype::q4_k:
    case dtype::q5_k: return {0, 2};
    case dtype::q6_k: return {208};
    default: return {};
  }
}

/// An n x k weight of dtype t: random values through the reference quantizer, then some blocks'
/// scale fields set to extremes (the f16 maximum 65504, the smallest subnormal, zero; for the
/// plain dtypes, such values as elements).
std::vector<uint8_t> extreme_weight(dtype t, int64_t n, int64_t k, uint64_t seed) {
  const int64_t rb = *row_bytes(t, k), be = block_elements(t), bb = block_bytes(t);
  std::vector<uint8_t> w(static_cast<size_t>(n * rb));
  for (int64_t j = 0; j < n; ++j) {
    const std::vector<float> v = uniform(static_cast<size_t>(k), seed + static_cast<uint64_t>(j));
    REQUIRE(quantize_row(t, v, {w.data() + j * rb, static_cast<size_t>(rb)}).has_value());
  }
  const uint16_t extremes[] = {0x7bff, 0x0001, 0x0000, 0x0400};  // 65504, 2^-24, 0, 2^-14
  const auto fields = scale_fields(t);
  int64_t which = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t blk = 0; blk < k / be; ++blk) {
      if ((j + blk) % 3 != 1) continue;  // a third of the blocks
      uint8_t* block = w.data() + j * rb + blk * bb;
      const uint16_t h = extremes[which++ % 4];
      if (!fields.empty()) {
        for (const int64_t f : fields) block[f] = static_cast<uint8_t>(h), block[f + 1] = static_cast<uint8_t>(h >> 8);
      } else if (t == dtype::f16) {
        block[0] = static_cast<uint8_t>(h), block[1] = static_cast<uint8_t>(h >> 8);
      } else if (t == dtype::bf16) {  // 2^100, 2^-100, 0, the smallest subnormal
        const uint16_t b[] = {0x7180, 0x0d80, 0x0000, 0x0001};
        block[0] = static_cast<uint8_t>(b[which % 4]), block[1] = static_cast<uint8_t>(b[which % 4] >> 8);
      } else if (t == dtype::f32) {
        const float f[] = {1e30f, 1e-30f, 0.0f, 1e-40f};
        std::memcpy(block, &f[which % 4], 4);
      }
    }
  return w;
}

/// y = x W^T by linear_f32 against dequantize_row and a double dot, element by element. Rows of
/// x take magnitudes 1, 1e4 and 1e-4 in turn.
void check_linear_kernel(dtype t, int64_t n, int64_t k, int64_t rows, cpu_isa isa, thread_pool* pool) {
  INFO("dtype " << to_string(t) << " n " << n << " k " << k << " rows " << rows << " isa " << to_string(isa) << " pool " << (pool != nullptr));
  const std::vector<uint8_t> w = extreme_weight(t, n, k, 100 + static_cast<uint64_t>(k));
  std::vector<float> x = uniform(static_cast<size_t>(rows * k), 7 + static_cast<uint64_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) x[static_cast<size_t>(r * k + c)] *= r % 3 == 1 ? 1e4f : (r % 3 == 2 ? 1e-4f : 1.0f);
  std::vector<float> y(static_cast<size_t>(rows * n), NAN);
  linear_args a;
  a.type = t, a.w = w.data(), a.n = n, a.k = k, a.x = x.data(), a.rows = rows, a.y = y.data();
  linear_f32(a, isa, pool);
  const int64_t rb = *row_bytes(t, k);
  std::vector<float> wrow(static_cast<size_t>(k));
  int64_t bad = 0;
  for (int64_t j = 0; j < n; ++j) {
    REQUIRE(dequantize_row(t, {w.data() + j * rb, static_cast<size_t>(rb)}, wrow).has_value());
    const std::vector<double> off = weight_offsets(t, w.data() + j * rb, k, false);
    for (int64_t r = 0; r < rows; ++r) {
      double want = 0, scale = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double xv = x[static_cast<size_t>(r * k + c)], wv = wrow[static_cast<size_t>(c)];
        want += xv * wv;
        scale += std::abs(xv) * (std::abs(wv) + 2 * off[static_cast<size_t>(c)]);
      }
      const float got = y[static_cast<size_t>(r * n + j)];
      if (!close(got, want, scale, 1e-5) && bad++ < 5) CHECK(got == Approx(want));
    }
  }
  CHECK(bad == 0);
}

// ---- the integer dots (x quantized to 8 bits) ----

/// x quantized as cpu_quant_dot.hpp publishes it, written here from that text: per block of B,
/// d = max|x| / 127 in f32, q = x / d rounded to nearest (ties to even) and clamped to +-127.
/// Returns d*q per element (exact in double) and, in `half_step`, d/2 per element (the rounding
/// bound).
std::vector<double> quantized_x(const float* x, int64_t k, int64_t block, std::vector<double>& half_step) {
  std::vector<double> out(static_cast<size_t>(k));
  half_step.assign(static_cast<size_t>(k), 0.0);
  for (int64_t b = 0; b < k / block; ++b) {
    float m = 0;
    for (int64_t i = 0; i < block; ++i) m = std::max(m, std::abs(x[b * block + i]));
    const float d = m / 127.0f;
    for (int64_t i = 0; i < block; ++i) {
      const size_t e = static_cast<size_t>(b * block + i);
      const float q = d == 0.0f ? 0.0f : std::clamp(std::nearbyint(x[e] / d), -127.0f, 127.0f);
      out[e] = static_cast<double>(q) * d;
      half_step[e] = 0.5 * d;
    }
  }
  return out;
}

/// How x's rows are made: uniform of magnitude 1, 1e4 and 1e-4 in turn; with `specials`, some
/// rows also get one huge element (1e6), a block of zeros, or every element at +-1 (all codes
/// +-127: the integer sums at their largest).
std::vector<float> int8_test_x(int64_t rows, int64_t k, uint64_t seed, bool specials) {
  std::vector<float> x = uniform(static_cast<size_t>(rows * k), seed);
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.data() + r * k;
    const float mag = r % 3 == 1 ? 1e4f : (r % 3 == 2 ? 1e-4f : 1.0f);
    for (int64_t c = 0; c < k; ++c) xr[c] *= mag;
    if (!specials) continue;
    if (r % 4 == 0) xr[(5 + 37 * r) % k] = 1e6f;
    if (r % 4 == 1) std::fill(xr, xr + std::min<int64_t>(k, 256), 0.0f);
    if (r % 4 == 2)
      for (int64_t c = 0; c < k; ++c) xr[c] = c % 64 < 32 ? 1.0f : -1.0f;
  }
  return x;
}

/// An n x k weight of dtype t whose blocks are random bytes (every code, 6-bit scale and minimum,
/// q6_k's -128 scales, q8_0's -128 codes) with the f16 scale fields set to normal values in
/// [2^-10, 2); with `saturated`, every code and sub-block scale at its largest magnitude instead
/// (q8_0 codes -128, q4_0 nibbles 15, q4_k nibbles 15 with 6-bit scales and minimums 63, q6_k
/// codes 63 with scales -128).
std::vector<uint8_t> random_block_weight(dtype t, int64_t n, int64_t k, uint64_t seed, bool saturated) {
  const int64_t rb = *row_bytes(t, k), be = block_elements(t), bb = block_bytes(t);
  std::vector<uint8_t> w(static_cast<size_t>(n * rb));
  std::mt19937_64 rng(seed);
  for (auto& b : w) b = saturated ? (t == dtype::q8_0 || t == dtype::q6_k ? 0x80 : 0xff) : static_cast<uint8_t>(rng());
  const int64_t blocks = n * k / be;
  if (saturated && t == dtype::q6_k)
    for (int64_t blk = 0; blk < blocks; ++blk) std::fill_n(w.data() + blk * bb, 192, uint8_t{0xff});
  std::uniform_int_distribution<int> exponent(5, 15), mantissa(0, 1023);  // 2^-10 .. 2 (f16 bias 15)
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (const int64_t f : scale_fields(t)) {
      const uint16_t h = static_cast<uint16_t>(exponent(rng) << 10 | mantissa(rng));
      w[static_cast<size_t>(blk * bb + f)] = static_cast<uint8_t>(h), w[static_cast<size_t>(blk * bb + f + 1)] = static_cast<uint8_t>(h >> 8);
    }
  return w;
}

struct int8_case {
  dtype t;
  int64_t n, k, rows;
  int weight = 0;  ///< 0: extreme_weight (the reference quantizer, extreme f16 scales); 1: random bytes; 2: saturated
};

/// y = x W^T by linear_f32 with linear_x::int8 against two references, element by element. Where
/// `isa` takes integer dots for the dtype: (1) dequantize_row() of the weight and a double dot
/// with x quantized as published (quantized_x), within 2e-6 of the sum of the products'
/// magnitudes, whatever the number of rows (f32 rounding of the block scales and of the float accumulation, a few roundings of
/// 6e-8 each; weight_offsets counts in the terms subtracted after the sums); the largest term's x
/// code off by one, or the first block's scale doubled, exceeds it in at least 9 of 10 rows
/// (checked below); (2) the dot with x itself, within the published
/// bound sum |w_i| * d_i / 2 plus 1e-5 of the sum of the products' magnitudes. Elsewhere (the portable path)
/// x stays f32: within f32 rounding of the dot with x.
void check_int8_kernel(const int8_case& c, cpu_isa isa, thread_pool* pool) {
  const dtype t = c.t;
  const int64_t n = c.n, k = c.k, rows = c.rows;
  INFO("dtype " << to_string(t) << " n " << n << " k " << k << " rows " << rows << " weight " << c.weight << " isa " << to_string(isa)
                << " pool " << (pool != nullptr));
  const uint64_t seed = 1000 + static_cast<uint64_t>(k * 7 + n * 3 + rows);
  const std::vector<uint8_t> w = c.weight == 0 ? extreme_weight(t, n, k, seed) : random_block_weight(t, n, k, seed, c.weight == 2);
  const std::vector<float> x = int8_test_x(rows, k, seed + 1, true);
  std::vector<float> y(static_cast<size_t>(rows * n), NAN);
  linear_args a;
  a.type = t, a.w = w.data(), a.n = n, a.k = k, a.x = x.data(), a.rows = rows, a.y = y.data(), a.x_mode = linear_x::int8;
  linear_f32(a, isa, pool);
  const bool int8 = takes_int8_dots(t, isa);
  std::vector<std::vector<double>> xq(static_cast<size_t>(rows)), half(static_cast<size_t>(rows));
  if (int8)
    for (int64_t r = 0; r < rows; ++r) xq[static_cast<size_t>(r)] = quantized_x(x.data() + r * k, k, int8_x_block(t), half[static_cast<size_t>(r)]);
  const int64_t rb = *row_bytes(t, k), first = block_elements(t);
  std::vector<float> wrow(static_cast<size_t>(k));
  int64_t bad = 0, caught = 0, probes = 0;
  for (int64_t j = 0; j < n; ++j) {
    REQUIRE(dequantize_row(t, {w.data() + j * rb, static_cast<size_t>(rb)}, wrow).has_value());
    const std::vector<double> off = weight_offsets(t, w.data() + j * rb, k, int8);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * k;
      const float got = y[static_cast<size_t>(r * n + j)];
      double exact = 0, scale = 0;
      for (int64_t e = 0; e < k; ++e) {
        exact += static_cast<double>(xr[e]) * wrow[static_cast<size_t>(e)];
        scale += std::abs(static_cast<double>(xr[e])) * (std::abs(wrow[static_cast<size_t>(e)]) + 2 * off[static_cast<size_t>(e)]);
      }
      if (!int8) {
        if (!close(got, exact, scale, 1e-5) && bad++ < 5) CHECK(got == Approx(exact));
        continue;
      }
      const std::vector<double>& q = xq[static_cast<size_t>(r)];
      const std::vector<double>& h = half[static_cast<size_t>(r)];
      double want = 0, qscale = 0, bound = 0, first_block = 0, first_mag = 0, one_code = 0;
      for (int64_t e = 0; e < k; ++e) {
        const double wv = wrow[static_cast<size_t>(e)], qv = q[static_cast<size_t>(e)], step = 2 * h[static_cast<size_t>(e)];
        want += wv * qv;
        qscale += std::abs(qv) * (std::abs(wv) + 2 * off[static_cast<size_t>(e)]);
        bound += std::abs(wv) * h[static_cast<size_t>(e)];
        if (e < first) first_block += wv * qv, first_mag += std::abs(wv * qv);
        one_code = std::max(one_code, std::abs(wv * step));
      }
      const double tight = 2e-6 * qscale + 1e-35;
      const double loose = bound * (1 + 1e-6) + 1e-5 * scale + 1e-35;
      const double diff_q = std::abs(static_cast<double>(got) - want), diff_x = std::abs(static_cast<double>(got) - exact);
      if ((!(diff_q <= tight) || !(diff_x <= loose)) && bad++ < 5) {
        INFO("row of x " << r << ", weight row " << j << ": exact " << exact << ", bound " << loose);
        CHECK(got == Approx(want));
        CHECK(diff_q <= tight);
        CHECK(diff_x <= loose);
      }
      // The tight check can fail: the first block's scale doubled, or the largest single term's
      // x code off by one, would leave it (counted where those terms are not zero and the first
      // block's terms do not cancel: the +-1 rows against saturated weights sum to about 0).
      if (std::abs(first_block) > 1e-3 * first_mag) ++probes, caught += std::abs(first_block) > tight;
      if (one_code != 0) ++probes, caught += one_code > tight;
    }
  }
  CHECK(bad == 0);
  // (With extreme_weight's scales a block of 65504 can dominate the sum, leaving a change in a
  // tiny block below f32 rounding: the count holds for the weights of normal scales.)
  if (c.weight != 0) CHECK(caught * 10 >= probes * 9);
}

}  // namespace

TEST_CASE("cpu linear: the register dots cover the decode step's dtypes") {
  if (supported_isa() == cpu_isa::portable) {
    WARN("this CPU has no AVX2/FMA/F16C: only the portable kernels run");
    return;
  }
  for (const dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k}) {
    INFO(to_string(t));
    CHECK(decodes_in_registers(t, cpu_isa::avx2));
    CHECK_FALSE(decodes_in_registers(t, cpu_isa::portable));
  }
}

TEST_CASE("cpu linear: every weight dtype against dequantize_row and a double dot, extreme scales, every kernel set") {
  const dtype types[] = {dtype::f32,  dtype::f16,  dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_1,
                         dtype::q5_0, dtype::q5_1, dtype::q4_k, dtype::q5_k, dtype::q6_k};
  for (const cpu_isa isa : isas())
    for (const dtype t : types)
      for (const int64_t k : {int64_t{256}, int64_t{2048}})
        for (const int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{9}}) {
          check_linear_kernel(t, 37, k, rows, isa, nullptr);
          check_linear_kernel(t, 37, k, rows, isa, &pool2());
        }
}

TEST_CASE("cpu linear: plain dtypes with k not a multiple of the vector width, and k = 0") {
  for (const cpu_isa isa : isas())
    for (const dtype t : {dtype::f32, dtype::f16, dtype::bf16})
      for (const int64_t k : {int64_t{1}, int64_t{13}, int64_t{29}})
        for (const int64_t rows : {int64_t{1}, int64_t{4}, int64_t{11}}) check_linear_kernel(t, 19, k, rows, isa, &pool2());
  std::vector<float> y(6, NAN);
  linear_args a;
  a.n = 3, a.k = 0, a.rows = 2, a.y = y.data();
  linear_f32(a, supported_isa(), &pool2());
  for (const float v : y) CHECK(v == 0.0f);
}

TEST_CASE("cpu linear int8: q8_0, q4_0, q4_k and q6_k against dequantize_row and x quantized as published, every kernel set") {
  for (const cpu_isa isa : isas())
    for (const dtype t : {dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k}) {
      const int64_t b = block_elements(t);
      for (const int64_t k : {b, 3 * b, 7 * b, 2048 + b})  // odd numbers of blocks, a short tail of 4 rows
        for (const int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 13})
          for (int weight = 0; weight < 3; ++weight) {
            const int64_t n = rows % 3 == 0 ? 1 : (rows % 3 == 1 ? 19 : 37);  // no multiple of the 16-row chunk or 4 rows of x
            check_int8_kernel({t, n, k, rows, weight}, isa, (rows + weight) % 2 ? &pool2() : nullptr);
          }
    }
}

TEST_CASE("cpu linear int8: a row's result is the same bit for bit alone or among a prompt's rows") {
  // What a split model's failover relies on: the survivors replay the stream's tokens as a
  // prompt, whose rows must give what the tokens gave when each was decoded alone.
  if (supported_isa() == cpu_isa::portable) {
    WARN("this CPU has no AVX2/FMA/F16C: no integer dots to check");
    return;
  }
  thread_pool pool(2);
  for (const dtype t : {dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k}) {
    INFO(to_string(t));
    const int64_t n = 37, k = 512, rows = 13;
    const std::vector<uint8_t> w = random_block_weight(t, n, k, 77, false);
    const std::vector<float> x = int8_test_x(rows, k, 78, false);
    std::vector<float> all(static_cast<size_t>(rows * n)), one(static_cast<size_t>(n));
    linear_args a;
    a.type = t, a.w = w.data(), a.n = n, a.k = k, a.x = x.data(), a.rows = rows, a.y = all.data(), a.x_mode = linear_x::int8;
    linear_f32(a, cpu_isa::avx2, &pool);
    for (int64_t r = 0; r < rows; ++r) {
      a.x = x.data() + r * k, a.rows = 1, a.y = one.data();
      linear_f32(a, cpu_isa::avx2, nullptr);
      CHECK(std::memcmp(one.data(), all.data() + r * n, one.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("cpu linear int8: NaN and infinity in x make their rows' results NaN, zero rows give zeros") {
  for (const dtype t : {dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k}) {
    INFO(to_string(t));
    const int64_t n = 5, k = 512, rows = 4;
    const std::vector<uint8_t> w = random_block_weight(t, n, k, 9, false);
    std::vector<float> x = uniform(static_cast<size_t>(rows * k), 10);
    x[3] = NAN;                                                // row 0
    x[static_cast<size_t>(k + 300)] = INFINITY;                // row 1
    std::fill(x.begin() + 3 * k, x.end(), 0.0f);               // row 3: zeros; row 2 finite
    std::vector<float> y(static_cast<size_t>(rows * n), 1.0f);
    linear_args a;
    a.type = t, a.w = w.data(), a.n = n, a.k = k, a.x = x.data(), a.rows = rows, a.y = y.data(), a.x_mode = linear_x::int8;
    for (const cpu_isa isa : isas()) {
      INFO(to_string(isa));
      linear_f32(a, isa, &pool2());
      for (int64_t j = 0; j < n; ++j) {
        CHECK(std::isnan(y[static_cast<size_t>(j)]));
        CHECK(!std::isfinite(y[static_cast<size_t>(n + j)]));
        CHECK(std::isfinite(y[static_cast<size_t>(2 * n + j)]));
        CHECK(y[static_cast<size_t>(3 * n + j)] == 0.0f);
      }
    }
  }
}

TEST_CASE("cpu linear int8: which dtypes take integer dots, and the MESH_CPU_LINEAR switch") {
  for (const dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::q5_k}) {
    CHECK_FALSE(takes_int8_dots(t, cpu_isa::avx2));
    CHECK(int8_x_block(t) == 0);
  }
  for (const dtype t : {dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q6_k}) {
    CHECK_FALSE(takes_int8_dots(t, cpu_isa::portable));
    CHECK(int8_x_block(t) == block_elements(t));
    CHECK(int8_x_row_bytes(t, 2048) % 64 == 0);
    if (supported_isa() == cpu_isa::avx2) CHECK(takes_int8_dots(t, cpu_isa::avx2));
  }
  const char* v = std::getenv("MESH_CPU_LINEAR");
  CHECK(default_linear_x() == (v && std::string(v) == "f32" ? linear_x::f32 : linear_x::int8));
}

TEST_CASE("cpu thread pool: every part runs once, nested runs stay on their thread") {
  thread_pool pool(3);
  CHECK(pool.size() == 3);
  for (const int64_t parts : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{1000}}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(parts));
    for (int rep = 0; rep < 50; ++rep) pool.run(parts, [&](int64_t p) { hits[static_cast<size_t>(p)].fetch_add(1); });
    for (auto& h : hits) CHECK(h.load() == 50);
  }
  std::atomic<int64_t> inner{0};
  pool.run(4, [&](int64_t) { pool.run(5, [&](int64_t p) { inner.fetch_add(p + 1); }); });
  CHECK(inner.load() == 4 * 15);
}

TEST_CASE("cpu executor: linear of every weight dtype, few rows and many, against the reference evaluator") {
  const dtype types[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q5_0, dtype::q4_k, dtype::q6_k};
  int seed = 0;
  for (const dtype wt : types)
    for (const shape& xs : {shape{1, 256}, shape{3, 512}, shape{2, 6, 256}}) {
      ++seed;
      const int64_t k = xs.back(), n = 45;
      INFO("w " << to_string(wt) << " x " << to_string(xs));
      const std::string tag = std::to_string(seed);
      builder b;
      auto x = b.input("x", dtype::f32, xs);
      auto w = b.parameter("w" + tag, wt, {n, k});
      b.output("y", linear(x, w));
      const graph g = finish(b);
      std::vector<double> wv(static_cast<size_t>(n * k));
      std::mt19937_64 rng(static_cast<uint64_t>(seed));
      std::uniform_real_distribution<double> u(-1, 1);
      for (auto& v : wv) v = u(rng);
      const tensor_map params{{"w" + tag, tensor::from_values(wt, {n, k}, wv)}};
      const tensor_map inputs{{"x", random_tensor(dtype::f32, xs, static_cast<uint64_t>(seed))}};
      const reference ref = reference_run(g, inputs, params);
      check_on(cpu(), g, inputs, params, ref, 1e-5);
      // The default executor rounds x to 8 bits for q8_0/q4_0/q4_k/q6_k (integer dots for a decode
      // step's rows): at most 1/254 of a block's largest |x| per element (cpu_quant_dot.hpp), about
      // 1e-3 of these outputs' range; the kernel tests above hold them to the published
      // quantization exactly.
      check_on(cpu_int8(), g, inputs, params, ref, takes_int8_dots(wt, default_isa()) ? 1e-2 : 1e-5);
    }
  // f16 activations: the result rounded to f16 as the reference rounds it.
  builder b;
  auto x = b.input("x", dtype::f16, {5, 256});
  auto w = b.parameter("w_f16x", dtype::q4_k, {33, 256});
  b.output("y", linear(x, w));
  const graph g = finish(b);
  std::vector<double> wv(33 * 256);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = std::sin(static_cast<double>(i));
  const tensor_map inputs{{"x", random_tensor(dtype::f16, {5, 256}, 3)}};
  const tensor_map params{{"w_f16x", tensor::from_values(dtype::q4_k, {33, 256}, wv)}};
  const reference ref = reference_run(g, inputs, params);
  check_on(cpu(), g, inputs, params, ref);
  check_on(cpu_int8(), g, inputs, params, ref, takes_int8_dots(dtype::q4_k, default_isa()) ? 1e-2 : -1);
}

TEST_CASE("cpu executor: matmul batched, broadcast and f16 against the reference evaluator") {
  struct mm_case {
    shape a, b;
    dtype t;
  };
  const mm_case cases[] = {
      {{1, 1}, {1, 1}, dtype::f32},          {{17, 33}, {33, 65}, dtype::f32},        {{130, 257}, {257, 67}, dtype::f32},
      {{2, 3, 17, 33}, {2, 3, 33, 65}, dtype::f32}, {{3, 9, 40}, {40, 23}, dtype::f32},  // B broadcast over the batch
      {{1, 5, 0}, {1, 0, 6}, dtype::f32},    {{4, 17, 33}, {4, 33, 9}, dtype::f16},   {{40, 70}, {70, 50}, dtype::bf16},
  };
  int seed = 50;
  for (const auto& c : cases) {
    INFO(to_string(c.a) << " x " << to_string(c.b) << " " << to_string(c.t));
    builder b;
    auto x = b.input("a", c.t, c.a);
    auto y = b.input("b", c.t, c.b);
    b.output("c", matmul(x, y));
    const graph g = finish(b);
    check_on(cpu(), g, {{"a", random_tensor(c.t, c.a, static_cast<uint64_t>(++seed))}, {"b", random_tensor(c.t, c.b, static_cast<uint64_t>(++seed))}},
             {});
  }
}
