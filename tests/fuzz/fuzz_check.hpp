#pragma once
/// What a fuzz target asserts about every input: a property that must hold. A violation aborts,
/// which libFuzzer reports with the input that caused it (unlike assert, kept in every build).
#include <cstdlib>

namespace mesh::fuzz {

inline void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace mesh::fuzz
