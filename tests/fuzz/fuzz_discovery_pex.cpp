// Fuzzes the peer exchange decoder and merge. Whatever decodes must re-encode to the same bytes
// (the format has one spelling per message) and merge into a peer table without trouble.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "discovery/peer_exchange.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mesh::discovery;
  auto entries = decode_pex(std::span<const uint8_t>(data, size));
  if (!entries) return 0;
  auto again = encode_pex(*entries);
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  peer_table table({std::string(64, 'a'), "mesh-x", 1, 4000, ""});
  merge_pex(table, std::string(64, 'b'), *entries);
  if (table.members().size() > entries->size()) std::abort();
  return 0;
}
