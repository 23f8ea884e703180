// Cross-back-end op tests (in the spirit of ggml's test-backend-ops): every op, the dtypes it
// supports and each fused pattern, on Vulkan (lavapipe in CI) and on the CPU back end, against the
// reference evaluator. Sizes are odd on purpose (1, 3, 127, not multiples of tiles or of vec4).
#include "harness.hpp"

#include "graph/nn.hpp"
#include "gpu/glsl.hpp"
#include "gpu/plan.hpp"

using namespace mesh;
using namespace mesh::gpu::test;

namespace {
/// A matmul shape for the tables of cases below.
struct mm_case {
  int64_t batch, m, k, n;  ///< batch 0: a plain rank-2 matmul
};
}  // namespace

TEST_CASE("ops: unary elementwise, f32, odd sizes") {
  for (shape s : {shape{1}, shape{3, 127}}) {
    builder b;
    auto x = b.input("x", dtype::f32, s);
    auto pos = abs(x) + 0.1;
    b.output("neg", -x);
    b.output("abs", abs(x));
    b.output("exp", exp(x));
    b.output("log", log(pos));
    b.output("sqrt", sqrt(pos));
    b.output("rsqrt", rsqrt(pos));
    b.output("tanh", tanh(x * 3.0));
    b.output("sin", sin(x));
    b.output("cos", cos(x));
    b.output("relu", relu(x));
    b.output("sigmoid", sigmoid(x));
    check(finish(b), {{"x", random_tensor(dtype::f32, s, 1)}});
  }
}

TEST_CASE("ops: binary elementwise and compare, f32 and i32") {
  for (dtype t : {dtype::f32, dtype::i32}) {
    const shape s{5, 7};
    builder b;
    auto x = b.input("x", t, s);
    auto y = b.input("y", t, s);
    b.output("add", x + y);
    b.output("sub", x - y);
    b.output("mul", x * y);
    b.output("div", x / y);
    b.output("max", maximum(x, y));
    b.output("min", minimum(x, y));
    for (auto k : {compare_kind::eq, compare_kind::ne, compare_kind::lt, compare_kind::le, compare_kind::gt, compare_kind::ge})
      b.output("cmp" + std::to_string(static_cast<int>(k)), compare(x, y, k));
    if (t == dtype::f32) {
      b.output("pow", pow(abs(x) + 0.5, y));
      b.output("pow_int_exp", pow(x, 3.0));
    }
    check(finish(b), {{"x", random_tensor(t, s, 2, -5, 5)}, {"y", random_tensor(t, s, 3, -3, 3)}});
  }
}

TEST_CASE("ops: select, casts and numpy broadcasting") {
  builder b;
  auto x = b.input("x", dtype::f32, {4, 1, 6});
  auto y = b.input("y", dtype::f32, {3, 1});
  auto c = b.input("c", dtype::i32, {6});
  b.output("bcast", x * y + 1.0);
  b.output("select", select(c, x, y));
  b.output("to_int", cast(x * 10.0, dtype::i32));
  b.output("int_to_float", cast(c, dtype::f32) * 0.5);
  b.output("to_f16", cast(x, dtype::f16));
  b.output("to_bf16", cast(x, dtype::bf16));
  check(finish(b), {{"x", random_tensor(dtype::f32, {4, 1, 6}, 4)},
                    {"y", random_tensor(dtype::f32, {3, 1}, 5)},
                    {"c", random_tensor(dtype::i32, {6}, 6, 0, 2)}});
}

TEST_CASE("ops: f16 and bf16 tensors (16-bit storage, f32 compute)") {
  for (dtype t : {dtype::f16, dtype::bf16}) {
    builder b;
    auto x = b.input("x", t, {9, 13});
    const std::string wn = std::string("w_") + to_string(t);
    auto w = b.parameter(wn, t, {13, 5});
    b.output("chain", sigmoid(x) * x + 1.0);
    b.output("sum", sum(x, {1}));
    b.output("mm", matmul(x, w));
    check(finish(b), {{"x", random_tensor(t, {9, 13}, 7)}}, {{wn, random_tensor(t, {13, 5}, 8)}});
  }
}

TEST_CASE("ops: matmul sizes, batches, transposed operands and epilogues") {
  for (auto c : {mm_case{0, 1, 1, 1}, mm_case{0, 3, 5, 7}, mm_case{0, 127, 33, 65}, mm_case{2, 64, 64, 64},
                 mm_case{3, 17, 1, 9}, mm_case{0, 520, 20, 515}, mm_case{0, 300, 36, 516}, mm_case{32, 129, 4, 132},
                 mm_case{32, 129, 3, 129}}) {
    INFO("m=" << c.m << " k=" << c.k << " n=" << c.n << " batch=" << c.batch);
    shape as{c.m, c.k}, bs{c.k, c.n}, cs{c.n};
    if (c.batch) {
      as.insert(as.begin(), c.batch);
      bs.insert(bs.begin(), c.batch);
    }
    builder b;
    const std::string tag = std::to_string(c.batch) + "_" + std::to_string(c.m) + "_" + std::to_string(c.k) + "_" + std::to_string(c.n);
    auto x = b.input("x", dtype::f32, as);
    auto w = b.parameter("w" + tag, dtype::f32, bs);
    auto bias = b.parameter("b" + tag, dtype::f32, cs);
    b.output("plain", matmul(x, w));
    b.output("epilogue", relu(matmul(x, w) + bias) * 2.0);
    if (c.m * c.n * std::max<int64_t>(c.batch, 1) < 100000) b.output("gelu", nn::gelu(matmul(x, w) + bias));
    const graph g = finish(b);
    check(g, {{"x", random_tensor(dtype::f32, as, 9)}},
          {{"w" + tag, random_tensor(dtype::f32, bs, 10)}, {"b" + tag, random_tensor(dtype::f32, cs, 11)}}, 1e-4);
  }
  builder b;
  auto x = b.input("x", dtype::f32, {7, 11});
  auto w = b.parameter("wt", dtype::f32, {13, 11});
  b.output("xt_w", matmul(x, transpose(w)) + x.owner()->fill(0.5, dtype::f32, {7, 13}));
  b.output("xxt", matmul(transpose(x), x));
  check(finish(b), {{"x", random_tensor(dtype::f32, {7, 11}, 12)}}, {{"wt", random_tensor(dtype::f32, {13, 11}, 13)}}, 1e-4);
}

TEST_CASE("ops: few-row matmuls (mms: decode attention's shapes) over transposed and gathered operands match the reference") {
  // Decode attention: 4 query rows of each of 8 heads against 515 cached keys (k not a multiple
  // of the 64-deep slices, n not of the 64 columns a workgroup owns), the keys read transposed
  // through a gather of cache rows; then the probabilities times the values, split in slices.
  builder b;
  auto q = b.input("q", dtype::f32, {8, 4, 64});
  auto cache = b.parameter("mms_cache", dtype::f32, {600, 8 * 64});
  auto rows = b.input("rows", dtype::i32, {515});
  auto keys = permute(reshape(gather(cache, rows), {515, 8, 64}), {1, 2, 0});  // [8, 64, 515]
  b.output("scores", matmul(q, keys) * 0.125);
  auto p = b.input("p", dtype::f32, {8, 5, 4, 130});
  auto v = b.input("v", dtype::f32, {8, 5, 130, 64});
  b.output("pv", sum(matmul(p, v), {1}));
  auto x = b.input("x", dtype::f32, {1, 200});
  auto w = b.input("w", dtype::f32, {200, 3});
  b.output("one_row", relu(matmul(x, w)));
  auto x8 = b.input("x8", dtype::f32, {8, 1000});
  b.output("eight_rows", matmul(x8, transpose(reshape(slice_axis(cache, 0, 0, 125), {64, 1000}))));
  check(finish(b),
        {{"q", random_tensor(dtype::f32, {8, 4, 64}, 31)}, {"rows", random_tensor(dtype::i32, {515}, 32, 0, 600)},
         {"p", random_tensor(dtype::f32, {8, 5, 4, 130}, 33)}, {"v", random_tensor(dtype::f32, {8, 5, 130, 64}, 34)},
         {"x", random_tensor(dtype::f32, {1, 200}, 35)}, {"w", random_tensor(dtype::f32, {200, 3}, 36)},
         {"x8", random_tensor(dtype::f32, {8, 1000}, 37)}},
        {{"mms_cache", random_tensor(dtype::f32, {600, 8 * 64}, 38)}}, 1e-4);
}

TEST_CASE("ops: reductions over every axis pattern, with prologue and epilogue") {
  const shape s{3, 4, 300};
  builder b;
  auto x = b.input("x", dtype::f32, s);
  auto i = b.input("i", dtype::i32, {5, 3});
  b.output("rows", sum(x, {2}));                   // trailing, one workgroup per row
  b.output("rows_max", max_over(x, {2}, true));
  b.output("first", sum(x, {0}));                   // thread per output
  b.output("middle", max_over(x, {1}));
  b.output("outer", sum(x, {0, 2}, true));
  b.output("all", sum_all(x));
  b.output("prologue", sum(exp(x) * 0.5, {2}));
  b.output("mean", mean(x, {1, 2}));
  b.output("int_sum", sum(i, {0}));
  auto cols = b.input("cols", dtype::f32, {130, 5, 7});
  b.output("columns", sum(cols, {0}));               // leading axes: 32 outputs x 8 slices per group
  b.output("columns_max", max_over(cols, {0, 1}, true));
  b.output("columns_epilogue", mean(exp(cols), {0}) + 1.0);
  b.output("int_max", max_over(i, {1}));
  check(finish(b), {{"x", random_tensor(dtype::f32, s, 14)}, {"i", random_tensor(dtype::i32, {5, 3}, 15, -9, 9)},
                    {"cols", random_tensor(dtype::f32, {130, 5, 7}, 16)}}, {}, 1e-4);
}

/// Kernels of `g`'s plan that are the first pass of a split reduction.
static int split_count(const graph& g) {
  int n = 0;
  for (const auto& k : gpu::lower(g).kernels) n += k.pass == 1;
  return n;
}

TEST_CASE("ops: split reductions (few outputs over long ranges) match the reference and repeat bit for bit") {
  builder b;
  auto flat = b.input("flat", dtype::f32, {100003});   // odd: the last slice is short
  auto x = b.input("x", dtype::f32, {3, 7, 4999});
  auto rows = b.input("rows", dtype::f32, {5, 20011});
  auto mid = b.input("mid", dtype::f32, {3, 5003, 2});
  auto i = b.input("i", dtype::i32, {30011});
  auto cols = b.input("cols", dtype::f32, {4099, 33});
  auto cube = b.input("cube", dtype::f32, {1031, 4, 33});
  auto bias = b.input("bias", dtype::f32, {5});
  b.output("sum_all", sum_all(flat));
  b.output("mean_all", mean_all(x));                                   // epilogue: the 1/n, in pass 2 only
  b.output("max_all", max_over(x, {0, 1, 2}));
  b.output("prologue_epilogue", sqrt(sum(rows * rows, {1}) + 1.0) + bias);  // 5 rows, prologue in pass 1
  b.output("rows_max", max_over(exp(rows) - 1.0, {1}, true));
  b.output("middle", sum(mid, {1}));                                   // strided rows: 6 outputs
  b.output("int_sum", sum(i, {0}));
  b.output("int_max", max_over(i * 3, {0}));
  b.output("columns", sum(cols, {0}));                                 // 33 columns over 4099 rows
  b.output("columns_epilogue", mean(exp(cols), {0}) + 1.0);
  b.output("columns_max", max_over(cube, {0, 1}, true));
  const graph g = finish(b);
  CHECK(split_count(g) == 11);
  const tensor_map inputs{{"flat", random_tensor(dtype::f32, {100003}, 31)},
                          {"x", random_tensor(dtype::f32, {3, 7, 4999}, 32)},
                          {"rows", random_tensor(dtype::f32, {5, 20011}, 33)},
                          {"mid", random_tensor(dtype::f32, {3, 5003, 2}, 34)},
                          {"i", random_tensor(dtype::i32, {30011}, 35, -9, 9)},
                          {"cols", random_tensor(dtype::f32, {4099, 33}, 36)},
                          {"cube", random_tensor(dtype::f32, {1031, 4, 33}, 37)},
                          {"bias", random_tensor(dtype::f32, {5}, 38)}};
  const auto first = check_on(vulkan(), g, inputs, {}, reference_run(g, inputs, {}), 1e-5);
  // Fixed slices, fixed combine order, no atomics: a second run gives the same bits.
  auto id = vulkan().load(g);
  REQUIRE(id.has_value());
  auto again = vulkan().run(*id, inputs);
  REQUIRE(again.has_value());
  for (const auto& [name, t] : first) {
    INFO(name);
    CHECK(again->at(name).bytes == t.bytes);
  }
  // The sums are exact in i32 (no rounding): equal to the reference, not just close.
  const auto ref = reference_run(g, inputs, {});
  CHECK(first.at("int_sum").bytes == ref.outputs.at("int_sum").bytes);
  CHECK(first.at("int_max").bytes == ref.outputs.at("int_max").bytes);
}

TEST_CASE("ops: split reductions of f16 tensors round once, at the end") {
  builder b;
  auto h = b.input("h", dtype::f16, {3, 12007});
  b.output("mean", mean(h, {1}));
  b.output("sum", sum_all(h * h));
  const graph g = finish(b);
  CHECK(split_count(g) == 2);
  check(g, {{"h", random_tensor(dtype::f16, {3, 12007}, 39)}});
}

TEST_CASE("ops: data movement is index arithmetic: permute, slice, concat, reshape, broadcast") {
  builder b;
  auto x = b.input("x", dtype::f32, {2, 3, 5});
  auto y = b.input("y", dtype::f32, {2, 4, 5});
  b.output("perm", permute(x, {2, 0, 1}) * 1.5);
  b.output("slice", slice(x, {1, 1, 2}, {2, 3, 5}));
  b.output("concat", concat({x, y, x}, 1) + 1.0);
  b.output("concat0", concat({x, x}, 0));
  b.output("reshape", reshape(permute(x, {1, 0, 2}), {6, 5}));
  b.output("bcast", broadcast_to(slice_axis(x, 1, 0, 1), {2, 3, 5}) - x);
  b.output("identity", x);
  check(finish(b), {{"x", random_tensor(dtype::f32, {2, 3, 5}, 16)}, {"y", random_tensor(dtype::f32, {2, 4, 5}, 17)}});
}

TEST_CASE("ops: gather and scatter_add, out-of-range indices read zero / are dropped") {
  builder b;
  auto table = b.parameter("table", dtype::f32, {6, 4});
  auto idx = b.input("idx", dtype::i32, {3, 3});
  auto upd = b.input("upd", dtype::f32, {3, 3, 4});
  b.output("gather", gather(table, idx));
  b.output("gather_fused", gather(table, idx) * 2.0 + 1.0);
  b.output("scatter", scatter_add(idx, upd, {6, 4}));
  auto ti = b.parameter("ti", dtype::i32, {6});
  b.output("gather_int", gather(ti, idx));
  check(finish(b), {{"idx", tensor::from_ints({3, 3}, {0, 5, 2, -1, 6, 2, 2, 3, 100})}, {"upd", random_tensor(dtype::f32, {3, 3, 4}, 18)}},
        {{"table", random_tensor(dtype::f32, {6, 4}, 19)}, {"ti", tensor::from_ints({6}, {1, 2, 3, 4, 5, 6})}});
}

TEST_CASE("ops: scatter_add over many rows (an embedding's gradient: the row kernel) and onto few rows (the element kernel)") {
  // 200 picks into 4096 rows of 300 (some picks repeat a row, some fall outside), fused with the
  // gather of an embedding as autodiff builds it; and 5000 picks into 3 rows.
  std::vector<int32_t> ids(200);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 2654435761u) % 4100) - 2;
  ids[7] = ids[3];
  ids[150] = ids[3];
  std::vector<int32_t> few(5000);
  for (size_t i = 0; i < few.size(); ++i) few[i] = static_cast<int32_t>(i % 3);
  builder b;
  auto idx = b.input("idx", dtype::i32, {200});
  auto upd = b.input("upd", dtype::f32, {200, 300});
  b.output("rows", scatter_add(idx, upd * 0.5 + 1.0, {4096, 300}));
  auto idx_few = b.input("few", dtype::i32, {5000});
  auto upd_few = b.input("upd_few", dtype::f32, {5000, 2});
  b.output("crowded", scatter_add(idx_few, upd_few, {3, 2}));
  const graph g = finish(b);
  const auto p = gpu::lower(g);
  std::vector<std::string> names;
  for (const auto& k : p.kernels)
    if (k.kind == gpu::kernel_kind::scatter_add) {
      gpu::device_caps caps;
      auto src = gpu::emit(g, p, k, caps);
      REQUIRE(src);
      names.push_back(src->name.substr(0, src->name.find('_')));
    }
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"scat", "scatr"});
  check(g, {{"idx", tensor::from_ints({200}, ids)}, {"upd", random_tensor(dtype::f32, {200, 300}, 21)},
            {"few", tensor::from_ints({5000}, few)}, {"upd_few", random_tensor(dtype::f32, {5000, 2}, 22)}});
}

TEST_CASE("ops: empty tensors and scalars") {
  builder b;
  auto x = b.input("x", dtype::f32, {0, 3});
  auto s = b.input("s", dtype::f32, {});
  b.output("empty", x * 2.0);
  b.output("sum_empty", sum(x, {0}));
  b.output("scalar", s * s + 1.0);
  check(finish(b), {{"x", tensor::zeros(dtype::f32, {0, 3})}, {"s", tensor::scalar(1.5)}});
}

TEST_CASE("ops: parameters stay resident, updates apply together after the run") {
  builder b;
  auto w = b.parameter("w", dtype::f32, {4});
  auto v = b.parameter("v", dtype::f32, {4});
  auto x = b.input("x", dtype::f32, {4});
  b.output("before", w + v);
  b.update(w, v + x);  // reads v before its own update
  b.update(v, w * 2.0);
  const graph g = finish(b);
  for (auto* ex : {&vulkan(), &cpu()}) {
    tensor_map params{{"w", tensor::from_floats({4}, {1, 2, 3, 4})}, {"v", tensor::from_floats({4}, {10, 20, 30, 40})}};
    tensor_map ref_params = params;
    REQUIRE(ex->set_parameters(params));
    auto id = ex->load(g);
    REQUIRE(id);
    const tensor_map in{{"x", tensor::from_floats({4}, {1, 1, 1, 1})}};
    for (int step = 0; step < 3; ++step) {
      auto out = ex->run(*id, in);
      REQUIRE(out);
      auto ref = evaluate(g, in, ref_params);
      REQUIRE(ref);
      ref_params = std::move(ref->params);
      CHECK(normalised_error(out->at("before"), ref->outputs.at("before")) == 0);
    }
    auto got = ex->get_parameters({"w", "v"});
    REQUIRE(got);
    CHECK(normalised_error(got->at("w"), ref_params.at("w")) == 0);
    CHECK(normalised_error(got->at("v"), ref_params.at("v")) == 0);
  }
}

TEST_CASE("ops: an update may read a parameter another update writes (a swap, the previous weights)") {
  // The update copies used to run back to back: one read a buffer another had just written.
  for (int kind = 0; kind < 3; ++kind) {
    builder b;
    auto p = b.parameter("sw.p", dtype::f32, {5});
    auto q = b.parameter("sw.q", dtype::f32, {5});
    auto x = b.input("x", dtype::f32, {5});
    b.output("y", p + q + x);
    if (kind == 0) {  // a swap
      b.update(q, p);
      b.update(p, q);
    } else if (kind == 1) {
      b.update(q, p * 2.0);
      b.update(p, q);
    } else {  // keep the previous weights
      b.update(p, p - x * 0.5);
      b.update(q, p);
    }
    const graph g = finish(b);
    for (auto* ex : {&vulkan(), &cpu()}) {
      INFO("kind " << kind << " on " << ex->info().name);
      tensor_map ref_params{{"sw.p", tensor::from_floats({5}, {1, 2, 3, 4, 5})}, {"sw.q", tensor::from_floats({5}, {10, 20, 30, 40, 50})}};
      REQUIRE(ex->set_parameters(ref_params));
      auto id = ex->load(g);
      REQUIRE(id);
      const tensor_map in{{"x", tensor::from_floats({5}, {1, 1, 1, 1, 1})}};
      for (int step = 0; step < 3; ++step) {
        REQUIRE(ex->run(*id, in));
        auto ref = evaluate(g, in, ref_params);
        REQUIRE(ref);
        ref_params = std::move(ref->params);
      }
      auto got = ex->get_parameters({"sw.p", "sw.q"});
      REQUIRE(got);
      CHECK(normalised_error(got->at("sw.p"), ref_params.at("sw.p")) == 0);
      CHECK(normalised_error(got->at("sw.q"), ref_params.at("sw.q")) == 0);
      ex->unload(*id);
    }
  }
}

TEST_CASE("ops: bad bindings are errors, not crashes") {
  builder b;
  auto x = b.input("x", dtype::f32, {4});
  b.output("y", x + 1.0);
  const graph g = finish(b);
  for (auto* ex : {&vulkan(), &cpu()}) {
    auto id = ex->load(g);
    REQUIRE(id);
    CHECK_FALSE(ex->run(*id, {}).has_value());
    CHECK_FALSE(ex->run(*id, {{"x", tensor::zeros(dtype::f32, {5})}}).has_value());
    CHECK_FALSE(ex->run(*id + 100, {{"x", tensor::zeros(dtype::f32, {4})}}).has_value());
    CHECK_FALSE(ex->get_parameters({"nope"}).has_value());
    graph bad = g;
    bad.nodes[1].inputs = {7};
    CHECK_FALSE(ex->load(bad).has_value());
  }
}

namespace {

/// A Vulkan executor with the options `set` makes (kernel variants, fusion); memory-only kernel
/// cache, so no other test's kernels are reused.
template <class F>
std::unique_ptr<gpu::executor> vulkan_with(F set) {
  vulkan();  // keeps the driver loaded (see harness.hpp)
  gpu::vulkan_options o;
  o.cache_dir = "-";
  set(o);
  auto ex = gpu::make_vulkan_executor(o);
  REQUIRE(ex);
  return std::move(*ex);
}

/// A Vulkan executor whose f32 matmuls take `variant` (kernel_variants::gemm).
std::unique_ptr<gpu::executor> vulkan_with_gemm(const char* variant) {
  return vulkan_with([&](gpu::vulkan_options& o) { o.variants.gemm = variant; });
}

/// A Vulkan executor that runs no rows kernels (vulkan_options::fuse_rows = 0).
std::unique_ptr<gpu::executor> vulkan_unfused() {
  return vulkan_with([](gpu::vulkan_options& o) { o.fuse_rows = 0; });
}

/// relu(x @ w) - 0.25 for one shape on `ex`, against the reference; `w` names the parameter.
void check_relu_matmul(gpu::executor& ex, const mm_case& c, const std::string& w, uint64_t seed) {
  INFO(w << ": m=" << c.m << " k=" << c.k << " n=" << c.n << " batch=" << c.batch);
  shape as{c.m, c.k}, bs{c.k, c.n};
  if (c.batch) {
    as.insert(as.begin(), c.batch);
    bs.insert(bs.begin(), c.batch);
  }
  builder b;
  auto x = b.input("x", dtype::f32, as);
  auto wp = b.parameter(w, dtype::f32, bs);
  b.output("y", relu(matmul(x, wp)) - 0.25);
  check_on(ex, finish(b), {{"x", random_tensor(dtype::f32, as, seed)}}, {{w, random_tensor(dtype::f32, bs, seed + 1)}}, 1e-4);
}

}  // namespace

TEST_CASE("ops: batched matmul against a weight broadcast over the batch, f32 and f16, with epilogues") {
  // The weight is read straight from its buffer with a batch stride of 0 (vec4 loads when n % 4
  // == 0; f16 with k, n multiples of 8 takes the tiled cooperative-matrix kernel on GPUs offering
  // it). n = 37 takes the loader path.
  for (dtype t : {dtype::f32, dtype::f16})
    for (int64_t n : {36, 37, 40}) {
      INFO(to_string(t) << " n=" << n);
      builder b;
      const std::string tag = std::string(to_string(t)) + std::to_string(n);
      auto x = b.input("x", t, {3, 17, 40});
      auto w = b.parameter("bw" + tag, t, {40, n});
      auto bias = b.parameter("bb" + tag, t, {n});
      b.output("plain", matmul(x, w));
      b.output("gelu", nn::gelu(matmul(x, w) + bias));
      b.output("residual", relu(matmul(x, w)) + slice_axis(x, 2, 0, n > 40 ? 40 : n));
      check(finish(b), {{"x", random_tensor(t, {3, 17, 40}, 30)}},
            {{"bw" + tag, random_tensor(t, {40, n}, 31)}, {"bb" + tag, random_tensor(t, {n}, 32)}}, t == dtype::f32 ? 1e-4 : -1);
    }
}

TEST_CASE("ops: bf16 matmuls past f16's range, on bf16 tensor cores where the device has them (mmct rewritten to KHR matrices)") {
  // x up to 1e5 in magnitude (f16's largest is 65504): a device with KHR bf16 cooperative
  // matrices multiplies on bf16 fragments (kernels named "_bf16_"), never rounding to f16; others
  // take the f32 kernels. Ragged tiles, a batched weight, a weight broadcast over a batch of 3, an
  // epilogue with a bf16 bias.
  auto& vk = vulkan();
  for (auto c : {mm_case{2, 130, 64, 136}, mm_case{0, 300, 264, 520}, mm_case{3, 77, 40, 24}}) {
    INFO("m=" << c.m << " k=" << c.k << " n=" << c.n << " batch=" << c.batch);
    shape as{c.m, c.k}, bs{c.k, c.n};
    if (c.batch) as.insert(as.begin(), c.batch);
    if (c.batch == 2) bs.insert(bs.begin(), c.batch);
    builder b;
    const std::string tag = std::to_string(c.batch) + "_" + std::to_string(c.m) + "_" + std::to_string(c.k);
    auto x = b.input("x", dtype::bf16, as);
    auto w = b.parameter("wbf" + tag, dtype::bf16, bs);
    auto bias = b.parameter("bbf" + tag, dtype::bf16, {c.n});
    b.output("plain", matmul(x, w));
    b.output("epilogue", relu(matmul(x, w) + bias));
    check(finish(b), {{"x", random_tensor(dtype::bf16, as, 40, -1e5, 1e5)}},
          {{"wbf" + tag, random_tensor(dtype::bf16, bs, 41, -2, 2)}, {"bbf" + tag, random_tensor(dtype::bf16, {c.n}, 42, -1e6, 1e6)}});
    int rewritten = 0;
    for (const auto& ks : vk.stats().kernels) rewritten += ks.name.find("_bf16_") != std::string::npos;
    CHECK((rewritten > 0) == vk.info().coopmat_bf16);
  }
}

TEST_CASE("ops: matmuls under every tile rasterisation (kernel_variants::gemm_swizzle = 0, 1, 3, 8) match the reference") {
  // 64-wide tiles: 1000 rows are 16 tile rows (3 leaves a ragged last group), 455 rows 8, one
  // tile column, batches (per batch index), and 128-wide tiles (32 x 2 x 2 of them).
  for (uint32_t sw : {0u, 1u, 3u, 8u}) {
    auto ex = vulkan_with([&](gpu::vulkan_options& o) { o.variants.gemm_swizzle = sw; });
    for (auto c : {mm_case{0, 1000, 33, 200}, mm_case{3, 455, 7, 300}, mm_case{0, 200, 5, 60}, mm_case{32, 129, 4, 132}})
      check_relu_matmul(*ex, c, "sw" + std::to_string(sw) + "_" + std::to_string(c.m) + "_" + std::to_string(c.k), 24);
  }
}

TEST_CASE("ops: the other matmul variants (kernel_variants::gemm = warp16, wide, narrow, classic) match the reference") {
  for (const char* variant : {"warp16", "wide", "narrow", "classic"}) {
    auto ex = vulkan_with_gemm(variant);
    for (auto c : {mm_case{0, 3, 5, 8}, mm_case{0, 127, 33, 65}, mm_case{32, 129, 4, 132}, mm_case{32, 129, 3, 129}})
      check_relu_matmul(*ex, c, std::string("var") + variant + std::to_string(c.m) + "_" + std::to_string(c.k), 22);
  }
}

TEST_CASE("ops: rows kernels (softmax, log-softmax, layer norm, shared row results) match the reference, fused or not") {
  auto unfused = vulkan_unfused();
  // Rows shorter than, near and longer than a workgroup (64-256 threads); leading axes; f16.
  // vulkan() fuses rows of every length (lavapipe's default starts at 256).
  for (int64_t len : {3, 64, 300, 1000}) {
    INFO("row length " << len);
    const std::string tag = std::to_string(len);
    builder b;
    auto x = b.input("x", dtype::f32, {2, 3, len});
    auto h = b.input("h", dtype::f16, {5, len});
    auto gamma = b.parameter("rg" + tag, dtype::f32, {len});
    auto beta = b.parameter("rb" + tag, dtype::f32, {len});
    b.output("softmax", nn::softmax(x));
    b.output("log_softmax", nn::log_softmax(x * 3.0));
    b.output("layer_norm", nn::layer_norm(x, gamma, beta));
    b.output("softmax_f16", nn::softmax(h));
    auto m = max_over(x, {2}, true);
    b.output("row_max", m);                                  // a member's result is also an output
    b.output("centred_by_max", exp(x - m) * sum(x, {2}, true));  // two reductions, one row pass
    const graph g = finish(b);
    INFO(gpu::describe(g, gpu::lower(g)));
    CHECK(gpu::describe(g, gpu::lower(g)).find("rows[") != std::string::npos);
    const tensor_map inputs{{"x", random_tensor(dtype::f32, {2, 3, len}, 40)}, {"h", random_tensor(dtype::f16, {5, len}, 41)}};
    const tensor_map params{{"rg" + tag, random_tensor(dtype::f32, {len}, 42)}, {"rb" + tag, random_tensor(dtype::f32, {len}, 43)}};
    check(g, inputs, params);  // each output at its dtype's tolerance (softmax_f16 is f16)
    check_on(*unfused, g, inputs, params);
  }
}

TEST_CASE("ops: a row result read at another row's index is not fused into a rows kernel") {
  // y[r, c] = x[r, c] * s[c] with s the row sums: the elementwise kernel reads other rows' sums,
  // which other workgroups compute, so it must stay a kernel of its own.
  builder b;
  auto x = b.input("x", dtype::f32, {6, 6});
  auto s = sum(x, {1}, true);  // [6, 1]
  b.output("y", x * reshape(s, {1, 6}));
  b.output("z", x * transpose(s));
  const graph g = finish(b);
  const auto p = gpu::lower(g);
  INFO(gpu::describe(g, p));
  for (const auto& k : p.kernels) CHECK(k.kind != gpu::kernel_kind::rows);
  check(g, {{"x", random_tensor(dtype::f32, {6, 6}, 44)}}, {}, 1e-5);
}

TEST_CASE("ops: column-major matmul operands (x^T, w^T through index arithmetic) are fetched along their contiguous axis") {
  // A = x^T walks m, B = w^T walks k (the layout the gradients of x @ w read); ragged tiles,
  // 64- and 128-wide tiles, a batch with a weight broadcast over it, and both at once.
  builder b;
  auto x = b.input("x", dtype::f32, {37, 300});
  auto y = b.input("y", dtype::f32, {37, 130});
  auto w = b.parameter("cw", dtype::f32, {515, 300});
  auto big = b.input("big", dtype::f32, {300, 1030});
  auto xb = b.input("xb", dtype::f32, {3, 40, 65});
  auto wb = b.parameter("cwb", dtype::f32, {70, 65});
  b.output("xt_y", matmul(transpose(x), y));                                  // [300, 37] x [37, 130]
  b.output("a_wt", relu(matmul(transpose(big), transpose(w))) + 1.0);        // [1030, 300] x [300, 515]
  b.output("batched_wt", matmul(xb, permute(broadcast_to(wb, {3, 70, 65}), {0, 2, 1})));  // [3, 40, 65] x [3, 65, 70]
  const graph g = finish(b);
  const tensor_map inputs{{"x", random_tensor(dtype::f32, {37, 300}, 50)},
                          {"y", random_tensor(dtype::f32, {37, 130}, 51)},
                          {"big", random_tensor(dtype::f32, {300, 1030}, 52)},
                          {"xb", random_tensor(dtype::f32, {3, 40, 65}, 53)}};
  const tensor_map params{{"cw", random_tensor(dtype::f32, {515, 300}, 54)}, {"cwb", random_tensor(dtype::f32, {70, 65}, 55)}};
  check(g, inputs, params, 1e-4);
  std::string names;
  for (const auto& k : vulkan().stats().kernels) names += k.name + " ";
  INFO(names);
  CHECK(names.find("am_") != std::string::npos);    // A walked along m
  CHECK(names.find("ambk_") != std::string::npos);  // both
  CHECK(names.find("bk_") != std::string::npos);
}

TEST_CASE("ops: i32 arithmetic and compares stay exact past 2^24 on every back end") {
  builder b;
  auto k1 = b.input("k1", dtype::i32, {4});
  auto k2 = b.input("k2", dtype::i32, {4});
  b.output("eq", compare(k1 + 1, k2, compare_kind::eq));
  b.output("sum", k1 + k2);
  b.output("diff", (k1 + 1) - k2);
  b.output("max", maximum(k1 + 1, k2));
  check(finish(b), {{"k1", tensor::from_ints({4}, {16777216, 16777215, -16777217, 1000000001})},
                    {"k2", tensor::from_ints({4}, {16777216, 16777216, -16777216, 1000000002})}});
}

TEST_CASE("ops: an i32 result of a row reduction is not passed between rows-kernel members as a float") {
  // cast(sum(x), i32) + 1 is 16777217 here: a float could not hold it, and k = 16777216 compares
  // equal to it only if it was rounded on the way.
  builder b;
  auto x = b.input("x", dtype::f32, {4, 8});
  auto k = b.input("k", dtype::i32, {4, 8});
  auto r = cast(sum(x, {1}, true), dtype::i32) + 1;
  b.output("r", r);
  b.output("z", select(compare(broadcast_to(r, {4, 8}), k, compare_kind::eq), x, x * 2.0));
  b.output("w", r + k);
  const graph g = finish(b);
  INFO(gpu::describe(g, gpu::lower(g)));
  for (const auto& kn : gpu::lower(g).kernels) CHECK(kn.kind != gpu::kernel_kind::rows);
  check(g, {{"x", random_tensor(dtype::f32, {4, 8}, 70, 2097152, 2097152)},
            {"k", tensor::from_ints({4, 8}, std::vector<int32_t>(32, 16777216))}});
}

TEST_CASE("ops: a max over a row holding NaN is NaN, fused or not, one pass or split") {
  // Workgroup reductions combine lanes with subgroupMax, whose NaN handling is undefined: the
  // kernels carry NaN past it, as the reference does.
  auto unfused = vulkan_unfused();
  builder b;
  auto x = b.input("x", dtype::f32, {3, 300});
  auto flat = b.input("flat", dtype::f32, {5000});
  b.output("row_max", max_over(x, {1}, true));
  b.output("softmax", nn::softmax(x));
  b.output("all_max", max_over(flat, {0}));  // split into two passes
  const graph g = finish(b);
  tensor xv = random_tensor(dtype::f32, {3, 300}, 80);
  xv.set(1 * 300 + 17, std::nan(""));  // row 1 only
  tensor fv = random_tensor(dtype::f32, {5000}, 81);
  fv.set(4321, std::nan(""));
  const tensor_map inputs{{"x", xv}, {"flat", fv}};
  check(g, inputs, {}, 1e-5);
  check_on(*unfused, g, inputs, {}, 1e-5);
}

TEST_CASE("ops: i32 arithmetic wraps, a float cast to i32 saturates, alike on every back end (bit for bit)") {
  const int32_t big = 2147483647, low = -2147483647 - 1;
  builder b;
  auto a = b.input("a", dtype::i32, {6});
  auto c = b.input("c", dtype::i32, {6});
  auto f = b.input("f", dtype::f32, {6});
  b.output("add", a + c);
  b.output("sub", a - c);
  b.output("mul", a * c);
  b.output("div", a / c);
  b.output("neg", -a);
  b.output("abs", abs(a));
  b.output("sum", sum(a, {0}));
  b.output("cast", cast(f, dtype::i32));
  b.output("empty_max", max_over(slice_axis(a, 0, 0, 0), {0}));  // the identity of max: INT_MIN
  const graph g = finish(b);
  const tensor_map inputs{{"a", tensor::from_ints({6}, {big, big, 65536, low, low, 7})},
                          {"c", tensor::from_ints({6}, {1, big, 65536, -1, 1, 0})},
                          {"f", tensor::from_values(dtype::f32, {6}, {std::numeric_limits<double>::infinity(), 3e9,
                                                                     -3e9, std::nan(""), -7.9, 2147483648.0})}};
  const auto ref = reference_run(g, inputs, {});
  // Wrapped: INT_MAX + 1 = INT_MIN, 2^16 * 2^16 = 0, INT_MIN / -1 = INT_MIN; saturated casts.
  CHECK(ref.outputs.at("add").at(0) == low);
  CHECK(ref.outputs.at("mul").at(2) == 0);
  CHECK(ref.outputs.at("div").at(3) == low);
  CHECK(ref.outputs.at("div").at(5) == 0);
  CHECK(ref.outputs.at("cast").at(0) == big);
  CHECK(ref.outputs.at("cast").at(2) == low);
  CHECK(ref.outputs.at("cast").at(3) == 0);
  CHECK(ref.outputs.at("cast").at(4) == -7);
  CHECK(ref.outputs.at("empty_max").at(0) == low);
  for (gpu::executor* ex : {&vulkan(), &cpu()}) {
    INFO(ex->info().name);
    const tensor_map got = run_on(*ex, g, inputs);
    for (const auto& [name, t] : ref.outputs) {
      INFO(name);
      CHECK(got.at(name).bytes == t.bytes);
    }
  }
}

TEST_CASE("ops: i32 sums wrap exactly past 2^53 on every back end, scatter_adds on the CPU executor") {
  // 2^23 * INT_MAX = 2^54 - 2^23: a double accumulator passes 2^53 and rounds (-4194304); the
  // exact sum modulo 2^32, which the GLSL kernels' int adds give, is -2^23.
  const int64_t n = int64_t{1} << 23;
  builder b;
  auto a = b.input("a", dtype::i32, {n});
  auto idx = b.input("idx", dtype::i32, {n});
  b.output("sum", sum(a, {0}));
  b.output("sa", scatter_add(idx, a, {1}));
  const graph g = finish(b);
  const tensor_map inputs{{"a", tensor::from_ints({n}, std::vector<int32_t>(static_cast<size_t>(n), 2147483647))},
                          {"idx", tensor::zeros(dtype::i32, {n})}};
  const auto ref = reference_run(g, inputs, {});
  CHECK(ref.outputs.at("sum").at(0) == -8388608);
  CHECK(ref.outputs.at("sa").at(0) == -8388608);
  for (gpu::executor* ex : {&cpu(), &vulkan()}) {
    INFO(ex->info().name);
    const tensor_map got = run_on(*ex, g, inputs);
    CHECK(got.at("sum").at(0) == -8388608);
    CHECK(got.at("sum").bytes == ref.outputs.at("sum").bytes);
    // The scatter kernel loops over all picks in one invocation, and llvmpipe stops any loop
    // after 65535 turns: on lavapipe "sa" comes out as 65535 picks' sum, whatever their type.
    // Only the CPU executor is checked for it here.
    if (ex == &cpu()) {
      CHECK(got.at("sa").at(0) == -8388608);
      CHECK(got.at("sa").bytes == ref.outputs.at("sa").bytes);
    }
  }
}

TEST_CASE("ops: pow's edge cases (zeros, infinities, NaN, negative bases) and NaN in max/min match the reference element by element") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<double> as{0.0, -0.0, 0.0, -0.0, 0.0, 1.0, -1.0, -1.0, 0.5, 2.0, inf, -inf, -inf, -inf, -8.0, -8.0, nan, 3.0, -2.0, 0.0};
  const std::vector<double> bs{-1.0, -1.0, -0.5, -3.0, 3.0, nan, inf, -inf, -inf, -inf, -2.0, -3.0, 3.0, 2.0, 3.0, 0.5, 0.0, nan, 5.0, 0.0};
  const auto n = static_cast<int64_t>(as.size());
  builder b;
  auto a = b.input("a", dtype::f32, {n});
  auto c = b.input("c", dtype::f32, {n});
  b.output("pow", pow(a, c));
  b.output("max", maximum(a, c));
  b.output("min", minimum(a, c));
  b.output("max_rev", maximum(c, a));
  const graph g = finish(b);
  const tensor_map inputs{{"a", tensor::from_values(dtype::f32, {n}, as)}, {"c", tensor::from_values(dtype::f32, {n}, bs)}};
  const auto ref = reference_run(g, inputs, {});
  CHECK(ref.outputs.at("pow").at(0) == inf);   // pow(0, -1)
  CHECK(ref.outputs.at("pow").at(1) == -inf);  // pow(-0, -1)
  CHECK(ref.outputs.at("pow").at(5) == 1.0);   // pow(1, NaN)
  CHECK(std::isnan(ref.outputs.at("max").at(5)));
  CHECK(std::isnan(ref.outputs.at("max_rev").at(5)));
  for (gpu::executor* ex : {&vulkan(), &cpu()}) {
    const tensor_map got = run_on(*ex, g, inputs);
    for (const auto& [name, want] : ref.outputs)
      for (int64_t i = 0; i < n; ++i) {
        INFO(ex->info().name << " " << name << "(" << as[i] << ", " << bs[i] << ")");
        const double x = got.at(name).at(i), y = want.at(i);
        if (std::isnan(y)) CHECK(std::isnan(x));
        else if (std::isinf(y) || y == 0) CHECK((x == y && std::signbit(x) == std::signbit(y)));
        else CHECK(std::abs(x - y) <= 1e-6 * std::abs(y));
      }
  }
}

TEST_CASE("ops: gather from a table of zero rows reads zeros") {
  builder b;
  auto table = b.input("t", dtype::f32, {0, 4});
  auto idx = b.input("i", dtype::i32, {3});
  b.output("g", gather(table, idx) + 1.0);
  check(finish(b), {{"t", tensor::zeros(dtype::f32, {0, 4})}, {"i", tensor::from_ints({3}, {0, -1, 2})}});
}

TEST_CASE("ops: tanh keeps its relative accuracy near zero (vec4 and scalar kernels)") {
  // exp(-2|x|) based tanh cancels near 0: x = 1e-6 once came out 3% off on Vulkan.
  const std::vector<double> xs{1e-30, 1e-6, -3e-5, 1e-3, 0.01, -0.1, 0.12, -0.124, 0.126, 0.2, 0.5, -1.0, 3.0, 9.0, 20.0, -40.0};
  for (size_t n : {xs.size(), xs.size() - 1}) {  // 16: vec4 kernel, 15: scalar kernel
    const auto len = static_cast<int64_t>(n);
    builder b;
    auto x = b.input("x", dtype::f32, {len});
    b.output("t", tanh(x));
    const graph g = finish(b);
    const tensor_map inputs{{"x", tensor::from_values(dtype::f32, {len}, std::vector<double>(xs.begin(), xs.begin() + len))}};
    for (gpu::executor* ex : {&vulkan(), &cpu()}) {
      const tensor t = run_on(*ex, g, inputs).at("t");
      for (int64_t i = 0; i < len; ++i) {
        const double want = std::tanh(static_cast<double>(static_cast<float>(xs[i])));
        INFO(ex->info().name << " n=" << n << " tanh(" << xs[i] << ") = " << t.at(i) << ", want " << want);
        CHECK(std::abs(t.at(i) - want) <= 4e-6 * std::abs(want));
      }
    }
  }
}

TEST_CASE("ops: loops of more than 65535 iterations per thread run to the end (lavapipe caps each loop there)") {
  // llvmpipe stops any shader loop after 65535 iterations (gallivm's loop limiter), silently:
  // a scatter_add over 100000 picks summed the first 65535. Kernels whose one thread may loop
  // longer split the loop. Checked with the executor as a node makes it (one-pass reductions on
  // CPU devices) and as the other tests make it (split reductions).
  const int64_t n = 100000;
  builder b;
  auto idx = b.input("idx", dtype::i32, {n});
  auto upd = b.input("upd", dtype::f32, {n, 2});
  auto tall = b.input("tall", dtype::f32, {n, 3});
  b.output("scatter", scatter_add(idx, upd, {4, 2}));
  b.output("columns", sum(tall, {0}));
  b.output("max", max_over(tall, {0}));
  auto wide = b.input("wide", dtype::f32, {64, 4096});
  auto deep = b.input("deep", dtype::f32, {4096, 64});
  b.output("matmul", matmul(wide, deep));  // a long k loop, not unrolled on CPU devices
  b.output("rowsum", sum(b.input("long", dtype::f32, {1, 17 << 20}), {1}));  // 17.8M: > 65535 per thread of 256
  const graph g = finish(b);
  std::vector<int32_t> picks(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) picks[static_cast<size_t>(i)] = static_cast<int32_t>(i % 4);
  tensor ones = tensor::zeros(dtype::f32, {n, 2});
  for (int64_t i = 0; i < ones.size(); ++i) ones.set(i, 1.0);
  tensor t = tensor::zeros(dtype::f32, {n, 3});
  for (int64_t i = 0; i < t.size(); ++i) t.set(i, i == t.size() - 1 ? 7.0 : 0.5);  // the max is the last row
  tensor_map in{{"idx", tensor::from_ints({n}, picks)}, {"upd", ones}, {"tall", t}};
  in["wide"] = random_tensor(dtype::f32, {64, 4096}, 11);
  in["deep"] = random_tensor(dtype::f32, {4096, 64}, 12);
  in["long"] = random_tensor(dtype::f32, {1, 17 << 20}, 13);
  vulkan();  // first: destroying the last Vulkan instance unloads the driver (harness.hpp says why)
  gpu::vulkan_options node_like;
  node_like.cache_dir = "-";
  auto as_node = gpu::make_vulkan_executor(node_like);
  REQUIRE(as_node);
  const reference ref = reference_run(g, in, {});  // once: it is most of this test's time
  for (gpu::executor* ex : {as_node->get(), &vulkan(), &cpu()}) {
    const auto out = check_on(*ex, g, in, {}, ref, 1e-5);
    CHECK(out.at("scatter").at(0) == 25000);  // exact: sums of ones
  }
  // Beyond what a kernel can split: refused with a reason on lavapipe, not answered short.
  if (vulkan().info().kind == "cpu") {
    builder deep;
    auto a = deep.input("a", dtype::f32, {1, 600000});
    auto c = deep.input("c", dtype::f32, {600000, 1});
    deep.output("y", matmul(a, c));
    auto id = vulkan().load(finish(deep));
    REQUIRE_FALSE(id);
    CHECK(id.error().code == error_code::unsupported);
    CHECK(id.error().message.find("65535") != std::string::npos);
  }
}
