// The reduction kernels: one-pass reductions over rows, columns or any axes, the two passes of
// a split reduction, and the rows kernels that run several reductions and an elementwise kernel
// over the same rows as one. What the plan decided (layout, split, fusion) is in plan.hpp; this
// file only writes the code.
#include <algorithm>

#include "gpu/glsl_emitter.hpp"
#include "gpu/glsl_kernels.hpp"

namespace mesh::gpu::detail {
namespace {

/// Accumulator init and combine for a reduction.
struct reduction_ops {
  std::string init;
  std::string combine(const std::string& acc, const std::string& v) const {
    if (is_max) return is_int ? "max(" + acc + ", " + v + ")" : "((isnan(" + v + ") || " + v + " > " + acc + ") ? " + v + " : " + acc + ")";
    return acc + " + " + v;
  }
  bool is_max = false, is_int = false;
};

reduction_ops reduction_of(const node& r) {
  reduction_ops ops;
  ops.is_max = r.op == op_kind::reduce_max;
  ops.is_int = r.type == dtype::i32;
  if (!ops.is_max) ops.init = ops.is_int ? "0" : "0.0";
  else ops.init = ops.is_int ? "(-2147483647 - 1)" : "uintBitsToFloat(0xff800000u)";
  return ops;
}

/// Reductions over leading axes (in = [red..., outs...]): 32 neighbouring outputs per workgroup,
/// read coalesced, with the reduced range split over 8 slices of threads and the slices combined
/// in shared memory. One thread per output would leave a GPU nearly idle when outputs are few.
kernel_source column_reduction(const graph& g, const plan& q, const kernel& k, const device_caps& caps, int64_t outs,
                               int64_t red) {
  const node& r = g[k.anchor];
  const node_index x = r.inputs[0];
  const auto ops = reduction_of(r);
  const std::string acc_t = ops.is_int ? "int" : "float";
  emitter e(g, q, false);
  e.bind(k.root);
  std::string inner;
  e.scoped([&] {
    const std::string v = e.value(x, "(o + r * " + u(outs) + ")");
    inner = e.body + "        acc = " + ops.combine("acc", v) + ";\n";
    e.body.clear();
  });
  std::string main;
  main += "  const uint c = gl_LocalInvocationID.x % 32u, sl = gl_LocalInvocationID.x / 32u;\n";
  main += "  for (uint og = gl_WorkGroupID.x * 32u; og < " + u(outs) + "; og += gl_NumWorkGroups.x * 32u) {\n";
  main += "    uint o = og + c;\n    " + acc_t + " acc = " + ops.init + ";\n";
  main += "    if (o < " + u(outs) + ") {\n      for (uint r = sl; r < " + u(red) + "; r += 8u) {\n" + inner + "      }\n    }\n";
  main += "    sh[sl][c] = acc;\n    barrier();\n";
  main += "    if (sl == 0u && o < " + u(outs) + ") {\n";
  main += "      for (uint s = 1u; s < 8u; ++s) acc = " + ops.combine("acc", "sh[s][c]") + ";\n";
  main += epilogue(e, g, k, "o", "acc") + "    }\n    barrier();\n  }\n";
  kernel_source s;
  s.name = "redc_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(outs, 32, caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, false) + "shared " + acc_t + " sh[8][32];\n" +
           prelude + "void main() {\n" + main + "}\n";
  return s;
}

/// Combines every thread's `acc` over the workgroup of `threads` (a power of two; in a fixed
/// order: results are reproducible) and opens a block in which thread 0 holds the result in
/// `acc`; the caller closes it and adds a barrier before `sh` is reused. Needs
/// `shared <acc type> sh[threads]`.
std::string workgroup_combine(const reduction_ops& ops, bool subgroups, uint32_t threads = 256) {
  std::string m;
  if (subgroups) {
    if (ops.is_max && !ops.is_int) {
      // subgroupMax of a NaN is undefined (lavapipe drops it); a float max propagates NaN, as
      // ops.combine and the reference do.
      m += "    const float nan_seen = subgroupMax(isnan(acc) ? 1.0 : 0.0);\n";
      m += "    acc = subgroupMax(isnan(acc) ? uintBitsToFloat(0xff800000u) : acc);\n";
      m += "    if (nan_seen > 0.0) acc = uintBitsToFloat(0x7fc00000u);\n";
    } else {
      m += std::string("    acc = ") + (ops.is_max ? "subgroupMax" : "subgroupAdd") + "(acc);\n";
    }
    m += "    if (gl_SubgroupInvocationID == 0u) sh[gl_SubgroupID] = acc;\n    barrier();\n";
    m += "    if (gl_LocalInvocationID.x == 0u) {\n      acc = " + ops.init +
         ";\n      for (uint s = 0u; s < gl_NumSubgroups; ++s) acc = " + ops.combine("acc", "sh[s]") + ";\n";
  } else {
    m += "    sh[gl_LocalInvocationID.x] = acc;\n    barrier();\n";
    m += "    for (uint s = " + u(threads / 2) + "; s > 0u; s >>= 1) {\n      if (gl_LocalInvocationID.x < s) sh[gl_LocalInvocationID.x] = " +
         ops.combine("sh[gl_LocalInvocationID.x]", "sh[gl_LocalInvocationID.x + s]") + ";\n      barrier();\n    }\n";
    m += "    if (gl_LocalInvocationID.x == 0u) {\n      acc = sh[0];\n";
  }
  return m;
}

/// Offsets into a reduction's input: `base` of output o, `roff` of reduced element r.
struct reduction_offsets {
  std::string base, roff;
};

reduction_offsets offsets_of(const graph& g, node_index anchor, bool trailing) {
  const node& r = g[anchor];
  const shape& xd = g[r.inputs[0]].dims;
  const auto xs = strides_of(xd);
  std::vector<bool> reduced(xd.size(), false);
  for (auto a : r.attrs.axes) reduced[static_cast<size_t>(a)] = true;
  shape kept_dims, red_dims;
  std::vector<int64_t> kept_strides, red_strides;
  for (size_t a = 0; a < xd.size(); ++a) {
    (reduced[a] ? red_dims : kept_dims).push_back(xd[a]);
    (reduced[a] ? red_strides : kept_strides).push_back(xs[a]);
  }
  auto offset = [&](const std::string& idx, const shape& dims, const std::vector<int64_t>& strides) {
    std::vector<std::string> terms;
    for (size_t d = 0; d < dims.size(); ++d)
      if (dims[d] != 1) terms.push_back(emitter::times(emitter::coord(idx, dims, d), strides[d]));
    return emitter::sum_terms(terms);
  };
  if (trailing) return {emitter::times("o", element_count(red_dims)), "r"};
  return {offset("o", kept_dims, kept_strides), offset("r", red_dims, red_strides)};
}

/// The statements that fold the input at reduced index `r` (of output o) into `acc`: the
/// prologue is evaluated inline.
std::string fold_input(emitter& e, const graph& g, const kernel& k, const reduction_ops& ops, const std::string& at,
                       const std::string& indent) {
  std::string inner;
  e.scoped([&] {
    const std::string v = e.value(g[k.anchor].inputs[0], at);
    inner = e.body + indent + "acc = " + ops.combine("acc", v) + ";\n";
    e.body.clear();
  });
  return inner;
}

/// Pass 1 of a split reduction: workgroup (o, s) folds slice s of output o's range (prologue
/// inline) into partial[o * slices + s] (rows) or partial[s * outputs + o] (columns: 32 outputs x
/// 8 interleaved sub-slices per workgroup, as in `redc`). No epilogue: pass 2 applies it.
kernel_source split_pass1(const graph& g, const plan& q, const kernel& k, const device_caps& caps, const reduction_layout& l) {
  const auto ops = reduction_of(g[k.anchor]);
  const std::string acc_t = ops.is_int ? "int" : "float";
  const int64_t len = slice_length(l.reduced, k.slices);
  emitter e(g, q, false);
  e.bind(scratch_id(g, k.scratch));  // binding 0: written
  const bool cols = l.columns(), subgroups = !cols && caps.subgroup_arithmetic;
  std::string main = "  for (uint s = gl_WorkGroupID.y; s < " + u(k.slices) + "; s += gl_NumWorkGroups.y) {\n";
  main += "  const uint r_begin = s * " + u(len) + ", r_end = min(r_begin + " + u(len) + ", " + u(l.reduced) + ");\n";
  std::string shared;
  if (cols) {
    shared = "shared " + acc_t + " sh[8][32];\n";
    const std::string inner = fold_input(e, g, k, ops, "(o + r * " + u(l.outputs) + ")", "        ");
    main += "  const uint c = gl_LocalInvocationID.x % 32u, sl = gl_LocalInvocationID.x / 32u;\n";
    main += "  for (uint og = gl_WorkGroupID.x * 32u; og < " + u(l.outputs) + "; og += gl_NumWorkGroups.x * 32u) {\n";
    main += "    uint o = og + c;\n    " + acc_t + " acc = " + ops.init + ";\n";
    main += "    if (o < " + u(l.outputs) + ") {\n      for (uint r = r_begin + sl; r < r_end; r += 8u) {\n" + inner +
            "      }\n    }\n";
    main += "    sh[sl][c] = acc;\n    barrier();\n    if (sl == 0u && o < " + u(l.outputs) + ") {\n";
    main += "      for (uint t = 1u; t < 8u; ++t) acc = " + ops.combine("acc", "sh[t][c]") + ";\n";
    main += "      b0.v[s * " + u(l.outputs) + " + o] = acc;\n    }\n    barrier();\n  }\n";
  } else {
    shared = "shared " + acc_t + " sh[256];\n";
    const auto off = offsets_of(g, k.anchor, l.trailing);
    const std::string inner = fold_input(e, g, k, ops, "(base + " + off.roff + ")", "    ");
    main += "  for (uint o = gl_WorkGroupID.x; o < " + u(l.outputs) + "; o += gl_NumWorkGroups.x) {\n";
    main += "    uint base = " + off.base + ";\n    " + acc_t + " acc = " + ops.init + ";\n";
    main += "    for (uint r = r_begin + gl_LocalInvocationID.x; r < r_end; r += 256u) {\n" + inner + "    }\n";
    main += workgroup_combine(ops, subgroups);
    main += "      b0.v[o * " + u(k.slices) + " + s] = acc;\n    }\n    barrier();\n  }\n";
  }
  main += "  }\n";
  kernel_source src;
  src.name = std::string(cols ? "redcs1_" : "reds1_") + std::to_string(k.root);
  src.bindings = e.bindings;
  const int64_t x_groups = cols ? (l.outputs + 31) / 32 : l.outputs;
  src.groups = {static_cast<uint32_t>(std::clamp<int64_t>(x_groups, 1, caps.max_groups[0])),
                static_cast<uint32_t>(std::clamp<int64_t>(k.slices, 1, caps.max_groups[1])), 1};
  src.bytes = bytes_of(g, src.bindings) + static_cast<uint64_t>(k.slices * l.outputs) * 4;
  src.glsl = header(g, src.bindings, subgroups, 256) + split_decls(g, q, k, src.bindings) + shared + prelude +
             "void main() {\n" + main + "}\n";
  return src;
}

/// Pass 2 of a split reduction: combines each output's partials in slice order (a workgroup per
/// output for rows, a thread per output for columns: reads coalesced either way) and applies the
/// epilogue.
kernel_source split_pass2(const graph& g, const plan& q, const kernel& k, const device_caps& caps, const reduction_layout& l) {
  const auto ops = reduction_of(g[k.anchor]);
  const std::string acc_t = ops.is_int ? "int" : "float";
  emitter e(g, q, false);
  e.bind(k.root);
  const std::string part = "b" + std::to_string(e.bind(scratch_id(g, k.scratch))) + ".v";
  const bool cols = l.columns(), subgroups = !cols && caps.subgroup_arithmetic;
  std::string main, shared;
  if (cols) {
    main += "  for (uint o = gl_GlobalInvocationID.x; o < " + u(l.outputs) + "; o += gl_NumWorkGroups.x * 256u) {\n";
    main += "    " + acc_t + " acc = " + ops.init + ";\n";
    main += "    for (uint s = 0u; s < " + u(k.slices) + "; ++s) acc = " +
            ops.combine("acc", part + "[s * " + u(l.outputs) + " + o]") + ";\n";
    main += epilogue(e, g, k, "o", "acc") + "  }\n";
  } else {
    shared = "shared " + acc_t + " sh[256];\n";
    main += "  for (uint o = gl_WorkGroupID.x; o < " + u(l.outputs) + "; o += gl_NumWorkGroups.x) {\n";
    main += "    " + acc_t + " acc = " + ops.init + ";\n";
    main += "    for (uint s = gl_LocalInvocationID.x; s < " + u(k.slices) + "; s += 256u) acc = " +
            ops.combine("acc", part + "[o * " + u(k.slices) + " + s]") + ";\n";
    main += workgroup_combine(ops, subgroups);
    main += epilogue(e, g, k, "o", "acc") + "    }\n    barrier();\n  }\n";
  }
  kernel_source src;
  src.name = std::string(cols ? "redcs2_" : "reds2_") + std::to_string(k.root);
  src.bindings = e.bindings;
  src.groups = {cols ? groups_for(l.outputs, 256, caps.max_groups[0])
                     : static_cast<uint32_t>(std::clamp<int64_t>(l.outputs, 1, caps.max_groups[0])),
                1, 1};
  src.bytes = bytes_of(g, src.bindings) + static_cast<uint64_t>(k.slices * l.outputs) * 4;
  src.glsl = header(g, src.bindings, subgroups, 256) + split_decls(g, q, k, src.bindings) + shared + prelude +
             "void main() {\n" + main + "}\n";
  return src;
}

/// The storage buffer of a split reduction's partials (binding b; written by pass 1).
std::string scratch_decl(const plan& p, const kernel& k, size_t b) {
  const bool is_int = p.scratch[static_cast<size_t>(k.scratch)].type == dtype::i32;
  return "layout(std430, binding = " + std::to_string(b) + ") " + (b == 0 ? "" : "readonly ") + "restrict buffer B" +
         std::to_string(b) + " { " + (is_int ? "int" : "float") + " v[]; } b" + std::to_string(b) + ";\n";
}

}  // namespace

/// Buffer declarations of a two-pass kernel: graph nodes and its scratch buffer.
std::string split_decls(const graph& g, const plan& p, const kernel& k, const std::vector<node_index>& bindings) {
  std::string s;
  for (size_t b = 0; b < bindings.size(); ++b)
    s += bindings[b] < g.size() ? buffer_decl(g, bindings[b], b, false) : scratch_decl(p, k, b);
  return s;
}


kernel_source reduction(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  if (k.pass == 1) return split_pass1(g, q, k, caps, layout_of(g, k.anchor));
  if (k.pass == 2) return split_pass2(g, q, k, caps, layout_of(g, k.anchor));
  // The plan's split decision reads the same layout (reduction_layout::columns / per_group).
  const reduction_layout l = layout_of(g, k.anchor);
  const int64_t outs = l.outputs, red = l.reduced;
  if (l.columns()) return column_reduction(g, q, k, caps, outs, red);
  const bool per_group = l.per_group();

  emitter e(g, q, false);
  e.bind(k.root);
  const auto off = offsets_of(g, k.anchor, l.trailing);
  const auto ops = reduction_of(g[k.anchor]);
  const std::string acc_t = ops.is_int ? "int" : "float";
  const std::string inner = fold_input(e, g, k, ops, "(base + " + off.roff + ")", "    ");
  std::string main;
  const std::string loop_o = per_group ? "for (uint o = gl_WorkGroupID.x; o < " + u(outs) + "; o += gl_NumWorkGroups.x)"
                                       : "for (uint o = gl_GlobalInvocationID.x; o < " + u(outs) +
                                             "; o += gl_NumWorkGroups.x * 256u)";
  main += "  " + loop_o + " {\n    uint base = " + off.base + ";\n    " + acc_t + " acc = " + ops.init + ";\n";
  main += per_group ? "    for (uint r = gl_LocalInvocationID.x; r < " + u(red) + "; r += 256u) {\n"
                    : "    for (uint r = 0u; r < " + u(red) + "; ++r) {\n";
  main += inner + "    }\n";
  const bool subgroups = per_group && caps.subgroup_arithmetic;
  std::string shared;
  if (per_group) {
    shared = "shared " + acc_t + " sh[256];\n";
    main += workgroup_combine(ops, subgroups);
    main += epilogue(e, g, k, "o", "acc") + "    }\n    barrier();\n";
  } else {
    main += epilogue(e, g, k, "o", "acc");
  }
  main += "  }\n";

  kernel_source s;
  s.name = std::string(per_group ? "redg_" : "redt_") + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {per_group ? static_cast<uint32_t>(std::clamp<int64_t>(outs, 1, caps.max_groups[0]))
                        : groups_for(outs, 256, caps.max_groups[0]),
              1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, subgroups, 256) + buffer_decls(g, s.bindings, false) + shared + prelude +
           "void main() {\n" + main + "}\n";
  return s;
}

/// A kernel_kind::rows kernel: one workgroup per row (grid-stride over rows). For each row, every
/// reduction member folds the row (its prologue inline) and combines it over the workgroup;
/// thread 0 applies the member's epilogue, stores its result and shares it through shared
/// memory, and later members use that register value wherever they read the result (the plan
/// checked they read it only at their own row). The elementwise member, if any, then writes the
/// row. A row is read from memory once; its later passes hit the cache.
kernel_source rows_kernel(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  plan q = p;
  for (const auto& m : k.members) q.materialised[m.root] = false;  // computed here, never loaded
  const shape& rows = g[g[k.members.front().anchor].inputs[0]].dims;
  const int64_t len = rows.back(), count = element_count(rows) / len;
  uint32_t threads = 64;  // a power of two, up to 256, near the row length
  while (threads < 256 && threads < len) threads *= 2;
  const bool subgroups = caps.subgroup_arithmetic;
  emitter e(g, q, false);
  for (const auto& m : k.members) e.bind(m.root);
  const std::string t = u(threads);
  // A short row (a decode step's RMSNorm: 2,048 elements, 8 per thread) unrolled: its loads are
  // in flight together instead of one memory latency after another.
  const std::string unroll = caps.unroll_loops && (len + threads - 1) / threads <= 16 ? "[[unroll]] " : "";
  std::string main = "  const uint lid = gl_LocalInvocationID.x;\n";
  main += "  for (uint o = gl_WorkGroupID.x; o < " + u(count) + "; o += gl_NumWorkGroups.x) {\n";
  main += "    const uint base = o * " + u(len) + ";\n";
  size_t results = 0;
  for (const auto& m : k.members) {
    if (m.kind == kernel_kind::elementwise) {
      std::string body;
      e.scoped([&] {
        const std::string v = e.value(m.root, "i");
        body = e.body + e.store(m.root, "i", v);
        e.body.clear();
      });
      main += "    " + unroll + "for (uint r = lid; r < " + u(len) + "; r += " + t + ") {\n      const uint i = base + r;\n" + body + "    }\n";
      continue;
    }
    const auto ops = reduction_of(g[m.anchor]);
    main += "    {\n    float acc = " + ops.init + ";\n";
    main += "    " + unroll + "for (uint r = lid; r < " + u(len) + "; r += " + t + ") {\n" + fold_input(e, g, m, ops, "(base + r)", "      ") +
            "    }\n";
    main += workgroup_combine(ops, subgroups, threads);
    const std::string slot = "shv[" + std::to_string(results) + "]";
    std::string v;
    main += epilogue(e, g, m, "o", "acc", &v) + "      " + slot + " = " + v + ";\n";
    main += "    }\n    barrier();\n    }\n";
    const std::string var = "rv" + std::to_string(results++);
    main += "    const float " + var + " = " + slot + ";\n";
    e.fix(m.root, var);
  }
  main += "    barrier();  // sh and shv are rewritten for the next row\n  }\n";

  kernel_source s;
  s.name = "rows" + std::to_string(k.members.size()) + "_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.writes = k.members.size();
  s.groups = {static_cast<uint32_t>(std::clamp<int64_t>(count, 1, caps.max_groups[0])), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, subgroups, threads) + buffer_decls(g, s.bindings, false, SIZE_MAX, 0, s.writes) +
           "shared float sh[" + t + "];\nshared float shv[" + std::to_string(std::max<size_t>(results, 1)) + "];\n" +
           prelude + "void main() {\n" + main + "}\n";
  return s;
}

}  // namespace mesh::gpu::detail
