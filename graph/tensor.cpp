#include "graph/tensor.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "graph/quant.hpp"

namespace mesh {

tensor tensor::zeros(dtype t, shape s) {
  tensor x;
  x.type = t;
  x.dims = std::move(s);
  const int64_t bytes = byte_size(t, x.dims);
  assert(bytes >= 0);
  x.bytes.assign(static_cast<size_t>(std::max<int64_t>(bytes, 0)), 0);
  return x;
}

tensor tensor::from_values(dtype t, shape s, const std::vector<double>& values) {
  tensor x = zeros(t, std::move(s));
  assert(static_cast<int64_t>(values.size()) == x.size());
  if (is_quantized(t)) {
    const int64_t k = x.dims.back(), rows = k ? x.size() / k : 0, rb = *row_bytes(t, k);
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < k; ++c) row[static_cast<size_t>(c)] = static_cast<float>(values[static_cast<size_t>(r * k + c)]);
      (void)quantize_row(t, row, {x.bytes.data() + r * rb, static_cast<size_t>(rb)});
    }
    return x;
  }
  for (size_t i = 0; i < values.size(); ++i) x.set(static_cast<int64_t>(i), values[i]);
  return x;
}

tensor tensor::from_floats(shape s, const std::vector<float>& values) {
  tensor x = zeros(dtype::f32, std::move(s));
  assert(values.size() * 4 == x.bytes.size());
  std::memcpy(x.bytes.data(), values.data(), x.bytes.size());
  return x;
}

tensor tensor::from_ints(shape s, const std::vector<int32_t>& values) {
  tensor x = zeros(dtype::i32, std::move(s));
  assert(values.size() * 4 == x.bytes.size());
  std::memcpy(x.bytes.data(), values.data(), x.bytes.size());
  return x;
}

tensor tensor::scalar(double value, dtype t) { return from_values(t, {}, {value}); }

double tensor::at(int64_t i) const {
  if (is_quantized(type)) {
    const int64_t k = dims.back();
    return dequantize_element(type, bytes.data() + i / k * *row_bytes(type, k), i % k);
  }
  const uint8_t* p = bytes.data() + i * static_cast<int64_t>(size_of(type));
  switch (type) {
    case dtype::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case dtype::i32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case dtype::f16:
    case dtype::bf16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return type == dtype::f16 ? half_to_float(h) : bf16_to_float(h);
    }
    default: return 0;
  }
}

void tensor::set(int64_t i, double v) {
  assert(!is_quantized(type));
  uint8_t* p = bytes.data() + i * static_cast<int64_t>(size_of(type));
  switch (type) {
    case dtype::f32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case dtype::i32: {
      int32_t x = static_cast<int32_t>(round_to(dtype::i32, v));
      std::memcpy(p, &x, 4);
      return;
    }
    case dtype::f16:
    case dtype::bf16: {
      uint16_t h = type == dtype::f16 ? float_to_half(static_cast<float>(v))
                                      : float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    default: return;
  }
}

std::vector<double> tensor::to_doubles() const {
  std::vector<double> out(static_cast<size_t>(size()));
  if (is_quantized(type)) {  // row by row: at() would decode a whole block per element
    const int64_t k = dims.back(), rows = k ? size() / k : 0, rb = *row_bytes(type, k);
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
      (void)dequantize_row(type, {bytes.data() + r * rb, static_cast<size_t>(rb)}, row);
      std::copy(row.begin(), row.end(), out.begin() + r * k);
    }
    return out;
  }
  const int64_t n = size();
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = at(i);
  return out;
}

std::vector<float> tensor::to_floats() const {
  if (is_quantized(type)) {
    const auto d = to_doubles();
    return std::vector<float>(d.begin(), d.end());
  }
  const int64_t n = size();
  std::vector<float> out(static_cast<size_t>(n));
  // f32 (a step's logits: 128k of them for Llama 3) is a copy of the bytes; element by element
  // through at() it cost a decode step 0.8 ms.
  if (type == dtype::f32) {
    if (n > 0) std::memcpy(out.data(), bytes.data(), static_cast<size_t>(n) * sizeof(float));
    return out;
  }
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<float>(at(i));
  return out;
}

expected<void> tensor_view::check() const {
  const int64_t want = static_cast<int>(type) < dtype_count ? byte_size(type, dims, std::numeric_limits<int64_t>::max() / 16) : -1;
  if (want < 0) {  // tensor::check() names what is wrong with the dtype or the shape
    tensor meta;
    meta.type = type;
    meta.dims = dims;
    return meta.check();
  }
  if (static_cast<uint64_t>(want) != bytes.size())
    return make_error(error_code::invalid_argument, "tensor " + to_string(dims) + " of " + mesh::to_string(type) + " needs " +
                                                        std::to_string(want) + " bytes, has " + std::to_string(bytes.size()));
  return {};
}

expected<void> tensor::check() const {
  if (static_cast<int>(type) >= dtype_count)
    return make_error(error_code::invalid_argument, "unknown dtype " + std::to_string(static_cast<int>(type)));
  if (dims.size() > static_cast<size_t>(max_rank))
    return make_error(error_code::limit_exceeded, "tensor rank " + std::to_string(dims.size()) +
                                                      " exceeds " + std::to_string(max_rank));
  for (auto d : dims)
    if (d < 0) return make_error(error_code::invalid_argument, "negative dimension in " + to_string(dims));
  const int64_t n = bounded_element_count(dims, std::numeric_limits<int64_t>::max() / 16);
  if (n < 0) return make_error(error_code::limit_exceeded, "tensor " + to_string(dims) + " is too large");
  const int64_t want = byte_size(type, dims, std::numeric_limits<int64_t>::max() / 16);
  if (want < 0) return make_error(error_code::invalid_argument, byte_size_problem(type, dims));
  if (static_cast<int64_t>(bytes.size()) != want)
    return make_error(error_code::invalid_argument,
                      "tensor " + to_string(dims) + " of " + mesh::to_string(type) + " needs " + std::to_string(want) +
                          " bytes, has " + std::to_string(bytes.size()));
  return {};
}

double normalised_error(const tensor& a, const tensor& b) {
  if (a.dims != b.dims) return std::numeric_limits<double>::infinity();
  double scale = 1, worst = 0;
  for (int64_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(b.at(i)));
  for (int64_t i = 0; i < a.size(); ++i) {
    const double x = a.at(i), y = b.at(i);
    if (std::isnan(x) != std::isnan(y)) return std::numeric_limits<double>::infinity();
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (!std::isnan(x)) worst = std::max(worst, std::abs(x - y));
  }
  return worst / scale;
}

}  // namespace mesh
