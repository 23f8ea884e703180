#pragma once
/// Optimizers written as graph updates: the step runs inside the same graph as forward and
/// backward, on whatever device runs the graph, and its state is ordinary parameters named
/// "opt.<kind>.<param>" (zeros at start; see nn::init_parameters).
#include <cstdint>
#include <vector>

#include "graph/builder.hpp"

namespace mesh::optim {

struct sgd_options {
  double lr = 0.1;
  double momentum = 0.0;  ///< 0 = plain SGD (no state)
};

/// p <- p - lr * v with v <- momentum * v + g (or v = g without momentum).
///
/// `take` (optional, both optimizers): an i32 scalar; where it is 0 the step is skipped, every
/// parameter and every piece of optimizer state keeping its value (mixed precision's loss scaling
/// skips a step whose gradients overflowed: see loss_scaling below).
void sgd(builder& b, const std::vector<expr>& params, const std::vector<expr>& grads, const sgd_options& o,
         const expr& take = {}, source_loc loc = source_loc::current());

struct adam_options {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;  ///< decoupled (AdamW) when > 0
};

/// Adam / AdamW with bias correction. Adds state "opt.adam.m.<p>", "opt.adam.v.<p>" and the step
/// counter "opt.adam.t" (f32 scalar).
void adam(builder& b, const std::vector<expr>& params, const std::vector<expr>& grads, const adam_options& o,
          const expr& take = {}, source_loc loc = source_loc::current());

/// Dynamic loss scaling for f16 gradients (Micikevicius et al., "Mixed Precision Training"): the
/// loss is multiplied by a scale S before the backward pass so that small gradients do not flush to
/// zero in f16, and the gradients are divided by S before the optimizer. A step whose gradients hold
/// an inf or NaN (the scaled values overflowed f16) is skipped and S halved; after
/// `growth_interval` finite steps in a row S doubles. S and the count live in the state as
/// "opt.loss_scale" and "opt.loss_scale.good" (f32 scalars), so a resumed run goes on with them.
struct loss_scaling {
  double initial = 65536;          ///< S at the first step (PyTorch's GradScaler starts here too)
  uint32_t growth_interval = 2000; ///< finite steps in a row before S doubles
};

/// The state names loss scaling keeps.
inline constexpr const char* loss_scale_name = "opt.loss_scale";
inline constexpr const char* loss_scale_good_name = "opt.loss_scale.good";

/// Unscales `grads` (each times 1 / S, in place) and returns `take`: an i32 scalar, 1 when every
/// gradient is finite. Also adds the updates of S and of the good-step count.
expr unscale_gradients(builder& b, std::vector<expr>& grads, const loss_scaling& o, source_loc loc = source_loc::current());

}  // namespace mesh::optim
