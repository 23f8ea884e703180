#pragma once
/// One view over the checkpoints users already have: a GGUF file, a .safetensors file, or a
/// Hugging Face directory (config.json beside model.safetensors or sharded
/// model-0000k-of-0000n.safetensors with model.safetensors.index.json).
///
/// The files stay mapped while the checkpoint lives and every tensor_view's data points into them:
/// no weight is copied into host memory, quantized ones stay quantized.
///
/// Shapes are given the way Hugging Face and PyTorch write them: row-major, outermost first, so a
/// [out, in] projection is {out, in} in both formats. GGUF stores ggml's ne[], fastest first;
/// the view reverses it (ne = {in, out} becomes shape {out, in}) and keeps the bytes as they are.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.hpp"
#include "models/gguf.hpp"
#include "models/mapped_file.hpp"
#include "models/safetensors_view.hpp"
#include "models/tensor_type.hpp"

namespace mesh::models {

/// Where a checkpoint's tensors come from.
enum class checkpoint_format { gguf, safetensors, hf_directory };

/// "gguf", "safetensors", "hf_directory".
const char* to_string(checkpoint_format f);

/// One tensor, its bytes where they lie in the mapped file.
struct tensor_view {
  std::string name;
  tensor_type type = tensor_type::f32;
  std::vector<int64_t> shape;  ///< row-major, outermost first (GGUF's ne[] reversed); {} for a scalar
  std::span<const uint8_t> data;

  int64_t elements() const;
};

/// "[4096, 4096]" for messages.
std::string shape_string(std::span<const int64_t> shape);

/// Bytes [offset, offset + length) of one of a checkpoint's files.
struct file_span {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const file_span&) const = default;
};

/// Where bytes of a checkpoint's mapping lie: its file (an index into checkpoint::files()) and
/// their offset in it.
struct file_location {
  size_t file = 0;
  uint64_t offset = 0;
};

/// A checkpoint opened in place. Move-only (it owns the mappings its views point into).
class checkpoint {
 public:
  /// Opens a .gguf file, a .safetensors file, or a Hugging Face directory (it must hold
  /// config.json, and model.safetensors.index.json or model.safetensors). What a file is follows
  /// from its first bytes, not its name. Errors name the path and what is wrong with it.
  static expected<checkpoint> open(const std::filesystem::path& path);

  checkpoint(checkpoint&&) noexcept = default;
  checkpoint& operator=(checkpoint&&) noexcept = default;
  checkpoint(const checkpoint&) = delete;
  checkpoint& operator=(const checkpoint&) = delete;
  ~checkpoint();

  checkpoint_format format() const { return format_; }
  /// What was opened (the file or the directory).
  const std::filesystem::path& path() const { return path_; }

  /// Every tensor, sorted by name.
  const std::vector<tensor_view>& tensors() const { return tensors_; }
  /// The tensor of that name, or nullptr.
  const tensor_view* find(std::string_view name) const;
  /// The tensor of that name with exactly that shape; errors (not_found, shape_mismatch) name the
  /// checkpoint, the tensor and both shapes.
  expected<const tensor_view*> require(std::string_view name, const std::vector<int64_t>& expected_shape) const;

  /// The GGUF metadata; nullptr unless format() is gguf.
  const gguf_view* gguf() const { return gguf_.get(); }
  /// The safetensors "__metadata__" of the file (of the first shard for a sharded checkpoint).
  const std::map<std::string, std::string>& safetensors_metadata() const;
  /// The text of config.json (checked to be a JSON object when opened); empty unless format() is
  /// hf_directory. model_config.hpp reads the architecture from it.
  const std::string& config_json() const { return config_json_; }
  /// Where config.json was read from (empty unless hf_directory).
  const std::filesystem::path& config_path() const { return config_path_; }
  /// Every file opening it read: the file itself, or a directory's config.json, its
  /// model.safetensors.index.json when it has one, and the safetensors files (what a node
  /// without the checkpoint must fetch to open it).
  std::vector<std::filesystem::path> files() const;
  /// Per file of files(): the bytes from its start that opening the checkpoint reads (a GGUF or
  /// safetensors file's header, up to its data; a JSON file all of it).
  std::vector<uint64_t> header_bytes() const;
  /// Where `bytes` (a tensor's data, in this checkpoint's mapping) lie; nullopt for bytes that
  /// are not in it.
  std::optional<file_location> locate(std::span<const uint8_t> bytes) const;

  /// Replaces the data of tensor `name` (same shape) with `bytes` of `type`, held by the
  /// checkpoint: how a LoRA adapter is merged into its base (peft.hpp). A replaced tensor lies in
  /// no file (locate: nullopt), so a split whose stages fetch the files refuses it. Errors: no
  /// such tensor, or `bytes` not the size of its shape in `type`.
  expected<void> replace(std::string_view name, tensor_type type, std::vector<uint8_t> bytes);
  /// How many tensors replace() changed.
  size_t replaced() const { return owned_.size(); }

 private:
  checkpoint() = default;
  expected<void> open_gguf(const std::filesystem::path& file);
  void take_safetensors(safetensors_shards shards);
  void index();

  checkpoint_format format_ = checkpoint_format::gguf;
  std::filesystem::path path_;
  std::filesystem::path config_path_;
  std::filesystem::path index_path_;  ///< model.safetensors.index.json, when one was read
  std::string config_json_;
  mapped_file gguf_file_;
  std::unique_ptr<gguf_view> gguf_;
  std::unique_ptr<safetensors_shards> shards_;
  std::vector<tensor_view> tensors_;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> owned_;  ///< replaced tensors' bytes
};

}  // namespace mesh::models
