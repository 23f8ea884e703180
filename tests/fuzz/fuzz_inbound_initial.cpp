// libFuzzer target: the stateless path every datagram from a stranger takes when it matches no
// connection (transport/retry.hpp): header decoding and Retry token verification, then the
// inbound gate's decision. Any bytes must give a verdict, never a crash; a forged or altered
// token never validates. Half the inputs are a real Initial's header with a genuine token and
// input bytes written over it, so the fuzzer reaches the token check, which random bytes never
// would.
#include <sodium.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <vector>

#include "transport/inbound_gate.hpp"
#include "transport/retry.hpp"

namespace {
using namespace mesh::transport;

constexpr uint64_t lifetime = 3'000'000'000u, now = 10'000'000'000u;

const retry_secret& secret() {
  static retry_secret s = [] {
    retry_secret x{};
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(i * 7 + 1);
    return x;
  }();
  return s;
}

void check(const uint8_t* data, size_t size, const socket_address& from) {
  static inbound_gate gate{inbound_limits{}};
  auto c = check_initial({data, size}, from, secret(), lifetime, now);
  if (c.what == initial_check::kind::not_initial) return;
  if (c.hd.type != NGTCP2_PKT_INITIAL) std::abort();
  auto v = gate.on_initial(source_key::of(from), c.what == initial_check::kind::valid_token, now);
  if (c.what != initial_check::kind::valid_token && v.what == inbound_gate::decision::accept) std::abort();
  if (v.what == inbound_gate::decision::accept) {
    static uint64_t handle = 0;
    gate.opened(source_key::of(from), ++handle, now);
    gate.settled(handle);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const socket_address from = *parse_address("10.1.2.3:4433");
  if (size == 0) return 0;
  check(data + 1, size - 1, from);
  if (data[0] & 1) return 0;
  // A Retry answering a made-up Initial gives a genuine token; build the client's next Initial
  // header around it (long header, type Initial, v1, the Retry's scid as dcid), then let the
  // input overwrite part of it.
  ngtcp2_pkt_hd hd{};
  hd.version = NGTCP2_PROTO_VER_V1;
  hd.dcid.datalen = 8;
  std::memset(hd.dcid.data, 0x11, 8);
  hd.scid.datalen = 8;
  std::memset(hd.scid.data, 0x22, 8);
  uint8_t retry[256];
  const size_t n = write_retry(retry, hd, from, secret(), now - 1'000'000'000u);
  if (n == 0) std::abort();
  ngtcp2_pkt_hd r{};
  if (ngtcp2_pkt_decode_hd_long(&r, retry, n) <= 0) std::abort();
  const size_t hdlen = 1 + 4 + 1 + r.dcid.datalen + 1 + r.scid.datalen;
  const uint8_t* token = retry + hdlen;
  const size_t tokenlen = n - hdlen - 16;
  std::vector<uint8_t> pkt;
  pkt.push_back(0xc0);  // long header, Initial, packet number length 1
  pkt.insert(pkt.end(), {0, 0, 0, 1});
  pkt.push_back(static_cast<uint8_t>(r.scid.datalen));
  pkt.insert(pkt.end(), r.scid.data, r.scid.data + r.scid.datalen);
  pkt.push_back(8);
  pkt.insert(pkt.end(), hd.scid.data, hd.scid.data + 8);
  pkt.push_back(static_cast<uint8_t>(0x40 | (tokenlen >> 8)));  // two-byte varints
  pkt.push_back(static_cast<uint8_t>(tokenlen & 0xff));
  pkt.insert(pkt.end(), token, token + tokenlen);
  const size_t rest = 1200 - pkt.size() - 2;  // the Length field covers the rest of the datagram
  pkt.push_back(static_cast<uint8_t>(0x40 | (rest >> 8)));
  pkt.push_back(static_cast<uint8_t>(rest & 0xff));
  pkt.resize(1200, 0);
  const size_t at = data[0] % pkt.size();
  for (size_t i = 1; i < size && at + i - 1 < pkt.size(); ++i) pkt[at + i - 1] ^= data[i];
  const bool untouched = size == 1 || std::all_of(data + 1, data + size, [](uint8_t b) { return b == 0; });
  auto c = check_initial(pkt, from, secret(), lifetime, now);
  if (untouched && c.what != initial_check::kind::valid_token) std::abort();  // the genuine token passes
  check(pkt.data(), pkt.size(), from);
  return 0;
}
