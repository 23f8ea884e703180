// The HTTP API of a real meshnode: `--model` loads a checkpoint at start, curl talks to the
// OpenAI routes, the dashboard's JSON and /metrics see the node's peer, `meshctl models` lists,
// loads and unloads models (which the API then serves or not), and bad serving settings stop the
// node at start with a message that names them.
#include <catch2/catch.hpp>

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

/// The ids /v1/models lists.
std::vector<std::string> model_ids(const std::filesystem::path& scratch, const std::string& url) {
  auto r = curl(scratch, url + "/v1/models", "");
  REQUIRE(r.status == 200);
  std::vector<std::string> ids;
  const auto listed = json::parse(r.body);
  for (const auto& m : listed.at("data")) ids.push_back(m.at("id"));
  return ids;
}

bool lists(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

TEST_CASE("meshnode --model serves the OpenAI API, the dashboard's JSON and metrics, and meshctl models steers it",
          "[apps][serving]") {
  mesh::test::temp_dir tmp;
  const auto model = tmp.path / "tiny.gguf", second = tmp.path / "second.gguf";
  models::test::write_gguf_model(model, serving::test::tiny_spec(), models::tensor_type::q8_0);
  models::test::write_gguf_model(second, serving::test::tiny_spec(), models::tensor_type::f32);
  const auto sa = tmp.path / "a", sb = tmp.path / "b";
  mesh::test::node_process a(sa, {"--model", model.string(), "--api-bind", "127.0.0.1:0"});
  const auto ea = a.endpoint();
  mesh::test::node_process b(sb, {"--peer", ea, "--api-bind", "off"});
  b.endpoint();
  const std::string url = api_url(sa);
  INFO(a.log());
  CHECK(url.rfind("http://127.0.0.1:", 0) == 0);
  {
    std::ifstream f(sb / "api");
    std::string line;
    std::getline(f, line);
    CHECK(line.empty());  // --api-bind off: no API
  }

  // The model loads in the background; then the API serves it.
  std::vector<std::string> ids;
  for (int i = 0; i < 300 && !lists(ids, "tiny"); ++i) {
    ids = model_ids(tmp.path, url);
    if (!lists(ids, "tiny")) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(lists(ids, "tiny"));
  auto done = curl(tmp.path, url + "/v1/completions",
                   R"({"model": "tiny", "prompt": "hello there", "max_tokens": 6, "temperature": 0, "ignore_eos": true})");
  REQUIRE(done.status == 200);
  const auto c = json::parse(done.body);
  CHECK(c.at("usage").at("completion_tokens") == 6);
  auto unknown = curl(tmp.path, url + "/v1/completions", R"({"model": "nope", "prompt": "x"})");
  CHECK(unknown.status == 404);

  // The dashboard's JSON and the metrics see peer b, healthy, within a few refreshes.
  bool seen = false;
  for (int i = 0; i < 150 && !seen; ++i) {
    auto m = curl(tmp.path, url + "/api/mesh", "");
    REQUIRE(m.status == 200);
    const auto j = json::parse(m.body);
    for (const auto& n : j.at("nodes"))
      seen |= n.at("id") == mesh::test::node_id_of(b.endpoint()) && n.at("health") == "healthy";
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  CHECK(seen);
  auto metrics = curl(tmp.path, url + "/metrics", "");
  REQUIRE(metrics.status == 200);
  CHECK(metrics.body.find("meshnode_peers{health=\"healthy\"} 1") != std::string::npos);
  CHECK(metrics.body.find("meshnode_completion_tokens_total{model=\"tiny\"} 6") != std::string::npos);

  // meshctl models: list, load (the API serves it), unload (it does not), errors.
  auto listed = meshctl(sa, "models");
  INFO(listed.output);
  REQUIRE(listed.status == 0);
  CHECK(listed.output.find("tiny") != std::string::npos);
  CHECK(listed.output.find("HTTP API: " + url) != std::string::npos);
  auto loaded = meshctl(sa, "models load " + second.string());
  INFO(loaded.output);
  REQUIRE(loaded.status == 0);
  CHECK(loaded.output.find("second") != std::string::npos);
  CHECK(lists(model_ids(tmp.path, url), "second"));
  auto again = meshctl(sa, "models load " + second.string());
  CHECK(again.status == 1);
  CHECK(again.output.find("a model with the id 'second' is already loaded") != std::string::npos);
  auto missing = meshctl(sa, "models load " + (tmp.path / "nope.gguf").string());
  CHECK(missing.status == 1);
  CHECK(missing.output.find("nope.gguf") != std::string::npos);
  auto unloaded = meshctl(sa, "models unload second");
  REQUIRE(unloaded.status == 0);
  CHECK_FALSE(lists(model_ids(tmp.path, url), "second"));
  auto unknown_unload = meshctl(sa, "models unload second");
  CHECK(unknown_unload.status == 1);
  CHECK(unknown_unload.output.find("no model 'second' is loaded") != std::string::npos);
  auto json_list = meshctl(sa, "--json models");
  REQUIRE(json_list.status == 0);
  CHECK(json::parse(json_list.output).at("models").size() == 1);

  // meshctl generate names a loaded model by its id too.
  auto gen = meshctl(sa, "generate tiny 'hello there' --max-tokens 4");
  CHECK(gen.status == 0);
  CHECK(a.running());
}

TEST_CASE("meshnode refuses bad serving settings at start with a message that names them", "[apps][serving]") {
  mesh::test::temp_dir tmp;
  const auto start = [&](const std::string& name, std::vector<std::string> args) {
    mesh::test::node_process n(tmp.path / name, std::move(args));
    const int code = n.wait_exit(std::chrono::seconds(60));
    return std::make_pair(code, n.log());
  };
  auto [bad_bind, bad_bind_log] = start("bind", {"--api-bind", "localhost"});
  CHECK(bad_bind == 2);
  CHECK(bad_bind_log.find("--api-bind") != std::string::npos);
  auto [missing, missing_log] = start("model", {"--model", (tmp.path / "nope.gguf").string()});
  CHECK(missing == 2);
  CHECK(missing_log.find("--model " + (tmp.path / "nope.gguf").string() + ": no such file or directory") != std::string::npos);
  auto [no_key, no_key_log] = start("key", {"--api-key-file", (tmp.path / "none.key").string()});
  CHECK(no_key == 2);
  CHECK(no_key_log.find("--api-key-file") != std::string::npos);

  // An address asked for by name must be free: the node does not start elsewhere.
  mesh::test::node_process first(tmp.path / "first", {"--api-bind", "127.0.0.1:0"});
  first.endpoint();
  const std::string taken = api_url(tmp.path / "first");
  const std::string port = taken.substr(taken.rfind(':') + 1);
  auto [busy, busy_log] = start("second", {"--api-bind", "127.0.0.1:" + port});
  CHECK(busy == 2);
  CHECK(busy_log.find("HTTP API") != std::string::npos);
}
