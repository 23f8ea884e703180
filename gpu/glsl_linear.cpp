// linear (x [..., k] times w [n, k] transposed, w of any float or quantized dtype) and kv_write.
//
// linear takes one of two paths by the rows of x:
// - at most matvec_max_rows rows (decode: a token at a time): `lmv`, a matrix-vector kernel. It is
//   memory bound on the weight, so each weight row is read once, by one subgroup (or, without
//   subgroup arithmetic, one 64-thread workgroup): lanes take chunks in turn (a quantized chunk is
//   32 elements decoded in registers from whole words, one block header per chunk; a float weight
//   in a buffer is read 8 elements (16 or 32 bytes) per lane at a time as uvec4s, so that a
//   subgroup has whole cache lines in flight instead of 2-byte reads), multiply them with every
//   row of x, and the partial sums are added by subgroupAdd (or a shared-memory tree); one lane
//   runs the epilogue and stores.
// - more rows (prefill): the tiled f32-math matmul kernels (glsl_matmul.cpp) with the weight read
//   transposed through its decoder, element by element into the shared tiles.
#include <algorithm>

#include "graph/quant.hpp"
#include "gpu/glsl_emitter.hpp"
#include "gpu/glsl_kernels.hpp"

namespace mesh::gpu::detail {
namespace {

kernel_source matvec(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  const node& lin = g[k.anchor];
  const node_index x = lin.inputs[0], w = lin.inputs[1];
  const int64_t kd = g[x].dims.back(), n = lin.dims.back(), m = n ? element_count(lin.dims) / n : 0;
  // Quantized tensors are leaves, so always in a buffer; chunks need k a multiple of 32.
  const dtype wt = g[w].type;
  const bool quant = is_quantized(wt);
  // A float weight in its own buffer, rows of whole 8-element chunks: read as uvec4s.
  const bool wide = !quant && q.materialised[w] && kd % 8 == 0 &&
                    (wt == dtype::f32 || wt == dtype::f16 || wt == dtype::bf16);
  const bool sg = caps.subgroup_arithmetic && caps.subgroup_size >= 4 && caps.subgroup_size <= 128 && caps.variants.matvec != "shared";
  const uint32_t local = sg ? std::max<uint32_t>(128, caps.subgroup_size) : 64;
  // Quantized rows through a shared-memory window: a subgroup copies the bytes of its next
  // `lanes` chunks with lane-adjacent word loads (coalesced, many in flight), then each lane
  // decodes its chunk from shared memory. Read straight from the buffer, a lane's chunk is 8 or
  // more words at a block's stride from its neighbours': every load instruction touches a
  // sector per lane. Needs whole blocks per window (lanes chunks).
  const int64_t lanes = caps.subgroup_size, chunk_blocks = quant ? std::max<int64_t>(1, block_elements(wt) / 32) : 1;
  const bool window = quant && sg && lanes % chunk_blocks == 0 && caps.variants.matvec != "direct";
  const int64_t rb = quant ? *row_bytes(wt, kd) : 0;
  const int64_t window_bytes = window ? lanes / chunk_blocks * block_bytes(wt) : 0;
  const int64_t window_words = window_bytes / 4 + 2;  // + a partial word at either end
  const int64_t subgroups = local / lanes;

  emitter e(g, q, false);
  e.bind(k.root);
  const std::string lx = loader(e, "load_x", x);
  const int w_binding = quant || wide ? e.bind(w) : -1;
  const std::string wb = quant || wide ? "b" + std::to_string(w_binding) : "";
  const std::string lw = quant || wide ? "" : loader(e, "load_w", w);
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "acc[mi]"); });

  const std::string mloop = "[[unroll]] for (uint mi = 0u; mi < " + u(m) + "; ++mi) ";
  std::string src = sg ? "" : "shared float red[64];\n";
  if (wide) {
    // Elements [8c, 8c + 8) of row r: one uvec4 (f16, bf16; little-endian halves) or two (f32).
    src += "void w_chunk(uint r, uint c, out float v[8]) {\n";
    if (wt == dtype::f32) {
      src += "  uint o = (r * " + u(kd / 8) + " + c) * 2u;\n  uvec4 a = " + wb + ".v[o], b = " + wb + ".v[o + 1u];\n";
      src += "  [[unroll]] for (uint j = 0u; j < 4u; ++j) { v[j] = uintBitsToFloat(a[j]); v[j + 4u] = uintBitsToFloat(b[j]); }\n";
    } else {
      src += "  uvec4 a = " + wb + ".v[r * " + u(kd / 8) + " + c];\n  [[unroll]] for (uint j = 0u; j < 4u; ++j) {\n";
      if (wt == dtype::f16)
        src += "    vec2 h = unpackHalf2x16(a[j]);\n    v[2u * j] = h.x;\n    v[2u * j + 1u] = h.y;\n";
      else
        src += "    v[2u * j] = uintBitsToFloat(a[j] << 16);\n    v[2u * j + 1u] = uintBitsToFloat(a[j] & 0xffff0000u);\n";
      src += "  }\n";
    }
    src += "}\n";
  }
  if (window) {
    src += "shared uint win[" + std::to_string(subgroups) + "][" + std::to_string(window_words) + "];\n";
    src += "uint win_sg, win_shift;  // this subgroup's window, and where its first block starts in it\n";
    src += "uint win_u8(uint o) { o += win_shift; return (win[win_sg][o >> 2] >> ((o & 3u) << 3)) & 255u; }\n";
    src += "uint win_u16(uint o) { o += win_shift; return (win[win_sg][o >> 2] >> ((o & 2u) << 3)) & 65535u; }\n";
    src += "uint win_u32(uint o) { o += win_shift; uint w = o >> 2; return (o & 2u) == 0u ? win[win_sg][w] : "
           "(win[win_sg][w] >> 16) | (win[win_sg][w + 1u] << 16); }\n";
    src += "float win_f16(uint o) { return unpackHalf2x16(win_u16(o)).x; }\n";
    src += quant_chunk_decoder(wt, "win");
  }
  src += lx + lw + "void main() {\n";
  if (sg) {
    // Rows go to subgroups, whatever their number per workgroup: the grid-stride loop covers n.
    src += "  const uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;\n";
    src += "  for (uint row = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID; row < " + u(n) +
           "; row += gl_NumWorkGroups.x * gl_NumSubgroups) {\n";
  } else {
    src += "  const uint lane = gl_LocalInvocationID.x, lanes = 64u;\n";
    src += "  for (uint row = gl_WorkGroupID.x; row < " + u(n) + "; row += gl_NumWorkGroups.x) {\n";
  }
  src += "    float acc[" + std::to_string(m) + "];\n    " + mloop + "acc[mi] = 0.0;\n";
  if (window) {
    // The runtime subgroup matches the one the window was sized for (a device may pick another
    // size per pipeline); otherwise the direct loop below runs.
    const std::string chunks = u(kd / 32);
    src += "    if (gl_SubgroupSize == " + u(lanes) + " && gl_NumSubgroups == " + u(subgroups) + ") {\n";
    src += "      win_sg = gl_SubgroupID;\n";
    src += "      for (uint c0 = 0u; c0 < " + chunks + "; c0 += " + u(lanes) + ") {\n";
    src += "        uint base = row * " + u(rb) + " + c0 / " + u(chunk_blocks) + " * " + u(block_bytes(wt)) + ";\n";
    src += "        uint end = min(base + " + u(window_bytes) + ", (row + 1u) * " + u(rb) + ");\n";
    src += "        uint first = base >> 2, words = (end + 3u) / 4u - first;\n        win_shift = base & 3u;\n";
    src += "        for (uint i = lane; i < words; i += " + u(lanes) + ") win[win_sg][i] = " + wb + ".v[first + i];\n";
    src += "        subgroupMemoryBarrierShared();\n        subgroupBarrier();\n";
    src += "        uint c = c0 + lane;\n        if (c < " + chunks + ") {\n          float v[32];\n";
    src += "          win_chunk_at((lane / " + u(chunk_blocks) + ") * " + u(block_bytes(wt)) + ", lane % " + u(chunk_blocks) + ", v);\n";
    src += "          " + mloop + "{\n            uint xb = mi * " + u(kd) + " + c * 32u;\n            float s = 0.0;\n";
    src += "            [[unroll]] for (uint j = 0u; j < 32u; ++j) s = fma(v[j], load_x(xb + j), s);\n            acc[mi] += s;\n          }\n        }\n";
    src += "        subgroupBarrier();  // every lane has read the window before it is refilled\n      }\n    } else\n";
  }
  if (quant || wide) {
    const std::string len = quant ? "32u" : "8u", decode = quant ? wb + "_chunk" : "w_chunk";
    src += "    for (uint c = lane; c < " + u(kd / (quant ? 32 : 8)) + "; c += lanes) {\n      float v[" + len + "];\n      " +
           decode + "(row, c, v);\n";
    src += "      " + mloop + "{\n        uint base = mi * " + u(kd) + " + c * " + len + ";\n        float s = 0.0;\n";
    src += "        [[unroll]] for (uint j = 0u; j < " + len + "; ++j) s = fma(v[j], load_x(base + j), s);\n        acc[mi] += s;\n      }\n    }\n";
  } else {
    src += "    for (uint c = lane; c < " + u(kd) + "; c += lanes) {\n      float wv = load_w(row * " + u(kd) + " + c);\n";
    src += "      " + mloop + "acc[mi] = fma(wv, load_x(mi * " + u(kd) + " + c), acc[mi]);\n    }\n";
  }
  if (sg) {
    src += "    " + mloop + "acc[mi] = subgroupAdd(acc[mi]);\n";
    src += "    if (subgroupElect()) " + mloop + "{\n      uint ci = mi * " + u(n) + " + row;\n" + store + "    }\n";
  } else {
    src += "    " + mloop + "{\n      red[lane] = acc[mi];\n      barrier();\n";
    src += "      for (uint s = 32u; s > 0u; s >>= 1) {\n        if (lane < s) red[lane] += red[lane + s];\n        barrier();\n      }\n";
    src += "      acc[mi] = red[0];\n      barrier();\n    }\n";
    src += "    if (lane == 0u) " + mloop + "{\n      uint ci = mi * " + u(n) + " + row;\n" + store + "    }\n";
  }
  src += "  }\n}\n";

  kernel_source s;
  s.name = std::string(sg ? (window ? "lmvw" : "lmv") : "lmvs") + (quant || wide ? std::string("_") + to_string(wt) : "") + "_" +
           std::to_string(k.root);
  s.bindings = e.bindings;
  const int64_t rows_per_group = sg ? local / caps.subgroup_size : 1;
  s.groups = {groups_for(n, rows_per_group, caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kd);
  std::string decls;
  for (size_t b = 0; b < s.bindings.size(); ++b)
    decls += wide && static_cast<int>(b) == w_binding ? "layout(std430, binding = " + std::to_string(b) + ") readonly restrict buffer B" +
                                          std::to_string(b) + " { uvec4 v[]; } " + wb + ";\n"
                                    : buffer_decl(g, s.bindings[b], b, false);
  s.glsl = header(g, s.bindings, sg, local) + decls + prelude + src;
  return s;
}

}  // namespace

kernel_source linear(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const node& lin = g[k.anchor];
  const int64_t n = lin.dims.back(), m = n ? element_count(lin.dims) / n : 0;
  const int64_t kd = g[lin.inputs[0]].dims.back();
  if (m >= 1 && m <= matvec_max_rows && kd > 0) return matvec(g, p, k, caps);
  return matmul(g, p, k, caps);
}

kernel_source kv_write(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const node& kv = g[k.root];
  const node_index value = kv.inputs[1], pos = kv.inputs[2];
  const shape& vd = g[value].dims;
  const auto ax = static_cast<size_t>(kv.attrs.axis);
  int64_t inner = 1;
  for (size_t a = ax + 1; a < vd.size(); ++a) inner *= vd[a];
  const int64_t count = element_count(vd), len = vd[ax], cache_len = kv.dims[ax];
  // The root's buffer is the cache parameter's (the executor aliases them): the kernel writes the
  // slice and reads nothing else of it.
  emitter e(g, p, false);
  e.bind(k.root);
  std::string body;
  e.scoped([&] {
    const std::string at = e.value(pos, "0u");
    body += e.body;
    e.body.clear();
    body += "  const int pos = " + at + ";\n";
  });
  std::string inner_body;
  e.scoped([&] {
    const std::string v = e.value(value, "i");
    inner_body = e.body;
    e.body.clear();
    inner_body += "    uint row = (i / " + u(inner) + ") % " + u(std::max<int64_t>(len, 1)) + ", outer = i / " + u(inner * std::max<int64_t>(len, 1)) +
                  ";\n    int t = int(row) + pos;\n";
    inner_body += "    if (t >= 0 && t < " + std::to_string(cache_len) + ") {\n      uint dst = (outer * " + u(cache_len) + " + uint(t)) * " +
                  u(inner) + " + i % " + u(inner) + ";\n  " + e.store(k.root, "dst", v) + "    }\n";
  });
  kernel_source s;
  s.name = "kvw_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(count, 256, caps.max_groups[0]), 1, 1};
  s.bytes = 2 * static_cast<uint64_t>(std::max<int64_t>(byte_size(g[value].type, vd), 0));
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, false) + prelude +
           "void main() {\n" + body + "  const uint stride = gl_NumWorkGroups.x * 256u;\n  for (uint i = gl_GlobalInvocationID.x; i < " +
           u(count) + "; i += stride) {\n" + inner_body + "  }\n}\n";
  return s;
}

}  // namespace mesh::gpu::detail
