// A prompt's linear with a quantized weight, in two kernels: `dqw` decodes the whole weight to
// f16 into a scratch buffer, then `mmctl` multiplies x by it as by an f16 weight. `mmctl` can
// also decode each 32-element chunk of the weight while it stages the chunk for the tensor cores,
// but then every tile row of x decodes the weight again (4 times for a 512-row prompt in
// 128-row tiles), and the decoding's integer and float work sits in the loop that feeds the
// tensor cores. Decoding first costs one pass over the weight (its quantized bytes read, twice
// its elements written, the product then reading f16 instead of blocks), which pays for a whole
// prompt (512 rows) and for products in few tiles, which the f16 weight lets split_linears split
// along k; docs/gpu.md has the measurements behind linear_predecode_min_rows and _max_tiles.
#include <algorithm>

#include "gpu/glsl_emitter.hpp"
#include "gpu/glsl_kernels.hpp"
#include "gpu/matmul_schedule.hpp"
#include "graph/quant.hpp"

namespace mesh::gpu::detail {

kernel_source weight_decode(const graph& g, const plan&, const kernel& k, const device_caps& caps) {
  const node& w = g[k.root];
  const int64_t kd = w.dims.back(), n = element_count(w.dims) / kd, chunks = n * (kd / 32);
  const std::vector<node_index> bindings{scratch_id(g, k.scratch), k.root};
  std::string src;
  src += "void main() {\n";
  src += "  for (uint i = gl_GlobalInvocationID.x; i < " + u(chunks) + "; i += gl_NumWorkGroups.x * 256u) {\n";
  src += "    float v[32];\n    b1_chunk(i / " + u(kd / 32) + ", i % " + u(kd / 32) + ", v);\n";
  // Chunk i of the weight is elements [32 i, 32 i + 32) of the [n, k] f16 matrix: 4 uvec4s.
  src += "    [[unroll]] for (uint j = 0u; j < 4u; ++j)\n";
  src += "      b0.v[i * 4u + j] = uvec4(packHalf2x16(vec2(v[8u * j], v[8u * j + 1u])), packHalf2x16(vec2(v[8u * j + 2u], v[8u * j + 3u])),"
         " packHalf2x16(vec2(v[8u * j + 4u], v[8u * j + 5u])), packHalf2x16(vec2(v[8u * j + 6u], v[8u * j + 7u])));\n";
  src += "  }\n}\n";
  kernel_source s;
  s.name = "dqw_" + std::string(to_string(w.type)) + "_" + std::to_string(k.root);
  s.bindings = bindings;
  s.groups = {groups_for(chunks, 256, caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, {k.root}) + static_cast<uint64_t>(n * kd) * 2;
  s.glsl = header(g, bindings, false, 256) + "layout(std430, binding = 0) writeonly restrict buffer B0 { uvec4 v[]; } b0;\n" +
           buffer_decl(g, k.root, 1, false) + prelude + src;
  return s;
}

bool predecodes_weight(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const std::string& choice = caps.variants.linear_decode;
  if (k.kind != kernel_kind::linear || k.pass != 0 || k.weight >= 0 || choice == "staged") return false;
  const mm_dims d = dims_of(g, k);
  const node& w = g[d.b];
  if (!is_quantized(w.type) || quant_chunk_decoder(w.type, "b").empty() || !p.materialised[d.b]) return false;
  if (d.kd % 32 != 0 || 2 * d.n * d.kd > linear_predecode_max_bytes) return false;
  if (d.m <= matvec_max_rows) return false;
  if (choice != "first" && d.m < linear_predecode_min_rows) {
    const auto tile = pick_coop_tile(d, caps);  // the staged product's tiles
    if (!tile || tile->tiles(d.m, d.n) > linear_predecode_max_tiles) return false;
  }
  // By default only where mmctl takes the product with the decoded weight; "first" also where
  // the f32 kernels do (lavapipe's tests run the decode kernel that way).
  if (choice == "first" && (!caps.coopmat_f16 || caps.variants.linear == "f32")) return true;
  kernel decoded = k;
  plan q = with_root_inline(p, k.root);
  q.scratch.push_back({dtype::f16, d.n * d.kd});
  decoded.weight = static_cast<int>(q.scratch.size() - 1);
  return linear_coopmat(g, q, decoded, caps).has_value();
}

}  // namespace mesh::gpu::detail

namespace mesh::gpu {

void predecode_linears(const graph& g, plan& p, const device_caps& caps) {
  std::vector<kernel> out;
  out.reserve(p.kernels.size());
  int shared = -1;
  int64_t largest = 0;
  for (const kernel& k : p.kernels) {
    if (!detail::predecodes_weight(g, p, k, caps)) {
      out.push_back(k);
      continue;
    }
    if (shared < 0) {
      shared = static_cast<int>(p.scratch.size());
      p.scratch.push_back({dtype::f16, 0});
    }
    const detail::mm_dims d = detail::dims_of(g, k);
    largest = std::max(largest, d.n * d.kd);
    kernel decode;
    decode.kind = kernel_kind::weight_decode;
    decode.root = decode.anchor = d.b;
    decode.scratch = shared;
    kernel product = k;
    product.weight = shared;
    out.push_back(decode);
    out.push_back(product);
  }
  if (shared >= 0) p.scratch[static_cast<size_t>(shared)].elements = largest;
  p.kernels = std::move(out);
}

}  // namespace mesh::gpu
