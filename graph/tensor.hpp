#pragma once
/// A dense host tensor: element type, shape and row-major little-endian bytes.
///
/// This is what crosses the API and the wire (inputs, outputs, parameters). Devices keep their
/// own copies; the reference evaluator converts to double per element.
#include <cstdint>
#include <string>
#include <vector>

#include "graph/dtype.hpp"
#include "base/error.hpp"
#include "graph/shape.hpp"

namespace mesh {

struct tensor {
  dtype type = dtype::f32;
  shape dims;
  std::vector<uint8_t> bytes;  ///< element_count(dims) * size_of(type) bytes

  /// A tensor of zeros.
  static tensor zeros(dtype t, shape s);
  /// A tensor holding `values` rounded to `t` (values.size() must equal the element count).
  static tensor from_values(dtype t, shape s, const std::vector<double>& values);
  /// An f32 tensor.
  static tensor from_floats(shape s, const std::vector<float>& values);
  /// An i32 tensor.
  static tensor from_ints(shape s, const std::vector<int32_t>& values);
  /// A rank-0 tensor.
  static tensor scalar(double value, dtype t = dtype::f32);

  int64_t size() const { return element_count(dims); }
  /// Element i as double (any dtype).
  double at(int64_t i) const;
  /// Stores v (rounded to the dtype) at element i.
  void set(int64_t i, double v);
  std::vector<double> to_doubles() const;
  std::vector<float> to_floats() const;

  /// Checks that the byte count matches dtype and shape (for tensors from a peer or a file).
  expected<void> check() const;

  bool operator==(const tensor&) const = default;
};

/// A tensor with its name: how tensor maps travel in messages (as lists, so a decoder can refuse
/// a duplicate name instead of silently dropping one).
struct named_tensor {
  std::string name;
  tensor value;
  bool operator==(const named_tensor&) const = default;
};

/// max |a-b| / max(1, max |b|): a normalised error for comparing a result with a reference.
double normalised_error(const tensor& a, const tensor& b);

}  // namespace mesh
