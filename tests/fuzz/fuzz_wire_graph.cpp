// libFuzzer target for the WireGraph decoder: whatever the bytes, decoding returns a value or an
// error, and a decoded graph always validates.
#include <cstdlib>
#include <cstring>

#include "graph/validate.hpp"
#include "wire/wire_graph.hpp"
#include "random_graph.hpp"

namespace {
/// A valid encoding to mutate, so the fuzzer reaches deep into the decoder from the first run.
const std::vector<char>& seed_bytes() {
  static const std::vector<char> bytes = [] {
    mesh::wire_graph w{mesh::test::random_graph(3, 12), {}};
    w.tensors["t"] = mesh::tensor::from_values(mesh::dtype::bf16, {2, 2}, {1, 2, 3, 4});
    // A block-quantized tensor whose dtype byte edits can turn into every other block type.
    w.tensors["q"] = mesh::tensor::from_values(mesh::dtype::q5_0, {1, 32}, std::vector<double>(32, 0.5));
    return *mesh::encode(w);
  }();
  return bytes;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mesh::graph_limits limits;
  limits.max_total_bytes = int64_t{64} << 20;  // keep the fuzzer within its memory budget
  limits.max_elements = int64_t{1} << 22;
  if (size > 0 && (data[0] & 1)) {
    // Odd first byte: treat the rest as edits (position, xor value pairs) of a valid encoding.
    std::vector<char> bytes = seed_bytes();
    for (size_t i = 1; i + 2 < size; i += 3) {
      const size_t pos = (static_cast<size_t>(data[i]) << 8 | data[i + 1]) % bytes.size();
      bytes[pos] = static_cast<char>(bytes[pos] ^ data[i + 2]);
    }
    auto r = mesh::decode_wire_graph(bytes.data(), bytes.size(), limits);
    if (r && !mesh::validate(r->g, limits)) std::abort();
    return 0;
  }
  auto r = mesh::decode_wire_graph(reinterpret_cast<const char*>(data), size, limits);
  if (r && !mesh::validate(r->g, limits)) std::abort();
  return 0;
}
