// When and over whom a split model re-plans (actors/split_replan.hpp): pure decisions, no
// threads or sockets.
#include <catch2/catch.hpp>

#include <set>
#include <vector>

#include "actors/split_replan.hpp"
#include "test_ids.hpp"

using namespace mesh;
using namespace mesh::generation;

namespace {

const node_id self = test::named("self"), b = test::named("b"), c = test::named("c"), d = test::named("d"), e = test::named("e");
const split_candidate me{self, 8, 10};

std::vector<node_id> ids(const std::vector<split_candidate>& v) {
  std::vector<node_id> out;
  for (const auto& x : v) out.push_back(x.id);
  return out;
}

}  // namespace

TEST_CASE("a plan stands while its stage nodes are alive and it has the width it asked for", "[split][replan]") {
  const std::vector<split_candidate> live{{b, 8, 10}, {c, 8, 10}, {d, 8, 10}};
  const split_plan_view plan{self, {self, b, c}, {self, b, c}, 3};
  CHECK(replan_needed(plan, live, {}) == replan_cause::none);
  // A node that got no layers (planned over, holding none) changes nothing either.
  const split_plan_view no_layers{self, {self, b, c}, {self, b}, 3};
  CHECK(replan_needed(no_layers, live, {}) == replan_cause::none);
}

TEST_CASE("a stage node that left, or is excluded after a failed call, is a lost node", "[split][replan]") {
  const split_plan_view plan{self, {self, b, c}, {self, b, c}, 3};
  const std::vector<split_candidate> without_c{{b, 8, 10}, {d, 8, 10}};
  CHECK(replan_needed(plan, without_c, {}) == replan_cause::lost_node);
  const std::vector<split_candidate> all{{b, 8, 10}, {c, 8, 10}};
  CHECK(replan_needed(plan, all, {b}) == replan_cause::lost_node);
  // A plan whose stages were dropped after a loss must be made again.
  CHECK(replan_needed({self, {self, b}, {}, 3}, all, {}) == replan_cause::lost_node);
  // This node is never lost to itself (it is not among the live peers).
  CHECK(replan_needed({self, {self}, {self}, 1}, {}, {}) == replan_cause::none);
}

TEST_CASE("a plan narrower than asked widens when an unused peer is there, and only then", "[split][replan]") {
  const split_plan_view narrow{self, {self, b}, {self, b}, 3};
  CHECK(replan_needed(narrow, std::vector<split_candidate>{{b, 8, 10}}, {}) == replan_cause::none);
  CHECK(replan_needed(narrow, std::vector<split_candidate>{{b, 8, 10}, {d, 8, 10}}, {}) == replan_cause::widen);
  // An excluded newcomer (it refused a stage) does not trigger it again.
  CHECK(replan_needed(narrow, std::vector<split_candidate>{{b, 8, 10}, {d, 8, 10}}, {d}) == replan_cause::none);
  // At full width a newcomer changes nothing.
  const split_plan_view full{self, {self, b, c}, {self, b, c}, 3};
  CHECK(replan_needed(full, std::vector<split_candidate>{{b, 8, 10}, {c, 8, 10}, {d, 8, 10}}, {}) == replan_cause::none);
}

TEST_CASE("the next plan keeps this node first and the old plan's survivors in order, then fills up by memory", "[split][replan]") {
  constexpr uint64_t gib = uint64_t{1} << 30;
  const std::vector<split_candidate> live{{b, 8 * gib, 10}, {d, 4 * gib, 10}, {e, 16 * gib, 10}};
  // c is gone: b stays, and e (more memory than d) takes its place.
  auto next = replan_nodes(me, std::vector<node_id>{self, c, b}, live, {}, 3);
  CHECK(ids(next) == std::vector<node_id>{self, b, e});
  // Excluded nodes are skipped; fewer usable nodes than asked make a narrower plan.
  next = replan_nodes(me, std::vector<node_id>{self, c, b}, live, {e, d}, 3);
  CHECK(ids(next) == std::vector<node_id>{self, b});
  // Nobody left: this node alone (the plan then says whether the model fits it).
  CHECK(ids(replan_nodes(me, std::vector<node_id>{self, b}, {}, {}, 2)) == std::vector<node_id>{self});
  // Ties in memory, counted in whole GiB (a figure that moves a little reorders nothing), go to
  // the lower id.
  const node_id lower = b.to_string() < d.to_string() ? b : d, higher = lower == b ? d : b;
  const std::vector<split_candidate> tie{{higher, 8 * gib + 5'000'000, 10}, {lower, 8 * gib, 10}};
  auto tied = replan_nodes(me, std::vector<node_id>{self}, tie, {}, 2);
  CHECK(ids(tied) == std::vector<node_id>{self, lower});
  // The description comes from the live view, not from the old plan.
  next = replan_nodes(me, std::vector<node_id>{self, b}, live, {}, 2);
  REQUIRE(next.size() == 2);
  CHECK(next[1].memory_bytes == 8 * gib);
}

TEST_CASE("a stage loss is a node that left, did not answer or could not be reached, not a bad request", "[split][replan]") {
  CHECK(is_stage_loss({error_code::unavailable, "node b left the mesh"}));
  CHECK(is_stage_loss({error_code::timeout, "late"}));
  CHECK(is_stage_loss({error_code::network, "unreachable"}));
  CHECK_FALSE(is_stage_loss({error_code::invalid_argument, "out of step"}));
  CHECK_FALSE(is_stage_loss({error_code::limit_exceeded, "context"}));
  CHECK_FALSE(is_stage_loss({error_code::device, "lost device"}));
}
