// linear (x [..., k] times w [n, k] transposed, w of any float or quantized dtype) and kv_write.
//
// linear takes one of two paths by the rows of x:
// - at most matvec_max_rows (16) rows (decode: a token, or a batched step of up to 16 sequences,
//   at a time): `lmv`, a matrix-vector kernel. It is
//   memory bound on the weight, so each weight row is read once, by one subgroup (or, without
//   subgroup arithmetic, one 64-thread workgroup): lanes take chunks in turn (a quantized weight
//   through its lane decoder, glsl_quant.cpp: a subgroup reads adjacent words of a few blocks and
//   each lane decodes 8 to 32 elements in registers, with one block header read per lane; a float
//   weight in a buffer is read 8 elements (16 or 32 bytes) per lane at a time as uvec4s, so that a
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

/// Workgroups of a matrix-vector kernel that keeps x in shared memory, at most (each reads x once).
constexpr uint32_t matvec_shared_x_groups = 1024;

/// Steps the coalesced kernel decodes per pass: kernel_variants::matvec "lanes1", "lanes2" or
/// "lanes4" (for comparing them), else the default.
int matvec_unroll(const std::string& variant) {
  if (variant == "lanes1") return 1;
  if (variant == "lanes4") return 4;
  return 2;
}

/// Rows of x from which the coalesced quantized kernel gives each subgroup 2 weight rows.
constexpr int64_t matvec_two_rows_from = 8;

/// Weight rows per subgroup of the coalesced quantized kernel for `m` rows of x: 2 from
/// matvec_two_rows_from rows on (each x load then serves both: on the H100 a batched decode
/// step's q4_k products took 2.75 ms instead of 3.96 at 8 rows, 5.31 instead of 7.61 at 16, the
/// same at 4, and 0.82 instead of 0.68 at 1), else 1; kernel_variants::matvec "rows1", "rows2"
/// or "rows4" instead (for comparing them).
int64_t matvec_rows(const std::string& variant, int64_t m) {
  if (variant == "rows1") return 1;
  if (variant == "rows2") return 2;
  if (variant == "rows4") return 4;
  return m >= matvec_two_rows_from ? 2 : 1;
}

/// Whether the 8-bit x kernel (`lmvi`) may replace `lmvc` (kernel_variants::matvec_x): "int8"
/// wherever the device has an integer dot product, "" where it is accelerated, never with "f32"
/// or with a matvec variant that names another kernel or another x.
bool int8_matvec(const device_caps& caps) {
  const std::string& v = caps.variants.matvec;
  if (!caps.integer_dot || v == "chunk" || v == "shared" || v == "xglobal") return false;
  return caps.variants.matvec_x == "int8" || (caps.variants.matvec_x.empty() && caps.integer_dot_fast);
}

/// Shared memory of the 8-bit x of `m` rows of `k` (k a multiple of 32): the codes, a scale per
/// 32, and with `sums` a sum per 16.
uint64_t int8_x_shared_bytes(int64_t m, int64_t k, bool sums) {
  const auto e = static_cast<uint64_t>(m * k);
  return e + e / 32 * 4 + (sums ? e / 16 * 4 : 0);
}

/// The shared arrays of quant_int8_lane_decoder, `int idot4(uint, uint)` (OpSDot on packed 8-bit
/// vectors) and `void quantize_x()`, which fills them from x4g(i) (4 floats of x from element i):
/// a thread per block of 32, as the CPU's integer dots quantize x (cpu_quant_dot.hpp), d =
/// max |x| / 127, codes round-to-even(x / d) clamped to +-127; a block holding NaN or infinity
/// gets d = NaN and codes 0, so that every product it enters is NaN.
std::string int8_x_shared(int64_t m, int64_t k, uint32_t local, bool sums) {
  const std::string blocks = u(m * k / 32);
  std::string s = "shared uvec4 xq[" + u(m * k / 16) + "];\nshared float xd[" + blocks + "];\n";
  if (sums) s += "shared float xsum[" + u(m * k / 16) + "];\n";
  s += "spirv_instruction(extensions = [\"SPV_KHR_integer_dot_product\"], capabilities = [6018, 6019], id = 4450)\n"
       "int sdot_packed(uint a, uint b, spirv_literal int packed_format);\n"
       "int idot4(uint a, uint b) { return sdot_packed(a, b, 0); }\n";
  s += "vec4 x4g(uint i);\n";
  s += "void quantize_x() {\n  for (uint b = gl_LocalInvocationID.x; b < " + blocks + "; b += " + u(local) + ") {\n";
  s += "    vec4 v[8];\n    float mx = 0.0;\n    bool bad = false;\n";
  s += "    [[unroll]] for (uint i = 0u; i < 8u; ++i) {\n      v[i] = x4g(32u * b + 4u * i);\n      vec4 a = abs(v[i]);\n";
  s += "      mx = max(mx, max(max(a.x, a.y), max(a.z, a.w)));\n      bad = bad || any(isnan(v[i])) || any(isinf(v[i]));\n    }\n";
  s += "    float d = bad ? uintBitsToFloat(0x7fc00000u) : mx / 127.0;\n    int sum[2] = int[2](0, 0);\n";
  s += "    [[unroll]] for (uint i = 0u; i < 8u; ++i) {\n";
  s += "      ivec4 q = bad || d == 0.0 ? ivec4(0) : ivec4(clamp(roundEven(v[i] / d), vec4(-127.0), vec4(127.0)));\n";
  s += "      xq[2u * b + i / 4u][i % 4u] = (uint(q.x) & 255u) | ((uint(q.y) & 255u) << 8) | ((uint(q.z) & 255u) << 16) | (uint(q.w) << 24);\n";
  s += "      sum[i / 4u] += q.x + q.y + q.z + q.w;\n    }\n    xd[b] = d;\n";
  if (sums) s += "    xsum[2u * b] = d * float(sum[0]);\n    xsum[2u * b + 1u] = d * float(sum[1]);\n";
  s += "  }\n}\n";
  return s;
}

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

  emitter e(g, q, false);
  e.bind(k.root);
  // The coalesced kernel for the quantized dtypes that have a lane decoder (on subgroups), with x
  // read 4 floats at a time when it is an f32 buffer of its own.
  const bool lanes = quant && sg && caps.variants.matvec != "chunk" && !quant_lane_decoder(wt, "b", kd).glsl.empty();
  // A float weight read as uvec4s, by the same passes of `unroll` chunks (not with "chunk").
  const bool wide_passes = wide && sg && caps.variants.matvec != "chunk";
  // x is read from the buffer that a chain of reshapes views (the same flat index), when there is one.
  const node_index xs = behind_reshapes(g, q, x);
  const bool x_buffer = (lanes || wide_passes) && q.materialised[xs] && g[xs].type == dtype::f32 && kd % 4 == 0;
  const int x_binding = x_buffer ? e.bind(xs) : -1;
  const std::string lx = x_buffer ? "" : loader(e, "load_x", x);
  const int w_binding = quant || wide ? e.bind(w) : -1;
  const std::string wb = quant || wide ? "b" + std::to_string(w_binding) : "";
  const std::string lw = quant || wide ? "" : loader(e, "load_w", w);
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "acc[mi]"); });
  // An epilogue that reads x itself (element by element) keeps x's buffer of floats.
  const std::string xb = "b" + std::to_string(x_binding);
  const bool x_vec4 = x_buffer && store.find(xb + ".v[") == std::string::npos;
  const lane_decoder ld = lanes ? quant_lane_decoder(wt, wb, kd) : lane_decoder{};
  // x in shared memory, read from memory once per workgroup, for the decoders that ask for it
  // (q4_k: each lane reads 16 floats of x in a row, 64 bytes apart from its neighbour's, which
  // from memory takes 16 cache lines per subgroup load; docs/gpu.md has the measurements), when
  // it fits (kernel_variants::matvec "xglobal" keeps it in memory). x4 reads 4 aligned floats.
  // x quantized to 8 bits in shared memory, the weight's share dotted in integers (int8_matvec).
  const lane_decoder ild = lanes && x_buffer && kd % 32 == 0 && int8_matvec(caps) ? quant_int8_lane_decoder(wt, wb, kd) : lane_decoder{};
  const bool int8 = !ild.glsl.empty() && int8_x_shared_bytes(m, kd, ild.sums) <= caps.shared_memory_bytes;
  const bool x_shared = !int8 && lanes && !ld.swizzle.empty() && kd % 4 == 0 && caps.variants.matvec != "xglobal" &&
                        static_cast<uint64_t>(m * kd) * 4 <= caps.shared_memory_bytes;

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
  src += lx + lw;
  if (lanes || wide_passes) {
    src += int8 ? int8_x_shared(m, kd, local, ild.sums) + ild.glsl : ld.glsl;
    const std::string from_x = x_vec4     ? xb + ".v[i >> 2]"
                               : x_buffer ? "vec4(" + xb + ".v[i], " + xb + ".v[i + 1u], " + xb + ".v[i + 2u], " + xb + ".v[i + 3u])"
                                          : "vec4(load_x(i), load_x(i + 1u), load_x(i + 2u), load_x(i + 3u))";
    if (int8) {
      src += "vec4 x4g(uint i) { return " + from_x + "; }\n";
    } else if (x_shared) {
      src += "shared vec4 xs[" + u(m * kd / 4) + "];\nvec4 x4g(uint i) { return " + from_x + "; }\n";
      src += "uint swizzle(uint p) { return " + ld.swizzle + "; }\nvec4 x4(uint i) { return xs[swizzle(i >> 2)]; }\n";
    } else {
      src += "vec4 x4(uint i) { return " + from_x + "; }\n";
    }
  }
  src += "void main() {\n";
  // Every row of a workgroup reads all of x: read it from memory once, into shared memory.
  if (x_shared)
    src += "  for (uint i = gl_LocalInvocationID.x; i < " + u(m * kd / 4) + "; i += " + u(local) + ") xs[swizzle(i)] = x4g(4u * i);\n  barrier();\n";
  if (int8) src += "  quantize_x();\n  barrier();\n";
  const int64_t R = lanes ? matvec_rows(caps.variants.matvec, m) : 1;
  const std::string RR = u(R);
  if (lanes) {
    // R weight rows at once (matvec_rows: each x load then serves R rows), in virtual lanes of
    // 32 per step, so that any subgroup size covers the steps (32 and 64 lanes stay coalesced: a
    // subgroup of 64 runs two steps side by side). Each
    // pass decodes `unroll` steps of every row before it multiplies, so that their loads are in
    // flight together: a lane past the row's end or the last block decodes the step's first
    // lane's share instead (always in the row) and keeps none of it; a row past n decodes row
    // n - 1 and is not stored.
    src += "  const uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;\n";
    src += "  for (uint row0 = (gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID) * " + RR + "; row0 < " + u(n) +
           "; row0 += gl_NumWorkGroups.x * gl_NumSubgroups * " + RR + ") {\n";
    src += "    float acc[" + std::to_string(m) + "], accr[" + RR + "][" + std::to_string(m) + "];\n";
    src += "    [[unroll]] for (uint r = 0u; r < " + RR + "; ++r) " + mloop + "accr[r][mi] = 0.0;\n";
    const int64_t total = (kd + ld.step - 1) / ld.step * 32;
    const std::string U = std::to_string(matvec_unroll(caps.variants.matvec)) + "u", T = u(total), PL = std::to_string(ld.per_lane());
    src += "    for (uint t0 = lane; t0 < " + T + "; t0 += lanes * " + U + ") {\n";
    // A lane's share of each step: decoded floats, or (int8) the quants and scales as loaded.
    src += "      " + (int8 ? wb + "_W v[" + U + "][" + RR + "]" : "float v[" + U + "][" + RR + "][" + PL + "]") + ";\n";
    src += "      uint e0[" + U + "];\n      bool keep[" + U + "];\n";
    src += "      [[unroll]] for (uint j = 0u; j < " + U + "; ++j) {\n";
    src += "        const uint t = min(t0 + j * lanes, " + T + " - 1u), s = t / 32u;\n        uint vl = t % 32u;\n";
    src += "        keep[j] = t0 + j * lanes < " + T + " && (" + ld.valid + ");\n        if (!keep[j]) vl = 0u;\n";
    src += "        e0[j] = " + ld.first + ";\n";
    src += "        [[unroll]] for (uint r = 0u; r < " + RR + "; ++r) " + wb + (int8 ? "_iload" : "_lane") + "(min(row0 + r, " + u(n - 1) +
           "), s, vl, v[j][r]);\n      }\n";
    src += "      [[unroll]] for (uint j = 0u; j < " + U + "; ++j)\n        if (keep[j]) " + mloop + "{\n";
    if (int8) {
      src += "          [[unroll]] for (uint r = 0u; r < " + RR + "; ++r) accr[r][mi] += " + wb + "_idot(v[j][r], mi * " + u(kd) +
             " + e0[j]);\n        }\n    }\n";
    } else {
      src += "          [[unroll]] for (uint g = 0u; g < " + u(ld.groups) + "; ++g)\n";
      src += "            [[unroll]] for (uint c = 0u; c < " + u(ld.group_len / 4) + "; ++c) {\n";
      src += "              const uint i = g * " + u(ld.group_len) + " + 4u * c;\n";
      src += "              const vec4 xa = x4(mi * " + u(kd) + " + e0[j] + g * " + u(ld.group_stride) + " + 4u * c);\n";
      src += "              [[unroll]] for (uint r = 0u; r < " + RR + "; ++r)\n";
      src += "                accr[r][mi] += dot(vec4(v[j][r][i], v[j][r][i + 1u], v[j][r][i + 2u], v[j][r][i + 3u]), xa);\n";
      src += "            }\n        }\n    }\n";
    }
    // Each row's sums, then its epilogue (row is uniform in the subgroup: subgroupAdd is safe).
    src += "    [[unroll]] for (uint r = 0u; r < " + RR + "; ++r) {\n      const uint row = row0 + r;\n";
    src += "      if (row >= " + u(n) + ") break;\n";
    src += "      " + mloop + "acc[mi] = subgroupAdd(accr[r][mi]);\n";
    src += "      if (subgroupElect()) " + mloop + "{\n        uint ci = mi * " + u(n) + " + row;\n" + store + "      }\n    }\n";
    src += "  }\n}\n";
  } else {
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
    if (wide_passes) {
      const std::string U = std::to_string(matvec_unroll(caps.variants.matvec)) + "u", C = u(kd / 8);
      src += "    for (uint c0 = lane; c0 < " + C + "; c0 += lanes * " + U + ") {\n";
      src += "      float v[" + U + "][8];\n      uint cc[" + U + "];\n";
      src += "      [[unroll]] for (uint j = 0u; j < " + U + "; ++j) {\n        cc[j] = min(c0 + j * lanes, " + C + " - 1u);\n";
      src += "        w_chunk(row, cc[j], v[j]);\n      }\n";
      src += "      [[unroll]] for (uint j = 0u; j < " + U + "; ++j)\n        if (c0 + j * lanes < " + C + ") " + mloop + "{\n";
      src += "          uint base = mi * " + u(kd) + " + cc[j] * 8u;\n";
      src += "          acc[mi] += dot(vec4(v[j][0], v[j][1], v[j][2], v[j][3]), x4(base)) + dot(vec4(v[j][4], v[j][5], v[j][6], v[j][7]), x4(base + 4u));\n";
      src += "        }\n    }\n";
    } else if (quant || wide) {
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
  }

  kernel_source s;
  s.name = std::string(lanes ? (int8 ? "lmvi" : "lmvc") + (R > 1 ? std::to_string(R) + "r" : "") : sg ? "lmv" : "lmvs") + (quant || wide ? std::string("_") + to_string(wt) : "") + "_" + std::to_string(k.root);
  s.bindings = e.bindings;
  const int64_t rows_per_group = sg ? local / caps.subgroup_size * R : 1;
  // With x in shared memory, a workgroup takes several rows in turn (the grid-stride loop), so
  // that fewer workgroups read x.
  s.groups = {groups_for(n, rows_per_group, x_shared || int8 ? std::min<uint32_t>(caps.max_groups[0], matvec_shared_x_groups) : caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kd);
  std::string decls;
  for (size_t b = 0; b < s.bindings.size(); ++b)
    decls += static_cast<int>(b) == x_binding ? buffer_decl(g, xs, b, x_vec4) :
             (wide || ld.uvec4) && static_cast<int>(b) == w_binding ? "layout(std430, binding = " + std::to_string(b) + ") readonly restrict buffer B" +
                                          std::to_string(b) + " { uvec4 v[]; } " + wb + ";\n"
                                    : buffer_decl(g, s.bindings[b], b, false);
  s.glsl = header(g, s.bindings, sg, local) + decls + prelude + src;
  if (int8) s.glsl.insert(s.glsl.find('\n') + 1, "#extension GL_EXT_spirv_intrinsics : require\n");
  return s;
}

}  // namespace

kernel_source linear(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const node& lin = g[k.anchor];
  const int64_t n = lin.dims.back(), m = n ? element_count(lin.dims) / n : 0;
  const int64_t kd = g[lin.inputs[0]].dims.back();
  if (m >= 1 && m <= matvec_max_rows && kd > 0) return matvec(g, p, k, caps);
  if (auto coop = linear_coopmat(g, with_root_inline(p, k.root), k, caps)) return *coop;
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
  // A scalar pos puts row r at pos + r; a vector (one entry per row) puts it at pos[r].
  const bool per_row = !g[pos].dims.empty();
  std::string body;
  if (!per_row)
    e.scoped([&] {
      const std::string at = e.value(pos, "0u");
      body += e.body;
      e.body.clear();
      body += "  const int pos = " + at + ";\n";
    });
  std::string inner_body = "    uint row = (i / " + u(inner) + ") % " + u(std::max<int64_t>(len, 1)) +
                           ", outer = i / " + u(inner * std::max<int64_t>(len, 1)) + ";\n";
  e.scoped([&] {
    if (per_row) {
      const std::string at = e.value(pos, "row");
      inner_body += e.body + "    int t = " + at + ";\n";
      e.body.clear();
    } else {
      inner_body += "    int t = int(row) + pos;\n";
    }
    const std::string v = e.value(value, "i");
    inner_body += e.body;
    e.body.clear();
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
