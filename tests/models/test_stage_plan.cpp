// The stage planner (models/stage_plan.hpp): exact splits by speed, memory caps that move layers
// to other nodes, nodes left out, and the errors of a model that does not fit.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "models/stage_plan.hpp"

using namespace mesh;
using namespace mesh::models;

namespace {

// Every layer 100 bytes of weights and 10 of KV cache; embedding 50, norm and head 70.
model_costs uniform(int64_t layers, int64_t shared = 0) {
  model_costs c;
  c.layer_bytes.assign(static_cast<size_t>(layers), 100);
  c.kv_bytes_per_layer = 10;
  c.first_bytes = 50;
  c.last_bytes = 70;
  c.shared_bytes = shared;
  return c;
}

struct split {
  std::string node;
  int64_t first, end, bytes;
  bool operator==(const split&) const = default;
};

std::ostream& operator<<(std::ostream& os, const split& s) {
  return os << s.node << " [" << s.first << ", " << s.end << ") " << s.bytes << " B";
}

std::vector<split> plan(const model_costs& c, const std::vector<stage_node>& nodes, head_place head = head_place::last_stage) {
  auto p = plan_stages(c, nodes, head);
  INFO((p ? std::string() : p.error().message));
  REQUIRE(p);
  std::vector<split> out;
  for (const auto& s : *p) out.push_back({s.node, s.layers.first, s.layers.end, s.bytes});
  return out;
}

constexpr int64_t plenty = 1'000'000;

}  // namespace

TEST_CASE("stage plan: equal nodes get equal shares, the extras on the first and last", "[models][stages]") {
  const std::vector<stage_node> nodes = {{"a", plenty, 1}, {"b", plenty, 1}, {"c", plenty, 1}, {"d", plenty, 1}};
  CHECK(plan(uniform(8), nodes) ==
        std::vector<split>{{"a", 0, 2, 270}, {"b", 2, 4, 220}, {"c", 4, 6, 220}, {"d", 6, 8, 290}});
}

TEST_CASE("stage plan: layers in proportion to speed, remainders to the earlier node", "[models][stages]") {
  CHECK(plan(uniform(8), {{"fast", plenty, 3}, {"slow", plenty, 1}}) ==
        std::vector<split>{{"fast", 0, 6, 710}, {"slow", 6, 8, 290}});
  // 4/3 each: one layer each, the fourth to the first of the tied remainders.
  CHECK(plan(uniform(4), {{"a", plenty, 1}, {"b", plenty, 1}, {"c", plenty, 1}}) ==
        std::vector<split>{{"a", 0, 2, 270}, {"b", 2, 3, 110}, {"c", 3, 4, 180}});
  // Speeds in GB/s, not integers: 2.5 : 1.5 of 8 layers is 5 : 3.
  CHECK(plan(uniform(8), {{"a", plenty, 2.5}, {"b", plenty, 1.5}}) ==
        std::vector<split>{{"a", 0, 5, 600}, {"b", 5, 8, 400}});
}

TEST_CASE("stage plan: a node whose share rounds to no layer is left out", "[models][stages]") {
  CHECK(plan(uniform(4), {{"a", plenty, 10}, {"b", plenty, 10}, {"tiny", plenty, 0.1}}) ==
        std::vector<split>{{"a", 0, 2, 270}, {"b", 2, 4, 290}});
  // One node with everything: a tied embedding (also the head) is held once.
  CHECK(plan(uniform(3, 50), {{"only", plenty, 1}}) == std::vector<split>{{"only", 0, 3, 330 + 50 + 70 - 50}});
}

TEST_CASE("stage plan: a node short of memory keeps what fits, the others take the rest by speed",
          "[models][stages]") {
  // "fast" should take 6 of 8 but holds 3 (3 x 110 + 50 = 380 <= 400).
  CHECK(plan(uniform(8), {{"fast", 400, 3}, {"slow", plenty, 1}}) ==
        std::vector<split>{{"fast", 0, 3, 380}, {"slow", 3, 8, 620}});
  // The middle node holds 2 of its 3; a and c share the 7 left: 4 and 3.
  CHECK(plan(uniform(9), {{"a", plenty, 1}, {"b", 250, 1}, {"c", plenty, 1}}) ==
        std::vector<split>{{"a", 0, 4, 490}, {"b", 4, 6, 220}, {"c", 6, 9, 400}});
  // The last stage's head counts: "c" holds 330 + 70 = 400 of three layers, not 440 of four.
  CHECK(plan(uniform(8), {{"a", plenty, 1}, {"c", 400, 1}}) ==
        std::vector<split>{{"a", 0, 5, 600}, {"c", 5, 8, 400}});
  // Memory that holds no layer at all: the node is left out.
  CHECK(plan(uniform(4), {{"a", plenty, 1}, {"none", 100, 100}, {"c", plenty, 1}}) ==
        std::vector<split>{{"a", 0, 2, 270}, {"c", 2, 4, 290}});
}

TEST_CASE("stage plan: the same input gives the same plan", "[models][stages]") {
  const std::vector<stage_node> nodes = {{"a", 700, 1.7}, {"b", 333, 2.9}, {"c", 900, 0.4}, {"d", plenty, 1.1}};
  const auto first = plan(uniform(13), nodes);
  for (int i = 0; i < 5; ++i) CHECK(plan(uniform(13), nodes) == first);
  int64_t next = 0;
  for (const auto& s : first) {  // contiguous, in node order, every layer once
    CHECK(s.first == next);
    next = s.end;
  }
  CHECK(next == 13);
}

TEST_CASE("stage plan: a model that does not fit is an error naming what it needs and what is free",
          "[models][stages]") {
  // 8 x 110 + 50 + 70 = 1000 bytes on 900.
  auto short_total = plan_stages(uniform(8), std::vector<stage_node>{{"a", 400, 1}, {"b", 500, 1}});
  REQUIRE_FALSE(short_total);
  CHECK(short_total.error().code == error_code::limit_exceeded);
  CHECK(short_total.error().message == "stage plan: the model needs 1.0 kB, the 2 nodes have 900 B free");
  // 560 bytes on 600, but no node holds two layers in a row: the three hold 3 of the 4.
  auto short_split = plan_stages(uniform(4), std::vector<stage_node>{{"a", 200, 1}, {"b", 200, 1}, {"c", 200, 1}});
  REQUIRE_FALSE(short_split);
  CHECK(short_split.error().code == error_code::limit_exceeded);
  CHECK(short_split.error().message ==
        "stage plan: the model needs 560 B and the 3 nodes have 600 B free, but in contiguous stages they hold only 3 of "
        "its 4 layers");
}

TEST_CASE("stage plan: bad input is an error", "[models][stages]") {
  CHECK_FALSE(plan_stages(uniform(4), std::vector<stage_node>{}));
  CHECK_FALSE(plan_stages(uniform(0), std::vector<stage_node>{{"a", plenty, 1}}));
  auto zero = plan_stages(uniform(4), std::vector<stage_node>{{"a", plenty, 1}, {"idle", plenty, 0}});
  REQUIRE_FALSE(zero);
  CHECK(zero.error().code == error_code::invalid_argument);
  CHECK(zero.error().message.find("node idle has speed 0") != std::string::npos);
}

TEST_CASE("format_bytes: powers of 1000, one decimal", "[models][stages]") {
  CHECK(format_bytes(812) == "812 B");
  CHECK(format_bytes(3400) == "3.4 kB");
  CHECK(format_bytes(5'100'000) == "5.1 MB");
  CHECK(format_bytes(5'100'000'000) == "5.1 GB");
  CHECK(format_bytes(3'900'000'000) == "3.9 GB");
}

TEST_CASE("stage plan: with the head on the first stage its memory is counted there, and the last stage holds none", "[models][stages]") {
  // Equal nodes: the first holds the embedding and the head (50 + 70), the last neither.
  CHECK(plan(uniform(8), {{"a", plenty, 1}, {"b", plenty, 1}}, head_place::first_stage) ==
        std::vector<split>{{"a", 0, 4, 560}, {"b", 4, 8, 440}});
  auto p = plan_stages(uniform(8), std::vector<stage_node>{{"a", plenty, 1}, {"b", plenty, 1}}, head_place::first_stage);
  REQUIRE(p);
  CHECK(p->front().layers.head);
  CHECK_FALSE(p->back().layers.head);
  // "a" fits 3 layers beside embedding and head (330 + 120 = 450 <= 500), not 4 (560): the rest
  // goes to "b", which needs no room for the head. Planned with the head last, "a" would keep 4.
  CHECK(plan(uniform(8), {{"a", 500, 1}, {"b", plenty, 1}}, head_place::first_stage) ==
        std::vector<split>{{"a", 0, 3, 450}, {"b", 3, 8, 550}});
  CHECK(plan(uniform(8), {{"a", 500, 1}, {"b", plenty, 1}}) == std::vector<split>{{"a", 0, 4, 490}, {"b", 4, 8, 510}});
  // A plan of one stage holds the head as the whole model does (a tied embedding counted once).
  CHECK(plan(uniform(2, 50), {{"a", plenty, 1}}, head_place::first_stage) == std::vector<split>{{"a", 0, 2, 290}});
  auto whole = plan_stages(uniform(2), std::vector<stage_node>{{"a", plenty, 1}}, head_place::first_stage);
  REQUIRE(whole);
  CHECK(whole->front().layers.head);
}
