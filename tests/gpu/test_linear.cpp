// Cross-back-end tests of the model-inference ops: linear with every weight dtype (f32, f16,
// bf16 and the quantized ones, decoded inside the kernels), on the matrix-vector path (few rows)
// and the tiled path (many rows), with epilogues; kv_write in place; and zero-copy parameter
// upload. Every graph runs on the CPU executor and on Vulkan (lavapipe in CI) with the
// validation layer on, against the reference evaluator, and the layer must stay quiet.
#include "harness.hpp"

#include <algorithm>
#include <limits>
#include <random>

#include "graph/quant.hpp"
#include "gpu/glsl.hpp"
#include "gpu/plan.hpp"

using namespace mesh;
using namespace mesh::gpu;
using namespace mesh::gpu::test;

namespace {

constexpr dtype weight_types[] = {dtype::f32,  dtype::f16,  dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_1,
                                   dtype::q5_0, dtype::q5_1, dtype::q4_k, dtype::q5_k, dtype::q6_k};

/// A Vulkan executor with the validation layer on; `variant` picks linear's matrix-vector kernel
/// (kernel_variants::matvec), `x` its x ("f32" unless a test says otherwise: the f32 tolerances
/// below are for it; "int8" takes the 8-bit x kernel). Each test destroys its own, while
/// harness.hpp's keeps the driver loaded (as test_runtime.cpp does).
std::unique_ptr<executor> validated(const std::string& variant = "", const std::string& x = "f32", const std::string& decode = "") {
  vulkan();
  vulkan_options o;
  o.validation = true;
  o.cache_dir = "-";
  o.variants.matvec = variant;
  o.variants.matvec_x = x;
  o.variants.linear_decode = decode;
  auto e = make_vulkan_executor(o);
  if (!e) FAIL("no Vulkan executor with validation: " << e.error().to_string());
  return std::move(*e);
}

/// Random values in [-1, 1) (quantized dtypes: encoded by the reference quantizer), with a few
/// blocks at extreme scales: 1e4 and 1e-4 times the rest.
tensor weights(dtype t, const shape& dims, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(static_cast<size_t>(element_count(dims)));
  for (size_t i = 0; i < v.size(); ++i) {
    const size_t block = i / 32;
    const double scale = block % 7 == 3 ? 1e3 : (block % 7 == 5 ? 1e-4 : 1.0);
    v[i] = u(rng) * scale;
  }
  return tensor::from_values(t, dims, v);
}

struct linear_case {
  shape x;        ///< [..., k]
  int64_t n = 1;  ///< weight rows
};

/// y = linear(x, w), and relu(linear(x, w) + bias) * 0.5 as an epilogue, on every back end.
void check_linear(executor& vk, dtype wt, const linear_case& c, dtype xt, uint64_t seed, bool with_cpu = true) {
  const int64_t k = c.x.back();
  const std::string tag = std::string(to_string(wt)) + to_string(xt) + "_" + to_string(c.x) + "_" + std::to_string(c.n) + "_" + std::to_string(seed);
  INFO("w " << to_string(wt) << "[" << c.n << "," << k << "], x " << to_string(xt) << to_string(c.x) << " on " << vk.info().name);
  builder b;
  auto x = b.input("x", xt, c.x);
  auto w = b.parameter("w" + tag, wt, {c.n, k});
  auto bias = b.parameter("b" + tag, xt, {c.n});
  b.output("y", linear(x, w));
  b.output("epilogue", relu(linear(x, w) + bias) * 0.5);
  const graph g = finish(b);
  const tensor_map inputs{{"x", random_tensor(xt, c.x, seed)}};
  const tensor_map params{{"w" + tag, weights(wt, {c.n, k}, seed + 1)}, {"b" + tag, random_tensor(xt, {c.n}, seed + 2)}};
  const reference ref = reference_run(g, inputs, params);
  // Accumulated in f32 on the devices, in double in the reference; extreme-scale blocks make the
  // error relative to the largest output. A device with cooperative matrices runs a prompt's
  // linear (more than 16 rows) on tensor cores with x and the weight rounded to f16 (`mmctl`).
  const double tol = xt == dtype::f32 ? 1e-4 : tolerance_for(xt);
  const bool halves =
      vk.info().coopmat && element_count(c.x) / k > 16 && (wt == dtype::f16 || wt == dtype::bf16 || is_quantized(wt));
  check_on(vk, g, inputs, params, ref, halves ? std::max(tol, tolerance_for(dtype::f16)) : tol);
  if (with_cpu) check_on(cpu(), g, inputs, params, ref, tol);
}

}  // namespace

TEST_CASE("linear: every weight dtype on the matrix-vector path (m = 1, odd n, one block and several)") {
  auto vk = validated();
  for (dtype wt : weight_types) {
    const int64_t block = block_elements(wt) > 1 ? block_elements(wt) : 32;
    // Q8_0, Q4_0 and Q5_0 rows of 1, 3 and 9 blocks (34, 18 or 22 bytes each) start at odd 16-bit
    // offsets of their buffer, and a Q5_0 block's 32-bit qh straddles two words.
    for (const linear_case& c : {linear_case{{block}, 7}, linear_case{{1, 3 * block}, 5}, linear_case{{2, 2, 2 * block}, 9},
                                 linear_case{{1, 9 * block}, 3}})
      check_linear(*vk, wt, c, dtype::f32, 11);
  }
  // Up to matvec_max_rows (16) rows of x: a batched decode step of 16 sequences (q4_k keeps x in
  // shared memory where it fits: 16 x 256 floats do, 16 x 1024 do not).
  check_linear(*vk, dtype::q4_k, {{16, 256}, 7}, dtype::f32, 14);
  check_linear(*vk, dtype::q4_k, {{16, 1024}, 5}, dtype::f32, 16);
  check_linear(*vk, dtype::f16, {{12, 64}, 9}, dtype::f32, 15);
  // Float weights take any k.
  check_linear(*vk, dtype::f32, {{1, 5}, 3}, dtype::f32, 12);
  check_linear(*vk, dtype::f16, {{3, 37}, 65}, dtype::f32, 13);
  CHECK(vk->stats().validation_errors == 0);
}

TEST_CASE("linear: every weight dtype on the tiled path (many rows, batch dims)") {
  auto vk = validated();
  for (dtype wt : weight_types) {
    const int64_t block = block_elements(wt) > 1 ? block_elements(wt) : 32;
    check_linear(*vk, wt, {{2, 9, 2 * block}, 33}, dtype::f32, 21);
    check_linear(*vk, wt, {{65, block}, 3}, dtype::f32, 22);
  }
  check_linear(*vk, dtype::bf16, {{19, 45}, 70}, dtype::f32, 23);
  // Several tiles each way, ragged at both ends (on tensor cores: 64x64 tiles), f16 x too.
  for (dtype wt : {dtype::f16, dtype::q4_k, dtype::q6_k, dtype::q8_0})
    for (dtype xt : {dtype::f32, dtype::f16}) check_linear(*vk, wt, {{3, 100, 512}, 200}, xt, 24, false);
  CHECK(vk->stats().validation_errors == 0);
}

TEST_CASE("linear: a prompt's product in few tiles, split along k on tensor cores (split_linears)") {
  // 40 x 72 outputs (2 tiles) over k = 1024 (32 tiles of 32): on a device with cooperative
  // matrices pass 1 takes 4 slices of 8 tiles, pass 2 adds them and runs the epilogue; 3 x 20
  // rows over k = 512 into 70 ragged columns: 2 slices. f16 and bf16 weights only (a quantized
  // one stays whole). Elsewhere (lavapipe) the f32 kernels.
  auto vk = validated();
  for (dtype wt : {dtype::f16, dtype::bf16, dtype::q8_0}) {
    check_linear(*vk, wt, {{40, 1024}, 72}, dtype::f32, 31, false);
    check_linear(*vk, wt, {{3, 20, 512}, 70}, dtype::f32, 32, false);
  }
  CHECK(vk->stats().validation_errors == 0);
}

TEST_CASE("linear: a prompt's quantized weights decoded to f16 first into one shared scratch buffer (predecode_linears)") {
  // Products of one x, each weight decoded into the same scratch buffer just before its product,
  // so each decode must wait for the previous product's reads (write after read); one with an
  // epilogue. On a device with cooperative matrices the default decodes first the four products
  // in few tiles (at most linear_predecode_max_tiles: then split along k), not the fifth (65 or
  // 195 tiles of 64 x 64, under 512 rows); "first" decodes all five, "staged" none (each chunk
  // decoded while staged). Elsewhere (lavapipe) the f32 kernels run them, reading the weight
  // decoded by `dqw` with "first" and the blocks themselves otherwise.
  for (const char* choice : {"", "first", "staged"}) {
    auto vk = validated("", "f32", choice);
    for (const int64_t rows : {40, 130}) {
      INFO("linear_decode \"" << choice << "\", " << rows << " rows of x");
      builder b;
      const std::string tag = std::string(choice) + std::to_string(rows);
      auto x = b.input("x", dtype::f32, {rows, 512});
      const std::pair<dtype, int64_t> weights_of[] = {{dtype::q4_k, 200}, {dtype::q8_0, 96}, {dtype::q6_k, 300}, {dtype::q5_0, 48},
                                                      {dtype::q4_0, 4160}};
      tensor_map params;
      for (size_t i = 0; i < 5; ++i) {
        const auto [wt, n] = weights_of[i];
        const std::string name = "pw" + std::to_string(i) + tag;
        auto w = b.parameter(name, wt, {n, 512});
        params.emplace(name, weights(wt, {n, 512}, 50 + i));
        if (i == 1) {
          auto bias = b.parameter("pb" + tag, dtype::f32, {n});
          params.emplace("pb" + tag, random_tensor(dtype::f32, {n}, 60));
          b.output("y1", relu(linear(x, w) + bias));
        } else {
          b.output("y" + std::to_string(i), linear(x, w));
        }
      }
      const graph g = finish(b);
      const tensor_map inputs{{"x", random_tensor(dtype::f32, {rows, 512}, 61)}};
      const reference ref = reference_run(g, inputs, params);
      // The weight is rounded to f16 wherever it is decoded first, and on tensor cores x too.
      check_on(*vk, g, inputs, params, ref, vk->info().coopmat || std::string(choice) == "first" ? tolerance_for(dtype::f16) : 1e-4);
      // Which kernels ran: a decode kernel before each product where the choice asks for it.
      int decodes = 0;
      for (const auto& ks : vk->stats().kernels) decodes += ks.name.rfind("dqw_", 0) == 0;
      const std::string c = choice;
      CHECK(decodes == (c == "first" ? 5 : !vk->info().coopmat || c == "staged" ? 0 : 4));
    }
    CHECK(vk->stats().validation_errors == 0);
  }
}

TEST_CASE("linear: a prompt's bf16 x and bf16 weight on bf16 tensor cores where the device has them (mmctl on bf16 fragments)") {
  // 40 x 72 outputs over k = 1024 (split along k in 4 slices on tensor cores) and 130 rows into
  // 200 columns with an epilogue. A device with KHR bf16 cooperative matrices runs them on bf16
  // fragments (kernels named "_bf16x_"); others, the f32 kernels. Then x past f16's range (up to
  // 1e5), which the f16 path would make infinite.
  auto vk = validated();
  for (const linear_case& c : {linear_case{{40, 1024}, 72}, linear_case{{2, 65, 512}, 200}}) {
    check_linear(*vk, dtype::bf16, c, dtype::bf16, 41);
    int rewritten = 0;
    for (const auto& ks : vk->stats().kernels) rewritten += ks.name.find("_bf16x_") != std::string::npos;
    CHECK((rewritten > 0) == vk->info().coopmat_bf16);
  }
  builder b;
  auto x = b.input("x", dtype::bf16, {40, 256});
  auto w = b.parameter("wbig", dtype::bf16, {72, 256});
  b.output("y", linear(x, w));
  check_on(*vk, finish(b), {{"x", random_tensor(dtype::bf16, {40, 256}, 43, -1e5, 1e5)}}, {{"wbig", weights(dtype::bf16, {72, 256}, 44)}});
  CHECK(vk->stats().validation_errors == 0);
}

TEST_CASE("linear: f16 and bf16 activations, and the shared-memory and chunk matrix-vector kernels") {
  auto vk = validated(), shared = validated("shared"), chunk = validated("chunk");
  for (dtype wt : {dtype::f16, dtype::q4_k, dtype::q8_0, dtype::q5_0, dtype::q6_k})
    for (dtype xt : {dtype::f16, dtype::bf16}) check_linear(*vk, wt, {{2, 256}, 11}, xt, 31);
  for (dtype wt : weight_types) {
    const int64_t block = block_elements(wt) > 1 ? block_elements(wt) : 32;
    check_linear(*shared, wt, {{3, 2 * block}, 13}, dtype::f32, 32, false);
    // "chunk": a lane per 32-element chunk, what dtypes without a lane decoder always get.
    check_linear(*chunk, wt, {{3, 2 * block}, 13}, dtype::f32, 33, false);
  }
  CHECK(vk->stats().validation_errors == 0);
  CHECK(shared->stats().validation_errors == 0);
  CHECK(chunk->stats().validation_errors == 0);
}

TEST_CASE("linear: the quantized matrix-vector kernel taking 2 or 4 weight rows per subgroup (rows2, rows4), or x from memory (xglobal)") {
  // n = 7 and 5: the last group of rows is partly past n; 1 and 3 rows of x.
  for (const auto& [variant, types] : {std::pair{"rows2", std::vector<dtype>{dtype::q4_k, dtype::q8_0}},
                                       std::pair{"rows4", std::vector<dtype>{dtype::q6_k}},
                                       std::pair{"xglobal", std::vector<dtype>{dtype::q4_k}}}) {
    auto vk = validated(variant);
    for (dtype wt : types)
      for (const linear_case& c : {linear_case{{block_elements(wt)}, 7}, linear_case{{3, 2 * block_elements(wt)}, 5}})
        check_linear(*vk, wt, c, dtype::f32, 41, false);
    CHECK(vk->stats().validation_errors == 0);
  }
  // The default takes 2 weight rows per subgroup from 8 rows of x on (a batched decode step):
  // 8, 9 or 16 rows of x, n = 7 (the last pair half past n).
  auto vk = validated("");
  for (const auto& [wt, m] : {std::pair{dtype::q4_k, int64_t{9}}, std::pair{dtype::q6_k, int64_t{16}}, std::pair{dtype::q8_0, int64_t{8}},
                              std::pair{dtype::q4_0, int64_t{9}}})
    check_linear(*vk, wt, {{m, 2 * block_elements(wt)}, 7}, dtype::f32, 43, false);
  CHECK(vk->stats().validation_errors == 0);
}

TEST_CASE("linear: the plan fuses epilogues and the kernels take the path by rows") {
  builder b;
  auto x1 = b.input("x1", dtype::f32, {1, 256});
  auto x2 = b.input("x2", dtype::f32, {40, 256});
  auto w = b.parameter("w", dtype::q4_k, {16, 256});
  auto bias = b.parameter("bias", dtype::f32, {16});
  b.output("decode", relu(linear(x1, w) + bias));
  b.output("prefill", linear(x2, w) * 2.0);
  const graph g = finish(b);
  const plan p = lower(g);
  REQUIRE(p.kernels.size() == 2);  // each linear with its epilogue: one kernel
  for (const auto& k : p.kernels) {
    CHECK(k.kind == kernel_kind::linear);
    CHECK(g[k.anchor].op == op_kind::linear);
    CHECK(k.root != k.anchor);
  }
  device_caps caps;
  caps.subgroup_arithmetic = true;
  auto decode = emit(g, p, p.kernels[0], caps);
  auto prefill = emit(g, p, p.kernels[1], caps);
  REQUIRE(decode);
  REQUIRE(prefill);
  CHECK(decode->name == "lmvc_q4_k_" + std::to_string(p.kernels[0].root));
  CHECK(decode->glsl.find("subgroupAdd") != std::string::npos);
  CHECK(decode->glsl.find("b2_lane(min(row0 + r, 15u), s, vl, v[j][r])") != std::string::npos);
  CHECK(decode->glsl.find("xs[swizzle(i)] = x4g(4u * i)") != std::string::npos);  // q4_k: x in shared memory
  caps.variants.matvec = "chunk";
  auto chunk = emit(g, p, p.kernels[0], caps);
  REQUIRE(chunk);
  CHECK(chunk->name == "lmv_q4_k_" + std::to_string(p.kernels[0].root));
  CHECK(chunk->glsl.find("b2_chunk(row, c, v)") != std::string::npos);
  CHECK(prefill->name.rfind("mmw64x64", 0) == 0);
  caps.variants.matvec = "shared";
  auto shared = emit(g, p, p.kernels[0], caps);
  REQUIRE(shared);
  CHECK(shared->name == "lmvs_q4_k_" + std::to_string(p.kernels[0].root));
}

namespace {

/// x for the 8-bit kernel: uniform of magnitude 1, 1e4 and 1e-4 by row; row 0 also has one huge
/// element (1e6: its block's other codes coarsen), row 1 a block of zeros, row 2 every element
/// at +-1 (every code +-127: the integer sums at their largest).
std::vector<float> int8_x(int64_t rows, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.data() + r * k;
    const float mag = r % 3 == 1 ? 1e4f : (r % 3 == 2 ? 1e-4f : 1.0f);
    for (int64_t c = 0; c < k; ++c) xr[c] = u(rng) * mag;
    if (r % 4 == 0) xr[(5 + 37 * r) % k] = 1e6f;
    if (r % 4 == 1) std::fill(xr, xr + 32, 0.0f);
    if (r % 4 == 2)
      for (int64_t c = 0; c < k; ++c) xr[c] = c % 64 < 32 ? 1.0f : -1.0f;
  }
  return x;
}

/// linear(x, w) on `vk` through `lmvi` (x quantized to 8 bits in blocks of 32, the weight's
/// quants dotted with its codes in integers) against two references written from the published
/// rule (docs/gpu.md; cpu_quant_dot.hpp's, blocks of 32): (1) the double dot of the dequantized
/// weight with x quantized by that rule, within f32 rounding (2e-6 of the products' magnitudes,
/// weight_offsets counting the terms subtracted after the sums) plus one code off by one (a
/// near-tie that the GPU's division rounds the other way); (2) the double dot with x itself,
/// within the published bound sum |w_i| d_i / 2 plus 1e-5 of the magnitudes.
void check_int8_linear(executor& vk, dtype t, int64_t rows, int64_t k, int64_t n, uint64_t seed) {
  INFO("w " << to_string(t) << "[" << n << "," << k << "], x [" << rows << "," << k << "] on " << vk.info().name);
  const std::string tag = std::string(to_string(t)) + "_" + std::to_string(rows) + "_" + std::to_string(k) + "_" + std::to_string(n);
  builder b;
  auto x = b.input("x", dtype::f32, {rows, k});
  auto w = b.parameter("w" + tag, t, {n, k});
  b.output("y", linear(x, w));
  const graph g = finish(b);
  const std::vector<float> xv = int8_x(rows, k, seed);
  const tensor wt = weights(t, {n, k}, seed + 1);
  const tensor_map out = run_on(vk, g, {{"x", tensor::from_floats({rows, k}, xv)}}, {{"w" + tag, wt}});
  bool lmvi = false;
  for (const auto& kt : vk.stats().kernels) lmvi = lmvi || kt.name.rfind("lmvi", 0) == 0;
  CHECK(lmvi);
  const std::vector<float> y = out.at("y").to_floats();
  const std::vector<double> wd = wt.to_doubles();
  const int64_t rb = *row_bytes(t, k);
  int64_t bad = 0;
  for (int64_t j = 0; j < n; ++j) {
    const std::vector<double> off = weight_offsets(t, wt.bytes.data() + j * rb, k, true);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = xv.data() + r * k;
      double exact = 0, quantized = 0, bound = 0, mag = 0, one_code = 0;
      for (int64_t blk = 0; blk < k / 32; ++blk) {
        float m = 0;
        for (int64_t i = 0; i < 32; ++i) m = std::max(m, std::abs(xr[blk * 32 + i]));
        const float d = m / 127.0f;
        for (int64_t i = 0; i < 32; ++i) {
          const int64_t c = blk * 32 + i;
          const double wv = wd[static_cast<size_t>(j * k + c)], xc = xr[c];
          const float q = d == 0.0f ? 0.0f : std::clamp(std::nearbyint(xr[c] / d), -127.0f, 127.0f);
          exact += xc * wv;
          quantized += static_cast<double>(q) * d * wv;
          bound += std::abs(wv) * d / 2;
          mag += std::abs(xc) * (std::abs(wv) + 2 * off[static_cast<size_t>(c)]);
          one_code = std::max(one_code, std::abs(wv) * d);
        }
      }
      const double got = y[static_cast<size_t>(r * n + j)];
      const bool ok = std::abs(got - quantized) <= 2e-6 * mag + one_code && std::abs(got - exact) <= bound + 1e-5 * mag;
      if (!ok && bad++ < 5) CHECK(got == Approx(quantized));
    }
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("linear: x in 8 bits through integer dot products (lmvi) for q8_0, q4_k and q6_k weights, within the published bound") {
  auto vk = validated("", "int8");
  if (!vk->info().integer_dot) {
    WARN(vk->info().name << " has no packed 8-bit integer dot product: lmvi not checked");
    return;
  }
  for (dtype t : {dtype::q8_0, dtype::q4_k, dtype::q6_k}) {
    // One row, a partial last step (q8_0: 3 blocks; the k-quants: a step is 4 blocks of 256),
    // n past the last subgroup's rows; 3 rows; 16 rows (a batched decode step).
    check_int8_linear(*vk, t, 1, t == dtype::q8_0 ? 96 : 256, 7, 51);
    check_int8_linear(*vk, t, 3, 1280, 5, 52);
    check_int8_linear(*vk, t, 16, 512, 9, 53);
  }
  // x holding NaN or infinity: that block's products are NaN, as in the CPU's integer dots.
  builder b;
  auto x = b.input("x", dtype::f32, {1, 64});
  auto w = b.parameter("wnan", dtype::q8_0, {3, 64});
  b.output("y", linear(x, w));
  std::vector<float> xv(64, 0.5f);
  xv[40] = std::numeric_limits<float>::infinity();
  const tensor_map out = run_on(*vk, finish(b), {{"x", tensor::from_floats({1, 64}, xv)}}, {{"wnan", weights(dtype::q8_0, {3, 64}, 54)}});
  for (float v : out.at("y").to_floats()) CHECK(std::isnan(v));
  CHECK(vk->stats().validation_errors == 0);
}

TEST_CASE("linear: a float weight in a buffer is read as uvec4 chunks when its rows allow") {
  for (const dtype wt : {dtype::f32, dtype::f16, dtype::bf16})
    for (const int64_t k : {64, 36}) {
      INFO(to_string(wt) << " k " << k);
      builder b;
      auto x = b.input("x", dtype::f32, {1, k});
      auto w = b.parameter("w", wt, {16, k});
      b.output("y", linear(x, w));
      const graph g = finish(b);
      const plan p = lower(g);
      REQUIRE(p.kernels.size() == 1);
      device_caps caps;
      caps.subgroup_arithmetic = true;
      caps.storage16 = true;
      auto s = emit(g, p, p.kernels[0], caps);
      REQUIRE(s);
      const bool wide = k % 8 == 0;
      CHECK((s->name == "lmv_" + std::string(to_string(wt)) + "_" + std::to_string(p.kernels[0].root)) == wide);
      CHECK((s->glsl.find("uvec4 v[]") != std::string::npos) == wide);
      // x, an f32 buffer of its own, is read 4 floats at a time beside the uvec4 chunks.
      CHECK((s->glsl.find("{ vec4 v[]") != std::string::npos) == wide);
    }
}

TEST_CASE("kv_write: the slice lands in the resident cache, attention reads it in the same run") {
  auto vk = validated();
  for (dtype t : {dtype::f32, dtype::f16}) {
    INFO(to_string(t));
    const std::string name = std::string("kv.") + to_string(t);
    builder b;
    auto cache = b.parameter(name, t, {2, 6, 4});  // [heads, positions, head dim]
    auto v = b.input("v", t, {2, 2, 4});
    auto pos = b.input("pos", dtype::i32, {});
    auto q = b.input("q", t, {2, 1, 4});
    auto kv = kv_write(cache, v * 1.0, pos, 1);
    b.update(cache, kv);
    b.output("scores", matmul(q, transpose(kv)));  // attention reads the updated cache
    const graph g = finish(b);
    for (executor* ex : {vk.get(), &cpu()}) {
      INFO(ex->info().name);
      tensor_map params{{name, random_tensor(t, {2, 6, 4}, 41)}};
      for (int32_t p : {0, 3, 5, -1}) {  // 5 and -1: one row past either end, dropped
        INFO("pos " << p);
        const tensor_map inputs{{"v", random_tensor(t, {2, 2, 4}, 42 + static_cast<uint64_t>(p + 1))},
                                {"pos", tensor::from_ints({}, {p})},
                                {"q", random_tensor(t, {2, 1, 4}, 43)}};
        const reference ref = reference_run(g, inputs, params);
        check_on(*ex, g, inputs, params, ref);
        params = ref.params;  // the next step starts from this one's cache
      }
    }
  }
  CHECK(vk->stats().validation_errors == 0);
}

TEST_CASE("kv_write with a position per row: rows land in their places, negative ones nowhere") {
  auto vk = validated();
  builder b;
  auto cache = b.parameter("kv.rows", dtype::f32, {2, 8, 4});  // [heads, slots x positions, head dim]
  auto v = b.input("v", dtype::f32, {2, 3, 4});
  auto rows = b.input("rows", dtype::i32, {3});
  auto kv = kv_write(cache, v * 1.0, rows + 0.0, 1);  // positions computed in the graph, as a step's are
  b.update(cache, kv);
  b.output("total", sum(kv, {2}));
  const graph g = finish(b);
  for (executor* ex : {vk.get(), &cpu()}) {
    INFO(ex->info().name);
    tensor_map params{{"kv.rows", random_tensor(dtype::f32, {2, 8, 4}, 61)}};
    for (const auto& r : std::vector<std::vector<int32_t>>{{0, 5, 2}, {7, -1, 3}, {-1, -1, 8}}) {
      INFO("rows " << r[0] << " " << r[1] << " " << r[2]);
      const tensor_map inputs{{"v", random_tensor(dtype::f32, {2, 3, 4}, 62 + static_cast<uint64_t>(r[0] + 1))},
                              {"rows", tensor::from_ints({3}, r)}};
      const reference ref = reference_run(g, inputs, params);
      check_on(*ex, g, inputs, params, ref);
      params = ref.params;
    }
  }
  CHECK(vk->stats().validation_errors == 0);
}

TEST_CASE("kv_write: the plan writes the slice into the parameter's own buffer") {
  builder b;
  auto cache = b.parameter("cache", dtype::f32, {8, 4});
  auto kv = kv_write(cache, b.input("v", dtype::f32, {1, 4}), b.input("pos", dtype::i32, {}), 0);
  b.update(cache, kv);
  b.output("y", sum(kv, {1}));
  const graph g = finish(b);
  const plan p = lower(g);
  CHECK(describe(g, p) == "kvw(%3) red(%4)");
  auto src = emit(g, p, p.kernels[0], device_caps{});
  REQUIRE(src);
  CHECK(src->name == "kvw_3");
  CHECK(src->bytes == 2 * 16);  // the value read and written, not the cache
}

TEST_CASE("set_parameter_view uploads quantized blocks from the caller's bytes, checked") {
  const tensor w = weights(dtype::q6_k, {5, 512}, 51);
  const std::vector<uint8_t> mapped = w.bytes;  // stands for a memory-mapped file
  builder b;
  auto x = b.input("x", dtype::f32, {1, 512});
  auto wp = b.parameter("view.w", dtype::q6_k, {5, 512});
  b.output("y", linear(x, wp));
  const graph g = finish(b);
  const tensor_map inputs{{"x", random_tensor(dtype::f32, {1, 512}, 52)}};
  const reference ref = reference_run(g, inputs, {{"view.w", w}});
  auto vk = validated();
  for (executor* ex : {vk.get(), &cpu()}) {
    INFO(ex->info().name);
    REQUIRE(ex->set_parameter_view("view.w", {dtype::q6_k, {5, 512}, mapped}));
    check_on(*ex, g, inputs, {}, ref, 1e-4);
    auto back = ex->get_parameters({"view.w"});
    REQUIRE(back);
    CHECK(back->at("view.w") == w);  // the blocks as uploaded
    auto short_bytes = ex->set_parameter_view("view.w", {dtype::q6_k, {5, 512}, std::span<const uint8_t>(mapped).first(mapped.size() - 1)});
    REQUIRE_FALSE(short_bytes);
    CHECK(short_bytes.error().message == "parameter \"view.w\": tensor [5,512] of q6_k needs 2100 bytes, has 2099");
    auto other = ex->set_parameter_view("view.w", {dtype::q8_0, {5, 512}, std::span<const uint8_t>(mapped).first(5 * 16 * 34)});
    REQUIRE_FALSE(other);
    CHECK(other.error().code == error_code::shape_mismatch);
  }
  CHECK(vk->stats().validation_errors == 0);
}

TEST_CASE("linear: an embedding of a quantized table decodes the picked rows, on both back ends") {
  // The CPU executor keeps a cast that only gathers read in its blocks and decodes each picked
  // row (not the whole table); picks past the table read zeros, a row picked twice is the same.
  auto vk = validated();
  for (dtype wt : {dtype::q8_0, dtype::q4_k, dtype::q6_k}) {
    INFO(to_string(wt));
    const int64_t rows = 5, row = block_elements(wt);
    builder b;
    auto ids = b.input("ids", dtype::i32, {6});
    auto table = b.parameter(std::string("table_") + to_string(wt), wt, {rows, row});
    b.output("rows", gather(cast(table, dtype::f32), ids));
    const graph g = finish(b);
    const tensor_map inputs{{"ids", tensor::from_ints({6}, {4, 0, 2, 9, -1, 4})}};
    const tensor_map params{{std::string("table_") + to_string(wt), weights(wt, {rows, row}, 51)}};
    const reference ref = reference_run(g, inputs, params);
    check_on(cpu(), g, inputs, params, ref, 1e-6);
    check_on(*vk, g, inputs, params, ref, 1e-6);
  }
  CHECK(vk->stats().validation_errors == 0);
}
