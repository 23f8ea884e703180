#include "graph/optim.hpp"

namespace mesh::optim {
void sgd(builder& b, const std::vector<expr>& params, const std::vector<expr>& grads, const sgd_options& o,
         source_loc loc) {
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
      b.update(v, step, loc);
    }
    b.update(p, p - step * o.lr, loc);
  }
}

void adam(builder& b, const std::vector<expr>& params, const std::vector<expr>& grads, const adam_options& o,
          source_loc loc) {
  if (params.size() != grads.size()) {
    b.fail({error_code::invalid_argument, "adam: params and grads differ in count"}, loc);
    return;
  }
  const expr t = b.parameter("opt.adam.t", dtype::f32, {}, loc);
  const expr t1 = t + 1.0;
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
    b.update(m, narrow(m1), loc);
    b.update(v, narrow(v1), loc);
    const expr c1 = cast(correction1, work, loc), c2 = cast(correction2, work, loc);
    const expr pw = widen(p);
    expr step = (m1 / c1) / (sqrt(v1 / c2, loc) + o.eps);
    if (o.weight_decay != 0.0) step = step + pw * o.weight_decay;
    b.update(p, narrow(pw - step * o.lr), loc);
  }
}

}  // namespace mesh::optim
