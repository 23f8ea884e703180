// libFuzzer target: what a member (or a relay) can put in the NAT traversal frames: addresses,
// introductions, punch targets, relay envelopes and the sealed boxes inside them, and the relay
// session checks those boxes go through. Traps when a box is accepted twice, a session opens
// without the mesh secret, or a decoded address fails to encode back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "transport/identity.hpp"
#include "transport/relay_sessions.hpp"
#include "transport/traversal.hpp"

namespace {
using namespace mesh;
using namespace mesh::transport;

struct fixture {
  identity a = identity::generate(), b = identity::generate();
  std::vector<uint8_t> secret = std::vector<uint8_t>(32, 7);
};
fixture& keys() {
  static fixture f;
  return f;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::span<const uint8_t> in{data + 1, size - 1};
  auto& k = keys();
  switch (mode % 4) {
    case 0: {  // address, peer address and node id payloads
      if (auto a = decode_address(in)) {
        const auto again = encode_address(*a);
        if (again.size() != in.size()) __builtin_trap();
      }
      (void)decode_peer_address(in);
      (void)decode_node_id(in);
      break;
    }
    case 1: {  // a relay envelope and the box in it, opened as B from A
      auto env = decode_relay(in);
      if (!env) break;
      if (encode_relay(*env) != std::vector<uint8_t>(in.begin(), in.end())) __builtin_trap();
      (void)open_from(k.b, k.a.id(), env->box);
      break;
    }
    case 2: {  // a box sealed by A with fuzzed fields, through an open session at B
      relay_sessions sa(k.a.id(), k.secret), sb(k.b.id(), k.secret);
      auto ack = sb.on_hello(k.a.id(), sa.hello(k.b.id()));
      if (!ack || !sa.on_ack(k.b.id(), *ack)) __builtin_trap();  // an honest session must open
      uint64_t last = 0;
      size_t i = 0;
      while (i + 10 <= in.size()) {
        relay_plain p;
        p.kind = static_cast<relay_kind>(in[i] % 3 + 1);
        p.channel = in[i + 1] % 3;
        for (size_t j = 0; j < 8; ++j) p.seq |= static_cast<uint64_t>(in[i + 2 + j]) << (8 * j);
        i += 10;
        // Either the open session's id (as a replaying relay has it) or bytes of the input.
        if (i < in.size() && in[i] % 2 == 0) {
          auto real = sa.seal(k.b.id(), 0, {});
          p.session = real->session;
        } else if (i + 16 <= in.size()) {
          std::copy(in.begin() + static_cast<std::ptrdiff_t>(i), in.begin() + static_cast<std::ptrdiff_t>(i + 16), p.session.begin());
        }
        i += 17;
        // Through the seal and open the relay sees, as bytes.
        auto opened = open_from(k.b, k.a.id(), seal_for(k.a, k.b.id(), p));
        if (!opened) __builtin_trap();
        if (opened->seq != p.seq || opened->session != p.session || opened->channel != p.channel) __builtin_trap();
        if (opened->kind == relay_kind::message) {
          if (sb.accept(k.a.id(), *opened)) {
            if (opened->seq <= last) __builtin_trap();  // accepted a box again, or an older one
            last = opened->seq;
          }
        } else if (opened->kind == relay_kind::hello) {
          // A hello whose tag is fuzzed: without the secret it cannot pass (a 256-bit MAC).
          relay_plain h = *opened;
          h.payload.assign(in.begin() + static_cast<std::ptrdiff_t>(std::min(i, in.size())), in.end());
          if (sb.on_hello(k.a.id(), h)) __builtin_trap();
        } else {
          (void)sa.on_ack(k.b.id(), *opened);  // no hello outstanding: must be refused
          if (sa.open(k.b.id()) == false) __builtin_trap();
        }
      }
      break;
    }
    default: {  // a fuzzed hello from a node without the secret
      relay_sessions sb(k.b.id(), k.secret);
      relay_plain h;
      h.kind = relay_kind::hello;
      const size_t n = std::min<size_t>(16, in.size());
      std::copy(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n), h.session.begin());
      h.payload.assign(in.begin() + static_cast<std::ptrdiff_t>(n), in.end());
      if (sb.on_hello(k.a.id(), h)) __builtin_trap();
      break;
    }
  }
  return 0;
}
