#include <catch2/catch.hpp>

#include "graph/builder.hpp"
#include "graph/nn.hpp"
#include "gpu/glsl.hpp"
#include "gpu/shader_cache.hpp"
#include "spirv_check.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

using namespace mesh;

namespace {
graph done(builder& b) {
  auto g = b.finish();
  REQUIRE(g.has_value());
  return *g;
}

/// A device like the NVIDIA GPUs the tensor-core kernels are for: 16-bit storage, subgroup
/// arithmetic, 48 KiB of shared memory and cooperative matrices.
gpu::device_caps tensor_core_caps() {
  gpu::device_caps caps;
  caps.storage16 = true;
  caps.subgroup_arithmetic = true;
  caps.shared_memory_bytes = 49152;
  caps.coopmat_f16 = true;
  return caps;
}

/// Kernel `k` of plan `p` emitted for `caps` and compiled by shaderc (and rewritten, for KHR
/// cooperative matrices: then validated, spirv_check.hpp); the test fails, showing the kernel's
/// GLSL, where any step fails.
gpu::kernel_source compiled(gpu::shader_cache& cache, const graph& g, const gpu::plan& p, const gpu::kernel& k,
                            const gpu::device_caps& caps) {
  auto src = gpu::emit(g, p, k, caps);
  REQUIRE(src.has_value());
  INFO(src->name << "\n" << src->glsl);
  auto spirv = gpu::kernel_spirv(cache, *src);
  if (!spirv) FAIL(spirv.error().message);
  if (src->bf16_matrices || src->khr_matrices) gpu::test::check_valid(*spirv, src->name);
  // Only A and B matrices on bf16: devices offer bf16 x bf16 -> f32 products, not bf16 accumulators.
  for (uint32_t use : gpu::test::summarize(*spirv).bf16_matrix_uses) CHECK(use < 2);
  return *src;
}
}  // namespace

TEST_CASE("glsl: every kernel of a varied graph compiles with shaderc, for both reduction variants") {
  builder b;
  auto x = b.input("x", dtype::f32, {6, 300});
  auto h = b.input("h", dtype::f16, {6, 300});
  auto idx = b.input("i", dtype::i32, {5});
  auto table = b.parameter("t", dtype::f32, {7, 3});
  auto w = b.parameter("w", dtype::f32, {300, 9});
  b.output("sm", nn::softmax(x));
  b.output("h2", cast(h, dtype::f32) * 2.0);
  b.output("mm", relu(matmul(x, w) + 1.0));
  b.output("g", gather(table, idx));
  b.output("s", scatter_add(idx, gather(table, idx), {7, 3}));
  b.output("c", concat({slice_axis(x, 1, 0, 5), transpose(slice_axis(x, 0, 0, 5))}, 0));
  b.output("r0", sum(x, {0}));
  b.output("bf", cast(x, dtype::bf16));
  b.output("ln", nn::layer_norm(slice_axis(x, 1, 0, 3), b.parameter("lg", dtype::f32, {3}),
                                b.parameter("lb", dtype::f32, {3})));  // a rows kernel of 64 threads
  const graph g = done(b);
  const auto p = gpu::lower(g);
  gpu::shader_cache cache("", "test");
  for (bool subgroups : {false, true}) {
    gpu::device_caps caps;
    caps.subgroup_arithmetic = subgroups;
    caps.storage16 = true;
    for (const auto& k : p.kernels) {
      auto src = gpu::emit(g, p, k, caps);
      REQUIRE(src.has_value());
      INFO(src->glsl);
      auto spirv = cache.get(src->name, src->glsl);
      if (!spirv) FAIL(spirv.error().message);
      CHECK(spirv->at(0) == 0x07230203u);
    }
  }
}

TEST_CASE("glsl: split reductions emit two passes that compile, bind a scratch buffer and cap their grids") {
  builder b;
  auto x = b.input("x", dtype::f32, {3, 70001});
  auto h = b.input("h", dtype::f16, {70001});
  auto cols = b.input("cols", dtype::f32, {9001, 40});
  auto i = b.input("i", dtype::i32, {3, 70001});
  b.output("rows", sqrt(sum(exp(x), {1}) + 1.0));
  b.output("hmax", max_over(h, {0}));
  b.output("cols", mean(cols, {0}));
  b.output("imax", max_over(i, {0, 1}));
  const graph g = done(b);
  const auto p = gpu::lower(g);
  REQUIRE(p.scratch.size() == 4);
  gpu::shader_cache cache("", "test");
  for (bool subgroups : {false, true}) {
    gpu::device_caps caps;
    caps.subgroup_arithmetic = subgroups;
    caps.storage16 = true;
    caps.max_groups = {2, 3, 65535};  // grid-stride over outputs and over slices
    for (const auto& k : p.kernels) {
      REQUIRE(k.pass != 0);
      const auto src = compiled(cache, g, p, k, caps);
      INFO(src.name);
      CHECK(src.groups[0] <= 2);
      CHECK(src.groups[1] <= 3);
      // Pass 1 writes the scratch buffer (binding 0) and never the root; pass 2 reads it.
      const node_index scratch = gpu::scratch_id(g, k.scratch);
      if (k.pass == 1) CHECK(src.bindings[0] == scratch);
      if (k.pass == 2) CHECK((src.bindings[0] == k.root && src.bindings[1] == scratch));
    }
  }
}

TEST_CASE("glsl: dispatch sizes respect the device's workgroup count limit (grid-stride loops)") {
  builder b;
  auto x = b.input("x", dtype::f32, {65535 * 256 * 4 + 4});
  b.output("y", x * 2.0);
  const graph g = done(b);
  const auto p = gpu::lower(g);
  gpu::device_caps caps;
  caps.max_groups = {65535, 65535, 65535};
  auto src = gpu::emit(g, p, p.kernels[0], caps);
  REQUIRE(src.has_value());
  CHECK(src->groups[0] == 65535);
  CHECK(src->name.rfind("ew4_", 0) == 0);  // vec4 variant
  CHECK(src->glsl.find("i += stride") != std::string::npos);
}

TEST_CASE("glsl: on a device with a loop limit, a scatter_add whose workgroups would loop past it is refused") {
  // 16 outputs over 4 workgroups: each walks 4 outputs of 20,000 pick iterations (80K > 65535).
  builder b;
  auto idx = b.input("idx", dtype::i32, {256 * 20000});
  auto upd = b.input("upd", dtype::f32, {256 * 20000, 4});
  b.output("y", scatter_add(idx, upd, {4, 4}));
  const graph g = done(b);
  const auto p = gpu::lower(g);
  gpu::device_caps caps;
  caps.loop_limit = 65535;
  caps.max_groups = {4, 65535, 65535};
  const gpu::kernel* scatter = nullptr;
  for (const auto& k : p.kernels)
    if (k.kind == gpu::kernel_kind::scatter_add) scatter = &k;
  REQUIRE(scatter);
  auto src = gpu::emit(g, p, *scatter, caps);
  REQUIRE_FALSE(src);
  CHECK(src.error().code == error_code::unsupported);
  caps.max_groups = {65535, 65535, 65535};  // one output per workgroup: 20,010 iterations fit
  CHECK(gpu::emit(g, p, *scatter, caps).has_value());
  caps.loop_limit = 0;  // a GPU: no limit
  caps.max_groups = {4, 65535, 65535};
  CHECK(gpu::emit(g, p, *scatter, caps).has_value());
}

TEST_CASE("glsl: f16 tensors are refused without 16-bit storage") {
  builder b;
  auto h = b.input("h", dtype::f16, {4});
  b.output("y", h + h);
  const graph g = done(b);
  const auto p = gpu::lower(g);
  gpu::device_caps caps;
  caps.storage16 = false;
  auto src = gpu::emit(g, p, p.kernels[0], caps);
  REQUIRE_FALSE(src.has_value());
  CHECK(src.error().code == error_code::unsupported);
}

TEST_CASE("shader cache: memory hit, then disk hit from a fresh cache") {
  const std::string dir = "/tmp/mesh-gpu-cache-test-" + std::to_string(::getpid());
  const std::string src = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n";
  {
    gpu::shader_cache c(dir, "dev");
    REQUIRE(c.get("k", src).has_value());
    REQUIRE(c.get("k", src).has_value());
    CHECK(c.counters().compiles == 1);
    CHECK(c.counters().memory_hits == 1);
  }
  {
    gpu::shader_cache c(dir, "dev");
    REQUIRE(c.get("k", src).has_value());
    CHECK(c.counters().compiles == 0);
    CHECK(c.counters().disk_hits == 1);
  }
  {
    gpu::shader_cache c(dir, "other device");
    REQUIRE(c.get("k", src).has_value());
    CHECK(c.counters().compiles == 1);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("shader cache: an entry of other content under the same key is recompiled, not used") {
  // The file name is a 64-bit FNV key; an entry planted (or colliding) under kernel A's name
  // but compiled from B must not be handed out for A.
  const std::string base = "/tmp/mesh-gpu-cache-collide-" + std::to_string(::getpid());
  const std::string a = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n";
  const std::string b = "#version 450\nlayout(local_size_x = 2) in;\nvoid main() {}\n";
  const auto only_file = [](const std::string& dir) {
    std::filesystem::path found;
    for (const auto& e : std::filesystem::directory_iterator(dir)) found = e.path();
    return found;
  };
  std::vector<uint32_t> words_a;
  {
    gpu::shader_cache ca(base + "/a", "dev"), cb(base + "/b", "dev");
    words_a = *ca.get("k", a);
    REQUIRE(cb.get("k", b).has_value());
  }
  const auto file_a = only_file(base + "/a");
  std::filesystem::copy_file(only_file(base + "/b"), file_a, std::filesystem::copy_options::overwrite_existing);
  {
    gpu::shader_cache c(base + "/a", "dev");
    auto got = c.get("k", a);
    REQUIRE(got.has_value());
    CHECK(*got == words_a);
    CHECK(c.counters().disk_hits == 0);
    CHECK(c.counters().compiles == 1);
  }
  std::filesystem::remove_all(base);
}

TEST_CASE("glsl: the cooperative-matrix f16 matmul compiles (run only on devices offering it)") {
  builder b;
  auto x = b.input("x", dtype::f16, {70, 48});
  auto w = b.parameter("w", dtype::f16, {48, 66});
  auto bias = b.parameter("b", dtype::f16, {66});
  b.output("y", relu(matmul(x, w) + bias));
  const graph g = done(b);
  const auto p = gpu::lower(g);
  gpu::device_caps caps;
  caps.storage16 = true;
  caps.coopmat_f16 = true;
  REQUIRE(p.kernels.size() == 1);
  auto src = gpu::emit(g, p, p.kernels[0], caps);
  REQUIRE(src.has_value());
  CHECK(src->name.rfind("mmcoop_", 0) == 0);
  gpu::shader_cache cache("", "test");
  auto spirv = cache.get(src->name, src->glsl);
  if (!spirv) FAIL(spirv.error().message << "\n" << src->glsl);
}

TEST_CASE("glsl: a prompt's linear in few tiles is split along k into two kernels, and both compile") {
  // 40 x 72 outputs are 2 tiles of 64 x 64: far too few for a GPU. k = 512 is 16 tiles of 32,
  // two slices of 8 (the least a slice may have). The epilogue (bias, relu) runs in pass 2.
  builder b;
  auto x = b.input("x", dtype::f32, {40, 512});
  auto w = b.parameter("w", dtype::bf16, {72, 512});
  auto bias = b.parameter("bias", dtype::f32, {72});
  b.output("y", relu(linear(x, w) + bias));
  // A quantized weight of the same shape stays one kernel (its decoding bounds it).
  auto wq = b.parameter("wq", dtype::q8_0, {72, 512});
  b.output("quantized", linear(x, wq));
  // Outputs enough for the device (2048 x 4096: 512 tiles of 128 x 128) stay one kernel.
  auto xl = b.input("xl", dtype::f32, {2048, 512});
  auto wl = b.parameter("wl", dtype::f16, {4096, 512});
  b.output("large", linear(xl, wl));
  const graph g = done(b);
  gpu::shader_cache cache("", "test", false);
  gpu::device_caps caps = tensor_core_caps();
  auto p = gpu::lower(g);
  const size_t before = p.kernels.size();
  gpu::split_linears(g, p, caps);
  REQUIRE(p.kernels.size() == before + 1);
  REQUIRE(p.scratch.size() == 1);
  CHECK(p.scratch[0].elements == 2 * 40 * 72);
  CHECK_THAT(gpu::describe(g, p), Catch::Contains(" x2)") && Catch::Contains("lin2("));
  std::vector<std::string> names;
  for (const auto& k : p.kernels) {
    if (k.kind != gpu::kernel_kind::linear) continue;
    const auto src = compiled(cache, g, p, k, caps);
    names.push_back(src.name);
    if (k.pass == 1) CHECK(src.groups[2] == 2);
  }
  REQUIRE(names.size() == 4);
  CHECK(names[0].rfind("mmctl64x64s2_bf16", 0) == 0);
  CHECK(names[1].rfind("mmctls2_", 0) == 0);
  CHECK(names[2].rfind("mmctl64x64_q8_0", 0) == 0);
  CHECK(names[3].rfind("mmctl128x128_f16", 0) == 0);
  // "nosplit" keeps it whole; "split4" would leave slices of 4 tiles: not allowed, so none;
  // without cooperative matrices there is no mmctl to split.
  for (const char* v : {"nosplit", "split4"}) {
    caps.variants.linear = v;
    auto q = gpu::lower(g);
    gpu::split_linears(g, q, caps);
    CHECK(q.kernels.size() == before);
  }
  caps = tensor_core_caps();
  caps.coopmat_f16 = false;
  auto r = gpu::lower(g);
  gpu::split_linears(g, r, caps);
  CHECK(r.kernels.size() == before);
}

TEST_CASE("glsl: a prompt's quantized weight is decoded to f16 before its product into one shared scratch buffer, and it compiles") {
  // The q4_k product's 256 x 72 outputs are 8 tiles of 64 x 64 (at most
  // linear_predecode_max_tiles): its weight is decoded first and the decoded (f16) product split
  // along k. The q8_0 product has 512 rows (linear_predecode_min_rows) in 112 tiles: decoded
  // first. Both share one scratch buffer, as large as the larger weight in f16. 40 rows into 8192
  // columns (128 tiles) stay staged by default; f16 weights need no decoding.
  builder b;
  auto x = b.input("x", dtype::f32, {256, 512});
  auto few = b.input("few", dtype::f32, {40, 256});
  auto w4 = b.parameter("w4", dtype::q4_k, {72, 512});
  auto wide = b.parameter("wide", dtype::q4_k, {8192, 256});
  auto w8 = b.parameter("w8", dtype::q8_0, {1024, 256});
  auto wh = b.parameter("wh", dtype::f16, {64, 512});
  auto bias = b.parameter("bias", dtype::f32, {1024});
  b.output("q4", linear(x, w4));
  b.output("q8", linear(reshape(x, {512, 256}), w8) + bias);
  b.output("few", linear(few, wide));
  b.output("f16", linear(x, wh));
  const graph g = done(b);
  gpu::device_caps caps = tensor_core_caps();
  auto p = gpu::lower(g);
  const size_t before = p.kernels.size();
  gpu::predecode_linears(g, p, caps);
  REQUIRE(p.kernels.size() == before + 2);
  REQUIRE(p.scratch.size() == 1);
  CHECK(p.scratch[0].type == dtype::f16);
  CHECK(p.scratch[0].elements == 1024 * 256);  // w8, the larger of the two decoded
  CHECK_THAT(gpu::describe(g, p), Catch::Contains("dqw(%") && Catch::Contains(" w=s0)"));
  gpu::split_linears(g, p, caps);
  CHECK_THAT(gpu::describe(g, p), Catch::Contains(" x2 w=s0)"));
  gpu::shader_cache cache("", "test", false);
  std::vector<std::string> names;
  for (const auto& k : p.kernels) {
    if (k.kind != gpu::kernel_kind::linear && k.kind != gpu::kernel_kind::weight_decode) continue;
    const auto src = compiled(cache, g, p, k, caps);
    names.push_back(src.name.substr(0, src.name.rfind('_')));
  }
  const std::vector<std::string> want{"dqw_q4_k",  "mmctl64x64s2_q4_k_dq", "mmctls2",          "dqw_q8_0",
                                      "mmctl64x64_q8_0_dq", "mmctl64x64_q4_k", "mmctl64x64s2_f16", "mmctls2"};
  CHECK(names == want);
  // "first" decodes from 17 rows on (the scratch buffer then holds the wide weight); "staged"
  // never; without cooperative matrices there is no mmctl.
  caps.variants.linear_decode = "first";
  auto q = gpu::lower(g);
  gpu::predecode_linears(g, q, caps);
  CHECK(q.kernels.size() == before + 3);
  CHECK(q.scratch[0].elements == 8192 * 256);
  caps.variants.linear_decode = "staged";
  q = gpu::lower(g);
  gpu::predecode_linears(g, q, caps);
  CHECK(q.kernels.size() == before);
  caps = tensor_core_caps();
  caps.coopmat_f16 = false;
  q = gpu::lower(g);
  gpu::predecode_linears(g, q, caps);
  CHECK(q.kernels.size() == before);
  CHECK(q.scratch.empty());
  // ... unless "first" asks for it: the f32 kernels then read the decoded weight's f16 pairs.
  caps.variants.linear_decode = "first";
  q = gpu::lower(g);
  gpu::predecode_linears(g, q, caps);
  REQUIRE(q.kernels.size() == before + 3);
  for (const auto& k : q.kernels) {
    if (k.kind != gpu::kernel_kind::linear || k.weight < 0) continue;
    const auto src = compiled(cache, g, q, k, caps);
    CHECK(src.name.rfind("mmw", 0) == 0);
    CHECK_THAT(src.glsl, Catch::Contains("unpackHalf2x16("));
  }
}

TEST_CASE("glsl: a prompt's linear takes the tensor-core kernel mmctl for f16, bf16 and quantized weights, and it compiles") {
  // x f32 and f16 (a reshape of a buffer), ragged rows and weight rows, an epilogue reading
  // another buffer; a small problem (64x64 tiles) and a large one (128x128).
  const dtype types[] = {dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::q4_k, dtype::q5_k, dtype::q6_k};
  gpu::shader_cache cache("", "test", false);
  for (dtype wt : types) {
    builder b;
    auto xs = b.input("xs", dtype::f32, {2, 21, 256});
    auto xh = b.input("xh", dtype::f16, {40, 256});
    auto xl = b.input("xl", dtype::f32, {1024, 256});
    auto w = b.parameter("w", wt, {72, 256});
    auto wl = b.parameter("wl", wt, {2056, 256});
    auto bias = b.parameter("bias", dtype::f32, {72});
    b.output("small", relu(linear(xs, w) + bias));
    b.output("half", linear(xh, w));
    b.output("large", linear(xl, wl));
    b.output("decode", linear(reshape(xs, {42, 256}), w));
    const graph g = done(b);
    const auto p = gpu::lower(g);
    gpu::device_caps caps = tensor_core_caps();
    std::vector<std::string> names;
    for (const auto& k : p.kernels) {
      if (k.kind != gpu::kernel_kind::linear) continue;
      INFO(to_string(wt));
      const auto src = compiled(cache, g, p, k, caps);
      names.push_back(src.name);
      CHECK(src.name.rfind("mmctl", 0) == 0);
    }
    CHECK(names.size() == 4);
    CHECK(std::count_if(names.begin(), names.end(), [](const std::string& n) { return n.rfind("mmctl128x128", 0) == 0; }) == 1);
    // kernel_variants::linear "f32" keeps the f32 kernels, and so does a device without coopmat.
    caps.variants.linear = "f32";
    for (const auto& k : p.kernels)
      if (k.kind == gpu::kernel_kind::linear) CHECK(gpu::emit(g, p, k, caps)->name.rfind("mmw", 0) == 0);
  }
}

TEST_CASE("glsl: bf16 products take the tensor-core kernels on bf16 fragments where the device has them, f16 ones KHR matrices, rewritten to valid SPIR-V") {
  // With KHR bf16 cooperative matrices (coopmat_bf16) a matmul of two bf16 operands takes mmct
  // and a prompt's linear of bf16 x and a bf16 weight mmctl (split along k when in few tiles),
  // on bf16 fragments: kernel_source::bf16_matrices, the SPIR-V rewritten (and validated where a
  // validator is given). An f16 matmul and a bf16 weight under f32 x keep the NV kernels on f16
  // fragments, rewritten to KHR matrices too where the device has KHR f16 ones (coopmat_khr; the
  // f16 product without epilogue stores f16 accumulators directly). Without them bf16 products
  // take the f32 kernels. Both shaderc settings: the unoptimised module keeps the fragments in
  // arrays indexed by loop counters.
  builder b;
  auto a = b.input("a", dtype::bf16, {2, 130, 64});
  auto w = b.parameter("w", dtype::bf16, {2, 64, 136});
  auto bias = b.parameter("bias", dtype::bf16, {136});
  auto ah = b.input("ah", dtype::f16, {130, 64});
  auto wh = b.parameter("wh", dtype::f16, {64, 136});
  auto x = b.input("x", dtype::bf16, {40, 1024});
  auto xl = b.input("xl", dtype::bf16, {130, 256});
  auto xf = b.input("xf", dtype::f32, {40, 256});
  auto lw = b.parameter("lw", dtype::bf16, {72, 1024});
  auto lw2 = b.parameter("lw2", dtype::bf16, {200, 256});
  b.output("mm", relu(matmul(a, w) + bias));
  b.output("mm_f16", matmul(ah, wh));
  b.output("lin_split", linear(x, lw));
  b.output("lin", relu(linear(xl, lw2)));
  b.output("lin_f32x", linear(xf, lw2));
  const graph g = done(b);
  for (bool optimize : {false, true}) {
    gpu::shader_cache cache("", "test", optimize);
    for (bool bf : {true, false}) {
      INFO((bf ? "coopmat_bf16" : "no coopmat_bf16") << (optimize ? ", optimised" : ", unoptimised"));
      gpu::device_caps caps = tensor_core_caps();
      caps.coopmat_bf16 = bf;
      caps.coopmat_khr = bf;
      auto p = gpu::lower(g);
      gpu::split_linears(g, p, caps);
      std::vector<std::string> rewritten, nv;
      for (const auto& k : p.kernels) {
        if (k.kind != gpu::kernel_kind::matmul && k.kind != gpu::kernel_kind::linear) continue;
        const auto src = compiled(cache, g, p, k, caps);
        (src.bf16_matrices ? rewritten : nv).push_back(src.name);
        if (src.name.rfind("mmct", 0) == 0 && src.name.rfind("mmctls2", 0) != 0) CHECK(src.khr_matrices == bf);
      }
      const auto has = [](const std::vector<std::string>& names, const std::string& prefix) {
        return std::count_if(names.begin(), names.end(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
      };
      INFO("rewritten: " << rewritten.size() << ", others: " << nv.size());
      if (bf) {
        REQUIRE(rewritten.size() == 3);
        CHECK(has(rewritten, "mmct64x64s4_bf16_") == 1);
        CHECK(has(rewritten, "mmctl64x64s4_bf16_bf16x_") == 1);  // pass 1 of the split, 4 slices
        CHECK(has(rewritten, "mmctl64x64_bf16_bf16x_") == 1);
        CHECK(has(nv, "mmct64x64s4_") == 1);                      // f16
        CHECK(has(nv, "mmctl64x64_bf16_") == 1);                  // f32 x, the weight rounded to f16
      } else {
        CHECK(rewritten.empty());
        CHECK(has(nv, "mmw") >= 3);  // the bf16 matmul and both bf16 x linears
      }
    }
  }
}

TEST_CASE("glsl: a prompt's attention takes the tensor-core kernel attnc where it fits, and it compiles") {
  // d 64 and 128 (keys per tile 64 and 32), 16; a sliding window; an f16 cache read through a
  // reshape; a batch; rows past the last tile's end; k and v read at an offset (a slice not at
  // the start: element by element, `attnc64x64s`). d 40 (not a multiple of 16), a device without
  // cooperative matrices and kernel_variants::attention "f32" keep `attnt`.
  struct attention_shape_case {
    int64_t batch, l, h, kv, d, t, window;
    dtype cache;
    const char* want;
    int64_t offset = 0;  ///< k and v start this many rows into their inputs
  };
  const attention_shape_case cases[] = {{0, 100, 4, 2, 64, 130, 0, dtype::f32, "attnc64x64_"},
                                        {0, 17, 2, 1, 128, 40, 0, dtype::f16, "attnc64x32_"},
                                        {2, 70, 3, 3, 16, 90, 20, dtype::f32, "attnc64x64_"},
                                        {0, 40, 2, 2, 64, 50, 0, dtype::f16, "attnc64x64s_", 3},
                                        {0, 40, 2, 2, 40, 50, 0, dtype::f32, "attnt"}};
  gpu::shader_cache cache("", "test", false);
  for (const auto& c : cases) {
    builder b;
    const shape lead = c.batch ? shape{c.batch} : shape{};
    auto with = [&](shape tail) {
      shape r = lead;
      r.insert(r.end(), tail.begin(), tail.end());
      return r;
    };
    auto q = b.input("q", dtype::f32, with({c.l, c.h, c.d}));
    auto k = reshape(b.input("k", c.cache, with({c.t, c.kv * c.d})), with({c.t, c.kv, c.d}));
    auto v = b.input("v", c.cache, with({c.t + c.offset, c.kv, c.d}));
    if (c.offset) {
      k = slice_axis(b.input("k2", c.cache, with({c.t + c.offset, c.kv, c.d})), c.batch ? 1 : 0, c.offset, c.t + c.offset);
      v = slice_axis(v, c.batch ? 1 : 0, c.offset, c.t + c.offset);
    }
    b.output("y", relu(attention(q, k, v, b.input("pos", dtype::i32, with({c.l})), c.window)));
    const graph g = done(b);
    const auto p = gpu::lower(g);
    const gpu::device_caps caps = tensor_core_caps();
    int found = 0;
    for (const auto& kn : p.kernels) {
      if (kn.kind != gpu::kernel_kind::attention) continue;
      ++found;
      const auto src = compiled(cache, g, p, kn, caps);
      CHECK(src.name.rfind(c.want, 0) == 0);
      gpu::device_caps no_coopmat = caps, f32 = caps;
      no_coopmat.coopmat_f16 = false;
      f32.variants.attention = "f32";
      CHECK(gpu::emit(g, p, kn, no_coopmat)->name.rfind("attnt", 0) == 0);
      CHECK(gpu::emit(g, p, kn, f32)->name.rfind("attnt", 0) == 0);
    }
    CHECK(found == 1);
  }
}

TEST_CASE("glsl: every matmul variant (f32 warp-tiled shapes, tiled coopmat shapes) compiles") {
  // Small (64x64 tiles) and large (enough 128-wide tiles to fill a GPU) problems, a weight
  // broadcast over the batch (read straight from its buffer), a transposed operand (loader), and
  // an epilogue that reads another buffer.
  builder b;
  auto xs = b.input("xs", dtype::f32, {2, 40, 24});
  auto xl = b.input("xl", dtype::f32, {16, 256, 64});
  auto w = b.parameter("w", dtype::f32, {24, 36});
  auto wl = b.parameter("wl", dtype::f32, {64, 520});
  auto bias = b.parameter("bias", dtype::f32, {520});
  b.output("small", relu(matmul(xs, w)));
  b.output("large", nn::gelu(matmul(xl, wl) + bias));
  b.output("transposed", matmul(transpose(xs), xs));
  auto hs = b.input("hs", dtype::f16, {40, 24});
  auto hl = b.input("hl", dtype::f16, {8, 256, 64});
  auto hw = b.parameter("hw", dtype::f16, {24, 40});
  auto hwl = b.parameter("hwl", dtype::f16, {64, 1024});
  auto hb = b.parameter("hb", dtype::f16, {1024});
  b.output("hsmall", matmul(hs, hw));
  b.output("hlarge", relu(matmul(hl, hwl) + hb));
  b.output("hplain", matmul(hl, hwl));  // no epilogue: whole tiles stored straight from the fragments
  auto hr = b.input("hr", dtype::f16, {8, 250, 64});
  b.output("hragged", matmul(hr, hwl));
  const graph g = done(b);
  const auto p = gpu::lower(g);
  // Unoptimised: this checks that every variant's GLSL compiles (spirv-opt would take minutes
  // on these unrolled kernels); the ops tests run the optimised kernels a device offers.
  gpu::shader_cache cache("", "test", false);
  // swizzle: the tile rasterisation (kernel_variants::gemm_swizzle); 3 leaves ragged groups of
  // tile rows. Explicit coopmat shapes ("g...") apply to every problem, the small one included.
  struct variant { const char* gemm; const char* coop; bool coopmat; uint32_t swizzle = 8; };
  for (auto v : {variant{"", "", false}, variant{"warp16", "", false}, variant{"wide", "", false}, variant{"classic", "", false},
                 variant{"narrow", "", false}, variant{"", "", true}, variant{"", "s8", true},
                 variant{"", "wide", true}, variant{"", "64", true}, variant{"", "g2x2f4x4k32", true}, variant{"", "g2x1f4x4k16", true},
                 variant{"", "", false, 0}, variant{"", "", false, 3}, variant{"", "", true, 0}, variant{"", "", true, 3}}) {
    gpu::device_caps caps;
    caps.variants.gemm_swizzle = v.swizzle;
    caps.storage16 = true;
    caps.shared_memory_bytes = 49152;
    caps.variants.gemm = v.gemm;
    caps.variants.coopmat = v.coop;
    caps.coopmat_f16 = v.coopmat;
    std::vector<std::string> names;
    int direct_stores = 0;  // tiled coopmat kernels without an epilogue store fragments directly
    int swizzled = 0;       // kernels with a rasterised tile order (those with several tile rows and columns)
    for (const auto& k : p.kernels) {
      if (k.kind != gpu::kernel_kind::matmul) continue;
      INFO(v.gemm << "/" << v.coop);
      const auto src = compiled(cache, g, p, k, caps);
      names.push_back(src.name);
      if (src.glsl.find("coopMatStoreNV(h, c16.v") != std::string::npos) ++direct_stores;
      if (src.glsl.find("rem % rows") != std::string::npos) ++swizzled;
    }
    INFO(v.gemm << "/" << v.coop << " swizzle " << v.swizzle);
    const bool tiled = std::string(v.gemm) != "classic";  // the f32 problems take mmw kernels
    CHECK((swizzled > 0) == (v.swizzle > 1 && tiled));
    const auto has = [&](const std::string& prefix) {
      return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
    };
    if (!v.coopmat) {
      CHECK(has(std::string(v.gemm) == "classic" ? "mm64_" : "mmw64x64"));
      const std::string g = v.gemm;
      const std::string big = g == "classic" ? "mm128_" : g == "wide" ? "mmw128x256" : g == "narrow" ? "mmw128x64" : "mmw128x128";
      CHECK(has(big));
    } else if (std::string(v.coop) == "64") {
      CHECK(has("mmcoop_"));
    } else if (v.coop[0] == 'g') {
      const std::string c = v.coop;
      CHECK(has(c == "g2x2f4x4k32" ? "mmct128x128s4_" : "mmct128x64s2k16_"));
      CHECK(!has("mmct64x64s4"));  // the small f16 problem gets the explicit shape too
      CHECK(direct_stores == 3);  // hsmall, hplain, hragged
    } else {
      CHECK(has("mmct64x64s4"));  // the small f16 problem
      CHECK(direct_stores == 3);   // hsmall, hplain, hragged
      CHECK(has(std::string(v.coop) == "s8" ? "mmct128x128s8" : std::string(v.coop) == "wide" ? "mmct128x256s8" : "mmct128x128s4"));
    }
  }
}
