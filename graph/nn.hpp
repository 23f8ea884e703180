#pragma once
/// Neural-network building blocks composed from the closed op set (no new ops: the kernel compiler
/// fuses these patterns), plus parameter creation and initialisation.
///
/// Parameters are created in the builder with dotted names ("block0.attn.wq"); optimizer state
/// lives under "opt." (see optim.hpp). init_parameters() gives every parameter of a graph a
/// deterministic starting value chosen by its name.
#include <cstdint>
#include <string>
#include <vector>

#include "graph/builder.hpp"
#include "graph/evaluate.hpp"

namespace mesh::nn {

// ---- composites ----
expr softmax(const expr& x, int64_t axis = -1, source_loc loc = source_loc::current());
expr log_softmax(const expr& x, int64_t axis = -1, source_loc loc = source_loc::current());
/// Mean cross-entropy of `logits` [..., classes] against i32 `labels` [...]. A label outside
/// [0, classes) is an error in evaluate() (see one_hot()).
expr cross_entropy(const expr& logits, const expr& labels, source_loc loc = source_loc::current());
/// Mean squared error.
expr mse(const expr& prediction, const expr& target, source_loc loc = source_loc::current());
/// Normalises over the last axis, then scales by gamma and shifts by beta (both [features]).
expr layer_norm(const expr& x, const expr& gamma, const expr& beta, double eps = 1e-5,
                source_loc loc = source_loc::current());
/// GELU, tanh approximation.
expr gelu(const expr& x, source_loc loc = source_loc::current());
/// i32 [n] constant 0, 1, ..., n-1.
expr iota(builder& b, int64_t n, source_loc loc = source_loc::current());
/// One-hot [..., classes] of i32 labels [...], of dtype `t`. A label outside [0, classes) is an
/// error in evaluate() that names it (the labels pass through a gather); an executor, which does
/// not check, gives it the row of class 0.
expr one_hot(const expr& labels, int64_t classes, dtype t = dtype::f32, source_loc loc = source_loc::current());

// ---- layers with their parameters ----
struct linear {
  expr w, b;  ///< [in, out], [out]
  expr operator()(const expr& x, source_loc loc = source_loc::current()) const;
};
linear make_linear(builder& b, const std::string& name, int64_t in, int64_t out, dtype t = dtype::f32);

/// A multi-layer perceptron: linear layers with `activation` between them (not after the last).
struct mlp {
  std::vector<linear> layers;
  expr operator()(const expr& x, source_loc loc = source_loc::current()) const;
};
mlp make_mlp(builder& b, const std::string& name, const std::vector<int64_t>& sizes, dtype t = dtype::f32);

/// Causal multi-head self-attention on x [batch, time, channels].
struct attention {
  expr wq, wk, wv, wo;  ///< [channels, channels]
  int64_t heads = 1;
  expr operator()(const expr& x, source_loc loc = source_loc::current()) const;
};
attention make_attention(builder& b, const std::string& name, int64_t channels, int64_t heads, dtype t = dtype::f32);

/// A pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x)) with a 4x GELU MLP.
struct transformer_block {
  expr ln1_gamma, ln1_beta, ln2_gamma, ln2_beta;
  attention attn;
  linear up, down;
  expr operator()(const expr& x, source_loc loc = source_loc::current()) const;
};
transformer_block make_transformer_block(builder& b, const std::string& name, int64_t channels, int64_t heads,
                                         dtype t = dtype::f32);

/// Starting values for every parameter of `g`, by name: "*.gamma" ones, "*.b"/"*.beta" and
/// "opt.*" zeros, other matrices uniform in +-sqrt(6/(fan_in+fan_out)) (Glorot), other vectors
/// uniform in +-0.1. Deterministic for a seed.
tensor_map init_parameters(const graph& g, uint64_t seed);

}  // namespace mesh::nn
