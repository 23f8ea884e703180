#pragma once
/// The element types of checkpoint tensors: plain floats and ggml's block quantizations, with the
/// exact block sizes ggml lays out (ggml/src/ggml-common.h), so a tensor's bytes can be bounded
/// before anything reads them and handed to a device kernel as they lie in the file.
///
/// A quantized tensor is a sequence of rows (ne[0] elements each, the fastest dimension); every
/// row is a whole number of blocks, each block a fixed number of bytes:
///
/// | type | elements | bytes | block                                                           |
/// | ---- | -------- | ----- | --------------------------------------------------------------- |
/// | F32  | 1        | 4     | little-endian IEEE single                                       |
/// | F16  | 1        | 2     | little-endian IEEE half                                         |
/// | BF16 | 1        | 2     | the top 16 bits of a single                                     |
/// | Q8_0 | 32       | 34    | f16 d, 32 x int8 q;                   x = q * d                 |
/// | Q4_0 | 32       | 18    | f16 d, 16 bytes of nibbles;           x = (q - 8) * d           |
/// | Q4_1 | 32       | 20    | f16 d, f16 m, 16 bytes of nibbles;    x = q * d + m             |
/// | Q5_0 | 32       | 22    | f16 d, 4 bytes qh, 16 bytes nibbles;  x = (q - 16) * d          |
/// | Q5_1 | 32       | 24    | f16 d, f16 m, 4 bytes qh, 16 bytes;   x = q * d + m             |
/// | Q4_K | 256      | 144   | f16 d, f16 dmin, 12 bytes 6-bit scales/mins, 128 bytes nibbles  |
/// | Q5_K | 256      | 176   | f16 d, f16 dmin, 12 bytes scales/mins, 32 bytes qh, 128 bytes   |
/// | Q6_K | 256      | 210   | 128 bytes ql, 64 bytes qh, 16 x int8 scales, f16 d              |
///
/// dequantize.hpp says how the values come out of each block.
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.hpp"
#include "graph/dtype.hpp"

namespace mesh::models {

/// Element types this reader accepts. Never serialized by value: the GGUF numbers are separate.
enum class tensor_type : uint8_t { f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_1, q5_0, q5_1, q5_k };

inline constexpr int tensor_type_count = 11;

/// The graph dtype of the same name and layout (f32 -> dtype::f32, q4_k -> dtype::q4_k, ...): a
/// checkpoint tensor's bytes are a graph tensor's bytes, handed to an executor as they lie.
dtype to_dtype(tensor_type t);

/// Elements per block (1 for the float types).
int64_t block_elements(tensor_type t);

/// Bytes per block.
int64_t block_bytes(tensor_type t);

/// True for the block-quantized types (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k).
bool is_quantized(tensor_type t);

/// Bytes of a row of `n` elements; an error (invalid_argument) when n is negative, not a multiple
/// of the block, or so large that the byte count overflows.
expected<int64_t> row_bytes(tensor_type t, int64_t n);

/// ggml's names: "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "Q4_1", "Q5_0", "Q5_1",
/// "Q5_K".
const char* to_string(tensor_type t);

/// The inverse of to_string, case-insensitive ("q4_k" and "Q4_K" both parse).
expected<tensor_type> parse_tensor_type(std::string_view name);

/// The number a GGUF file stores for the type (ggml_type): F32=0, F16=1, Q4_0=2, Q4_1=3, Q5_0=6,
/// Q5_1=7, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14, BF16=30.
uint32_t gguf_type_number(tensor_type t);

/// The type a GGUF type number stands for. Numbers of other ggml types (Q3_K, IQ2_XS, ...) are
/// `unsupported` errors that name the type; numbers ggml never defined are `decode_error`s.
expected<tensor_type> tensor_type_from_gguf(uint32_t number);

/// ggml's name for any ggml type number ("Q3_K" for 11), or nullptr for numbers it never used;
/// for messages about types this reader does not support.
const char* ggml_type_name(uint32_t number);

/// A tensor name or metadata key read from a file, quoted for an error message: control
/// characters, quotes and backslashes escaped, and cut after 200 bytes, so that whatever a hostile
/// file holds, the message stays one printable line. Every reader of this layer uses it.
std::string quote_name(std::string_view name);

}  // namespace mesh::models
