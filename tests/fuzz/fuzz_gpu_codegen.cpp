// libFuzzer target for the kernel compiler's pure half (gpu::lower, gpu::emit): graphs come from
// peers, so every valid graph must lower and emit without crashing, whatever its shapes. The fuzz
// bytes drive the builder of well-typed graphs in tests/gpu/graph_generator.hpp (nearly every
// input is a valid graph). Lowering runs with low split thresholds so that split reductions, rows
// kernels and their checks are reached on small tensors; emission runs for several device
// capabilities. No shader is compiled here (test_gpu_codegen compiles every kernel kind).
// Small all-f32 graphs also run differentially: the CPU back end against the reference
// evaluator, on the same random inputs and parameters (an i32 read through a float once made
// them differ past 2^24; this would have found it).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu/executor.hpp"
#include "gpu/glsl.hpp"
#include "gpu/plan.hpp"
#include "graph/evaluate.hpp"
#include "graph/validate.hpp"
#include "graph_generator.hpp"

namespace {

using namespace mesh;

/// One line per node, for a failure report.
void print_graph(const graph& g) {
  for (node_index i = 0; i < g.size(); ++i) {
    std::fprintf(stderr, "  %%%d %s [", static_cast<int>(i), std::string(to_string(g[i].op)).c_str());
    for (auto d : g[i].dims) std::fprintf(stderr, " %lld", static_cast<long long>(d));
    std::fprintf(stderr, " ] <-");
    for (auto in : g[i].inputs) std::fprintf(stderr, " %%%d", static_cast<int>(in));
    std::fprintf(stderr, "\n");
  }
}

/// The CPU back end and the reference evaluator agree on a small all-f32 graph.
void differential(const graph& g, uint64_t seed) {
  if (!test::small_f32_graph(g, 20000)) return;  // small: keeps the fuzzer fast
  tensor_map inputs, params;
  test::random_bindings(g, seed, inputs, params);
  const auto cpu = gpu::make_cpu_executor(1);  // fresh: parameter names repeat with other shapes
  if (!cpu->set_parameters(params)) std::abort();
  auto id = cpu->load(g);
  if (!id) std::abort();
  auto got = cpu->run(*id, inputs);
  // as_devices: random_bindings() puts some gather indices out of range on purpose.
  auto want = evaluate(g, inputs, params, index_check::as_devices);
  if (!got || !want) std::abort();
  for (const auto& [name, w] : want->outputs) {
    const tensor& c = got->at(name);
    if (!test::tame(w) || !test::tame(c)) continue;  // overflow or NaN: rounding order decides, not a bug
    if (normalised_error(c, w) > 1e-3) {
      std::fprintf(stderr, "cpu and reference differ on output %s: normalised error %g\n", name.c_str(), normalised_error(c, w));
      print_graph(g);
      for (int64_t i = 0; i < std::min<int64_t>(c.size(), 8); ++i)
        std::fprintf(stderr, "  [%lld] cpu %g ref %g\n", static_cast<long long>(i), c.at(i), w.at(i));
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = test::graph_from_bytes(data, size);
  if (!g) return 0;  // an op the generator did not guard (the builder said why): not a codegen input
  if (!validate(*g)) std::abort();  // the builder only makes valid graphs

  gpu::split_options split;  // thresholds low enough for small tensors
  split.min_reduced = 8;
  split.min_slice = 8;
  split.target_groups = 16;
  split.max_slices = 8;
  const gpu::plan p = gpu::lower(*g, split, 2);
  gpu::device_caps caps[3];
  caps[0].subgroup_arithmetic = true;
  caps[0].storage16 = true;
  caps[1].storage16 = true;
  caps[1].shared_memory_bytes = 49152;
  caps[1].coopmat_f16 = true;
  caps[2].storage16 = false;  // f16/bf16 graphs must be refused, not crash
  caps[2].unroll_loops = false;
  for (const auto& c : caps)
    for (const auto& k : p.kernels) {
      auto src = gpu::emit(*g, p, k, c);
      if (!src) continue;
      if (src->bindings.empty() || src->writes < 1 || src->writes > src->bindings.size() || src->glsl.empty()) std::abort();
      for (auto id : src->bindings)
        if (id < 0 || id >= g->size() + static_cast<node_index>(p.scratch.size())) std::abort();
    }
  uint64_t seed = size;
  for (size_t i = 0; i < size; ++i) seed = seed * 131 + data[i];
  differential(*g, seed);
  return 0;
}
