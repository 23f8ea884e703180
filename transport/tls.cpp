#include "transport/tls.hpp"

#include <sodium.h>

#include <gnutls/abstract.h>
#include <gnutls/x509.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>

#include <cstring>
#include <ctime>

#include "transport/admission.hpp"

namespace mesh::transport {

namespace {

// TLS 1.3 only, AES-GCM first (ChaCha20 is ~6x slower on these machines), no middlebox
// compatibility mode (QUIC forbids it).
constexpr const char* priority =
    "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:+CHACHA20-POLY1305:"
    "%DISABLE_TLS13_COMPAT_MODE";

std::string gnutls_text(int rv) { return gnutls_strerror(rv); }

// Session data slot: we keep the check pointer next to the conn_ref via a small holder.
struct session_data {
  ngtcp2_crypto_conn_ref* ref;
  tls_peer_check* check;
};

// Reads the peer's Ed25519 key from its certificate; the certificate chain itself is not
// trusted (self-signed), the key is: TLS 1.3 CertificateVerify proved the peer holds it.
int verify_peer(gnutls_session_t session) {
  auto* ref = static_cast<ngtcp2_crypto_conn_ref*>(gnutls_session_get_ptr(session));
  auto* data = ref ? static_cast<session_data*>(gnutls_db_get_ptr(session)) : nullptr;
  if (!data) return -1;
  tls_peer_check& check = *data->check;
  unsigned n = 0;
  const gnutls_datum_t* certs = gnutls_certificate_get_peers(session, &n);
  if (!certs || n == 0) {
    check.failure = "peer presented no certificate";
    return -1;
  }
  gnutls_pubkey_t pk = nullptr;
  if (gnutls_pubkey_init(&pk) < 0) return -1;
  int rv = gnutls_pubkey_import_x509_raw(pk, &certs[0], GNUTLS_X509_FMT_DER, 0);
  gnutls_ecc_curve_t curve = GNUTLS_ECC_CURVE_INVALID;
  gnutls_datum_t x{}, y{};
  if (rv >= 0) rv = gnutls_pubkey_export_ecc_raw2(pk, &curve, &x, &y, 0);
  gnutls_pubkey_deinit(pk);
  if (rv < 0 || curve != GNUTLS_ECC_CURVE_ED25519 || x.size != 32) {
    check.failure = "peer's certificate key is not an Ed25519 node key";
    gnutls_free(x.data);
    gnutls_free(y.data);
    return -1;
  }
  node_id peer;
  std::memcpy(peer.key.data(), x.data, 32);
  gnutls_free(x.data);
  gnutls_free(y.data);
  // A small-order point (the all-zero key among them, which the layers above read as "no node")
  // is no identity anyone holds a secret for: refused before the peer is anything.
  if (crypto_core_ed25519_is_valid_point(peer.key.data()) != 1) {
    check.failure = "peer's key " + peer.to_string() + " is not a valid Ed25519 point";
    return -1;
  }
  check.peer = peer;
  if (check.expected && *check.expected != peer) {
    check.failure = "peer is node " + peer.to_string() + ", expected " + check.expected->to_string();
    return -1;
  }
  return 0;
}

}  // namespace

expected<std::unique_ptr<tls_context>> tls_context::create(const identity& id) {
  std::unique_ptr<tls_context> ctx(new tls_context());
  int rv = gnutls_certificate_allocate_credentials(&ctx->cred_);
  if (rv < 0) return make_error(error_code::internal, "gnutls credentials: " + gnutls_text(rv));

  gnutls_x509_privkey_t key = nullptr;
  gnutls_x509_crt_t crt = nullptr;
  auto cleanup = [&] {
    if (crt) gnutls_x509_crt_deinit(crt);
    if (key) gnutls_x509_privkey_deinit(key);
  };
  // libsodium's secret key is seed || public key; GnuTLS takes the two halves separately.
  auto seed = id.seed();
  auto pub = id.public_key();
  gnutls_datum_t pk_d{pub.data(), 32}, seed_d{seed.data(), 32};
  if ((rv = gnutls_x509_privkey_init(&key)) < 0 ||
      (rv = gnutls_x509_privkey_import_ecc_raw(key, GNUTLS_ECC_CURVE_ED25519, &pk_d, nullptr, &seed_d)) < 0 ||
      (rv = gnutls_x509_crt_init(&crt)) < 0) {
    cleanup();
    return make_error(error_code::internal, "cannot import the node key into GnuTLS: " + gnutls_text(rv));
  }
  std::string cn = "meshnode " + id.id().to_string();
  const uint8_t serial[] = {1};
  std::time_t now = std::time(nullptr);
  if ((rv = gnutls_x509_crt_set_version(crt, 3)) < 0 ||
      (rv = gnutls_x509_crt_set_serial(crt, serial, sizeof(serial))) < 0 ||
      (rv = gnutls_x509_crt_set_activation_time(crt, now - 86400)) < 0 ||
      (rv = gnutls_x509_crt_set_expiration_time(crt, now + 10 * 365 * 86400L)) < 0 ||
      (rv = gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, cn.data(),
                                          static_cast<unsigned>(cn.size()))) < 0 ||
      (rv = gnutls_x509_crt_set_key(crt, key)) < 0 ||
      (rv = gnutls_x509_crt_sign2(crt, crt, key, GNUTLS_DIG_SHA512, 0)) < 0 ||
      (rv = gnutls_certificate_set_x509_key(ctx->cred_, &crt, 1, key)) < 0) {
    cleanup();
    return make_error(error_code::internal, "cannot build the node certificate: " + gnutls_text(rv));
  }
  cleanup();
  gnutls_certificate_set_verify_function(ctx->cred_, verify_peer);
  return ctx;
}

tls_context::~tls_context() {
  if (cred_) gnutls_certificate_free_credentials(cred_);
}

expected<gnutls_session_t> make_tls_session(const tls_context& ctx, bool server, ngtcp2_crypto_conn_ref* ref,
                                            tls_peer_check* check) {
  gnutls_session_t s = nullptr;
  unsigned flags = (server ? GNUTLS_SERVER : GNUTLS_CLIENT) | GNUTLS_NO_END_OF_EARLY_DATA;
  int rv = gnutls_init(&s, flags);
  if (rv < 0) return make_error(error_code::internal, "gnutls_init: " + gnutls_text(rv));
  auto fail = [&](const char* what) {
    gnutls_deinit(s);
    return make_error(error_code::internal, std::string(what) + ": " + gnutls_text(rv));
  };
  if ((rv = gnutls_priority_set_direct(s, priority, nullptr)) < 0) return fail("gnutls priority");
  rv = server ? ngtcp2_crypto_gnutls_configure_server_session(s) : ngtcp2_crypto_gnutls_configure_client_session(s);
  if (rv != 0) return fail("ngtcp2 crypto configure");
  if ((rv = gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, ctx.credentials())) < 0) return fail("credentials");
  if (server) gnutls_certificate_server_set_request(s, GNUTLS_CERT_REQUIRE);
  gnutls_session_set_ptr(s, ref);
  // The db pointer is unused by QUIC (no session resumption here); it carries the check state.
  auto* data = new session_data{ref, check};
  gnutls_db_set_ptr(s, data);
  static const gnutls_datum_t alpn{const_cast<unsigned char*>(reinterpret_cast<const unsigned char*>("meshnode/1")), 10};
  gnutls_alpn_set_protocols(s, &alpn, 1, GNUTLS_ALPN_MANDATORY);
  return s;
}

void free_tls_session(gnutls_session_t s) {
  if (!s) return;
  delete static_cast<session_data*>(gnutls_db_get_ptr(s));
  gnutls_deinit(s);
}

expected<std::array<uint8_t, 32>> admission_exporter(gnutls_session_t session) {
  std::array<uint8_t, 32> out{};
  int rv = gnutls_prf_rfc5705(session, admission_exporter_label.size(), admission_exporter_label.data(), 0,
                              nullptr, out.size(), reinterpret_cast<char*>(out.data()));
  if (rv < 0) return make_error(error_code::internal, "TLS exporter: " + gnutls_text(rv));
  return out;
}

}  // namespace mesh::transport
