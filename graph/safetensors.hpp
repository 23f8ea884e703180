#pragma once
/// Checkpoints in the safetensors format (https://huggingface.co/docs/safetensors): an 8-byte
/// little-endian header length, a JSON header naming each tensor's dtype, shape and byte range,
/// then the raw little-endian bytes. Other tools (PyTorch, JAX, candle) read these files.
///
/// The reader parses only what the format allows (an object of tensor entries and an optional
/// "__metadata__" object of strings) and checks every range against the file: a truncated or
/// hostile file is an error, never a crash; memory is bounded by the file's size.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "graph/evaluate.hpp"

namespace mesh {

struct checkpoint {
  tensor_map tensors;
  std::map<std::string, std::string> metadata;  ///< e.g. {"step": "120"}
};

/// The bytes of a safetensors file.
std::vector<uint8_t> encode_safetensors(const checkpoint& c);
expected<checkpoint> decode_safetensors(const uint8_t* data, size_t size);

/// Writes durably (temporary file, fsync, rename over `path`, fsync of the directory): after a
/// crash or power cut `path` holds the old checkpoint or the new one, never half a file.
expected<void> save_safetensors(const std::filesystem::path& path, const checkpoint& c);
expected<checkpoint> load_safetensors(const std::filesystem::path& path);

}  // namespace mesh
