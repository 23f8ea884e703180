// The fused attention op (op_kind::attention) on every back end: the reference evaluator's
// result is first checked against the same attention composed of matmul, select and softmax
// (independent code: the evaluator's general ops), then the CPU executor and Vulkan (lavapipe in
// CI, validation layer on) against the reference. Shapes cover grouped-query heads, several
// tiles of keys, a sliding window, a row that sees no key, a batch read through a gather, and
// head sizes that divide the workgroup (64), do not (80) and exceed it (160), and slices of
// several tiles of keys.
#include "harness.hpp"

#include <cmath>

#include "graph/autodiff.hpp"
#include "graph/nn.hpp"
#include "gpu/plan.hpp"

using namespace mesh;
using namespace mesh::gpu;
using namespace mesh::gpu::test;

namespace {

struct attention_case {
  int64_t batch = 0;  ///< 0: no batch dims
  int64_t l = 1, h = 4, kv = 2, d = 64, t = 8, window = 0;
  std::vector<int32_t> pos;  ///< batch * l positions
  dtype cache = dtype::f32;
  int64_t offset = 0;  ///< k and v are rows [offset, offset + t) of larger inputs (read through a slice)
};

/// The composed form: scores q k^T / sqrt(d), keys past pos (or outside the window) at -inf
/// (written -1e30), softmax, times v; a row that sees no key is zeroed as the op defines.
expr composed(builder& b, const expr& q, const expr& k, const expr& v, const expr& pos, const attention_case& c) {
  const int64_t group = c.h / c.kv, bt = std::max<int64_t>(c.batch, 1);
  const expr q4 = reshape(q, {bt, c.l, c.h, c.d}), k4 = reshape(cast(k, dtype::f32), {bt, c.t, c.kv, c.d}),
             v4 = reshape(cast(v, dtype::f32), {bt, c.t, c.kv, c.d});
  // Each query head against its key/value head: [b, h, l, d] x [b, h, d, t].
  auto per_head = [&](const expr& x) {  // [b, t, kv, d] -> [b, h, t, d]
    const expr rep = broadcast_to(reshape(x, {bt, c.t, c.kv, 1, c.d}), {bt, c.t, c.kv, group, c.d});
    return permute(reshape(rep, {bt, c.t, c.h, c.d}), {0, 2, 1, 3});
  };
  const expr qh = permute(q4, {0, 2, 1, 3});
  const expr scores = matmul(qh, transpose(per_head(k4))) * (1.0 / std::sqrt(static_cast<double>(c.d)));  // [b, h, l, t]
  const expr ts = reshape(nn::iota(b, c.t), {1, 1, 1, c.t});
  const expr p = reshape(pos, {bt, 1, c.l, 1});
  expr visible = compare(ts, p, compare_kind::le);
  if (c.window > 0) visible = visible * compare(ts, p - static_cast<double>(c.window), compare_kind::gt);
  const expr probs = nn::softmax(select(visible, scores, -1e30), -1);
  const expr seen = cast(compare(sum(cast(visible, dtype::f32), {3}, true), 0.0, compare_kind::gt), dtype::f32);  // [b, 1, l, 1]
  const expr out = permute(matmul(probs, per_head(v4)) * broadcast_to(seen, {bt, c.h, c.l, 1}), {0, 2, 1, 3});  // [b, l, h, d]
  return c.batch ? out : reshape(out, {c.l, c.h, c.d});
}

/// `on`: the Vulkan executor to check (default: harness.hpp's).
void check_attention(const attention_case& c, uint64_t seed, executor* on = nullptr) {
  INFO("batch " << c.batch << " l " << c.l << " h " << c.h << " kv " << c.kv << " d " << c.d << " t " << c.t << " window " << c.window
                << " cache " << to_string(c.cache));
  builder b;
  const shape lead = c.batch ? shape{c.batch} : shape{};
  auto with = [&](shape tail) {
    shape s = lead;
    s.insert(s.end(), tail.begin(), tail.end());
    return s;
  };
  auto q = b.input("q", dtype::f32, with({c.l, c.h, c.d}));
  auto k = b.input("k", c.cache, with({c.t + c.offset, c.kv, c.d}));
  auto v = b.input("v", c.cache, with({c.t + c.offset, c.kv, c.d}));
  if (c.offset) {
    k = slice_axis(k, c.batch ? 1 : 0, c.offset, c.offset + c.t);
    v = slice_axis(v, c.batch ? 1 : 0, c.offset, c.offset + c.t);
  }
  auto pos = b.input("pos", dtype::i32, with({c.l}));
  b.output("fused", attention(q, k, v, pos, c.window));
  b.output("composed", composed(b, q, k, v, pos, c));
  const graph g = finish(b);
  tensor p = tensor::zeros(dtype::i32, with({c.l}));
  for (size_t i = 0; i < c.pos.size(); ++i) p.set(static_cast<int64_t>(i), c.pos[i]);
  // Scores up to about +-8: softmax weights far from uniform.
  const tensor_map inputs{{"q", random_tensor(dtype::f32, with({c.l, c.h, c.d}), seed, -1.5, 1.5)},
                          {"k", random_tensor(c.cache, with({c.t + c.offset, c.kv, c.d}), seed + 1, -1.5, 1.5)},
                          {"v", random_tensor(c.cache, with({c.t + c.offset, c.kv, c.d}), seed + 2)},
                          {"pos", p}};
  const reference ref = reference_run(g, inputs, {});
  // The composed form rounds every intermediate to f32 in the reference; the op rounds once.
  CHECK(normalised_error(ref.outputs.at("fused"), ref.outputs.at("composed")) <= 1e-6);
  check_on(cpu(), g, inputs, {}, ref, 1e-5);
  // On a device with cooperative matrices a prompt's attention runs on tensor cores (`attnc`:
  // q, k, v and the softmax weights rounded to f16), within f16 rounding; elsewhere in f32.
  executor& vk = on ? *on : vulkan();
  const bool halves = vk.info().coopmat && c.l >= attention_tiled_min_rows && c.d % 16 == 0 && c.t > 0;
  check_on(vk, g, inputs, {}, ref, halves ? tolerance_for(dtype::f16) : 1e-5);
  auto ran = [&](const char* prefix) {
    for (const auto& kt : vk.stats().kernels)
      if (kt.name.rfind(prefix, 0) == 0) return true;
    return false;
  };
  if (halves) CHECK(ran("attnc"));
  // Decode rows: pass 1 takes every query head of a key/value head at once (`attn1g`) for groups
  // of up to 16 heads whose tiles fit the device's shared memory (d = 64 everywhere).
  if (c.l < attention_tiled_min_rows && c.t > 0 && c.d <= 64) CHECK(ran("attn1g") == (c.h / c.kv <= 16));
}

}  // namespace

TEST_CASE("attention: one sequence against a cache, grouped-query heads, every back end") {
  check_attention({.l = 1, .h = 4, .kv = 2, .d = 64, .t = 8, .pos = {5}}, 1);            // a decode step
  bool parts4 = false;  // 4 parts of 64 threads, where they fit (lavapipe's 32 KiB: d = 64 does)
  for (const auto& kt : vulkan().stats().kernels) parts4 = parts4 || kt.name.rfind("attn1g2p4_", 0) == 0;
  CHECK(parts4);
  check_attention({.l = 3, .h = 6, .kv = 2, .d = 64, .t = 300, .pos = {297, 298, 299}}, 2);  // three tiles of keys
  check_attention({.l = 2, .h = 2, .kv = 2, .d = 80, .t = 20, .pos = {0, 19}}, 3);        // d does not divide 128
  check_attention({.l = 1, .h = 4, .kv = 1, .d = 160, .t = 9, .pos = {8}}, 4);            // d over 128
  check_attention({.l = 2, .h = 24, .kv = 1, .d = 16, .t = 70, .pos = {40, 69}}, 8);      // 24 heads a group: a workgroup each
  check_attention({.l = 2, .h = 4, .kv = 4, .d = 32, .t = 200, .window = 64, .pos = {150, 199}}, 5);  // sliding window
  check_attention({.l = 2, .h = 2, .kv = 1, .d = 64, .t = 16, .pos = {-1, 3}, .cache = dtype::f16}, 6);  // row 0 sees no key
  // 128 rows x heads of d = 64: the partials of one slice per 64 keys would pass
  // attention_partials_max, so each slice takes several tiles (31 slices of up to 2 here), with
  // the running maximum carried across them; a window inside the long range.
  {
    attention_case c{.l = 16, .h = 8, .kv = 2, .d = 64, .t = 2500, .pos = {}};
    for (int32_t i = 0; i < 16; ++i) c.pos.push_back(2484 + i);
    check_attention(c, 12);
    c.l = 4;
    c.h = 32;
    c.window = 1200;
    c.pos = {2499, 1700, 1000, 100};
    check_attention(c, 13);
  }
}

TEST_CASE("attention: the grouped decode pass in one part of 64 threads (attn1g, parts1)") {
  vulkan();  // keeps the driver loaded while this test's executor comes and goes
  vulkan_options o;
  o.validation = true;
  o.cache_dir = "-";
  o.variants.attention = "parts1";  // the default takes 4 parts where they fit
  auto vk = make_vulkan_executor(o);
  if (!vk) FAIL("no Vulkan executor with validation: " << vk.error().to_string());
  check_attention({.l = 1, .h = 4, .kv = 2, .d = 64, .t = 8, .pos = {5}}, 31, vk->get());
  check_attention({.l = 3, .h = 6, .kv = 2, .d = 64, .t = 300, .pos = {297, 298, 299}}, 32, vk->get());
  check_attention({.l = 2, .h = 2, .kv = 2, .d = 80, .t = 20, .pos = {0, 19}}, 33, vk->get());  // two column passes
  check_attention({.l = 2, .h = 4, .kv = 4, .d = 32, .t = 200, .window = 64, .pos = {150, 199}}, 34, vk->get());
  check_attention({.l = 2, .h = 2, .kv = 1, .d = 64, .t = 16, .pos = {-1, 3}, .cache = dtype::f16}, 35, vk->get());
  bool one_part = false;  // the last case's pass 1 (2 heads a group)
  for (const auto& kt : (*vk)->stats().kernels) one_part = one_part || kt.name.rfind("attn1g2_", 0) == 0;
  CHECK(one_part);
  CHECK((*vk)->stats().validation_errors == 0);
}

TEST_CASE("attention: prompt-sized query rows take one kernel, on every back end") {
  // At least gpu::attention_tiled_min_rows (17) rows: `attnt`, tiles of query rows against
  // tiles of keys. A prompt after 20 cached positions; rows past the last tile's end; a head
  // size that 4 does not divide; a sliding window; positions out of order with a padding row
  // (-1: sees nothing); d = 128 with an f16 cache; a batch; k and v at an offset into their
  // inputs.
  {
    attention_case c{.l = 40, .h = 4, .kv = 2, .d = 64, .t = 60, .pos = {}};
    for (int32_t i = 0; i < 40; ++i) c.pos.push_back(20 + i);
    check_attention(c, 21);
  }
  {
    attention_case c{.l = 100, .h = 2, .kv = 1, .d = 42, .t = 100, .window = 30, .pos = {}};
    for (int32_t i = 0; i < 100; ++i) c.pos.push_back(i);
    check_attention(c, 22);
  }
  {
    attention_case c{.l = 70, .h = 3, .kv = 3, .d = 128, .t = 90, .pos = {}, .cache = dtype::f16};
    for (int32_t i = 0; i < 70; ++i) c.pos.push_back(i == 33 ? -1 : (i * 37) % 90);
    check_attention(c, 23);
  }
  check_attention({.batch = 2, .l = 20, .h = 4, .kv = 2, .d = 64, .t = 50,
                   .pos = {30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49,
                           0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}},
                  24);
  {
    // k and v read through slices at an offset (on tensor cores: element by element, not four
    // values a load); 150 keys: three tiles of 64, the last partial.
    attention_case c{.l = 90, .h = 4, .kv = 2, .d = 32, .t = 150, .pos = {}, .cache = dtype::f16, .offset = 7};
    for (int32_t i = 0; i < 90; ++i) c.pos.push_back(60 + i);
    check_attention(c, 25);
  }
  // The plan: one kernel for the prompt, two passes for a decode step.
  builder b;
  auto k = b.input("k", dtype::f32, {32, 2, 64});
  auto v = b.input("v", dtype::f32, {32, 2, 64});
  b.output("prompt", attention(b.input("qp", dtype::f32, {17, 4, 64}), k, v, b.input("pp", dtype::i32, {17})));
  b.output("decode", attention(b.input("qd", dtype::f32, {16, 4, 64}), k, v, b.input("pd", dtype::i32, {16})));
  const graph g = finish(b);
  const plan p = lower(g);
  std::vector<int> passes;
  for (const auto& kn : p.kernels)
    if (kn.kind == kernel_kind::attention) passes.push_back(kn.pass);
  CHECK(passes == std::vector<int>{0, 1, 2});
}

TEST_CASE("attention: an empty cache gives zeros on every back end") {
  for (const int64_t l : {2, 20}) {
  builder b;
  auto q = b.input("q", dtype::f32, {l, 4, 8});
  auto k = b.input("k", dtype::f32, {0, 2, 8});
  auto pos = b.input("pos", dtype::i32, {l});
  b.output("y", attention(q, k, b.input("v", dtype::f32, {0, 2, 8}), pos));
  const graph g = finish(b);
  tensor p = tensor::zeros(dtype::i32, {l});
  p.set(1, 5);
  const tensor_map inputs{{"q", random_tensor(dtype::f32, {l, 4, 8}, 11)}, {"k", tensor::zeros(dtype::f32, {0, 2, 8})},
                          {"v", tensor::zeros(dtype::f32, {0, 2, 8})}, {"pos", p}};
  for (executor* ex : {&cpu(), &vulkan()}) {
    const tensor_map out = run_on(*ex, g, inputs);
    INFO(ex->info().name << " rows " << l);
    REQUIRE(out.at("y").dims == (shape{l, 4, 8}));
    bool zeros = true;
    for (int64_t i = 0; i < out.at("y").size(); ++i) zeros = zeros && out.at("y").at(i) == 0.0;
    CHECK(zeros);
  }
  }
}

TEST_CASE("attention: a batch of sequences, each reading its own rows of a cache through a gather") {
  check_attention({.batch = 3, .l = 1, .h = 4, .kv = 2, .d = 64, .t = 40, .pos = {39, 0, 17}}, 7);
  // The batched decode step of the models: q [n, 1, h, d], keys gathered from a [slots * context,
  // kv * d] cache by row index, positions [n, 1].
  const int64_t n = 2, context = 24, attended = 16, kvh = 2, d = 64, h = 4;
  builder b;
  auto q = b.input("q", dtype::f32, {n, 1, h, d});
  auto cache_k = b.input("ck", dtype::f32, {3 * context, kvh * d});
  auto cache_v = b.input("cv", dtype::f32, {3 * context, kvh * d});
  auto pos = b.input("pos", dtype::i32, {n, 1});
  const expr rows = reshape(nn::iota(b, n) * static_cast<double>(context), {n, 1}) + reshape(nn::iota(b, attended), {1, attended});
  auto view = [&](const expr& c) { return reshape(gather(c, rows), {n, attended, kvh, d}); };
  b.output("y", attention(q, view(cache_k), view(cache_v), pos));
  const graph g = finish(b);
  tensor p = tensor::zeros(dtype::i32, {n, 1});
  p.set(0, 15);
  p.set(1, 4);
  check(g, {{"q", random_tensor(dtype::f32, {n, 1, h, d}, 8)}, {"ck", random_tensor(dtype::f32, {3 * context, kvh * d}, 9)},
            {"cv", random_tensor(dtype::f32, {3 * context, kvh * d}, 10)}, {"pos", p}},
        {}, 1e-5);
}

TEST_CASE("attention: shapes and dtypes are checked with errors that name them, and autodiff refuses it") {
  auto error_of = [](auto make) {
    builder b;
    make(b);
    auto g = b.finish();
    REQUIRE_FALSE(g.has_value());
    return g.error().to_string();
  };
  const std::string heads = error_of([](builder& b) {
    b.output("y", attention(b.input("q", dtype::f32, {1, 3, 8}), b.input("k", dtype::f32, {4, 2, 8}), b.input("v", dtype::f32, {4, 2, 8}),
                            b.input("p", dtype::i32, {1})));
  });
  CHECK(heads.find("multiple of the key/value heads") != std::string::npos);
  const std::string pos = error_of([](builder& b) {
    b.output("y", attention(b.input("q", dtype::f32, {2, 2, 8}), b.input("k", dtype::f32, {4, 2, 8}), b.input("v", dtype::f32, {4, 2, 8}),
                            b.input("p", dtype::f32, {2})));
  });
  CHECK(pos.find("pos must be i32 [2]") != std::string::npos);
  const std::string rank = error_of([](builder& b) {
    b.output("y", attention(b.input("q", dtype::f32, {2, 8}), b.input("k", dtype::f32, {4, 8}), b.input("v", dtype::f32, {4, 8}),
                            b.input("p", dtype::i32, {2})));
  });
  CHECK(rank.find("needs q [..., l, h, d]") != std::string::npos);
  const std::string window = error_of([](builder& b) {
    b.output("y", attention(b.input("q", dtype::f32, {1, 2, 8}), b.input("k", dtype::f32, {4, 2, 8}), b.input("v", dtype::f32, {4, 2, 8}),
                            b.input("p", dtype::i32, {1}), -3));
  });
  CHECK(window.find("window -3 is negative") != std::string::npos);

  builder b;
  auto q = b.parameter("q", dtype::f32, {1, 2, 8});
  auto y = attention(q, b.input("k", dtype::f32, {4, 2, 8}), b.input("v", dtype::f32, {4, 2, 8}), b.input("p", dtype::i32, {1}));
  b.output("dq", gradients(sum_all(y), {q})[0]);
  auto g = b.finish();
  REQUIRE_FALSE(g.has_value());
  CHECK(g.error().to_string().find("attention (node %") != std::string::npos);
}
