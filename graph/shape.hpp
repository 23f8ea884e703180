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

/// Element count of `s` when every dimension is >= 0 and the product of its non-zero dimensions
/// is at most `limit`, else -1. The non-zero product, not the count, is bounded: a shape such as
/// [0, 2^31, 2^31] has no elements, yet strides, reductions over its other axes and index
/// arithmetic would all multiply its huge dimensions. Every decoder of shapes checks with this.
int64_t bounded_element_count(const shape& s, int64_t limit);

/// Row-major strides in elements.
std::vector<int64_t> strides_of(const shape& s);

/// "[2,3,4]".
std::string to_string(const shape& s);

}  // namespace mesh
