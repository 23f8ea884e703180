// libFuzzer target for the safetensors reader (checkpoints a user points meshnode at): any bytes
// give a checkpoint whose tensors are consistent, or an error.
#include <cstdlib>

#include "graph/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto c = mesh::decode_safetensors(data, size);
  if (c)
    for (const auto& [name, t] : c->tensors)
      if (!t.check()) std::abort();
  return 0;
}
