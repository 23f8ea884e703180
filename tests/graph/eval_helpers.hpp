#pragma once
// Small helpers shared by the graph tests: build, evaluate, compare.
#include <catch2/catch.hpp>

#include "graph/builder.hpp"
#include "graph/evaluate.hpp"
#include "graph/validate.hpp"

namespace mesh::test {

/// Finishes `b`, validates, evaluates, returns output `name` as doubles.
inline std::vector<double> run(builder& b, const tensor_map& inputs = {}, const std::string& name = "y") {
  auto g = b.finish();
  INFO((g ? std::string() : g.error().to_string()));
  REQUIRE(g);
  auto ok = validate(*g);
  INFO((ok ? std::string() : ok.error().to_string()));
  REQUIRE(ok);
  auto out = evaluate(*g, inputs, {});
  INFO((out ? std::string() : out.error().to_string()));
  REQUIRE(out);
  return out->outputs.at(name).to_doubles();
}

/// Finishes `b`, validates, evaluates; returns every output by name.
inline tensor_map run_all(builder& b, const tensor_map& inputs = {}) {
  auto g = b.finish();
  INFO((g ? std::string() : g.error().to_string()));
  REQUIRE(g);
  REQUIRE(validate(*g));
  auto out = evaluate(*g, inputs, {});
  INFO((out ? std::string() : out.error().to_string()));
  REQUIRE(out);
  return out->outputs;
}

inline void require_close(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::abs(got[i] - want[i]) <= tol * std::max(1.0, std::abs(want[i])));
  }
}

}  // namespace mesh::test
