// The Avahi backend against private avahi-daemons on loopback (see mdns_cases.hpp). Needs root;
// skips with a reason otherwise.
#include <catch2/catch.hpp>

#include "mdns_cases.hpp"

using namespace mesh::discovery;

TEST_CASE("avahi: two announcers find each other, a clean exit is seen as lost", "[discovery][avahi]") {
  test::two_announcers_find_each_other("avahi");
}
TEST_CASE("avahi: another mesh id is foreign, not a member", "[discovery][avahi]") {
  test::other_mesh_is_foreign("avahi");
}
TEST_CASE("avahi: a service name conflict is resolved", "[discovery][avahi]") {
  test::name_conflict_is_resolved("avahi");
}
TEST_CASE("avahi: daemon absent at start, started later", "[discovery][avahi]") {
  test::daemon_absent_then_started("avahi");
}
TEST_CASE("avahi: daemon restarted under running nodes", "[discovery][avahi]") {
  test::daemon_restart_reannounces("avahi");
}

TEST_CASE("avahi: hostile TXT records are rejected, not fatal", "[discovery][avahi]") {
  test::hostile_txt_is_rejected("avahi");
}
TEST_CASE("avahi: an instance that fails to resolve is retried until it resolves", "[discovery][avahi]") {
  test::unresolved_is_retried("avahi");
}
TEST_CASE("avahi: daemon stopped while a lookup is open", "[discovery][avahi]") {
  test::daemon_stops_during_lookup("avahi");
}
