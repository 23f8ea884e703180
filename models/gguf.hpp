#pragma once
/// GGUF files (llama.cpp's checkpoint format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md),
/// read in place: versions 2 and 3, little-endian.
///
///   "GGUF" | u32 version | u64 tensor count | u64 metadata count
///   metadata: count x (string key, u32 value type, value)
///   tensor infos: count x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml type, u64 offset)
///   padding to general.alignment (default 32) | tensor data (offsets relative to its start)
///
/// A string is a u64 length and that many bytes (no terminator). Values are u8, i8, u16, i16, u32,
/// i32, u64, i64, f32, f64, bool (one byte), string, or an array (u32 element type, u64 count,
/// elements; arrays nest).
///
/// Every count and length is checked against the bytes that remain before anything is reserved,
/// so a hostile file costs at most memory proportional to its size; every tensor's byte range
/// (rows of row_bytes(type, ne[0]) bytes) must lie inside the file. Strings and data are views into
/// the bytes parsed: they live as long as those bytes (the checkpoint's mapping).
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.hpp"
#include "models/tensor_type.hpp"

namespace mesh::models {

/// The value types of GGUF metadata, numbered as the file stores them.
enum class gguf_value_type : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};

/// "u8", "string", "array", ... for messages.
const char* to_string(gguf_value_type t);

/// One metadata value, a view of its encoded bytes. Arrays are decoded on demand (elements()), so
/// a 150k-entry vocabulary costs nothing until someone asks for it.
class gguf_value {
 public:
  gguf_value() = default;
  gguf_value(gguf_value_type type, std::span<const uint8_t> encoded) : type_(type), encoded_(encoded) {}

  gguf_value_type type() const { return type_; }
  /// The encoded bytes (for an array: element type, count, elements).
  std::span<const uint8_t> encoded() const { return encoded_; }

  bool is_integer() const;  ///< u8 .. i64
  bool is_float() const;    ///< f32 or f64
  /// An integer of any width as int64 / uint64; nullopt-like errors are the callers' (they know
  /// the key): check is_integer() first. A u64 above INT64_MAX reads as -1 through as_i64.
  int64_t as_i64() const;
  uint64_t as_u64() const;
  double as_f64() const;  ///< f32 or f64 (or an integer)
  bool as_bool() const;
  std::string_view as_string() const;

  /// Arrays: the element type and count.
  gguf_value_type element_type() const;
  uint64_t size() const;
  /// The elements, each a value (nested arrays included). Linear in the array's bytes.
  std::vector<gguf_value> elements() const;

 private:
  gguf_value_type type_ = gguf_value_type::u8;
  std::span<const uint8_t> encoded_;
};

/// One tensor info: ne[] in ggml's order (ne[0] is the row length, the fastest dimension).
struct gguf_tensor_info {
  std::string_view name;
  uint32_t n_dims = 0;
  std::array<int64_t, 4> ne = {1, 1, 1, 1};
  tensor_type type = tensor_type::f32;
  uint64_t offset = 0;             ///< relative to the data section
  std::span<const uint8_t> data;  ///< the tensor's bytes in the file
};

/// A parsed GGUF file: metadata and tensor infos, views into the bytes parsed.
class gguf_view {
 public:
  /// Most dimensions a tensor may have (ggml's GGML_MAX_DIMS).
  static constexpr uint32_t max_dims = 4;
  /// Deepest nesting of arrays accepted (real files nest at most 2).
  static constexpr int max_array_depth = 8;

  /// Parses `bytes` (the whole file). `source` (usually the path) starts every error message.
  static expected<gguf_view> parse(std::span<const uint8_t> bytes, std::string source);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  /// Offset of the data section from the start of the file.
  uint64_t data_offset() const { return data_offset_; }
  const std::string& source() const { return source_; }

  const std::vector<gguf_tensor_info>& tensors() const { return tensors_; }
  const gguf_tensor_info* find_tensor(std::string_view name) const;

  /// Metadata in file order.
  const std::vector<std::pair<std::string_view, gguf_value>>& metadata() const { return metadata_; }
  const gguf_value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed accessors: not_found when the key is missing, dtype_mismatch when it holds another type,
  // out of range values are invalid_argument; every message names the file and the key. Integer
  // accessors accept any integer width whose value fits (converters differ in what they write).
  expected<uint32_t> get_u32(std::string_view key) const;
  expected<uint64_t> get_u64(std::string_view key) const;
  expected<int64_t> get_i64(std::string_view key) const;
  expected<float> get_f32(std::string_view key) const;  ///< f32 or f64
  expected<double> get_f64(std::string_view key) const;
  expected<bool> get_bool(std::string_view key) const;
  expected<std::string_view> get_string(std::string_view key) const;
  expected<std::vector<std::string_view>> get_array_strings(std::string_view key) const;
  expected<std::vector<float>> get_array_f32(std::string_view key) const;
  expected<std::vector<int64_t>> get_array_i64(std::string_view key) const;

 private:
  expected<const gguf_value*> typed(std::string_view key) const;
  tl::unexpected<error> wrong_type(std::string_view key, const gguf_value& v, const char* wanted) const;

  std::string source_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string_view, gguf_value>> metadata_;
  std::unordered_map<std::string_view, size_t> metadata_index_;
  std::vector<gguf_tensor_info> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace mesh::models
