#pragma once
// Shared helpers of the gpu tests: random tensors, the executors under test, and a check that
// runs a graph on a back end and compares outputs and updated parameters with mesh::evaluate.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "graph/builder.hpp"
#include "graph/evaluate.hpp"
#include "gpu/executor.hpp"
#include "graph/quant.hpp"

namespace mesh::gpu::test {

inline tensor random_tensor(dtype t, shape s, uint64_t seed, double lo = -1, double hi = 1) {
  tensor x = tensor::zeros(t, s);
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < x.size(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(state >> 11) / 9007199254740992.0;
    x.set(i, t == dtype::i32 ? std::floor(lo + u * (hi - lo)) : lo + u * (hi - lo));
  }
  return x;
}

/// The Vulkan executor of this test process (lavapipe in CI); memory-only kernel cache; split
/// reductions and rows kernels of every row length on (by default they are off, or partly off,
/// on CPU devices, and CI must test them). It lives
/// until exit on purpose: destroying the last instance unloads the driver, and LeakSanitizer could
/// then not name (nor suppress) what the driver leaked.
inline executor& vulkan() {
  static executor* ex = [] {
    vulkan_options o;
    o.cache_dir = "-";
    o.split_reductions = 1;
    o.fuse_rows = 1;
    auto e = make_vulkan_executor(o);
    if (!e) FAIL("no Vulkan executor: " << e.error().to_string());
    return e->release();
  }();
  return *ex;
}

/// The CPU back end with x kept in f32 in every linear, so that its results are within f32
/// rounding of the reference; cpu_int8() is the default, which rounds x to 8 bits for q8_0, q4_0,
/// q4_k and q6_k weights where the CPU has AVX2 (tests/gpu/test_cpu_kernels.cpp checks it).
inline executor& cpu() {
  static std::unique_ptr<executor> ex = [] {
    cpu_options o;
    o.threads = 2, o.int8_linear = 0;
    return make_cpu_executor(o);
  }();
  return *ex;
}

inline executor& cpu_int8() {
  static std::unique_ptr<executor> ex = [] {
    cpu_options o;
    o.threads = 2, o.int8_linear = 1;
    return make_cpu_executor(o);
  }();
  return *ex;
}

/// The register kernels sum larger terms than the weights' own values and subtract an offset
/// after the sum: q4_k's d*sc*q against dmin*m; with `int8` (the integer dots) also q6_k's
/// d*sc*u against d*sc*32 (u = q + 32). Per element, that offset's magnitude (0 for the other
/// dtypes), which the tolerances count as part of the products' magnitudes.
inline std::vector<double> weight_offsets(dtype t, const uint8_t* row, int64_t k, bool int8) {
  std::vector<double> off(static_cast<size_t>(k), 0.0);
  for (int64_t blk = 0; blk < k / 256; ++blk) {
    if (t == dtype::q4_k) {
      const uint8_t* b = row + blk * 144;
      const double dmin = half_to_float(static_cast<uint16_t>(b[2] | b[3] << 8));
      const uint8_t* s = b + 4;
      for (int j = 0; j < 8; ++j) {
        const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
        for (int e = 0; e < 32; ++e) off[static_cast<size_t>(blk * 256 + 32 * j + e)] = std::abs(dmin * m);
      }
    } else if (t == dtype::q6_k && int8) {
      const uint8_t* b = row + blk * 210;
      const double d = half_to_float(static_cast<uint16_t>(b[208] | b[209] << 8));
      for (int j = 0; j < 16; ++j)
        for (int e = 0; e < 16; ++e) off[static_cast<size_t>(blk * 256 + 16 * j + e)] = std::abs(d * static_cast<int8_t>(b[192 + j]) * 32);
    }
  }
  return off;
}

inline double tolerance_for(dtype t) {
  switch (t) {
    case dtype::f16: return 4e-3;
    case dtype::bf16: return 3e-2;
    default: return 2e-5;
  }
}

/// The reference outputs and updated parameters of one run.
struct reference {
  tensor_map outputs, params;
};

inline reference reference_run(const graph& g, const tensor_map& inputs, const tensor_map& params) {
  // Like the executors, out-of-range indices read zeros or are dropped: some tests use them.
  auto out = evaluate(g, inputs, params, index_check::as_devices);
  if (!out) FAIL("reference: " << out.error().to_string());
  return {std::move(out->outputs), std::move(out->params)};
}

/// Sets `params` (when any), loads `g` on `ex` and runs it once: its outputs, or a test failure
/// that says which step failed.
inline tensor_map run_on(executor& ex, const graph& g, const tensor_map& inputs, const tensor_map& params = {}) {
  if (!params.empty()) REQUIRE(ex.set_parameters(params).has_value());
  auto id = ex.load(g);
  if (!id) FAIL("load failed on " << ex.info().name << ": " << id.error().to_string());
  auto out = ex.run(*id, inputs);
  if (!out) FAIL("run failed on " << ex.info().name << ": " << out.error().to_string());
  return std::move(*out);
}

/// Runs `g` on `ex`; every output and every updated parameter must agree with the reference's
/// within `tol` (or the dtype's default when tol < 0). Returns the back end's outputs.
inline tensor_map check_on(executor& ex, const graph& g, const tensor_map& inputs, const tensor_map& params,
                           const reference& want_all, double tol = -1) {
  const tensor_map* ref = &want_all.outputs;
  const tensor_map& ref_params = want_all.params;
  tensor_map out = run_on(ex, g, inputs, params);
  for (const auto& [name, want] : *ref) {
    INFO("output " << name << " on " << ex.info().name);
    REQUIRE(out.count(name) == 1);
    const tensor& got = out.at(name);
    REQUIRE(got.type == want.type);
    REQUIRE(got.dims == want.dims);
    const double t = tol >= 0 ? tol : tolerance_for(want.type);
    CHECK(normalised_error(got, want) <= t);
  }
  std::vector<std::string> names;
  for (const auto& u : g.updates) names.push_back(g[u.target].attrs.name);
  if (!names.empty()) {
    auto got = ex.get_parameters(names);
    REQUIRE(got.has_value());
    for (const auto& n : names) {
      INFO("updated parameter " << n);
      CHECK(normalised_error(got->at(n), ref_params.at(n)) <= (tol >= 0 ? tol : tolerance_for(got->at(n).type)));
    }
  }
  return out;
}

inline tensor_map check_on(executor& ex, const graph& g, const tensor_map& inputs, const tensor_map& params, double tol = -1) {
  return check_on(ex, g, inputs, params, reference_run(g, inputs, params), tol);
}

/// Both back ends against the reference (evaluated once).
inline void check(const graph& g, const tensor_map& inputs, const tensor_map& params = {}, double tol = -1) {
  const reference ref = reference_run(g, inputs, params);
  check_on(vulkan(), g, inputs, params, ref, tol);
  check_on(cpu(), g, inputs, params, ref, tol);
}

inline graph finish(builder& b) {
  auto g = b.finish();
  if (!g) FAIL("graph: " << g.error().to_string());
  return *g;
}

}  // namespace mesh::gpu::test
