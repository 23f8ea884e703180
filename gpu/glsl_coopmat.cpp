// The f16 matmul kernels on tensor cores (GL_NV_cooperative_matrix 16x16x16, f32 accumulation):
// the tiled `mmct*` kernel and the first one, `mmcoop`, kept for shapes the tiled one does not take.
// matmul() (glsl_matmul.cpp) tries them first; block shapes come from matmul_schedule.hpp.
#include <algorithm>

#include "gpu/glsl_emitter.hpp"
#include "gpu/glsl_kernels.hpp"
#include "gpu/matmul_schedule.hpp"

namespace mesh::gpu::detail {

std::string coopmat_header(int64_t threads) {
  return "#version 450\n#extension GL_EXT_shader_16bit_storage : require\n"
         "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n"
         "#extension GL_NV_cooperative_matrix : require\n#extension GL_KHR_memory_scope_semantics : require\n"
         "#extension GL_KHR_shader_subgroup_basic : require\n#extension GL_EXT_control_flow_attributes : require\n"
         "layout(local_size_x = " + std::to_string(threads) + ") in;\n";
}

std::string rewrite_note(const kernel_source& s) {
  if (s.bf16_matrices) return "// SPIR-V rewritten: KHR cooperative matrices on bf16 fragments (spirv_coopmat.hpp)\n";
  if (s.khr_matrices) return "// SPIR-V rewritten: KHR cooperative matrices (spirv_coopmat.hpp)\n";
  return "";
}

/// The first f16 matmul on tensor cores through GL_NV_cooperative_matrix, kept for shapes the
/// tiled one does not take (k or n not a multiple of 8) and kernel_variants::coopmat "64": 64x64 block tiles
/// staged in shared memory (f16vec2 loads), four subgroups each multiplying 2x2 fragments of 16x16x16 with
/// f32 accumulation, then the accumulators go through shared memory so the epilogue runs per
/// element like everywhere else. nullopt when it does not apply.
std::optional<kernel_source> matmul_coopmat(const graph& g, const plan& q, const kernel& k, const device_caps& caps) {
  const node& mm = g[k.anchor];
  const node_index a = mm.inputs[0], b = mm.inputs[1];
  const shape& ad = g[a].dims;
  const size_t rank = ad.size();
  const int64_t m = ad[rank - 2], kd = ad[rank - 1], n = mm.dims[rank - 1];
  const int64_t batch = m * n != 0 ? element_count(mm.dims) / (m * n) : 0;
  if (!caps.coopmat_f16 || !q.materialised[a] || !q.materialised[b] || a == b) return std::nullopt;
  if (g[a].type != dtype::f16 || g[b].type != dtype::f16 || kd % 2 != 0 || n % 2 != 0 || kd == 0 || batch == 0)
    return std::nullopt;
  std::vector<node_index> epi;
  inline_nodes(g, q, k.root, k.anchor, epi);
  if (std::count(epi.begin(), epi.end(), a) || std::count(epi.begin(), epi.end(), b)) return std::nullopt;

  emitter e(g, q, false);
  e.bind(k.root);
  e.bind(a);
  e.bind(b);
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "Cs[li]"); });
  const std::string frag16 = "fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>", frag32 = "fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>";
  std::string decl;
  for (size_t i = 0; i < e.bindings.size(); ++i)
    decl += i == 1 || i == 2 ? "layout(std430, binding = " + std::to_string(i) + ") readonly restrict buffer B" +
                                   std::to_string(i) + " { f16vec2 v[]; } b" + std::to_string(i) + ";\n"
                             : buffer_decl(g, e.bindings[i], i, false);
  std::string src;
  src += "shared float16_t As[64 * 40];\nshared float16_t Bs[32 * 72];\nshared float Cs[64 * 64];\n";
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, warp = gl_SubgroupID, wm = warp / 2u, wn = warp % 2u;\n";
  src += "  for (uint bz = gl_WorkGroupID.z; bz < " + u(batch) + "; bz += gl_NumWorkGroups.z)\n";
  src += "  for (uint by = gl_WorkGroupID.y; by < " + u((m + 63) / 64) + "; by += gl_NumWorkGroups.y)\n";
  src += "  for (uint bx = gl_WorkGroupID.x; bx < " + u((n + 63) / 64) + "; bx += gl_NumWorkGroups.x) {\n";
  src += "    const uint m0 = by * 64u, n0 = bx * 64u;\n";
  src += "    " + frag32 + " acc[2][2];\n";
  src += "    [[unroll]] for (uint i = 0u; i < 2u; ++i) [[unroll]] for (uint j = 0u; j < 2u; ++j) acc[i][j] = " + frag32 + "(0.0);\n";
  src += "    for (uint k0 = 0u; k0 < " + u(kd) + "; k0 += 32u) {\n";
  src += "      [[unroll]] for (uint l = 0u; l < 8u; ++l) {\n";
  src += "        uint el = tid + l * 128u, r = el / 16u, c = el % 16u, gm = m0 + r, gk = k0 + c * 2u;\n";
  src += "        f16vec2 v = (gm < " + u(m) + " && gk < " + u(kd) + ") ? b1.v[(bz * " + u(m * kd) + " + gm * " + u(kd) +
         " + gk) >> 1] : f16vec2(0.0);\n";
  src += "        As[r * 40u + c * 2u] = v.x;\n        As[r * 40u + c * 2u + 1u] = v.y;\n      }\n";
  src += "      [[unroll]] for (uint l = 0u; l < 8u; ++l) {\n";
  src += "        uint el = tid + l * 128u, r = el / 32u, c = el % 32u, gk = k0 + r, gn = n0 + c * 2u;\n";
  src += "        f16vec2 v = (gk < " + u(kd) + " && gn < " + u(n) + ") ? b2.v[(bz * " + u(kd * n) + " + gk * " + u(n) +
         " + gn) >> 1] : f16vec2(0.0);\n";
  src += "        Bs[r * 72u + c * 2u] = v.x;\n        Bs[r * 72u + c * 2u + 1u] = v.y;\n      }\n";
  src += "      barrier();\n";
  src += "      [[unroll]] for (uint kk = 0u; kk < 32u; kk += 16u) {\n";
  src += "        " + frag16 + " fa[2];\n        " + frag16 + " fb[2];\n";
  src += "        [[unroll]] for (uint i = 0u; i < 2u; ++i) coopMatLoadNV(fa[i], As, (wm * 32u + i * 16u) * 40u + kk, 40u, false);\n";
  src += "        [[unroll]] for (uint j = 0u; j < 2u; ++j) coopMatLoadNV(fb[j], Bs, kk * 72u + wn * 32u + j * 16u, 72u, false);\n";
  src += "        [[unroll]] for (uint i = 0u; i < 2u; ++i) [[unroll]] for (uint j = 0u; j < 2u; ++j) acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);\n";
  src += "      }\n      barrier();\n    }\n";
  src += "    [[unroll]] for (uint i = 0u; i < 2u; ++i) [[unroll]] for (uint j = 0u; j < 2u; ++j)\n";
  src += "      coopMatStoreNV(acc[i][j], Cs, (wm * 32u + i * 16u) * 64u + wn * 32u + j * 16u, 64u, false);\n";
  src += "    barrier();\n";
  src += "    for (uint li = tid; li < 4096u; li += 128u) {\n";
  src += "      uint gm = m0 + li / 64u, gn = n0 + li % 64u;\n";
  src += "      if (gm >= " + u(m) + " || gn >= " + u(n) + ") continue;\n";
  src += "      uint ci = bz * " + u(m * n) + " + gm * " + u(n) + " + gn;\n";
  src += store + "    }\n    barrier();\n  }\n}\n";

  kernel_source s;
  s.name = "mmcoop_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(n, 64, caps.max_groups[0]), groups_for(m, 64, caps.max_groups[1]), groups_for(batch, 1, caps.max_groups[2])};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kd);
  s.glsl = coopmat_header(128) + decl + prelude + src;
  return s;
}

/// f16 matmul on tensor cores (GL_NV_cooperative_matrix 16x16x16, f32 accumulation), and bf16 on
/// devices with KHR bf16 cooperative matrices (the same kernel, kernel_source::bf16_matrices), with
/// 128-bit loads: operands bound as uvec4 arrays (k and n multiples of 8), tiles copied to shared
/// memory a uvec4 per thread and access, two shared stages with the next tile held in registers
/// while the current one is multiplied (one barrier per tile), fragments loaded from shared memory
/// with a padded stride. Each subgroup stages one accumulator fragment at a time in shared memory
/// so that the epilogue runs per element like everywhere else. nullopt when it does not apply.
std::optional<kernel_source> matmul_coopmat_tiled(const graph& g, const plan& q, const kernel& k, const device_caps& caps) {
  const mm_dims d = dims_of(g, k);
  const auto av = direct_operand(g, q, d.a), bv = direct_operand(g, q, d.b);
  if (!caps.coopmat_f16 || caps.variants.coopmat == "64" || !av || !bv) return std::nullopt;
  // bf16 operands: the same kernel on bf16 fragments (its SPIR-V rewritten, spirv_coopmat.hpp);
  // the operands are only copied as raw 16-bit words, never computed with, on their way there.
  const dtype at = g[av->id].type, bt = g[bv->id].type;
  const bool bf = caps.coopmat_bf16 && at == dtype::bf16 && bt == dtype::bf16;
  if (((at != dtype::f16 || bt != dtype::f16) && !bf) || d.kd % 8 != 0 || d.n % 8 != 0 || d.kd == 0 || d.batch == 0)
    return std::nullopt;
  if (read_elsewhere(g, q, k, av->id, d.b) || read_elsewhere(g, q, k, bv->id, d.a)) return std::nullopt;
  const auto tile = pick_coop_tile(d, caps);
  if (!tile) return std::nullopt;
  const coop_tile t = *tile;
  const int64_t m = d.m, n = d.n, kd = d.kd, bm = t.bm(), bn = t.bn(), bk = t.bk, as = t.a_stride(), bs = t.b_stride();
  const int64_t threads = t.threads();

  emitter e(g, q, false);
  e.bind(k.root);
  e.bind(av->id);
  e.bind(bv->id);
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "Cs[sg * 256u + li]"); });
  // Without an epilogue the f16 result of a whole tile goes from the accumulators to memory
  // directly (converted to f16 fragments: the same rounding as the per-element path), through a
  // float16_t view of binding 0 (two views of one buffer, so neither is `restrict`). Not for bf16,
  // whose f32 accumulators would need bf16 accumulator matrices, which devices need not offer.
  const bool direct = k.root == k.anchor && g[k.root].type == dtype::f16 && !bf;
  std::string decl;
  for (size_t i = 0; i < e.bindings.size(); ++i) {
    if (i == 1 || i == 2)
      decl += "layout(std430, binding = " + std::to_string(i) + ") readonly restrict buffer B" + std::to_string(i) +
              " { uvec4 v[]; } b" + std::to_string(i) + ";\n";
    else if (i == 0 && direct)
      decl += "layout(std430, binding = 0) buffer B0 { uint16_t v[]; } b0;\n"
              "layout(std430, binding = 0) buffer B0h { float16_t v[]; } c16;\n";
    else
      decl += buffer_decl(g, e.bindings[i], i, false);
  }

  const std::string frag16 = "fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>", frag32 = "fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>";
  const auto loop = [](const char* var, int64_t count) {
    return std::string("[[unroll]] for (uint ") + var + " = 0u; " + var + " < " + u(count) + "; ++" + var + ") ";
  };
  const int64_t a_items = bm * bk / 8, b_items = bk * bn / 8;
  const int64_t a_per = (a_items + threads - 1) / threads, b_per = (b_items + threads - 1) / threads;
  const auto guard = [&](int64_t items) { return items % threads == 0 ? std::string() : "el < " + u(items) + " && "; };
  auto fetch = [&](const std::string& kb) {
    std::string f;
    f += "      " + loop("l", a_per) + "{\n        uint el = tid + l * " + u(threads) + ", gm = m0 + el / " + u(bk / 8) +
         ", gk = " + kb + " + (el % " + u(bk / 8) + ") * 8u;\n";
    f += "        ga[l] = (" + guard(a_items) + "gm < " + u(m) + " && gk < " + u(kd) + ") ? b1.v[(bz * " + u(av->batch_stride) +
         " + gm * " + u(kd) + " + gk) >> 3] : uvec4(0u);\n      }\n";
    f += "      " + loop("l", b_per) + "{\n        uint el = tid + l * " + u(threads) + ", gk = " + kb + " + el / " +
         u(bn / 8) + ", gn = n0 + (el % " + u(bn / 8) + ") * 8u;\n";
    f += "        gb[l] = (" + guard(b_items) + "gk < " + u(kd) + " && gn < " + u(n) + ") ? b2.v[(bz * " + u(bv->batch_stride) +
         " + gk * " + u(n) + " + gn) >> 3] : uvec4(0u);\n      }\n";
    return f;
  };
  auto stash = [&](const std::string& stage) {
    const std::string ga = guard(a_items), gb = guard(b_items);
    std::string s;
    s += "      " + loop("l", a_per) + "{\n        uint el = tid + l * " + u(threads) + ";\n        " +
         (ga.empty() ? "" : "if (el < " + u(a_items) + ") ") + "As[(" + stage + ") * " + u(bm * as) + " + (el / " +
         u(bk / 8) + ") * " + u(as) + " + el % " + u(bk / 8) + "] = ga[l];\n      }\n";
    s += "      " + loop("l", b_per) + "{\n        uint el = tid + l * " + u(threads) + ";\n        " +
         (gb.empty() ? "" : "if (el < " + u(b_items) + ") ") + "Bs[(" + stage + ") * " + u(bk * bs) + " + (el / " +
         u(bn / 8) + ") * " + u(bs) + " + el % " + u(bn / 8) + "] = gb[l];\n      }\n";
    return s;
  };

  const int64_t tiles = (kd + bk - 1) / bk;
  std::string src;
  // One k tile multiplied from shared stage `stage`: per 16-deep step, each subgroup loads its
  // A and B fragments, then multiplies every pair.
  auto math = [&](const std::string& stage) {
    std::string m_;
    m_ += "      " + loop("kk", bk / 16) + "{\n        " + frag16 + " fa[" + std::to_string(t.fm) + "], fb[" + std::to_string(t.fn) + "];\n";
    m_ += "        " + loop("i", t.fm) + "coopMatLoadNV(fa[i], As, (" + stage + ") * " + u(bm * as) + " + (wm * " +
          u(t.fm * 16) + " + i * 16u) * " + u(as) + " + kk * 2u, " + u(as) + ", false);\n";
    m_ += "        " + loop("j", t.fn) + "coopMatLoadNV(fb[j], Bs, (" + stage + ") * " + u(bk * bs) + " + kk * " + u(16 * bs) +
          " + wn * " + u(t.fn * 2) + " + j * 2u, " + u(bs) + ", false);\n";
    m_ += "        " + loop("i", t.fm) + loop("j", t.fn) + "acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);\n      }\n";
    return m_;
  };

  src += "shared uvec4 As[" + std::to_string(2 * bm * as) + "];\nshared uvec4 Bs[" + std::to_string(2 * bk * bs) + "];\n";
  src += "shared float Cs[" + std::to_string(t.sgm * t.sgn * 256) + "];\n";
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;\n";
  src += "  const uint wm = sg / " + u(t.sgn) + ", wn = sg % " + u(t.sgn) + ";\n";
  src += tile_loops(d.batch, m, n, bm, bn, caps.variants.gemm_swizzle);
  src += "    " + frag32 + " acc[" + std::to_string(t.fm) + "][" + std::to_string(t.fn) + "];\n";
  src += "    " + loop("i", t.fm) + loop("j", t.fn) + "acc[i][j] = " + frag32 + "(0.0);\n";
  src += "    uvec4 ga[" + std::to_string(a_per) + "], gb[" + std::to_string(b_per) + "];\n";
  // The last tile is peeled off the loop so that its body (fetch tile t + 1 into registers,
  // multiply tile t, store the registers into the other stage, one barrier) has no branches:
  // measured 2-3% faster on the H100 than guarding the fetch and the store inside the loop.
  src += "    {\n" + fetch("0u") + stash("0u") + "    }\n    barrier();\n";
  src += "    for (uint t = 0u; t < " + u(tiles - 1) + "; ++t) {\n      const uint cur = t & 1u;\n      {\n" +
         fetch("(t + 1u) * " + u(bk)) + "      }\n" + math("cur") + stash("cur ^ 1u") + "      barrier();\n    }\n";
  src += math(u(tiles - 1) + " & 1u");
  if (direct) {
    const std::string full = (m % bm == 0 && n % bn == 0) ? "true" : "m0 + " + u(bm) + " <= " + u(m) + " && n0 + " + u(bn) + " <= " + u(n);
    src += "    if (" + full + ") {\n      " + loop("i", t.fm) + loop("j", t.fn) + "{\n";
    src += "        " + frag16 + " h = " + frag16 + "(acc[i][j]);\n";
    src += "        coopMatStoreNV(h, c16.v, bz * " + u(m * n) + " + (m0 + wm * " + u(t.fm * 16) + " + i * 16u) * " + u(n) +
           " + n0 + wn * " + u(t.fn * 16) + " + j * 16u, " + u(n) + ", false);\n      }\n      continue;\n    }\n";
  }
  src += "    " + loop("i", t.fm) + loop("j", t.fn) + "{\n";
  src += "      coopMatStoreNV(acc[i][j], Cs, sg * 256u, 16u, false);\n      subgroupMemoryBarrierShared();\n      subgroupBarrier();\n";
  src += "      " + loop("r", 8) + "{\n        uint li = lane + r * 32u, gm = m0 + wm * " + u(t.fm * 16) +
         " + i * 16u + li / 16u, gn = n0 + wn * " + u(t.fn * 16) + " + j * 16u + li % 16u;\n";
  src += "        if (gm < " + u(m) + " && gn < " + u(n) + ") {\n          uint ci = bz * " + u(m * n) + " + gm * " + u(n) +
         " + gn;\n" + store + "        }\n      }\n      subgroupMemoryBarrierShared();\n      subgroupBarrier();\n    }\n  }\n}\n";

  kernel_source s;
  s.name = "mmct" + std::to_string(bm) + "x" + std::to_string(bn) + "s" + std::to_string(t.sgm * t.sgn) +
           (bk == 32 ? "" : "k" + std::to_string(bk)) + (bf ? "_bf16_" : "_") + std::to_string(k.root);
  s.bf16_matrices = bf;
  s.khr_matrices = caps.coopmat_khr;
  s.bindings = e.bindings;
  s.groups = {groups_for(n, bn, caps.max_groups[0]), groups_for(m, bm, caps.max_groups[1]), groups_for(d.batch, 1, caps.max_groups[2])};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = d.flops();
  s.glsl = rewrite_note(s) + coopmat_header(threads) + decl + prelude + src;
  return s;
}

}  // namespace mesh::gpu::detail
