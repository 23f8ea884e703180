#include <catch2/catch.hpp>

#include "transport/admission.hpp"
#include "transport/identity.hpp"

using namespace mesh::transport;
using mesh::node_id;

namespace {
admission_binding binding(uint8_t exporter_byte, node_id prover, node_id verifier, uint32_t version = 3) {
  admission_binding b;
  b.exporter.fill(exporter_byte);
  b.prover = prover;
  b.verifier = verifier;
  b.protocol_version = version;
  return b;
}
}  // namespace

TEST_CASE("admission proof with the right secret is accepted", "[transport][admission]") {
  auto a = identity::generate().id(), b = identity::generate().id();
  std::vector<uint8_t> secret(32, 9);
  auto proof = make_admission_proof(secret, binding(1, a, b));
  CHECK(verify_admission_proof(proof, secret, binding(1, a, b)));
  // The open mesh (empty secret) works the same way.
  auto open = make_admission_proof({}, binding(1, a, b));
  CHECK(verify_admission_proof(open, {}, binding(1, a, b)));
  CHECK_FALSE(verify_admission_proof(open, secret, binding(1, a, b)));
}

TEST_CASE("admission proof with a wrong secret is rejected", "[transport][admission]") {
  auto a = identity::generate().id(), b = identity::generate().id();
  std::vector<uint8_t> secret(32, 9), wrong(32, 9);
  wrong[31] = 8;
  auto proof = make_admission_proof(wrong, binding(1, a, b));
  auto r = verify_admission_proof(proof, secret, binding(1, a, b));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == mesh::error_code::invalid_argument);
}

TEST_CASE("admission proof replayed from another connection is rejected", "[transport][admission]") {
  auto a = identity::generate().id(), b = identity::generate().id(), c = identity::generate().id();
  std::vector<uint8_t> secret(32, 9);
  auto proof = make_admission_proof(secret, binding(1, a, b));
  // Same peers, another TLS connection: another exporter value.
  CHECK_FALSE(verify_admission_proof(proof, secret, binding(2, a, b)));
  // Reflected back to its maker, or forwarded to a third node.
  CHECK_FALSE(verify_admission_proof(proof, secret, binding(1, b, a)));
  CHECK_FALSE(verify_admission_proof(proof, secret, binding(1, a, c)));
}

TEST_CASE("admission reports a protocol version mismatch", "[transport][admission]") {
  auto a = identity::generate().id(), b = identity::generate().id();
  std::vector<uint8_t> secret(32, 9);
  auto proof = make_admission_proof(secret, binding(1, a, b, 4));
  auto r = verify_admission_proof(proof, secret, binding(1, a, b, 3));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == mesh::error_code::version_mismatch);
  // Tampering with the version field does not help: the MAC covers it.
  auto forged = proof;
  forged[3] = 3;
  auto f = verify_admission_proof(forged, secret, binding(1, a, b, 3));
  REQUIRE_FALSE(f);
  CHECK(f.error().code == mesh::error_code::invalid_argument);
  CHECK_FALSE(verify_admission_proof(std::span(proof).first(10), secret, binding(1, a, b, 4)));
}
