// A model split over three real meshnode processes where only the serving node has the file
// (docs/serving.md, "Split over the mesh"): the stage nodes, which see an empty directory where
// the file lies (a mount namespace each), fetch the chunks their layers read from the serving
// node into their blob caches; the text is the whole model's; a second load of the model takes it from the caches
// (no transfer). A stage node killed: the re-plan goes on over the survivors; a node that joins
// without the file fetches it when the plan widens to it.
#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/blob_chunks.hpp"
#include "actors/blob_digest.hpp"
#include "model_writer.hpp"
#include "models/gguf.hpp"
#include "models/mapped_file.hpp"
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

std::pair<int, std::string> complete(const std::filesystem::path& scratch, const std::string& url, const std::string& model) {
  auto r = curl(scratch, url + "/v1/completions",
                R"({"model": ")" + model + R"(", "prompt": "one two three four", "max_tokens": 8, "temperature": 0, "ignore_eos": true})");
  if (r.status != 200) return {r.status, r.body};
  return {200, json::parse(r.body).at("choices").at(0).at("text").get<std::string>()};
}

/// The nodes of model `id`'s stages as `meshctl --json models` lists them, in order.
std::vector<std::string> stage_nodes_of(const std::filesystem::path& state, const std::string& id) {
  std::vector<std::string> out;
  auto listed = meshctl(state, "--json models");
  if (listed.status != 0) return out;
  const auto models_json = json::parse(listed.output);
  for (const auto& m : models_json.at("models"))
    if (m.at("id") == id)
      for (const auto& s : m.at("stages")) out.push_back(s.at("node"));
  return out;
}

bool poll_until(const std::function<bool()>& f, int seconds = 90) {
  for (int i = 0; i < seconds * 10; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return f();
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// How many of `file`'s chunks a stage of layers [first, end) of `layers` reads: the GGUF header,
/// its blocks' tensors, the embedding for the first stage and the output head for the last, each
/// located by its tensor info in the file.
std::set<uint64_t> chunks_read_by(const std::filesystem::path& file, int64_t first, int64_t end, int64_t layers) {
  auto mapped = models::mapped_file::open(file);
  REQUIRE(mapped.has_value());
  auto view = models::gguf_view::parse(mapped->bytes(), file.string());
  REQUIRE(view.has_value());
  std::set<uint64_t> chunks;
  const auto add = [&](uint64_t offset, uint64_t length) {
    for (uint64_t c = offset / blobs::chunk_bytes; c * blobs::chunk_bytes < offset + length; ++c) chunks.insert(c);
  };
  add(0, view->data_offset());
  for (const auto& t : view->tensors()) {
    const std::string name(t.name);
    bool read = false;
    for (int64_t l = first; l < end; ++l) read = read || name.starts_with("blk." + std::to_string(l) + ".");
    read = read || (first == 0 && name.starts_with("token_embd."));
    read = read || (end == layers && (name.starts_with("output.") || name.starts_with("output_norm.")));
    if (read) add(view->data_offset() + t.offset, t.data.size());
  }
  return chunks;
}

}  // namespace

TEST_CASE("stage nodes without the file fetch it from the serving node into their blob caches",
          "[apps][serving][split][blobs]") {
  if (!mesh::test::can_hide_directories()) {
    WARN("skipped: hiding the model from the stage nodes needs a mount namespace (root or CAP_SYS_ADMIN)");
    return;
  }
  mesh::test::temp_dir tmp;
  models::test::model_spec spec;
  spec.layers = 6;
  spec.context = 256;
  // Layers of about 0.5 MB (Q8_0): a stage reads only the 1 MiB chunks its layers lie in.
  spec.hidden = 256;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.ffn = 384;
  const auto served = tmp.path / "served";  // empty to the stage nodes
  std::filesystem::create_directories(served);
  const auto whole = served / "whole.gguf", split = served / "split.gguf";
  models::test::write_gguf_model(whole, spec, models::tensor_type::q8_0);
  std::filesystem::copy_file(whole, split);
  const auto digest = blobs::to_hex(blobs::hash_file(split).value());
  const uint64_t chunks = (std::filesystem::file_size(split) + blobs::chunk_bytes - 1) / blobs::chunk_bytes;
  REQUIRE(chunks >= 3);
  const auto sa = tmp.path / "a";
  mesh::test::node_process a(sa, {"--model", whole.string(), "--api-bind", "127.0.0.1:0"});
  const auto ea = a.endpoint();
  mesh::test::node_process b(tmp.path / "b", {"--peer", ea, "--api-bind", "off"}, true, {served});
  const auto eb = b.endpoint();
  mesh::test::node_process c(tmp.path / "c", {"--peer", ea, "--api-bind", "off"}, true, {served});
  const auto ec = c.endpoint();
  const std::string url = api_url(sa);
  INFO(a.log());

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

  auto loaded = meshctl(sa, "models load " + split.string() + " --split 3");
  INFO(loaded.output << "\nb:\n" << b.log() << "\nc:\n" << c.log());
  REQUIRE(loaded.status == 0);

  // The stage nodes other than the serving node, by their state directories.
  struct stage_node {
    std::filesystem::path dir;
    mesh::test::node_process* node;
    uint64_t chunks_read;          ///< of the file's, by its layers' tensors
    std::set<uint64_t> chunk_set;  ///< which
  };
  // The split model's stages on b and c, as `meshctl --json models` lists them now.
  auto stages_now = [&] {
    auto listed = meshctl(sa, "--json models");
    REQUIRE(listed.status == 0);
    std::vector<stage_node> out;
    const auto models_json = json::parse(listed.output);  // kept: the loop walks into it
    for (const auto& m : models_json.at("models"))
      if (m.at("id") == "split")
        for (const auto& s : m.at("stages")) {
          auto set = chunks_read_by(split, s.at("first_layer"), s.at("end_layer"), spec.layers);
          if (s.at("node") == mesh::test::node_id_of(eb)) out.push_back({tmp.path / "b", &b, set.size(), set});
          if (s.at("node") == mesh::test::node_id_of(ec)) out.push_back({tmp.path / "c", &c, set.size(), set});
        }
    return out;
  };
  const std::vector<stage_node> stage_nodes = stages_now();
  REQUIRE_FALSE(stage_nodes.empty());
  // The plan (it weighs the nodes as they measure themselves) decides the ranges; a stage may
  // read every chunk, but one of the stages must not for the test to show partial fetches.
  uint64_t fewest_read = chunks;
  for (const auto& s : stage_nodes) fewest_read = std::min(fewest_read, s.chunks_read);
  CHECK(fewest_read < chunks);
  for (const auto& [dir, node, read, set] : stage_nodes) {
    INFO(dir << ": its layers read " << read << " of " << chunks << " chunks");
    // Only the chunks of its layers, in a sparse file of the whole size.
    CHECK(std::filesystem::file_size(dir / "blobs" / (digest + ".sparse")) == std::filesystem::file_size(split));
    CHECK(count_of(node->log(), "fetched blob " + digest + " in part") == 1);
    CHECK(count_of(node->log(), "fetching " + std::to_string(read) + " of blob " + digest + "'s " + std::to_string(chunks) + " chunks") == 1);
  }

  auto expected_text = complete(tmp.path, url, "whole");
  REQUIRE(expected_text.first == 200);
  auto got = complete(tmp.path, url, "split");
  INFO(got.second);
  REQUIRE(got.first == 200);
  CHECK(got.second == expected_text.second);

  // Loaded again: a stage node takes what its cache holds from there and fetches only the chunks
  // it lacks (the new plan, which weighs fresh measurements, may give it other layers): with all
  // of them cached, nothing.
  REQUIRE(meshctl(sa, "models unload split").status == 0);
  auto again = meshctl(sa, "models load " + split.string() + " --split 3");
  INFO(again.output);
  REQUIRE(again.status == 0);
  for (const auto& now : stages_now()) {
    std::set<uint64_t> held;
    for (const auto& before : stage_nodes)
      if (before.node == now.node) held = before.chunk_set;
    uint64_t missing = 0;
    for (const uint64_t ch : now.chunk_set) missing += held.count(ch) == 0;
    INFO(now.dir << ": its layers read " << now.chunks_read << " chunks, " << missing << " not cached\n" << now.node->log());
    if (held.empty()) continue;  // no stage there the first time: a first fetch, checked above for the others
    if (missing == 0) {
      CHECK(count_of(now.node->log(), "fetched blob " + digest) == 1);
      CHECK(count_of(now.node->log(), "blob " + digest + " from the cache (no transfer)") >= 1);
    } else {
      CHECK(count_of(now.node->log(), "fetched blob " + digest) == 2);
      CHECK(count_of(now.node->log(), "fetching " + std::to_string(missing) + " of blob " + digest + "'s " + std::to_string(chunks) + " chunks") == 1);
    }
  }
  auto got_again = complete(tmp.path, url, "split");
  REQUIRE(got_again.first == 200);
  CHECK(got_again.second == expected_text.second);

  // Failover: the last stage's node dies; the model is planned again over this node and the
  // other peer (which loads its new range from its cache). Then a newcomer without the file
  // joins: the plan widens to it, and it fetches the file.
  const std::string ida = mesh::test::node_id_of(ea), idb = mesh::test::node_id_of(eb), idc = mesh::test::node_id_of(ec);
  const auto before = stage_nodes_of(sa, "split");
  REQUIRE(before.size() == 3);
  const bool c_dies = before.back() == idc;
  const std::string survivor = c_dies ? idb : idc;
  (c_dies ? c : b).kill(SIGKILL);
  CHECK(poll_until([&] { return stage_nodes_of(sa, "split") == std::vector<std::string>{ida, survivor}; }));
  auto after_loss = complete(tmp.path, url, "split");
  REQUIRE(after_loss.first == 200);
  CHECK(after_loss.second == expected_text.second);

  mesh::test::node_process d(tmp.path / "d", {"--peer", ea, "--api-bind", "off"}, true, {served});
  const std::string idd = mesh::test::node_id_of(d.endpoint());
  INFO(d.log());
  CHECK(poll_until([&] { return stage_nodes_of(sa, "split") == std::vector<std::string>{ida, survivor, idd}; }));
  CHECK(std::filesystem::file_size(tmp.path / "d" / "blobs" / (digest + ".sparse")) == std::filesystem::file_size(split));
  CHECK(count_of(d.log(), "fetched blob " + digest) == 1);
  auto widened = complete(tmp.path, url, "split");
  REQUIRE(widened.first == 200);
  CHECK(widened.second == expected_text.second);
}
