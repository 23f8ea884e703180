// GGUF: every metadata value type (nested arrays included), tensor infos and data ranges,
// alignment, versions 2 and 3, and hostile files (every truncation point, wrong magic and
// version, bad counts, types, dimensions and ranges) as errors naming the file and the tensor/key.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>

#include "checkpoint_writer.hpp"
#include "models/gguf.hpp"

using namespace mesh::models;
using namespace mesh::models::test;
using mesh::error_code;

namespace {

const std::string src = "test.gguf";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A small file with every value type and a few tensors of different types.
gguf_writer sample() {
  gguf_writer w;
  w.add_string("general.architecture", "llama");
  w.add_u8("k.u8", 200);
  w.add_i8("k.i8", -5);
  w.add_u16("k.u16", 60000);
  w.add_i16("k.i16", -30000);
  w.add_u32("k.u32", 4000000000u);
  w.add_i32("k.i32", -7);
  w.add_u64("k.u64", uint64_t{1} << 40);
  w.add_i64("k.i64", -(int64_t{1} << 40));
  w.add_f32("k.f32", 0.5f);
  w.add_f64("k.f64", 1e-6);
  w.add_bool("k.bool", true);
  w.add_array_strings("k.strings", {"a", "", "hello"});
  w.add_array_i32("k.ints", {1, -2, 3});
  w.add_array_f32("k.floats", {0.25f, -1.0f});
  // An array of two arrays of u8: [[1, 2], [3]].
  bytes inner;
  for (const auto& [vals, n] : {std::pair<bytes, uint64_t>{{1, 2}, 2}, {{3}, 1}}) {
    put_le(inner, static_cast<uint32_t>(gguf_value_type::u8), 4);
    put_le(inner, n, 8);
    inner.insert(inner.end(), vals.begin(), vals.end());
  }
  w.add_raw("k.nested", gguf_writer::array(gguf_value_type::array, 2, inner));
  w.add_tensor("a.f32", tensor_type::f32, {3, 2}, f32_bytes({1, 2, 3, 4, 5, 6}));
  w.add_tensor("b.q8_0", tensor_type::q8_0, {64}, random_bytes(68, 1));
  w.add_tensor("c.q4_k", tensor_type::q4_k, {256, 2}, random_bytes(288, 2));
  w.add_tensor("d.q6_k", tensor_type::q6_k, {256, 1, 1, 1}, random_bytes(210, 3));
  return w;
}

mesh::error parse_error(const bytes& b) {
  auto g = gguf_view::parse(b, src);
  REQUIRE_FALSE(g);
  return g.error();
}

}  // namespace

TEST_CASE("GGUF metadata of every value type reads back", "[models][gguf]") {
  const bytes b = sample().build();
  auto g = gguf_view::parse(b, src);
  REQUIRE(g);
  CHECK(g->version() == 3);
  CHECK(g->alignment() == 32);
  CHECK(*g->get_string("general.architecture") == "llama");
  CHECK(*g->get_u32("k.u8") == 200);
  CHECK(*g->get_i64("k.i8") == -5);
  CHECK(*g->get_u32("k.u16") == 60000);
  CHECK(*g->get_i64("k.i16") == -30000);
  CHECK(*g->get_u32("k.u32") == 4000000000u);
  CHECK(*g->get_i64("k.i32") == -7);
  CHECK(*g->get_u64("k.u64") == uint64_t{1} << 40);
  CHECK(*g->get_i64("k.i64") == -(int64_t{1} << 40));
  CHECK(*g->get_f32("k.f32") == 0.5f);
  CHECK(*g->get_f64("k.f64") == 1e-6);
  CHECK(*g->get_bool("k.bool"));
  CHECK(*g->get_array_strings("k.strings") == std::vector<std::string_view>{"a", "", "hello"});
  CHECK(*g->get_array_i64("k.ints") == std::vector<int64_t>{1, -2, 3});
  CHECK(*g->get_array_f32("k.floats") == std::vector<float>{0.25f, -1.0f});
  const gguf_value* nested = g->find("k.nested");
  REQUIRE(nested);
  CHECK(nested->element_type() == gguf_value_type::array);
  const auto outer = nested->elements();
  REQUIRE(outer.size() == 2);
  CHECK(outer[0].size() == 2);
  CHECK(outer[0].elements()[1].as_u64() == 2);
  CHECK(outer[1].elements()[0].as_u64() == 3);
  CHECK(g->metadata().size() == 16);
  CHECK(g->metadata()[0].first == "general.architecture");
}

TEST_CASE("GGUF typed accessors name the file and the key", "[models][gguf]") {
  const bytes b = sample().build();
  auto g = gguf_view::parse(b, src);
  REQUIRE(g);
  auto missing = g->get_u32("llama.block_count");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == error_code::not_found);
  CHECK(missing.error().message == "test.gguf: metadata key \"llama.block_count\" is missing");
  auto wrong = g->get_u32("general.architecture");
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().code == error_code::dtype_mismatch);
  CHECK(wrong.error().message == "test.gguf: metadata key \"general.architecture\" is string, not an integer");
  auto negative = g->get_u32("k.i32");
  REQUIRE_FALSE(negative);
  CHECK(contains(negative.error().message, "\"k.i32\" is out of the u32 range"));
  CHECK_FALSE(g->get_u32("k.u64"));  // 2^40 does not fit
  auto strings = g->get_array_strings("k.ints");
  REQUIRE_FALSE(strings);
  CHECK(strings.error().message == "test.gguf: metadata key \"k.ints\" is array of i32, not an array of strings");
  CHECK_FALSE(g->get_string("k.strings"));
  CHECK_FALSE(g->get_bool("k.u8"));
}

TEST_CASE("GGUF tensors keep ne order and point at their bytes", "[models][gguf]") {
  auto w = sample();
  const bytes b = w.build();
  auto g = gguf_view::parse(b, src);
  REQUIRE(g);
  REQUIRE(g->tensors().size() == 4);
  const auto* a = g->find_tensor("a.f32");
  REQUIRE(a);
  CHECK(a->n_dims == 2);
  CHECK(a->ne == std::array<int64_t, 4>{3, 2, 1, 1});
  CHECK(a->type == tensor_type::f32);
  CHECK(a->data.size() == 24);
  CHECK(bytes(a->data.begin(), a->data.end()) == f32_bytes({1, 2, 3, 4, 5, 6}));
  CHECK(g->data_offset() % 32 == 0);
  for (const auto& t : g->tensors()) {
    CHECK(t.offset % 32 == 0);
    CHECK(t.data.data() == b.data() + g->data_offset() + t.offset);  // a view, no copy
    CHECK(bytes(t.data.begin(), t.data.end()) == w.tensors()[static_cast<size_t>(&t - g->tensors().data())].data);
  }
  CHECK(g->find_tensor("c.q4_k")->data.size() == 288);
  CHECK(g->find_tensor("nope") == nullptr);
}

TEST_CASE("GGUF tensors of the 5-bit and offset types (Q4_K_M's fallbacks for rows not of 256)", "[models][gguf]") {
  gguf_writer w;
  w.add_tensor("q5_0", tensor_type::q5_0, {96, 3}, random_bytes(3 * 3 * 22, 1));  // 66-byte rows
  w.add_tensor("q5_1", tensor_type::q5_1, {32}, random_bytes(24, 2));
  w.add_tensor("q4_1", tensor_type::q4_1, {64, 1}, random_bytes(40, 3));
  w.add_tensor("q5_k", tensor_type::q5_k, {256, 2}, random_bytes(352, 4));
  const bytes b = w.build();
  auto g = gguf_view::parse(b, src);
  REQUIRE(g);
  for (const auto& [name, type, size] : {std::tuple{"q5_0", tensor_type::q5_0, 198}, std::tuple{"q5_1", tensor_type::q5_1, 24},
                                         std::tuple{"q4_1", tensor_type::q4_1, 40}, std::tuple{"q5_k", tensor_type::q5_k, 352}}) {
    INFO(name);
    const auto* t = g->find_tensor(name);
    REQUIRE(t);
    CHECK(t->type == type);
    CHECK(t->data.size() == static_cast<size_t>(size));
  }
  gguf_writer bad;
  bad.add_tensor("q5_k", tensor_type::q5_k, {96, 2}, random_bytes(352, 4));
  CHECK(contains(parse_error(bad.build()).message, "a row of 96 Q5_K elements is not a whole number of 256-element blocks"));
}

TEST_CASE("GGUF version 2 and a custom alignment", "[models][gguf]") {
  auto w = sample();
  w.version = 2;
  w.set_alignment(64);
  const bytes b = w.build();
  auto g = gguf_view::parse(b, src);
  REQUIRE(g);
  CHECK(g->version() == 2);
  CHECK(g->alignment() == 64);
  CHECK(g->data_offset() % 64 == 0);
  for (const auto& t : g->tensors()) CHECK(t.offset % 64 == 0);
}

TEST_CASE("GGUF files without tensors or metadata are valid", "[models][gguf]") {
  gguf_writer w;
  const bytes b = w.build();
  auto g = gguf_view::parse(b, src);
  REQUIRE(g);
  CHECK(g->tensors().empty());
  CHECK(g->metadata().empty());
}

TEST_CASE("every truncation of a GGUF file is an error naming the file", "[models][gguf]") {
  const bytes b = sample().build();
  // The last tensor's data ends the file: every shorter prefix lacks something.
  for (size_t n = 0; n < b.size(); ++n) {
    const bytes cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    auto g = gguf_view::parse(cut, src);
    INFO("prefix of " << n << " bytes");
    REQUIRE_FALSE(g);
    CHECK(g.error().message.rfind("test.gguf: ", 0) == 0);
  }
}

TEST_CASE("GGUF header errors: magic, version, counts", "[models][gguf]") {
  SECTION("wrong magic") {
    auto w = sample();
    w.magic = "GGML";
    const auto e = parse_error(w.build());
    CHECK(e.code == error_code::decode_error);
    CHECK(e.message == "test.gguf: not a GGUF file (it starts with \"GGML\", not \"GGUF\")");
  }
  SECTION("version 1 and an unknown version") {
    auto w = sample();
    w.version = 1;
    CHECK(parse_error(w.build()).message == "test.gguf: GGUF version 1 is not supported (versions 2 and 3 are)");
    w.version = 4;
    CHECK(parse_error(w.build()).code == error_code::unsupported);
  }
  SECTION("a big-endian file says so") {
    auto w = sample();
    w.version = 0x03000000;
    CHECK(contains(parse_error(w.build()).message, "big-endian"));
  }
  SECTION("absurd tensor and metadata counts") {
    auto w = sample();
    w.tensor_count_override = uint64_t{1} << 60;
    auto e = parse_error(w.build());
    CHECK(contains(e.message, "test.gguf: the header claims 1152921504606846976 tensors, more than the file's"));
    w.tensor_count_override.reset();
    w.kv_count_override = ~uint64_t{0};
    CHECK(contains(parse_error(w.build()).message, "metadata entries, more than the file's"));
  }
  SECTION("a huge array or string length") {
    gguf_writer w;
    w.add_raw("big.array", gguf_writer::array(gguf_value_type::u64, uint64_t{1} << 61, {}));
    CHECK(contains(parse_error(w.build()).message, "metadata key \"big.array\" claims 2305843009213693952 elements of type u64"));
    gguf_writer s;
    bytes v;
    put_le(v, static_cast<uint32_t>(gguf_value_type::string), 4);
    put_le(v, uint64_t{1} << 50, 8);
    s.add_raw("big.string", v);
    CHECK(contains(parse_error(s.build()).message, "truncated: the file ends inside metadata key \"big.string\""));
  }
  SECTION("unknown value types and deep nesting") {
    gguf_writer w;
    w.add_raw("odd", gguf_writer::value(static_cast<gguf_value_type>(13), 0, 4));
    CHECK(parse_error(w.build()).message == "test.gguf: metadata key \"odd\" has unknown value type 13");
    gguf_writer deep;
    bytes v = {7};  // innermost element: one u8 array of one byte
    v = gguf_writer::array(gguf_value_type::u8, 1, v);
    for (int i = 0; i < 20; ++i) v = gguf_writer::array(gguf_value_type::array, 1, bytes(v.begin() + 4, v.end()));
    deep.add_raw("deep", v);
    const auto e = parse_error(deep.build());
    CHECK(e.code == error_code::limit_exceeded);
    CHECK(contains(e.message, "metadata key \"deep\" nests arrays deeper than 8 levels"));
  }
  SECTION("duplicate keys and a bad alignment") {
    gguf_writer w;
    w.add_u32("a", 1);
    w.add_u32("a", 2);
    CHECK(parse_error(w.build()).message == "test.gguf: metadata key \"a\" appears twice");
    gguf_writer al;
    al.add_u32("general.alignment", 24);
    CHECK(contains(parse_error(al.build()).message, "general.alignment is 24, not a power of two"));
    gguf_writer al64;
    al64.add_u64("general.alignment", 32);
    CHECK(contains(parse_error(al64.build()).message, "\"general.alignment\" is a u64, not a u32"));
  }
}

TEST_CASE("GGUF tensor errors name the tensor", "[models][gguf]") {
  SECTION("a range past the end of the file") {
    auto w = sample();
    w.tensors()[3].offset = 4096;
    bytes b = w.build();
    b.resize(b.size() - 100);  // the writer padded the file to the far offset: cut into it
    const auto e = parse_error(b);
    CHECK(contains(e.message, "test.gguf: tensor \"d.q6_k\" occupies bytes"));
    CHECK(contains(e.message, "past the end of the file"));
  }
  SECTION("an unknown and an unsupported type") {
    auto w = sample();
    w.tensors()[1].type = 99;
    auto e = parse_error(w.build());
    CHECK(e.message == "test.gguf: tensor \"b.q8_0\": unknown tensor type number 99");
    w.tensors()[1].type = 11;  // Q3_K
    e = parse_error(w.build());
    CHECK(e.code == error_code::unsupported);
    CHECK(contains(e.message, "test.gguf: tensor \"b.q8_0\": tensor type Q3_K (11) is not supported"));
  }
  SECTION("more than four dimensions") {
    auto w = sample();
    w.tensors()[0].ne = {3, 2, 1, 1, 1};
    const auto e = parse_error(w.build());
    CHECK(e.code == error_code::limit_exceeded);
    CHECK(e.message == "test.gguf: tensor \"a.f32\" has 5 dimensions; at most 4 are supported");
  }
  SECTION("a row that is not whole blocks") {
    auto w = sample();
    w.tensors()[2].ne = {100, 2};
    CHECK(contains(parse_error(w.build()).message,
                   "test.gguf: tensor \"c.q4_k\": a row of 100 Q4_K elements is not a whole number of 256-element blocks"));
  }
  SECTION("dimensions whose product overflows") {
    auto w = sample();
    w.tensors()[0].ne = {uint64_t{1} << 40, uint64_t{1} << 40, uint64_t{1} << 40};
    CHECK(contains(parse_error(w.build()).message, "tensor \"a.f32\" (F32, ne 1099511627776 x 1099511627776 x 1099511627776 x 1) has more bytes than the whole file"));
    w.tensors()[0].ne = {~uint64_t{0}};
    CHECK(contains(parse_error(w.build()).message, "tensor \"a.f32\" has dimension 18446744073709551615, beyond int64"));
  }
  SECTION("a misaligned offset and a duplicate name") {
    auto w = sample();
    w.tensors()[1].offset = 40;
    CHECK(contains(parse_error(w.build()).message, "tensor \"b.q8_0\" starts at data offset 40, not a multiple of the alignment 32"));
    auto d = sample();
    d.tensors()[1].name = "a.f32";
    CHECK(parse_error(d.build()).message == "test.gguf: tensor \"a.f32\" appears twice");
  }
  SECTION("overlapping ranges inside the file are accepted") {
    auto w = sample();
    w.tensors()[1].offset = 0;  // b.q8_0's 68 bytes overlap a.f32's 24
    const bytes b = w.build();
    auto g = gguf_view::parse(b, src);
    REQUIRE(g);
    CHECK(g->find_tensor("b.q8_0")->data.data() == g->find_tensor("a.f32")->data.data());
  }
}
