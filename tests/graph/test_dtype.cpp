// Conversions between f32 and the 16-bit float formats round to nearest even.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "graph/dtype.hpp"
#include "graph/tensor.hpp"

using namespace mesh;

TEST_CASE("f16 conversion: exact values, rounding, overflow, subnormals, NaN", "[graph][dtype]") {
  for (float v : {0.0f, 1.0f, -2.0f, 0.5f, 1024.0f, 65504.0f, 6.103515625e-05f}) CHECK(half_to_float(float_to_half(v)) == v);
  CHECK(float_to_half(1.0f) == 0x3c00);
  CHECK(float_to_half(1.0f + 1.0f / 4096) == 0x3c00);  // below half an ulp: rounds down
  CHECK(float_to_half(1.0f + 3.0f / 2048) == 0x3c02);  // a tie rounds to even
  CHECK(std::isinf(half_to_float(float_to_half(70000.0f))));
  CHECK(half_to_float(float_to_half(5.960464477539063e-08f)) == 5.960464477539063e-08f);  // smallest subnormal
  CHECK(std::isnan(half_to_float(float_to_half(std::numeric_limits<float>::quiet_NaN()))));
  for (int i = 0; i < 65536; i += 7) {  // every finite half round-trips through float
    const auto h = static_cast<uint16_t>(i);
    const float f = half_to_float(h);
    if (std::isfinite(f)) CHECK(float_to_half(f) == h);
  }
}

TEST_CASE("bf16 conversion rounds to nearest even", "[graph][dtype]") {
  CHECK(bf16_to_float(float_to_bf16(1.0f)) == 1.0f);
  CHECK(bf16_to_float(float_to_bf16(3.14159f)) == 3.140625f);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("tensors store every dtype and check their byte counts", "[graph][dtype]") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32}) {
    auto x = tensor::from_values(t, {2, 2}, {1, -2, 3.5, 4});
    CHECK(x.bytes.size() == 4 * size_of(t));
    CHECK(x.at(1) == -2);
    CHECK(x.check());
  }
  auto bad = tensor::zeros(dtype::f32, {3});
  bad.bytes.pop_back();
  CHECK_FALSE(bad.check());
}
