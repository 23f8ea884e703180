#pragma once
/// Small synthetic datasets the project generates itself (no downloads), for examples and tests.
#include <cstdint>

#include "graph/tensor.hpp"

namespace mesh::datasets {

/// Features f32 [n, 2] and labels i32 [n].
struct labelled {
  tensor x, y;
};

/// Two interleaving half circles with Gaussian noise (sd 0.1): not linearly separable.
labelled two_moons(int64_t n, uint64_t seed);

/// The four XOR points.
labelled xor_points();

}  // namespace mesh::datasets
