// The matmul schedule: block shapes per problem, device and kernel_variants (matmul_schedule.hpp).
#include "gpu/matmul_schedule.hpp"

#include <cstdio>

namespace mesh::gpu::detail {

mm_dims dims_of(const graph& g, const kernel& k) {
  const node& mm = g[k.anchor];
  mm_dims d;
  d.a = mm.inputs[0];
  d.b = mm.inputs[1];
  if (mm.op == op_kind::linear) {  // x [..., k] as [rows, k] times w [n, k] read transposed; one batch
    const shape& xd = g[d.a].dims;
    d.m = element_count(shape(xd.begin(), xd.end() - 1));
    d.kd = xd.back();
    d.n = mm.dims.back();
    d.batch = 1;
    return d;
  }
  const shape& ad = g[d.a].dims;
  const size_t rank = ad.size();
  d.m = ad[rank - 2];
  d.kd = ad[rank - 1];
  d.n = mm.dims[rank - 1];
  d.batch = d.m * d.n != 0 ? element_count(mm.dims) / (d.m * d.n) : 0;
  return d;
}

bool many_big_tiles(const mm_dims& d) { return ((d.m + 127) / 128) * ((d.n + 127) / 128) * d.batch >= 128; }

std::optional<warp_tile> pick_warp_tile(const mm_dims& d, const device_caps& caps) {
  warp_tile t;
  const bool big = many_big_tiles(d);
  if (!big) t.rm = t.rn = 1;
  if (big && caps.variants.gemm == "wide") t.rn = 4;
  if (big && caps.variants.gemm == "narrow") t.rn = 1;
  if (caps.variants.gemm == "warp16") t.bk = 16;
  if (t.shared_bytes() > static_cast<int64_t>(caps.shared_memory_bytes)) return std::nullopt;
  return t;
}

std::optional<coop_tile> parse_coop_tile(const std::string& spec) {
  long v[5] = {0, 0, 0, 0, 0};
  int used = 0;
  if (std::sscanf(spec.c_str(), "g%ldx%ldf%ldx%ldk%ld%n", &v[0], &v[1], &v[2], &v[3], &v[4], &used) != 5 ||
      static_cast<size_t>(used) != spec.size())
    return std::nullopt;
  const coop_tile t{v[0], v[1], v[2], v[3], v[4]};
  const auto in = [](int64_t x, int64_t lo, int64_t hi) { return x >= lo && x <= hi; };
  if (!in(t.sgm, 1, 8) || !in(t.sgn, 1, 8) || t.sgm * t.sgn > 16 || !in(t.fm, 1, 8) || !in(t.fn, 1, 8) || !in(t.bk, 16, 64) ||
      t.bk % 16 != 0)
    return std::nullopt;
  return t;
}

std::optional<coop_tile> pick_coop_tile(const mm_dims& d, const device_caps& caps) {
  coop_tile t;
  const bool big = many_big_tiles(d);
  if (auto spec = parse_coop_tile(caps.variants.coopmat)) t = *spec;
  else if (!big) t = {2, 2, 2, 2, 32};
  else if (caps.variants.coopmat == "s8") t = {2, 4, 4, 2, 32};
  else if (caps.variants.coopmat == "wide") t = {2, 4, 4, 4, 16};
  if (t.shared_bytes() > static_cast<int64_t>(caps.shared_memory_bytes)) return std::nullopt;
  return t;
}

}  // namespace mesh::gpu::detail
