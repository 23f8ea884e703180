// `mmctl`: a prompt-sized linear (x [rows, k] times a weight [n, k] read transposed) on tensor
// cores. The tiled cooperative-matrix kernel (glsl_coopmat.cpp) reads both operands as f16
// buffers; a linear's weight is quantized, f16 or bf16 and stored row by row along k, and its x
// is usually f32. Here both are converted while they are staged: each thread reads a 32-element
// chunk of one weight row (quantized: decoded in registers by the dtype's chunk decoder,
// glsl_quant.cpp; f16 and bf16: four 16-byte loads), rounds it to f16 and stores it as a row of the shared
// B tile, which is laid out [n][k] and loaded as column-major fragments; x is read as vec4s (f32)
// or uvec4s (f16) and rounded to f16 on its way to the shared A tile. bf16 x with a bf16 weight,
// on a device with bf16 cooperative matrices, is staged as it is into bf16 fragments instead
// (kernel_source::bf16_matrices). Accumulation is f32, the
// epilogue runs per element as in every matmul. Rounding x and the weight to f16 is what
// llama.cpp's CUDA back end does for its cuBLAS path too; values beyond f16's range (65504)
// become infinite, which kernel_variants::linear "f32" avoids.
//
// Split k (split_linears): a product of an f16 or bf16 weight whose tiles leave a GPU
// under-filled (the o and down projections of a prompt: 512 x 2048 outputs are 256 tiles of
// 64 x 64) runs as two kernels.
// Pass 1 is this kernel with a third grid dimension: workgroup z takes slice z of the k tiles
// and stores its raw f32 sums into a scratch buffer [slices, m, n]; pass 2 (`mmctls2`) adds
// each output's slices in slice order (deterministic, no atomics) and runs the epilogue.
#include <algorithm>

#include "gpu/glsl_emitter.hpp"
#include "gpu/glsl_kernels.hpp"
#include "gpu/matmul_schedule.hpp"
#include "graph/quant.hpp"

namespace mesh::gpu::detail {

std::optional<kernel_source> linear_coopmat(const graph& g, const plan& q, const kernel& k, const device_caps& caps) {
  if (!caps.coopmat_f16 || caps.variants.linear == "f32" || caps.variants.coopmat == "64") return std::nullopt;
  const bool pass1 = k.pass == 1;  // a slice of k into the scratch buffer (split_linears)
  const mm_dims d = dims_of(g, k);
  const node_index w = d.b;
  // A weight decoded before the product (predecode_linears) is read as f16 from its scratch buffer.
  const bool decoded = k.weight >= 0;
  const dtype wt = decoded ? dtype::f16 : g[w].type;
  // x from the buffer a chain of reshapes views (the same flat index), f32 or f16.
  const node_index x = behind_reshapes(g, q, d.a);
  const dtype xt = g[x].type;
  // bf16 x and a bf16 weight on a device with bf16 cooperative matrices: both staged as they are
  // (raw 16-bit words) into bf16 fragments (kernel_source::bf16_matrices), no rounding to f16.
  const bool bf = caps.coopmat_bf16 && xt == dtype::bf16 && wt == dtype::bf16;
  if (!q.materialised[x] || !q.materialised[w] || (xt != dtype::f32 && xt != dtype::f16 && !bf)) return std::nullopt;
  const bool quant = is_quantized(wt);
  if (quant ? quant_chunk_decoder(wt, "b").empty() : wt != dtype::f16 && wt != dtype::bf16) return std::nullopt;
  if (d.m <= matvec_max_rows || d.kd % 8 != 0 || d.kd == 0 || d.n == 0) return std::nullopt;
  if (read_elsewhere(g, q, k, x, w) || read_elsewhere(g, q, k, w, d.a)) return std::nullopt;
  auto tile = pick_coop_tile(d, caps);
  if (!tile) return std::nullopt;
  coop_tile t = *tile;
  t.bk = 32;  // one 32-element chunk of a weight row per thread and tile
  const int64_t m = d.m, n = d.n, kd = d.kd, bm = t.bm(), bn = t.bn(), bk = t.bk, rs = bk / 8 + 1;  // uvec4 per shared row
  const int64_t threads = t.threads();
  if (16 * 2 * (bm + bn) * rs + t.sgm * t.sgn * 256 * 4 > static_cast<int64_t>(caps.shared_memory_bytes)) return std::nullopt;

  const int64_t tiles = (kd + bk - 1) / bk, slices = pass1 ? k.slices : 1;
  if (pass1 && (slices < 2 || tiles % slices != 0)) return std::nullopt;
  const int64_t slice_tiles = tiles / slices;

  emitter e(g, q, false);
  e.bind(pass1 ? scratch_id(g, k.scratch) : k.root);
  const int xb = e.bind(x), wb = e.bind(decoded ? scratch_id(g, k.weight) : w);
  std::string store;
  if (pass1)
    store = "          b0.v[bz * " + u(m * n) + " + ci] = Cs[sg * 256u + li];\n";
  else
    e.scoped([&] { store = epilogue(e, g, k, "ci", "Cs[sg * 256u + li]"); });
  std::string decl;
  for (size_t i = 0; i < e.bindings.size(); ++i) {
    const std::string b = std::to_string(i);
    if (pass1 && i == 0)
      decl += "layout(std430, binding = 0) restrict buffer B0 { float v[]; } b0;\n";
    else if (static_cast<int>(i) == xb)
      decl += "layout(std430, binding = " + b + ") readonly restrict buffer B" + b + " { " + (xt == dtype::f32 ? "vec4" : "uvec4") +
              " v[]; } b" + b + ";\n";
    else if (static_cast<int>(i) == wb && !quant)
      decl += "layout(std430, binding = " + b + ") readonly restrict buffer B" + b + " { uvec4 v[]; } b" + b + ";\n";
    else
      decl += buffer_decl(g, e.bindings[i], i, false);  // a quantized weight brings its decoders
  }
  const std::string X = "b" + std::to_string(xb), W = "b" + std::to_string(wb);

  const std::string frag16 = "fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>", frag32 = "fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>";
  const auto loop = [](const char* var, int64_t count) {
    return std::string("[[unroll]] for (uint ") + var + " = 0u; " + var + " < " + u(count) + "; ++" + var + ") ";
  };
  // A items: 8 elements (one uvec4 of halves) of a row of x; B items: one 32-element chunk of a
  // weight row (4 uvec4 of halves).
  const int64_t a_items = bm * bk / 8, b_items = bn * bk / 32;
  const int64_t a_per = (a_items + threads - 1) / threads, b_per = (b_items + threads - 1) / threads;
  const auto guard = [&](int64_t items) { return items % threads == 0 ? std::string() : "el < " + u(items) + " && "; };

  std::string src;
  // Eight elements of x at flat index i (a multiple of 8), rounded to f16.
  src += "uvec4 x8(uint i) {\n";
  if (xt == dtype::f32)
    src += "  vec4 a = " + X + ".v[i >> 2], c = " + X + ".v[(i >> 2) + 1u];\n  return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), "
           "packHalf2x16(c.xy), packHalf2x16(c.zw));\n";
  else
    src += "  return " + X + ".v[i >> 3];\n";
  src += "}\n";
  if (wt == dtype::bf16 && !bf)
    src += "uint bf2h(uint p) { return packHalf2x16(vec2(uintBitsToFloat(p << 16), uintBitsToFloat(p & 0xffff0000u))); }\n";
  // Chunk c (32 elements) of weight row r, as 16 packed halves; zeros past k.
  src += "void w32(uint r, uint c, out uvec4 h[4]) {\n";
  if (quant) {
    src += "  float v[32];\n  " + W + "_chunk(r, c, v);\n";
    src += "  " + loop("j", 4) + "h[j] = uvec4(packHalf2x16(vec2(v[8u * j], v[8u * j + 1u])), packHalf2x16(vec2(v[8u * j + 2u], v[8u * j + 3u])),"
           " packHalf2x16(vec2(v[8u * j + 4u], v[8u * j + 5u])), packHalf2x16(vec2(v[8u * j + 6u], v[8u * j + 7u])));\n";
  } else {
    src += "  " + loop("j", 4) + "h[j] = c * 32u + j * 8u < " + u(kd) + " ? " + W + ".v[(r * " + u(kd) + " + c * 32u + j * 8u) >> 3] : uvec4(0u);\n";
    // bf16 pairs (a word each: the lower element in the low half) become f16 pairs: exact within
    // f16's normal range (6.1e-5 to 65504 in magnitude; bf16's 8 bits of mantissa fit f16's
    // 11), smaller values lose bits as f16 subnormals, larger ones become infinite.
    if (wt == dtype::bf16 && !bf)
      src += "  " + loop("j", 4) + "h[j] = uvec4(bf2h(h[j].x), bf2h(h[j].y), bf2h(h[j].z), bf2h(h[j].w));\n";
  }
  src += "}\n";

  auto fetch = [&](const std::string& kb) {
    std::string f;
    f += "      " + loop("l", a_per) + "{\n        uint el = tid + l * " + u(threads) + ", gm = m0 + el / " + u(bk / 8) + ", gk = " + kb +
         " + (el % " + u(bk / 8) + ") * 8u;\n";
    f += "        ga[l] = (" + guard(a_items) + "gm < " + u(m) + " && gk < " + u(kd) + ") ? x8(gm * " + u(kd) + " + gk) : uvec4(0u);\n      }\n";
    f += "      " + loop("l", b_per) + "{\n        uint el = tid + l * " + u(threads) + ", gn = n0 + el / " + u(bk / 32) + ", gc = " + kb +
         " / 32u + el % " + u(bk / 32) + ";\n";
    f += "        if (" + guard(b_items) + "gn < " + u(n) + " && gc * 32u < " + u(kd) + ") w32(gn, gc, gb[l]);\n";
    f += "        else " + loop("j", 4) + "gb[l][j] = uvec4(0u);\n      }\n";
    return f;
  };
  auto stash = [&](const std::string& stage) {
    std::string s;
    s += "      " + loop("l", a_per) + "{\n        uint el = tid + l * " + u(threads) + ";\n        " +
         (guard(a_items).empty() ? "" : "if (el < " + u(a_items) + ") ") + "As[(" + stage + ") * " + u(bm * rs) + " + (el / " +
         u(bk / 8) + ") * " + u(rs) + " + el % " + u(bk / 8) + "] = ga[l];\n      }\n";
    s += "      " + loop("l", b_per) + "{\n        uint el = tid + l * " + u(threads) + ";\n        " +
         (guard(b_items).empty() ? "" : "if (el < " + u(b_items) + ") ") + loop("j", 4) + "Bs[(" + stage + ") * " + u(bn * rs) +
         " + (el / " + u(bk / 32) + ") * " + u(rs) + " + (el % " + u(bk / 32) + ") * 4u + j] = gb[l][j];\n      }\n";
    return s;
  };
  // One k tile from shared stage `stage`: A fragments row-major from [m][k], B fragments
  // column-major from [n][k] (element (k, n) at n * stride + k).
  auto math = [&](const std::string& stage) {
    std::string m_;
    m_ += "      " + loop("kk", bk / 16) + "{\n        " + frag16 + " fa[" + std::to_string(t.fm) + "], fb[" + std::to_string(t.fn) + "];\n";
    m_ += "        " + loop("i", t.fm) + "coopMatLoadNV(fa[i], As, (" + stage + ") * " + u(bm * rs) + " + (wm * " + u(t.fm * 16) +
          " + i * 16u) * " + u(rs) + " + kk * 2u, " + u(rs) + ", false);\n";
    m_ += "        " + loop("j", t.fn) + "coopMatLoadNV(fb[j], Bs, (" + stage + ") * " + u(bn * rs) + " + (wn * " + u(t.fn * 16) +
          " + j * 16u) * " + u(rs) + " + kk * 2u, " + u(rs) + ", true);\n";
    m_ += "        " + loop("i", t.fm) + loop("j", t.fn) + "acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);\n      }\n";
    return m_;
  };

  src += "shared uvec4 As[" + std::to_string(2 * bm * rs) + "];\nshared uvec4 Bs[" + std::to_string(2 * bn * rs) + "];\n";
  src += "shared float Cs[" + std::to_string(t.sgm * t.sgn * 256) + "];\n";
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;\n";
  src += "  const uint wm = sg / " + u(t.sgn) + ", wn = sg % " + u(t.sgn) + ";\n";
  // Pass 1: bz is the slice of k tiles (tile_loops' batch loop), k0 its first element.
  src += tile_loops(slices, m, n, bm, bn, caps.variants.gemm_swizzle);
  if (!pass1) src += "    const uint bz = 0u;\n";
  src += "    const uint k0 = bz * " + u(slice_tiles * bk) + ";\n";
  src += "    " + frag32 + " acc[" + std::to_string(t.fm) + "][" + std::to_string(t.fn) + "];\n";
  src += "    " + loop("i", t.fm) + loop("j", t.fn) + "acc[i][j] = " + frag32 + "(0.0);\n";
  src += "    uvec4 ga[" + std::to_string(a_per) + "], gb[" + std::to_string(b_per) + "][4];\n";
  // As in the tiled f16 kernel: the next tile in registers while this one is multiplied, one
  // barrier per tile, the last tile peeled off so the loop body has no branches.
  src += "    {\n" + fetch("k0") + stash("0u") + "    }\n    barrier();\n";
  src += "    for (uint t = 0u; t < " + u(slice_tiles - 1) + "; ++t) {\n      const uint cur = t & 1u;\n      {\n" +
         fetch("(k0 + (t + 1u) * " + u(bk) + ")") + "      }\n" + math("cur") + stash("cur ^ 1u") + "      barrier();\n    }\n";
  src += math(u(slice_tiles - 1) + " & 1u");
  src += "    " + loop("i", t.fm) + loop("j", t.fn) + "{\n";
  src += "      coopMatStoreNV(acc[i][j], Cs, sg * 256u, 16u, false);\n      subgroupMemoryBarrierShared();\n      subgroupBarrier();\n";
  src += "      " + loop("r", 8) + "{\n        uint li = lane + r * 32u, gm = m0 + wm * " + u(t.fm * 16) + " + i * 16u + li / 16u, gn = n0 + wn * " +
         u(t.fn * 16) + " + j * 16u + li % 16u;\n";
  src += "        if (gm < " + u(m) + " && gn < " + u(n) + ") {\n          uint ci = gm * " + u(n) + " + gn;\n" + store +
         "        }\n      }\n      subgroupMemoryBarrierShared();\n      subgroupBarrier();\n    }\n";
  // The next tile of this workgroup (grid-stride) overwrites stage 0 of As and Bs.
  src += "    barrier();\n  }\n}\n";

  kernel_source s;
  s.name = "mmctl" + std::to_string(bm) + "x" + std::to_string(bn) + (pass1 ? "s" + std::to_string(slices) : "") + "_" +
           to_string(g[w].type) + (decoded ? "_dq_" : bf ? "_bf16x_" : "_") + std::to_string(k.root);
  s.bf16_matrices = bf;
  s.khr_matrices = caps.coopmat_khr;
  s.bindings = e.bindings;
  s.groups = {groups_for(n, bn, caps.max_groups[0]), groups_for(m, bm, caps.max_groups[1]),
              static_cast<uint32_t>(std::min<int64_t>(slices, caps.max_groups[2]))};
  // bytes_of counts graph nodes only: a pass 1's partials and a decoded weight are added.
  s.bytes = bytes_of(g, s.bindings) + (pass1 ? static_cast<uint64_t>(slices * m * n) * 4 : 0) +
            (decoded ? static_cast<uint64_t>(n * kd) * 2 : 0);
  s.flops = d.flops();
  s.glsl = rewrite_note(s) + coopmat_header(threads) + decl + prelude + src;
  return s;
}

kernel_source linear_split_sum(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  const mm_dims d = dims_of(g, k);
  const int64_t outputs = d.m * d.n;
  emitter e(g, q, false);
  e.bind(k.root);
  const std::string part = "b" + std::to_string(e.bind(scratch_id(g, k.scratch))) + ".v";
  std::string main;
  main += "  for (uint o = gl_GlobalInvocationID.x; o < " + u(outputs) + "; o += gl_NumWorkGroups.x * 256u) {\n";
  main += "    float acc = 0.0;\n";
  main += "    for (uint s = 0u; s < " + u(k.slices) + "; ++s) acc += " + part + "[s * " + u(outputs) + " + o];\n";
  main += epilogue(e, g, k, "o", "acc") + "  }\n";
  kernel_source src;
  src.name = "mmctls2_" + std::to_string(k.root);
  src.bindings = e.bindings;
  src.groups = {groups_for(outputs, 256, caps.max_groups[0]), 1, 1};
  src.bytes = bytes_of(g, src.bindings) + static_cast<uint64_t>(k.slices * outputs) * 4;
  src.glsl = header(g, src.bindings, false, 256) + split_decls(g, q, k, src.bindings) + prelude + "void main() {\n" + main + "}\n";
  return src;
}

int64_t linear_split_slices(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  if (k.kind != kernel_kind::linear || k.pass != 0 || caps.variants.linear == "nosplit") return 0;
  const mm_dims d = dims_of(g, k);
  // Float weights only: a quantized weight decoded while staged bounds its products (on the H200
  // a q8_0 down projection gained 9% in 4 slices, its o projection lost 9%).
  const dtype wt = g[d.b].type;
  if (wt != dtype::f16 && wt != dtype::bf16 && k.weight < 0) return 0;  // a decoded weight is f16 (predecode_linears)
  if (d.m <= matvec_max_rows || !linear_coopmat(g, with_root_inline(p, k.root), k, caps)) return 0;
  auto tile = pick_coop_tile(d, caps);
  if (!tile) return 0;
  const int64_t tiles = (d.kd + 31) / 32;  // mmctl's tiles are 32 deep
  const int64_t groups = tile->tiles(d.m, d.n);
  int64_t forced = 0;
  if (caps.variants.linear.rfind("split", 0) == 0) forced = std::atoll(caps.variants.linear.c_str() + 5);
  if (forced == 0 && groups >= linear_split_max_groups) return 0;
  int64_t best = 0;
  for (const int64_t s : {2, 4, 8}) {
    if (tiles % s != 0 || tiles / s < linear_split_min_tiles) continue;  // each slice a long k loop
    if (forced) {
      if (s == forced) return s;
      continue;
    }
    best = s;
    if (groups * s >= linear_split_target_groups) break;  // the fewest slices that fill the device
  }
  return forced ? 0 : best;
}

}  // namespace mesh::gpu::detail

namespace mesh::gpu {

void split_linears(const graph& g, plan& p, const device_caps& caps) {
  std::vector<kernel> out;
  out.reserve(p.kernels.size());
  for (const kernel& k : p.kernels) {
    const int64_t slices = detail::linear_split_slices(g, p, k, caps);
    if (slices < 2) {
      out.push_back(k);
      continue;
    }
    const detail::mm_dims d = detail::dims_of(g, k);
    kernel first = k;
    first.pass = 1;
    first.slices = slices;
    first.scratch = static_cast<int>(p.scratch.size());
    p.scratch.push_back({dtype::f32, slices * d.m * d.n});
    kernel second = first;
    second.pass = 2;
    out.push_back(first);
    out.push_back(second);
  }
  p.kernels = std::move(out);
}

}  // namespace mesh::gpu
