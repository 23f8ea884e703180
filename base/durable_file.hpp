#pragma once
/// Files that survive a crash or a power cut whole: either the old content or the new one.
#include <filesystem>
#include <span>
#include <string_view>
#include <sys/types.h>

#include "base/error.hpp"

namespace mesh {

/// Writes `bytes` to `path` through a temporary file beside it (never following a symlink),
/// fsyncs it, renames it over `path` and fsyncs the directory, so that after a crash `path` holds
/// the old content or the new one, never a torn mix, and the rename itself is on disk. The file
/// gets `mode` (e.g. 0600 for secrets). Errors are io_error naming the step that failed.
expected<void> write_file_durably(const std::filesystem::path& path, std::span<const char> bytes, mode_t mode = 0644);

/// The same for text.
inline expected<void> write_text_durably(const std::filesystem::path& path, std::string_view text, mode_t mode = 0644) {
  return write_file_durably(path, std::span<const char>(text.data(), text.size()), mode);
}

/// fsyncs a directory, so that a rename or a new file in it is on disk.
expected<void> sync_directory(const std::filesystem::path& dir);

}  // namespace mesh
