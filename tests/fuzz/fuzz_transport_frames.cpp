// libFuzzer target: arbitrary bytes, in arbitrary chunking, through the frame decoder.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/buffer_pool.hpp"
#include "transport/frame.hpp"

namespace {
using namespace mesh::transport;

std::vector<frame> decode_chunked(const uint8_t* data, size_t size, size_t chunk, const frame_limits& limits,
                                  buffer_pool* pool) {
  frame_decoder d(limits, limits.bulk, pool);
  std::vector<frame> out;
  for (size_t i = 0; i < size; i += chunk) {
    size_t n = size - i < chunk ? size - i : chunk;
    if (!d.feed({data + i, n}, out)) break;
  }
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte picks the chunk size, so the fuzzer explores split headers too.
  size_t chunk = (data[0] % 16) + 1;
  data += 1;
  size -= 1;
  frame_limits limits;
  limits.control = 4096;
  limits.bulk = 1 << 16;
  const auto out = decode_chunked(data, size, chunk, limits, nullptr);
  for (const auto& f : out)
    if (f.payload.size() > limits.for_kind(f.kind)) __builtin_trap();
  // Again with a pool that lends reused buffers (as a connection's bulk streams decode), filled
  // with the payloads of earlier inputs: the frames must be exactly the same.
  static buffer_pool pool(4, 1 << 20, 64);
  auto pooled = decode_chunked(data, size, chunk, limits, &pool);
  if (pooled.size() != out.size()) __builtin_trap();
  for (size_t i = 0; i < out.size(); ++i)
    if (pooled[i].kind != out[i].kind || pooled[i].payload != out[i].payload) __builtin_trap();
  for (auto& f : pooled) pool.give(std::move(f.payload));
  (void)decode_single_frame({data, size}, limits);
  return 0;
}
