// A model split over three real meshnode processes (docs/serving.md, "Split over the mesh"):
// `meshctl models load PATH --split 3` on the serving node plans the stages over it and its two
// peers, each loading its layers from its copy of the file; a greedy /v1/completions gives
// exactly the text of the same checkpoint served whole; `meshctl models` and the dashboard's JSON
// show the stages; killing a stage node makes the next request fail with a message naming it
// while the serving node stays up.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "model_writer.hpp"
#include "node_harness.hpp"
#include "run_command.hpp"
#include "serving_fixture.hpp"
#include "serving_harness.hpp"

using namespace mesh;
using nlohmann::json;
using serving::test::curl;
using mesh::test::api_url;
using mesh::test::meshctl;

namespace {

/// The completion's text, or the failed reply's status and body.
std::pair<int, std::string> complete(const std::filesystem::path& scratch, const std::string& url, const std::string& model) {
  auto r = curl(scratch, url + "/v1/completions",
                R"({"model": ")" + model + R"(", "prompt": "one two three four", "max_tokens": 8, "temperature": 0, "ignore_eos": true})");
  if (r.status != 200) return {r.status, r.body};
  return {200, json::parse(r.body).at("choices").at(0).at("text").get<std::string>()};
}

}  // namespace

TEST_CASE("a model split over three meshnodes serves the text of the whole model, and a dead stage node is named",
          "[apps][serving][split]") {
  mesh::test::temp_dir tmp;
  models::test::model_spec spec;
  spec.layers = 6;
  spec.context = 256;
  const auto whole = tmp.path / "whole.gguf", split = tmp.path / "split.gguf";
  models::test::write_gguf_model(whole, spec, models::tensor_type::q8_0);
  std::filesystem::copy_file(whole, split);  // the same checkpoint under another id
  const auto sa = tmp.path / "a";
  mesh::test::node_process a(sa, {"--model", whole.string(), "--api-bind", "127.0.0.1:0"});
  const auto ea = a.endpoint();
  mesh::test::node_process b(tmp.path / "b", {"--peer", ea, "--api-bind", "off"});
  const auto eb = b.endpoint();
  mesh::test::node_process c(tmp.path / "c", {"--peer", ea, "--api-bind", "off"});
  const auto ec = c.endpoint();
  const std::string url = api_url(sa);
  INFO(a.log());

  // Both peers healthy as the serving node sees them.
  int healthy = 0;
  for (int i = 0; i < 300 && healthy < 2; ++i) {
    auto m = curl(tmp.path, url + "/api/mesh", "");
    REQUIRE(m.status == 200);
    healthy = 0;
    const auto mesh_json = json::parse(m.body);
    for (const auto& n : mesh_json.at("nodes")) healthy += n.at("health") == "healthy";
    if (healthy < 2) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  REQUIRE(healthy == 2);

  auto too_many = meshctl(sa, "models load " + split.string() + " --split 4");
  CHECK(too_many.status == 1);
  CHECK(too_many.output.find("a split over 4 nodes needs 3 healthy peers; this node has 2") != std::string::npos);

  auto loaded = meshctl(sa, "models load " + split.string() + " --split 3");
  INFO(loaded.output);
  REQUIRE(loaded.status == 0);

  // Where the stages are: this node first, then peers; every layer once, in order.
  auto listed = meshctl(sa, "--json models");
  REQUIRE(listed.status == 0);
  json stages;
  const auto models_json = json::parse(listed.output);
  for (const auto& m : models_json.at("models"))
    if (m.at("id") == "split") stages = m.at("stages");
  REQUIRE(stages.size() >= 2);
  CHECK(stages.front().at("node") == mesh::test::node_id_of(ea));
  CHECK(stages.front().at("first_layer") == 0);
  CHECK(stages.back().at("end_layer") == 6);
  for (size_t i = 1; i < stages.size(); ++i) CHECK(stages[i].at("first_layer") == stages[i - 1].at("end_layer"));
  const std::string last_node = stages.back().at("node");
  REQUIRE(last_node != mesh::test::node_id_of(ea));
  auto text_list = meshctl(sa, "models");
  CHECK(text_list.output.find("split: layers 0-") != std::string::npos);
  CHECK(text_list.output.find(" on " + last_node.substr(0, 8)) != std::string::npos);
  auto board = curl(tmp.path, url + "/api/mesh", "");
  bool board_shows = false;
  for (int i = 0; i < 50 && !board_shows; ++i) {
    board = curl(tmp.path, url + "/api/mesh", "");
    const auto board_json = json::parse(board.body);
    for (const auto& m : board_json.at("models"))
      board_shows |= m.at("id") == "split" && m.at("stages").size() == stages.size();
    if (!board_shows) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  CHECK(board_shows);

  // The same greedy text as the whole model on one node.
  auto expected_text = complete(tmp.path, url, "whole");
  REQUIRE(expected_text.first == 200);
  auto got = complete(tmp.path, url, "split");
  INFO(got.second);
  REQUIRE(got.first == 200);
  CHECK(got.second == expected_text.second);
  CHECK_FALSE(got.second.empty());

  // The last stage's node dies: the next request fails naming it; the serving node stays up.
  (last_node == mesh::test::node_id_of(eb) ? b : c).kill(SIGKILL);
  auto failed = complete(tmp.path, url, "split");
  CHECK(failed.first == 503);
  CHECK(failed.second.find(last_node.substr(0, 8)) != std::string::npos);
  CHECK(a.running());
  auto still = complete(tmp.path, url, "whole");
  CHECK(still.first == 200);
  CHECK(still.second == expected_text.second);
}
