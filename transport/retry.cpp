#include "transport/retry.hpp"

#include <ngtcp2/ngtcp2_crypto.h>
#include <sodium.h>

namespace mesh::transport {

initial_check check_initial(std::span<const uint8_t> packet, const socket_address& from, const retry_secret& secret,
                            uint64_t token_lifetime_ns, uint64_t now_ns) {
  initial_check r;
  ngtcp2_pkt_hd hd{};
  if (ngtcp2_accept(&hd, packet.data(), packet.size()) != 0 || hd.type != NGTCP2_PKT_INITIAL) return r;
  r.hd = hd;
  if (hd.token.len == 0) {
    r.what = initial_check::kind::no_token;
    return r;
  }
  const int rv = ngtcp2_crypto_verify_retry_token(&r.odcid, hd.token.base, hd.token.len, secret.data(), secret.size(),
                                                  hd.version, from.get(), from.len, &hd.dcid, token_lifetime_ns, now_ns);
  r.what = rv == 0 ? initial_check::kind::valid_token : initial_check::kind::invalid_token;
  return r;
}

size_t write_retry(std::span<uint8_t> out, const ngtcp2_pkt_hd& hd, const socket_address& to,
                   const retry_secret& secret, uint64_t now_ns) {
  ngtcp2_cid scid{};
  scid.datalen = 18;  // the length of every connection id this endpoint issues
  randombytes_buf(scid.data, scid.datalen);
  std::array<uint8_t, NGTCP2_CRYPTO_MAX_RETRY_TOKENLEN> token{};
  const ngtcp2_ssize tokenlen = ngtcp2_crypto_generate_retry_token(token.data(), secret.data(), secret.size(), hd.version,
                                                                   to.get(), to.len, &scid, &hd.dcid, now_ns);
  if (tokenlen < 0) return 0;
  const ngtcp2_ssize n = ngtcp2_crypto_write_retry(out.data(), out.size(), hd.version, &hd.scid, &scid, &hd.dcid,
                                                   token.data(), static_cast<size_t>(tokenlen));
  return n < 0 ? 0 : static_cast<size_t>(n);
}

}  // namespace mesh::transport
