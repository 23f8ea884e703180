#include "graph/optim.hpp"

namespace mesh::optim {
namespace {
/// `next`, or `old` where `take` is 0 (no `take`: always `next`).
expr gated(const expr& take, const expr& next, const expr& old) {
  if (!take.ok()) return next;
  return select(broadcast_to(take, next.dims()), next, old);
}
}  // namespace

void sgd(builder& b, const std::vector<expr>& params, const std::vector<expr>& grads, const sgd_options& o,
         const expr& take, source_loc loc) {
  if (params.size() != grads.size()) {
    b.fail({error_code::invalid_argument, "sgd: params and grads differ in count"}, loc);
    return;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const expr& p = params[i];
    if (!p.ok() || !grads[i].ok()) return;
    expr step = grads[i];
    if (o.momentum != 0.0) {
      const expr v = b.parameter("opt.sgd.v." + p.name(), p.type(), p.dims(), loc);
      step = v * o.momentum + grads[i];
      b.update(v, gated(take, step, v), loc);
    }
    b.update(p, gated(take, p - step * o.lr, p), loc);
  }
}

void adam(builder& b, const std::vector<expr>& params, const std::vector<expr>& grads, const adam_options& o,
          const expr& take, source_loc loc) {
  if (params.size() != grads.size()) {
    b.fail({error_code::invalid_argument, "adam: params and grads differ in count"}, loc);
    return;
  }
  const expr t = b.parameter("opt.adam.t", dtype::f32, {}, loc);
  // A skipped step does not count: bias correction follows the steps taken.
  const expr t1 = take.ok() ? t + cast(take, dtype::f32, loc) : t + 1.0;
  b.update(t, t1, loc);
  const expr correction1 = 1.0 - pow(b.scalar(o.beta1), t1);
  const expr correction2 = 1.0 - pow(b.scalar(o.beta2), t1);
  for (size_t i = 0; i < params.size(); ++i) {
    const expr& p = params[i];
    const expr& g = grads[i];
    if (!p.ok() || !g.ok()) return;
    const std::string name = p.name();
    const dtype type = p.type();
    const expr m = b.parameter("opt.adam.m." + name, type, p.dims(), loc);
    const expr v = b.parameter("opt.adam.v." + name, type, p.dims(), loc);
    // The update is computed in f32 whatever the parameter's float type, and only the results
    // (m, v, p) are rounded back to it: in f16 eps = 1e-8 is 0 and sqrt(v) of a small v is 0
    // too, so a zero gradient gave 0 / 0 = NaN. The state keeps the parameter's type. An f32
    // parameter gets exactly the graph it always had (no casts added).
    const dtype work = is_float(type) ? dtype::f32 : type;
    const auto widen = [&](const expr& e) { return type == work ? e : cast(e, work, loc); };
    const auto narrow = [&](const expr& e) { return type == work ? e : cast(e, type, loc); };
    const expr gw = widen(g);
    const expr m1 = widen(m) * o.beta1 + gw * (1.0 - o.beta1);
    const expr v1 = widen(v) * o.beta2 + gw * gw * (1.0 - o.beta2);
    b.update(m, gated(take, narrow(m1), m), loc);
    b.update(v, gated(take, narrow(v1), v), loc);
    const expr c1 = cast(correction1, work, loc), c2 = cast(correction2, work, loc);
    const expr pw = widen(p);
    expr step = (m1 / c1) / (sqrt(v1 / c2, loc) + o.eps);
    if (o.weight_decay != 0.0) step = step + pw * o.weight_decay;
    b.update(p, gated(take, narrow(pw - step * o.lr), p), loc);
  }
}

expr unscale_gradients(builder& b, std::vector<expr>& grads, const loss_scaling& o, source_loc loc) {
  const expr s = b.parameter(loss_scale_name, dtype::f32, {}, loc);
  const expr good = b.parameter(loss_scale_good_name, dtype::f32, {}, loc);
  const expr inverse = 1.0 / s;
  // Non-finite entries counted: |g| <= FLT_MAX is false for inf and (an ordered comparison) NaN.
  expr bad = b.scalar(0.0);
  for (auto& g : grads) {
    if (!g.ok()) return g;
    const expr unscaled = g * cast(inverse, g.type(), loc);
    const expr finite = compare(abs(unscaled), 3.4028234663852886e38, compare_kind::le);
    bad = bad + sum_all(cast(1 - finite, dtype::f32, loc), loc);
    g = unscaled;
  }
  const expr take = compare(bad, 0.0, compare_kind::eq);
  const expr good1 = good + 1.0;
  const expr grow = compare(good1, static_cast<double>(o.growth_interval), compare_kind::ge);
  b.update(s, select(take, select(grow, s * 2.0, s), s * 0.5), loc);
  b.update(good, select(take, select(grow, b.scalar(0.0), good1), b.scalar(0.0)), loc);
  return take;
}

}  // namespace mesh::optim
