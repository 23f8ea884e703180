// Tensor types: ggml's block sizes and GGUF numbers, row sizes and their refusals, names.
#include <catch2/catch.hpp>

#include "graph/quant.hpp"
#include "models/tensor_type.hpp"

using namespace mesh::models;

TEST_CASE("block layouts are ggml's", "[models][tensor_type]") {
  struct row {
    tensor_type t;
    int64_t elements, bytes;
    uint32_t gguf;
    const char* name;
  };
  for (const row& r : {row{tensor_type::f32, 1, 4, 0, "F32"}, row{tensor_type::f16, 1, 2, 1, "F16"},
                       row{tensor_type::bf16, 1, 2, 30, "BF16"}, row{tensor_type::q8_0, 32, 34, 8, "Q8_0"},
                       row{tensor_type::q4_0, 32, 18, 2, "Q4_0"}, row{tensor_type::q4_k, 256, 144, 12, "Q4_K"},
                       row{tensor_type::q6_k, 256, 210, 14, "Q6_K"}, row{tensor_type::q4_1, 32, 20, 3, "Q4_1"},
                       row{tensor_type::q5_0, 32, 22, 6, "Q5_0"}, row{tensor_type::q5_1, 32, 24, 7, "Q5_1"},
                       row{tensor_type::q5_k, 256, 176, 13, "Q5_K"}}) {
    INFO(r.name);
    CHECK(block_elements(r.t) == r.elements);
    CHECK(block_bytes(r.t) == r.bytes);
    CHECK(gguf_type_number(r.t) == r.gguf);
    CHECK(std::string(to_string(r.t)) == r.name);
    CHECK(*parse_tensor_type(r.name) == r.t);
    CHECK(*tensor_type_from_gguf(r.gguf) == r.t);
    CHECK(std::string(ggml_type_name(r.gguf)) == r.name);
    CHECK(mesh::block_bytes(to_dtype(r.t)) == r.bytes);  // the graph dtype of the same layout
  }
  CHECK(*parse_tensor_type("q4_k") == tensor_type::q4_k);
  CHECK(*parse_tensor_type("q5_0") == tensor_type::q5_0);
  CHECK_FALSE(parse_tensor_type("Q3_K"));
}

TEST_CASE("row_bytes counts whole blocks and refuses the rest", "[models][tensor_type]") {
  CHECK(*row_bytes(tensor_type::f32, 7) == 28);
  CHECK(*row_bytes(tensor_type::q4_k, 4096) == 16 * 144);
  CHECK(*row_bytes(tensor_type::q6_k, 0) == 0);
  auto r = row_bytes(tensor_type::q8_0, 33);
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "a row of 33 Q8_0 elements is not a whole number of 32-element blocks");
  CHECK_FALSE(row_bytes(tensor_type::f32, -1));
  CHECK_FALSE(row_bytes(tensor_type::f32, int64_t{1} << 62));  // 2^64 bytes
}

TEST_CASE("GGUF type numbers of other ggml types name the type", "[models][tensor_type]") {
  auto q3k = tensor_type_from_gguf(11);
  REQUIRE_FALSE(q3k);
  CHECK(q3k.error().code == mesh::error_code::unsupported);
  CHECK(q3k.error().message == "tensor type Q3_K (11) is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                               "Q4_K, Q5_K, Q6_K)");
  auto unknown = tensor_type_from_gguf(1000);
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code == mesh::error_code::decode_error);
  CHECK(unknown.error().message == "unknown tensor type number 1000");
  CHECK(ggml_type_name(4) == nullptr);  // Q4_2, removed before GGUF
}

TEST_CASE("names from files are quoted into one printable line", "[models][tensor_type]") {
  CHECK(quote_name("blk.0.attn_q.weight") == "\"blk.0.attn_q.weight\"");
  CHECK(quote_name(std::string("a\nb\"c\0", 6)) == "\"a\\x0ab\\x22c\\x00\"");
  CHECK(quote_name(std::string(300, 'x')).size() == 2 + 200 + 3);
}
