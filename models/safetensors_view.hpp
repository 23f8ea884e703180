#pragma once
/// Safetensors checkpoints (https://huggingface.co/docs/safetensors) read in place:
///
///   u64 little-endian header length N | N bytes of JSON | data buffer
///   JSON: {"__metadata__": {"k": "v", ...}, "name": {"dtype": "F16", "shape": [..],
///          "data_offsets": [begin, end]}, ...}   (offsets relative to the data buffer)
///
/// and the sharded form Hugging Face writes for large models: model.safetensors.index.json, whose
/// "weight_map" names the shard file holding each tensor; every shard is mapped once.
///
/// Only F32, F16 and BF16 tensors are accepted (the dtypes of the checkpoints meshnode runs);
/// another dtype is an `unsupported` error naming the tensor and the dtype. Every tensor's range
/// must lie inside the data buffer and hold exactly shape x dtype bytes; ranges may overlap or come
/// in any order (the format does not forbid it and nothing here writes). Unlike graph/safetensors,
/// which copies f32 training checkpoints into tensors, nothing here copies tensor data.
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.hpp"
#include "models/mapped_file.hpp"
#include "models/tensor_type.hpp"

namespace mesh::models {

/// One tensor of a safetensors file; `data` points into the bytes parsed.
struct safetensors_tensor {
  std::string name;
  tensor_type type = tensor_type::f32;
  std::vector<int64_t> shape;  ///< row-major, outermost first; empty for a scalar
  std::span<const uint8_t> data;
};

/// A parsed safetensors file: views into the bytes parsed, which must outlive it.
class safetensors_view {
 public:
  /// The format's own limit on the JSON header (the reference implementation refuses more).
  static constexpr uint64_t max_header_bytes = uint64_t{100} << 20;

  /// Parses `bytes` (a whole file). `source` (usually the path) starts every error message.
  static expected<safetensors_view> parse(std::span<const uint8_t> bytes, std::string source);

  const std::string& source() const { return source_; }
  /// Tensors sorted by name.
  const std::vector<safetensors_tensor>& tensors() const { return tensors_; }
  const safetensors_tensor* find(std::string_view name) const;
  /// The "__metadata__" object (string values only, as the format defines it).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Where the data buffer starts in the file (8 + header length).
  uint64_t data_offset() const { return data_offset_; }

 private:
  std::string source_;
  uint64_t data_offset_ = 0;
  std::vector<safetensors_tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// The "weight_map" of a model.safetensors.index.json.
struct safetensors_index {
  std::vector<std::pair<std::string, std::string>> weight_map;  ///< tensor name -> shard file name
  std::vector<std::string> shards;                              ///< distinct shard names, first seen first
};

/// Parses the text of an index file. Shard names must be plain file names (no directories, no
/// ".."): the index is input, and must not point the reader anywhere but beside itself.
expected<safetensors_index> parse_safetensors_index(std::string_view json, const std::string& source);

/// A safetensors checkpoint on disk: one file, or every shard an index names, each mapped once and
/// kept mapped while this object lives (its views point into the mappings).
class safetensors_shards {
 public:
  /// One .safetensors file.
  static expected<safetensors_shards> open_file(const std::filesystem::path& path);
  /// The shards `index_path` (model.safetensors.index.json) names, from its directory. A shard
  /// that is missing, a tensor the index places in a shard that lacks it, or a tensor in two
  /// shards is an error naming them.
  static expected<safetensors_shards> open_index(const std::filesystem::path& index_path);

  const std::vector<safetensors_view>& views() const { return views_; }
  const std::vector<mapped_file>& files() const { return files_; }
  /// A tensor of any shard.
  const safetensors_tensor* find(std::string_view name) const;

 private:
  expected<void> add(mapped_file file);

  std::vector<mapped_file> files_;
  std::vector<safetensors_view> views_;
  std::unordered_map<std::string, std::pair<size_t, size_t>> where_;  ///< name -> (view, tensor)
};

}  // namespace mesh::models
