// emit(): the GLSL of one kernel of a plan. It refuses what the device cannot run (16-bit
// tensors without 16-bit storage, loops past a CPU driver's limit), then hands the kernel to the
// emitter of its kind. The elementwise and scatter_add kernels are here; reductions and rows
// kernels are in glsl_reduce.cpp, matmuls in glsl_matmul.cpp and glsl_coopmat.cpp (block shapes
// in matmul_schedule.cpp), linear and kv_write in glsl_linear.cpp, the decoders of quantized
// blocks in glsl_quant.cpp, and the expression emitter they all use in glsl_emitter.cpp.
#include "gpu/glsl.hpp"

#include <algorithm>

#include "gpu/glsl_emitter.hpp"
#include "gpu/glsl_kernels.hpp"

namespace mesh::gpu {
namespace {

using namespace detail;

/// A splat constant, possibly broadcast or reshaped: the same value at every index.
bool is_uniform(const graph& g, node_index id) {
  const node& n = g[id];
  if (is_splat(n)) return true;
  return (n.op == op_kind::broadcast || n.op == op_kind::reshape) && is_uniform(g, n.inputs[0]);
}

/// vec4 elementwise needs every value f32 or i32, every read at the output's own index, and a
/// length divisible by 4.
bool vectorisable(const graph& g, const plan& p, node_index root) {
  if (element_count(g[root].dims) % 4 != 0) return false;
  std::vector<node_index> nodes;
  inline_nodes(g, p, root, -1, nodes);
  for (auto id : nodes) {
    const node& n = g[id];
    if (n.type != dtype::f32 && n.type != dtype::i32) return false;
    if (id != root && (p.materialised[id] || is_splat(n))) continue;
    if (!is_elementwise(n.op) && n.op != op_kind::reshape && !is_uniform(g, id)) return false;
    if ((n.op == op_kind::div || n.op == op_kind::pow) && n.type == dtype::i32) return false;
    if (n.op == op_kind::pow && g[n.inputs[0]].type == dtype::i32) return false;
  }
  return true;
}

kernel_source elementwise(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  const bool vec4 = vectorisable(g, q, k.root);
  const int64_t count = element_count(g[k.root].dims) / (vec4 ? 4 : 1);
  emitter e(g, q, vec4);
  e.bind(k.root);
  const std::string v = e.value(k.root, "i");
  const std::string body = e.body + e.store(k.root, "i", v);
  kernel_source s;
  s.name = std::string(vec4 ? "ew4_" : "ew_") + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(count, 256, caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, vec4) + prelude +
           "void main() {\n  const uint stride = gl_NumWorkGroups.x * 256u;\n  for (uint i = gl_GlobalInvocationID.x; i < " +
           u(count) + "; i += stride) {\n" + body + "  }\n}\n";
  return s;
}

/// scatter_add where picks spread over many rows (an embedding's gradient): one workgroup per
/// output row (grid-stride over rows). The picks are taken 256 at a
/// time: each thread tests one pick's index against the row and marks it in shared memory; when
/// any of the 256 landed on the row, every thread adds the marked picks' updates, in pick order, to
/// the columns it owns (col = t, t + 256, ...). Deterministic (pick order, no float atomics), and
/// a row no pick lands on costs picks / 256 compares per thread, so the embedding gradient of a
/// large vocabulary (rows >> picks) costs about rows x picks compares in all, not rows x columns x
/// picks. (llvmpipe ends a shader invocation's loops after 65535 iterations in all, silently: the
/// loop budget in emit() refuses kernels that could need more.)
/// Columns of a scatter_add row each of its 256 threads owns.
int64_t scatter_column_slots(int64_t row_size) { return std::max<int64_t>((row_size + 255) / 256, 1); }

/// Whether scatter_rows does less work than scatter_elements: thread iterations in all, the
/// element kernel's outputs x picks against the row kernel's 4 x rows x picks for the tests, and
/// 256 x 256 x column slots per round some pick landed on (at most one round per pick).
bool scatter_by_rows(int64_t rows, int64_t row_size, int64_t picks) {
  const double rounds = static_cast<double>((picks + 255) / 256);
  const double hit_rounds = std::min(static_cast<double>(picks), static_cast<double>(rows) * rounds);
  const double by_rows = 4.0 * static_cast<double>(rows) * static_cast<double>(picks) +
                         hit_rounds * 65536.0 * static_cast<double>(scatter_column_slots(row_size));
  return by_rows < static_cast<double>(rows) * static_cast<double>(row_size) * static_cast<double>(picks);
}

/// scatter_add where picks crowd onto few rows (a sum of many picks into few outputs): one
/// workgroup per output element (grid-stride over outputs); its 256 threads
/// each sum every 256th pick that lands on the element's row, in pick order, and a fixed tree
/// in shared memory adds the 256 partial sums: deterministic, no atomics. A thread loops
/// picks / 256 times. (One thread per element, looping over every pick, left all but a few
/// threads idle when the output is small, and on lavapipe came back wrong past 65535 picks:
/// llvmpipe ends a shader invocation's loops after 65535 iterations in all, silently.)
kernel_source scatter_elements(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  const node& sa = g[k.root];
  const node_index idx = sa.inputs[0], upd = sa.inputs[1];
  const int64_t outs = element_count(sa.dims), rows = sa.dims[0];
  const int64_t row_size = rows ? outs / rows : 0, picks = element_count(g[idx].dims);
  emitter e(g, q, false);
  e.bind(k.root);
  const bool is_int = sa.type == dtype::i32;
  std::string inner;
  e.scoped([&] {
    const std::string ix = e.value(idx, "pk");
    inner = e.body + "      if (" + ix + " == int(row)) {\n";
    e.body.clear();
    e.scoped([&] {
      const std::string v = e.value(upd, "pk * " + u(row_size) + " + col");
      inner += e.body + "      acc += " + v + ";\n      }\n";
      e.body.clear();
    });
  });
  std::string out;
  e.scoped([&] {
    const std::string v = e.rounded(k.root, "acc");
    out = e.store(k.root, "o", v);
  });
  const std::string acc_type = is_int ? "int" : "float", zero = is_int ? "0" : "0.0";
  const std::string rs = u(std::max<int64_t>(row_size, 1));
  std::string src = "shared " + acc_type + " part[256];\nvoid main() {\n  const uint t = gl_LocalInvocationID.x;\n";
  src += "  for (uint o = gl_WorkGroupID.x; o < " + u(outs) + "; o += gl_NumWorkGroups.x) {\n";
  src += "    uint row = o / " + rs + ", col = o % " + rs + ";\n    " + acc_type + " acc = " + zero + ";\n";
  src += "    for (uint pk = t; pk < " + u(picks) + "; pk += 256u) {\n" + inner + "    }\n";
  src += "    part[t] = acc;\n    barrier();\n";
  src += "    for (uint s = 128u; s > 0u; s >>= 1) {\n      if (t < s) part[t] += part[t + s];\n      barrier();\n    }\n";
  src += "    if (t == 0u) {\n      acc = part[0];\n" + out + "    }\n    barrier();\n  }\n}\n";
  kernel_source s;
  s.name = "scat_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(outs, 1, caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, false) + prelude + src;
  return s;
}

kernel_source scatter_rows(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  const node& sa = g[k.root];
  const node_index idx = sa.inputs[0], upd = sa.inputs[1];
  const int64_t outs = element_count(sa.dims), rows = sa.dims[0];
  const int64_t row_size = rows ? outs / rows : 0, picks = element_count(g[idx].dims);
  const int64_t slots = scatter_column_slots(row_size);
  emitter e(g, q, false);
  e.bind(k.root);
  const bool is_int = sa.type == dtype::i32;
  const std::string rs = u(std::max<int64_t>(row_size, 1));
  std::string test;
  e.scoped([&] {
    const std::string ix = e.value(idx, "pk");
    test = e.body + "        if (" + ix + " == int(row)) h = int(pk);\n";
    e.body.clear();
  });
  std::string add;
  e.scoped([&] {
    const std::string v = e.value(upd, "uint(pick) * " + rs + " + col");
    add = e.body + "              acc[s] += " + v + ";\n";
    e.body.clear();
  });
  std::string out;
  e.scoped([&] {
    const std::string v = e.rounded(k.root, "acc[s]");
    out = e.store(k.root, "o", v);
  });
  const std::string acc_type = is_int ? "int" : "float", zero = is_int ? "0" : "0.0";
  std::string src = "shared int hit[256];\nshared uint hits;\nvoid main() {\n  const uint t = gl_LocalInvocationID.x;\n";
  src += "  for (uint row = gl_WorkGroupID.x; row < " + u(rows) + "; row += gl_NumWorkGroups.x) {\n";
  src += "    " + acc_type + " acc[" + u(slots) + "];\n";
  src += "    for (uint s = 0u; s < " + u(slots) + "; ++s) acc[s] = " + zero + ";\n";
  src += "    for (uint base = 0u; base < " + u(picks) + "; base += 256u) {\n";
  src += "      if (t == 0u) hits = 0u;\n      barrier();\n";
  src += "      const uint pk = base + t;\n      int h = -1;\n      if (pk < " + u(picks) + ") {\n" + test + "      }\n";
  src += "      hit[t] = h;\n      if (h >= 0) atomicAdd(hits, 1u);\n      barrier();\n";
  src += "      if (hits > 0u) {\n        for (uint j = 0u; j < 256u; ++j) {\n          const int pick = hit[j];\n";
  src += "          if (pick >= 0) {\n            for (uint s = 0u; s < " + u(slots) + "; ++s) {\n";
  src += "              const uint col = t + s * 256u;\n              if (col >= " + u(row_size) + ") break;\n" + add;
  src += "            }\n          }\n        }\n      }\n      barrier();\n    }\n";
  src += "    for (uint s = 0u; s < " + u(slots) + "; ++s) {\n      const uint col = t + s * 256u;\n      if (col >= " + u(row_size) +
         ") break;\n      const uint o = row * " + rs + " + col;\n" + out + "    }\n  }\n}\n";
  kernel_source s;
  s.name = "scatr_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(std::max<int64_t>(rows, 1), 1, caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, false) + prelude + src;
  return s;
}

}  // namespace

expected<kernel_source> emit(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  if (!caps.storage16) {
    std::vector<node_index> nodes;
    if (k.kind == kernel_kind::rows)
      for (const auto& m : k.members) detail::inline_nodes(g, p, m.root, -1, nodes);
    else
      detail::inline_nodes(g, p, k.root, -1, nodes);
    for (auto id : nodes)
      if (g[id].type == dtype::f16 || g[id].type == dtype::bf16)
        return make_error(error_code::unsupported, "this device has no 16-bit storage buffers: f16/bf16 tensors cannot run here");
  }
  // The kernels whose one invocation loops in proportion to a tensor's size, with a margin for
  // the loops around them (reductions split instead: split_options::must_split_above).
  if (caps.loop_limit > 0) {
    const int64_t budget = caps.loop_limit * 7 / 8;
    const auto too_long = [&](const std::string& what, int64_t iterations) -> expected<kernel_source> {
      return make_error(error_code::unsupported, what + " needs " + std::to_string(iterations) +
                                                     " loop iterations in one shader invocation; this device (a CPU Vulkan driver) stops at " +
                                                     std::to_string(caps.loop_limit) + ": run it on a GPU or the CPU executor");
    };
    if (k.kind == kernel_kind::scatter_add) {
      const node& sa = g[k.root];
      const int64_t picks = element_count(g[sa.inputs[0]].dims), outs = element_count(sa.dims), rows = sa.dims[0];
      const int64_t row_size = rows ? outs / rows : 0, groups = std::max<int64_t>(caps.max_groups[0], 1);
      int64_t iterations = 0;
      if (scatter_by_rows(rows, row_size, picks)) {
        // Each workgroup walks ceil(rows / groups) rows; a row takes picks / 256 rounds, and a
        // round some pick landed on loops 256 marks x the thread's column slots: at worst every
        // round (all picks on one row).
        const int64_t slots = scatter_column_slots(row_size), rounds = (picks + 255) / 256;
        iterations = (rows + groups - 1) / groups * (rounds * (4 + 256 * (slots + 1)) + 2 * slots + 4);
      } else {
        // Each workgroup walks ceil(outputs / groups) outputs, each costing picks / 256 iterations
        // plus the tree's 8 and the walk's own.
        iterations = (outs + groups - 1) / groups * ((picks + 255) / 256 + 10);
      }
      if (iterations > budget)
        return too_long("scatter_add of " + std::to_string(outs) + " outputs over " + std::to_string(picks) + " picks", iterations);
    }
    if (k.kind == kernel_kind::attention) {
      // Pass 1: per slice, the query's load, then per tile the short reductions (the key loops
      // are unrolled); pass 2: per row, d / 64 elements, each combining every slice.
      const shape& kd = g[g[k.root].inputs[1]].dims;
      const int64_t d = g[k.root].dims.back(), rows = element_count(g[k.root].dims) / std::max<int64_t>(d, 1);
      if (k.pass == 0) {
        // One kernel: per tile of rows, per tile of keys, the k/v loads, the scores (bk/4 x d),
        // the weighted sums (bk x d/4), should the compiler keep the loops.
        const int64_t t = kd[kd.size() - 3], bq = 16, bk = 16, key_tiles = (t + bk - 1) / bk;
        const int64_t groups = (rows + bq - 1) / bq, per_group = (groups + caps.max_groups[0] - 1) / std::max<int64_t>(caps.max_groups[0], 1);
        const int64_t iterations = per_group * (d + 4 + key_tiles * (2 * d / 4 + bk / 4 * d + bk * (d / 4 + 1)));
        if (iterations > budget) return too_long("attention of " + std::to_string(rows) + " rows over " + std::to_string(t) + " keys", iterations);
      }
      const int64_t tiles = attention_tiles_per_slice(kd[kd.size() - 3], k.slices);
      const int64_t items = k.pass == 1 ? rows * k.slices : rows;
      const int64_t per_group = (items + caps.max_groups[0] - 1) / std::max<int64_t>(caps.max_groups[0], 1);
      const int64_t iterations = per_group * (k.pass == 1 ? d / 64 + 4 + tiles * 16 : (d / 64 + 2) * (k.slices + 1));
      if (iterations > budget) return too_long("attention over " + std::to_string(k.slices) + " slices of keys", iterations);
    }
    if (k.kind == kernel_kind::matmul || k.kind == kernel_kind::linear) {
      const shape& ad = g[g[k.anchor].inputs[0]].dims;
      const int64_t kd = ad.empty() ? 0 : ad.back();
      if ((kd + 7) / 8 > budget) return too_long("a matmul " + std::to_string(kd) + " deep", (kd + 7) / 8);
    }
  }
  switch (k.kind) {
    case kernel_kind::elementwise: return elementwise(g, p, k, caps);
    case kernel_kind::reduce: return detail::reduction(g, p, k, caps);
    case kernel_kind::matmul: return detail::matmul(g, p, k, caps);
    case kernel_kind::scatter_add: {
      const node& sa = g[k.root];
      const int64_t rows = sa.dims[0], outs = element_count(sa.dims);
      return scatter_by_rows(rows, rows ? outs / rows : 0, element_count(g[sa.inputs[0]].dims)) ? scatter_rows(g, p, k, caps)
                                                                                                 : scatter_elements(g, p, k, caps);
    }
    case kernel_kind::rows: return detail::rows_kernel(g, p, k, caps);
    case kernel_kind::linear:
      if (k.pass == 2) return detail::linear_split_sum(g, p, k, caps);
      if (k.pass == 1) {
        auto slice = detail::linear_coopmat(g, with_root_inline(p, k.root), k, caps);
        if (!slice) return make_error(error_code::internal, "a linear split along k (split_linears) has no tensor-core kernel");
        return *slice;
      }
      return detail::linear(g, p, k, caps);
    case kernel_kind::kv_write: return detail::kv_write(g, p, k, caps);
    case kernel_kind::attention: return detail::attention(g, p, k, caps);
    case kernel_kind::weight_decode: return detail::weight_decode(g, p, k, caps);
  }
  return make_error(error_code::internal, "unknown kernel kind");
}

}  // namespace mesh::gpu
