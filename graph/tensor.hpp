#pragma once
/// A dense host tensor: element type, shape and row-major little-endian bytes.
///
/// This is what crosses the API and the wire (inputs, outputs, parameters). Devices keep their
/// own copies; the reference evaluator converts to double per element. A tensor of a quantized
/// dtype holds its blocks as they lie (graph/quant.hpp): reading an element decodes it, and
/// from_values() encodes with a simple quantizer; set() is not defined for it.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "graph/dtype.hpp"
#include "base/error.hpp"
#include "graph/shape.hpp"

namespace mesh {

struct tensor {
  dtype type = dtype::f32;
  shape dims;
  std::vector<uint8_t> bytes;  ///< byte_size(type, dims) bytes (element_count(dims) * size_of(type) for plain dtypes)

  /// A tensor of zeros.
  static tensor zeros(dtype t, shape s);
  /// A tensor holding `values` rounded to `t` (values.size() must equal the element count);
  /// for a quantized `t`, encoded row by row by quantize_row().
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
  /// Stores v (rounded to the dtype) at element i; not for quantized dtypes (asserts).
  void set(int64_t i, double v);
  std::vector<double> to_doubles() const;
  std::vector<float> to_floats() const;

  /// Checks that the byte count matches dtype and shape (for tensors from a peer or a file): a
  /// quantized tensor needs rank >= 1, a last dim that is a multiple of its block, and
  /// rows x row_bytes bytes.
  expected<void> check() const;

  bool operator==(const tensor&) const = default;
};

/// A tensor's dtype and shape over bytes someone else owns (a memory-mapped checkpoint): what
/// executor::set_parameter_view uploads without a host copy. The bytes must outlive the call.
struct tensor_view {
  dtype type = dtype::f32;
  shape dims;
  std::span<const uint8_t> bytes;

  /// The same checks as tensor::check().
  expected<void> check() const;
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
