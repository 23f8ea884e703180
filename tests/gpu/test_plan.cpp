#include <catch2/catch.hpp>

#include "graph/builder.hpp"
#include "graph/nn.hpp"
#include "gpu/plan.hpp"

using namespace mesh;
using mesh::gpu::describe;
using mesh::gpu::kernel_kind;
using mesh::gpu::lower;

namespace {
graph done(builder& b) {
  auto g = b.finish();
  REQUIRE(g.has_value());
  return *g;
}
int count(const gpu::plan& p, kernel_kind k) {
  int n = 0;
  for (const auto& x : p.kernels) n += x.kind == k;
  return n;
}
}  // namespace

TEST_CASE("lowering: an elementwise chain with fan-out and broadcasts is one kernel") {
  builder b;
  auto x = b.input("x", dtype::f32, {4, 8});
  auto bias = b.parameter("b", dtype::f32, {8});
  auto s = x * sigmoid(x) + bias;
  b.output("y", select(compare(s, 0.0, compare_kind::gt), s, s * 0.1));
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  CHECK(p.kernels.size() == 1);
  CHECK(count(p, kernel_kind::elementwise) == 1);
}

TEST_CASE("lowering: bias + activation + residual become the matmul's epilogue") {
  builder b;
  auto x = b.input("x", dtype::f32, {5, 8});
  auto w = b.parameter("w", dtype::f32, {8, 8});
  auto bias = b.parameter("b", dtype::f32, {8});
  b.output("y", relu(matmul(x, w) + bias) + x);
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  REQUIRE(p.kernels.size() == 1);
  CHECK(p.kernels[0].kind == kernel_kind::matmul);
  CHECK(p.kernels[0].anchor != p.kernels[0].root);
}

TEST_CASE("lowering: a transposed operand is index arithmetic, not a copy") {
  builder b;
  auto x = b.input("x", dtype::f32, {5, 8});
  auto w = b.parameter("w", dtype::f32, {6, 8});
  b.output("y", matmul(x, transpose(w)));
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  CHECK(p.kernels.size() == 1);
}

TEST_CASE("lowering: softmax is one rows kernel (3 kernels unfused: a small subexpression two kernels need is recomputed)") {
  builder b;
  auto x = b.input("x", dtype::f32, {4, 16});
  b.output("y", nn::softmax(x));
  const graph g = done(b);
  const auto unfused = lower(g, {}, false);
  INFO(describe(g, unfused));
  // max, sum (recomputing exp(x - max)), division (recomputing it again): 3 kernels.
  CHECK(unfused.kernels.size() == 3);
  CHECK(count(unfused, kernel_kind::reduce) == 2);
  // They all walk the same rows and read the max and the sum only at their own row: one kernel.
  const auto p = lower(g);
  INFO(describe(g, p));
  REQUIRE(p.kernels.size() == 1);
  CHECK(p.kernels[0].kind == kernel_kind::rows);
  CHECK(describe(g, p) == "rows[" + describe(g, unfused) + "]");
  CHECK(p.kernels[0].root == unfused.kernels.back().root);
}

TEST_CASE("lowering: a mean is a reduction with its scaling as epilogue") {
  builder b;
  auto x = b.input("x", dtype::f32, {4, 16});
  b.output("m", mean(exp(x), {1}));
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  REQUIRE(p.kernels.size() == 1);
  CHECK(p.kernels[0].kind == kernel_kind::reduce);
}

TEST_CASE("lowering: outputs and update values always get buffers") {
  builder b;
  auto x = b.input("x", dtype::f32, {3});
  auto w = b.parameter("w", dtype::f32, {3});
  auto t = x + w;
  b.output("t", t);
  b.output("u", t * 2.0);
  b.update(w, w - t);
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  CHECK(p.kernels.size() == 3);
  CHECK(p.materialised[t.id()]);
}

TEST_CASE("lowering: an epilogue that uses the matmul result several times (GELU) still fuses") {
  builder b;
  auto x = b.input("x", dtype::f32, {5, 8});
  auto w = b.parameter("w", dtype::f32, {8, 8});
  auto bias = b.parameter("b", dtype::f32, {8});
  b.output("y", nn::gelu(matmul(x, w) + bias));
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  REQUIRE(p.kernels.size() == 1);
  CHECK(p.kernels[0].kind == kernel_kind::matmul);
}

TEST_CASE("lowering: no epilogue when the matmul result is also re-indexed") {
  builder b;
  auto x = b.input("x", dtype::f32, {8, 8});
  auto m = matmul(x, x);
  b.output("y", m + transpose(m));
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  CHECK(p.kernels.size() == 2);
}

TEST_CASE("lowering: a large subexpression two kernels need is materialised once") {
  builder b;
  auto x = b.input("x", dtype::f32, {4, 16});
  expr t = x;
  for (int i = 0; i < 8; ++i) t = sin(t) * 1.5;
  b.output("s", sum(t, {1}));
  b.output("m", max_over(t, {1}));
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  CHECK(p.materialised[t.id()]);
  CHECK(p.kernels.size() == 2);  // t, then both reductions of its rows in one kernel
  CHECK(lower(g, {}, false).kernels.size() == 3);
}

TEST_CASE("lowering: layer norm is one rows kernel (mean, variance, normalise: 3 kernels unfused)") {
  builder b;
  auto x = b.input("x", dtype::f32, {4, 16});
  auto gamma = b.parameter("g", dtype::f32, {16});
  auto beta = b.parameter("b", dtype::f32, {16});
  b.output("y", nn::layer_norm(x, gamma, beta));
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  CHECK(lower(g, {}, false).kernels.size() == 3);
  REQUIRE(p.kernels.size() == 1);
  CHECK(p.kernels[0].members.size() == 3);
}

TEST_CASE("lowering: rows kernels take only kernels that read row results at their own row") {
  builder b;
  auto x = b.input("x", dtype::f32, {8, 8});
  auto s = sum(x, {1}, true);                            // [8, 1]
  b.output("other_rows", x * reshape(s, {1, 8}));        // element (r, c) reads s[c]: not fusable
  b.output("own_row", x - s);                            // reads s[r] (a later kernel: not adjacent)
  auto t = sum(exp(x), {1});                             // [8], no kept axis
  b.output("flat", x / reshape(t, {8, 1}));              // a reshape to [8, 1], then the row broadcast
  b.output("split", sum(x, {0}, true));                  // a column sum: not a row kernel
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  // s's kernel, then "other_rows" breaks the run; t + "flat" fuse.
  int rows = 0;
  for (const auto& k : p.kernels) {
    if (k.kind != kernel_kind::rows) continue;
    ++rows;
    REQUIRE(k.members.size() == 2);
    CHECK(k.root == g.outputs[2].id);
  }
  CHECK(rows == 1);
}

TEST_CASE("lowering: few outputs over long ranges split into two passes, thresholds are options") {
  builder b;
  auto x = b.input("x", dtype::f32, {8, 256, 768});
  auto m = b.input("m", dtype::f32, {4096, 4096});
  b.output("loss", mean_all(x * x));   // one output over 1.5M elements: split
  b.output("cols", sum(m, {0}));       // 4096 columns = 128 workgroups: split
  b.output("rows", sum(m, {1}));       // 4096 rows = 4096 workgroups: one pass
  const graph g = done(b);
  const auto p = lower(g);
  INFO(describe(g, p));
  REQUIRE(p.kernels.size() == 5);
  CHECK(p.kernels[0].pass == 1);
  CHECK(p.kernels[1].pass == 2);
  CHECK(p.kernels[0].anchor != p.kernels[0].root);  // the 1/n stays an epilogue (of pass 2)
  CHECK(p.kernels[0].slices == 768);                // 2048 elements (8 per thread) each
  CHECK(p.kernels[2].pass == 1);
  CHECK(p.kernels[2].slices == 8);                  // 128 x 8 = 1024 workgroups
  CHECK(p.kernels[4].pass == 0);
  REQUIRE(p.scratch.size() == 2);
  CHECK(p.scratch[0].elements == 768);
  CHECK(p.scratch[1].elements == 8 * 4096);
  CHECK(describe(g, p).find(" x768)") != std::string::npos);

  gpu::split_options off;
  off.enabled = false;
  CHECK(lower(g, off).kernels.size() == 3);
  gpu::split_options strict;
  strict.min_reduced = 1 << 22;  // longer than any range here
  CHECK(lower(g, strict).scratch.empty());
}

TEST_CASE("lowering: split slices cover the reduced range in 64-element multiples") {
  gpu::reduction_layout l;
  l.outputs = 1;
  l.trailing = true;
  for (int64_t red : {4096, 4099, 100003, 1572864, 50000000}) {
    l.reduced = red;
    const int64_t s = gpu::split_slices(l, {});
    INFO(red << " -> " << s);
    REQUIRE(s >= 2);
    const int64_t len = gpu::slice_length(red, s);
    CHECK(len % 64 == 0);
    CHECK(len * s >= red);        // every element in a slice
    CHECK(len * (s - 1) < red);   // no empty slice
    CHECK(s <= 1024);
  }
  l.reduced = 4000;  // too short to split into slices of 2048
  CHECK(gpu::split_slices(l, {}) == 0);
  l.reduced = 1000;  // too short to split at all
  CHECK(gpu::split_slices(l, {}) == 0);
  l.reduced = 1 << 20;
  l.outputs = 300;  // enough workgroups already
  CHECK(gpu::split_slices(l, {}) == 0);
  l.trailing = false;  // a middle axis with many outputs and long ranges: one workgroup per output
  l.outputs = 2048;
  CHECK(l.per_group());
  CHECK(gpu::split_slices(l, {}) == 0);  // enough workgroups already
  l.reduced = 20000;  // short enough for one thread per output (redt)
  CHECK_FALSE(l.per_group());
  // A CPU device whose loops stop after 65535 iterations: a range too long for one pass is split
  // even with splitting off, into slices short enough for a thread.
  gpu::split_options cpu;
  cpu.enabled = false;
  cpu.must_split_above = 32768;
  l.outputs = 1;
  l.trailing = true;
  l.reduced = 17 << 20;
  const int64_t s = gpu::split_slices(l, cpu);
  REQUIRE(s >= 2);
  CHECK(gpu::slice_length(l.reduced, s) / 256 <= 32768);
  l.reduced = 1 << 20;  // 16K per thread of 64: one pass
  CHECK(gpu::split_slices(l, cpu) == 0);
  // A column sum of 640M elements: 1,024 slices (the usual cap) left 78,128 iterations per
  // thread; a forced split takes as many slices as it needs.
  l.trailing = false;
  l.leading = true;
  l.reduced = 640000000;
  const int64_t c = gpu::split_slices(l, cpu);
  REQUIRE(c > 1024);
  CHECK(gpu::slice_length(l.reduced, c) / 8 <= 32768);
}
