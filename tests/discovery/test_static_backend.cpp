#include <catch2/catch.hpp>

#include <thread>

#include "discovery/backend.hpp"
#include "discovery/peer_table.hpp"
#include "discovery/lab/event_log.hpp"
#include "test_util.hpp"

using namespace mesh::discovery;
using namespace std::chrono_literals;

TEST_CASE("static backend: addresses become hints, id@addresses members", "[discovery][static]") {
  const std::string id = test::node_id('e');
  auto b = make_static_backend({"127.0.0.1:5000", id + "@localhost:5001", "[::1]:5002"});
  REQUIRE(b);
  test::event_log log;
  REQUIRE((*b)->start(test::make_announcement('a'), log.callback()));
  event e;
  REQUIRE(log.wait_for([](const event& x) { return x.k == event::peer_hint && x.peer.port == 5000; }, 5s, &e));
  CHECK(e.peer.addresses == std::vector<std::string>{"127.0.0.1"});
  CHECK(e.peer.node_id.empty());
  REQUIRE(log.wait_for(event::peer_found, id, 5s, &e));
  CHECK(e.peer.port == 5001);
  CHECK(e.peer.mesh_id == "mesh-a");
  CHECK(e.peer.source == "static");
  CHECK(!e.peer.addresses.empty());
  REQUIRE(log.wait_for([](const event& x) { return x.k == event::peer_hint && x.peer.port == 5002; }, 5s, &e));
  CHECK(e.peer.addresses == std::vector<std::string>{"::1"});
  (*b)->stop();
  // Through the peer table the configured member is a member like any other.
  peer_table table(test::make_announcement('a'));
  for (const auto& ev : log.snapshot()) table.apply(ev);
  REQUIRE(table.find(id));
  CHECK(table.members().size() == 1);
}

TEST_CASE("static backend: a bad --peer value is refused up front", "[discovery][static]") {
  auto b = make_static_backend({"127.0.0.1:5000", "nonsense"});
  REQUIRE(!b);
  CHECK(b.error().message.find("nonsense") != std::string::npos);
}

TEST_CASE("static backend: a configured peer is announced again until stop", "[discovery][static]") {
  // The node dials on each announcement (a no-op while connected): a peer that starts after this
  // node, or restarts, is reached again without restarting this node.
  const std::string id = test::node_id('e');
  auto b = make_static_backend({id + "@127.0.0.1:5001"});
  REQUIRE(b);
  test::event_log log;
  REQUIRE((*b)->start(test::make_announcement('a'), log.callback()));
  const auto announced = [&] {
    size_t n = 0;
    for (const auto& ev : log.snapshot()) n += ev.k == event::peer_found && ev.peer.node_id == id;
    return n;
  };
  for (int i = 0; i < 100 && announced() < 3; ++i) std::this_thread::sleep_for(100ms);
  CHECK(announced() >= 3);  // at 0, 0.5 and 1.5 s
  (*b)->stop();
  const size_t at_stop = announced();
  std::this_thread::sleep_for(1500ms);
  CHECK(announced() == at_stop);
}
