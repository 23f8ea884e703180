#pragma once
/// A bound on JSON nesting, checked before parsing: nlohmann's parser recurses once per level, so
/// a hostile file of a million '[' would overflow the stack. Shared by every JSON reader of
/// outside input in models/ (tokenizer.json, JSONL training records, adapter_config.json).
#include <cstddef>
#include <string_view>

namespace mesh::models {

/// Whether `text` opens more than `max_depth` arrays or objects at once (strings skipped, escapes
/// included); a flat scan, whatever the text's validity.
inline bool json_too_deep(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

}  // namespace mesh::models
