#pragma once
/// GnuTLS set-up for QUIC: the node key as a self-signed certificate, mutual authentication by
/// Ed25519 key (the node id), and the TLS exporter used by admission. Internal to transport/.
#include <gnutls/gnutls.h>

#include <array>
#include <memory>
#include <optional>
#include <string>

#include "base/error.hpp"
#include "transport/identity.hpp"

struct ngtcp2_crypto_conn_ref;

namespace mesh::transport {

/// Certificate credentials of one endpoint: a runtime self-signed X.509 certificate over the
/// node's Ed25519 key. Trust does not come from the certificate chain but from the key itself,
/// which must equal the node id the dialer expects (and is reported to the acceptor).
class tls_context {
 public:
  static expected<std::unique_ptr<tls_context>> create(const identity& id);
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  gnutls_certificate_credentials_t credentials() const { return cred_; }

 private:
  tls_context() = default;
  gnutls_certificate_credentials_t cred_ = nullptr;
};

/// The per-connection verification state the verify callback fills in. It lives in the
/// connection; the TLS session reaches it through its `ngtcp2_crypto_conn_ref`.
struct tls_peer_check {
  std::optional<node_id> expected;  ///< dialer: the node id it asked for
  std::optional<node_id> peer;      ///< set once the peer's key was read
  std::string failure;              ///< why verification failed, for the log
};

/// A configured TLS 1.3 session for one QUIC connection. `ref` is what ngtcp2's crypto helpers
/// find through the session pointer; `check` receives the peer's key and must outlive the session.
expected<gnutls_session_t> make_tls_session(const tls_context& ctx, bool server, ngtcp2_crypto_conn_ref* ref,
                                            tls_peer_check* check);

/// Frees a session made by make_tls_session.
void free_tls_session(gnutls_session_t session);

/// The 32-byte exporter value of an established session for the admission label.
expected<std::array<uint8_t, 32>> admission_exporter(gnutls_session_t session);

}  // namespace mesh::transport
