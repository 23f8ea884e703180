// Fuzzes the TXT record path of a peer's announcement: wire form -> entries -> announcement,
// then the browse state machine fed with whatever decodes. Re-encoding a decoded announcement
// must give back the same announcement.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "discovery/browse_state.hpp"
#include "discovery/txt_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mesh::discovery;
  if (size == 0) return 0;
  // First byte odd: the rest is newline-separated entries (reaches the key/value checks fast,
  // as Avahi hands us entries); even: the RFC 6763 wire form (as dns_sd hands it).
  mesh::expected<std::vector<std::string>> entries;
  if (data[0] & 1) {
    entries.emplace();
    std::string cur;
    for (size_t i = 1; i < size; ++i) {
      if (data[i] == '\n') {
        entries->push_back(cur);
        cur.clear();
      } else {
        cur.push_back(static_cast<char>(data[i]));
      }
    }
    entries->push_back(cur);
  } else {
    entries = txt_from_wire(std::span<const uint8_t>(data + 1, size - 1));
  }
  if (!entries) return 0;
  auto decoded = decode_txt(*entries);
  static const announcement self{std::string(64, 'a'), "mesh-x", 1, 4000, ""};
  browse_state state(self, "fuzz");
  state.resolved("k", *entries, {"127.0.0.1"}, decoded ? decoded->port : 1);
  state.removed("k");
  if (!decoded) return 0;
  auto again = encode_txt(*decoded);
  if (!again) std::abort();
  auto round = decode_txt(*again);
  if (!round || round->node_id != decoded->node_id || round->mesh_id != decoded->mesh_id ||
      round->port != decoded->port || round->protocol_version != decoded->protocol_version ||
      round->device_summary != decoded->device_summary) {
    std::abort();
  }
  return 0;
}
