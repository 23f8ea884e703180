#include "graph/datasets.hpp"

#include <cmath>
#include <random>

namespace mesh::datasets {

labelled two_moons(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> angle(0, M_PI);
  std::normal_distribution<double> noise(0, 0.1);
  std::vector<float> xs;
  std::vector<int32_t> ys;
  for (int64_t i = 0; i < n; ++i) {
    const double a = angle(rng);
    const int cls = static_cast<int>(i % 2);
    xs.push_back(static_cast<float>((cls ? 1 - std::cos(a) : std::cos(a)) + noise(rng)));
    xs.push_back(static_cast<float>((cls ? 0.5 - std::sin(a) : std::sin(a)) + noise(rng)));
    ys.push_back(cls);
  }
  return {tensor::from_floats({n, 2}, xs), tensor::from_ints({n}, ys)};
}

labelled xor_points() {
  return {tensor::from_floats({4, 2}, {0, 0, 0, 1, 1, 0, 1, 1}), tensor::from_ints({4}, {0, 1, 1, 0})};
}

}  // namespace mesh::datasets
