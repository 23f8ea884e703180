// A model split over three real meshnode processes (docs/serving.md, "Split over the mesh"):
// `meshctl models load PATH --split 3` on the serving node plans the stages over it and its two
// peers, each loading its layers from its copy of the file; a greedy /v1/completions gives
// exactly the text of the same checkpoint served whole; `meshctl models` and the dashboard's JSON
// show the stages; `meshctl models replan split --split 2` plans it again while it serves (the
// same text); killing a stage node moves its layers to the survivors: a stream in flight
// ends with exactly the undisturbed text, and a node that joins takes a share again.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

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

TEST_CASE("a model split over three meshnodes serves the text of the whole model",
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

  // Planned again over two nodes while it serves: the same text; errors name what was wrong.
  auto narrower = meshctl(sa, "models replan split --split 2");
  INFO(narrower.output);
  REQUIRE(narrower.status == 0);
  const auto after = json::parse(meshctl(sa, "--json models").output);
  for (const auto& m : after.at("models"))
    if (m.at("id") == "split") CHECK(m.at("stages").size() == 2);
  auto again = complete(tmp.path, url, "split");
  REQUIRE(again.first == 200);
  CHECK(again.second == expected_text.second);
  auto unknown = meshctl(sa, "models replan nothing --split 2");
  CHECK(unknown.status == 1);
  CHECK(unknown.output.find("no model 'nothing' is loaded") != std::string::npos);
  auto no_width = meshctl(sa, "models replan split");
  CHECK(no_width.status == 2);
}

namespace {

/// The stages of model `id` as `meshctl --json models` lists them.
json stages_of(const std::filesystem::path& state, const std::string& id) {
  auto listed = meshctl(state, "--json models");
  if (listed.status != 0) return json::array();
  const auto models_json = json::parse(listed.output);
  for (const auto& m : models_json.at("models"))
    if (m.at("id") == id) return m.at("stages");
  return json::array();
}

/// The nodes of `stages`, in order.
std::vector<std::string> nodes_of(const json& stages) {
  std::vector<std::string> out;
  for (const auto& s : stages) out.push_back(s.at("node"));
  return out;
}

/// Polls `f` every 100 ms for up to `seconds`.
bool poll_until(const std::function<bool()>& f, int seconds = 60) {
  for (int i = 0; i < seconds * 10; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return f();
}

const char* const long_body = R"({"model": "split", "prompt": "one two three four", "max_tokens": 64, "temperature": 0, "ignore_eos": true)";

/// A streamed completion run by curl on a thread of its own, written to `out` as it comes.
struct background_stream {
  std::filesystem::path out;
  std::thread t;
  int curl_status = -1;
  background_stream(const std::filesystem::path& dir, const std::string& url) : out(dir / "stream.txt") {
    std::filesystem::create_directories(dir);
    models::test::write_file(dir / "body.json", std::string(long_body) + R"(, "stream": true})");
    const std::string cmd = "curl -sS -N --max-time 300 -o '" + out.string() + "' -H 'Content-Type: application/json' --data-binary @'" +
                            (dir / "body.json").string() + "' '" + url + "/v1/completions'";
    t = std::thread([this, cmd] { curl_status = mesh::test::run_command(cmd).status; });
  }
  ~background_stream() {
    if (t.joinable()) t.join();
  }
  /// `data:` events so far.
  size_t events() const {
    const auto text = serving::test::read_text(out);
    size_t n = 0;
    for (size_t at = text.find("data: "); at != std::string::npos; at = text.find("data: ", at + 1)) ++n;
    return n;
  }
  /// Waits for the end; the text of its chunks, and whether it ended with [DONE] and no error.
  std::pair<std::string, bool> finish() {
    t.join();
    const auto s = serving::test::parse_sse(serving::test::read_text(out));
    std::string text;
    bool error = false;
    for (const auto& e : s.events) {
      if (e.contains("error")) error = true;
      else if (!e.at("choices").empty()) text += e.at("choices").at(0).at("text").get<std::string>();
    }
    return {text, s.done && !error && curl_status == 0};
  }
};

}  // namespace

TEST_CASE("a stage node killed mid-stream moves its layers to the survivors, and a node that joins takes a share again",
          "[apps][serving][split][failover]") {
  mesh::test::temp_dir tmp;
  models::test::model_spec spec;
  spec.layers = 6;
  spec.context = 256;
  const auto whole = tmp.path / "whole.gguf", split = tmp.path / "split.gguf";
  models::test::write_gguf_model(whole, spec, models::tensor_type::q8_0);
  std::filesystem::copy_file(whole, split);
  const auto sa = tmp.path / "a";
  mesh::test::node_process a(sa, {"--model", whole.string(), "--api-bind", "127.0.0.1:0"});
  const auto ea = a.endpoint();
  mesh::test::node_process b(tmp.path / "b", {"--peer", ea, "--api-bind", "off"});
  const auto eb = b.endpoint();
  mesh::test::node_process c(tmp.path / "c", {"--peer", ea, "--api-bind", "off"});
  const auto ec = c.endpoint();
  const std::string url = api_url(sa);
  INFO(a.log());
  const std::string ida = mesh::test::node_id_of(ea), idb = mesh::test::node_id_of(eb), idc = mesh::test::node_id_of(ec);

  REQUIRE(poll_until([&] {
    auto m = curl(tmp.path, url + "/api/mesh", "");
    int healthy = 0;
    const auto mesh_json = json::parse(m.body);
    for (const auto& n : mesh_json.at("nodes")) healthy += n.at("health") == "healthy";
    return healthy == 2;
  }));
  auto loaded = meshctl(sa, "models load " + split.string() + " --split 3");
  INFO(loaded.output);
  REQUIRE(loaded.status == 0);
  const auto first = nodes_of(stages_of(sa, "split"));
  REQUIRE(first.size() == 3);
  REQUIRE(first[0] == ida);

  // The undisturbed text: the split model now, and the whole model on one node.
  auto reference = curl(tmp.path, url + "/v1/completions", std::string(long_body) + "}");
  REQUIRE(reference.status == 200);
  const std::string expected_text = json::parse(reference.body).at("choices").at(0).at("text");
  auto whole_ref = curl(tmp.path, url + "/v1/completions",
                        R"({"model": "whole", "prompt": "one two three four", "max_tokens": 64, "temperature": 0, "ignore_eos": true})");
  REQUIRE(whole_ref.status == 200);
  CHECK(json::parse(whole_ref.body).at("choices").at(0).at("text") == expected_text);

  // The second stage's node is killed once the stream is under way.
  const std::string victim = first[1], survivor = first[2];
  {
    background_stream stream(tmp.path / "s1", url);
    REQUIRE(poll_until([&] { return stream.events() >= 20; }));
    const size_t before = stream.events();
    const auto killed_at = std::chrono::steady_clock::now();
    (victim == idb ? b : c).kill(SIGKILL);
    // The pause the client sees: until the stream moves again (for docs/serving.md's figure).
    CHECK(poll_until([&] { return stream.events() > before + 1; }));
    WARN("the stream moved again " << std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count()
                                   << " s after the SIGKILL");
    auto [text, clean] = stream.finish();
    INFO(serving::test::read_text(stream.out));
    CHECK(clean);
    CHECK(text == expected_text);
  }
  // The new plan: this node and the survivor, every layer once.
  auto after = stages_of(sa, "split");
  CHECK(nodes_of(after) == std::vector<std::string>{ida, survivor});
  REQUIRE(after.size() == 2);
  CHECK(after[0].at("first_layer") == 0);
  CHECK(after[1].at("first_layer") == after[0].at("end_layer"));
  CHECK(after[1].at("end_layer") == 6);
  auto listing = meshctl(sa, "models");
  CHECK(listing.output.find(victim.substr(0, 8)) == std::string::npos);

  // A node joins while a stream runs: the plan widens to it (the split asked for 3 nodes) and
  // the stream is not disturbed.
  {
    background_stream stream(tmp.path / "s2", url);
    REQUIRE(poll_until([&] { return stream.events() >= 5; }));
    mesh::test::node_process d(tmp.path / "d", {"--peer", ea, "--api-bind", "off"});
    const std::string idd = mesh::test::node_id_of(d.endpoint());
    CHECK(poll_until([&] { return nodes_of(stages_of(sa, "split")) == std::vector<std::string>{ida, survivor, idd}; }));
    auto [text, clean] = stream.finish();
    CHECK(clean);
    CHECK(text == expected_text);
    auto again = curl(tmp.path, url + "/v1/completions", std::string(long_body) + "}");
    REQUIRE(again.status == 200);
    CHECK(json::parse(again.body).at("choices").at(0).at("text") == expected_text);
    INFO(d.log());
  }
  CHECK(a.running());
}
