// A client's takeover grant (wire/takeover_grant.hpp): what it signs, and every way a grant that
// is not the client's word for this run, this generation and this node is refused.
#include <catch2/catch.hpp>

#include "test_ids.hpp"
#include "transport/identity.hpp"
#include "wire/messages.hpp"
#include "wire/takeover_grant.hpp"

using namespace mesh;
using namespace mesh::msg;

namespace {
transport::identity key(uint8_t n) {
  std::array<uint8_t, 32> seed{};
  seed.fill(n);
  return transport::identity::from_seed(seed);
}
}  // namespace

TEST_CASE("a takeover grant signed by the run's client is accepted for the node it names only", "[wire][takeover]") {
  const auto client = key(1), other_client = key(2);
  const node_id node_b = key(3).id(), node_m = key(4).id();
  const auto grant = sign_takeover(client.secret_key(), 7, 2, node_b);
  CHECK(grant.generation == 2);
  CHECK(grant.coordinator == node_b);
  CHECK(check_takeover(grant, client.id(), 7, node_b));

  const auto refused = [](const expected<void>& r, const std::string& words) {
    REQUIRE_FALSE(r);
    CHECK(r.error().code == error_code::invalid_argument);
    CHECK_THAT(r.error().message, Catch::Contains(words));
  };
  // Forwarded by another node than the one it names.
  refused(check_takeover(grant, client.id(), 7, node_m), "grant is for node " + node_b.short_string());
  // For another run of the client, or for another client's run.
  refused(check_takeover(grant, client.id(), 8, node_b), "not signed by the run's client");
  refused(check_takeover(grant, other_client.id(), 7, node_b), "not signed by the run's client");
  // A generation raised after signing (to supersede a later takeover), a bit flipped.
  auto raised = grant;
  raised.generation = 9;
  refused(check_takeover(raised, client.id(), 7, node_b), "generation 9");
  auto flipped = grant;
  flipped.sig[10] ^= 1;
  refused(check_takeover(flipped, client.id(), 7, node_b), "not signed");
  // Signed by the node that wants to take the run over, not by the client.
  refused(check_takeover(sign_takeover(key(3).secret_key(), 7, 2, node_b), client.id(), 7, node_b), "not signed");
  // None at all; a run that names no client.
  refused(check_takeover(takeover_grant{}, client.id(), 7, node_b), "no takeover grant");
  refused(check_takeover(grant, node_id{}, 7, node_b), "not signed");
  // An all-zero signature (what signing gives when libsodium cannot start) is never accepted.
  refused(check_takeover(takeover_grant{2, node_b, {}}, client.id(), 7, node_b), "not signed");
}

TEST_CASE("a takeover statement binds the run, the generation and the node", "[wire][takeover]") {
  const node_id b = test::named("node-b"), c = test::named("node-c");
  const auto s = takeover_statement(7, 2, b);
  CHECK(s != takeover_statement(8, 2, b));
  CHECK(s != takeover_statement(7, 3, b));
  CHECK(s != takeover_statement(7, 2, c));
  CHECK(s == takeover_statement(7, 2, b));
  // The grant travels inside train_setup and train_resume and survives the codec bit for bit.
  const auto grant = sign_takeover(key(1).secret_key(), 7, 2, b);
  train_resume r{7, c, {}, grant};
  auto bytes = encode_message(r);
  REQUIRE(bytes);
  auto back = decode_message(bytes->data(), bytes->size());
  REQUIRE(back);
  CHECK(std::get<train_resume>(*back).takeover == grant);
  CHECK(check_takeover(std::get<train_resume>(*back).takeover, key(1).id(), 7, b));
}
