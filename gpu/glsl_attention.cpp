// attention (op_kind::attention): causal grouped-query attention against a KV cache. Many query
// rows (a prompt: plan.cpp's add_attention, attention_tiled_min_rows) take one kernel, `attnc` on
// tensor cores (attention_coopmat below) or `attnt` in f32 (attention_tiled), flash-attention style. Few rows (decode) take two kernels,
// flash-decoding style (add_attention makes the passes and their scratch buffer of partials,
// d + 2 floats per query row, head and slice):
// - pass 1 (`attn1`): a workgroup of 64 threads per query row, head and slice of the keys (a
//   grid-stride loop over them). The query row, scaled by 1/sqrt(d), goes to shared memory.
//   The slice is walked a tile of 64 keys at a time (one tile, unless the partials would grow
//   too large: attention_tiles_per_slice). Each thread takes one key of the tile: its score
//   q . k (the d loads unrolled, so that they are in flight together); the running maximum m,
//   each key's weight exp(score - m) to shared memory and their sum l; then thread x adds
//   weight x v[x] over the tile's keys (what earlier tiles added rescaled by exp(m_old - m)).
//   It writes m, l and the d sums. A slice with no visible key writes m = -inf, l = 0; with no
//   keys at all, nothing is read.
// - pass 1 for a group of query heads (`attn1g`, attention_pass1_grouped below): the same
//   partials for every query head of one key/value head from one workgroup, so that k and v are
//   read once per group; taken where the group and its tiles fit.
// - pass 2 (`attn2`): a workgroup per query row and head combines the slices: M = max m, the
//   result sum(exp(m - M) acc) / sum(exp(m - M) l), or 0 where no key is visible.
// Keys past the visible range are read at a clamped index and their values replaced, never
// multiplied by 0 (a cache row that was never written may hold anything, NaN included).
// q, k, v and pos are read through the expression emitter: views of the cache (a slice, a
// reshape, a gather of a batch's rows) cost index arithmetic, not copies.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <tuple>

#include "graph/attention_rows.hpp"
#include "gpu/glsl_emitter.hpp"
#include "gpu/glsl_kernels.hpp"

namespace mesh::gpu::detail {
namespace {

/// `<type> name(<type> x)`: the workgroup's (component-wise) max or sum of x, every thread getting
/// it, through subgroup arithmetic and the shared array `red` (of `type`, one per thread), or a
/// shared-memory tree without subgroups. `type`: "float" or "vec4".
std::string workgroup_reduce(const std::string& name, bool max, bool sg, int64_t local, const std::string& type = "float",
                             const std::string& red = "red") {
  const std::string combine = max ? "a = max(a, " + red + "[s]);" : "a += " + red + "[s];";
  if (sg)
    return type + " " + name + "(" + type + " x) {\n  " + type + " a = " + (max ? "subgroupMax" : "subgroupAdd") +
           "(x);\n  if (subgroupElect()) " + red + "[gl_SubgroupID] = a;\n  barrier();\n  a = " + red +
           "[0];\n  for (uint s = 1u; s < gl_NumSubgroups; ++s) " + combine + "\n  barrier();\n  return a;\n}\n";
  const std::string tree = max ? red + "[i] = max(" + red + "[i], " + red + "[i + s]);" : red + "[i] += " + red + "[i + s];";
  return type + " " + name + "(" + type + " x) {\n  const uint i = gl_LocalInvocationID.x;\n  " + red + "[i] = x;\n  barrier();\n  for (uint s = " +
         u(local / 2) + "; s > 0u; s >>= 1) {\n    if (i < s) " + tree + "\n    barrier();\n  }\n  " + type + " a = " + red +
         "[0];\n  barrier();\n  return a;\n}\n";
}

/// The statements that store `res` as output element (b, i, j, x) of an attention node of l query
/// rows, h heads and head size d (root bound first: binding 0), through its epilogue.
std::string output_store(emitter& e, node_index root, int64_t l, int64_t h, int64_t d) {
  e.bind(root);
  std::string store;
  e.scoped([&] {
    store = e.store(root, "((b * " + u(l) + " + i) * " + u(h) + " + j) * " + u(d) + " + x", "res");
    store = e.body + store;
    e.body.clear();
  });
  return store;
}

/// 1/sqrt(d) as a GLSL float literal.
std::string scale_literal(int64_t d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", 1.0 / std::sqrt(static_cast<double>(d)));
  if (!std::strpbrk(text, ".e")) std::strcat(text, ".0");
  return text;
}

/// Rows and keys per tile of the one-kernel attention (`attnt`), the largest that fit the
/// device's shared memory: q tile [bq, d], k and v tiles [bk, d] (rows padded by one float), the
/// weights [bq, bk] and two floats per thread for row reductions. 4 threads per query row.
struct attention_tile {
  int64_t bq = 0, bk = 0;
  int64_t threads() const { return 4 * bq; }
  int64_t shared_bytes(int64_t d) const { return 4 * ((bq + 2 * bk) * (d + 1) + bq * bk + 2 * threads()) + 8 * bq; }
};

attention_tile pick_attention_tile(int64_t d, const device_caps& caps) {
  for (attention_tile t : {attention_tile{64, 32}, attention_tile{32, 32}, attention_tile{32, 16}})
    if (t.shared_bytes(d) <= static_cast<int64_t>(caps.shared_memory_bytes)) return t;
  return {16, 16};  // 26 KB at d = 128 (the plan's largest for this kernel)
}

/// Attention in one kernel for many query rows (a prompt), flash-attention style: a workgroup
/// per (batch, head, tile of bq query rows). The q tile (scaled by 1/sqrt(d)) stays in shared
/// memory; the keys the tile's rows see, [min first, max last), are walked bk at a time: the k
/// and v tiles go to shared memory, each thread scores bk / 4 keys of its row, the row's
/// running maximum and sum are combined through shared memory (4 threads a row), the weights
/// exp(s - m) go to shared memory, and each thread adds weight x v over the tile into its d / 4
/// outputs (earlier tiles rescaled by exp(m_old - m_new)). Every key is read once per tile of
/// rows instead of once per row. A key a row does not see is skipped for that row, never
/// multiplied by 0 (a cache row never written may hold NaN); keys outside [0, t) read as 0.
kernel_source attention_tiled(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const node& at = g[k.root];
  const node_index q = at.inputs[0], kk = at.inputs[1], v = at.inputs[2], pos = at.inputs[3];
  const attention_shape as = attention_shape_of(g[q].dims, g[kk].dims, at.attrs.axis);
  const int64_t l = as.l, h = as.h, d = as.d, t = as.t, kv = as.kv, window = as.window, group = h / kv;
  const attention_tile tile = pick_attention_tile(d, caps);
  const int64_t bq = tile.bq, bk = tile.bk, threads = tile.threads(), q_tiles = (l + bq - 1) / bq;
  const int64_t groups_total = as.batch * h * q_tiles, nx = (d + 3) / 4, ds = d + 1;
  const std::string D = u(d), DS = u(ds), BQ = u(bq), BK = u(bk), T = u(t), KV = u(kv), L = u(l), H = u(h);
  const std::string BKi = std::to_string(bk), Ti = std::to_string(t);
  const std::string scale = scale_literal(d);

  emitter e(g, p, false);
  const std::string store = output_store(e, k.root, l, h, d);
  kernel_source s;
  s.name = "attnt" + std::to_string(bq) + "x" + std::to_string(bk) + "_" + std::to_string(k.root);
  if (t == 0) {
    // No keys at all (an empty cache): every row sees nothing, and there is nothing to read.
    const int64_t n = as.batch * l * h * d;
    std::string src = "void main() {\n  for (uint o = gl_GlobalInvocationID.x; o < " + u(n) + "; o += gl_NumWorkGroups.x * 64u) {\n";
    src += "    const uint x = o % " + D + ", j = (o / " + D + ") % " + H + ", i = (o / " + u(d * h) + ") % " + L + ", b = o / " +
           u(d * h * l) + ";\n    const float res = 0.0;\n" + store + "  }\n}\n";
    s.bindings = e.bindings;
    s.groups = {groups_for(n, 64, caps.max_groups[0]), 1, 1};
    s.bytes = bytes_of(g, s.bindings);
    s.glsl = header(g, s.bindings, false, 64) + split_decls(g, p, k, s.bindings) + prelude + src;
    return s;
  }
  const std::string lq = loader(e, "load_q", q), lk = loader(e, "load_k", kk), lv = loader(e, "load_v", v), lp = loader(e, "load_pos", pos);
  const auto unrolled = [](const char* var, int64_t count) {
    return std::string("[[unroll]] for (uint ") + var + " = 0u; " + var + " < " + u(count) + "; ++" + var + ") ";
  };
  // The loops over d and over a tile's keys: unrolled where the device wants it (GPUs: the
  // loads are then in flight together), kept on CPU devices (llvmpipe compiles the unrolled
  // d = 128 kernel for minutes).
  const auto inner = [&](const char* var, int64_t count) {
    return std::string(caps.unroll_loops ? "[[unroll]] " : "") + "for (uint " + var + " = 0u; " + var + " < " + u(count) + "; ++" + var + ") ";
  };
  std::string src = lq + lk + lv + lp;
  src += "shared float Qs[" + u(bq * ds) + "];\nshared float Ks[" + u(bk * ds) + "];\nshared float Vs[" + u(bk * ds) + "];\n";
  src += "shared float Ps[" + u(bq * bk) + "];\nshared float red[" + u(2 * threads) + "];\nshared int span[" + u(2 * bq) + "];\n";
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, r = tid / 4u, c4 = tid % 4u;\n";
  src += "  const float neg_inf = uintBitsToFloat(0xff800000u);\n";
  src += "  for (uint wg = gl_WorkGroupID.x; wg < " + u(groups_total) + "; wg += gl_NumWorkGroups.x) {\n";
  // Row tiles longest first (as `attnc`).
  src += "    const uint qt = " + u(q_tiles - 1) + " - wg / " + u(as.batch * h) + ", j = wg % " + H + ", b = (wg / " + H + ") % " +
         u(as.batch) + ", kvh = j / " + u(group) + ", i = qt * " + BQ + " + r;\n";
  // This thread's row: its visible keys [first, last) (none for rows past the last).
  src += "    int first = 0, last = 0;\n    if (i < " + L + ") {\n      const int p = int(load_pos(b * " + L + " + i));\n";
  src += "      last = clamp(p + 1, 0, " + Ti + ");\n      first = " +
         (window > 0 ? "clamp(p - " + std::to_string(window - 1) + ", 0, last)" : std::string("0")) + ";\n    }\n";
  src += "    if (c4 == 0u) {\n      span[r] = first < last ? first : " + Ti + ";\n      span[" + BQ + " + r] = first < last ? last : 0;\n    }\n";
  src += "    for (uint e = tid; e < " + u(bq * d) + "; e += " + u(threads) + ") {\n      const uint rr = e / " + D + ", x = e % " + D +
         ", ii = qt * " + BQ + " + rr;\n      Qs[rr * " + DS + " + x] = ii < " + L + " ? load_q(((b * " + L + " + ii) * " + H + " + j) * " + D +
         " + x) * " + scale + " : 0.0;\n    }\n    barrier();\n";
  // The keys any row of the tile sees.
  src += "    int lo = " + Ti + ", hi = 0;\n    for (uint rr = 0u; rr < " + BQ + "; ++rr) {\n      lo = min(lo, span[rr]);\n      hi = max(hi, span[" + BQ +
         " + rr]);\n    }\n";
  src += "    float m = neg_inf, total = 0.0, o[" + u(nx) + "];\n    " + unrolled("a", nx) + "o[a] = 0.0;\n";
  src += "    for (int t0 = lo - lo % " + BKi + "; t0 < hi; t0 += " + BKi + ") {\n";
  src += "      barrier();  // the previous tile's k, v and weights are no longer read\n";
  src += "      for (uint e = tid; e < " + u(bk * d) + "; e += " + u(threads) + ") {\n        const uint c = e / " + D + ", x = e % " + D +
         ";\n        const int key = t0 + int(c);\n        const bool in_range = key >= lo && key < hi;\n";
  src += "        const uint ko = ((b * " + T + " + uint(clamp(key, 0, " + std::to_string(t - 1) + "))) * " + KV + " + kvh) * " + D + " + x;\n";
  src += "        Ks[c * " + DS + " + x] = in_range ? load_k(ko) : 0.0;\n        Vs[c * " + DS + " + x] = in_range ? load_v(ko) : 0.0;\n      }\n";
  src += "      barrier();\n";
  // Scores of this thread's keys c4, c4 + 4, ...
  src += "      float s[" + u(bk / 4) + "];\n      float top = neg_inf;\n      " + unrolled("jj", bk / 4) + "{\n        const uint c = c4 + 4u * jj;\n";
  src += "        float acc = 0.0;\n        " + inner("x", d) + "acc = fma(Qs[r * " + DS + " + x], Ks[c * " + DS + " + x], acc);\n";
  src += "        const int key = t0 + int(c);\n        s[jj] = key >= first && key < last ? acc : neg_inf;\n        top = max(top, s[jj]);\n      }\n";
  src += "      red[tid] = top;\n      barrier();\n";
  src += "      const float mn = max(m, max(max(red[4u * r], red[4u * r + 1u]), max(red[4u * r + 2u], red[4u * r + 3u])));\n";
  // mn = -inf: the row has seen nothing yet (its weights are 0, nothing to rescale).
  src += "      const float corr = mn == neg_inf ? 1.0 : exp(m - mn);\n      float part = 0.0;\n";
  src += "      " + unrolled("jj", bk / 4) + "{\n        const float w = s[jj] == neg_inf ? 0.0 : exp(s[jj] - mn);\n        Ps[r * " + BK +
         " + c4 + 4u * jj] = w;\n        part += w;\n      }\n";
  src += "      red[" + u(threads) + " + tid] = part;\n      barrier();\n";
  src += "      total = total * corr + (red[" + u(threads) + " + 4u * r] + red[" + u(threads) + " + 4u * r + 1u]) + (red[" + u(threads) +
         " + 4u * r + 2u] + red[" + u(threads) + " + 4u * r + 3u]);\n      m = mn;\n";
  src += "      " + unrolled("a", nx) + "o[a] *= corr;\n";
  src += "      " + inner("c", bk) + "{\n        const int key = t0 + int(c);\n        if (key >= first && key < last) {\n          const float w = Ps[r * " +
         BK + " + c];\n";
  src += "          " + unrolled("a", nx) + "{\n            const uint x = c4 + 4u * a;\n            " +
         (d % 4 == 0 ? std::string() : "if (x < " + D + ") ") + "o[a] = fma(w, Vs[c * " + DS + " + x], o[a]);\n          }\n        }\n      }\n";
  src += "    }\n";
  src += "    if (i < " + L + ")\n      " + unrolled("a", nx) + "{\n        const uint x = c4 + 4u * a;\n        if (x < " + D +
         ") {\n          const float res = total > 0.0 ? o[a] / total : 0.0;\n" + store + "        }\n      }\n";
  src += "    barrier();  // Qs and span are rewritten for the next tile of rows\n  }\n}\n";

  s.bindings = e.bindings;
  s.groups = {groups_for(groups_total, 1, caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = 4.0 * static_cast<double>(as.batch * l * h) * static_cast<double>(t) * static_cast<double>(d);
  s.glsl = header(g, s.bindings, false, static_cast<uint32_t>(threads)) + split_decls(g, p, k, s.bindings) + prelude + src;
  return s;
}

/// Keys per tile of `attnc` (0: it does not fit the device's shared memory): the k and v tiles
/// [bk, d + 8] and the q tile, later the weights, [64, max(d, bk) + 8] in f16; the scores
/// [64, bk + 4], the row map [16, 16], a float per thread and per row, two ints per row in f32.
int64_t coopmat_attention_keys(int64_t d, const device_caps& caps) {
  for (const int64_t bk : {int64_t{64}, int64_t{32}}) {
    const int64_t halves = 2 * bk * (d + 8) + 64 * (std::max(d, bk) + 8);
    const int64_t floats = 64 * (bk + 4) + 256 + 128 + 64 + 2 * 64;
    if (2 * halves + 4 * floats <= static_cast<int64_t>(caps.shared_memory_bytes)) return bk;
  }
  return 0;
}

/// The materialised f32 or f16 tensor that `x` reads with its own element index (through
/// reshapes, and slices keeping a prefix of the leading axis: a KV cache's first rows), or
/// nullopt.
std::optional<node_index> same_index_buffer(const graph& g, const plan& p, node_index x) {
  for (;;) {
    if (p.materialised[x]) {
      if (g[x].type != dtype::f32 && g[x].type != dtype::f16) return std::nullopt;
      return x;
    }
    const node& n = g[x];
    if (n.op == op_kind::slice) {
      const shape& in = g[n.inputs[0]].dims;
      for (size_t i = 0; i < in.size(); ++i)
        if (n.attrs.starts[i] != 0 || (i > 0 && n.attrs.stops[i] != in[i])) return std::nullopt;
    } else if (n.op != op_kind::reshape) {
      return std::nullopt;
    }
    x = n.inputs[0];
  }
}

/// Attention in one kernel on tensor cores (GL_NV_cooperative_matrix 16x16x16, f16 operands, f32
/// accumulation), flash-attention style: a workgroup of 4 subgroups per (batch, head, tile of 64
/// query rows), each subgroup owning 16 rows. q (scaled by 1/sqrt(d)), and each tile of bk keys'
/// k and v, are rounded to f16 as they are staged in shared memory; the next tile's k and v are
/// fetched into registers while the current one is used (4 values a load where k and v are
/// buffers read at their own index, as a KV cache's first rows are). Per key tile a subgroup
/// multiplies its q fragments (held in registers for the whole row tile) by k^T into f32 score
/// fragments, which go through shared memory for the softmax: two lanes per row (even and odd
/// columns) take the row's running maximum, the weights exp(s - m) (rounded to f16 into shared
/// memory: the next product's A operand) and their sum; then the subgroup's output fragments (f32,
/// in registers) are rescaled per row by exp(m_old - m_new) and accumulate weights x v. A
/// fragment's elements are matched to their rows through a row map: a fragment of the same type
/// loaded from a matrix whose every element is its row number (NV cooperative matrices leave the
/// element layout to the implementation, but it is the same for every fragment of one type).
/// Masking as `attnt`: a key a row does not see gets weight 0 (its v is a real cache row; keys
/// outside the tile's span read as 0). Row tiles go longest first, as `attnt`'s. nullopt when the device has no cooperative matrices, d is
/// not a multiple of 16, or the tiles do not fit its shared memory.
std::optional<kernel_source> attention_coopmat(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const node& at = g[k.root];
  const node_index q = at.inputs[0], kk = at.inputs[1], v = at.inputs[2], pos = at.inputs[3];
  const attention_shape as = attention_shape_of(g[q].dims, g[kk].dims, at.attrs.axis);
  const int64_t l = as.l, h = as.h, d = as.d, t = as.t, kv = as.kv, window = as.window, group = h / kv;
  if (!caps.coopmat_f16 || caps.variants.attention == "f32" || caps.subgroup_size != 32 || d % 16 != 0 || t == 0) return std::nullopt;
  const int64_t bk = coopmat_attention_keys(d, caps);
  if (bk == 0) return std::nullopt;
  constexpr int64_t bq = 64, threads = 128;
  const int64_t q_tiles = (l + bq - 1) / bq, groups_total = as.batch * h * q_tiles, fd = d / 16, fk = bk / 16;
  const int64_t hs = d + 8, ps = bk + 8, ss = bk + 4, half = bk / 2;  // row strides (16-byte multiples)
  const std::string D = u(d), HS = u(hs), PS = u(ps), SS = u(ss), T = u(t), KV = u(kv), L = u(l), H = u(h);
  const std::string BKi = std::to_string(bk), Ti = std::to_string(t);
  const std::string scale = scale_literal(d);

  emitter e(g, p, false);
  const std::string store = output_store(e, k.root, l, h, d);
  // k and v four values a load when both are buffers read at their own index that nothing else
  // in the kernel reads (their bindings are then declared as vec4 / f16 x 4 arrays).
  const auto kb = same_index_buffer(g, p, kk), vb = same_index_buffer(g, p, v);
  std::vector<node_index> others;
  inline_nodes(g, p, q, -1, others);
  inline_nodes(g, p, pos, -1, others);
  inline_nodes(g, p, k.root, k.anchor, others);
  const bool wide = kb && vb && *kb != *vb && d % 4 == 0 && std::count(others.begin(), others.end(), *kb) == 0 &&
                    std::count(others.begin(), others.end(), *vb) == 0;
  int k_binding = -1, v_binding = -1;
  std::string fetch_fns;
  if (wide) {
    k_binding = e.bind(*kb);
    v_binding = e.bind(*vb);
    for (const auto& [name, bnd, id] : {std::tuple{"fetch_k", k_binding, *kb}, std::tuple{"fetch_v", v_binding, *vb}})
      fetch_fns += "vec4 " + std::string(name) + "(uint i) { " +
                   (g[id].type == dtype::f32 ? "return b" + std::to_string(bnd) + ".v[i];"
                                             : "const uvec2 w = b" + std::to_string(bnd) +
                                                   ".v[i]; return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));") +
                   " }\n";
  }
  const std::string lq = loader(e, "load_q", q), lp = loader(e, "load_pos", pos);
  const std::string lk = wide ? "" : loader(e, "load_k", kk), lv = wide ? "" : loader(e, "load_v", v);
  const std::string frag16 = "fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>", frag32 = "fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>";
  const auto loop = [](const char* var, int64_t count) {
    return std::string("[[unroll]] for (uint ") + var + " = 0u; " + var + " < " + u(count) + "; ++" + var + ") ";
  };
  const std::string sync = "subgroupMemoryBarrierShared();\n      subgroupBarrier();\n";

  // A tile's k and v: `per` items of `width` values per thread (every thread has the same count:
  // bk * d is a multiple of 4 * 128).
  const int64_t width = wide ? 4 : 1, per = bk * d / width / threads, row_items = d / width;
  const std::string vt = wide ? "vec4" : "float";
  const auto fetch = [&](const std::string& t0) {
    std::string f = "      " + loop("n", per) + "{\n        const uint el = tid + n * " + u(threads) + ", c = el / " + u(row_items) +
                    ", x = el % " + u(row_items) + ";\n        const int key = " + t0 + " + int(c);\n";
    f += "        const bool in_range = key >= lo && key < hi;\n        const uint ko = ((b * " + T + " + uint(clamp(key, 0, " +
         std::to_string(t - 1) + "))) * " + KV + " + kvh) * " + u(row_items) + " + x;\n";
    f += wide ? "        gk[n] = in_range ? fetch_k(ko) : vec4(0.0);\n        gv[n] = in_range ? fetch_v(ko) : vec4(0.0);\n"
              : "        gk[n] = in_range ? load_k(ko) : 0.0;\n        gv[n] = in_range ? load_v(ko) : 0.0;\n";
    return f + "      }\n";
  };
  // Ks and Vs are f16 x 4 (uvec2) arrays on the wide path (one 64-bit store per item), f16 ones
  // otherwise; fragment offsets and strides count their elements.
  const std::string kunit = wide ? "4u" : "1u";
  std::string stash = "      " + loop("n", per) + "{\n        const uint el = tid + n * " + u(threads) + ", c = el / " + u(row_items) +
                      ", x = el % " + u(row_items) + ";\n";
  stash += wide ? "        Ks[c * " + u(hs / 4) + " + x] = uvec2(packHalf2x16(gk[n].xy), packHalf2x16(gk[n].zw));\n        Vs[c * " + u(hs / 4) +
                      " + x] = uvec2(packHalf2x16(gv[n].xy), packHalf2x16(gv[n].zw));\n"
                : "        Ks[c * " + HS + " + x] = float16_t(gk[n]);\n        Vs[c * " + HS + " + x] = float16_t(gv[n]);\n";
  stash += "      }\n";

  std::string src = lq + lk + lv + lp + fetch_fns;
  const std::string kv_type = wide ? "uvec2" : "float16_t";
  src += "shared " + kv_type + " Ks[" + u(bk * hs / width) + "];\nshared " + kv_type + " Vs[" + u(bk * hs / width) + "];\n";
  src += "shared float16_t Hs[" + u(bq * (std::max(d, bk) + 8)) + "];  // the q tile, then each key tile's weights\n";
  src += "shared float Ss[" + u(bq * ss) + "];\nshared float Rs[256];\nshared float pair[" + u(threads) + "];\nshared float corr_s[" +
         u(bq) + "];\nshared int span[" + u(2 * bq) + "];\n";
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;\n";
  src += "  const float neg_inf = uintBitsToFloat(0xff800000u);\n";
  // The row map: element e of any f32 fragment is in row rowmap[e] of that fragment.
  src += "  for (uint e = tid; e < 256u; e += " + u(threads) + ") Rs[e] = float(e / 16u);\n  barrier();\n";
  src += "  " + frag32 + " rowmap;\n  coopMatLoadNV(rowmap, Rs, 0u, 16u, false);\n";
  // This lane's row of the subgroup's 16 (two lanes a row: even and odd columns of a key tile).
  src += "  const uint row = sg * 16u + lane / 2u, side = lane & 1u;\n";
  src += "  " + vt + " gk[" + u(per) + "], gv[" + u(per) + "];\n";
  src += "  for (uint wg = gl_WorkGroupID.x; wg < " + u(groups_total) + "; wg += gl_NumWorkGroups.x) {\n";
  // Row tiles longest first (causal: a later tile sees more keys), so that the short ones fill
  // the device at the end instead of the long ones running alone.
  src += "    const uint qt = " + u(q_tiles - 1) + " - wg / " + u(as.batch * h) + ", j = wg % " + H + ", b = (wg / " + H + ") % " +
         u(as.batch) + ", kvh = j / " + u(group) + ";\n";
  src += "    if (tid < " + u(bq) + ") {\n      const uint i = qt * " + u(bq) + " + tid;\n      int first = 0, last = 0;\n";
  src += "      if (i < " + L + ") {\n        const int p = int(load_pos(b * " + L + " + i));\n        last = clamp(p + 1, 0, " + Ti + ");\n";
  src += "        first = " + (window > 0 ? "clamp(p - " + std::to_string(window - 1) + ", 0, last)" : std::string("0")) + ";\n      }\n";
  src += "      span[tid] = first < last ? first : " + Ti + ";\n      span[" + u(bq) + " + tid] = first < last ? last : 0;\n    }\n";
  src += "    for (uint e = tid; e < " + u(bq * d) + "; e += " + u(threads) + ") {\n      const uint rr = e / " + D + ", x = e % " + D +
         ", ii = qt * " + u(bq) + " + rr;\n      Hs[rr * " + HS + " + x] = float16_t(ii < " + L + " ? load_q(((b * " + L + " + ii) * " + H +
         " + j) * " + D + " + x) * " + scale + " : 0.0);\n    }\n    barrier();\n";
  src += "    int lo = " + Ti + ", hi = 0;\n    for (uint rr = 0u; rr < " + u(bq) + "; ++rr) {\n      lo = min(lo, span[rr]);\n      hi = max(hi, span[" +
         u(bq) + " + rr]);\n    }\n";
  src += "    const int first = span[row], last = span[" + u(bq) + " + row];\n";
  src += "    " + frag16 + " fq[" + u(fd) + "];\n    " + loop("f", fd) + "coopMatLoadNV(fq[f], Hs, sg * " + u(16 * hs) + " + f * 16u, " + HS +
         ", false);\n";
  src += "    " + frag32 + " fo[" + u(fd) + "];\n    " + loop("f", fd) + "fo[f] = " + frag32 + "(0.0);\n";
  src += "    float m = neg_inf, total = 0.0;\n    const int t_first = lo - lo % " + BKi + ";\n";
  src += "    if (t_first < hi) {\n" + fetch("t_first") + "    }\n";
  src += "    for (int t0 = t_first; t0 < hi; t0 += " + BKi + ") {\n";
  src += "      barrier();  // q is in registers; the previous tile's k, v and weights are no longer read\n";
  src += stash + "      barrier();\n";
  // The next tile's loads are in flight while this one is multiplied.
  src += "      if (t0 + " + BKi + " < hi) {\n" + fetch("(t0 + " + BKi + ")") + "      }\n";
  // Scores of the subgroup's 16 rows: q [16, d] x k^T [d, bk] (k's rows read column-major).
  src += "      " + loop("n", fk) + "{\n        " + frag32 + " acc = " + frag32 + "(0.0);\n";
  src += "        " + loop("f", fd) + "{\n          " + frag16 + " fkt;\n          coopMatLoadNV(fkt, Ks, (n * " + u(16 * hs) + " + f * 16u) / " +
         kunit + ", " + HS + " / " + kunit + ", true);\n          acc = coopMatMulAddNV(fq[f], fkt, acc);\n        }\n";
  src += "        coopMatStoreNV(acc, Ss, sg * " + u(16 * ss) + " + n * 16u, " + SS + ", false);\n      }\n      " + sync;
  // The softmax step of this lane's columns of its row (side, side + 2, ...).
  src += "      float s[" + u(half) + "];\n      float top = neg_inf;\n      " + loop("c", half) + "{\n        const uint col = 2u * c + side;\n" +
         "        const int key = t0 + int(col);\n        s[c] = key >= first && key < last ? Ss[row * " + SS + " + col] : neg_inf;\n" +
         "        top = max(top, s[c]);\n      }\n";
  src += "      pair[tid] = top;\n      " + sync + "      const float mn = max(m, max(top, pair[tid ^ 1u]));\n";
  // mn = -inf: the row has seen nothing yet (its weights are 0, nothing to rescale).
  src += "      const float corr = mn == neg_inf ? 1.0 : exp(m - mn);\n      float part = 0.0;\n";
  src += "      " + loop("c", half) + "{\n        const float w = s[c] == neg_inf ? 0.0 : exp(s[c] - mn);\n        Hs[row * " + PS +
         " + 2u * c + side] = float16_t(w);\n        part += w;\n      }\n";
  src += "      " + sync + "      pair[tid] = part;\n      if (side == 0u) corr_s[row] = corr;\n      " + sync;
  src += "      total = total * corr + (part + pair[tid ^ 1u]);\n      m = mn;\n";
  // Rescale the output rows, then add weights [16, bk] x v [bk, d].
  src += "      " + loop("f", fd) + "for (uint e = 0u; e < uint(rowmap.length()); ++e) fo[f][e] *= corr_s[sg * 16u + uint(rowmap[e])];\n";
  src += "      " + loop("c", fk) + "{\n        " + frag16 + " fp;\n        coopMatLoadNV(fp, Hs, sg * " + u(16 * ps) + " + c * 16u, " + PS +
         ", false);\n";
  src += "        " + loop("f", fd) + "{\n          " + frag16 + " fv;\n          coopMatLoadNV(fv, Vs, (c * " + u(16 * hs) + " + f * 16u) / " +
         kunit + ", " + HS + " / " + kunit + ", false);\n          fo[f] = coopMatMulAddNV(fp, fv, fo[f]);\n        }\n      }\n";
  src += "    }\n";
  // Divide each row by its sum (0 for a row that saw nothing) and store through the epilogue,
  // a fragment at a time through the subgroup's rows of Ss.
  src += "    " + sync + "    if (side == 0u) corr_s[row] = total > 0.0 ? 1.0 / total : 0.0;\n    " + sync;
  src += "    " + loop("f", fd) + "{\n      for (uint e = 0u; e < uint(rowmap.length()); ++e) fo[f][e] *= corr_s[sg * 16u + uint(rowmap[e])];\n";
  src += "      coopMatStoreNV(fo[f], Ss, sg * " + u(16 * ss) + ", " + SS + ", false);\n      " + sync;
  src += "      " + loop("r", 8) + "{\n        const uint li = lane + r * 32u, rr = sg * 16u + li / 16u, i = qt * " + u(bq) +
         " + rr, x = f * 16u + li % 16u;\n";
  src += "        if (i < " + L + ") {\n          const float res = Ss[rr * " + SS + " + li % 16u];\n" + store + "        }\n      }\n      " + sync + "    }\n";
  src += "    barrier();  // Hs and span are rewritten for the next tile of rows\n  }\n}\n";

  std::string decl;
  for (size_t i = 0; i < e.bindings.size(); ++i) {
    const int bi = static_cast<int>(i);
    if (bi == k_binding || bi == v_binding)
      decl += "layout(std430, binding = " + std::to_string(i) + ") readonly restrict buffer B" + std::to_string(i) + " { " +
              (g[e.bindings[i]].type == dtype::f32 ? "vec4" : "uvec2") + " v[]; } b" + std::to_string(i) + ";\n";
    else
      decl += buffer_decl(g, e.bindings[i], i, false);
  }
  kernel_source ks;
  ks.name = "attnc64x" + std::to_string(bk) + (wide ? "" : "s") + "_" + std::to_string(k.root);
  ks.bindings = e.bindings;
  ks.groups = {groups_for(groups_total, 1, caps.max_groups[0]), 1, 1};
  ks.bytes = bytes_of(g, ks.bindings);
  ks.flops = 4.0 * static_cast<double>(as.batch * l * h) * static_cast<double>(t) * static_cast<double>(d);
  ks.glsl = coopmat_header(threads) + decl + prelude + src;
  return ks;
}

/// Query heads per key/value head that the grouped pass 1 (`attn1g`) takes at most.
constexpr int64_t grouped_attention_max_group = 16;

/// Passes of 64 columns over a head of d.
int64_t column_passes(int64_t d) { return (d + 63) / 64; }

int64_t grouped_attention_shared_bytes(int64_t d, int64_t group, int64_t parts);

/// Parts of 64 threads in `attn1g` (each adds a share of a tile's keys into v's weighted sum): 4
/// where their shared memory fits (on the H200 a Llama-1B decode step's pass 1 took 8.6 µs
/// against 11.9 with one part: each thread runs a quarter of the dependent loads), else 1;
/// kernel_variants::attention "parts1" keeps 1. 0: not even one part fits (`attn1` then).
int64_t grouped_attention_parts(const device_caps& caps, int64_t d, int64_t group) {
  for (const int64_t parts : {4, 1})
    if ((parts == 1 || caps.variants.attention != "parts1") &&
        grouped_attention_shared_bytes(d, group, parts) <= static_cast<int64_t>(caps.shared_memory_bytes))
      return parts;
  return 0;
}

/// Shared memory of `attn1g`: the k tile [64, d + 1], the group's query rows [group, d], the
/// weights [group, 64], the reductions' vec4 per thread and, with several parts, the partial
/// sums of all parts but the first.
int64_t grouped_attention_shared_bytes(int64_t d, int64_t group, int64_t parts) {
  return 4 * (attention_slice_keys * (d + 1) + group * d + group * attention_slice_keys + 4 * 64 * parts +
              (parts - 1) * group * column_passes(d) * 64);
}

/// Flash-decoding pass 1 for every query head of one key/value head at once (`attn1g`): a
/// workgroup of 64 threads per (query row, key/value head, slice of the keys) computes what `attn1`
/// computes for each of the `group` query heads that share the key/value head, so each k and v
/// element is read once for all of them. The key tile [64, d] is copied to shared memory first
/// (consecutive threads read consecutive elements: coalesced), rows padded by one float, then
/// thread c scores key c against every query head of the group; the group's running maxima and
/// sums go through vec4 workgroup reductions; thread x adds weight x v[x] for every head. It
/// writes the same partials (m, l and the d sums per query head and slice) as `attn1`, which pass
/// 2 (`attn2`) combines. With `parts` > 1 the workgroup has 64 x parts threads: the tile copy is
/// shared among them all, and part p (threads 64p ..) adds keys [64p / parts, 64(p + 1) / parts)
/// of each tile into v's sums, which are added up in shared memory at the end: each thread runs
/// a parts-th of the dependent loads.
kernel_source attention_pass1_grouped(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const node& at = g[k.root];
  const node_index q = at.inputs[0], kk = at.inputs[1], v = at.inputs[2], pos = at.inputs[3];
  const attention_shape as = attention_shape_of(g[q].dims, g[kk].dims, at.attrs.axis);
  const int64_t l = as.l, h = as.h, d = as.d, t = as.t, kv = as.kv, window = as.window;
  const int64_t group = h / kv, slices = k.slices, C = attention_slice_keys, chunks = (group + 3) / 4;
  constexpr int64_t local = 64;  // columns of v a pass, and keys of a tile
  const int64_t parts = grouped_attention_parts(caps, d, group), threads = local * parts, per_part = C / parts;
  const bool sg = caps.subgroup_arithmetic && caps.subgroup_size >= 4 && caps.subgroup_size <= threads;
  const int64_t tiles_per_slice = attention_tiles_per_slice(t, slices), units = as.batch * l * kv * slices;
  const std::string D = u(d), DS = u(d + 1), T = u(t), H = u(h), L = u(l), KV = u(kv), S = u(slices), W = u(d + 2), G = u(group);
  const std::string SPAN = u(tiles_per_slice * C), NA = u((d + local - 1) / local);
  const std::string scale = scale_literal(d);

  emitter e(g, p, false);
  e.bind(scratch_id(g, k.scratch));  // binding 0: written
  const std::string lq = loader(e, "load_q", q), lk = loader(e, "load_k", kk), lv = loader(e, "load_v", v), lp = loader(e, "load_pos", pos);
  const auto each_head = [&](const std::string& body) { return "[[unroll]] for (uint hq = 0u; hq < " + G + "; ++hq) " + body; };
  std::string src = lq + lk + lv + lp;
  src += "shared float Ks[" + u(C * (d + 1)) + "];\nshared float qs[" + u(group * d) + "];\nshared float w[" + u(group * C) +
         "];\nshared vec4 red4[" + u(threads) + "];\n";
  if (parts > 1) src += "shared float pacc[" + u((parts - 1) * group * column_passes(d) * local) + "];\n";
  src += workgroup_reduce("wg_max4", true, sg, threads, "vec4", "red4") + workgroup_reduce("wg_sum4", false, sg, threads, "vec4", "red4");
  src += "void main() {\n  const uint lid = gl_LocalInvocationID.x, col = lid % " + u(local) + ", part = lid / " + u(local) +
         ";\n  const float neg_inf = uintBitsToFloat(0xff800000u);\n";
  src += "  for (uint ws = gl_WorkGroupID.x; ws < " + u(units) + "; ws += gl_NumWorkGroups.x) {\n";
  src += "    const uint rk = ws / " + S + ", sl = ws % " + S + ", b = rk / " + u(l * kv) + ", i = (rk / " + KV + ") % " + L + ", kvh = rk % " +
         KV + ";\n";
  src += "    const int p = int(load_pos(b * " + L + " + i));\n    const uint last = uint(clamp(p + 1, 0, " + std::to_string(t) +
         ")), first = " + (window > 0 ? "uint(clamp(p - " + std::to_string(window - 1) + ", 0, int(last)))" : std::string("0u")) + ";\n";
  // The group's query rows: heads kvh * group + hq, scaled by 1/sqrt(d).
  src += "    const uint q0 = ((b * " + L + " + i) * " + H + " + kvh * " + G + ") * " + D + ";\n";
  src += "    for (uint e = lid; e < " + u(group * d) + "; e += " + u(threads) + ") qs[e] = load_q(q0 + e) * " + scale + ";\n";
  src += "    const uint t_begin = sl * " + SPAN + ", t_end = min(t_begin + " + SPAN + ", last);\n";
  src += "    const uint t_first = t_begin + (max(first, t_begin) - t_begin) / " + u(C) + " * " + u(C) + ";\n";
  src += "    float m[" + G + "], total[" + G + "], acc[" + G + "][" + NA + "];\n";
  src += "    " + each_head("{\n      m[hq] = neg_inf;\n      total[hq] = 0.0;\n      [[unroll]] for (uint a = 0u; a < " + NA +
                              "; ++a) acc[hq][a] = 0.0;\n    }\n");
  src += "    for (uint t0 = t_first; t0 < t_end; t0 += " + u(C) + ") {\n";
  src += "      barrier();  // qs written; the previous tile's k and weights are no longer read\n";
  // Loops unrolled where the device wants it (GPUs: their loads are then in flight together).
  const std::string unroll = caps.unroll_loops ? "[[unroll]] " : "";
  // The tile's C x d elements, threads-strided (consecutive threads, consecutive elements).
  const int64_t copies = (C * d + threads - 1) / threads;
  src += "      " + unroll + "for (uint n = 0u; n < " + u(copies) + "; ++n) {\n        const uint e = lid + n * " + u(threads) + ", c = e / " + D +
         ", x = e % " + D + ";\n        " + (copies * threads == C * d ? "" : "if (e < " + u(C * d) + ") ") + "Ks[c * " + DS +
         " + x] = load_k(((b * " + T + " + min(t0 + c, " + u(t - 1) + ")) * " + KV + " + kvh) * " + D + " + x);\n      }\n";
  src += "      barrier();\n";
  // Thread c < C scores key t0 + c; the others (parts > 1: whole subgroups past the first 64
  // threads, so the branch does not diverge within one) skip the scores and take part in the
  // reductions only.
  src += "      const uint key = t0 + lid;\n      const bool seen = lid < " + u(C) + " && key >= first && key < t_end;\n";
  src += "      float s[" + G + "];\n      " + each_head("s[hq] = 0.0;\n");
  src += "      if (lid < " + u(C) + ")\n        " + unroll + "for (uint x = 0u; x < " + D + "; ++x) {\n          const float kx = Ks[lid * " + DS +
         " + x];\n          " + each_head("s[hq] = fma(qs[hq * " + D + " + x], kx, s[hq]);\n") + "        }\n";
  // A key the row does not see (or past the slice) never enters the maximum or the sums.
  src += "      float corr[" + G + "];\n";
  src += "      [[unroll]] for (uint c4 = 0u; c4 < " + u(chunks) + "; ++c4) {\n        vec4 mine = vec4(neg_inf);\n";
  src += "        [[unroll]] for (uint r = 0u; r < 4u; ++r) if (c4 * 4u + r < " + G + ") mine[r] = seen ? s[c4 * 4u + r] : neg_inf;\n";
  src += "        const vec4 top = wg_max4(mine);\n";
  // Every tile holds a visible key, so the new maximum is finite; m = -inf before the first: corr 0.
  src += "        [[unroll]] for (uint r = 0u; r < 4u; ++r) if (c4 * 4u + r < " + G +
         ") {\n          const uint hq = c4 * 4u + r;\n          const float mn = max(m[hq], top[r]);\n          corr[hq] = exp(m[hq] - mn);\n"
         "          m[hq] = mn;\n        }\n      }\n";
  src += "      if (lid < " + u(C) + ") " + each_head("w[hq * " + u(C) + " + lid] = seen ? exp(s[hq] - m[hq]) : 0.0;\n");
  src += "      [[unroll]] for (uint c4 = 0u; c4 < " + u(chunks) + "; ++c4) {\n        vec4 mine = vec4(0.0);\n";
  src += "        [[unroll]] for (uint r = 0u; r < 4u; ++r) if (c4 * 4u + r < " + G + ") mine[r] = lid < " + u(C) + " ? w[(c4 * 4u + r) * " +
         u(C) + " + lid] : 0.0;\n";
  src += "        const vec4 part = wg_sum4(mine);  // its barrier also publishes w[]\n";
  src += "        [[unroll]] for (uint r = 0u; r < 4u; ++r) if (c4 * 4u + r < " + G +
         ") total[c4 * 4u + r] = total[c4 * 4u + r] * corr[c4 * 4u + r] + part[r];\n      }\n";
  src += "      [[unroll]] for (uint a = 0u; a < " + NA + "; ++a) {\n        const uint x = col + a * " + u(local) + ";\n        " +
         each_head("acc[hq][a] *= corr[hq];\n");
  src += "        if (x < " + D + ")\n          " + unroll + "for (uint c = part * " + u(per_part) + "; c < part * " + u(per_part) + " + " +
         u(per_part) + "; ++c) {\n            const uint kc = t0 + c;\n";
  src += "            const float vv = load_v(((b * " + T + " + min(kc, " + u(t - 1) + ")) * " + KV + " + kvh) * " + D + " + x);\n";
  src += "            const float vx = kc >= first && kc < t_end ? vv : 0.0;\n            " +
         each_head("acc[hq][a] = fma(w[hq * " + u(C) + " + c], vx, acc[hq][a]);\n") + "          }\n      }\n";
  src += "    }\n";
  if (parts > 1) {
    // Every part's sums into part 0's, through shared memory.
    const std::string slot = "((part - 1u) * " + G + " + hq) * " + u(column_passes(d) * local) + " + a * " + u(local) + " + col";
    src += "    if (part > 0u) " + each_head("[[unroll]] for (uint a = 0u; a < " + NA + "; ++a) pacc[" + slot + "] = acc[hq][a];\n");
    src += "    barrier();\n    if (part == 0u) " +
           each_head("[[unroll]] for (uint a = 0u; a < " + NA + "; ++a)\n        [[unroll]] for (uint pp = 1u; pp < " + u(parts) + "; ++pp) acc[hq][a] += pacc[((pp - 1u) * " +
                     G + " + hq) * " + u(column_passes(d) * local) + " + a * " + u(local) + " + col];\n");
  }
  src += "    " + each_head("{\n      const uint po = (((b * " + L + " + i) * " + H + " + kvh * " + G + " + hq) * " + S + " + sl) * " + W +
                              ";\n      if (lid == 0u) {\n        b0.v[po] = m[hq];\n        b0.v[po + 1u] = total[hq];\n      }\n" +
                              "      [[unroll]] for (uint a = 0u; a < " + NA + "; ++a) {\n        const uint x = col + a * " + u(local) +
                              ";\n        if (part == 0u && x < " + D + ") b0.v[po + 2u + x] = acc[hq][a];\n      }\n    }\n");
  src += "    barrier();  // qs is rewritten for the next unit\n  }\n}\n";

  kernel_source ks;
  ks.name = "attn1g" + std::to_string(group) + (parts > 1 ? "p" + std::to_string(parts) : "") + "_" + std::to_string(k.root);
  ks.bindings = e.bindings;
  ks.groups = {groups_for(units, 1, caps.max_groups[0]), 1, 1};
  ks.bytes = bytes_of(g, ks.bindings) + static_cast<uint64_t>(as.batch * l * h * slices * (d + 2)) * 4;
  ks.flops = 4.0 * static_cast<double>(as.batch * l * h) * static_cast<double>(t) * static_cast<double>(d);
  ks.glsl = header(g, ks.bindings, sg, static_cast<uint32_t>(threads)) + split_decls(g, p, k, ks.bindings) + prelude + src;
  return ks;
}

}  // namespace

kernel_source attention(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  if (k.pass == 0) {
    if (auto on_tensor_cores = attention_coopmat(g, p, k, caps)) return *on_tensor_cores;
    return attention_tiled(g, p, k, caps);
  }
  const node& at = g[k.root];
  const node_index q = at.inputs[0], kk = at.inputs[1], v = at.inputs[2], pos = at.inputs[3];
  const attention_shape as = attention_shape_of(g[q].dims, g[kk].dims, at.attrs.axis);
  const int64_t l = as.l, h = as.h, d = as.d, t = as.t, kv = as.kv, window = as.window;
  const int64_t group = h / kv, rows = as.batch * l * h, slices = k.slices, C = attention_slice_keys;
  constexpr int64_t local = 64;
  static_assert(attention_slice_keys == local, "a key per thread");
  // Pass 1 for every query head of a key/value head at once where the group and the tiles fit.
  if (k.pass == 1 && t > 0 && group <= grouped_attention_max_group && caps.variants.attention != "ungrouped" &&
      grouped_attention_parts(caps, d, group) > 0)
    return attention_pass1_grouped(g, p, k, caps);
  const bool sg = caps.subgroup_arithmetic && caps.subgroup_size >= 4 && caps.subgroup_size <= local;
  const int64_t tiles_per_slice = attention_tiles_per_slice(t, slices);
  const std::string D = u(d), T = u(t), H = u(h), L = u(l), KV = u(kv), S = u(slices), W = u(d + 2);
  const std::string SPAN = u(tiles_per_slice * C), NA = u((d + local - 1) / local);

  emitter e(g, p, false);
  kernel_source s;
  std::string src;
  // The row's query head j, its batch b and row i, its key/value head, and its visible keys
  // [first, last).
  const std::string locate = "    const uint b = rh / " + u(l * h) + ", i = (rh / " + H + ") % " + L + ", j = rh % " + H + ", kvh = j / " + u(group) +
                             ";\n    const int p = int(load_pos(b * " + L + " + i));\n    const uint last = uint(clamp(p + 1, 0, " +
                             std::to_string(t) + ")), first = " +
                             (window > 0 ? "uint(clamp(p - " + std::to_string(window - 1) + ", 0, int(last)))" : std::string("0u")) + ";\n";
  if (k.pass == 1 && t == 0) {
    // No keys at all (an empty cache): every slice sees nothing, and there is nothing to read.
    e.bind(scratch_id(g, k.scratch));
    src += "void main() {\n  for (uint ws = gl_GlobalInvocationID.x; ws < " + u(rows * slices) + "; ws += gl_NumWorkGroups.x * " + u(local) +
           ") {\n    b0.v[ws * " + W + "] = uintBitsToFloat(0xff800000u);\n    b0.v[ws * " + W + " + 1u] = 0.0;\n  }\n}\n";
    s.name = "attn1_" + std::to_string(k.root);
    s.groups = {groups_for(rows * slices, local, caps.max_groups[0]), 1, 1};
  } else if (k.pass == 1) {
    e.bind(scratch_id(g, k.scratch));  // binding 0: written
    const std::string lq = loader(e, "load_q", q), lk = loader(e, "load_k", kk), lv = loader(e, "load_v", v), lp = loader(e, "load_pos", pos);
    const std::string scale = scale_literal(d);
    src += lq + lk + lv + lp;
    src += "shared float qs[" + D + "];\nshared float w[" + u(C) + "];\nshared float red[" + u(local) + "];\n";
    src += workgroup_reduce("wg_max", true, sg, local) + workgroup_reduce("wg_sum", false, sg, local);
    src += "void main() {\n  const uint lid = gl_LocalInvocationID.x;\n  const float neg_inf = uintBitsToFloat(0xff800000u);\n";
    src += "  for (uint ws = gl_WorkGroupID.x; ws < " + u(rows * slices) + "; ws += gl_NumWorkGroups.x) {\n";
    src += "    const uint rh = ws / " + S + ", sl = ws % " + S + ";\n" + locate;
    // The slice's keys [sl * SPAN, sl * SPAN + SPAN), walked a tile of C at a time from the tile
    // holding its first visible key to its last visible key, with a running maximum m (the
    // weights and sums so far rescaled by exp(m_old - m_new) when it grows).
    src += "    const uint t_begin = sl * " + SPAN + ", t_end = min(t_begin + " + SPAN + ", last);\n";
    src += "    const uint t_first = t_begin + (max(first, t_begin) - t_begin) / " + u(C) + " * " + u(C) + ";\n";
    src += "    for (uint x = lid; x < " + D + "; x += " + u(local) + ") qs[x] = load_q(rh * " + D + " + x) * " + scale + ";\n    barrier();\n";
    src += "    float m = neg_inf, total = 0.0, acc[" + NA + "];\n    [[unroll]] for (uint a = 0u; a < " + NA + "; ++a) acc[a] = 0.0;\n";
    src += "    for (uint t0 = t_first; t0 < t_end; t0 += " + u(C) + ") {\n";
    src += "      const uint key = t0 + lid, ko = ((b * " + T + " + min(key, " + u(t - 1) + ")) * " + KV + " + kvh) * " + D + ";\n";
    src += "      float s = 0.0;\n      [[unroll]] for (uint x = 0u; x < " + D + "; ++x) s = fma(qs[x], load_k(ko + x), s);\n";
    src += "      const bool seen = key >= first && key < t_end;\n      if (!seen) s = neg_inf;\n";
    src += "      const float mn = max(m, wg_max(s));\n";
    // mn is finite: the tile holds a visible key. m = -inf before the first: corr 0.
    src += "      const float corr = exp(m - mn), wt = seen ? exp(s - mn) : 0.0;\n      w[lid] = wt;\n";
    src += "      total = total * corr + wg_sum(wt);\n      m = mn;\n";  // wg_sum's barrier also publishes w[]
    src += "      [[unroll]] for (uint a = 0u; a < " + NA + "; ++a) {\n        const uint x = lid + a * " + u(local) + ";\n        acc[a] *= corr;\n";
    src += "        if (x < " + D + ")\n          [[unroll]] for (uint c = 0u; c < " + u(C) + "; ++c) {\n            const uint kc = t0 + c;\n";
    src += "            const float vv = load_v(((b * " + T + " + min(kc, " + u(t - 1) + ")) * " + KV + " + kvh) * " + D + " + x);\n";
    src += "            acc[a] = fma(w[c], kc >= first && kc < t_end ? vv : 0.0, acc[a]);\n          }\n      }\n";
    src += "      barrier();  // w is rewritten by the next tile\n    }\n";
    src += "    const uint po = ws * " + W + ";\n    if (lid == 0u) {\n      b0.v[po] = m;\n      b0.v[po + 1u] = total;\n    }\n";
    src += "    [[unroll]] for (uint a = 0u; a < " + NA + "; ++a) {\n      const uint x = lid + a * " + u(local) + ";\n      if (x < " + D +
           ") b0.v[po + 2u + x] = acc[a];\n    }\n    barrier();  // qs is rewritten for the next slice\n  }\n}\n";
    s.name = "attn1_" + std::to_string(k.root);
    s.groups = {groups_for(rows * slices, 1, caps.max_groups[0]), 1, 1};
  } else {
    e.bind(k.root);
    const int part_binding = e.bind(scratch_id(g, k.scratch));
    const std::string part = "b" + std::to_string(part_binding) + ".v";
    std::string store;
    e.scoped([&] {
      store = e.store(k.root, "rh * " + D + " + x", "res");
      store = e.body + store;
      e.body.clear();
    });
    src += "void main() {\n  const uint lid = gl_LocalInvocationID.x;\n  const float neg_inf = uintBitsToFloat(0xff800000u);\n";
    src += "  for (uint rh = gl_WorkGroupID.x; rh < " + u(rows) + "; rh += gl_NumWorkGroups.x) {\n";
    src += "    float top = neg_inf;\n    for (uint sl = 0u; sl < " + S + "; ++sl) top = max(top, " + part + "[(rh * " + S + " + sl) * " + W + "]);\n";
    src += "    for (uint x = lid; x < " + D + "; x += " + u(local) + ") {\n      float acc = 0.0, total = 0.0;\n";
    src += "      if (top > neg_inf)\n        for (uint sl = 0u; sl < " + S + "; ++sl) {\n          const uint o = (rh * " + S + " + sl) * " + W + ";\n";
    src += "          const float f = exp(" + part + "[o] - top);\n          total = fma(f, " + part + "[o + 1u], total);\n          acc = fma(f, " +
           part + "[o + 2u + x], acc);\n        }\n";
    src += "      const float res = total > 0.0 ? acc / total : 0.0;\n" + store + "    }\n  }\n}\n";
    s.name = "attn2_" + std::to_string(k.root);
    s.groups = {groups_for(rows, 1, caps.max_groups[0]), 1, 1};
  }
  s.bindings = e.bindings;
  s.bytes = bytes_of(g, s.bindings) + static_cast<uint64_t>(rows * slices * (d + 2)) * 4;
  s.flops = k.pass == 1 ? 4.0 * static_cast<double>(rows) * static_cast<double>(t) * static_cast<double>(d) : 0.0;
  s.glsl = header(g, s.bindings, k.pass == 1 && sg, local) + split_decls(g, p, k, s.bindings) + prelude + src;
  return s;
}

}  // namespace mesh::gpu::detail
