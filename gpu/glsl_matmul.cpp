// The f32 matmul kernels (warp-tiled `mmw*`, classic `mm128`/`mm64`, few-row `mms`), matmul() choosing among
// them and the cooperative-matrix kernels (glsl_coopmat.cpp), and the operand helpers both use.
// Block shapes come from matmul_schedule.hpp.
#include <algorithm>

#include "gpu/glsl_emitter.hpp"
#include "gpu/glsl_kernels.hpp"
#include "gpu/matmul_schedule.hpp"

namespace mesh::gpu::detail {
namespace {

/// The flat index, in the materialised node it re-indexes, of element `idx` of `x` when `x` reaches
/// one buffer through reshape, broadcast, permute and slice only (the emitter's index arithmetic,
/// evaluated for one index); nullopt for anything else.
std::optional<int64_t> source_index(const graph& g, const plan& q, node_index x, int64_t idx) {
  while (!q.materialised[x]) {
    const node& n = g[x];
    if (n.op == op_kind::broadcast || n.op == op_kind::permute || n.op == op_kind::slice)
      idx = movement_index(n, g[n.inputs[0]].dims)(idx);
    else if (n.op != op_kind::reshape)  // a reshape keeps the flat index
      return std::nullopt;
    x = n.inputs[0];
  }
  return idx;
}

/// Whether matmul operand `x` ([..., r, c]) is laid out column by column in memory: stepping r,
/// not c, moves to the next element (a transposed weight, x^T in a gradient). The tiled matmuls
/// then let consecutive threads walk r so that their loads stay coalesced.
bool column_major(const graph& g, const plan& q, node_index x) {
  const shape& xd = g[x].dims;
  if (xd.size() < 2 || xd[xd.size() - 2] < 2 || xd[xd.size() - 1] < 2) return false;
  const auto first = source_index(g, q, x, 0), next_c = source_index(g, q, x, 1),
             next_r = source_index(g, q, x, xd[xd.size() - 1]);
  return first && next_c && next_r && *next_c - *first != 1 && *next_r - *first == 1;
}

/// The warp-tiled f32 matmul (any operand type: loads go through the prologue loaders, B as
/// vec4 straight from its buffer when it is a materialised f32 tensor with n % 4 == 0).
/// Shared tiles are double-buffered: the next tile is loaded from global memory into registers
/// while the current one is multiplied, then stored to the other stage, with one barrier per
/// tile. All shared accesses are whole vec4s (component writes are read-modify-writes of a vec4
/// on some drivers, racing between threads).
std::optional<kernel_source> matmul_warp(const graph& g, const plan& q, const kernel& k, const device_caps& caps) {
  const mm_dims d = dims_of(g, k);
  const auto tile = pick_warp_tile(d, caps);
  if (!tile || d.kd == 0 || d.batch == 0) return std::nullopt;
  warp_tile t = *tile;
  const int64_t bm = t.bm(), bn = t.bn(), bk = t.bk, m = d.m, n = d.n, kd = d.kd;
  const std::string unroll = caps.unroll_loops ? "[[unroll]] " : "";
  const auto loop = [&](const char* var, int64_t count) {
    return unroll + "for (uint " + var + " = 0u; " + var + " < " + u(count) + "; ++" + var + ") ";
  };

  emitter e(g, q, false);
  e.bind(k.root);
  const bool lin = g[k.anchor].op == op_kind::linear;
  const std::string la = loader(e, "load_a", d.a);
  const auto bv = lin ? std::nullopt : direct_operand(g, q, d.b);
  const bool b_vec4 = bv && g[bv->id].type == dtype::f32 && n % 4 == 0 && !read_elsewhere(g, q, k, bv->id, d.a);
  const int b_binding = b_vec4 ? e.bind(bv->id) : -1;
  const int64_t b_batch = b_vec4 ? bv->batch_stride : kd * n;
  const std::string lb = b_vec4 ? "" : lin ? linear_b_loader(e, d, g, k) : loader(e, "load_b", d.b);
  // Operands laid out the other way (x^T, w^T through index arithmetic) are walked by
  // consecutive threads along their contiguous axis: A along m, B along k (a linear's weight).
  const bool a_by_m = column_major(g, q, d.a);
  const bool b_by_k = !b_vec4 && (lin || column_major(g, q, d.b));
  t.b_padded = b_by_k;  // k-walking threads store down a column of Bs: padded rows spread the banks
  if (t.shared_bytes() > static_cast<int64_t>(caps.shared_memory_bytes)) return std::nullopt;
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "acc[rm * 4u + i][rn][c]"); });

  // Global -> registers: A as groups of 4 rows at one k (consecutive threads along k read
  // neighbouring words of 4 rows; along m when A is column-major), B as 4 neighbouring columns at
  // one k (consecutive threads along n; along k when B is column-major).
  const int64_t a_items = bm / 4 * bk, b_items = bk * bn / 4;
  const int64_t a_per = (a_items + 255) / 256, b_per = (b_items + 255) / 256;
  const auto guard = [](int64_t items) { return items % 256 == 0 ? std::string() : "if (el < " + u(items) + ") "; };
  // Which (k, m/4) or (k, n/4) slot of a tile item `el` fills.
  const std::string a_k = a_by_m ? "el / " + u(bm / 4) : "el % " + u(bk), a_m4 = a_by_m ? "el % " + u(bm / 4) : "el / " + u(bk);
  const std::string b_k = b_by_k ? "el % " + u(bk) : "el / " + u(bn / 4), b_n4 = b_by_k ? "el / " + u(bk) : "el % " + u(bn / 4);
  auto fetch = [&](const std::string& kb) {
    std::string f;
    f += "      " + loop("l", a_per) + "{\n        uint el = tid + l * 256u, gm = m0 + (" + a_m4 + ") * 4u, gk = " + kb +
         " + " + a_k + ";\n        vec4 v = vec4(0.0);\n";
    f += "        " + guard(a_items) + "if (gk < " + u(kd) + ") {\n          uint base = bz * " + u(m * kd) + " + gm * " + u(kd) +
         " + gk;\n";
    f += "          " + loop("r", 4) + "if (gm + r < " + u(m) + ") v[r] = load_a(base + r * " + u(kd) + ");\n        }\n";
    f += "        ga[l] = v;\n      }\n";
    f += "      " + loop("l", b_per) + "{\n        uint el = tid + l * 256u, gk = " + kb + " + " + b_k + ", gn = n0 + (" + b_n4 +
         ") * 4u, base = bz * " + u(b_batch) + " + gk * " + u(n) + " + gn;\n";
    if (b_vec4) {
      std::string in_range = "gk < " + u(kd) + " && gn < " + u(n);
      if (b_items % 256 != 0) in_range = "el < " + u(b_items) + " && " + in_range;
      f += "        gb[l] = (" + in_range + ") ? b" + std::to_string(b_binding) + ".v[base >> 2] : vec4(0.0);\n";
    } else {
      f += "        vec4 v = vec4(0.0);\n        " + guard(b_items) + "if (gk < " + u(kd) + ") " + loop("c", 4) +
           "if (gn + c < " + u(n) + ") v[c] = load_b(base + c);\n        gb[l] = v;\n";
    }
    f += "      }\n";
    return f;
  };
  auto stash = [&](const std::string& stage) {
    std::string s;
    s += "      " + loop("l", a_per) + "{\n        uint el = tid + l * 256u;\n        " + guard(a_items) + "As[" + stage +
         "][" + a_k + "][" + a_m4 + "] = ga[l];\n      }\n";
    s += "      " + loop("l", b_per) + "{\n        uint el = tid + l * 256u;\n        " + guard(b_items) + "Bs[" + stage +
         "][" + b_k + "][" + b_n4 + "] = gb[l];\n      }\n";
    return s;
  };

  const int64_t tiles = (kd + bk - 1) / bk;
  std::string src;
  src += "shared vec4 As[2][" + std::to_string(bk) + "][" + std::to_string(bm / 4 + 1) + "];\n";
  src += "shared vec4 Bs[2][" + std::to_string(bk) + "][" + std::to_string(t.b_row()) + "];\n";
  src += la + lb;
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, warp = tid >> 5, lane = tid & 31u;\n";
  src += "  const uint wm = warp >> 1, wn = warp & 1u, lm = lane >> 3, ln = lane & 7u;\n";
  src += tile_loops(d.batch, m, n, bm, bn, caps.variants.gemm_swizzle);
  src += "    vec4 acc[" + std::to_string(4 * t.rm) + "][" + std::to_string(t.rn) + "];\n";
  src += "    " + loop("i", 4 * t.rm) + loop("j", t.rn) + "acc[i][j] = vec4(0.0);\n";
  src += "    vec4 ga[" + std::to_string(a_per) + "], gb[" + std::to_string(b_per) + "];\n";
  src += "    {\n" + fetch("0u") + stash("0") + "    }\n    barrier();\n";
  // One tile multiplied from shared stage `stage`.
  auto math = [&](const std::string& stage) {
    std::string m_;
    m_ += "      " + loop("kk", bk) + "{\n        vec4 ra[" + std::to_string(t.rm) + "], rb[" + std::to_string(t.rn) + "];\n";
    m_ += "        " + loop("rm", t.rm) + "ra[rm] = As[" + stage + "][kk][wm * " + u(t.wtm() / 4) + " + rm * 4u + lm];\n";
    m_ += "        " + loop("rn", t.rn) + "rb[rn] = Bs[" + stage + "][kk][wn * " + u(t.wtn() / 4) + " + rn * 8u + ln];\n";
    m_ += "        " + loop("rm", t.rm) + loop("i", 4) + loop("rn", t.rn) +
          "acc[rm * 4u + i][rn] = fma(vec4(ra[rm][i]), rb[rn], acc[rm * 4u + i][rn]);\n      }\n";
    return m_;
  };
  // The last tile is peeled off the loop so that its body (fetch tile t + 1, multiply tile t,
  // store) has no branches: measured 11% faster on the H100 (35.7 -> 39.8 TFLOP/s at 4096) than
  // guarding the fetch and the store inside the loop.
  src += "    for (uint t = 0u; t < " + u(tiles - 1) + "; ++t) {\n      const uint cur = t & 1u;\n      {\n" +
         fetch("(t + 1u) * " + u(bk)) + "      }\n" + math("cur") + stash("cur ^ 1u") + "      barrier();\n    }\n";
  src += math(u(tiles - 1) + " & 1u");
  src += "    " + loop("rm", t.rm) + loop("i", 4) + loop("rn", t.rn) + loop("c", 4) + "{\n";
  src += "      uint gm = m0 + wm * " + u(t.wtm()) + " + rm * 16u + lm * 4u + i, gn = n0 + wn * " + u(t.wtn()) +
         " + rn * 32u + ln * 4u + c;\n";
  src += "      if (gm >= " + u(m) + " || gn >= " + u(n) + ") continue;\n";
  src += "      uint ci = bz * " + u(m * n) + " + gm * " + u(n) + " + gn;\n";
  src += store + "    }\n  }\n}\n";

  kernel_source s;
  s.name = "mmw" + std::to_string(bm) + "x" + std::to_string(bn) + (bk == 8 ? "" : "k" + std::to_string(bk)) +
           (a_by_m ? "am" : "") + (b_by_k ? "bk" : "") + "_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(n, bn, caps.max_groups[0]), groups_for(m, bm, caps.max_groups[1]), groups_for(d.batch, 1, caps.max_groups[2])};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = d.flops();
  const size_t vb = b_vec4 ? static_cast<size_t>(b_binding) : SIZE_MAX;
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, false, vb, vb + 1) + prelude + src;
  return s;
}

/// The classic f32 matmul (`mm128`, `mm64`): single-buffered shared tiles 16 deep, 8x8 (4x4)
/// outputs per thread, operands through the prologue loaders. It takes every matmul the other
/// kernels do not (the warp tile's shared memory does not fit; k or the batch is 0), and
/// kernel_variants::gemm "classic" picks it for comparison.
kernel_source matmul_classic(const graph& g, const plan& q, const kernel& k, const device_caps& caps) {
  const mm_dims d = dims_of(g, k);
  const node_index a = d.a, b = d.b;
  const int64_t m = d.m, kd = d.kd, n = d.n, batch = d.batch;
  // Big tiles only when there are enough of them to fill the device; both fit in 16 KiB of
  // shared memory.
  const bool big = many_big_tiles(d) && caps.shared_memory_bytes >= 16384;
  const int64_t bm = big ? 128 : 64, bn = bm, bk = 16, tm = big ? 8 : 4, tn = tm;
  const std::string unroll = caps.unroll_loops ? "[[unroll]] " : "";
  const int64_t tx = bn / tn;

  emitter e(g, q, false);
  e.bind(k.root);
  const std::string la = loader(e, "load_a", a);
  const std::string lb = g[k.anchor].op == op_kind::linear ? linear_b_loader(e, d, g, k) : loader(e, "load_b", b);
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "acc[i][j]"); });

  std::string src;
  // As is stored transposed (As[k][m]): 16 threads write one m column at once, so each k row is
  // padded by one float to put those writes in 16 different banks.
  src += "shared float As[" + std::to_string(bk) + "][" + std::to_string(bm + 1) + "];\n";
  src += "shared float Bs[" + std::to_string(bk) + "][" + std::to_string(bn) + "];\n";
  src += la + lb;
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, tx = tid % " + u(tx) + ", ty = tid / " + u(tx) + ";\n";
  src += "  for (uint bz = gl_WorkGroupID.z; bz < " + u(batch) + "; bz += gl_NumWorkGroups.z)\n";
  src += "  for (uint by = gl_WorkGroupID.y; by < " + u((m + bm - 1) / bm) + "; by += gl_NumWorkGroups.y)\n";
  src += "  for (uint bx = gl_WorkGroupID.x; bx < " + u((n + bn - 1) / bn) + "; bx += gl_NumWorkGroups.x) {\n";
  src += "    const uint m0 = by * " + u(bm) + ", n0 = bx * " + u(bn) + ";\n";
  src += "    float acc[" + std::to_string(tm) + "][" + std::to_string(tn) + "];\n";
  src += "    " + unroll + "for (uint i = 0u; i < " + u(tm) + "; ++i) " + unroll + "for (uint j = 0u; j < " + u(tn) + "; ++j) acc[i][j] = 0.0;\n";
  src += "    for (uint k0 = 0u; k0 < " + u(kd) + "; k0 += " + u(bk) + ") {\n";
  src += "      " + unroll + "for (uint l = 0u; l < " + u(bm * bk / 256) + "; ++l) {\n";
  src += "        uint el = tid + l * 256u, kk = el % " + u(bk) + ", mm = el / " + u(bk) + ", gm = m0 + mm, gk = k0 + kk;\n";
  src += "        As[kk][mm] = (gm < " + u(m) + " && gk < " + u(kd) + ") ? load_a(bz * " + u(m * kd) + " + gm * " + u(kd) +
         " + gk) : 0.0;\n      }\n";
  src += "      " + unroll + "for (uint l = 0u; l < " + u(bn * bk / 256) + "; ++l) {\n";
  src += "        uint el = tid + l * 256u, nn = el % " + u(bn) + ", kk = el / " + u(bn) + ", gn = n0 + nn, gk = k0 + kk;\n";
  src += "        Bs[kk][nn] = (gn < " + u(n) + " && gk < " + u(kd) + ") ? load_b(bz * " + u(kd * n) + " + gk * " + u(n) +
         " + gn) : 0.0;\n      }\n";
  src += "      barrier();\n";
  src += "      " + unroll + "for (uint kk = 0u; kk < " + u(bk) + "; ++kk) {\n";
  src += "        float ra[" + std::to_string(tm) + "], rb[" + std::to_string(tn) + "];\n";
  src += "        " + unroll + "for (uint i = 0u; i < " + u(tm) + "; ++i) ra[i] = As[kk][ty * " + u(tm) + " + i];\n";
  src += "        " + unroll + "for (uint j = 0u; j < " + u(tn) + "; ++j) rb[j] = Bs[kk][tx + j * " + u(tx) + "];\n";
  src += "        " + unroll + "for (uint i = 0u; i < " + u(tm) + "; ++i) " + unroll + "for (uint j = 0u; j < " + u(tn) + "; ++j) acc[i][j] = fma(ra[i], rb[j], acc[i][j]);\n";
  src += "      }\n      barrier();\n    }\n";
  src += "    " + unroll + "for (uint i = 0u; i < " + u(tm) + "; ++i) " + unroll + "for (uint j = 0u; j < " + u(tn) + "; ++j) {\n";
  src += "      uint gm = m0 + ty * " + u(tm) + " + i, gn = n0 + tx + j * " + u(tx) + ";\n";
  src += "      if (gm >= " + u(m) + " || gn >= " + u(n) + ") continue;\n";
  src += "      uint ci = bz * " + u(m * n) + " + gm * " + u(n) + " + gn;\n";
  src += store + "    }\n  }\n}\n";

  kernel_source s;
  s.name = std::string(big ? "mm128_" : "mm64_") + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(n, bn, caps.max_groups[0]), groups_for(m, bm, caps.max_groups[1]),
              groups_for(batch, 1, caps.max_groups[2])};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kd);
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, false) + prelude + src;
  return s;
}

/// Few rows (m <= matmul_skinny_max_rows: decode attention's q k^T and probs v, a head's handful
/// of query rows against hundreds of keys), where the tiled kernels' 64- or 128-row tiles would
/// compute mostly padding and launch few workgroups (`mms`). 64 threads own 64 output columns of
/// every row: A's rows are staged in shared memory 64 deep at a time and each thread walks k
/// down its column of B, so one workgroup per 64 columns of each batch matrix runs.
std::optional<kernel_source> matmul_skinny(const graph& g, const plan& q, const kernel& k, const device_caps& caps) {
  const mm_dims d = dims_of(g, k);
  const int64_t m = d.m, kd = d.kd, n = d.n, batch = d.batch, bn = 64, bk = 64;
  if (m < 1 || m > matmul_skinny_max_rows || kd == 0 || batch == 0 || n == 0) return std::nullopt;
  // Each thread walks all of k: on a device that caps a shader's loops (lavapipe) a deep product
  // goes to the tiled kernels, whose threads take k / 8 steps.
  if (caps.loop_limit > 0 && kd + kd / bk + m > caps.loop_limit * 7 / 8) return std::nullopt;
  const std::string unroll = caps.unroll_loops ? "[[unroll]] " : "";
  emitter e(g, q, false);
  e.bind(k.root);
  const std::string la = loader(e, "load_a", d.a);
  const std::string lb = loader(e, "load_b", d.b);
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "acc[i]"); });

  std::string src;
  src += "shared float As[" + std::to_string(m) + "][" + std::to_string(bk) + "];\n";
  src += la + lb;
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x;\n";
  src += "  for (uint bz = gl_WorkGroupID.z; bz < " + u(batch) + "; bz += gl_NumWorkGroups.z)\n";
  src += "  for (uint bx = gl_WorkGroupID.x; bx < " + u((n + bn - 1) / bn) + "; bx += gl_NumWorkGroups.x) {\n";
  src += "    const uint gn = bx * " + u(bn) + " + tid;\n";
  src += "    float acc[" + std::to_string(m) + "];\n";
  src += "    " + unroll + "for (uint i = 0u; i < " + u(m) + "; ++i) acc[i] = 0.0;\n";
  src += "    for (uint k0 = 0u; k0 < " + u(kd) + "; k0 += " + u(bk) + ") {\n";
  src += "      const uint kn = min(" + u(bk) + ", " + u(kd) + " - k0);\n";
  src += "      barrier();\n";  // the previous slice's reads of As are done
  src += "      for (uint l = tid; l < " + u(m * bk) + "; l += " + u(bn) + ") {\n";
  src += "        const uint i = l / " + u(bk) + ", kk = l % " + u(bk) + ";\n";
  src += "        As[i][kk] = kk < kn ? load_a(bz * " + u(m * kd) + " + i * " + u(kd) + " + k0 + kk) : 0.0;\n      }\n";
  src += "      barrier();\n";
  src += "      if (gn < " + u(n) + ") for (uint kk = 0u; kk < kn; ++kk) {\n";
  src += "        const float b = load_b(bz * " + u(kd * n) + " + (k0 + kk) * " + u(n) + " + gn);\n";
  src += "        " + unroll + "for (uint i = 0u; i < " + u(m) + "; ++i) acc[i] = fma(As[i][kk], b, acc[i]);\n      }\n";
  src += "    }\n";
  src += "    if (gn < " + u(n) + ") " + unroll + "for (uint i = 0u; i < " + u(m) + "; ++i) {\n";
  src += "      const uint ci = bz * " + u(m * n) + " + i * " + u(n) + " + gn;\n";
  src += store + "    }\n  }\n}\n";

  kernel_source s;
  s.name = "mms_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(n, bn, caps.max_groups[0]), 1, groups_for(batch, 1, caps.max_groups[2])};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = d.flops();
  s.glsl = header(g, s.bindings, false, static_cast<uint32_t>(bn)) + buffer_decls(g, s.bindings, false) + prelude + src;
  return s;
}

}  // namespace

node_index behind_reshapes(const graph& g, const plan& q, node_index x) {
  while (!q.materialised[x] && g[x].op == op_kind::reshape) x = g[x].inputs[0];
  return x;
}

std::optional<operand_view> direct_operand(const graph& g, const plan& q, node_index x) {
  const shape& xd = g[x].dims;
  const int64_t matrix = xd[xd.size() - 2] * xd[xd.size() - 1];
  if (q.materialised[x]) return operand_view{x, matrix};
  if (g[x].op != op_kind::broadcast) return std::nullopt;
  const node_index src = g[x].inputs[0];
  const shape& sd = g[src].dims;
  if (!q.materialised[src] || sd.size() < 2 || element_count(sd) != matrix || sd[sd.size() - 2] != xd[xd.size() - 2] ||
      sd[sd.size() - 1] != xd[xd.size() - 1])
    return std::nullopt;
  return operand_view{src, 0};
}

bool read_elsewhere(const graph& g, const plan& q, const kernel& k, node_index operand, node_index other) {
  std::vector<node_index> seen;
  inline_nodes(g, q, k.root, k.anchor, seen);
  inline_nodes(g, q, other, -1, seen);
  return operand == other || std::count(seen.begin(), seen.end(), operand) > 0;
}

std::string tile_loops(int64_t batch, int64_t m, int64_t n, int64_t bm, int64_t bn, uint32_t swizzle) {
  const int64_t tm = (m + bm - 1) / bm, tn = (n + bn - 1) / bn;
  std::string src;
  src += "  for (uint bz = gl_WorkGroupID.z; bz < " + u(batch) + "; bz += gl_NumWorkGroups.z)\n";
  if (swizzle <= 1 || tm <= 1 || tn <= 1) {
    src += "  for (uint by = gl_WorkGroupID.y; by < " + u(tm) + "; by += gl_NumWorkGroups.y)\n";
    src += "  for (uint bx = gl_WorkGroupID.x; bx < " + u(tn) + "; bx += gl_NumWorkGroups.x) {\n";
  } else {
    const int64_t g = swizzle, group = g * tn;
    src += "  for (uint ry = gl_WorkGroupID.y; ry < " + u(tm) + "; ry += gl_NumWorkGroups.y)\n";
    src += "  for (uint rx = gl_WorkGroupID.x; rx < " + u(tn) + "; rx += gl_NumWorkGroups.x) {\n";
    src += "    const uint lin = ry * " + u(tn) + " + rx, grp = lin / " + u(group) + ", first = grp * " + u(g) +
           ", rows = min(" + u(g) + ", " + u(tm) + " - first), rem = lin - grp * " + u(group) + ";\n";
    src += "    const uint by = first + rem % rows, bx = rem / rows;\n";
  }
  src += "    const uint m0 = by * " + u(bm) + ", n0 = bx * " + u(bn) + ";\n";
  return src;
}

std::string linear_b_loader(emitter& e, const mm_dims& d, const graph& g, const kernel& k) {
  std::string f;
  if (k.weight >= 0) {  // decoded to f16 by a weight_decode kernel (predecode_linears): [n, k] halves, two a word
    const std::string w = "b" + std::to_string(e.bind(scratch_id(g, k.weight)));
    return "float load_b(uint xi) {\n  uint i = (xi % " + u(d.n) + ") * " + u(d.kd) + " + xi / " + u(d.n) + ";\n  return unpackHalf2x16(" + w +
           ".v[i >> 1])[i & 1u];\n}\n";
  }
  e.scoped([&] {
    const std::string v = e.value(d.b, "(xi % " + u(d.n) + ") * " + u(d.kd) + " + xi / " + u(d.n));
    f = "float load_b(uint xi) {\n" + e.body + "  return float(" + v + ");\n}\n";
    e.body.clear();
  });
  return f;
}

kernel_source matmul(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  // The cooperative-matrix kernels read both operands as f16 buffers: a linear's weight is
  // transposed (and may be quantized), so linear takes the f32-math kernels.
  if (g[k.anchor].op == op_kind::matmul) {
    if (caps.variants.gemm != "noskinny")
      if (auto skinny = matmul_skinny(g, q, k, caps)) return *skinny;
    if (auto coop = matmul_coopmat_tiled(g, q, k, caps)) return *coop;
    if (auto coop = matmul_coopmat(g, q, k, caps)) return *coop;
  }
  if (caps.variants.gemm != "classic")
    if (auto warp = matmul_warp(g, q, k, caps)) return *warp;
  return matmul_classic(g, q, k, caps);
}

}  // namespace mesh::gpu::detail
