#pragma once
/// Optimizers written as graph updates: the step runs inside the same graph as forward and
/// backward, on whatever device runs the graph, and its state is ordinary parameters named
/// "opt.<kind>.<param>" (zeros at start; see nn::init_parameters).
#include <vector>

#include "graph/builder.hpp"

namespace mesh::optim {

struct sgd_options {
  double lr = 0.1;
  double momentum = 0.0;  ///< 0 = plain SGD (no state)
};

/// p <- p - lr * v with v <- momentum * v + g (or v = g without momentum).
void sgd(builder& b, const std::vector<expr>& params, const std::vector<expr>& grads, const sgd_options& o,
         source_loc loc = source_loc::current());

struct adam_options {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;  ///< decoupled (AdamW) when > 0
};

/// Adam / AdamW with bias correction. Adds state "opt.adam.m.<p>", "opt.adam.v.<p>" and the step
/// counter "opt.adam.t" (f32 scalar).
void adam(builder& b, const std::vector<expr>& params, const std::vector<expr>& grads, const adam_options& o,
          source_loc loc = source_loc::current());

}  // namespace mesh::optim
