#pragma once
// Test-side writers of GGUF and safetensors files (and Hugging Face directories, sharded or not),
// so that each test builds exactly the file it needs: chosen metadata, chosen tensors, and hostile
// variations (wrong counts, offsets, types) that no real writer would produce.
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "models/dequantize.hpp"
#include "models/gguf.hpp"
#include "models/tensor_type.hpp"

namespace mesh::models::test {

using bytes = std::vector<uint8_t>;

inline void put_le(bytes& out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void put_string(bytes& out, const std::string& s) {
  put_le(out, s.size(), 8);
  out.insert(out.end(), s.begin(), s.end());
}

inline bytes f32_bytes(const std::vector<float>& v) {
  bytes out;
  for (const float x : v) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    put_le(out, u, 4);
  }
  return out;
}
inline bytes f16_bytes(const std::vector<float>& v) {
  bytes out;
  for (const float x : v) put_le(out, f32_to_f16(x), 2);
  return out;
}
inline bytes bf16_bytes(const std::vector<float>& v) {
  bytes out;
  for (const float x : v) put_le(out, f32_to_bf16(x), 2);
  return out;
}
inline bytes random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  bytes out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

inline void write_file(const std::filesystem::path& path, const bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
inline void write_file(const std::filesystem::path& path, const std::string& s) { write_file(path, bytes(s.begin(), s.end())); }
inline bytes read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(f), {});
}

/// A fresh directory under the system's temporary directory, removed with everything in it.
class temp_dir {
 public:
  temp_dir() {
    std::string t = (std::filesystem::temp_directory_path() / "mesh_models_XXXXXX").string();
    if (::mkdtemp(t.data())) path_ = t;
  }
  ~temp_dir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// Builds a GGUF file. Metadata and tensors are written in the order added; tensor data is laid
/// out in order at the alignment unless a tensor overrides its offset.
class gguf_writer {
 public:
  uint32_t version = 3;
  uint32_t alignment = 32;  ///< the data section's alignment (general.alignment when set_alignment)
  std::optional<uint64_t> tensor_count_override, kv_count_override;
  std::string magic = "GGUF";

  // Encoded values: the u32 type then the value, as a key/value entry stores them.
  static bytes value(gguf_value_type t, uint64_t raw, size_t n) {
    bytes b;
    put_le(b, static_cast<uint32_t>(t), 4);
    put_le(b, raw, n);
    return b;
  }
  void add_raw(const std::string& key, bytes encoded) { kvs_.emplace_back(key, std::move(encoded)); }
  void add_u8(const std::string& k, uint8_t v) { add_raw(k, value(gguf_value_type::u8, v, 1)); }
  void add_i8(const std::string& k, int8_t v) { add_raw(k, value(gguf_value_type::i8, static_cast<uint8_t>(v), 1)); }
  void add_u16(const std::string& k, uint16_t v) { add_raw(k, value(gguf_value_type::u16, v, 2)); }
  void add_i16(const std::string& k, int16_t v) { add_raw(k, value(gguf_value_type::i16, static_cast<uint16_t>(v), 2)); }
  void add_u32(const std::string& k, uint32_t v) { add_raw(k, value(gguf_value_type::u32, v, 4)); }
  void add_i32(const std::string& k, int32_t v) { add_raw(k, value(gguf_value_type::i32, static_cast<uint32_t>(v), 4)); }
  void add_u64(const std::string& k, uint64_t v) { add_raw(k, value(gguf_value_type::u64, v, 8)); }
  void add_i64(const std::string& k, int64_t v) { add_raw(k, value(gguf_value_type::i64, static_cast<uint64_t>(v), 8)); }
  void add_f32(const std::string& k, float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    add_raw(k, value(gguf_value_type::f32, u, 4));
  }
  void add_f64(const std::string& k, double v) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    add_raw(k, value(gguf_value_type::f64, u, 8));
  }
  void add_bool(const std::string& k, bool v) { add_raw(k, value(gguf_value_type::boolean, v ? 1 : 0, 1)); }
  void add_string(const std::string& k, const std::string& v) {
    bytes b;
    put_le(b, static_cast<uint32_t>(gguf_value_type::string), 4);
    put_string(b, v);
    add_raw(k, std::move(b));
  }
  /// An array whose elements are already encoded (without their type).
  static bytes array(gguf_value_type element, uint64_t count, const bytes& elements) {
    bytes b;
    put_le(b, static_cast<uint32_t>(gguf_value_type::array), 4);
    put_le(b, static_cast<uint32_t>(element), 4);
    put_le(b, count, 8);
    b.insert(b.end(), elements.begin(), elements.end());
    return b;
  }
  void add_array_strings(const std::string& k, const std::vector<std::string>& v) {
    bytes e;
    for (const auto& s : v) put_string(e, s);
    add_raw(k, array(gguf_value_type::string, v.size(), e));
  }
  void add_array_i32(const std::string& k, const std::vector<int32_t>& v) {
    bytes e;
    for (const int32_t x : v) put_le(e, static_cast<uint32_t>(x), 4);
    add_raw(k, array(gguf_value_type::i32, v.size(), e));
  }
  void add_array_f32(const std::string& k, const std::vector<float>& v) {
    bytes e = f32_bytes(v);
    add_raw(k, array(gguf_value_type::f32, v.size(), e));
  }
  void set_alignment(uint32_t a) {
    alignment = a;
    add_u32("general.alignment", a);
  }

  struct tensor {
    std::string name;
    uint32_t type;             ///< GGUF type number (may be one no reader supports)
    std::vector<uint64_t> ne;  ///< ggml order
    bytes data;
    std::optional<uint64_t> offset;  ///< relative to the data section; default: laid out in order
  };
  void add_tensor(const std::string& name, tensor_type t, std::vector<uint64_t> ne, bytes data) {
    tensors_.push_back({name, gguf_type_number(t), std::move(ne), std::move(data), std::nullopt});
  }
  void add_tensor(tensor t) { tensors_.push_back(std::move(t)); }
  std::vector<tensor>& tensors() { return tensors_; }

  bytes build() const {
    bytes out(magic.begin(), magic.end());
    put_le(out, version, 4);
    put_le(out, tensor_count_override.value_or(tensors_.size()), 8);
    put_le(out, kv_count_override.value_or(kvs_.size()), 8);
    for (const auto& [k, v] : kvs_) {
      put_string(out, k);
      out.insert(out.end(), v.begin(), v.end());
    }
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors_) {
      const uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      next = std::max(next, off + t.data.size());
      next = (next + alignment - 1) / alignment * alignment;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      put_string(out, t.name);
      put_le(out, t.ne.size(), 4);
      for (const uint64_t n : t.ne) put_le(out, n, 8);
      put_le(out, t.type, 4);
      put_le(out, offsets[i], 8);
    }
    while (out.size() % alignment) out.push_back(0);
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& d = tensors_[i].data;
      if (out.size() < data_start + offsets[i] + d.size()) out.resize(data_start + offsets[i] + d.size(), 0);
      std::copy(d.begin(), d.end(), out.begin() + static_cast<std::ptrdiff_t>(data_start + offsets[i]));
    }
    return out;
  }

 private:
  std::vector<std::pair<std::string, bytes>> kvs_;
  std::vector<tensor> tensors_;
};

/// Builds a safetensors file; tensors laid out in order unless given offsets.
struct safetensors_writer {
  struct tensor {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    bytes data;
    std::optional<std::pair<uint64_t, uint64_t>> offsets;
  };
  std::vector<tensor> tensors;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::optional<std::string> header_override;  ///< the JSON header verbatim
  std::optional<uint64_t> length_override;      ///< the 8-byte header length

  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, bytes data) {
    tensors.push_back({name, dtype, std::move(shape), std::move(data), std::nullopt});
  }

  bytes build() const {
    std::string header = "{";
    if (!metadata.empty()) {
      header += "\"__metadata__\":{";
      for (size_t i = 0; i < metadata.size(); ++i)
        header += (i ? "," : "") + ("\"" + metadata[i].first + "\":\"" + metadata[i].second + "\"");
      header += "}";
    }
    bytes buffer;
    for (const auto& t : tensors) {
      uint64_t begin = buffer.size(), end = buffer.size() + t.data.size();
      if (t.offsets) std::tie(begin, end) = *t.offsets;
      else buffer.insert(buffer.end(), t.data.begin(), t.data.end());
      if (header.size() > 1) header += ",";
      header += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
      for (size_t i = 0; i < t.shape.size(); ++i) header += (i ? "," : "") + std::to_string(t.shape[i]);
      header += "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
    }
    header += "}";
    if (header_override) header = *header_override;
    while (header.size() % 8) header += ' ';
    bytes out;
    put_le(out, length_override.value_or(header.size()), 8);
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), buffer.begin(), buffer.end());
    return out;
  }
};

}  // namespace mesh::models::test
