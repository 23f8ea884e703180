#pragma once
/// Tensor shapes: a list of dimension sizes, rank 0 (a scalar) to max_rank.
#include <cstdint>
#include <string>
#include <vector>

namespace mesh {

/// Dimension sizes, outermost first. `{}` is a scalar. Sizes may be 0 (an empty tensor).
using shape = std::vector<int64_t>;

/// The highest rank a graph may use (checked by validate()).
inline constexpr int max_rank = 6;

/// Number of elements; 1 for a scalar. Assumes a validated shape (no overflow).
int64_t element_count(const shape& s);

/// Row-major strides in elements.
std::vector<int64_t> strides_of(const shape& s);

/// "[2,3,4]".
std::string to_string(const shape& s);

}  // namespace mesh
