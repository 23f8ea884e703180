// libFuzzer target: the join token decoder (what a person types or pastes after --join). Any
// input must give a credential or an error, never a crash; a decoded credential must re-encode to
// a token that decodes to the same credential. Half the inputs are a valid token with bytes of
// the input written over it, so the fuzzer reaches the checksum and the success path, which
// random bytes never would.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "transport/join_token.hpp"

namespace {
using namespace mesh::transport;

void check(const std::string& text) {
  auto c = decode_join_token(text);
  if (!c) {
    if (c.error().message.empty()) std::abort();  // every refusal must say why
    return;
  }
  if (c->secret.size() != mesh_secret_size || c->mesh_id.size() != 2 * mesh_id_bytes) std::abort();
  auto again = decode_join_token(encode_join_token(*c));
  if (!again || !(*again == *c)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] & 1) {
    check(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
    return 0;
  }
  // A fixed valid token, overwritten at (position, byte) pairs from the input.
  static const std::string valid = encode_join_token({std::string(32, 'a'), std::vector<uint8_t>(mesh_secret_size, 0x5c)});
  std::string t = valid;
  for (size_t i = 1; i + 1 < size; i += 2) t[data[i] % t.size()] = static_cast<char>(data[i + 1]);
  if (size % 2 == 0) t.push_back(static_cast<char>(data[size - 1]));  // and a length change
  check(t);
  return 0;
}
