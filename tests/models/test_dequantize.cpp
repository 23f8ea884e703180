// Dequantization of every tensor type: hand-made blocks whose values follow from the format's
// definition by hand, and random blocks with extreme scales checked against an independent numpy
// reference (ref_dequantize.py, run through the shell; skipped with a warning without numpy).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint_writer.hpp"
#include "models/dequantize.hpp"
#include "run_command.hpp"

using namespace mesh::models;
using namespace mesh::models::test;

namespace {

std::vector<float> decode(tensor_type t, const bytes& src, size_t n) {
  std::vector<float> out(n);
  auto ok = dequantize_row(t, src, out);
  REQUIRE(ok);
  return out;
}

void put_f16(bytes& b, size_t at, uint16_t h) {
  b[at] = static_cast<uint8_t>(h);
  b[at + 1] = static_cast<uint8_t>(h >> 8);
}

// A python3 that has numpy, or why there is none.
std::string python_with_numpy(std::string& why) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("MESH_PYTHON")) candidates.emplace_back(p);
  candidates.insert(candidates.end(), {"python3", "/usr/bin/python3"});
  for (const auto& p : candidates)
    if (mesh::test::run_command(p + " -c 'import numpy'").status == 0) return p;
  why = "no python3 with numpy (tried $MESH_PYTHON, python3, /usr/bin/python3; apt install python3-numpy)";
  return {};
}

// Scales that stress the arithmetic: f16 max and min, the smallest subnormal, zeros of both
// signs, negatives, an ordinary value and infinity (0 * inf must give NaN like the reference).
const std::vector<uint16_t> extreme_scales = {0x7bff, 0xfbff, 0x0001, 0x8001, 0x0000, 0x8000, 0x3c00, 0xbc00, 0x2e66, 0x0400, 0x7c00};

}  // namespace

TEST_CASE("f16 and bf16 conversions are exact and round to nearest even", "[models][dequantize]") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      CHECK((h & 0x7c00) == 0x7c00);
      CHECK((h & 0x3ff) != 0);
      continue;
    }
    CHECK(f32_to_f16(f) == h);  // every half survives the round trip, subnormals included
  }
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_to_f32(0x7bff) == 65504.0f);
  CHECK(f16_to_f32(0xc000) == -2.0f);
  CHECK(f32_to_f16(65520.0f) == 0x7c00);           // halfway to 65536 rounds to even: infinity
  CHECK(f32_to_f16(65519.0f) == 0x7bff);
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0);   // halfway to the smallest subnormal: even (zero)
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 1);
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie, even
  CHECK(f32_to_f16(1.0f + std::ldexp(3.0f, -11)) == 0x3c02);  // tie, up to even
  CHECK(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(bf16_to_f32(0x3f80) == 1.0f);
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(bf16_to_f32(0xc2f7)) == 0xc2f7);
}

TEST_CASE("row sizes must match the type", "[models][dequantize]") {
  std::vector<float> out(32);
  bytes b(33);
  auto r = dequantize_row(tensor_type::q8_0, b, out);
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("takes 34 bytes, not 33") != std::string::npos);
  std::vector<float> odd(31);
  r = dequantize_row(tensor_type::q4_0, bytes(18), odd);
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("not a whole number of 32-element blocks") != std::string::npos);
}

TEST_CASE("hand-made blocks decode as the format defines", "[models][dequantize]") {
  SECTION("F32, F16, BF16") {
    CHECK(decode(tensor_type::f32, f32_bytes({1.5f, -2.0f}), 2) == std::vector<float>{1.5f, -2.0f});
    CHECK(decode(tensor_type::f16, f16_bytes({0.5f, -3.0f}), 2) == std::vector<float>{0.5f, -3.0f});
    CHECK(decode(tensor_type::bf16, bf16_bytes({256.0f, -0.25f}), 2) == std::vector<float>{256.0f, -0.25f});
  }
  SECTION("Q8_0: d times int8") {
    bytes b(34, 0);
    put_f16(b, 0, f32_to_f16(0.5f));
    for (int i = 0; i < 32; ++i) b[2 + static_cast<size_t>(i)] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
    const auto y = decode(tensor_type::q8_0, b, 32);
    for (int i = 0; i < 32; ++i) CHECK(y[static_cast<size_t>(i)] == 0.5f * static_cast<float>(i - 16));
  }
  SECTION("Q4_0: low nibbles are elements 0-15, high nibbles 16-31") {
    bytes b(18, 0);
    put_f16(b, 0, f32_to_f16(2.0f));
    for (int j = 0; j < 16; ++j) b[2 + static_cast<size_t>(j)] = static_cast<uint8_t>(j | (15 - j) << 4);
    const auto y = decode(tensor_type::q4_0, b, 32);
    for (int j = 0; j < 16; ++j) {
      CHECK(y[static_cast<size_t>(j)] == 2.0f * static_cast<float>(j - 8));
      CHECK(y[static_cast<size_t>(j + 16)] == 2.0f * static_cast<float>(7 - j));
    }
  }
  SECTION("Q4_1: unsigned nibbles times d plus the block's min m") {
    bytes b(20, 0);
    put_f16(b, 0, f32_to_f16(0.5f));
    put_f16(b, 2, f32_to_f16(-3.0f));
    for (int j = 0; j < 16; ++j) b[4 + static_cast<size_t>(j)] = static_cast<uint8_t>(j | (15 - j) << 4);
    const auto y = decode(tensor_type::q4_1, b, 32);
    for (int j = 0; j < 16; ++j) {
      CHECK(y[static_cast<size_t>(j)] == 0.5f * static_cast<float>(j) - 3.0f);
      CHECK(y[static_cast<size_t>(j + 16)] == 0.5f * static_cast<float>(15 - j) - 3.0f);
    }
  }
  // Element e of a 5-bit block gets q = e ^ 21 (so both halves and every qh bit vary): low
  // nibble in byte e % 16 (high half for e >= 16), 5th bit at bit e of the little-endian qh.
  const auto five_bit = [](bytes& b, size_t qh, size_t qs) {
    for (int e = 0; e < 32; ++e) {
      const int q = e ^ 21;
      b[qs + static_cast<size_t>(e % 16)] |= static_cast<uint8_t>((q & 15) << (e < 16 ? 0 : 4));
      b[qh + static_cast<size_t>(e / 8)] |= static_cast<uint8_t>((q >> 4) << (e % 8));
    }
  };
  SECTION("Q5_0: a 5th bit per element from the 32-bit qh, minus 16") {
    bytes b(22, 0);
    put_f16(b, 0, f32_to_f16(0.25f));
    five_bit(b, 2, 6);
    const auto y = decode(tensor_type::q5_0, b, 32);
    for (int e = 0; e < 32; ++e) CHECK(y[static_cast<size_t>(e)] == 0.25f * static_cast<float>((e ^ 21) - 16));
  }
  SECTION("Q5_1: the 5-bit q times d plus m") {
    bytes b(24, 0);
    put_f16(b, 0, f32_to_f16(2.0f));
    put_f16(b, 2, f32_to_f16(-1.5f));
    five_bit(b, 4, 8);
    const auto y = decode(tensor_type::q5_1, b, 32);
    for (int e = 0; e < 32; ++e) CHECK(y[static_cast<size_t>(e)] == 2.0f * static_cast<float>(e ^ 21) - 1.5f);
  }
  SECTION("Q4_K: packed 6-bit scales and mins, nibble groups of 64") {
    bytes b(144, 0);
    put_f16(b, 0, f32_to_f16(1.0f));   // d
    put_f16(b, 2, f32_to_f16(0.5f));   // dmin
    // Sub-block j gets scale 10 + j and min 40 + j (the last four need their top bits split out).
    uint8_t* s = b.data() + 4;
    for (int j = 0; j < 8; ++j) {
      const int sc = 10 + j, m = 40 + j;
      if (j < 4) {
        s[j] = static_cast<uint8_t>(sc);
        s[j + 4] = static_cast<uint8_t>(m);
      } else {
        s[j + 4] = static_cast<uint8_t>((sc & 15) | (m & 15) << 4);
        s[j - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
        s[j] |= static_cast<uint8_t>((m >> 4) << 6);
      }
    }
    for (int i = 0; i < 128; ++i) b[16 + static_cast<size_t>(i)] = static_cast<uint8_t>(3 | 12 << 4);
    const auto y = decode(tensor_type::q4_k, b, 256);
    for (int e = 0; e < 256; ++e) {
      const int sub = e / 32;                // 8 sub-blocks of 32
      const int q = sub % 2 == 0 ? 3 : 12;   // even sub-blocks are low nibbles
      CHECK(y[static_cast<size_t>(e)] == static_cast<float>(10 + sub) * static_cast<float>(q) - 0.5f * static_cast<float>(40 + sub));
    }
  }
  SECTION("Q5_K: Q4_K's scales and nibbles, a 5th bit from bit `sub-block` of qh[l]") {
    bytes b(176, 0);
    put_f16(b, 0, f32_to_f16(0.5f));   // d
    put_f16(b, 2, f32_to_f16(0.25f));  // dmin
    uint8_t* s = b.data() + 4;
    for (int j = 0; j < 8; ++j) {  // scale 20 + j, min 50 + j
      const int sc = 20 + j, m = 50 + j;
      if (j < 4) {
        s[j] = static_cast<uint8_t>(sc);
        s[j + 4] = static_cast<uint8_t>(m);
      } else {
        s[j + 4] = static_cast<uint8_t>((sc & 15) | (m & 15) << 4);
        s[j - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
        s[j] |= static_cast<uint8_t>((m >> 4) << 6);
      }
    }
    // Element l of sub-block j gets q = (l + 3 * j) % 32.
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) {
        const int q = (l + 3 * j) % 32;
        b[16 + static_cast<size_t>(l)] |= static_cast<uint8_t>((q >> 4) << j);
        b[48 + static_cast<size_t>(32 * (j / 2) + l)] |= static_cast<uint8_t>((q & 15) << (4 * (j % 2)));
      }
    const auto y = decode(tensor_type::q5_k, b, 256);
    for (int e = 0; e < 256; ++e) {
      const int j = e / 32, q = (e % 32 + 3 * j) % 32;
      CHECK(y[static_cast<size_t>(e)] == 0.5f * static_cast<float>(20 + j) * static_cast<float>(q) - 0.25f * static_cast<float>(50 + j));
    }
  }
  SECTION("Q6_K: 4 low bits from ql, 2 high bits from qh, a scale per 16") {
    bytes b(210, 0);
    // Element e gets q = (e % 64) - 32 through the documented bit positions.
    for (int half = 0; half < 2; ++half)
      for (int l = 0; l < 32; ++l)
        for (int g = 0; g < 4; ++g) {
          const int e = 128 * half + 32 * g + l;
          const int q = e % 64;
          uint8_t& low = b[static_cast<size_t>(64 * half + l + 32 * (g % 2))];
          low |= static_cast<uint8_t>((q & 15) << (4 * (g / 2)));
          b[static_cast<size_t>(128 + 32 * half + l)] |= static_cast<uint8_t>((q >> 4) << (2 * g));
        }
    for (int i = 0; i < 16; ++i) b[192 + static_cast<size_t>(i)] = static_cast<uint8_t>(static_cast<int8_t>(i - 8));
    put_f16(b, 208, f32_to_f16(0.25f));
    const auto y = decode(tensor_type::q6_k, b, 256);
    for (int e = 0; e < 256; ++e)
      CHECK(y[static_cast<size_t>(e)] == 0.25f * static_cast<float>(e / 16 - 8) * static_cast<float>(e % 64 - 32));
  }
}

TEST_CASE("dequantization matches the numpy reference with extreme scales", "[models][dequantize]") {
  std::string why;
  const std::string python = python_with_numpy(why);
  if (python.empty()) {
    WARN("skipped: " << why);
    return;
  }
  temp_dir dir;
  REQUIRE(!dir.path().empty());
  uint32_t seed = 1;
  for (int ti = 0; ti < tensor_type_count; ++ti) {
    const auto t = static_cast<tensor_type>(ti);
    const int64_t n = block_elements(t) * 12;
    bytes src = random_bytes(static_cast<size_t>(*row_bytes(t, n)), seed++);
    // Place each extreme scale in a block's scale fields (d, and dmin or m where the type has one).
    const size_t bb = static_cast<size_t>(block_bytes(t));
    for (size_t blk = 0; is_quantized(t) && blk < 12; ++blk) {
      const uint16_t d = extreme_scales[blk % extreme_scales.size()];
      const uint16_t dmin = extreme_scales[(blk + 3) % extreme_scales.size()];
      uint8_t* p = src.data() + blk * bb;
      switch (t) {
        case tensor_type::q8_0:
        case tensor_type::q4_0:
        case tensor_type::q5_0: put_f16(src, blk * bb, d); break;
        case tensor_type::q4_1:
        case tensor_type::q5_1:  // dmin as m: a signed offset, infinities included
        case tensor_type::q4_k:
        case tensor_type::q5_k:
          put_f16(src, blk * bb, d);
          put_f16(src, blk * bb + 2, dmin);
          if (t == tensor_type::q5_k && blk == 1) std::memset(p + 4, 0xff, 12);  // every scale and min 63
          if (t == tensor_type::q5_k && blk == 2) std::memset(p + 16, 0xff, 32);  // every 5th bit set
          break;
        case tensor_type::q6_k:
          put_f16(src, blk * bb + 208, d);
          if (blk == 1) std::memset(p + 192, 0x80, 16);  // int8 scales all -128
          if (blk == 2) std::memset(p + 192, 0x7f, 16);  // all 127
          break;
        default: break;
      }
    }
    if (t == tensor_type::f16)
      for (size_t i = 0; i < extreme_scales.size(); ++i) put_f16(src, 2 * i, extreme_scales[i]);
    const auto in = dir / (std::string("in_") + to_string(t));
    const auto out = dir / (std::string("out_") + to_string(t));
    write_file(in, src);
    const std::string script = MESH_MODELS_REF_DEQUANTIZE;
    const auto run = mesh::test::run_command(python + " " + script + " " + to_string(t) + " " + in.string() + " " + out.string() + " " +
                                             std::to_string(n));
    INFO(to_string(t) << ": " << run.output);
    REQUIRE(run.status == 0);
    const bytes ref_bytes = read_file(out);
    REQUIRE(ref_bytes.size() == static_cast<size_t>(n) * 4);
    std::vector<float> ref(static_cast<size_t>(n));
    std::memcpy(ref.data(), ref_bytes.data(), ref_bytes.size());
    const auto got = decode(t, src, static_cast<size_t>(n));
    int mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float a = got[i], b = ref[i];
      const bool same = (std::isnan(a) && std::isnan(b)) || a == b ||
                        std::fabs(a - b) <= 1e-6f * std::max(std::fabs(a), std::fabs(b));
      if (!same && mismatches++ < 5) FAIL_CHECK(to_string(t) << " element " << i << ": " << a << " vs reference " << b);
    }
    CHECK(mismatches == 0);
  }
}
