#include "graph/shape.hpp"

namespace mesh {

int64_t element_count(const shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

int64_t bounded_element_count(const shape& s, int64_t limit) {
  int64_t nonzero = 1;
  bool empty = false;
  for (auto d : s) {
    if (d < 0) return -1;
    if (d == 0) {
      empty = true;
      continue;
    }
    if (nonzero > limit / d) return -1;
    nonzero *= d;
  }
  return empty ? 0 : nonzero;
}

std::vector<int64_t> strides_of(const shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

std::string to_string(const shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

}  // namespace mesh
