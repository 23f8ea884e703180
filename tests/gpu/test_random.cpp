// Random well-typed graphs (graph_generator.hpp, the generator fuzz_gpu_codegen uses) on Vulkan
// (lavapipe in CI) and on the CPU back end, against the reference evaluator: fusion, rows
// kernels, split reductions, transposed-operand matmuls and index arithmetic meet shapes and op
// mixes no hand-written case has.
#include <cstdlib>

#include "graph_generator.hpp"
#include "harness.hpp"

#include "gpu/plan.hpp"

using namespace mesh;
using namespace mesh::gpu::test;

namespace {

/// Seeded bytes for the generator.
std::vector<uint8_t> random_bytes(uint64_t seed, size_t n) {
  std::vector<uint8_t> bytes(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : bytes) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(s >> 56);
  }
  return bytes;
}

/// Runs `g` on `ex` and compares every output with the reference's: within `tol` of the largest
/// value, unless either side overflowed or made NaN (then the rounding order decides).
void compare(gpu::executor& ex, const graph& g, const tensor_map& inputs, const tensor_map& params,
             const tensor_map& want, double tol) {
  INFO("on " << ex.info().name);
  const tensor_map got = run_on(ex, g, inputs, params);
  for (const auto& [name, w] : want) {
    INFO("output " << name);
    const tensor& c = got.at(name);
    REQUIRE(c.dims == w.dims);
    if (!mesh::test::tame(w) || !mesh::test::tame(c)) continue;
    CHECK(normalised_error(c, w) <= tol);
  }
}

}  // namespace

TEST_CASE("random graphs: Vulkan and the CPU back end equal the reference") {
  vulkan();  // keeps the driver loaded (see harness.hpp)
  // MESH_RANDOM_GRAPHS=N runs N graphs, MESH_RANDOM_SEED=S from another seed, MESH_RANDOM_STEPS
  // = K of up to K ops (16), for a longer hunt.
  const int want_graphs = std::getenv("MESH_RANDOM_GRAPHS") ? std::atoi(std::getenv("MESH_RANDOM_GRAPHS")) : 40;
  const uint64_t first = std::getenv("MESH_RANDOM_SEED") ? std::strtoull(std::getenv("MESH_RANDOM_SEED"), nullptr, 10) : 1;
  const int steps = std::getenv("MESH_RANDOM_STEPS") ? std::atoi(std::getenv("MESH_RANDOM_STEPS")) : 16;
  int ran = 0;
  for (uint64_t seed = first; ran < want_graphs && seed < first + 25 * static_cast<uint64_t>(want_graphs); ++seed) {
    const auto bytes = random_bytes(seed, static_cast<size_t>(7 * steps));
    auto g = mesh::test::graph_from_bytes(bytes.data(), bytes.size(), steps);
    if (!g) continue;
    if (!mesh::test::small_f32_graph(*g, 100000)) continue;
    ++ran;
    INFO("seed " << seed << ": " << gpu::describe(*g, gpu::lower(*g)));
    tensor_map inputs, params;
    mesh::test::random_bindings(*g, seed, inputs, params);
    const auto want = reference_run(*g, inputs, params).outputs;
    // Fresh executors: parameter names repeat across graphs with other shapes. Rows kernels of
    // every length and split reductions on, as lavapipe would not have them by default.
    gpu::vulkan_options o;
    o.cache_dir = "-";
    o.split_reductions = 1;
    o.fuse_rows = 1;
    auto vk = gpu::make_vulkan_executor(o);
    REQUIRE(vk.has_value());
    compare(**vk, *g, inputs, params, want, 1e-4);
    compare(*gpu::make_cpu_executor(2), *g, inputs, params, want, 1e-4);
  }
  CHECK(ran == want_graphs);
}
