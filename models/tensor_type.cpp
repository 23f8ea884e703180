#include "models/tensor_type.hpp"

#include <array>
#include <cctype>
#include <limits>
#include <string>

#include "graph/quant.hpp"

namespace mesh::models {
namespace {

struct type_info {
  tensor_type type;
  const char* name;
  uint32_t gguf;
};

// Indexed by the enum's value.
constexpr std::array<type_info, tensor_type_count> types = {{
    {tensor_type::f32, "F32", 0},
    {tensor_type::f16, "F16", 1},
    {tensor_type::bf16, "BF16", 30},
    {tensor_type::q8_0, "Q8_0", 8},
    {tensor_type::q4_0, "Q4_0", 2},
    {tensor_type::q4_k, "Q4_K", 12},
    {tensor_type::q6_k, "Q6_K", 14},
    {tensor_type::q4_1, "Q4_1", 3},
    {tensor_type::q5_0, "Q5_0", 6},
    {tensor_type::q5_1, "Q5_1", 7},
    {tensor_type::q5_k, "Q5_K", 13},
}};

const type_info& info(tensor_type t) { return types[static_cast<size_t>(t)]; }

// For error messages: every type above, in ggml's order.
constexpr const char* supported = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";

// ggml_type's numbers and names (ggml.h); 4 and 5 were Q4_2 and Q4_3, removed before GGUF, and
// 31-33 were Q4_0 repackings that never appear in files.
constexpr std::array<const char*, 40> ggml_names = {
    "F32",     "F16",    "Q4_0",  "Q4_1",   nullptr, nullptr, "Q5_0",   "Q5_1",    "Q8_0",   "Q8_1",
    "Q2_K",    "Q3_K",   "Q4_K",  "Q5_K",   "Q6_K",  "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
    "IQ4_NL",  "IQ3_S",  "IQ2_S", "IQ4_XS", "I8",    "I16",   "I32",    "I64",     "F64",    "IQ1_M",
    "BF16",    nullptr,  nullptr, nullptr,  "TQ1_0", "TQ2_0", nullptr,  nullptr,   nullptr,  "MXFP4",
};

}  // namespace

dtype to_dtype(tensor_type t) {
  switch (t) {
    case tensor_type::f32: return dtype::f32;
    case tensor_type::f16: return dtype::f16;
    case tensor_type::bf16: return dtype::bf16;
    case tensor_type::q8_0: return dtype::q8_0;
    case tensor_type::q4_0: return dtype::q4_0;
    case tensor_type::q4_k: return dtype::q4_k;
    case tensor_type::q6_k: return dtype::q6_k;
    case tensor_type::q4_1: return dtype::q4_1;
    case tensor_type::q5_0: return dtype::q5_0;
    case tensor_type::q5_1: return dtype::q5_1;
    case tensor_type::q5_k: return dtype::q5_k;
  }
  return dtype::f32;
}

// The block layout is graph/quant.hpp's; this layer adds ggml's names and type numbers.
int64_t block_elements(tensor_type t) { return mesh::block_elements(to_dtype(t)); }
int64_t block_bytes(tensor_type t) { return mesh::block_bytes(to_dtype(t)); }
bool is_quantized(tensor_type t) { return mesh::is_quantized(to_dtype(t)); }

expected<int64_t> row_bytes(tensor_type t, int64_t n) {
  const auto& i = info(t);
  const int64_t elements = block_elements(t), bytes = block_bytes(t);
  if (n < 0) return make_error(error_code::invalid_argument, "a row of " + std::to_string(n) + " elements is negative");
  if (n % elements != 0)
    return make_error(error_code::invalid_argument, "a row of " + std::to_string(n) + " " + i.name + " elements is not a whole number of " +
                                                        std::to_string(elements) + "-element blocks");
  const int64_t blocks = n / elements;
  if (blocks > std::numeric_limits<int64_t>::max() / bytes)
    return make_error(error_code::invalid_argument, "a row of " + std::to_string(n) + " " + i.name + " elements has more bytes than int64 holds");
  return blocks * bytes;
}

const char* to_string(tensor_type t) { return info(t).name; }

expected<tensor_type> parse_tensor_type(std::string_view name) {
  for (const auto& i : types) {
    const std::string_view candidate = i.name;
    if (candidate.size() != name.size()) continue;
    bool same = true;
    for (size_t k = 0; k < name.size() && same; ++k)
      same = std::toupper(static_cast<unsigned char>(name[k])) == static_cast<unsigned char>(candidate[k]);
    if (same) return i.type;
  }
  return make_error(error_code::invalid_argument,
                    "unknown tensor type \"" + std::string(name) + "\" (known: " + std::string(supported) + ")");
}

uint32_t gguf_type_number(tensor_type t) { return info(t).gguf; }

expected<tensor_type> tensor_type_from_gguf(uint32_t number) {
  for (const auto& i : types)
    if (i.gguf == number) return i.type;
  if (const char* name = ggml_type_name(number))
    return make_error(error_code::unsupported, std::string("tensor type ") + name + " (" + std::to_string(number) +
                                                   ") is not supported (supported: " + supported + ")");
  return make_error(error_code::decode_error, "unknown tensor type number " + std::to_string(number));
}

const char* ggml_type_name(uint32_t number) { return number < ggml_names.size() ? ggml_names[number] : nullptr; }

std::string quote_name(std::string_view name) {
  static constexpr size_t limit = 200;
  std::string out = "\"";
  for (const char c : name.substr(0, limit)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '"' || c == '\\') {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  if (name.size() > limit) out += "...";
  return out + "\"";
}

}  // namespace mesh::models
