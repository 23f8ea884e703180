#include "graph/tensor.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

namespace mesh {

tensor tensor::zeros(dtype t, shape s) {
  tensor x;
  x.type = t;
  x.dims = std::move(s);
  x.bytes.assign(static_cast<size_t>(element_count(x.dims)) * size_of(t), 0);
  return x;
}

tensor tensor::from_values(dtype t, shape s, const std::vector<double>& values) {
  tensor x = zeros(t, std::move(s));
  assert(static_cast<int64_t>(values.size()) == x.size());
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
  }
  return 0;
}

void tensor::set(int64_t i, double v) {
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
  }
}

std::vector<double> tensor::to_doubles() const {
  std::vector<double> out(static_cast<size_t>(size()));
  for (int64_t i = 0; i < size(); ++i) out[static_cast<size_t>(i)] = at(i);
  return out;
}

std::vector<float> tensor::to_floats() const {
  std::vector<float> out(static_cast<size_t>(size()));
  for (int64_t i = 0; i < size(); ++i) out[static_cast<size_t>(i)] = static_cast<float>(at(i));
  return out;
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
  if (static_cast<int64_t>(bytes.size()) != n * static_cast<int64_t>(size_of(type)))
    return make_error(error_code::invalid_argument,
                      "tensor " + to_string(dims) + " of " + mesh::to_string(type) + " needs " +
                          std::to_string(n * static_cast<int64_t>(size_of(type))) + " bytes, has " +
                          std::to_string(bytes.size()));
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
