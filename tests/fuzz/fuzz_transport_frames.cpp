// libFuzzer target: arbitrary bytes, in arbitrary chunking, through the frame decoder.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/frame.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mesh::transport;
  if (size < 1) return 0;
  // The first byte picks the chunk size, so the fuzzer explores split headers too.
  size_t chunk = (data[0] % 16) + 1;
  data += 1;
  size -= 1;
  frame_limits limits;
  limits.control = 4096;
  limits.bulk = 1 << 16;
  frame_decoder d(limits);
  std::vector<frame> out;
  for (size_t i = 0; i < size; i += chunk) {
    size_t n = size - i < chunk ? size - i : chunk;
    if (!d.feed({data + i, n}, out)) break;
  }
  for (const auto& f : out)
    if (f.payload.size() > limits.for_kind(f.kind)) __builtin_trap();
  (void)decode_single_frame({data, size}, limits);
  return 0;
}
