#pragma once
/// A text progress bar for the command-line tools (mesh-demo, meshctl train): "#####......".
#include <algorithm>
#include <string>

namespace mesh::app {

/// `width` characters, the share `fraction` (0..1, rounded to the nearest character) drawn as '#'.
inline std::string progress_bar(double fraction, int width = 28) {
  const int full = std::clamp(static_cast<int>(fraction * width + 0.5), 0, width);
  return std::string(static_cast<size_t>(full), '#') + std::string(static_cast<size_t>(width - full), '.');
}

}  // namespace mesh::app
